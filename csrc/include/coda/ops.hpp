// coda/ops.hpp — libcoda's ready-made fused GEMM kernels for SM90 (H100/H200).
//
// Every op computes the GEMM  A · Bᵀ  with A (M, K) and B (N, K) both K-contiguous — B is
// laid out as torch.nn.Linear stores its weight — accumulates in fp32, applies its epilogue
// in fp32 while the tile is on chip, and writes outputs in the operands' dtype (bf16 or fp16).
//
// Contract of every call:
//  * All pointers are device memory of the current device; nothing is allocated or synchronised.
//  * Arguments are validated first. A mistake (null pointer, shape, stride, alignment, dtype,
//    enum value, workspace, overlapping outputs) returns a Status naming the argument and the
//    fix; nothing is launched and the GPU is not touched.
//  * Alignment: A, B, D, Z and residual are read or written with TMA — their base pointers must
//    be 16-byte aligned and their leading strides a multiple of 16 bytes (8 elements); K and N
//    must be multiples of 8. bias must be 16-byte aligned. Y and sumsq need natural alignment.
//  * Outputs may not overlap each other or any input (no in-place residual).
//  * `workspace` must hold workspace_size({op, dtype, M, N, K}) bytes (often 0), 256-byte aligned.
//  * The work is enqueued on `stream`; the call returns without waiting for it.
#pragma once

#include <cuda_runtime_api.h>

#include "coda/export.h"
#include "coda/types.hpp"

namespace coda {

// D (M, N) = A · Bᵀ
CODA_API Status gemm(const TensorRef& A, const TensorRef& B, const TensorRef& D, Workspace workspace,
                     cudaStream_t stream, const Options& options = {});

// D (M, N) = act(A · Bᵀ + bias), bias a length-N vector of the operands' dtype.
CODA_API Status gemm_bias_act(const TensorRef& A, const TensorRef& B, const TensorRef& bias, Activation act,
                              const TensorRef& D, Workspace workspace, cudaStream_t stream,
                              const Options& options = {});

// D (M, N) = A · Bᵀ + residual, residual (M, N) of the operands' dtype.
CODA_API Status gemm_residual(const TensorRef& A, const TensorRef& B, const TensorRef& residual,
                              const TensorRef& D, Workspace workspace, cudaStream_t stream,
                              const Options& options = {});

// SwiGLU of an interleaved gate/up projection, at half width:
//   Z (M, N)     = A · Bᵀ                      (rows of B alternate gate, up, gate, up, ...)
//   Y (M, N / 2) = silu(Z[:, 2i]) · Z[:, 2i+1]  computed from the fp32 accumulator
// Z is the pre-activation the backward pass needs; this kernel always writes it.
CODA_API Status gemm_swiglu(const TensorRef& A, const TensorRef& B, const TensorRef& Z, const TensorRef& Y,
                            Workspace workspace, cudaStream_t stream, const Options& options = {});

// D (M, N) = A · Bᵀ and sumsq (length M, fp32) = Σ_n (A · Bᵀ)[m, n]², summed in fp32 from the
// unrounded accumulator — the statistic of an RMSNorm of D: rstd = rsqrt(sumsq / N + eps).
// Deterministic (per-tile partials in the workspace, finished in a fixed order). Needs a workspace.
CODA_API Status gemm_row_sumsq(const TensorRef& A, const TensorRef& B, const TensorRef& D,
                               const TensorRef& sumsq, Workspace workspace, cudaStream_t stream,
                               const Options& options = {});

// Bytes of device workspace one call of `problem.op` needs (0 if none). Also 0 when the problem
// is invalid (M, N or K < 1) or the kernel is not built; the call itself then says why.
// Runs no kernel and needs no GPU.
CODA_API size_t workspace_size(const Problem& problem);

inline size_t gemm_workspace_size(DType dtype, int64_t M, int64_t N, int64_t K) {
  return workspace_size({Op::kGemm, dtype, M, N, K});
}
inline size_t gemm_bias_act_workspace_size(DType dtype, int64_t M, int64_t N, int64_t K) {
  return workspace_size({Op::kGemmBiasAct, dtype, M, N, K});
}
inline size_t gemm_residual_workspace_size(DType dtype, int64_t M, int64_t N, int64_t K) {
  return workspace_size({Op::kGemmResidual, dtype, M, N, K});
}
inline size_t gemm_swiglu_workspace_size(DType dtype, int64_t M, int64_t N, int64_t K) {
  return workspace_size({Op::kGemmSwiglu, dtype, M, N, K});
}
inline size_t gemm_row_sumsq_workspace_size(DType dtype, int64_t M, int64_t N, int64_t K) {
  return workspace_size({Op::kGemmRowSumSq, dtype, M, N, K});
}

// Whether this libcoda contains the kernel of `op` in `dtype` (the CMake option CODA_KERNELS
// chooses which are compiled; a full build has all of them).
CODA_API bool is_built(Op op, DType dtype);

// The tile/cluster/schedule every kernel of this libcoda uses.
CODA_API KernelConfig kernel_config();

// Checks that the current CUDA device can run libcoda's kernels (compute capability 9.0).
CODA_API Status check_device();

}  // namespace coda
