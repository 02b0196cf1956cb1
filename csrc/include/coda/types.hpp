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

#include "coda/abi.h"      // CODA_STATUS_LIST
#include "coda/export.h"
#include "coda/op_list.h"  // CODA_OP_LIST

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
// One enumerator per row of coda/abi.h's CODA_STATUS_LIST, with its value and what it means
// (kOk = CODA_OK = 0, kInvalidArgument = CODA_ERROR_INVALID_ARGUMENT, ...; the kernel ABI's codes
// are below 16).
enum class StatusCode : int32_t {
#define CODA_STATUS_ENUMERATOR(constant, enumerator, value, name) enumerator = value,
  CODA_STATUS_LIST(CODA_STATUS_ENUMERATOR)
#undef CODA_STATUS_ENUMERATOR
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
// The kernels of libcoda: one enumerator per row of coda/op_list.h, with its value and what it
// computes (kGemm = CODA_OP_GEMM = 0, kGemmBiasAct, ...). With a dtype, an enumerator names one
// compiled kernel (CODA_KERNELS calls it "<op_name>_<dtype>").
enum class Op : int32_t {
#define CODA_OP_ENUMERATOR(NAME, enumerator, value, name) enumerator = value,
  CODA_OP_LIST(CODA_OP_ENUMERATOR)
#undef CODA_OP_ENUMERATOR
};
#define CODA_OP_COUNT(NAME, enumerator, value, name) +1
inline constexpr int kNumOps = 0 CODA_OP_LIST(CODA_OP_COUNT);  // the values are 0 .. kNumOps - 1
#undef CODA_OP_COUNT
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
  int32_t swizzle = 0;                // tile-scheduler swizzle: 1, 2, 4, 8 or 16; 0: kernel_config(op).swizzle
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
