// GPU tests of libcoda: every op compiled into this library, in bf16 and fp16, against a
// double-precision host reference on fresh random data, at shapes that are and are not
// multiples of the 128 x 256 tile, with contiguous and padded leading strides.
//
// Tolerance (docs: "How correctness is judged"): the op's max |error| against the double
// reference must be at most 2x the error of the same math done naively in the same dtype
// (every intermediate rounded, as eager PyTorch does), plus a tiny floor. Outputs are
// poisoned with NaN first, so an unwritten element fails; padding columns must stay untouched.
//
// Exit status 77 (CTest: skipped) when there is no SM90 GPU.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "check.hpp"
#include "gpu_check.hpp"
#include "coda/coda.h"

using coda::Activation;
using coda::DType;
using coda::Op;
using coda::StatusCode;

namespace {

using namespace gpu_check;

// ---- one shape, one dtype: every built op --------------------------------------------------
struct Shape {
  int64_t M, N, K;
  int64_t pad;  // extra elements of every leading stride (a multiple of 8), 0: contiguous
};

void test_shape(DType dt, Shape sh, std::mt19937& rng) {
  const int64_t M = sh.M, N = sh.N, K = sh.K, P = sh.pad;
  const std::string tag = std::string(coda::dtype_name(dt)) + " M=" + std::to_string(M) + " N=" + std::to_string(N) +
                          " K=" + std::to_string(K) + (P ? " padded" : "");
  std::printf("%s\n", tag.c_str());

  Matrix A(dt, M, K, K + P), B(dt, N, K, K + 2 * P);
  A.randomize(rng, 1.0);
  B.randomize(rng, 2.0 / std::sqrt(double(K)));
  std::vector<double> acc(size_t(M * N));  // the exact A · Bᵀ
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      const double* a = &A.value[size_t(m * K)];
      const double* b = &B.value[size_t(n * K)];
      for (int64_t k = 0; k < K; ++k) s += a[k] * b[k];
      acc[size_t(m * N + n)] = s;
    }
  std::vector<double> acc_rounded(acc.size());
  for (size_t i = 0; i < acc.size(); ++i) acc_rounded[i] = round_to(dt, acc[i]);

  Matrix D(dt, M, N, N + P);
  auto workspace_for = [&](Op op) { return coda::workspace_size({op, dt, M, N, K}); };
  int64_t pad_written = 0;

  if (coda::is_built(Op::kGemm, dt)) {
    DeviceBuffer ws(std::max<size_t>(workspace_for(Op::kGemm), 256));
    D.dev.poison();
    if (run_ok(coda::gemm(A.ref(), B.ref(), D.ref(), {ws.ptr, ws.bytes}, nullptr), "gemm")) {
      auto got = D.download(&pad_written);
      compare("gemm: D", got, acc, acc_rounded, pad_written);
    }
    // The same through the C API, on 8 SMs (the persistent scheduler loops over tiles), with a
    // swizzled, along-N tile order.
    coda_tensor cA{A.dev.ptr, int32_t(dt), 2, {M, K}, {A.ld, 1}}, cB{B.dev.ptr, int32_t(dt), 2, {N, K}, {B.ld, 1}},
        cD{D.dev.ptr, int32_t(dt), 2, {M, N}, {D.ld, 1}};
    coda_options options{8, 2, 2, 0};
    D.dev.poison();
    const int rc = coda_gemm(&cA, &cB, &cD, ws.ptr, ws.bytes, nullptr, &options);
    if (run_ok(coda::Status(StatusCode(rc), coda_last_error_message()), "coda_gemm (C API, 8 SMs, swizzle 2)")) {
      auto got = D.download(&pad_written);
      compare("coda_gemm (C API, 8 SMs, swizzle 2, along N): D", got, acc, acc_rounded, pad_written);
    }
  }

  if (coda::is_built(Op::kGemmBiasAct, dt)) {
    std::vector<double> bias_value(static_cast<size_t>(N));
    DeviceBuffer bias(size_t(N) * 2);
    {
      std::uniform_real_distribution<double> dist(-1.0, 1.0);
      std::vector<uint16_t> bits(static_cast<size_t>(N));
      for (int64_t n = 0; n < N; ++n) {
        bits[size_t(n)] = to_bits(dt, float(dist(rng)));
        bias_value[size_t(n)] = from_bits(dt, bits[size_t(n)]);
      }
      cudaMemcpy(bias.ptr, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice);
    }
    DeviceBuffer ws(std::max<size_t>(workspace_for(Op::kGemmBiasAct), 256));
    for (int a = 0; a < coda::kNumActivations; ++a) {
      const Activation act = Activation(a);
      const std::string what = std::string("gemm_bias_act ") + coda::activation_name(act);
      D.dev.poison();
      if (!run_ok(coda::gemm_bias_act(A.ref(), B.ref(), coda::vector(bias.ptr, dt, N), act, D.ref(),
                                      {ws.ptr, ws.bytes}, nullptr),
                  what))
        continue;
      std::vector<double> ref(acc.size()), naive(acc.size());
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
          const size_t i = size_t(m * N + n);
          ref[i] = activation(act, acc[i] + bias_value[size_t(n)]);
          naive[i] = round_to(dt, activation(act, round_to(dt, acc_rounded[i] + bias_value[size_t(n)])));
        }
      auto got = D.download(&pad_written);
      compare(what + ": D", got, ref, naive, pad_written);
    }
  }

  if (coda::is_built(Op::kGemmResidual, dt)) {
    Matrix R(dt, M, N, N + 2 * P);
    R.randomize(rng, 1.0);
    DeviceBuffer ws(std::max<size_t>(workspace_for(Op::kGemmResidual), 256));
    D.dev.poison();
    if (run_ok(coda::gemm_residual(A.ref(), B.ref(), R.ref(), D.ref(), {ws.ptr, ws.bytes}, nullptr),
               "gemm_residual")) {
      std::vector<double> ref(acc.size()), naive(acc.size());
      for (size_t i = 0; i < acc.size(); ++i) {
        ref[i] = acc[i] + R.value[i];
        naive[i] = round_to(dt, acc_rounded[i] + R.value[i]);
      }
      auto got = D.download(&pad_written);
      compare("gemm_residual: D", got, ref, naive, pad_written);
    }
  }

  if (coda::is_built(Op::kGemmSwiglu, dt)) {
    const int64_t H = N / 2;
    Matrix Y(dt, M, H, H + (P ? 3 : 0));  // Y needs only element alignment: an odd padding is fine
    DeviceBuffer ws(std::max<size_t>(workspace_for(Op::kGemmSwiglu), 256));
    D.dev.poison();
    Y.dev.poison();
    if (run_ok(coda::gemm_swiglu(A.ref(), B.ref(), D.ref(), Y.ref(), {ws.ptr, ws.bytes}, nullptr), "gemm_swiglu")) {
      auto z = D.download(&pad_written);
      compare("gemm_swiglu: Z", z, acc, acc_rounded, pad_written);
      std::vector<double> ref(size_t(M * H)), naive(size_t(M * H));
      for (int64_t m = 0; m < M; ++m)
        for (int64_t i = 0; i < H; ++i) {
          const size_t g = size_t(m * N + 2 * i), u = g + 1, o = size_t(m * H + i);
          ref[o] = activation(Activation::kSilu, acc[g]) * acc[u];
          naive[o] = round_to(dt, round_to(dt, activation(Activation::kSilu, acc_rounded[g])) * acc_rounded[u]);
        }
      auto y = Y.download(&pad_written);
      compare("gemm_swiglu: Y = silu(Z[:, 2i]) * Z[:, 2i+1]", y, ref, naive, pad_written);
    }
  }

  if (coda::is_built(Op::kGemmRowSumSq, dt)) {
    const size_t need = workspace_for(Op::kGemmRowSumSq);
    ::check::expect(need > 0, "gemm_row_sumsq needs a workspace", __FILE__, __LINE__);
    DeviceBuffer ws(std::max<size_t>(need, 256));
    DeviceBuffer sumsq(size_t(M) * 4);
    std::vector<float> first(static_cast<size_t>(M)), second(static_cast<size_t>(M));
    for (int rep = 0; rep < 2; ++rep) {  // twice: the same workspace again, bit-identical results
      D.dev.poison();
      sumsq.poison();
      if (!run_ok(coda::gemm_row_sumsq(A.ref(), B.ref(), D.ref(), coda::vector(sumsq.ptr, DType::kFloat32, M),
                                       {ws.ptr, ws.bytes}, nullptr),
                  "gemm_row_sumsq"))
        return;
      cudaMemcpy(rep == 0 ? first.data() : second.data(), sumsq.ptr, size_t(M) * 4, cudaMemcpyDeviceToHost);
    }
    auto got_d = D.download(&pad_written);
    compare("gemm_row_sumsq: D", got_d, acc, acc_rounded, pad_written);
    std::vector<double> ref(size_t(M), 0.0), naive(size_t(M), 0.0), got(static_cast<size_t>(M));
    for (int64_t m = 0; m < M; ++m) {
      float naive_sum = 0.0f;  // torch: (D.float() ** 2).sum(-1) with D already rounded
      for (int64_t n = 0; n < N; ++n) {
        const size_t i = size_t(m * N + n);
        ref[size_t(m)] += acc[i] * acc[i];
        naive_sum += float(acc_rounded[i] * acc_rounded[i]);
      }
      naive[size_t(m)] = naive_sum;
      got[size_t(m)] = first[size_t(m)];
    }
    compare("gemm_row_sumsq: sumsq (fp32)", got, ref, naive);
    ::check::expect(std::memcmp(first.data(), second.data(), first.size() * 4) == 0,
                    "gemm_row_sumsq is deterministic (two runs, identical bits)", __FILE__, __LINE__);
  }
}

// Checks that need a GPU but launch nothing: host memory, too small a workspace.
void test_runtime_checks() {
  std::printf("runtime checks\n");
  const DType dt = coda::is_built(Op::kGemm, DType::kBFloat16) ? DType::kBFloat16 : DType::kFloat16;
  const int64_t M = 128, N = 256, K = 64;
  DeviceBuffer A(size_t(M * K) * 2), B(size_t(N * K) * 2), D(size_t(M * N) * 2);
  if (coda::is_built(Op::kGemm, dt)) {
    std::vector<uint16_t> host(size_t(M * K) + 16);
    void* host_ptr = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(host.data()) + 15) / 16 * 16);
    EXPECT_STATUS(coda::gemm(coda::matrix(host_ptr, dt, M, K), coda::matrix(B.ptr, dt, N, K),
                             coda::matrix(D.ptr, dt, M, N), {}, nullptr),
                  StatusCode::kInvalidArgument, "A (", "is not CUDA memory");
  }
  if (coda::is_built(Op::kGemmRowSumSq, dt)) {
    DeviceBuffer sumsq(size_t(M) * 4);
    EXPECT_STATUS(coda::gemm_row_sumsq(coda::matrix(A.ptr, dt, M, K), coda::matrix(B.ptr, dt, N, K),
                                       coda::matrix(D.ptr, dt, M, N), coda::vector(sumsq.ptr, DType::kFloat32, M),
                                       {D.ptr, 16}, nullptr),
                  StatusCode::kBadWorkspace, "needs");
  }
  EXPECT(cudaGetLastError() == cudaSuccess);  // the checks leave no CUDA error behind
}

}  // namespace

int main() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::printf("SKIPPED: no CUDA device (%s)\n", err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    return kSkip;
  }
  coda::Status device = coda::check_device();
  if (!device.ok()) {
    std::printf("SKIPPED: %s\n", device.message().c_str());
    return kSkip;
  }
  bool any = false;
  for (int op = 0; op < coda::kNumOps; ++op)
    for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
      const bool built = coda::is_built(Op(op), dt);
      any = any || built;
      if (!built) std::printf("not built, not tested: %s_%s\n", coda::op_name(Op(op)), coda::dtype_name(dt));
    }
  if (!any) {
    std::printf("SKIPPED: this libcoda has no kernels (CODA_BUILD_OPS=OFF)\n");
    return kSkip;
  }

  test_runtime_checks();
  std::mt19937 rng(1234);
  const Shape shapes[] = {
      {128, 256, 64, 0},    // exactly one tile
      {333, 520, 264, 0},   // M and N not multiples of the tile
      {200, 264, 136, 8},   // padded leading strides
      {1030, 776, 512, 0},  // 9 x 4 tiles
  };
  for (DType dt : {DType::kBFloat16, DType::kFloat16})
    for (const Shape& sh : shapes) test_shape(dt, sh, rng);
  return ::check::finish("test_gpu_ops");
}
