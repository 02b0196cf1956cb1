/* coda/abi.h — the plain C seam between a compiled epilogue kernel and its callers.
 *
 * Every kernel translation unit (emitted by coda_ext or built into libcoda) exports the
 * three entry points below. Callers (the torch binding, libcoda users, tests) fill a
 * CodaLaunch with device pointers, sizes and leading strides; the kernel translation unit
 * owns the packing of those into CUTLASS arguments. No torch, no CUTLASS types here.
 */
#ifndef CODA_ABI_H
#define CODA_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CODA_ABI_VERSION 1
#define CODA_MAX_SLOTS 32

/* One runtime operand of the epilogue: a tile (M x N, row-major with leading stride ld),
 * a vector (length M or N, contiguous), a scalar value, or a scalar device pointer. */
typedef struct CodaSlot {
  void* ptr;      /* device pointer, or NULL for a scalar passed by value */
  int64_t ld;     /* leading stride in elements (tiles); 0 otherwise */
  float value;    /* scalar value (runtime scalars) */
} CodaSlot;

typedef struct CodaLaunch {
  int32_t abi_version;  /* CODA_ABI_VERSION */
  int64_t M, N, K;
  const void* A; int64_t lda;   /* (M, K), K contiguous */
  const void* B; int64_t ldb;   /* (N, K), K contiguous: torch.nn.Linear's weight */
  void* D; int64_t ldd;         /* (M, N), N contiguous */
  int32_t num_slots;
  CodaSlot slots[CODA_MAX_SLOTS]; /* in the graph's canonical slot order */
  void* workspace;              /* at least coda_workspace_size(...) bytes, 256-byte aligned */
  size_t workspace_bytes;
  int32_t sm_count;             /* 0: query the device */
  int32_t max_swizzle;          /* tile rasterization swizzle (1, 2, 4, 8, 16); 0: 1 */
  int32_t raster_order;         /* 0: heuristic, 1: along M, 2: along N; | 4: the scheduler's padded grid */
} CodaLaunch;

/* Status codes, listed once: X(C constant, coda::StatusCode enumerator, value, name). coda_run
 * returns the first six; libcoda's calls (coda/coda.h, coda/types.hpp) also the others. This list
 * makes the C constants below, coda::StatusCode and coda::status_code_name. */
#define CODA_STATUS_LIST(X)                                                                          \
  X(CODA_OK, kOk, 0, "ok")                                                                           \
  /* a null pointer, bad shape, stride, alignment, dtype or enum value */                            \
  X(CODA_ERROR_INVALID_ARGUMENT, kInvalidArgument, 1, "invalid argument")                            \
  /* CUTLASS refused the problem (should not happen after validation) */                             \
  X(CODA_ERROR_CAN_IMPLEMENT, kCanImplement, 2, "CUTLASS cannot implement the problem")              \
  /* workspace missing, smaller than the kernel needs, or misaligned */                              \
  X(CODA_ERROR_WORKSPACE, kBadWorkspace, 3, "bad workspace")                                         \
  /* CUTLASS could not set up the launch (e.g. the shared memory attribute) */                       \
  X(CODA_ERROR_INITIALIZE, kInitializeFailed, 4, "kernel initialization failed")                     \
  /* the kernel launch returned a CUDA error */                                                      \
  X(CODA_ERROR_LAUNCH, kLaunchFailed, 5, "kernel launch failed")                                     \
  /* this op/dtype is not compiled into this libcoda (see CODA_KERNELS) */                           \
  X(CODA_ERROR_NOT_BUILT, kNotBuilt, 16, "kernel not built")                                         \
  /* no CUDA device, or the current device is not SM90 (H100/H200) */                                \
  X(CODA_ERROR_UNSUPPORTED_DEVICE, kUnsupportedDevice, 17, "unsupported device")                     \
  /* a CUDA runtime query failed */                                                                  \
  X(CODA_ERROR_CUDA, kCudaError, 18, "CUDA error")

#define CODA_STATUS_CONSTANT(constant, enumerator, value, name) constant = value,
enum { CODA_STATUS_LIST(CODA_STATUS_CONSTANT) };
#undef CODA_STATUS_CONSTANT

/* Bytes of device workspace one launch of this kernel needs at this problem size. */
typedef size_t (*CodaWorkspaceSizeFn)(int64_t M, int64_t N, int64_t K);
/* Runs the GEMM + epilogue (and any reduction finalize kernels) on `stream`.
 * Returns CODA_OK or an error code; on error, a message is written to `err`. */
typedef int (*CodaRunFn)(const CodaLaunch* launch, void* stream, char* err, size_t err_len);

#ifdef __cplusplus
}
#endif

#endif /* CODA_ABI_H */
