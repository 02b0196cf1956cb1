// coda/epilogues/column_partials.hpp — per-column reduction over the rows of each output tile
// (length N, reduced over M), written as one fp32 partial per (M-tile, column) without atomics.
//
// A CUTLASS SM90 epilogue visitor node (the node contract of sm90_visitor_*.hpp), a sink that
// passes its input through. Each thread folds the elements it owns into one register per
// distinct column it owns (the register tensor has stride 0 along M, so it holds only the
// columns); at the end of the tile the lanes of a warp that own the same columns are folded
// with xor-shuffles, then the warps through shared memory (the current store buffer, as the
// collective allows), in a fixed order: deterministic. Every update is a select on registers
// with static indices, so no state spills to local memory.
//
// Partials: a compact (ceil(M / TILE_M), round_up(N, TILE_N)) n-major fp32 buffer; finish with
// kernels::launch_finalize.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp>

#include "interior_tiles.hpp"
#include "node_base.hpp"

namespace coda::epi {

struct Sm90ColumnPartialsArguments {
  float* ptr_partials = nullptr;
  float identity = 0.0f;
};

template <
  class InputFn,         // scalar rule folding one element into a partial: (partial, x) -> partial
  class CombineFn,       // scalar rule combining two partials
  class CtaTileShapeMNK,
  bool CheckOOB = true   // false: elements beyond the problem are known to be the rule's identity
>
struct Sm90ColumnPartials : Sm90PlainNode<Sm90ColumnPartialsArguments> {
  using Sm90PlainNode::Sm90PlainNode;

  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Sm90ColumnPartialsArguments const& args) {
    return args.ptr_partials != nullptr;
  }

  template <int Threads, class RTensor, class CTensor, class Residue>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE ConsumerStoreCallbacks(RTensor&& tC_rCol, CTensor tC_cD, Residue residue, bool interior,
                                          int m_tile, int n_tile, int M, int N, int thread_idx,
                                          Params const* params_ptr)
        : tC_rCol(cute::forward<RTensor>(tC_rCol)), tC_cD(tC_cD), residue(residue), interior(interior),
          m_tile(m_tile), n_tile(n_tile), M(M), N(N), thread_idx(thread_idx), params_ptr(params_ptr) {}

    RTensor tC_rCol;   // (CPY, CPY_M, CPY_N, EPI_M, EPI_N), stride 0 along M: one register per column
    CTensor tC_cD;     // the same shape: (m, n) of every element relative to this thread's first one
    Residue residue;   // (M, N) minus the coordinate of this thread's first element
    bool interior;     // the tile lies wholly inside the problem: no element needs the bounds test
    int m_tile, n_tile, M, N, thread_idx;
    Params const* params_ptr;

    template <class ElementAccumulator, class ElementInput, int FragmentSize>
    CUTLASS_DEVICE auto visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v, int epi_m, int epi_n,
                              cutlass::Array<ElementInput, FragmentSize> const& frg_input) {
      cute::Tensor r = tC_rCol(cute::_, cute::_, cute::_, epi_m, epi_n);
      cute::Tensor c = tC_cD(cute::_, cute::_, cute::_, epi_m, epi_n);
      if (!CheckOOB || interior) {   // uniform across the tile's threads (interior_tiles.hpp)
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < FragmentSize; ++i) {
          int k = epi_v * FragmentSize + i;
          r(k) = InputFn{}(r(k), float(frg_input[i]));
        }
      } else {
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < FragmentSize; ++i) {
          int k = epi_v * FragmentSize + i;
          float folded = InputFn{}(r(k), float(frg_input[i]));
          r(k) = cute::elem_less(c(k), residue) ? folded : r(k);
        }
      }
      return frg_input;
    }

    template <class STensor, class SyncFn, class VTensor>
    CUTLASS_DEVICE void reduce(STensor&& smem_buffer, SyncFn const& sync_fn, int, int, bool is_last_iteration,
                               VTensor) {
      using namespace cute;
      constexpr int TileM = size<0>(CtaTileShapeMNK{});
      constexpr int TileN = size<1>(CtaTileShapeMNK{});
      constexpr int Warps = Threads / 32;
      using SmemT = cute::remove_cvref_t<STensor>;
      static_assert(sizeof(typename SmemT::value_type) * decltype(cosize(typename SmemT::layout_type{}))::value >=
                        sizeof(float) * Warps * TileN,
                    "the store buffer of one epilogue subtile must hold one fp32 row per warp; use a larger epilogue tile");
      if (!is_last_iteration) return;
      // A tile wholly beyond the problem (the scheduler pads the grid to whole clusters and
      // swizzle strips) has no partials: writing them would overrun the buffer.
      if (m_tile * TileM >= M || n_tile * TileN >= N) return;

      // One register per distinct column, and the (relative) coordinate of each at M-index 0.
      Tensor r = filter_zeros(tC_rCol);
      Tensor c = make_tensor(tC_cD.data(), make_layout(r.shape(), tC_cD.stride()));
      int base_col = N - int(get<1>(residue));  // this thread's first column

      // 1. Lanes that own the same columns: the column offsets of a thread's registers are the
      //    same static layout for every thread, so equal first columns mean equal columns.
      CUTLASS_PRAGMA_UNROLL
      for (int bit = 1; bit < 32; bit <<= 1) {
        bool same = __shfl_xor_sync(0xffffffffu, base_col, bit) == base_col;
        if (__all_sync(0xffffffffu, same)) {
          CUTLASS_PRAGMA_UNROLL
          for (int j = 0; j < size(r); ++j) {
            r(j) = CombineFn{}(r(j), __shfl_xor_sync(0xffffffffu, r(j), bit));  // commutative: both lanes agree
          }
        }
      }

      // 2. Warps, through shared memory: slot (warp, column of the tile), the identity where a warp
      //    owns no element of a column; then each column is folded over the warps in order.
      int warp = thread_idx / 32;
      float* sbuf = reinterpret_cast<float*>(raw_pointer_cast(smem_buffer.data()));
      float identity = params_ptr->identity;
      int first = base_col - n_tile * TileN;  // this thread's first column within the tile
      sync_fn();
      CUTLASS_PRAGMA_UNROLL
      for (int i = thread_idx; i < Warps * TileN; i += Threads) sbuf[i] = identity;
      sync_fn();
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < size(r); ++j) {
        sbuf[warp * TileN + first + int(get<1>(c(j)))] = r(j);  // the lanes of a group write equal values
      }
      sync_fn();
      int64_t ld = int64_t((N + TileN - 1) / TileN) * TileN;
      float* out = params_ptr->ptr_partials + int64_t(m_tile) * ld + int64_t(n_tile) * TileN;
      CUTLASS_PRAGMA_UNROLL
      for (int col = thread_idx; col < TileN; col += Threads) {
        float v = sbuf[col];
        CUTLASS_PRAGMA_UNROLL
        for (int w = 1; w < Warps; ++w) v = CombineFn{}(v, sbuf[w * TileN + col]);
        out[col] = v;
      }
      sync_fn();  // the buffer is this subtile's store buffer: free it for the copy of D
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
    using namespace cute;
    constexpr int TileM = size<0>(CtaTileShapeMNK{});
    constexpr int TileN = size<1>(CtaTileShapeMNK{});
    constexpr int Threads = decltype(args.tiled_copy)::TiledNumThr::value;
    static_assert(Threads % 32 == 0, "the epilogue runs whole warps");
    // A stride-0-along-M view of the tile, partitioned like the output, gives the register layout.
    Tensor gCol = make_tensor(make_gmem_ptr(static_cast<float*>(nullptr)),
                              make_layout(make_shape(Int<TileM>{}, Int<TileN>{}), make_stride(_0{}, _1{})));
    Tensor tC_gCol = cutlass::epilogue::fusion::sm90_partition_for_epilogue<ReferenceSrc>(
        gCol, args.epi_tile, args.tiled_copy, args.thread_idx);
    Tensor tC_rCol = make_tensor_like<float>(tC_gCol);
    fill(tC_rCol, params_ptr->identity);
    auto [M, N, K, L] = args.problem_shape_mnkl;
    auto [m, n, k, l] = args.tile_coord_mnkl;
    return ConsumerStoreCallbacks<Threads, decltype(tC_rCol), decltype(args.tCcD), decltype(args.residue_tCcD)>(
        cute::move(tC_rCol), args.tCcD, args.residue_tCcD, tile_is_interior(args),
        int(m), int(n), int(M), int(N), args.thread_idx, params_ptr);
  }
};

}  // namespace coda::epi
