// coda/epilogues/nodes.hpp — the one table from coda_ext graph node kinds to CUTLASS SM90
// epilogue visitor nodes, with the argument packing of each.
//
// Each wrapper `X<Cfg, ...>` names the visitor (`X::Node`) and builds its arguments from the
// plain launch description (`X::args(...)`), so emitted code never spells CUTLASS argument
// structs. Naming: a *row* reduction here produces one value per row (length M, reducing
// over N) — CUTLASS calls that node Sm90ColReduction; a *column* reduction produces one
// value per column (length N) — the project's Sm90ColumnPartials (CUTLASS's
// Sm90RowReduction keeps its state in local memory).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp>

#include "coda/abi.h"
#include "functors.hpp"
#include "column_partials.hpp"
#include "coordinates.hpp"
#include "direct_tile_load.hpp"
#include "evict_first.hpp"
#include "interior_tiles.hpp"
#include "last_tile.hpp"
#include "pair_gated_store.hpp"
#include "row_lse_partials.hpp"
#include "segment_reduce.hpp"
#include "staggered_pairs.hpp"

namespace coda::epi {

namespace fusion = cutlass::epilogue::fusion;
namespace detail = cutlass::epilogue::collective::detail;
constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;

template <class T>
T const* const_ptr(CodaSlot const& s) { return static_cast<T const*>(s.ptr); }

// The GEMM accumulator (fp32).
struct Accumulator {
  using Node = fusion::Sm90AccFetch;
  static typename Node::Arguments args() { return {}; }
};

// A scalar: a value fixed in the source, a runtime value, or a device pointer (fp32).
template <class Cfg>
struct Scalar {
  using Node = fusion::Sm90ScalarBroadcast<float, typename Cfg::ScalarStride>;
  static typename Node::Arguments constant(float value) { return {{value}, {nullptr}, {}}; }
  static typename Node::Arguments value(CodaSlot const& s) { return {{s.value}, {nullptr}, {}}; }
  static typename Node::Arguments pointer(CodaSlot const& s) {
    return {{0.0f}, {static_cast<float const*>(s.ptr)}, {}};
  }
};

// A length-N vector broadcast along M (a Linear bias, a norm weight).
template <class Cfg, class T>
struct RowVector {
  using Node = fusion::Sm90RowBroadcast<0, typename Cfg::TileShape, T, float, typename Cfg::RowVectorStride,
                                        128 / cutlass::sizeof_bits<T>::value, /*EnableNullptr=*/false>;
  static typename Node::Arguments args(CodaSlot const& s) { return {const_ptr<T>(s), T(0), {}}; }
};

// A length-M vector broadcast along N (a per-token scale, rstd).
template <class Cfg, class T>
struct ColVector {
  using Node = fusion::Sm90ColBroadcast<0, typename Cfg::TileShape, T, float, typename Cfg::ColVectorStride,
                                        128 / cutlass::sizeof_bits<T>::value, /*EnableNullptr=*/false>;
  static typename Node::Arguments args(CodaSlot const& s) { return {const_ptr<T>(s), T(0), {}}; }
};

// A full M x N tile, TMA-loaded through shared memory by the epilogue producer warp.
// Its stage count must be the collective's StagesC (the descriptor's): the node indexes its
// buffers with the collective's load-pipeline index, so fewer stages read the wrong buffers.
template <class Cfg, class T>
struct TileLoad {
  using Desc = detail::AuxLoadDescriptor<typename Cfg::EpilogueDescriptor, typename Cfg::LayoutD, T>;
  using Node = fusion::Sm90AuxLoad<Desc::Stages, typename Desc::EpilogueTile, T, typename Desc::Stride,
                                   typename Desc::SmemLayoutAtom, typename Desc::CopyOpS2R,
                                   128 / cutlass::sizeof_bits<T>::value, /*EnableNullptr=*/false>;
  static constexpr int kStages = Desc::Stages;
  static typename Node::Arguments args(CodaSlot const& s) {
    return {const_ptr<T>(s), T(0), {s.ld, cute::_1{}, int64_t(0)}};
  }
};

// A full M x N tile read from global memory straight into registers, a subtile ahead (direct_tile_load.hpp):
// KernelConfig(tile_loads="direct"). No shared memory, no producer-warp load.
template <class Cfg, class T>
struct TileLoadDirect {
  using Node = DirectTileLoad<T, cutlass::detail::TagToStrideC_t<typename Cfg::LayoutD>, 128 / cutlass::sizeof_bits<T>::value>;
  static typename Node::Arguments args(CodaSlot const& s) {
    return {const_ptr<T>(s), T(0), {s.ld, cute::_1{}, int64_t(0)}};
  }
};

// TileLoad whose threads read shared memory in staggered 4-byte halves (staggered_pairs.hpp): the 32-bit
// pair tiles with KernelConfig(pair_smem="staggered").
template <class Cfg, class T>
struct TileLoadStaggered {
  using Node = StaggeredAuxLoad<typename TileLoad<Cfg, T>::Node, TileLoad<Cfg, T>::Desc::Stages>;
  static constexpr int kStages = TileLoad<Cfg, T>::kStages;
  static typename Node::Arguments args(CodaSlot const& s) { return TileLoad<Cfg, T>::args(s); }
};

// Stores its input as an M x N tile (TMA through shared memory) and passes it through.
template <class Cfg, class T>
struct TileStore {
  using Desc = detail::AuxStoreDescriptor<typename Cfg::EpilogueDescriptor, typename Cfg::LayoutD, T>;
  using Node = fusion::Sm90AuxStore<Desc::Stages, typename Desc::EpilogueTile, T, kRound, typename Desc::Stride,
                                    typename Desc::SmemLayoutAtom, typename Desc::CopyOpR2S,
                                    128 / cutlass::sizeof_bits<T>::value, /*EnableNullptr=*/false>;
  static constexpr int kStages = Desc::Stages;
  static typename Node::Arguments args(CodaSlot const& s) {
    return {static_cast<T*>(s.ptr), {s.ld, cute::_1{}, int64_t(0)}};
  }
};

// TileStore whose threads write shared memory in staggered 4-byte halves: the 32-bit pair stores with
// KernelConfig(pair_smem="staggered").
template <class Cfg, class T>
struct TileStoreStaggered {
  using Node = StaggeredAuxStore<typename TileStore<Cfg, T>::Node, TileStore<Cfg, T>::Desc::Stages>;
  static constexpr int kStages = TileStore<Cfg, T>::kStages;
  static typename Node::Arguments args(CodaSlot const& s) { return TileStore<Cfg, T>::args(s); }
};

// A TMA tile load (TileLoad, TileLoadStaggered) or store (TileStore, TileStoreStaggered) whose copies carry the L2
// evict-first hint (evict_first.hpp): KernelConfig(epilogue_cache="evict_first").
template <class W>
struct EvictFirstLoad {
  using Node = EvictFirstAuxLoad<typename W::Node, W::kStages>;
  static typename Node::Arguments args(CodaSlot const& s) { return W::args(s); }
};
template <class W>
struct EvictFirstStore {
  using Node = EvictFirstAuxStore<typename W::Node, W::kStages>;
  static typename Node::Arguments args(CodaSlot const& s) { return W::args(s); }
};

// An element-wise op (fp32 in and out).
template <class Cfg, template <class> class Fn>
struct Compute {
  using Node = fusion::Sm90Compute<Fn, float, float, kRound>;
  static typename Node::Arguments args() { return {}; }
};

// A cast: rounds to T and continues in fp32, so it may feed any node (D of another 16-bit type too).
template <class Cfg, class T>
struct Cast {
  using Node = fusion::Sm90Compute<RoundThrough<T>::template Fn, float, float, kRound>;
  static typename Node::Arguments args() { return {}; }
};

// One element (Half 0: even column, 1: odd) of each 16-bit pair of a pair tile (a TileLoad<Cfg, float>
// of the (M, 2N) tensor viewed as (M, N) 32-bit elements), as fp32.
template <class Cfg, class T, int Half>
struct Unpack {
  using Node = fusion::Sm90Compute<UnpackHalf<T, Half>::template Fn, float, float, kRound>;
  static typename Node::Arguments args() { return {}; }
};

// Two values rounded to T and packed into one 32-bit element per column (for a TileStore<Cfg, float>
// of the (M, 2N) output viewed as (M, N)).
template <class Cfg, class T>
struct Pack {
  using Node = fusion::Sm90Compute<PackPair<T>::template Fn, float, float, kRound>;
  static typename Node::Arguments args() { return {}; }
};

// The global column index of each element, as fp32.
struct ColIndex {
  using Node = Sm90ColIndex;
  static typename Node::Arguments args() { return {}; }
};

// Reduction rules: the per-element rule, and the rule that combines partial results.
// Input/Combine: array rules for CUTLASS's nodes; ScalarInput/ScalarCombine: scalar rules for the project's.
struct ReduceSum {
  template <class T> using Input = Add<T>;
  template <class T> using Combine = Add<T>;
  using ScalarInput = scalar::Add;
  using ScalarCombine = scalar::Add;
};
struct ReduceMax {
  template <class T> using Input = Max<T>;
  template <class T> using Combine = Max<T>;
  using ScalarInput = scalar::Max;
  using ScalarCombine = scalar::Max;
};
struct ReduceSumSq {
  template <class T> using Input = PlusSquare<T>;
  template <class T> using Combine = Add<T>;
  using ScalarInput = scalar::PlusSquare;
  using ScalarCombine = scalar::Add;
};

// Per-row statistic (length M, reduced over N): writes one fp32 partial per (row, N-tile)
// into a compact (round_up(M, TILE_M), ceil(N / TILE_N)) m-major buffer, no atomics;
// finish with kernels::launch_finalize. Passes its input through.
// CheckOOB = false skips the per-element bounds test; the emitter chooses it only when the
// reduced value is provably 0 beyond the problem's columns and 0 is the rule's identity. With
// the test, tiles wholly inside the problem skip it (interior_tiles.hpp).
template <class Cfg, class Rule, bool CheckOOB = true>
struct RowReduce {
  using Node = std::conditional_t<
      CheckOOB,
      Sm90RowReductionInterior<Rule::template Input, Rule::template Combine, Rule::template Combine, 0,
                               typename Cfg::TileShape, float, float, kRound, cute::Stride<cute::_1, cute::_0, cute::_0>,
                               4, /*EnableNullptr=*/false, /*FinalReduction=*/false>,
      fusion::Sm90ColReduction<Rule::template Input, Rule::template Combine, Rule::template Combine, 0,
                               typename Cfg::TileShape, float, float, kRound, cute::Stride<cute::_1, cute::_0, cute::_0>,
                               4, /*EnableNullptr=*/false, /*FinalReduction=*/false, /*VisitCheckOOB=*/false>>;
  static typename Node::Arguments args(float* partials, float identity) { return {partials, identity, {}}; }
};

// Per-column statistic (length N, reduced over M): one fp32 partial per (M-tile, column)
// in a compact (ceil(M / TILE_M), round_up(N, TILE_N)) n-major buffer (the project node of
// column_partials.hpp: registers, lane shuffles and one shared-memory pass per tile). CheckOOB
// as above, for rows beyond M.
template <class Cfg, class Rule, bool CheckOOB = true>
struct ColReduce {
  using Node = Sm90ColumnPartials<typename Rule::ScalarInput, typename Rule::ScalarCombine, typename Cfg::TileShape,
                                  CheckOOB>;
  static typename Node::Arguments args(float* partials, float identity) { return {partials, identity}; }
};

// Per row, Rule folded over each segment of Size columns, broadcast back (the epilogue subtile
// must be Size columns wide: segment_reduce.hpp).
template <class Cfg, class Rule, int Size>
struct SegmentReduce {
  using Node = Sm90SegmentReduce<typename Rule::ScalarInput, typename Rule::ScalarCombine, Size,
                                 typename Cfg::TileShape>;
  static typename Node::Arguments args(float identity) { return {identity}; }
};

// Per-row online log-sum-exp over N: one fp32 partial per (row, N-tile) in the layout of
// RowReduce's; finish with ReduceCombine::LogSumExp. Passes its input through.
template <class Cfg, bool CheckOOB = true>
struct RowLogSumExp {
  using Node = Sm90RowLsePartials<typename Cfg::TileShape, CheckOOB>;
  static typename Node::Arguments args(float* partials, float /*identity*/) { return {partials}; }
};

// The fusion of a graph without a main output D (Cfg::ElementD = void): CUTLASS then takes the
// element of D's staging buffer (the scratch of reductions) from the fusion's ElementAux.
template <class Fusion, class T>
struct WithoutD : Fusion {
  using ElementAux = T;
  using Fusion::Fusion;
};

// out[:, i] = Act(x[:, 2i]) * x[:, 2i+1], stored at half width; passes x through.
template <class Cfg, class T, class Act>
struct PairGatedStore {
  using Node = Sm90PairGatedStore<T, Act>;
  static typename Node::Arguments args(CodaSlot const& s) { return {static_cast<T*>(s.ptr), s.ld}; }
};

}  // namespace coda::epi
