// tests/cpp/gpu_check.hpp — what libcoda's GPU tests share: 16-bit values on the host, device
// buffers, matrices with exact host copies, and the comparison against a double reference.
//
// Tolerance (docs: "How correctness is judged"): an op's max |error| against the double
// reference must be at most 2x the error of the same math done naively in the same dtype
// (every intermediate rounded, as eager PyTorch does), plus a tiny floor. Outputs are poisoned
// with NaN first, so an unwritten element fails; padding columns must stay untouched.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "check.hpp"

namespace gpu_check {

using coda::Activation;
using coda::DType;

constexpr int kSkip = 77;  // CTest: skipped

// ---- host-side 16-bit values ---------------------------------------------------------------
inline uint16_t to_bits(DType dt, float x) {
  uint16_t bits;
  if (dt == DType::kBFloat16) {
    __nv_bfloat16 v = __float2bfloat16_rn(x);
    std::memcpy(&bits, &v, 2);
  } else {
    __half v = __float2half_rn(x);
    std::memcpy(&bits, &v, 2);
  }
  return bits;
}

inline double from_bits(DType dt, uint16_t bits) {
  if (dt == DType::kBFloat16) {
    __nv_bfloat16 v;
    std::memcpy(&v, &bits, 2);
    return __bfloat162float(v);
  }
  __half v;
  std::memcpy(&v, &bits, 2);
  return __half2float(v);
}

inline double round_to(DType dt, double x) { return from_bits(dt, to_bits(dt, float(x))); }

inline double activation(Activation act, double x) {
  switch (act) {
    case Activation::kRelu: return x > 0 ? x : 0.0;
    case Activation::kSilu: return x / (1.0 + std::exp(-x));
    case Activation::kGeluTanh: return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
    case Activation::kGelu: return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    default: return x;
  }
}

// ---- device buffers ----------------------------------------------------------------------
struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t n) : bytes(n) {
    if (cudaMalloc(&ptr, n) != cudaSuccess) {
      std::fprintf(stderr, "cudaMalloc(%zu) failed\n", n);
      std::exit(1);
    }
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void poison() const { cudaMemset(ptr, 0xff, bytes); }  // NaN in bf16, fp16 and fp32
};

// A row-major matrix of 16-bit values on host and device; `value` holds the exact values.
struct Matrix {
  DType dt;
  int64_t rows, cols, ld;
  std::vector<double> value;  // rows x cols, dense
  DeviceBuffer dev;

  Matrix(DType dt_, int64_t rows_, int64_t cols_, int64_t ld_)
      : dt(dt_), rows(rows_), cols(cols_), ld(ld_), value(size_t(rows_ * cols_)), dev(size_t(rows_ * ld_) * 2) {}

  void randomize(std::mt19937& rng, double scale) {
    std::uniform_real_distribution<double> dist(-scale, scale);
    std::vector<uint16_t> bits(size_t(rows * ld), 0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        uint16_t b = to_bits(dt, float(dist(rng)));
        bits[size_t(r * ld + c)] = b;
        value[size_t(r * cols + c)] = from_bits(dt, b);
      }
    cudaMemcpy(dev.ptr, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice);
  }
  // Reads the device values back; counts elements of the padding (cols..ld) that were written.
  std::vector<double> download(int64_t* pad_written) const {
    std::vector<uint16_t> bits(size_t(rows * ld));
    cudaMemcpy(bits.data(), dev.ptr, bits.size() * 2, cudaMemcpyDeviceToHost);
    std::vector<double> out(size_t(rows * cols));
    *pad_written = 0;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) out[size_t(r * cols + c)] = from_bits(dt, bits[size_t(r * ld + c)]);
      for (int64_t c = cols; c < ld; ++c) *pad_written += bits[size_t(r * ld + c)] != 0xffff;
    }
    return out;
  }
  coda::TensorRef ref() const { return coda::matrix(dev.ptr, dt, rows, cols, ld); }
};

// ---- comparison ----------------------------------------------------------------------------
inline void compare(const std::string& what, const std::vector<double>& got, const std::vector<double>& ref,
                    const std::vector<double>& naive, int64_t pad_written = 0) {
  double err = 0, err_naive = 0, max_ref = 0;
  int64_t nan = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(got[i])) ++nan;
    err = std::fmax(err, std::fabs(got[i] - ref[i]));
    err_naive = std::fmax(err_naive, std::fabs(naive[i] - ref[i]));
    max_ref = std::fmax(max_ref, std::fabs(ref[i]));
  }
  const double tol = 2.0 * err_naive + 1e-5 * max_ref + 1e-7;
  const bool ok = nan == 0 && pad_written == 0 && err <= tol;
  std::printf("  %-52s max|err| %.3e  naive %.3e  max|ref| %.3g%s\n", what.c_str(), err, err_naive, max_ref,
              ok ? "" : "  <-- FAILED");
  if (nan) std::printf("    %lld NaN element(s): unwritten output\n", (long long)nan);
  if (pad_written) std::printf("    %lld padding element(s) written past N\n", (long long)pad_written);
  ::check::expect(ok, what.c_str(), __FILE__, __LINE__);
}

inline bool run_ok(const coda::Status& s, const std::string& what) {
  if (!s.ok()) std::printf("  %s: %s\n", what.c_str(), s.to_string().c_str());
  ::check::expect(s.ok(), what.c_str(), __FILE__, __LINE__);
  cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) std::printf("  %s: %s\n", what.c_str(), cudaGetErrorString(err));
  ::check::expect(err == cudaSuccess, (what + ": kernel ran").c_str(), __FILE__, __LINE__);
  return s.ok() && err == cudaSuccess;
}

}  // namespace gpu_check
