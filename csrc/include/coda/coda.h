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

#include "coda/abi.h" /* CODA_OK, CODA_ERROR_INVALID_ARGUMENT, ..., CODA_ERROR_LAUNCH */
#include "coda/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes beyond the kernel ABI's (coda/abi.h defines 0..5). */
#define CODA_ERROR_NOT_BUILT 16          /* this op/dtype is not compiled into this libcoda */
#define CODA_ERROR_UNSUPPORTED_DEVICE 17 /* no CUDA device, or it is not SM90 */
#define CODA_ERROR_CUDA 18               /* a CUDA runtime query failed */

/* Element types (values of coda_tensor.dtype). */
#define CODA_DTYPE_BF16 0
#define CODA_DTYPE_FP16 1
#define CODA_DTYPE_FP32 2

/* Ops (for the workspace query). */
#define CODA_OP_GEMM 0
#define CODA_OP_GEMM_BIAS_ACT 1
#define CODA_OP_GEMM_RESIDUAL 2
#define CODA_OP_GEMM_SWIGLU 3
#define CODA_OP_GEMM_ROW_SUMSQ 4

/* Activations of coda_gemm_bias_act. */
#define CODA_ACT_IDENTITY 0
#define CODA_ACT_RELU 1
#define CODA_ACT_SILU 2
#define CODA_ACT_GELU_TANH 3
#define CODA_ACT_GELU 4

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
  int32_t swizzle;             /* tile-scheduler swizzle 1, 2, 4 or 8; 0: 1 */
  int32_t raster;              /* 0: heuristic, 1: along M, 2: along N */
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
