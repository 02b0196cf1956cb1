// coda/kernels/finalize.cuh — finishes per-tile reduction partials into vectors.
//
// A reduction in an epilogue writes one fp32 partial per (output index, tile) without
// atomics; one small launch finishes every reduction of a graph. Each output index is
// combined by a column of `slices` threads: thread s folds partials s, s + slices, ... into
// four independent accumulators, and the slices are folded in index order. The order
// depends only on the partial count, so results are deterministic run to run, and the
// loads of one output are spread over many threads (a latency-bound loop of hundreds of
// dependent loads per output, at small M, cost more than the GEMM's epilogue).
#pragma once

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include <atomic>

namespace coda::kernels {

enum class ReduceAxis : int { Rows = 0, Cols = 1 };       // Rows: length M; Cols: length N
enum class ReduceCombine : int { Sum = 0, Max = 1, LogSumExp = 2 };  // how partials combine

// One reduction to finish: `count` vectors of `length` floats (length >= n_out), vector j at
// partials + j * length; the result (n_out floats) goes to `out`.
struct FinalizeItem {
  float const* partials;
  float* out;
  int64_t n_out;
  int64_t length;
  int64_t count;
  ReduceCombine combine;
  ReduceAxis axis;  // which tiles a vector element's partials come from (finished in the kernel: last_tile.hpp)
};

// A fresh nonzero 40-bit tag for the tile counters of one launch (epilogues/last_tile.hpp).
inline uint64_t next_epoch() {
  static std::atomic<uint64_t> launches{0};  // one sequence per kernel library, offset by where it is loaded
  uint64_t z = reinterpret_cast<uintptr_t>(&launches) +
               (launches.fetch_add(1, std::memory_order_relaxed) + 1) * 0x9E3779B97F4A7C15ull;  // splitmix64
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  z &= (1ull << 40) - 1;
  return z == 0 ? 1 : z;
}

constexpr int kMaxFinalizeItems = 8;
struct FinalizeBatch {
  int n_items;
  FinalizeItem items[kMaxFinalizeItems];
};

constexpr int kFinalizeLanes = 32;       // output indices per block (one coalesced 128-byte row)
constexpr int kFinalizeMaxSlices = 32;   // threads per output index
constexpr int kFinalizeLoadsPerThread = 8;

__device__ __forceinline__ float combine_partial(ReduceCombine c, float a, float b) {
  if (c == ReduceCombine::Sum) return a + b;
  if (c == ReduceCombine::LogSumExp) {  // log(e^a + e^b), -inf the identity, NaN propagates
    float hi = fmaxf(a, b), lo = fminf(a, b);
    if (a != a || b != b) return a + b;
    if (lo == -INFINITY || hi == INFINITY) return hi;
    return hi + log1pf(expf(lo - hi));
  }
  return (a != a || b != b) ? a + b : (b > a ? b : a);  // max that propagates NaN
}

// static: one private copy per translation unit (libcoda links several that include this header).
static __global__ void finalize_partials_kernel(FinalizeBatch batch) {
  __shared__ float folded[kFinalizeMaxSlices][kFinalizeLanes + 1];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Launched as a programmatic dependent of the GEMM: wait until that grid has completed and
  // its partials are visible (a no-op when launched normally).
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  FinalizeItem const& item = batch.items[blockIdx.y];
  int64_t first = int64_t(blockIdx.x) * kFinalizeLanes;
  if (first >= item.n_out) return;  // whole block: no thread reaches the barrier
  int64_t i = first + threadIdx.x;
  int slice = threadIdx.y, slices = blockDim.y;
  ReduceCombine c = item.combine;
  float identity = c == ReduceCombine::Sum ? 0.0f : -INFINITY;
  float acc[4] = {identity, identity, identity, identity};
  if (i < item.n_out) {
    float const* p = item.partials + i;
    int64_t j = slice;
    for (; j + 3 * slices < item.count; j += 4 * slices) {
      float v0 = p[j * item.length], v1 = p[(j + slices) * item.length];
      float v2 = p[(j + 2 * slices) * item.length], v3 = p[(j + 3 * slices) * item.length];
      acc[0] = combine_partial(c, acc[0], v0);
      acc[1] = combine_partial(c, acc[1], v1);
      acc[2] = combine_partial(c, acc[2], v2);
      acc[3] = combine_partial(c, acc[3], v3);
    }
    for (int k = 0; j < item.count; j += slices, ++k) acc[k] = combine_partial(c, acc[k], p[j * item.length]);
  }
  folded[slice][threadIdx.x] = combine_partial(c, combine_partial(c, acc[0], acc[1]), combine_partial(c, acc[2], acc[3]));
  __syncthreads();
  if (slice == 0 && i < item.n_out) {
    float r = folded[0][threadIdx.x];
    for (int s = 1; s < slices; ++s) r = combine_partial(c, r, folded[s][threadIdx.x]);
    item.out[i] = r;
  }
}

// Threads per output index: enough that each loads at most kFinalizeLoadsPerThread partials
// (up to kFinalizeMaxSlices), a power of two.
inline int finalize_slices(int64_t max_count) {
  int slices = 1;
  while (slices < kFinalizeMaxSlices && int64_t(slices) * kFinalizeLoadsPerThread < max_count) slices *= 2;
  return slices;
}

// One launch finishes every item of the batch (none: no launch), as a programmatic dependent
// of the kernel before it in the stream.
inline cudaError_t launch_finalize(FinalizeBatch const& batch, cudaStream_t stream) {
  if (batch.n_items <= 0) return cudaSuccess;
  if (batch.n_items > kMaxFinalizeItems) return cudaErrorInvalidValue;
  int64_t max_out = 0, max_count = 0;
  for (int k = 0; k < batch.n_items; ++k) {
    max_out = batch.items[k].n_out > max_out ? batch.items[k].n_out : max_out;
    max_count = batch.items[k].count > max_count ? batch.items[k].count : max_count;
  }
  if (max_out <= 0) return cudaSuccess;
  dim3 block(kFinalizeLanes, finalize_slices(max_count));
  dim3 grid(unsigned((max_out + kFinalizeLanes - 1) / kFinalizeLanes), unsigned(batch.n_items));
  // Programmatic stream serialization: the launch may begin before the GEMM before it in the
  // stream has finished (the kernel waits for it first), which hides the launch latency.
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  config.attrs = &attr;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, finalize_partials_kernel, batch);
}

}  // namespace coda::kernels
