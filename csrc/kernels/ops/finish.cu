// libcoda: the small kernels before and after its fused GEMMs (declarations and contracts in
// finish.h). No CUTLASS: a few seconds of nvcc. Every loop order is fixed, so results are
// bit-identical run to run.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>

#include "kernels/ops/finish.h"

namespace {

constexpr int kThreads = 256;
constexpr int kReduceThreads = 1024;  // one block sums every token (fixed order)

unsigned blocks_for(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  return unsigned(b < 65535 * 16 ? b : 65535 * 16);  // grid-stride loops cover the rest
}

__global__ void fill_kernel(float* out, int64_t n, float value) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = value;
}

__global__ void rstd_kernel(float* x, int64_t M, float n_cols, float eps) {
  for (int64_t m = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; m < M; m += int64_t(gridDim.x) * blockDim.x)
    x[m] = rsqrtf(x[m] / n_cols + eps);
}

template <class T>
__device__ float as_float(T v) {
  return float(v);
}
template <>
__device__ float as_float<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <>
__device__ float as_float<__half>(__half v) {
  return __half2float(v);
}

template <class T>
__global__ void qk_norm_kernel(const T* q, const T* k, int64_t head_dim, int64_t n_heads, int64_t n_kv_heads,
                               float* norm_a, float* norm_b) {
  const int64_t q_end = n_heads * head_dim, k_end = (n_heads + n_kv_heads) * head_dim;
  const int64_t N = k_end + n_kv_heads * head_dim;
  for (int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; n < N; n += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = n % head_dim;
    norm_b[n] = n < q_end ? as_float(q[d]) : n < k_end ? as_float(k[d]) : 0.0f;
    norm_a[n] = n < k_end ? 0.0f : 1.0f;
  }
}

__device__ float token_loss(const float* lse, const float* target_logit, const int32_t* target, int64_t m,
                            int64_t n_classes, int32_t ignore_index, int* counts) {
  const int32_t t = target[m];
  if (t == ignore_index) return 0.0f;
  *counts += 1;
  if (t < 0 || int64_t(t) >= n_classes) return NAN;
  return lse[m] - target_logit[m];
}

__global__ void cross_entropy_none_kernel(const float* lse, const float* target_logit, const int32_t* target,
                                          int64_t M, int64_t n_classes, int32_t ignore_index, float* loss) {
  for (int64_t m = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; m < M; m += int64_t(gridDim.x) * blockDim.x) {
    int unused = 0;
    loss[m] = token_loss(lse, target_logit, target, m, n_classes, ignore_index, &unused);
  }
}

// One block: thread i sums tokens i, i + 1024, ... in double, then a fixed tree.
__global__ void cross_entropy_reduce_kernel(const float* lse, const float* target_logit, const int32_t* target,
                                            int64_t M, int64_t n_classes, int32_t ignore_index, int mean,
                                            float* loss) {
  __shared__ double sums[kReduceThreads];
  __shared__ long long counts[kReduceThreads];
  double s = 0.0;
  long long c = 0;
  for (int64_t m = threadIdx.x; m < M; m += kReduceThreads) {
    int counted = 0;
    s += double(token_loss(lse, target_logit, target, m, n_classes, ignore_index, &counted));
    c += counted;
  }
  sums[threadIdx.x] = s;
  counts[threadIdx.x] = c;
  __syncthreads();
  for (int half = kReduceThreads / 2; half > 0; half /= 2) {
    if (int(threadIdx.x) < half) {
      sums[threadIdx.x] += sums[threadIdx.x + half];
      counts[threadIdx.x] += counts[threadIdx.x + half];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) loss[0] = mean ? float(sums[0] / double(counts[0])) : float(sums[0]);  // 0/0: NaN
}

int status(cudaError_t launched) { return int(launched != cudaSuccess ? launched : cudaGetLastError()); }

}  // namespace

extern "C" int coda_finish_fill(float* out, int64_t n, float value, void* stream) {
  if (n <= 0) return 0;
  fill_kernel<<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(out, n, value);
  return status(cudaSuccess);
}

extern "C" int coda_finish_rstd(float* x, int64_t M, int64_t n_cols, float eps, void* stream) {
  if (M <= 0) return 0;
  rstd_kernel<<<blocks_for(M), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, M, float(n_cols), eps);
  return status(cudaSuccess);
}

extern "C" int coda_finish_qk_norm_vectors(const void* q_weight, const void* k_weight, int32_t dtype,
                                           int64_t head_dim, int64_t n_heads, int64_t n_kv_heads, float* norm_a,
                                           float* norm_b, void* stream) {
  const int64_t N = (n_heads + 2 * n_kv_heads) * head_dim;
  if (N <= 0) return 0;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case CODA_FINISH_BF16:
      qk_norm_kernel<<<blocks_for(N), kThreads, 0, s>>>(static_cast<const __nv_bfloat16*>(q_weight),
                                                        static_cast<const __nv_bfloat16*>(k_weight), head_dim, n_heads,
                                                        n_kv_heads, norm_a, norm_b);
      break;
    case CODA_FINISH_FP16:
      qk_norm_kernel<<<blocks_for(N), kThreads, 0, s>>>(static_cast<const __half*>(q_weight),
                                                        static_cast<const __half*>(k_weight), head_dim, n_heads,
                                                        n_kv_heads, norm_a, norm_b);
      break;
    case CODA_FINISH_FP32:
      qk_norm_kernel<<<blocks_for(N), kThreads, 0, s>>>(static_cast<const float*>(q_weight),
                                                        static_cast<const float*>(k_weight), head_dim, n_heads,
                                                        n_kv_heads, norm_a, norm_b);
      break;
    default:
      return int(cudaErrorInvalidValue);
  }
  return status(cudaSuccess);
}

extern "C" int coda_finish_cross_entropy(const float* lse, const float* target_logit, const int32_t* target,
                                         int64_t M, int64_t n_classes, int32_t ignore_index, int32_t reduction,
                                         float* loss, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (reduction == CODA_FINISH_REDUCTION_NONE) {
    if (M <= 0) return 0;
    cross_entropy_none_kernel<<<blocks_for(M), kThreads, 0, s>>>(lse, target_logit, target, M, n_classes,
                                                                 ignore_index, loss);
  } else if (reduction == CODA_FINISH_REDUCTION_SUM || reduction == CODA_FINISH_REDUCTION_MEAN) {
    cross_entropy_reduce_kernel<<<1, kReduceThreads, 0, s>>>(lse, target_logit, target, M, n_classes, ignore_index,
                                                             reduction == CODA_FINISH_REDUCTION_MEAN, loss);
  } else {
    return int(cudaErrorInvalidValue);
  }
  return status(cudaSuccess);
}
