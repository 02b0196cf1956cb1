// coda/epilogues/last_tile.hpp — reductions finished inside the GEMM: the CTA whose tile is the
// last of its row (or column) of tiles to write its partials folds them into the output vector,
// instead of a finalize launch after the GEMM (kernels::launch_finalize).
//
// KernelConfig(finalize="kernel"): a CUTLASS SM90 visitor node put at the root of a fusion whose graph
// has reductions (FinishReductions below); it passes its input through. Measured slower than the
// finalize launch at every shape tried (1.01-2.4x at 128-4096 rows on an H200: the count's
// compare-and-swap contends where all tiles end together, and every tile's epilogue waits on it),
// so not the default; kept for comparison. Its reduce() runs after every other node's
// on the tile's last subtile, when their partials are written: the tile's epilogue threads meet, one
// of them releases their writes and counts the tile in (CUTLASS's GenericBarrier pattern: a barrier,
// then one thread's gpu-scope fence and atomic), and where it was the last of its row (column) of
// tiles it acquires the others' and the threads fold that block of the output vector, one output a
// thread: four interleaved accumulators over the partials in index order, 32 loads in flight, then
// (a0 + a1) + (a2 + a3) — a fixed order (deterministic), not the finalize kernel's (a few ulp apart).
//
// The counters live in the launch's workspace, whose contents are not cleared between launches:
// each holds (epoch << 24) | tiles counted, and a count carried under another epoch is read as 0.
// The host gives every launch a fresh nonzero 40-bit epoch, and the last tile puts its counter back
// to 0, so a CUDA graph's replays (one epoch, one workspace) start from 0 too.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp>

#include "../kernels/finalize.cuh"
#include "node_base.hpp"

namespace coda::epi {

struct FinishReductionsArguments {
  kernels::FinalizeBatch batch{};               // the reductions to finish; n_items 0: none here
  uint64_t epoch = 0;                           // this launch's, nonzero, < 2^40
  unsigned long long* row_counters = nullptr;   // one per M-tile (row reductions)
  unsigned long long* col_counters = nullptr;   // one per N-tile (column reductions)
};

// Counts one tile into `counter` (after a gpu-scope fence: the CTA's writes before it are released);
// true for the tile that makes it `expected`, the counter then 0 again and the other tiles' writes acquired.
__device__ __forceinline__ bool count_tile_in(unsigned long long* counter, uint64_t epoch, int expected) {
  constexpr unsigned long long kCountMask = (1ull << 24) - 1;
  asm volatile("fence.acq_rel.gpu;" ::: "memory");
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
  asm volatile("fence.acq_rel.gpu;" ::: "memory");
  return true;
}

// Output i of a reduction from its partials (written by other CTAs during this launch: loads bypass L1).
__device__ __forceinline__ float fold_in_kernel(kernels::FinalizeItem const& item, int64_t i) {
  constexpr int kBatch = 32;
  kernels::ReduceCombine c = item.combine;
  float identity = c == kernels::ReduceCombine::Sum ? 0.0f : -INFINITY;
  float const* p = item.partials + i;
  float acc[4] = {identity, identity, identity, identity};
  for (int64_t base = 0; base < item.count; base += kBatch) {
    float v[kBatch];
    CUTLASS_PRAGMA_UNROLL
    for (int t = 0; t < kBatch; ++t) v[t] = base + t < item.count ? __ldcg(p + (base + t) * item.length) : identity;
    CUTLASS_PRAGMA_UNROLL
    for (int t = 0; t < kBatch; ++t) acc[t & 3] = kernels::combine_partial(c, acc[t & 3], v[t]);
  }
  float lo = kernels::combine_partial(c, acc[0], acc[1]), hi = kernels::combine_partial(c, acc[2], acc[3]);
  return kernels::combine_partial(c, lo, hi);
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
      sync_fn();  // every thread's partials written
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
      for (int k = 0; k < p.batch.n_items; ++k) {
        kernels::FinalizeItem const& item = p.batch.items[k];
        bool row = item.axis == kernels::ReduceAxis::Rows;
        if (!(flags & (row ? 1 : 2))) continue;
        int64_t first = row ? int64_t(m_tile) * TileM : int64_t(n_tile) * TileN;
        int64_t end = first + (row ? TileM : TileN);
        end = end < item.n_out ? end : item.n_out;
        for (int64_t i = first + thread_idx; i < end; i += Threads) item.out[i] = fold_in_kernel(item, i);
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
