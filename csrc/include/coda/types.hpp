// coda/types.hpp — the torch-free value types of libcoda's C++ API: element types, status,
// tensor references, workspace, problem and launch options.
//
// Nothing here includes CUDA, CUTLASS or torch. Sizes and strides are in elements; every
// matrix is row-major with a unit inner stride (stride[1] == 1) and a leading stride
// stride[0] >= cols, which is how torch lays out a contiguous (or row-sliced) 2-D tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "coda/export.h"

namespace coda {

inline constexpr int kVersionMajor = 0;
inline constexpr int kVersionMinor = 1;
inline constexpr int kVersionPatch = 0;

// ---------------------------------------------------------------------------------------------
// Element types
// ---------------------------------------------------------------------------------------------
enum class DType : int32_t {
  kBFloat16 = 0,  // GEMM operands and outputs
  kFloat16 = 1,   // GEMM operands and outputs
  kFloat32 = 2,   // reduction outputs (e.g. the per-row sum of squares), rstd, positions, losses
  kInt32 = 3,     // class indices (lm_head_cross_entropy's target)
};

CODA_API const char* dtype_name(DType dtype);  // "bf16", "fp16", "fp32", "int32"; "unknown" otherwise
CODA_API size_t dtype_size(DType dtype);       // bytes per element; 0 for an unknown value

// ---------------------------------------------------------------------------------------------
// Status
// ---------------------------------------------------------------------------------------------
// Values below 16 are the kernel ABI's codes (coda/abi.h: CODA_OK ... CODA_ERROR_LAUNCH).
enum class StatusCode : int32_t {
  kOk = 0,
  kInvalidArgument = 1,     // a null pointer, bad shape, stride, alignment, dtype or enum value
  kCanImplement = 2,        // CUTLASS refused the problem (should not happen after validation)
  kBadWorkspace = 3,        // workspace missing, smaller than workspace_size(...), or misaligned
  kInitializeFailed = 4,    // CUTLASS could not set up the launch (e.g. shared memory attribute)
  kLaunchFailed = 5,        // the kernel launch returned a CUDA error
  kNotBuilt = 16,           // this op/dtype was not compiled into this libcoda (see CODA_KERNELS)
  kUnsupportedDevice = 17,  // no CUDA device, or the current device is not SM90 (H100/H200)
  kCudaError = 18,          // a CUDA runtime query failed
};

CODA_API const char* status_code_name(StatusCode code);  // e.g. "invalid argument"

// The result of every libcoda call: a code and, on failure, a message that names the op, the
// argument and the fix, e.g. "coda::gemm: K = 100 must be a multiple of 8 ...".
class [[nodiscard]] Status {
 public:
  Status() = default;  // success
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  bool ok() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "ok", or "<code name>: <message>".
  std::string to_string() const {
    return ok() ? std::string("ok") : std::string(status_code_name(code_)) + ": " + message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// ---------------------------------------------------------------------------------------------
// Tensor references (device memory; libcoda never owns or allocates it)
// ---------------------------------------------------------------------------------------------
struct TensorRef {
  void* data = nullptr;          // device pointer (inputs are only read)
  DType dtype = DType::kBFloat16;
  int32_t rank = 0;              // 1 (vector) or 2 (matrix)
  int64_t shape[2] = {0, 0};     // rank 1: {length, 0}; rank 2: {rows, cols}
  int64_t stride[2] = {0, 0};    // in elements; rank 1: {1, 0}; rank 2: {ld, 1}
};

// A row-major rows x cols matrix with leading stride `ld` elements (0: contiguous, ld = cols).
inline TensorRef matrix(const void* data, DType dtype, int64_t rows, int64_t cols, int64_t ld = 0) {
  TensorRef t;
  t.data = const_cast<void*>(data);
  t.dtype = dtype;
  t.rank = 2;
  t.shape[0] = rows;
  t.shape[1] = cols;
  t.stride[0] = ld == 0 ? cols : ld;
  t.stride[1] = 1;
  return t;
}

// A contiguous vector of `length` elements.
inline TensorRef vector(const void* data, DType dtype, int64_t length) {
  TensorRef t;
  t.data = const_cast<void*>(data);
  t.dtype = dtype;
  t.rank = 1;
  t.shape[0] = length;
  t.stride[0] = 1;
  return t;
}

// Device scratch memory of one call: at least workspace_size(...) bytes, 256-byte aligned
// (cudaMalloc's alignment). It may be reused by the next call on the same stream.
struct Workspace {
  void* data = nullptr;
  size_t bytes = 0;
};

// ---------------------------------------------------------------------------------------------
// Ops, problems, options
// ---------------------------------------------------------------------------------------------
// The kernels of libcoda: with a dtype, an enumerator names one compiled kernel (CODA_KERNELS
// calls it "<op_name>_<dtype>"). The ops of a Transformer block (kLinearResidualNorm and after)
// are built from the graphs of coda_ext.ops; an op with variants (linear_swiglu with or without
// Z, qkv_rope with or without QK-norm) has a kernel for each, and the op function picks it.
enum class Op : int32_t {
  kGemm = 0,                 // D = A · Bᵀ
  kGemmBiasAct = 1,          // D = act(A · Bᵀ + bias)
  kGemmResidual = 2,         // D = A · Bᵀ + residual
  kGemmSwiglu = 3,           // Z = A · Bᵀ;  Y[:, i] = silu(Z[:, 2i]) · Z[:, 2i+1]
  kGemmRowSumSq = 4,         // D = A · Bᵀ;  sumsq[m] = Σ_n (A · Bᵀ)[m, n]²  (fp32)
  kLinearResidualNorm = 5,   // linear_residual_norm: D = A · Bᵀ + residual, H = D ⊙ norm_weight, rstd
  kRmsLinear = 6,            // rms_linear: D = act(rstd ⊙row A · Bᵀ)
  kLinearSwiglu = 7,         // linear_swiglu without Z: only Y
  kLinearSwigluTrain = 8,    // linear_swiglu with Z
  kQkvRope = 9,              // qkv_rope without QK-norm (head_dim 64 or 128)
  kQkvRopeQkNorm64 = 10,     // qkv_rope with QK-norm, head_dim 64
  kQkvRopeQkNorm128 = 11,    // qkv_rope with QK-norm, head_dim 128
  kLmHeadCrossEntropy = 12,  // lm_head_cross_entropy
};
inline constexpr int kNumOps = 13;
CODA_API const char* op_name(Op op);  // "gemm", "gemm_bias_act", ..., "qkv_rope_qk_norm64"; "unknown" otherwise

// Activations of gemm_bias_act, chosen at run time (one kernel serves all of them).
enum class Activation : int32_t {
  kIdentity = 0,
  kRelu = 1,
  kSilu = 2,       // x · sigmoid(x)
  kGeluTanh = 3,   // 0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))  (torch's approximate="tanh")
  kGelu = 4,       // 0.5 x (1 + erf(x / √2))                        (torch's default)
};
inline constexpr int kNumActivations = 5;
CODA_API const char* activation_name(Activation act);  // "identity", "relu", ...; "unknown"

// How lm_head_cross_entropy reduces its per-token losses (torch's cross_entropy `reduction`).
enum class Reduction : int32_t {
  kNone = 0,  // loss has length M: one loss per token (0 where the target is ignore_index)
  kSum = 1,   // loss has length 1: Σ over tokens
  kMean = 2,  // loss has length 1: Σ over tokens / the number of tokens whose target is not ignore_index
};
inline constexpr int kNumReductions = 3;
CODA_API const char* reduction_name(Reduction reduction);  // "none", "sum", "mean"; "unknown"

// One GEMM problem of one op: A is (M, K), B is (N, K), D is (M, N).
struct Problem {
  Op op = Op::kGemm;
  DType dtype = DType::kBFloat16;  // of A, B and the outputs
  int64_t M = 0, N = 0, K = 0;
};

// Order in which the persistent tile scheduler walks output tiles.
enum class Raster : int32_t {
  kDefault = 0,    // the order the op's config was tuned with: kernel_config(op).raster
  kAlongM = 1,
  kAlongN = 2,
  kHeuristic = 3,  // CUTLASS's choice by the tile counts (the default of the gemm_* ops)
};

// Per-call launch options (none of them recompiles anything). The defaults are the launch
// arguments each op's config was chosen with (kernel_config(op)).
struct Options {
  int32_t sm_count = 0;               // SMs the persistent kernel may use; 0: all SMs of the current device
  int32_t swizzle = 0;                // tile-scheduler swizzle: 1, 2, 4 or 8; 0: kernel_config(op).swizzle
  Raster raster = Raster::kDefault;   // tile order of the persistent scheduler
  bool check_pointers = true;         // ask the CUDA runtime (about 1 µs per pointer) that every pointer is
                                      // device or managed memory of the current device, so a host pointer
                                      // is an error message rather than a fault that kills the context
};

// The mainloop configuration a kernel of this libcoda was compiled with (kernel_config(op)), and
// the launch arguments it was chosen with (what Options' defaults use).
struct KernelConfig {
  int32_t tile_m, tile_n, tile_k;
  int32_t cluster_m, cluster_n;
  const char* schedule;            // "cooperative" or "pingpong"
  int32_t epilogue_tile_m = 0;     // the epilogue subtile; 0: CUTLASS's choice
  int32_t epilogue_tile_n = 0;
  int32_t swizzle = 1;             // tile-scheduler swizzle the op launches with by default
  Raster raster = Raster::kHeuristic;  // tile order the op launches with by default
};

}  // namespace coda
