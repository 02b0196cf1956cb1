/* coda/kernels/ops/finish.h — the small CUDA kernels around libcoda's fused ops (finish.cu):
 * what the host does before a GEMM (a vector of ones for an absent rstd, the QK-norm weight
 * vectors) and after it (rstd from the sum of squares, the cross-entropy loss). Plain C: the
 * host code calls them through the kernel table (csrc/lib/kernel_table.cpp.in), which has them
 * whenever CMake compiles a kernel that needs them. Each enqueues on `stream` and returns a
 * cudaError_t value (0: launched). */
#ifndef CODA_KERNELS_OPS_FINISH_H
#define CODA_KERNELS_OPS_FINISH_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Element types of coda_finish_qk_norm_vectors' weights (coda::DType values). */
#define CODA_FINISH_BF16 0
#define CODA_FINISH_FP16 1
#define CODA_FINISH_FP32 2

/* Reductions of coda_finish_cross_entropy (coda::Reduction values). */
#define CODA_FINISH_REDUCTION_NONE 0
#define CODA_FINISH_REDUCTION_SUM 1
#define CODA_FINISH_REDUCTION_MEAN 2

/* out[i] = value for i < n. */
int coda_finish_fill(float* out, int64_t n, float value, void* stream);

/* In place: x[m] = rsqrt(x[m] / n_cols + eps) for m < M (x holds Σ_n out[m, n]² on entry). */
int coda_finish_rstd(float* x, int64_t M, int64_t n_cols, float eps, void* stream);

/* The per-column QK-norm vectors of a [Q | K | V] row of N = (n_heads + 2 n_kv_heads) · head_dim
 * columns: norm_b = q_weight (per Q head), k_weight (per K head), 0 on V; norm_a = 1 on V, else 0.
 * The weights are head_dim elements of `dtype` (CODA_FINISH_*). */
int coda_finish_qk_norm_vectors(const void* q_weight, const void* k_weight, int32_t dtype, int64_t head_dim,
                                int64_t n_heads, int64_t n_kv_heads, float* norm_a, float* norm_b, void* stream);

/* Per token: l[m] = 0 where target[m] == ignore_index, lse[m] - target_logit[m] where
 * 0 <= target[m] < n_classes, NaN otherwise (a target out of range). reduction NONE: loss[m] = l[m];
 * SUM: loss[0] = Σ l; MEAN: loss[0] = Σ l / (number of tokens whose target is not ignore_index)
 * (NaN when there is none, as torch). Sums are in double, in a fixed order (deterministic). */
int coda_finish_cross_entropy(const float* lse, const float* target_logit, const int32_t* target, int64_t M,
                              int64_t n_classes, int32_t ignore_index, int32_t reduction, float* loss, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* CODA_KERNELS_OPS_FINISH_H */
