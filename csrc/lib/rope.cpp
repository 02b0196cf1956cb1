// csrc/lib/rope.cpp — coda::rope_frequencies: the (2, N) fp32 table qkv_rope takes, computed on
// the host exactly as coda_ext.ops.rope_frequencies (python/coda_ext/ops/qkv.py) computes it:
//   inv_freq[i] = 1 / theta^(2i / head_dim)            (fp64; or the caller's inv_freq)
//   turns[i]    = inv_freq[i] / 2π                      (turns per position)
//   columns 2i and 2i+1 of a Q or K head (pair i): turns[i]; V columns: 0 (no rotation)
//   row 0 = float(column), row 1 = float(column − row 0)   (hi + lo: an exact-to-fp64 pair)
#include <cmath>

#include "coda/coda.hpp"
#include "detail.hpp"

namespace coda {

Status rope_frequencies(int32_t head_dim, int32_t n_heads, int32_t n_kv_heads, double theta, const double* inv_freq,
                        float* out, int64_t out_count) {
  auto fail = [](const std::string& message) {
    return Status(StatusCode::kInvalidArgument, "coda::rope_frequencies: " + message);
  };
  if (head_dim < 2 || head_dim % 2 != 0)
    return fail(detail::cat("head_dim = ", head_dim, " must be even and at least 2 (qkv_rope takes 64 or 128)"));
  if (n_heads < 1 || n_kv_heads < 1)
    return fail(detail::cat("n_heads = ", n_heads, " and n_kv_heads = ", n_kv_heads, " must both be at least 1"));
  if (inv_freq == nullptr && !(std::isfinite(theta) && theta > 0.0))
    return fail(detail::cat("theta = ", theta, " must be a finite value > 0 (e.g. 10000 or 500000), or pass inv_freq"));
  const int64_t qk_cols = (int64_t(n_heads) + n_kv_heads) * head_dim;
  const int64_t N = qk_cols + int64_t(n_kv_heads) * head_dim;
  if (out == nullptr) return fail("out is null; pass host memory for 2 * N floats");
  if (out_count != 2 * N)
    return fail(detail::cat("out holds ", out_count, " floats but the table is (2, N) = 2 * ", N, " = ", 2 * N,
                            " floats, N = (n_heads + 2 n_kv_heads) * head_dim"));
  const double two_pi = 2.0 * 3.141592653589793;  // Python's 2 * math.pi
  for (int64_t c = 0; c < N; ++c) {
    double turns = 0.0;
    if (c < qk_cols) {
      const int64_t d = c % head_dim, i = d / 2;
      const double f = inv_freq != nullptr ? inv_freq[i] : 1.0 / std::pow(theta, double(2 * i) / double(head_dim));
      turns = f / two_pi;
    }
    const float hi = static_cast<float>(turns);
    out[c] = hi;
    out[N + c] = static_cast<float>(turns - static_cast<double>(hi));
  }
  return Status();
}

}  // namespace coda
