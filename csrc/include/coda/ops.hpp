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
//  * Alignment: A, B, D, Z, H, out and residual are read or written with TMA — their base pointers
//    must be 16-byte aligned and their leading strides a multiple of 16 bytes (8 elements); K and
//    N must be multiples of 8 (N: where D or Z is written). Input vectors (bias, norm_weight,
//    rstd, positions, target, freqs' rows) must be 16-byte aligned. Y, sumsq and the fp32 outputs
//    (rstd, lse, loss) need natural alignment.
//  * Outputs may not overlap each other or any input (no in-place residual).
//  * `workspace` must hold workspace_size({op, dtype, M, N, K}) bytes (often 0), 256-byte aligned.
//  * The work is enqueued on `stream`; the call returns without waiting for it.
//  * Optional inputs and outputs are TensorRefs with a null data pointer: pass `{}` for none.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

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

// ---------------------------------------------------------------------------------------------
// The ops of a Transformer block's forward pass: the kernels of coda_ext.ops (Python), emitted
// from the same graphs. rstd, positions and losses are fp32; `H`, `Y`, `Z` and `out` are in the
// operands' dtype. See docs/libcoda.md for the block they make up.
// ---------------------------------------------------------------------------------------------

// The down or output projection, the residual add and the next RMSNorm's statistic:
//   D (M, N) = A · Bᵀ + residual        the new residual stream
//   H (M, N) = D ⊙ norm_weight           the next GEMM's input (norm_weight: length N, A's dtype)
//   rstd (M) = rsqrt(Σ_n D[m, n]² / N + eps)   from the unrounded fp32 D, deterministic
// so RMSNorm(D) · Wᵀ = rstd ⊙row (H · Wᵀ): rms_linear, linear_swiglu, qkv_rope and
// lm_head_cross_entropy finish the norm in their epilogue. Needs a workspace.
CODA_API Status linear_residual_norm(const TensorRef& A, const TensorRef& B, const TensorRef& residual,
                                     const TensorRef& norm_weight, float eps, const TensorRef& D, const TensorRef& H,
                                     const TensorRef& rstd, Workspace workspace, cudaStream_t stream,
                                     const Options& options = {});

// D (M, N) = act(rstd[m] · (A · Bᵀ)[m, n]), rstd a length-M fp32 vector; act chosen at run time.
CODA_API Status rms_linear(const TensorRef& A, const TensorRef& B, const TensorRef& rstd, Activation act,
                           const TensorRef& D, Workspace workspace, cudaStream_t stream, const Options& options = {});

// SwiGLU of an interleaved gate/up projection (B's rows alternate gate, up), at half width:
//   z = [rstd ⊙row] A · Bᵀ    (rstd: optional length-M fp32 vector; {}: no scaling)
//   Y (M, N/2) = silu(z[:, 2i]) · z[:, 2i+1], from the fp32 z
//   Z (M, N)   = z, only when Z is given (the backward pass needs it; {}: not written)
// N must be even; a multiple of 8 when Z is written. Needs a workspace when rstd is absent.
CODA_API Status linear_swiglu(const TensorRef& A, const TensorRef& B, const TensorRef& rstd, const TensorRef& Z,
                              const TensorRef& Y, Workspace workspace, cudaStream_t stream,
                              const Options& options = {});

// The QKV projection with RoPE (and optionally QK-norm) in its epilogue; B = [W_q; W_k; W_v] has
// N = (n_heads + 2 n_kv_heads) · head_dim rows, head_dim 64 or 128:
//   z = [rstd ⊙row] A · Bᵀ                       (rstd optional, {}: none)
//   z_h = z_h ⊙ w · rsqrt(mean(z_h²) + eps)     per Q head (w = q_norm_weight) and K head (k_norm_weight),
//                                              only when both weights are given (length head_dim,
//                                              fp32 or A's dtype; {} for both: no QK-norm)
//   out = RoPE(z) on Q and K heads, V unchanged, in adjacent pairs:
//         out[2i] = a cos θ − b sin θ, out[2i+1] = b cos θ + a sin θ, (a, b) = (z[2i], z[2i+1]),
//         θ = positions[m] · inv_freq[i]
// positions: length-M fp32 (integers below 2^24 are exact); freqs: the (2, N) fp32 table of
// rope_frequencies() in device memory. Hugging Face checkpoints store Q and K rows in
// rotate-half order: permute them (and the QK-norm weights) to adjacent pairs once, at load.
// Needs a workspace when rstd is absent or with QK-norm.
CODA_API Status qkv_rope(const TensorRef& A, const TensorRef& B, const TensorRef& positions, const TensorRef& freqs,
                         int32_t n_heads, int32_t n_kv_heads, const TensorRef& rstd, const TensorRef& q_norm_weight,
                         const TensorRef& k_norm_weight, float eps, const TensorRef& out, Workspace workspace,
                         cudaStream_t stream, const Options& options = {});

// The (2, N) fp32 frequency table qkv_rope takes, written to host memory `out` (row 0 at
// out[0..N), row 1 at out[N..2N)), N = (n_heads + 2 n_kv_heads) · head_dim; copy it to the
// device once per model. Per column: the frequency of its pair in turns per position
// (inv_freq / 2π) as an exact float pair hi + lo; 0 on V. inv_freq (head_dim / 2 values,
// radians per position, e.g. Llama 3's scaled ones) overrides theta; nullptr: Llama's
// inv_freq[i] = theta^(−2i / head_dim). The same numbers as coda_ext.ops.rope_frequencies.
CODA_API Status rope_frequencies(int32_t head_dim, int32_t n_heads, int32_t n_kv_heads, double theta,
                                 const double* inv_freq, float* out, int64_t out_count);

// The LM head's cross-entropy without logits in memory:
//   logits = [rstd ⊙row] A · Bᵀ   (B: (V, d), V = N < 2^24 classes; rstd optional, {}: none)
//   lse (M)  = logsumexp_n logits[m, n]            (fp32, for the backward pass)
//   loss     = lse − logits[m, target[m]] per token, 0 where target[m] == ignore_index (NaN for
//              a target outside [0, V)), reduced by `reduction`: kNone → loss has length M;
//              kSum / kMean → loss has length 1 (kMean divides by the tokens that count).
// target: length-M int32. Deterministic. Needs a workspace. N need not be a multiple of 8.
CODA_API Status lm_head_cross_entropy(const TensorRef& A, const TensorRef& B, const TensorRef& target,
                                      const TensorRef& rstd, int32_t ignore_index, Reduction reduction,
                                      const TensorRef& loss, const TensorRef& lse, Workspace workspace,
                                      cudaStream_t stream, const Options& options = {});

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
inline size_t linear_residual_norm_workspace_size(DType dtype, int64_t M, int64_t N, int64_t K) {
  return workspace_size({Op::kLinearResidualNorm, dtype, M, N, K});
}
inline size_t rms_linear_workspace_size(DType dtype, int64_t M, int64_t N, int64_t K) {
  return workspace_size({Op::kRmsLinear, dtype, M, N, K});
}
// with_z: whether the call writes Z (the kernel differs).
inline size_t linear_swiglu_workspace_size(DType dtype, int64_t M, int64_t N, int64_t K, bool with_z = false) {
  return workspace_size({with_z ? Op::kLinearSwigluTrain : Op::kLinearSwiglu, dtype, M, N, K});
}
// head_dim: 64 or 128; qk_norm: whether the call has QK-norm weights (the kernel differs).
inline size_t qkv_rope_workspace_size(DType dtype, int64_t M, int64_t N, int64_t K, int32_t head_dim = 128,
                                      bool qk_norm = false) {
  return workspace_size({!qk_norm ? Op::kQkvRope : head_dim == 64 ? Op::kQkvRopeQkNorm64 : Op::kQkvRopeQkNorm128,
                         dtype, M, N, K});
}
inline size_t lm_head_cross_entropy_workspace_size(DType dtype, int64_t M, int64_t N, int64_t K) {
  return workspace_size({Op::kLmHeadCrossEntropy, dtype, M, N, K});
}

// Whether this libcoda contains the kernel of `op` in `dtype` (the CMake option CODA_KERNELS
// chooses which are compiled; a full build has all of them).
CODA_API bool is_built(Op op, DType dtype);

// The tile/cluster/schedule of the gemm_* ops' kernels (all of them share it).
CODA_API KernelConfig kernel_config();
// The config of `op`'s kernels and the launch arguments Options' defaults use for it: the
// Transformer-block ops each have the config coda_ext's heuristic picks at a large training
// shape (M = 16384, a Llama 3 layer). Values of an unknown op are zero.
CODA_API KernelConfig kernel_config(Op op);

// Checks that the current CUDA device can run libcoda's kernels (compute capability 9.0).
CODA_API Status check_device();

}  // namespace coda
