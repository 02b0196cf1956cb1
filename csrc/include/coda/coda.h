/* coda/coda.h — libcoda's C API: the ops of coda/ops.hpp as plain C functions, for C and
 * for other languages' foreign-function interfaces (ctypes, Rust, Julia, ...).
 *
 * Conventions: every op returns a status code (CODA_OK = 0) and, on failure, leaves a message
 * naming the argument and the fix in coda_last_error_message() (per thread). Tensors are
 * described by coda_tensor (device pointer, dtype, rank, shape, strides in elements); a NULL
 * options pointer means the defaults. `stream` is a cudaStream_t (NULL: the default stream).
 * See coda/ops.hpp for what each op computes and the alignment rules. */
#ifndef CODA_CODA_H
#define CODA_CODA_H

#include <stddef.h>
#include <stdint.h>

#include "coda/abi.h" /* the status codes: CODA_OK, CODA_ERROR_INVALID_ARGUMENT, ..., CODA_ERROR_CUDA */
#include "coda/export.h"
#include "coda/op_list.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Element types (values of coda_tensor.dtype). */
#define CODA_DTYPE_BF16 0
#define CODA_DTYPE_FP16 1
#define CODA_DTYPE_FP32 2
#define CODA_DTYPE_INT32 3

/* Ops (for the workspace query): CODA_OP_GEMM = 0, CODA_OP_GEMM_BIAS_ACT, ..., one per row of
 * coda/op_list.h. */
#define CODA_OP_CONSTANT(NAME, enumerator, value, name) CODA_OP_##NAME = value,
enum { CODA_OP_LIST(CODA_OP_CONSTANT) };
#undef CODA_OP_CONSTANT

/* Activations of coda_gemm_bias_act. */
#define CODA_ACT_IDENTITY 0
#define CODA_ACT_RELU 1
#define CODA_ACT_SILU 2
#define CODA_ACT_GELU_TANH 3
#define CODA_ACT_GELU 4

/* Reductions of coda_lm_head_cross_entropy. */
#define CODA_REDUCTION_NONE 0 /* loss: length M */
#define CODA_REDUCTION_SUM 1  /* loss: length 1 */
#define CODA_REDUCTION_MEAN 2 /* loss: length 1, over the tokens whose target is not ignore_index */

/* Tile orders (coda_options.raster). */
#define CODA_RASTER_DEFAULT 0   /* the order the op's config was tuned with */
#define CODA_RASTER_ALONG_M 1
#define CODA_RASTER_ALONG_N 2
#define CODA_RASTER_HEURISTIC 3 /* CUTLASS's choice */

typedef struct coda_tensor {
  void* data;         /* device pointer */
  int32_t dtype;      /* CODA_DTYPE_* */
  int32_t rank;       /* 1 (vector) or 2 (matrix) */
  int64_t shape[2];   /* rank 1: {length, 0}; rank 2: {rows, cols} */
  int64_t stride[2];  /* in elements; rank 1: {1, 0}; rank 2: {leading stride, 1} */
} coda_tensor;

/* Launch options; all zeros (or a NULL pointer) means the defaults. */
typedef struct coda_options {
  int32_t sm_count;            /* 0: all SMs of the current device */
  int32_t swizzle;             /* tile-scheduler swizzle 1, 2, 4, 8 or 16; 0: the op's tuned value */
  int32_t raster;              /* CODA_RASTER_*; 0: the op's tuned order */
  int32_t skip_pointer_checks; /* nonzero: do not ask the CUDA runtime whether pointers are device memory */
} coda_options;

/* D = A·Bᵀ */
CODA_API int coda_gemm(const coda_tensor* A, const coda_tensor* B, const coda_tensor* D, void* workspace,
                       size_t workspace_bytes, void* stream, const coda_options* options);
/* D = act(A·Bᵀ + bias) */
CODA_API int coda_gemm_bias_act(const coda_tensor* A, const coda_tensor* B, const coda_tensor* bias,
                                int32_t activation, const coda_tensor* D, void* workspace,
                                size_t workspace_bytes, void* stream, const coda_options* options);
/* D = A·Bᵀ + residual */
CODA_API int coda_gemm_residual(const coda_tensor* A, const coda_tensor* B, const coda_tensor* residual,
                                const coda_tensor* D, void* workspace, size_t workspace_bytes, void* stream,
                                const coda_options* options);
/* Z = A·Bᵀ; Y[:, i] = silu(Z[:, 2i]) · Z[:, 2i+1] */
CODA_API int coda_gemm_swiglu(const coda_tensor* A, const coda_tensor* B, const coda_tensor* Z,
                              const coda_tensor* Y, void* workspace, size_t workspace_bytes, void* stream,
                              const coda_options* options);
/* D = A·Bᵀ; sumsq[m] = Σ_n (A·Bᵀ)[m, n]² (fp32) */
CODA_API int coda_gemm_row_sumsq(const coda_tensor* A, const coda_tensor* B, const coda_tensor* D,
                                 const coda_tensor* sumsq, void* workspace, size_t workspace_bytes,
                                 void* stream, const coda_options* options);

/* The ops of a Transformer block (coda/ops.hpp has the full contracts). An optional tensor is a
 * NULL pointer (or a coda_tensor whose data is NULL). rstd, positions, losses are fp32. */

/* D = A·Bᵀ + residual; H = D ⊙ norm_weight; rstd[m] = rsqrt(Σ_n D[m, n]² / N + eps) */
CODA_API int coda_linear_residual_norm(const coda_tensor* A, const coda_tensor* B, const coda_tensor* residual,
                                       const coda_tensor* norm_weight, float eps, const coda_tensor* D,
                                       const coda_tensor* H, const coda_tensor* rstd, void* workspace,
                                       size_t workspace_bytes, void* stream, const coda_options* options);
/* D = act(rstd ⊙row A·Bᵀ) */
CODA_API int coda_rms_linear(const coda_tensor* A, const coda_tensor* B, const coda_tensor* rstd, int32_t activation,
                             const coda_tensor* D, void* workspace, size_t workspace_bytes, void* stream,
                             const coda_options* options);
/* z = [rstd ⊙row] A·Bᵀ; Y[:, i] = silu(z[:, 2i]) · z[:, 2i+1]; Z = z if Z is not NULL. rstd optional. */
CODA_API int coda_linear_swiglu(const coda_tensor* A, const coda_tensor* B, const coda_tensor* rstd,
                                const coda_tensor* Z, const coda_tensor* Y, void* workspace, size_t workspace_bytes,
                                void* stream, const coda_options* options);
/* out = RoPE([QK-norm]([rstd ⊙row] A·Bᵀ)) on Q and K heads, V unchanged. rstd, q_norm_weight and
 * k_norm_weight optional (the two weights together). freqs: coda_rope_frequencies' (2, N) table. */
CODA_API int coda_qkv_rope(const coda_tensor* A, const coda_tensor* B, const coda_tensor* positions,
                           const coda_tensor* freqs, int32_t n_heads, int32_t n_kv_heads, const coda_tensor* rstd,
                           const coda_tensor* q_norm_weight, const coda_tensor* k_norm_weight, float eps,
                           const coda_tensor* out, void* workspace, size_t workspace_bytes, void* stream,
                           const coda_options* options);
/* Writes the (2, N) fp32 table of coda_qkv_rope to host memory out (out_count = 2 * N floats).
 * inv_freq: head_dim / 2 doubles, or NULL for theta^(-2i / head_dim). */
CODA_API int coda_rope_frequencies(int32_t head_dim, int32_t n_heads, int32_t n_kv_heads, double theta,
                                   const double* inv_freq, float* out, int64_t out_count);
/* lse[m] = logsumexp_n logits[m, n], loss = lse − logits[m, target[m]] (0 where target == ignore_index),
 * reduced by CODA_REDUCTION_*, logits = [rstd ⊙row] A·Bᵀ never stored. target int32; rstd optional. */
CODA_API int coda_lm_head_cross_entropy(const coda_tensor* A, const coda_tensor* B, const coda_tensor* target,
                                        const coda_tensor* rstd, int32_t ignore_index, int32_t reduction,
                                        const coda_tensor* loss, const coda_tensor* lse, void* workspace,
                                        size_t workspace_bytes, void* stream, const coda_options* options);

/* Bytes of workspace one call needs (0 if none, or if the problem is invalid / not built). */
CODA_API size_t coda_workspace_size_of(int32_t op, int32_t dtype, int64_t M, int64_t N, int64_t K);
/* 1 if the kernel of (op, dtype) is compiled into this library. */
CODA_API int coda_is_built(int32_t op, int32_t dtype);
/* The message of the last failed call on this thread ("" after a success). */
CODA_API const char* coda_last_error_message(void);
/* A short name of a status code, e.g. "invalid argument". */
CODA_API const char* coda_status_name(int code);
/* The library version, e.g. "0.1.0". */
CODA_API const char* coda_version(void);

#ifdef __cplusplus
}
#endif

#endif /* CODA_CODA_H */
