// coda_example — one fused op of libcoda on an SM90 GPU, checked against a naive host loop.
//
//   D = silu(A · Wᵀ + bias)     A (M, K), W (N, K) as torch.nn.Linear stores it, bf16
//
// Exit status: 0 passed, 1 failed, 77 skipped (no SM90 GPU on this machine).
#include <coda/coda.hpp>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#define CUDA_CHECK(expr)                                                                      \
  do {                                                                                        \
    cudaError_t err_ = (expr);                                                                \
    if (err_ != cudaSuccess) {                                                                \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(err_)); \
      return 1;                                                                               \
    }                                                                                         \
  } while (0)

namespace {

// Random bf16 values in [-scale, scale]; `exact` receives each value as a double.
std::vector<__nv_bfloat16> random_bf16(size_t n, float scale, std::mt19937& rng, std::vector<double>& exact) {
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<__nv_bfloat16> out(n);
  exact.resize(n);
  for (size_t i = 0; i < n; ++i) {
    out[i] = __float2bfloat16_rn(dist(rng));
    exact[i] = __bfloat162float(out[i]);
  }
  return out;
}

double silu(double x) { return x / (1.0 + std::exp(-x)); }

}  // namespace

int main() {
  const int64_t M = 1000, N = 776, K = 512;  // M and N are not multiples of the 128 x 256 tile
  const coda::DType bf16 = coda::DType::kBFloat16;

  coda::Status device = coda::check_device();
  if (!device.ok()) {
    std::printf("coda_example: skipped, no SM90 GPU: %s\n", device.message().c_str());
    return 77;
  }
  if (!coda::is_built(coda::Op::kGemmBiasAct, bf16)) {
    std::printf("coda_example: skipped, this libcoda has no gemm_bias_act_bf16 kernel\n");
    return 77;
  }

  // Host data: A ~ U(-1, 1), W ~ U(-1, 1) / sqrt(K) so that A · Wᵀ is O(1).
  std::mt19937 rng(2024);
  std::vector<double> a, w, b;
  auto hA = random_bf16(size_t(M * K), 1.0f, rng, a);
  auto hW = random_bf16(size_t(N * K), 1.0f / std::sqrt(float(K)), rng, w);
  auto hBias = random_bf16(size_t(N), 0.5f, rng, b);

  // Device buffers.
  void *dA, *dW, *dBias, *dD, *dWorkspace = nullptr;
  CUDA_CHECK(cudaMalloc(&dA, hA.size() * 2));
  CUDA_CHECK(cudaMalloc(&dW, hW.size() * 2));
  CUDA_CHECK(cudaMalloc(&dBias, hBias.size() * 2));
  CUDA_CHECK(cudaMalloc(&dD, size_t(M * N) * 2));
  CUDA_CHECK(cudaMemcpy(dA, hA.data(), hA.size() * 2, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(dW, hW.data(), hW.size() * 2, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(dBias, hBias.data(), hBias.size() * 2, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemset(dD, 0xff, size_t(M * N) * 2));  // NaN: an unwritten element fails the check

  // The workspace this problem needs (often 0 bytes).
  const size_t workspace_bytes = coda::gemm_bias_act_workspace_size(bf16, M, N, K);
  if (workspace_bytes > 0) CUDA_CHECK(cudaMalloc(&dWorkspace, workspace_bytes));

  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  coda::Status s = coda::gemm_bias_act(coda::matrix(dA, bf16, M, K),
                                       coda::matrix(dW, bf16, N, K),
                                       coda::vector(dBias, bf16, N),
                                       coda::Activation::kSilu,
                                       coda::matrix(dD, bf16, M, N),
                                       {dWorkspace, workspace_bytes}, stream);
  if (!s.ok()) {
    std::fprintf(stderr, "coda_example: %s\n", s.to_string().c_str());
    return 1;
  }
  CUDA_CHECK(cudaStreamSynchronize(stream));

  std::vector<__nv_bfloat16> hD(size_t(M * N));
  CUDA_CHECK(cudaMemcpy(hD.data(), dD, hD.size() * 2, cudaMemcpyDeviceToHost));

  // Naive host reference in double. The kernel rounds its fp32 result to bf16 once (relative
  // error <= 2^-8); the absolute term covers fp32 accumulation over K.
  double max_err = 0.0, max_ref = 0.0;
  int64_t bad = 0;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0.0;
      for (int64_t k = 0; k < K; ++k) acc += a[size_t(m * K + k)] * w[size_t(n * K + k)];
      const double ref = silu(acc + b[size_t(n)]);
      const double got = __bfloat162float(hD[size_t(m * N + n)]);
      const double err = std::fabs(got - ref);
      if (!(err <= std::ldexp(std::fabs(ref), -7) + 1e-4)) {  // also catches NaN
        if (bad++ < 5) std::fprintf(stderr, "  D[%lld, %lld] = %g, expected %g\n", (long long)m, (long long)n, got, ref);
      }
      if (err > max_err) max_err = err;
      if (std::fabs(ref) > max_ref) max_ref = std::fabs(ref);
    }
  }

  cudaFree(dA);
  cudaFree(dW);
  cudaFree(dBias);
  cudaFree(dD);
  cudaFree(dWorkspace);
  cudaStreamDestroy(stream);

  std::printf("coda_example: gemm_bias_act(silu) bf16 M=%lld N=%lld K=%lld: max |error| %.3g (max |D| %.3g), %lld "
              "element(s) out of tolerance: %s\n",
              (long long)M, (long long)N, (long long)K, max_err, max_ref, (long long)bad, bad ? "FAILED" : "PASSED");
  return bad ? 1 : 0;
}
