// csrc/lib/validate.cpp — argument validation of libcoda's ops. Pure host code: it reads the
// TensorRef descriptions only, never the memory they point to, and never calls CUDA.
#include <cmath>
#include <cstdio>

#include "detail.hpp"

namespace coda::detail {
namespace {

constexpr int64_t kMaxDim = int64_t(1) << 31;        // CUTLASS problem shapes are int
constexpr uint64_t kMaxTmaStride = uint64_t(1) << 40;  // TMA global strides are < 2^40 bytes
constexpr uintptr_t kTmaAlign = 16;
constexpr uintptr_t kWorkspaceAlign = 256;

bool known_dtype(DType d) { return dtype_size(d) != 0; }

std::string shape_text(const TensorRef& t) {
  if (t.rank == 1) return cat("(", t.shape[0], ")");
  return cat("(", t.shape[0], ", ", t.shape[1], ")");
}

}  // namespace

std::string hex(const void* ptr) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%p", ptr);
  return buf;
}

Status Validator::fail(const std::string& message) const {
  return Status(StatusCode::kInvalidArgument, cat("coda::", op_, ": ", message));
}

void Validator::add_region(const char* name, const void* data, uint64_t bytes, bool output) {
  if (num_regions_ >= kMaxRegions) return;  // ops have at most 9 operands + workspace
  Region& r = regions_[num_regions_++];
  r.name = name;
  r.begin = reinterpret_cast<uintptr_t>(data);
  r.end = r.begin + bytes;
  r.output = output;
}

Status Validator::operands(const TensorRef& A, const TensorRef& B, bool n_aligned) {
  for (auto [name, t] : {std::pair<const char*, const TensorRef*>{"A", &A}, {"B", &B}}) {
    if (t->data == nullptr)
      return fail(cat(name, " is null; pass a device pointer to the ", name, name[0] == 'A' ? " (M, K)" : " (N, K)",
                      " operand"));
    if (t->rank != 2)
      return fail(cat(name, " must be a matrix (rank 2), got rank ", t->rank, "; describe it with coda::matrix(...)"));
  }
  if (!known_dtype(A.dtype)) return fail(cat("A has an unknown dtype value ", int32_t(A.dtype)));
  if (A.dtype != DType::kBFloat16 && A.dtype != DType::kFloat16)
    return fail(cat("A has dtype ", dtype_name(A.dtype), "; the GEMM operands must be bf16 or fp16"));
  dtype_ = A.dtype;
  M_ = A.shape[0];
  K_ = A.shape[1];
  N_ = B.shape[0];
  if (B.shape[1] != K_)
    return fail(cat("A is (M, K) = ", shape_text(A), " but B is ", shape_text(B),
                    ": B must be (N, K) with A's K = ", K_, ", as torch.nn.Linear stores its weight"));
  if (M_ < 1 || N_ < 1 || K_ < 1)
    return fail(cat("empty problem M = ", M_, ", N = ", N_, ", K = ", K_,
                    ": every dimension must be at least 1 (skip the call when M = 0)"));
  if (M_ >= kMaxDim || N_ >= kMaxDim || K_ >= kMaxDim)
    return fail(cat("M, N and K must be < 2^31, got M = ", M_, ", N = ", N_, ", K = ", K_));
  const int64_t align = int64_t(kTmaAlign / dtype_size(dtype_));  // 8 for 16-bit types
  if (K_ % align != 0)
    return fail(cat("K = ", K_, " must be a multiple of ", align, " (16 bytes of ", dtype_name(dtype_),
                    ") for the TMA loads of A and B; pad K with zeros"));
  if (n_aligned && N_ % align != 0)
    return fail(cat("N = ", N_, " must be a multiple of ", align, " (16 bytes of ", dtype_name(dtype_),
                    ") for the TMA store of the output; pad N (B's rows) with zeros"));
  Status s = matrix("A", A, dtype_, M_, K_, "M", "K", Access::kTma, /*output=*/false);
  if (!s.ok()) return s;
  return matrix("B", B, dtype_, N_, K_, "N", "K", Access::kTma, /*output=*/false);
}

Status Validator::matrix(const char* name, const TensorRef& t, DType dtype, int64_t rows, int64_t cols,
                         const char* rows_name, const char* cols_name, Access access, bool output) {
  const char* role = output ? "output" : "input";
  if (t.data == nullptr)
    return fail(cat(name, " is null; pass a device pointer to the (", rows_name, ", ", cols_name, ") ", role));
  if (t.rank != 2)
    return fail(cat(name, " must be a matrix (rank 2) of shape (", rows_name, ", ", cols_name, ") = (", rows, ", ",
                    cols, "), got rank ", t.rank, "; describe it with coda::matrix(...)"));
  if (t.dtype != dtype)
    return fail(cat(name, " has dtype ", dtype_name(t.dtype), ", expected ", dtype_name(dtype),
                    dtype == dtype_ ? " (the dtype of A)" : ""));
  if (t.shape[0] != rows || t.shape[1] != cols)
    return fail(cat(name, " must have shape (", rows_name, ", ", cols_name, ") = (", rows, ", ", cols, "), got ",
                    shape_text(t)));
  if (t.stride[1] != 1)
    return fail(cat(name, " must have a contiguous last dimension (stride[1] = 1), got stride[1] = ", t.stride[1],
                    "; make a contiguous copy"));
  const int64_t ld = t.stride[0];
  if (ld < cols)
    return fail(cat(name, " has leading stride ", ld, " < ", cols, " columns (its rows would overlap)"));
  const uint64_t esize = dtype_size(dtype);
  const uintptr_t addr = reinterpret_cast<uintptr_t>(t.data);
  if (uint64_t(ld) >= kMaxTmaStride / esize)
    return fail(cat(name, " has leading stride ", ld, " elements; strides must be below 2^40 bytes"));
  if (access == Access::kTma || access == Access::kVector) {
    if (addr % kTmaAlign != 0)
      return fail(cat(name, "'s data pointer ", hex(t.data), " is not ", kTmaAlign,
                      "-byte aligned (the kernel accesses it with TMA); use memory from cudaMalloc or an offset "
                      "that is a multiple of 16 bytes"));
  } else if (addr % esize != 0) {
    return fail(cat(name, "'s data pointer ", hex(t.data), " is not aligned to its ", esize, "-byte elements"));
  }
  if (access == Access::kTma && (uint64_t(ld) * esize) % kTmaAlign != 0)
    return fail(cat(name, "'s rows are ", uint64_t(ld) * esize, " bytes apart (leading stride ", ld,
                    "); TMA needs a multiple of ", kTmaAlign, " bytes: use a leading stride that is a multiple of ",
                    kTmaAlign / esize));
  add_region(name, t.data, (uint64_t(rows - 1) * uint64_t(ld) + uint64_t(cols)) * esize, output);
  return Status();
}

Status Validator::vector(const char* name, const TensorRef& t, DType dtype, int64_t length, const char* length_name,
                         Access access, bool output) {
  const char* role = output ? "output" : "input";
  if (t.data == nullptr)
    return fail(cat(name, " is null; pass a device pointer to the length-", length_name, " ", role));
  if (t.rank != 1)
    return fail(cat(name, " must be a vector (rank 1) of length ", length_name, " = ", length, ", got rank ", t.rank,
                    " with shape ", shape_text(t), "; describe it with coda::vector(...)"));
  if (t.dtype != dtype)
    return fail(cat(name, " has dtype ", dtype_name(t.dtype), ", expected ", dtype_name(dtype),
                    dtype == dtype_ ? " (the dtype of A)" : ""));
  if (t.shape[0] != length)
    return fail(cat(name, " must have length ", length_name, " = ", length, ", got ", t.shape[0]));
  if (t.stride[0] != 1)
    return fail(cat(name, " must be contiguous (stride[0] = 1), got stride[0] = ", t.stride[0]));
  const uint64_t esize = dtype_size(dtype);
  const uintptr_t addr = reinterpret_cast<uintptr_t>(t.data);
  const uint64_t align = access == Access::kNatural ? esize : kTmaAlign;
  if (addr % align != 0)
    return fail(cat(name, "'s data pointer ", hex(t.data), " is not ", align, "-byte aligned",
                    access == Access::kNatural ? "" : " (the kernel reads it with 16-byte vector loads)"));
  add_region(name, t.data, uint64_t(length) * esize, output);
  return Status();
}

Status Validator::activation(Activation act) const {
  const int32_t v = static_cast<int32_t>(act);
  if (v < 0 || v >= kNumActivations)
    return fail(cat("activation ", v, " is not one of identity (0), relu (1), silu (2), gelu_tanh (3), gelu (4)"));
  return Status();
}

Status Validator::nonnegative(const char* name, float value) const {
  if (!std::isfinite(value) || value < 0.0f)
    return fail(cat(name, " = ", value, " must be a finite value >= 0 (e.g. 1e-6)"));
  return Status();
}

Status Validator::options(const Options& options) const {
  if (options.sm_count < 0)
    return fail(cat("options.sm_count = ", options.sm_count, " must be >= 0 (0: all SMs of the device)"));
  const int32_t sw = options.swizzle;
  if (sw != 0 && sw != 1 && sw != 2 && sw != 4 && sw != 8 && sw != 16)
    return fail(cat("options.swizzle = ", sw, " must be 1, 2, 4, 8 or 16"));
  const int32_t raster = static_cast<int32_t>(options.raster);
  if (raster < 0 || raster > 3)
    return fail(cat("options.raster = ", raster,
                    " is not one of kDefault (0), kAlongM (1), kAlongN (2), kHeuristic (3)"));
  return Status();
}

Status Validator::workspace(const Workspace& ws, size_t need) {
  if (need == 0) return Status();
  if (ws.data == nullptr || ws.bytes < need)
    return Status(StatusCode::kBadWorkspace,
                  cat("coda::", op_, ": the workspace has ", ws.data == nullptr ? 0 : ws.bytes,
                      " bytes but this problem (M = ", M_, ", N = ", N_, ", K = ", K_, ") needs ", need,
                      " bytes; allocate coda::", op_, "_workspace_size(dtype, M, N, K) bytes of device memory"));
  if (reinterpret_cast<uintptr_t>(ws.data) % kWorkspaceAlign != 0)
    return Status(StatusCode::kBadWorkspace, cat("coda::", op_, ": the workspace pointer ", hex(ws.data), " is not ",
                                                 kWorkspaceAlign, "-byte aligned (cudaMalloc's alignment)"));
  add_region("the workspace", ws.data, need, /*output=*/true);
  return no_overlap();
}

Status Validator::no_overlap() const {
  for (int i = 0; i < num_regions_; ++i) {
    for (int j = 0; j < num_regions_; ++j) {
      const Region& a = regions_[i];
      const Region& b = regions_[j];
      if (i == j || !a.output || (b.output && j < i)) continue;  // each output against every other region once
      if (a.begin < b.end && b.begin < a.end)
        return fail(cat(a.name, " overlaps ", b.name, " in memory; give every output its own buffer "
                        "(in-place updates are not supported)"));
    }
  }
  return Status();
}

}  // namespace coda::detail
