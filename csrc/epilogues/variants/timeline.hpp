// coda/epilogues/variants/timeline.hpp — a per-tile timeline of the epilogue (KernelConfig(timeline=True)):
// where the time between two tiles of a warp group goes.
//
// The GEMM accumulator node, wrapped: its callbacks run at every step of CUTLASS's epilogue collectives, so one
// thread of each math warp group records the SM's cycle counter (clock64) at each of them, and the epilogue's
// load warp at each of its steps, into a device buffer indexed by the output tile (kTimelineSlots slots a tile):
//   0 consumer begin() (the epilogue starts: the tile's MMAs are done), 1 end(),
//   2 + 5 s + {0 begin_loop (subtile s starts, before its tile-input wait), 1 previsit (inputs in registers),
//   2 postreduce (math done, results in shared memory), 3 tma_store (stores issued, after the warp group's
//   barrier), 4 end_loop (the next store stage acquired)}, for s < kTimelineSubtiles;
//   82 producer begin() (the load warp reaches the tile), 83 + s its step s (stage s acquired, loads issued);
//   124 globaltimer (ns) at consumer begin(), 125 at end(), 126 SM id, 127 thread index / 128 (the warp group).
// Unwritten slots stay 0 (the buffer is cleared by coda_timeline_clear). Host side: coda_timeline_clear() and
// coda_timeline_copy(dst, bytes), exported by the kernel library (benchmarks/epilogue_timeline.py reads them).
// A diagnostic: the extra stores cost a little time; the values computed are unchanged.
//
// A variant header (csrc/epilogues/variants/): included by the emitted source of the kernels that use it only,
// after the kernel templates, so a change here re-keys those kernels alone (coda_ext.jit.cache.variant_digest).
#pragma once

#include <cuda_runtime.h>

#include "../nodes.hpp"

namespace coda::epi {

constexpr int kTimelineSlots = 128;
constexpr int kTimelineSubtiles = 16;
constexpr int kTimelineTiles = 16384;   // tiles past this (in the grid's M-major tile order) are not recorded

__device__ unsigned long long coda_timeline_buffer[kTimelineTiles * kTimelineSlots];

CUTLASS_DEVICE unsigned long long timeline_globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

CUTLASS_DEVICE unsigned timeline_smid() {
  unsigned id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  return id;
}

// The tile's slots, or nullptr for tiles past kTimelineTiles and for the tiles past the problem that a swizzled
// persistent scheduler also runs (it rounds the tile grid up to whole swizzle groups: their slots would be another
// tile's).
template <class Args>
CUTLASS_DEVICE unsigned long long* timeline_slots(Args const& args) {
  using namespace cute;
  auto [M, N, K, L] = args.problem_shape_mnkl;
  auto [m, n, k, l] = args.tile_coord_mnkl;
  int tiles_m = (int(M) + int(size<0>(args.tile_shape_mnk)) - 1) / int(size<0>(args.tile_shape_mnk));
  int tiles_n = (int(N) + int(size<1>(args.tile_shape_mnk)) - 1) / int(size<1>(args.tile_shape_mnk));
  if (int(m) >= tiles_m || int(n) >= tiles_n) return nullptr;
  long tile = long(m) * tiles_n + long(n);
  return tile < kTimelineTiles ? coda_timeline_buffer + tile * kTimelineSlots : nullptr;
}

template <class Base>
struct TimelineNode : Base {
  using Base::Base;

  template <class Callbacks>
  struct Consumer : Callbacks {
    CUTLASS_DEVICE Consumer(Callbacks&& cb, unsigned long long* slots, int subtiles_m)
        : Callbacks(cute::move(cb)), slots(slots), subtiles_m(subtiles_m) {}
    unsigned long long* slots;   // nullptr: this thread does not record
    int subtiles_m;

    CUTLASS_DEVICE void mark(int slot, unsigned long long v) {
      if (slots) slots[slot] = v;
    }
    CUTLASS_DEVICE void mark_subtile(int epi_m, int epi_n, int step) {
      int s = epi_n * subtiles_m + epi_m;
      if (s < kTimelineSubtiles) mark(2 + 5 * s + step, clock64());
    }
    CUTLASS_DEVICE void begin() {
      mark(0, clock64());
      mark(124, timeline_globaltimer());
      mark(126, timeline_smid());
      mark(127, threadIdx.x / 128);
      Callbacks::begin();
    }
    CUTLASS_DEVICE void begin_loop(int epi_m, int epi_n) {
      mark_subtile(epi_m, epi_n, 0);
      Callbacks::begin_loop(epi_m, epi_n);
    }
    CUTLASS_DEVICE void previsit(int epi_m, int epi_n, int load_iteration, bool is_producer_load_needed) {
      mark_subtile(epi_m, epi_n, 1);
      Callbacks::previsit(epi_m, epi_n, load_iteration, is_producer_load_needed);
    }
    CUTLASS_DEVICE void postreduce(int epi_m, int epi_n, int store_iteration, bool issue_smem_store) {
      mark_subtile(epi_m, epi_n, 2);
      Callbacks::postreduce(epi_m, epi_n, store_iteration, issue_smem_store);
    }
    CUTLASS_DEVICE void tma_store(int epi_m, int epi_n, int store_iteration, bool issue_tma_store) {
      mark_subtile(epi_m, epi_n, 3);
      Callbacks::tma_store(epi_m, epi_n, store_iteration, issue_tma_store);
    }
    CUTLASS_DEVICE void end_loop(int epi_m, int epi_n) {
      Callbacks::end_loop(epi_m, epi_n);
      mark_subtile(epi_m, epi_n, 4);
    }
    CUTLASS_DEVICE void end() {
      Callbacks::end();
      mark(1, clock64());
      mark(125, timeline_globaltimer());
    }
  };

  template <class Callbacks>
  struct Producer : Callbacks {
    CUTLASS_DEVICE Producer(Callbacks&& cb, unsigned long long* slots, int subtiles_m)
        : Callbacks(cute::move(cb)), slots(slots), subtiles_m(subtiles_m) {}
    unsigned long long* slots;
    int subtiles_m;

    CUTLASS_DEVICE void begin() {
      if (slots && cute::elect_one_sync()) slots[82] = clock64();
      Callbacks::begin();
    }
    CUTLASS_DEVICE void step(uint64_t* full_mbarrier_ptr, int epi_m, int epi_n, int load_iteration,
                             bool issue_tma_load) {
      int s = epi_n * subtiles_m + epi_m;
      if (slots && issue_tma_load && s < kTimelineSubtiles) slots[83 + s] = clock64();
      Callbacks::step(full_mbarrier_ptr, epi_m, epi_n, load_iteration, issue_tma_load);
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
    auto cb = Base::template get_consumer_store_callbacks<ReferenceSrc>(args);
    bool records = args.thread_idx % 128 == 0;   // one thread of each math warp group
    int subtiles_m = int(cute::size<0>(args.tile_shape_mnk)) / int(cute::size<0>(args.epi_tile));
    return Consumer<decltype(cb)>(cute::move(cb), records ? timeline_slots(args) : nullptr, subtiles_m);
  }

  template <class... Args>
  CUTLASS_DEVICE auto get_producer_load_callbacks(cutlass::epilogue::fusion::ProducerLoadArgs<Args...> const& args) {
    auto cb = Base::get_producer_load_callbacks(args);
    int subtiles_m = int(cute::size<0>(args.tile_shape_mnk)) / int(cute::size<0>(args.epi_tile));
    return Producer<decltype(cb)>(cute::move(cb), timeline_slots(args), subtiles_m);
  }
};

// The accumulator node (nodes.hpp's Accumulator) recording the timeline.
struct TimelineAccumulator {
  using Node = TimelineNode<fusion::Sm90AccFetch>;
  static typename Node::Arguments args() { return {}; }
};

}  // namespace coda::epi

extern "C" __attribute__((visibility("default"))) int coda_timeline_clear() {
  void* p = nullptr;
  if (cudaGetSymbolAddress(&p, coda::epi::coda_timeline_buffer) != cudaSuccess) return 1;
  return cudaMemset(p, 0, sizeof(coda::epi::coda_timeline_buffer)) == cudaSuccess ? 0 : 1;
}

extern "C" __attribute__((visibility("default"))) int coda_timeline_copy(void* dst, unsigned long long bytes) {
  if (bytes > sizeof(coda::epi::coda_timeline_buffer)) bytes = sizeof(coda::epi::coda_timeline_buffer);
  return cudaMemcpyFromSymbol(dst, coda::epi::coda_timeline_buffer, bytes) == cudaSuccess ? 0 : 1;
}
