// coda/epilogues/last_tile.hpp — reductions finished inside the GEMM: the CTA whose tile is the
// last of its row (or column) of tiles to write its partials folds them into the output vector,
// instead of a finalize launch after the GEMM (kernels::launch_finalize). Small M is where that
// launch costs most: a 10–25 µs GEMM at 128 rows.
//
// A CUTLASS SM90 visitor node put at the root of a fusion whose graph has reductions
// (FinishReductions below); it passes its input through. Its reduce() runs after every other node's
// on the tile's last subtile, when their partials are written: the tile's epilogue threads fence and
// meet, one of them counts the tile in, and where it was the last of its row (column) of tiles the
// threads fold that block of the output vector from the partials, in the finalize kernel's order
// (kernels::fold_partials: the same bits).
//
// The counters live in the launch's workspace, whose contents are not cleared between launches:
// each holds (epoch << 24) | tiles counted, and a count carried under another epoch is read as 0.
// The host gives every launch a fresh nonzero 40-bit epoch, and the last tile puts its counter back
// to 0, so a CUDA graph's replays (one epoch, one workspace) start from 0 too.
// FinishReductionsArguments::batch.n_items == 0 (the default) leaves the partials to the launch.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp>

#include "../kernels/finalize.cuh"
#include "node_base.hpp"

namespace coda::epi {

struct FinishReductionsArguments {
  kernels::FinalizeBatch batch{};               // the reductions to finish; n_items 0: none here
  int slices = 1;                               // the finalize kernel's threads per output (its fold order)
  uint64_t epoch = 0;                           // this launch's, nonzero, < 2^40
  unsigned long long* row_counters = nullptr;   // one per M-tile (row reductions)
  unsigned long long* col_counters = nullptr;   // one per N-tile (column reductions)
};

// Counts one tile into `counter`; true for the tile that makes it `expected` (the counter is then 0 again).
__device__ __forceinline__ bool count_tile_in(unsigned long long* counter, uint64_t epoch, int expected) {
  constexpr unsigned long long kCountMask = (1ull << 24) - 1;
  unsigned long long old = *reinterpret_cast<unsigned long long volatile*>(counter);
  unsigned long long counted;
  while (true) {
    counted = (old >> 24) == epoch ? (old & kCountMask) : 0ull;
    unsigned long long seen = atomicCAS(counter, old, (epoch << 24) | (counted + 1));
    if (seen == old) break;
    old = seen;
  }
  if (counted + 1 != static_cast<unsigned long long>(expected)) return false;
  atomicExch(counter, 0ull);
  return true;
}

template <class CtaTileShapeMNK>
struct Sm90FinishReductions : Sm90PlainNode<FinishReductionsArguments> {
  using Sm90PlainNode::Sm90PlainNode;

  template <int Threads>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE ConsumerStoreCallbacks(int m_tile, int n_tile, int M, int N, int thread_idx,
                                          Params const* params_ptr)
        : m_tile(m_tile), n_tile(n_tile), M(M), N(N), thread_idx(thread_idx), params_ptr(params_ptr) {}

    int m_tile, n_tile, M, N, thread_idx;
    Params const* params_ptr;

    template <class ElementAccumulator, class ElementInput, int FragmentSize>
    CUTLASS_DEVICE auto visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int, int, int,
                              cutlass::Array<ElementInput, FragmentSize> const& frg_input) {
      return frg_input;
    }

    template <class STensor, class SyncFn, class VTensor>
    CUTLASS_DEVICE void reduce(STensor&& smem_buffer, SyncFn const& sync_fn, int, int, bool is_last_iteration,
                               VTensor) {
      using namespace cute;
      constexpr int TileM = size<0>(CtaTileShapeMNK{});
      constexpr int TileN = size<1>(CtaTileShapeMNK{});
      Params const& p = *params_ptr;
      if (!is_last_iteration || p.batch.n_items == 0) return;
      // A tile wholly beyond the problem (the grid's padding) wrote no partials: it does not count.
      if (m_tile * TileM >= M || n_tile * TileN >= N) return;
      bool rows = false, cols = false;
      for (int k = 0; k < p.batch.n_items; ++k) {
        rows |= p.batch.items[k].axis == kernels::ReduceAxis::Rows;
        cols |= p.batch.items[k].axis == kernels::ReduceAxis::Cols;
      }
      int* last = reinterpret_cast<int*>(raw_pointer_cast(smem_buffer.data()));
      __threadfence();  // this tile's partials, written by every thread, before it is counted
      sync_fn();
      if (thread_idx == 0) {
        int flags = 0;
        if (rows && count_tile_in(p.row_counters + m_tile, p.epoch, (N + TileN - 1) / TileN)) flags |= 1;
        if (cols && count_tile_in(p.col_counters + n_tile, p.epoch, (M + TileM - 1) / TileM)) flags |= 2;
        *last = flags;
      }
      sync_fn();
      int flags = *last;
      sync_fn();  // the buffer is this subtile's store buffer: free it for the copy of D
      if (flags == 0) return;
      __threadfence();  // the other tiles' partials, counted before this one, are read after
      for (int k = 0; k < p.batch.n_items; ++k) {
        kernels::FinalizeItem const& item = p.batch.items[k];
        bool row = item.axis == kernels::ReduceAxis::Rows;
        if (!(flags & (row ? 1 : 2))) continue;
        int64_t first = row ? int64_t(m_tile) * TileM : int64_t(n_tile) * TileN;
        int64_t end = first + (row ? TileM : TileN);
        end = end < item.n_out ? end : item.n_out;
        for (int64_t i = first + thread_idx; i < end; i += Threads) item.out[i] = kernels::fold_partials(item, i, p.slices);
      }
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
    constexpr int Threads = decltype(args.tiled_copy)::TiledNumThr::value;
    auto [M, N, K, L] = args.problem_shape_mnkl;
    auto [m, n, k, l] = args.tile_coord_mnkl;
    return ConsumerStoreCallbacks<Threads>(int(m), int(n), int(M), int(N), args.thread_idx, params_ptr);
  }
};

// A fusion whose reductions the kernel can finish itself: the finishing node at its root.
template <class Cfg, class Body>
struct FinishReductions : cutlass::epilogue::fusion::Sm90EVT<Sm90FinishReductions<typename Cfg::TileShape>, Body> {
  using Base = cutlass::epilogue::fusion::Sm90EVT<Sm90FinishReductions<typename Cfg::TileShape>, Body>;
  using Base::Base;
  static constexpr bool kFinishesReductions = true;
};

// Whether a fusion (possibly wrapped, as WithoutD does) has the finishing node at its root.
template <class Fusion, class = void>
struct finishes_reductions : cute::false_type {};
template <class Fusion>
struct finishes_reductions<Fusion, cute::void_t<decltype(Fusion::kFinishesReductions)>>
    : cute::bool_constant<Fusion::kFinishesReductions> {};

}  // namespace coda::epi
