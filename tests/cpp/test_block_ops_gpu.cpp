// GPU tests of libcoda's Transformer-block ops: each built kernel, bf16 and fp16, against a
// double-precision host reference of the op (what coda_ext.ops.<module>.reference computes) on
// fresh random data at small odd shapes (M = 333: not a multiple of any tile), with and without
// the optional inputs. Tolerance as in gpu_check.hpp: at most 2x the error of the same math
// done naively in the dtype, plus a tiny floor; outputs are poisoned with NaN first.
//
//   test_block_ops_gpu <op>   op: linear_residual_norm, rms_linear, linear_swiglu, qkv_rope,
//                             lm_head_cross_entropy; all: every one
// Exit status 77 (CTest: skipped) without an SM90 GPU, or when none of the op's kernels is built.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "check.hpp"
#include "coda/coda.h"
#include "gpu_check.hpp"

using coda::Activation;
using coda::DType;
using coda::Op;
using coda::Reduction;
using coda::StatusCode;

namespace {

using namespace gpu_check;

constexpr DType fp32 = DType::kFloat32;

std::string dtype_tag(DType dt) { return coda::dtype_name(dt); }

// A (M, K), B (N, K) and the exact A · Bᵀ (and its rounding to the dtype).
struct Operands {
  DType dt;
  int64_t M, N, K;
  Matrix A, B;
  std::vector<double> acc, acc_rounded;

  Operands(DType dt_, int64_t M_, int64_t N_, int64_t K_, int64_t pad, std::mt19937& rng)
      : dt(dt_), M(M_), N(N_), K(K_), A(dt_, M_, K_, K_ + pad), B(dt_, N_, K_, K_ + pad) {
    A.randomize(rng, 1.0);
    B.randomize(rng, 2.0 / std::sqrt(double(K)));
    acc.resize(static_cast<size_t>(M * N));
    acc_rounded.resize(acc.size());
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double s = 0;
        const double* a = &A.value[size_t(m * K)];
        const double* b = &B.value[size_t(n * K)];
        for (int64_t k = 0; k < K; ++k) s += a[k] * b[k];
        acc[size_t(m * N + n)] = s;
        acc_rounded[size_t(m * N + n)] = round_to(dt, s);
      }
  }
};

// A device vector of fp32 (or int32) values with its host copy.
template <class T>
struct Vector {
  std::vector<T> host;
  DeviceBuffer dev;
  explicit Vector(size_t n) : host(n), dev(std::max<size_t>(n, 1) * sizeof(T)) {}
  void upload() { cudaMemcpy(dev.ptr, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice); }
  std::vector<T> download() const {
    std::vector<T> out(host.size());
    cudaMemcpy(out.data(), dev.ptr, out.size() * sizeof(T), cudaMemcpyDeviceToHost);
    return out;
  }
  coda::TensorRef ref(DType dt) const { return coda::vector(dev.ptr, dt, int64_t(host.size())); }
};

// A vector of 16-bit values (norm weights): its exact values and its device copy.
struct HalfVector {
  DType dt;
  Matrix m;
  HalfVector(DType dt_, int64_t n, std::mt19937& rng, double lo, double hi) : dt(dt_), m(dt_, 1, n, n) {
    std::uniform_real_distribution<double> dist(lo, hi);
    std::vector<uint16_t> bits(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      bits[size_t(i)] = to_bits(dt, float(dist(rng)));
      m.value[size_t(i)] = from_bits(dt, bits[size_t(i)]);
    }
    cudaMemcpy(m.dev.ptr, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice);
  }
  double operator[](size_t i) const { return m.value[i]; }
  coda::TensorRef ref() const { return coda::vector(m.dev.ptr, dt, m.cols); }
};

std::vector<double> doubles(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

std::vector<float> random_floats(std::mt19937& rng, size_t n, double lo, double hi) {
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = float(dist(rng));
  return v;
}

struct Scratch {
  DeviceBuffer buf;
  explicit Scratch(size_t need) : buf(std::max<size_t>(need, 256)) {}
  coda::Workspace ws() const { return {buf.ptr, buf.bytes}; }
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// ---- linear_residual_norm --------------------------------------------------------------------
void linear_residual_norm_case(DType dt, int64_t M, int64_t N, int64_t K, int64_t pad, std::mt19937& rng) {
  const std::string tag = "linear_residual_norm " + dtype_tag(dt) + " M=" + std::to_string(M) + " N=" +
                          std::to_string(N) + " K=" + std::to_string(K) + (pad ? " padded" : "");
  std::printf("%s\n", tag.c_str());
  const float eps = 1e-6f;
  Operands op(dt, M, N, K, pad, rng);
  Matrix R(dt, M, N, N + pad), D(dt, M, N, N + 2 * pad), H(dt, M, N, N + pad);
  R.randomize(rng, 1.0);
  HalfVector gamma(dt, N, rng, -1.5, 1.5);
  Vector<float> rstd(static_cast<size_t>(M));
  Scratch ws(coda::linear_residual_norm_workspace_size(dt, M, N, K));
  std::vector<float> first;
  for (int rep = 0; rep < 2; ++rep) {  // twice: rstd is bit-identical run to run
    D.dev.poison();
    H.dev.poison();
    rstd.dev.poison();
    if (!run_ok(coda::linear_residual_norm(op.A.ref(), op.B.ref(), R.ref(), gamma.ref(), eps, D.ref(), H.ref(),
                                           rstd.ref(fp32), ws.ws(), nullptr),
                tag))
      return;
    if (rep == 0) first = rstd.download();
  }
  ::check::expect(same_bits(first, rstd.download()), (tag + ": rstd is deterministic").c_str(), __FILE__, __LINE__);
  const size_t MN = size_t(M * N);
  std::vector<double> d(MN), nd(MN), h(MN), nh(MN), r(static_cast<size_t>(M)), nr(static_cast<size_t>(M));
  for (int64_t m = 0; m < M; ++m) {
    double s = 0;
    float ns = 0;
    for (int64_t n = 0; n < N; ++n) {
      const size_t i = size_t(m * N + n);
      d[i] = op.acc[i] + R.value[i];
      nd[i] = round_to(dt, op.acc_rounded[i] + R.value[i]);
      h[i] = d[i] * gamma[size_t(n)];
      nh[i] = round_to(dt, nd[i] * gamma[size_t(n)]);
      s += d[i] * d[i];
      ns += float(nd[i] * nd[i]);
    }
    r[size_t(m)] = 1.0 / std::sqrt(s / double(N) + eps);
    nr[size_t(m)] = 1.0f / std::sqrt(ns / float(N) + eps);
  }
  int64_t pad_written = 0;
  compare(tag + ": D = A·Bᵀ + residual", D.download(&pad_written), d, nd, pad_written);
  compare(tag + ": H = D ⊙ norm_weight", H.download(&pad_written), h, nh, pad_written);
  compare(tag + ": rstd (fp32)", doubles(first), r, nr);
}

void test_linear_residual_norm(std::mt19937& rng) {
  if (coda::is_built(Op::kLinearResidualNorm, DType::kBFloat16)) {
    linear_residual_norm_case(DType::kBFloat16, 333, 520, 264, 0, rng);
    linear_residual_norm_case(DType::kBFloat16, 1030, 776, 512, 8, rng);  // several tiles, padded strides
  }
  if (coda::is_built(Op::kLinearResidualNorm, DType::kFloat16)) linear_residual_norm_case(DType::kFloat16, 333, 520, 264, 8, rng);
}

// ---- rms_linear ------------------------------------------------------------------------------
void rms_linear_case(DType dt, int64_t M, int64_t N, int64_t K, std::mt19937& rng) {
  const std::string tag = "rms_linear " + dtype_tag(dt) + " M=" + std::to_string(M) + " N=" + std::to_string(N) +
                          " K=" + std::to_string(K);
  std::printf("%s\n", tag.c_str());
  Operands op(dt, M, N, K, 0, rng);
  Vector<float> rstd(static_cast<size_t>(M));
  rstd.host = random_floats(rng, size_t(M), 0.5, 2.0);
  rstd.upload();
  Matrix D(dt, M, N, N);
  Scratch ws(coda::rms_linear_workspace_size(dt, M, N, K));
  for (int a = 0; a < coda::kNumActivations; ++a) {
    const Activation act = Activation(a);
    coda::Options options;
    if (act == Activation::kGelu) {  // explicit launch options: 8 SMs (the scheduler loops), swizzle 2, along M
      options.sm_count = 8;
      options.swizzle = 2;
      options.raster = coda::Raster::kAlongM;
    }
    const std::string what = tag + " " + coda::activation_name(act) + (act == Activation::kGelu ? " (8 SMs)" : "");
    D.dev.poison();
    if (!run_ok(coda::rms_linear(op.A.ref(), op.B.ref(), rstd.ref(fp32), act, D.ref(), ws.ws(), nullptr, options),
                what))
      continue;
    std::vector<double> ref(op.acc.size()), naive(op.acc.size());
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        const size_t i = size_t(m * N + n);
        const double r = rstd.host[size_t(m)];
        ref[i] = activation(act, r * op.acc[i]);
        naive[i] = round_to(dt, activation(act, round_to(dt, r * op.acc_rounded[i])));
      }
    int64_t pad_written = 0;
    compare(what + ": D", D.download(&pad_written), ref, naive, pad_written);
  }
}

void test_rms_linear(std::mt19937& rng) {
  if (coda::is_built(Op::kRmsLinear, DType::kBFloat16)) rms_linear_case(DType::kBFloat16, 333, 520, 264, rng);
  if (coda::is_built(Op::kRmsLinear, DType::kFloat16)) rms_linear_case(DType::kFloat16, 333, 264, 136, rng);
}

// ---- linear_swiglu ---------------------------------------------------------------------------
void linear_swiglu_case(DType dt, int64_t M, int64_t N, int64_t K, bool with_z, bool with_rstd, std::mt19937& rng) {
  const Op kernel = with_z ? Op::kLinearSwigluTrain : Op::kLinearSwiglu;
  if (!coda::is_built(kernel, dt)) return;
  const std::string tag = "linear_swiglu " + dtype_tag(dt) + " M=" + std::to_string(M) + " N=" + std::to_string(N) +
                          " K=" + std::to_string(K) + (with_z ? " +Z" : " Y only") + (with_rstd ? " rstd" : " no rstd");
  std::printf("%s\n", tag.c_str());
  Operands op(dt, M, N, K, 0, rng);
  const int64_t Hn = N / 2;
  Vector<float> rstd(static_cast<size_t>(M));
  rstd.host = random_floats(rng, size_t(M), 0.5, 2.0);
  rstd.upload();
  Matrix Z(dt, M, N, N + 8), Y(dt, M, Hn, Hn + 3);  // Y needs only element alignment: an odd padding is fine
  Scratch ws(coda::linear_swiglu_workspace_size(dt, M, N, K, with_z));
  Z.dev.poison();
  Y.dev.poison();
  if (!run_ok(coda::linear_swiglu(op.A.ref(), op.B.ref(), with_rstd ? rstd.ref(fp32) : coda::TensorRef{},
                                  with_z ? Z.ref() : coda::TensorRef{}, Y.ref(), ws.ws(), nullptr),
              tag))
    return;
  std::vector<double> z(op.acc.size()), nz(op.acc.size()), y(static_cast<size_t>(M * Hn)), ny(static_cast<size_t>(M * Hn));
  for (int64_t m = 0; m < M; ++m) {
    const double r = with_rstd ? rstd.host[size_t(m)] : 1.0;
    for (int64_t n = 0; n < N; ++n) {
      const size_t i = size_t(m * N + n);
      z[i] = r * op.acc[i];
      nz[i] = round_to(dt, r * op.acc_rounded[i]);
    }
    for (int64_t i = 0; i < Hn; ++i) {
      const size_t g = size_t(m * N + 2 * i), u = g + 1, o = size_t(m * Hn + i);
      y[o] = activation(Activation::kSilu, z[g]) * z[u];
      ny[o] = round_to(dt, round_to(dt, activation(Activation::kSilu, nz[g])) * nz[u]);
    }
  }
  int64_t pad_written = 0;
  compare(tag + ": Y = silu(z[:, 2i]) * z[:, 2i+1]", Y.download(&pad_written), y, ny, pad_written);
  if (with_z) {
    compare(tag + ": Z", Z.download(&pad_written), z, nz, pad_written);
  } else {  // not written: still the poison
    std::vector<uint16_t> bits(size_t(M * (N + 8)));
    cudaMemcpy(bits.data(), Z.dev.ptr, bits.size() * 2, cudaMemcpyDeviceToHost);
    ::check::expect(std::all_of(bits.begin(), bits.end(), [](uint16_t b) { return b == 0xffff; }),
                    (tag + ": no Z written").c_str(), __FILE__, __LINE__);
  }
}

void test_linear_swiglu(std::mt19937& rng) {
  linear_swiglu_case(DType::kBFloat16, 333, 520, 264, true, true, rng);
  linear_swiglu_case(DType::kBFloat16, 333, 520, 264, false, false, rng);
  linear_swiglu_case(DType::kBFloat16, 333, 262, 264, false, true, rng);  // Y only: N even, not a multiple of 8
  linear_swiglu_case(DType::kFloat16, 333, 520, 136, true, false, rng);
  linear_swiglu_case(DType::kFloat16, 1030, 776, 512, false, true, rng);
}

// ---- qkv_rope --------------------------------------------------------------------------------
enum class Norm { kNone, kFp32, kDType };

void qkv_rope_case(DType dt, int64_t M, int64_t K, int32_t heads, int32_t kv, int64_t hd, bool with_rstd, Norm norm,
                   std::mt19937& rng) {
  const Op kernel = norm == Norm::kNone ? Op::kQkvRope : hd == 64 ? Op::kQkvRopeQkNorm64 : Op::kQkvRopeQkNorm128;
  if (!coda::is_built(kernel, dt)) return;
  const int64_t N = (heads + 2 * kv) * hd;
  const std::string tag = "qkv_rope " + dtype_tag(dt) + " M=" + std::to_string(M) + " K=" + std::to_string(K) +
                          " heads " + std::to_string(heads) + "/" + std::to_string(kv) + " x " + std::to_string(hd) +
                          (with_rstd ? " rstd" : "") +
                          (norm == Norm::kNone ? "" : norm == Norm::kFp32 ? " QK-norm (fp32)" : " QK-norm");
  std::printf("%s\n", tag.c_str());
  const double theta = 500000.0;
  const float eps = 1e-6f;
  Operands op(dt, M, N, K, 0, rng);
  Vector<float> rstd(static_cast<size_t>(M)), positions(static_cast<size_t>(M)), freqs(static_cast<size_t>(2 * N));
  rstd.host = random_floats(rng, size_t(M), 0.5, 2.0);
  rstd.upload();
  std::uniform_int_distribution<int> pos(0, 131071);
  for (int64_t m = 0; m < M; ++m) positions.host[size_t(m)] = float(m < 8 ? m : pos(rng));  // 0..7, then up to 2^17
  positions.upload();
  if (!run_ok(coda::rope_frequencies(int32_t(hd), heads, kv, theta, nullptr, freqs.host.data(), 2 * N),
              "rope_frequencies"))
    return;
  freqs.upload();
  // QK-norm weights: fp32 or the operands' dtype.
  const DType wdt = norm == Norm::kFp32 ? fp32 : dt;
  std::vector<double> qw(size_t(hd), 1.0), kw(size_t(hd), 1.0);
  DeviceBuffer qdev(size_t(hd) * 4), kdev(size_t(hd) * 4);
  if (norm != Norm::kNone) {
    for (auto [w, devbuf] : {std::pair<std::vector<double>*, DeviceBuffer*>{&qw, &qdev}, {&kw, &kdev}}) {
      std::vector<float> f = random_floats(rng, size_t(hd), 0.5, 1.5);
      std::vector<uint16_t> bits(static_cast<size_t>(hd));
      for (int64_t i = 0; i < hd; ++i) {
        if (wdt == fp32) {
          (*w)[size_t(i)] = f[size_t(i)];
        } else {
          bits[size_t(i)] = to_bits(dt, f[size_t(i)]);
          (*w)[size_t(i)] = from_bits(dt, bits[size_t(i)]);
        }
      }
      if (wdt == fp32)
        cudaMemcpy(devbuf->ptr, f.data(), size_t(hd) * 4, cudaMemcpyHostToDevice);
      else
        cudaMemcpy(devbuf->ptr, bits.data(), size_t(hd) * 2, cudaMemcpyHostToDevice);
    }
  }
  const coda::TensorRef q_ref = norm == Norm::kNone ? coda::TensorRef{} : coda::vector(qdev.ptr, wdt, hd);
  const coda::TensorRef k_ref = norm == Norm::kNone ? coda::TensorRef{} : coda::vector(kdev.ptr, wdt, hd);
  Matrix out(dt, M, N, N + 8);
  Scratch ws(coda::qkv_rope_workspace_size(dt, M, N, K, int32_t(hd), norm != Norm::kNone));
  out.dev.poison();
  if (!run_ok(coda::qkv_rope(op.A.ref(), op.B.ref(), positions.ref(fp32), coda::matrix(freqs.dev.ptr, fp32, 2, N),
                             heads, kv, with_rstd ? rstd.ref(fp32) : coda::TensorRef{}, q_ref, k_ref, eps, out.ref(),
                             ws.ws(), nullptr),
              tag))
    return;

  // Reference (double, exact angles) and the naive version (z, the norm and the output rounded
  // to the dtype; the angles exact too, so the tolerance stays tight).
  const int64_t qk_cols = (heads + kv) * hd;
  std::vector<double> ref(op.acc.size()), naive(op.acc.size());
  std::vector<double> z(static_cast<size_t>(N)), nz(static_cast<size_t>(N));
  for (int64_t m = 0; m < M; ++m) {
    const double r = with_rstd ? rstd.host[size_t(m)] : 1.0;
    for (int64_t n = 0; n < N; ++n) {
      z[size_t(n)] = r * op.acc[size_t(m * N + n)];
      nz[size_t(n)] = round_to(dt, r * op.acc_rounded[size_t(m * N + n)]);
    }
    if (norm != Norm::kNone) {
      for (int64_t h0 = 0; h0 < qk_cols; h0 += hd) {
        const std::vector<double>& w = h0 < heads * hd ? qw : kw;
        double s = 0, ns = 0;
        for (int64_t d = 0; d < hd; ++d) {
          s += z[size_t(h0 + d)] * z[size_t(h0 + d)];
          ns += nz[size_t(h0 + d)] * nz[size_t(h0 + d)];
        }
        const double inv = 1.0 / std::sqrt(s / double(hd) + eps), ninv = 1.0 / std::sqrt(ns / double(hd) + eps);
        for (int64_t d = 0; d < hd; ++d) {
          z[size_t(h0 + d)] *= inv * w[size_t(d)];
          nz[size_t(h0 + d)] = round_to(dt, nz[size_t(h0 + d)] * ninv * w[size_t(d)]);
        }
      }
    }
    for (int64_t n = 0; n < N; n += 2) {
      const size_t i = size_t(m * N + n);
      if (n >= qk_cols) {  // V
        ref[i] = z[size_t(n)], ref[i + 1] = z[size_t(n + 1)];
        naive[i] = nz[size_t(n)], naive[i + 1] = nz[size_t(n + 1)];
        continue;
      }
      const int64_t pair = (n % hd) / 2;
      const double angle = double(positions.host[size_t(m)]) / std::pow(theta, double(2 * pair) / double(hd));
      const double c = std::cos(angle), s = std::sin(angle);
      const double a = z[size_t(n)], b = z[size_t(n + 1)], na = nz[size_t(n)], nb = nz[size_t(n + 1)];
      ref[i] = a * c - b * s;
      ref[i + 1] = b * c + a * s;
      naive[i] = round_to(dt, na * c - nb * s);
      naive[i + 1] = round_to(dt, nb * c + na * s);
    }
  }
  int64_t pad_written = 0;
  compare(tag + ": [Q | K | V]", out.download(&pad_written), ref, naive, pad_written);
}

void test_qkv_rope(std::mt19937& rng) {
  qkv_rope_case(DType::kBFloat16, 333, 264, 2, 1, 128, false, Norm::kNone, rng);
  qkv_rope_case(DType::kBFloat16, 333, 264, 4, 2, 64, true, Norm::kNone, rng);
  qkv_rope_case(DType::kBFloat16, 333, 264, 4, 2, 64, true, Norm::kFp32, rng);
  qkv_rope_case(DType::kBFloat16, 333, 136, 4, 2, 128, false, Norm::kDType, rng);
  qkv_rope_case(DType::kFloat16, 333, 264, 2, 1, 128, true, Norm::kDType, rng);
  qkv_rope_case(DType::kFloat16, 333, 136, 4, 2, 64, false, Norm::kFp32, rng);
  qkv_rope_case(DType::kFloat16, 200, 136, 6, 1, 64, true, Norm::kNone, rng);
}

// ---- lm_head_cross_entropy -------------------------------------------------------------------
void lm_head_case(DType dt, int64_t M, int64_t V, int64_t K, bool with_rstd, std::mt19937& rng) {
  if (!coda::is_built(Op::kLmHeadCrossEntropy, dt)) return;
  const std::string tag = "lm_head_cross_entropy " + dtype_tag(dt) + " M=" + std::to_string(M) + " V=" +
                          std::to_string(V) + " K=" + std::to_string(K) + (with_rstd ? " rstd" : "");
  std::printf("%s\n", tag.c_str());
  const int32_t ignore = -100;
  Operands op(dt, M, V, K, 0, rng);
  Vector<float> rstd(static_cast<size_t>(M)), lse(static_cast<size_t>(M)), loss(static_cast<size_t>(M)), scalar(1);
  Vector<int32_t> target(static_cast<size_t>(M));
  rstd.host = random_floats(rng, size_t(M), 0.5, 2.0);
  rstd.upload();
  std::uniform_int_distribution<int32_t> cls(0, int32_t(V - 1));
  for (int64_t m = 0; m < M; ++m) target.host[size_t(m)] = m % 7 == 3 ? ignore : cls(rng);
  target.host[1] = int32_t(V - 1);  // the last column (a partial tile when V is not a multiple of it)
  target.upload();
  Scratch ws(coda::lm_head_cross_entropy_workspace_size(dt, M, V, K));

  std::vector<double> ref_lse(static_cast<size_t>(M)), ref_loss(static_cast<size_t>(M)), naive_lse(static_cast<size_t>(M)), naive_loss(static_cast<size_t>(M));
  double ref_sum = 0, naive_sum = 0;
  int64_t counted = 0;
  for (int64_t m = 0; m < M; ++m) {
    const double r = with_rstd ? rstd.host[size_t(m)] : 1.0;
    double mx = -INFINITY, nmx = -INFINITY;
    for (int64_t n = 0; n < V; ++n) {
      mx = std::max(mx, r * op.acc[size_t(m * V + n)]);
      nmx = std::max(nmx, round_to(dt, r * op.acc_rounded[size_t(m * V + n)]));
    }
    double s = 0, ns = 0;
    for (int64_t n = 0; n < V; ++n) {
      s += std::exp(r * op.acc[size_t(m * V + n)] - mx);
      ns += std::exp(round_to(dt, r * op.acc_rounded[size_t(m * V + n)]) - nmx);
    }
    ref_lse[size_t(m)] = mx + std::log(s);
    naive_lse[size_t(m)] = nmx + std::log(ns);
    const int32_t t = target.host[size_t(m)];
    if (t != ignore) {
      ref_loss[size_t(m)] = ref_lse[size_t(m)] - r * op.acc[size_t(m * V + t)];
      naive_loss[size_t(m)] = naive_lse[size_t(m)] - round_to(dt, r * op.acc_rounded[size_t(m * V + t)]);
      ++counted;
    }
    ref_sum += ref_loss[size_t(m)];
    naive_sum += naive_loss[size_t(m)];
  }

  const coda::TensorRef r_ref = with_rstd ? rstd.ref(fp32) : coda::TensorRef{};
  std::vector<float> first_lse, first_loss;
  for (int rep = 0; rep < 2; ++rep) {  // twice: bit-identical
    lse.dev.poison();
    loss.dev.poison();
    if (!run_ok(coda::lm_head_cross_entropy(op.A.ref(), op.B.ref(), target.ref(DType::kInt32), r_ref, ignore,
                                            Reduction::kNone, loss.ref(fp32), lse.ref(fp32), ws.ws(), nullptr),
                tag + " none"))
      return;
    if (rep == 0) {
      first_lse = lse.download();
      first_loss = loss.download();
    }
  }
  ::check::expect(same_bits(first_lse, lse.download()) && same_bits(first_loss, loss.download()),
                  (tag + ": deterministic").c_str(), __FILE__, __LINE__);
  compare(tag + ": lse", doubles(first_lse), ref_lse, naive_lse);
  compare(tag + ": loss (none)", doubles(first_loss), ref_loss, naive_loss);

  for (Reduction red : {Reduction::kSum, Reduction::kMean}) {
    scalar.dev.poison();
    const std::string what = tag + " " + coda::reduction_name(red);
    if (!run_ok(coda::lm_head_cross_entropy(op.A.ref(), op.B.ref(), target.ref(DType::kInt32), r_ref, ignore, red,
                                            scalar.ref(fp32), lse.ref(fp32), ws.ws(), nullptr),
                what))
      continue;
    const double div = red == Reduction::kMean ? double(counted) : 1.0;
    compare(what + ": loss", doubles(scalar.download()), {ref_sum / div}, {naive_sum / div});
  }

  // The C API, with launch options (8 SMs, swizzle 2, CUTLASS's raster heuristic).
  {
    coda_tensor cA{op.A.dev.ptr, int32_t(dt), 2, {M, K}, {op.A.ld, 1}};
    coda_tensor cB{op.B.dev.ptr, int32_t(dt), 2, {V, K}, {op.B.ld, 1}};
    coda_tensor ct{target.dev.ptr, CODA_DTYPE_INT32, 1, {M, 0}, {1, 0}};
    coda_tensor cr{rstd.dev.ptr, CODA_DTYPE_FP32, 1, {M, 0}, {1, 0}};
    coda_tensor closs{loss.dev.ptr, CODA_DTYPE_FP32, 1, {M, 0}, {1, 0}};
    coda_tensor clse{lse.dev.ptr, CODA_DTYPE_FP32, 1, {M, 0}, {1, 0}};
    coda_options options{8, 2, CODA_RASTER_HEURISTIC, 0};
    lse.dev.poison();
    loss.dev.poison();
    const int rc = coda_lm_head_cross_entropy(&cA, &cB, &ct, with_rstd ? &cr : nullptr, ignore, CODA_REDUCTION_NONE,
                                              &closs, &clse, ws.buf.ptr, ws.buf.bytes, nullptr, &options);
    if (run_ok(coda::Status(StatusCode(rc), coda_last_error_message()), tag + " (C API, 8 SMs)")) {
      compare(tag + " (C API, 8 SMs): lse", doubles(lse.download()), ref_lse, naive_lse);
      compare(tag + " (C API, 8 SMs): loss", doubles(loss.download()), ref_loss, naive_loss);
    }
  }

  // A target outside [0, V) that is not ignore_index: NaN for that token only; a mean over no
  // counted token: NaN (as torch).
  target.host[5] = int32_t(V);
  target.upload();
  loss.dev.poison();
  if (run_ok(coda::lm_head_cross_entropy(op.A.ref(), op.B.ref(), target.ref(DType::kInt32), r_ref, ignore,
                                         Reduction::kNone, loss.ref(fp32), lse.ref(fp32), ws.ws(), nullptr),
             tag + " bad target")) {
    std::vector<float> got = loss.download();
    bool ok = std::isnan(got[5]);
    for (int64_t m = 0; m < M; ++m) ok = ok && (m == 5 || got[size_t(m)] == first_loss[size_t(m)]);
    ::check::expect(ok, (tag + ": NaN for the out-of-range target only").c_str(), __FILE__, __LINE__);
  }
  std::fill(target.host.begin(), target.host.end(), ignore);
  target.upload();
  scalar.dev.poison();
  if (run_ok(coda::lm_head_cross_entropy(op.A.ref(), op.B.ref(), target.ref(DType::kInt32), r_ref, ignore,
                                         Reduction::kMean, scalar.ref(fp32), lse.ref(fp32), ws.ws(), nullptr),
             tag + " all ignored")) {
    std::vector<float> got = scalar.download();
    ::check::expect(std::isnan(got[0]), (tag + ": mean over no token is NaN").c_str(), __FILE__, __LINE__);
  }
}

void test_lm_head_cross_entropy(std::mt19937& rng) {
  lm_head_case(DType::kBFloat16, 333, 1000, 264, true, rng);
  lm_head_case(DType::kBFloat16, 333, 1003, 136, false, rng);  // V not a multiple of 8 (no D is written)
  lm_head_case(DType::kFloat16, 333, 1000, 264, false, rng);
  lm_head_case(DType::kFloat16, 130, 2056, 64, true, rng);
}

struct Section {
  const char* name;
  void (*run)(std::mt19937&);
  Op kernels[3];
  int n_kernels;
};

}  // namespace

int main(int argc, char** argv) {
  const std::string which = argc > 1 ? argv[1] : "all";
  const Section sections[] = {
      {"linear_residual_norm", test_linear_residual_norm, {Op::kLinearResidualNorm}, 1},
      {"rms_linear", test_rms_linear, {Op::kRmsLinear}, 1},
      {"linear_swiglu", test_linear_swiglu, {Op::kLinearSwiglu, Op::kLinearSwigluTrain}, 2},
      {"qkv_rope", test_qkv_rope, {Op::kQkvRope, Op::kQkvRopeQkNorm64, Op::kQkvRopeQkNorm128}, 3},
      {"lm_head_cross_entropy", test_lm_head_cross_entropy, {Op::kLmHeadCrossEntropy}, 1},
  };
  bool known = which == "all";
  for (const Section& s : sections) known = known || which == s.name;
  if (!known) {
    std::fprintf(stderr, "unknown op '%s'\n", which.c_str());
    return 2;
  }
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
  std::mt19937 rng(4321);
  for (const Section& s : sections) {
    if (which != "all" && which != s.name) continue;
    bool built = false;
    for (int i = 0; i < s.n_kernels; ++i)
      for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
        const bool b = coda::is_built(s.kernels[i], dt);
        built = built || b;
        if (!b) std::printf("not built, not tested: %s_%s\n", coda::op_name(s.kernels[i]), coda::dtype_name(dt));
      }
    if (!built) continue;
    any = true;
    s.run(rng);
  }
  if (!any) {
    std::printf("SKIPPED: none of the kernels of '%s' is built into this libcoda\n", which.c_str());
    return kSkip;
  }
  EXPECT(cudaGetLastError() == cudaSuccess);
  return ::check::finish(("test_block_ops_gpu " + which).c_str());
}
