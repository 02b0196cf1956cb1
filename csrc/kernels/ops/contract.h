// coda/kernels/ops/contract.h — what libcoda's host code (csrc/lib) and its kernel translation
// units (csrc/kernels/ops/*.cu) agree on: the mainloop configuration and, for every op, which
// CodaLaunch slot carries which operand. Plain C++: included by g++ and nvcc alike.
#pragma once

namespace coda::ops {

// The mainloop of libcoda's gemm_* kernels (fusions.cuh, coda::kernel_config()): 128 x 256 x 64
// tiles, 1 x 1 cluster, cooperative, persistent. This is not the coda_ext JIT's DEFAULT_CONFIG
// (python/coda_ext/config.py: ping-pong 128 x 128 x 64, swizzle 4); the block ops' kernels each
// have their own config, in contract_generated.h.
inline constexpr int kTileM = 128;
inline constexpr int kTileN = 256;
inline constexpr int kTileK = 64;
inline constexpr int kClusterM = 1;
inline constexpr int kClusterN = 1;
inline constexpr bool kCooperative = true;  // false: ping-pong

// CodaLaunch slots, per op (gemm has none).
namespace slot {
inline constexpr int kBias = 0;         // gemm_bias_act: bias (length N), ptr
inline constexpr int kActivation = 1;   // gemm_bias_act: coda::Activation as a float value
inline constexpr int kResidual = 0;     // gemm_residual: residual (M, N), ptr + ld
inline constexpr int kGatedOut = 0;     // gemm_swiglu: Y (M, N/2), ptr + ld
inline constexpr int kRowSumSq = 0;     // gemm_row_sumsq: sumsq (length M, fp32), ptr
}  // namespace slot

// The activations of gemm_bias_act, by value (the host passes coda::Activation; csrc/lib/ops.cpp
// static_asserts that the two numberings agree). Kept here so the kernels do not depend on the
// public headers.
namespace act {
inline constexpr int kIdentity = 0;
inline constexpr int kRelu = 1;
inline constexpr int kSilu = 2;
inline constexpr int kGeluTanh = 3;
inline constexpr int kGelu = 4;  // erf form
}  // namespace act

}  // namespace coda::ops
