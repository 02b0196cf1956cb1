// coda/kernels/finalize.cuh — finishes per-tile reduction partials into vectors.
//
// A reduction in an epilogue writes one fp32 partial per (output index, tile) without
// atomics; this small kernel combines the `count` partials of every output index in a
// fixed order, so results are deterministic run to run and need no pre-filled output.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace coda::kernels {

enum class ReduceAxis : int { Rows = 0, Cols = 1 };       // Rows: length M; Cols: length N
enum class ReduceCombine : int { Sum = 0, Max = 1 };      // how partials combine

template <ReduceCombine Combine>
__global__ void finalize_partials_kernel(float const* __restrict__ partials, float* __restrict__ out,
                                         int64_t n_out, int64_t length, int64_t count) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_out) return;
  float acc = partials[i];
  for (int64_t j = 1; j < count; ++j) {
    float v = partials[i + j * length];
    if constexpr (Combine == ReduceCombine::Sum) {
      acc += v;
    } else {
      acc = (acc != acc || v != v) ? acc + v : (v > acc ? v : acc);
    }
  }
  out[i] = acc;
}

// partials: `count` vectors of `length` floats (length >= n_out), vector j at partials + j * length.
inline void launch_finalize(float const* partials, float* out, int64_t n_out, int64_t length, int64_t count,
                            ReduceCombine combine, cudaStream_t stream) {
  constexpr int kThreads = 256;
  unsigned blocks = unsigned((n_out + kThreads - 1) / kThreads);
  if (combine == ReduceCombine::Sum) {
    finalize_partials_kernel<ReduceCombine::Sum><<<blocks, kThreads, 0, stream>>>(partials, out, n_out, length, count);
  } else {
    finalize_partials_kernel<ReduceCombine::Max><<<blocks, kThreads, 0, stream>>>(partials, out, n_out, length, count);
  }
}

}  // namespace coda::kernels
