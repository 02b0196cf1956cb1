// coda/kernels/ops/contract_generated.h — written by `python -m coda_ext libgen csrc/kernels/ops`
// from the graphs of coda_ext.ops; do not edit. What libcoda's host code (csrc/lib) and its kernels
// (csrc/kernels/ops/<kernel>_<dtype>.cu) agree on, per kernel: the fixed mainloop config and
// the CodaLaunch slot of every operand, in the graph's canonical slot order (inputs sorted by
// name, then outputs sorted by name: the order the emitted code reads them). Plain C++.
#pragma once

namespace coda::ops::gen {

// Raster orders as CodaLaunch.raster_order numbers them.
inline constexpr int kRasterHeuristic = 0;
inline constexpr int kRasterAlongM = 1;
inline constexpr int kRasterAlongN = 2;

// linear_residual_norm: coda_ext.ops.residual_norm.graph()
// out = A·Bᵀ + residual, h = out ⊙ norm_weight, sumsq = Σ out² (Llama 3 8B down projection).
// Config coop_128x256x64_c2x1_s4: the heuristic's at M = 16384, N = 4096, K = 14336.
namespace linear_residual_norm {
inline constexpr const char* kName = "linear_residual_norm";
inline constexpr int kTileM = 128, kTileN = 256, kTileK = 64;
inline constexpr int kClusterM = 2, kClusterN = 1;
inline constexpr const char* kSchedule = "cooperative";
inline constexpr int kEpilogueTileM = 0, kEpilogueTileN = 0;  // 0: CUTLASS's choice
inline constexpr int kSwizzle = 4;  // launch defaults the config was chosen with
inline constexpr int kRaster = kRasterHeuristic;
inline constexpr bool kHasD = true;  // writes a main output D
inline constexpr int kNumSlots = 4;
namespace slot {
inline constexpr int kNormWeight = 0;  // row_vector 'norm_weight': length-N vector, ptr (the operands' dtype)
inline constexpr int kResidual   = 1;  // tile 'residual': (M, N) tile, ptr + ld (the operands' dtype)
inline constexpr int kH          = 2;  // store 'h': (M, N) output tile, ptr + ld (the operands' dtype)
inline constexpr int kSumsq      = 3;  // row_reduce 'sumsq': length-M fp32 output, ptr
}  // namespace slot
}  // namespace linear_residual_norm

// rms_linear: coda_ext.ops.rms_scale.graph(None)
// act(rstd ⊙row A·Bᵀ), act chosen at run time (Llama 3 8B up projection).
// Config ping_128x128x64_c1x1_s4: the heuristic's at M = 16384, N = 14336, K = 4096.
namespace rms_linear {
inline constexpr const char* kName = "rms_linear";
inline constexpr int kTileM = 128, kTileN = 128, kTileK = 64;
inline constexpr int kClusterM = 1, kClusterN = 1;
inline constexpr const char* kSchedule = "pingpong";
inline constexpr int kEpilogueTileM = 0, kEpilogueTileN = 0;  // 0: CUTLASS's choice
inline constexpr int kSwizzle = 4;  // launch defaults the config was chosen with
inline constexpr int kRaster = kRasterHeuristic;
inline constexpr bool kHasD = true;  // writes a main output D
inline constexpr int kNumSlots = 2;
namespace slot {
inline constexpr int kRstd       = 0;  // col_vector 'rstd': length-M vector, ptr (float32)
inline constexpr int kActivation = 1;  // libcoda's own (coda::ops::RmsLinear), after the graph's
}  // namespace slot
}  // namespace rms_linear

// linear_swiglu: coda_ext.ops.swiglu.graph(True, False)
// y = silu(z[:, 2i]) · z[:, 2i+1], z = rstd ⊙row A·Bᵀ, no z written (Llama 3 8B gate/up).
// Config ping_64x256x64_c1x1_s8_along_n: the heuristic's at M = 16384, N = 28672, K = 4096.
namespace linear_swiglu {
inline constexpr const char* kName = "linear_swiglu";
inline constexpr int kTileM = 64, kTileN = 256, kTileK = 64;
inline constexpr int kClusterM = 1, kClusterN = 1;
inline constexpr const char* kSchedule = "pingpong";
inline constexpr int kEpilogueTileM = 0, kEpilogueTileN = 0;  // 0: CUTLASS's choice
inline constexpr int kSwizzle = 8;  // launch defaults the config was chosen with
inline constexpr int kRaster = kRasterAlongN;
inline constexpr bool kHasD = false;  // writes a main output D
inline constexpr int kNumSlots = 2;
namespace slot {
inline constexpr int kRstd = 0;  // col_vector 'rstd': length-M vector, ptr (float32)
inline constexpr int kY    = 1;  // pair_gated_store 'y': (M, N/2) output, ptr + ld (the operands' dtype)
}  // namespace slot
}  // namespace linear_swiglu

// linear_swiglu_train: coda_ext.ops.swiglu.graph(True, True)
// z = rstd ⊙row A·Bᵀ written as D, and y = silu(z[:, 2i]) · z[:, 2i+1] (Llama 3 8B gate/up).
// Config ping_64x256x64_c1x1_s8_along_n: the heuristic's at M = 16384, N = 28672, K = 4096.
namespace linear_swiglu_train {
inline constexpr const char* kName = "linear_swiglu_train";
inline constexpr int kTileM = 64, kTileN = 256, kTileK = 64;
inline constexpr int kClusterM = 1, kClusterN = 1;
inline constexpr const char* kSchedule = "pingpong";
inline constexpr int kEpilogueTileM = 0, kEpilogueTileN = 0;  // 0: CUTLASS's choice
inline constexpr int kSwizzle = 8;  // launch defaults the config was chosen with
inline constexpr int kRaster = kRasterAlongN;
inline constexpr bool kHasD = true;  // writes a main output D
inline constexpr int kNumSlots = 2;
namespace slot {
inline constexpr int kRstd = 0;  // col_vector 'rstd': length-M vector, ptr (float32)
inline constexpr int kY    = 1;  // pair_gated_store 'y': (M, N/2) output, ptr + ld (the operands' dtype)
}  // namespace slot
}  // namespace linear_swiglu_train

// qkv_rope: coda_ext.ops.qkv.graph(True, False, 128)
// RoPE(rstd ⊙row A·Bᵀ) on Q and K, V passed through (Llama 3 8B QKV).
// Config ping_128x128x64_c1x1_s4: the heuristic's at M = 16384, N = 6144, K = 4096.
namespace qkv_rope {
inline constexpr const char* kName = "qkv_rope";
inline constexpr int kTileM = 128, kTileN = 128, kTileK = 64;
inline constexpr int kClusterM = 1, kClusterN = 1;
inline constexpr const char* kSchedule = "pingpong";
inline constexpr int kEpilogueTileM = 0, kEpilogueTileN = 0;  // 0: CUTLASS's choice
inline constexpr int kSwizzle = 4;  // launch defaults the config was chosen with
inline constexpr int kRaster = kRasterHeuristic;
inline constexpr bool kHasD = true;  // writes a main output D
inline constexpr int kNumSlots = 4;
namespace slot {
inline constexpr int kFreqHi    = 0;  // row_vector 'freq_hi': length-N vector, ptr (float32)
inline constexpr int kFreqLo    = 1;  // row_vector 'freq_lo': length-N vector, ptr (float32)
inline constexpr int kPositions = 2;  // col_vector 'positions': length-M vector, ptr (float32)
inline constexpr int kRstd      = 3;  // col_vector 'rstd': length-M vector, ptr (float32)
}  // namespace slot
}  // namespace qkv_rope

// qkv_rope_qk_norm64: coda_ext.ops.qkv.graph(True, True, 64)
// per-head RMSNorm of Q and K (head_dim 64), then RoPE (Llama 3.2 1B-sized QKV).
// Config ping_128x128x64_c1x1_e64x64_s4: the heuristic's at M = 16384, N = 3072, K = 2048.
namespace qkv_rope_qk_norm64 {
inline constexpr const char* kName = "qkv_rope_qk_norm64";
inline constexpr int kTileM = 128, kTileN = 128, kTileK = 64;
inline constexpr int kClusterM = 1, kClusterN = 1;
inline constexpr const char* kSchedule = "pingpong";
inline constexpr int kEpilogueTileM = 64, kEpilogueTileN = 64;  // 0: CUTLASS's choice
inline constexpr int kSwizzle = 4;  // launch defaults the config was chosen with
inline constexpr int kRaster = kRasterHeuristic;
inline constexpr bool kHasD = true;  // writes a main output D
inline constexpr int kNumSlots = 7;
namespace slot {
inline constexpr int kEps       = 0;  // scalar 'eps': runtime float, value
inline constexpr int kFreqHi    = 1;  // row_vector 'freq_hi': length-N vector, ptr (float32)
inline constexpr int kFreqLo    = 2;  // row_vector 'freq_lo': length-N vector, ptr (float32)
inline constexpr int kNormA     = 3;  // row_vector 'norm_a': length-N vector, ptr (float32)
inline constexpr int kNormB     = 4;  // row_vector 'norm_b': length-N vector, ptr (float32)
inline constexpr int kPositions = 5;  // col_vector 'positions': length-M vector, ptr (float32)
inline constexpr int kRstd      = 6;  // col_vector 'rstd': length-M vector, ptr (float32)
}  // namespace slot
}  // namespace qkv_rope_qk_norm64

// qkv_rope_qk_norm128: coda_ext.ops.qkv.graph(True, True, 128)
// per-head RMSNorm of Q and K (head_dim 128), then RoPE (Llama 3 8B QKV).
// Config ping_128x128x64_c1x1_e64x128_s4: the heuristic's at M = 16384, N = 6144, K = 4096.
namespace qkv_rope_qk_norm128 {
inline constexpr const char* kName = "qkv_rope_qk_norm128";
inline constexpr int kTileM = 128, kTileN = 128, kTileK = 64;
inline constexpr int kClusterM = 1, kClusterN = 1;
inline constexpr const char* kSchedule = "pingpong";
inline constexpr int kEpilogueTileM = 64, kEpilogueTileN = 128;  // 0: CUTLASS's choice
inline constexpr int kSwizzle = 4;  // launch defaults the config was chosen with
inline constexpr int kRaster = kRasterHeuristic;
inline constexpr bool kHasD = true;  // writes a main output D
inline constexpr int kNumSlots = 7;
namespace slot {
inline constexpr int kEps       = 0;  // scalar 'eps': runtime float, value
inline constexpr int kFreqHi    = 1;  // row_vector 'freq_hi': length-N vector, ptr (float32)
inline constexpr int kFreqLo    = 2;  // row_vector 'freq_lo': length-N vector, ptr (float32)
inline constexpr int kNormA     = 3;  // row_vector 'norm_a': length-N vector, ptr (float32)
inline constexpr int kNormB     = 4;  // row_vector 'norm_b': length-N vector, ptr (float32)
inline constexpr int kPositions = 5;  // col_vector 'positions': length-M vector, ptr (float32)
inline constexpr int kRstd      = 6;  // col_vector 'rstd': length-M vector, ptr (float32)
}  // namespace slot
}  // namespace qkv_rope_qk_norm128

// lm_head_cross_entropy: coda_ext.ops.lm_head_ce.graph(True)
// lse and the target logit of logits = rstd ⊙row A·Bᵀ, no logits written (Llama 3 LM head).
// Config ping_64x256x64_c1x1_s8_along_n: the heuristic's at M = 16384, N = 128256, K = 4096.
namespace lm_head_cross_entropy {
inline constexpr const char* kName = "lm_head_cross_entropy";
inline constexpr int kTileM = 64, kTileN = 256, kTileK = 64;
inline constexpr int kClusterM = 1, kClusterN = 1;
inline constexpr const char* kSchedule = "pingpong";
inline constexpr int kEpilogueTileM = 0, kEpilogueTileN = 0;  // 0: CUTLASS's choice
inline constexpr int kSwizzle = 8;  // launch defaults the config was chosen with
inline constexpr int kRaster = kRasterAlongN;
inline constexpr bool kHasD = false;  // writes a main output D
inline constexpr int kNumSlots = 4;
namespace slot {
inline constexpr int kRstd        = 0;  // col_vector 'rstd': length-M vector, ptr (float32)
inline constexpr int kTarget      = 1;  // col_vector 'target': length-M vector, ptr (int32)
inline constexpr int kLse         = 2;  // row_reduce 'lse': length-M fp32 output, ptr
inline constexpr int kTargetLogit = 3;  // row_reduce 'target_logit': length-M fp32 output, ptr
}  // namespace slot
}  // namespace lm_head_cross_entropy

}  // namespace coda::ops::gen

// Every generated kernel as X(coda::Op enumerator, namespace above).
#define CODA_GENERATED_KERNELS(X) \
  X(kLinearResidualNorm, linear_residual_norm) \
  X(kRmsLinear, rms_linear) \
  X(kLinearSwiglu, linear_swiglu) \
  X(kLinearSwigluTrain, linear_swiglu_train) \
  X(kQkvRope, qkv_rope) \
  X(kQkvRopeQkNorm64, qkv_rope_qk_norm64) \
  X(kQkvRopeQkNorm128, qkv_rope_qk_norm128) \
  X(kLmHeadCrossEntropy, lm_head_cross_entropy)
