// Host-side tests of libcoda's Transformer-block ops (linear_residual_norm, rms_linear,
// linear_swiglu, qkv_rope, lm_head_cross_entropy) and of coda::rope_frequencies: argument
// validation, kernel selection, workspace queries, configs, the C API. No GPU, no launch: the
// pointers are fake, aligned, far-apart device addresses that are never dereferenced — every
// call fails validation, or stops at the "kernel not built" / "no SM90 device" checks.
//
//   test_block_ops_host <section>   sections: common, linear_residual_norm, rms_linear,
//                                   linear_swiglu, qkv_rope, lm_head_cross_entropy, c_api; all: every one
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "check.hpp"

using coda::Activation;
using coda::DType;
using coda::Op;
using coda::Reduction;
using coda::StatusCode;
using coda::TensorRef;

namespace {

constexpr DType bf16 = DType::kBFloat16;
constexpr DType fp16 = DType::kFloat16;
constexpr DType fp32 = DType::kFloat32;
constexpr DType i32 = DType::kInt32;
constexpr StatusCode bad = StatusCode::kInvalidArgument;

void* fake(int i, uintptr_t offset = 0) { return reinterpret_cast<void*>((uintptr_t(i) << 36) + offset); }
size_t floats(int64_t n) { return (size_t(n) * 4 + 255) / 256 * 256; }

const bool g_have_sm90 = coda::check_device().ok();

// A call with valid arguments stops at "not built" (naming `kernel`) or, with the kernel built, at
// "no SM90 device". With an SM90 GPU the call would launch on fake pointers, so it is not made.
template <class Call>
void expect_valid(Op op, DType dtype, const char* kernel, Call call, const char* what) {
  if (!coda::is_built(op, dtype)) {
    ::check::expect_status(call(), StatusCode::kNotBuilt, {"was built without", kernel}, what, __FILE__, __LINE__);
  } else if (!g_have_sm90) {
    ::check::expect_status(call(), StatusCode::kUnsupportedDevice, {"SM90"}, what, __FILE__, __LINE__);
  }
}

// ---- common: names, types, configs, options -----------------------------------------------
void test_common() {
  EXPECT(std::string(coda::dtype_name(i32)) == "int32" && coda::dtype_size(i32) == 4);
  EXPECT(std::string(coda::reduction_name(Reduction::kMean)) == "mean");
  EXPECT(std::string(coda::reduction_name(Reduction(7))) == "unknown");
  const char* names[] = {"linear_residual_norm", "rms_linear", "linear_swiglu", "linear_swiglu_train", "qkv_rope",
                         "qkv_rope_qk_norm64", "qkv_rope_qk_norm128", "lm_head_cross_entropy"};
  for (int i = 0; i < 8; ++i)
    ::check::expect(std::string(coda::op_name(Op(5 + i))) == names[i], names[i], __FILE__, __LINE__);
  EXPECT(coda::kNumOps == 13);
  EXPECT(std::string(coda::op_name(Op(13))) == "unknown");

  // Every op has a config; the gemm_* ops keep theirs; QK-norm needs one head per epilogue subtile.
  for (int op = 0; op < coda::kNumOps; ++op) {
    const coda::KernelConfig c = coda::kernel_config(Op(op));
    const bool ok = c.tile_m >= 64 && c.tile_n >= 64 && c.tile_k == 64 && c.cluster_m >= 1 && c.cluster_n >= 1 &&
                    (std::string(c.schedule) == "cooperative" || std::string(c.schedule) == "pingpong") &&
                    (c.swizzle == 1 || c.swizzle == 2 || c.swizzle == 4 || c.swizzle == 8) &&
                    c.raster != coda::Raster::kDefault;
    ::check::expect(ok, coda::op_name(Op(op)), __FILE__, __LINE__);
  }
  const coda::KernelConfig g = coda::kernel_config(Op::kGemmBiasAct), g0 = coda::kernel_config();
  EXPECT(g.tile_m == g0.tile_m && g.tile_n == g0.tile_n && g.swizzle == 1 && g.raster == coda::Raster::kHeuristic);
  const coda::KernelConfig n64 = coda::kernel_config(Op::kQkvRopeQkNorm64);
  const coda::KernelConfig n128 = coda::kernel_config(Op::kQkvRopeQkNorm128);
  EXPECT(n64.epilogue_tile_n == 64 && n128.epilogue_tile_n == 128 && n128.tile_n % 128 == 0);
  EXPECT(coda::kernel_config(Op(99)).tile_m == 0);

  // Options: the raster and swizzle rules hold for the new ops too.
  const int64_t M = 200, N = 520, K = 136;
  TensorRef A = coda::matrix(fake(1), bf16, M, K), B = coda::matrix(fake(2), bf16, N, K);
  TensorRef rstd = coda::vector(fake(3), fp32, M), D = coda::matrix(fake(4), bf16, M, N);
  coda::Workspace ws{fake(9), size_t(1) << 24};
  coda::Options o;
  EXPECT(o.swizzle == 0 && o.raster == coda::Raster::kDefault);
  o.raster = coda::Raster(4);
  EXPECT_STATUS(coda::rms_linear(A, B, rstd, Activation::kSilu, D, ws, nullptr, o), bad, "options.raster = 4",
                "kHeuristic (3)");
  o = coda::Options();
  o.swizzle = 32;
  EXPECT_STATUS(coda::rms_linear(A, B, rstd, Activation::kSilu, D, ws, nullptr, o), bad, "swizzle = 32",
                "1, 2, 4, 8 or 16");
  o = coda::Options();
  o.raster = coda::Raster::kHeuristic;
  o.swizzle = 2;
  expect_valid(Op::kRmsLinear, bf16, "rms_linear_bf16",
               [&] { return coda::rms_linear(A, B, rstd, Activation::kSilu, D, ws, nullptr, o); }, "explicit options");

  for (int op = 5; op < coda::kNumOps; ++op) {
    EXPECT(coda::workspace_size({Op(op), bf16, 0, 512, 64}) == 0);
    EXPECT(coda::workspace_size({Op(op), fp32, 128, 512, 64}) == 0);
  }
}

// ---- linear_residual_norm --------------------------------------------------------------------
struct ResidualNormCase {
  int64_t M = 200, N = 264, K = 136;
  DType dt;
  TensorRef A, B, residual, norm_weight, D, H, rstd;
  float eps = 1e-6f;
  coda::Workspace ws{fake(9), size_t(1) << 24};
  explicit ResidualNormCase(DType d = bf16) : dt(d) {
    A = coda::matrix(fake(1), dt, M, K);
    B = coda::matrix(fake(2), dt, N, K);
    residual = coda::matrix(fake(3), dt, M, N);
    norm_weight = coda::vector(fake(4), dt, N);
    D = coda::matrix(fake(5), dt, M, N);
    H = coda::matrix(fake(6), dt, M, N);
    rstd = coda::vector(fake(7), fp32, M);
  }
  coda::Status call() const {
    return coda::linear_residual_norm(A, B, residual, norm_weight, eps, D, H, rstd, ws, nullptr);
  }
};

void test_linear_residual_norm() {
  using C = ResidualNormCase;
  { C x; x.residual.data = nullptr; EXPECT_STATUS(x.call(), bad, "coda::linear_residual_norm: residual is null"); }
  { C x; x.residual.stride[0] = 268; EXPECT_STATUS(x.call(), bad, "residual's rows are 536 bytes apart"); }
  { C x; x.norm_weight.dtype = fp32; EXPECT_STATUS(x.call(), bad, "norm_weight has dtype fp32, expected bf16"); }
  { C x; x.norm_weight.shape[0] = 200; EXPECT_STATUS(x.call(), bad, "norm_weight must have length N = 264, got 200"); }
  { C x; x.norm_weight.data = fake(4, 8); EXPECT_STATUS(x.call(), bad, "norm_weight's data pointer", "16-byte"); }
  { C x; x.eps = -1.0f; EXPECT_STATUS(x.call(), bad, "eps = -1 must be a finite value >= 0"); }
  { C x; x.eps = std::numeric_limits<float>::quiet_NaN(); EXPECT_STATUS(x.call(), bad, "eps = nan"); }
  { C x; x.H.data = nullptr; EXPECT_STATUS(x.call(), bad, "H is null", "(M, N) output"); }
  { C x; x.H.shape[1] = 256; EXPECT_STATUS(x.call(), bad, "H must have shape (M, N) = (200, 264)"); }
  { C x; x.H = x.D; EXPECT_STATUS(x.call(), bad, "D overlaps H", "own buffer"); }
  { C x; x.D = x.residual; EXPECT_STATUS(x.call(), bad, "D overlaps residual"); }
  { C x; x.rstd.dtype = bf16; EXPECT_STATUS(x.call(), bad, "rstd has dtype bf16, expected fp32"); }
  { C x; x.rstd.shape[0] = 264; EXPECT_STATUS(x.call(), bad, "rstd must have length M = 200, got 264"); }
  { C x; x.rstd.data = fake(7, 2); EXPECT_STATUS(x.call(), bad, "rstd's data pointer", "4-byte aligned"); }
  { C x; x.rstd.data = fake(6, 64); EXPECT_STATUS(x.call(), bad, "H overlaps rstd"); }
  {
    C x;
    x.B = coda::matrix(fake(2), bf16, 260, x.K);
    EXPECT_STATUS(x.call(), bad, "N = 260 must be a multiple of 8");
  }
  if (coda::is_built(Op::kLinearResidualNorm, bf16)) {
    const size_t need = coda::linear_residual_norm_workspace_size(bf16, 200, 264, 136);
    EXPECT(need > 0 && need % 256 == 0);  // the per-tile partials of Σ D²
    { C x; x.ws = {nullptr, 0}; EXPECT_STATUS(x.call(), StatusCode::kBadWorkspace, "needs", "linear_residual_norm_workspace_size"); }
    { C x; x.ws.bytes = need - 4; EXPECT_STATUS(x.call(), StatusCode::kBadWorkspace, "needs"); }
  } else {
    EXPECT(coda::linear_residual_norm_workspace_size(bf16, 200, 264, 136) == 0);
  }
  C c;
  expect_valid(Op::kLinearResidualNorm, bf16, "linear_residual_norm_bf16", [&] { return c.call(); }, "bf16");
  C h(fp16);
  expect_valid(Op::kLinearResidualNorm, fp16, "linear_residual_norm_fp16", [&] { return h.call(); }, "fp16");
  C p;  // padded strides
  p.residual = coda::matrix(fake(3), bf16, p.M, p.N, p.N + 8);
  p.D = coda::matrix(fake(5), bf16, p.M, p.N, p.N + 16);
  expect_valid(Op::kLinearResidualNorm, bf16, "linear_residual_norm_bf16", [&] { return p.call(); }, "padded");
}

// ---- rms_linear ------------------------------------------------------------------------------
void test_rms_linear() {
  const int64_t M = 200, N = 264, K = 136;
  auto call = [&](DType dt, TensorRef rstd, Activation act, TensorRef D) {
    return coda::rms_linear(coda::matrix(fake(1), dt, M, K), coda::matrix(fake(2), dt, N, K), rstd, act, D,
                            {fake(9), size_t(1) << 24}, nullptr);
  };
  const TensorRef rstd = coda::vector(fake(3), fp32, M), D = coda::matrix(fake(4), bf16, M, N);
  EXPECT_STATUS(call(bf16, TensorRef{}, Activation::kSilu, D), bad, "coda::rms_linear: rstd is null");
  EXPECT_STATUS(call(bf16, coda::vector(fake(3), bf16, M), Activation::kSilu, D), bad, "rstd has dtype bf16, expected fp32");
  EXPECT_STATUS(call(bf16, coda::vector(fake(3, 4), fp32, M), Activation::kSilu, D), bad, "rstd's data pointer",
                "16-byte aligned");
  EXPECT_STATUS(call(bf16, coda::vector(fake(3), fp32, M + 1), Activation::kSilu, D), bad,
                "rstd must have length M = 200, got 201");
  EXPECT_STATUS(call(bf16, rstd, Activation(5), D), bad, "activation 5 is not one of identity (0)");
  EXPECT_STATUS(call(bf16, rstd, Activation::kRelu, coda::matrix(fake(4), fp16, M, N)), bad,
                "D has dtype fp16, expected bf16");
  EXPECT_STATUS(call(bf16, rstd, Activation::kRelu, coda::matrix(fake(3, 256), bf16, M, N)), bad, "D overlaps rstd");
  for (int a = 0; a < coda::kNumActivations; ++a)
    expect_valid(Op::kRmsLinear, bf16, "rms_linear_bf16", [&] { return call(bf16, rstd, Activation(a), D); },
                 coda::activation_name(Activation(a)));
  expect_valid(Op::kRmsLinear, fp16, "rms_linear_fp16",
               [&] { return call(fp16, rstd, Activation::kGelu, coda::matrix(fake(4), fp16, M, N)); }, "fp16");
  if (coda::is_built(Op::kRmsLinear, bf16)) EXPECT(coda::rms_linear_workspace_size(bf16, M, N, K) == 0);
}

// ---- linear_swiglu ---------------------------------------------------------------------------
struct SwigluCase {
  int64_t M = 200, N = 264, K = 136;
  DType dt = bf16;
  TensorRef A, B, rstd, Z, Y;
  coda::Workspace ws{fake(9), size_t(1) << 24};
  explicit SwigluCase(int64_t n = 264) : N(n) {
    A = coda::matrix(fake(1), dt, M, K);
    B = coda::matrix(fake(2), dt, N, K);
    rstd = coda::vector(fake(3), fp32, M);
    Z = coda::matrix(fake(4), dt, M, N);
    Y = coda::matrix(fake(5), dt, M, N / 2);
  }
  coda::Status call() const { return coda::linear_swiglu(A, B, rstd, Z, Y, ws, nullptr); }
};

void test_linear_swiglu() {
  using C = SwigluCase;
  { C x(263); EXPECT_STATUS(x.call(), bad, "N = 263 must be a multiple of 8"); }  // with Z: the TMA store rule first
  { C x(263); x.Z = {}; EXPECT_STATUS(x.call(), bad, "N = 263 is odd", "interleave_gate_up"); }
  { C x(262); EXPECT_STATUS(x.call(), bad, "N = 262 must be a multiple of 8", "TMA store"); }
  { C x; x.Y.data = nullptr; EXPECT_STATUS(x.call(), bad, "coda::linear_swiglu: Y is null"); }
  { C x; x.Y = coda::matrix(fake(5), bf16, x.M, x.N); EXPECT_STATUS(x.call(), bad, "Y must have shape (M, N/2) = (200, 132)"); }
  { C x; x.Z.shape[1] = 132; EXPECT_STATUS(x.call(), bad, "Z must have shape (M, N) = (200, 264)"); }
  { C x; x.Z.data = fake(4, 8); EXPECT_STATUS(x.call(), bad, "Z's data pointer", "16-byte aligned"); }
  { C x; x.Y.data = fake(4, 512); EXPECT_STATUS(x.call(), bad, "Z overlaps Y"); }
  { C x; x.rstd.shape[0] = 10; EXPECT_STATUS(x.call(), bad, "rstd must have length M = 200, got 10"); }
  { C x; x.rstd.dtype = fp16; EXPECT_STATUS(x.call(), bad, "rstd has dtype fp16, expected fp32"); }
  { C x; x.Y.data = fake(3, 16); EXPECT_STATUS(x.call(), bad, "Y overlaps rstd"); }
  // The kernel follows Z: without Z the y-only kernel (and N need not be a multiple of 8).
  C with_z;
  expect_valid(Op::kLinearSwigluTrain, bf16, "linear_swiglu_train_bf16", [&] { return with_z.call(); }, "with Z");
  C no_z;
  no_z.Z = {};
  expect_valid(Op::kLinearSwiglu, bf16, "linear_swiglu_bf16", [&] { return no_z.call(); }, "without Z");
  C no_rstd;
  no_rstd.rstd = {};
  expect_valid(Op::kLinearSwigluTrain, bf16, "linear_swiglu_train_bf16", [&] { return no_rstd.call(); }, "no rstd");
  C narrow(262);  // Y only: N even but not a multiple of 8; Y's odd leading stride is fine
  narrow.Z = {};
  narrow.rstd = {};
  narrow.Y = coda::matrix(fake(5, 2), bf16, narrow.M, 131, 133);
  expect_valid(Op::kLinearSwiglu, bf16, "linear_swiglu_bf16", [&] { return narrow.call(); }, "N = 262, Y only");
  if (coda::is_built(Op::kLinearSwiglu, bf16)) {
    // The host part of the workspace: ones in place of an absent rstd.
    const size_t need = coda::linear_swiglu_workspace_size(bf16, 200, 264, 136, /*with_z=*/false);
    EXPECT(need >= floats(200) && need % 256 == 0);
    C x;
    x.Z = {};
    x.ws.bytes = need - 1;
    EXPECT_STATUS(x.call(), StatusCode::kBadWorkspace, "linear_swiglu_workspace_size");
  }
}

// ---- qkv_rope --------------------------------------------------------------------------------
struct QkvCase {
  int64_t M = 200, K = 136;
  int32_t heads = 4, kv = 2;
  int64_t hd = 64, N = 512;
  DType dt = bf16;
  TensorRef A, B, positions, freqs, rstd, qw, kw, out;
  float eps = 1e-6f;
  coda::Workspace ws{fake(10), size_t(1) << 24};
  QkvCase(int32_t h = 4, int32_t k = 2, int64_t head_dim = 64, bool qk_norm = false)
      : heads(h), kv(k), hd(head_dim), N((h + 2 * k) * head_dim) {
    A = coda::matrix(fake(1), dt, M, K);
    B = coda::matrix(fake(2), dt, N, K);
    positions = coda::vector(fake(3), fp32, M);
    freqs = coda::matrix(fake(4), fp32, 2, N);
    rstd = coda::vector(fake(5), fp32, M);
    if (qk_norm) {
      qw = coda::vector(fake(6), fp32, hd);
      kw = coda::vector(fake(7), fp32, hd);
    }
    out = coda::matrix(fake(8), dt, M, N);
  }
  coda::Status call() const {
    return coda::qkv_rope(A, B, positions, freqs, heads, kv, rstd, qw, kw, eps, out, ws, nullptr);
  }
};

void test_qkv_rope() {
  using C = QkvCase;
  { C x; x.heads = 0; EXPECT_STATUS(x.call(), bad, "n_heads = 0 and n_kv_heads = 2 must both be at least 1"); }
  { C x; x.heads = 5; EXPECT_STATUS(x.call(), bad, "not a multiple of n_heads + 2 n_kv_heads = 9 heads"); }
  { C x(8, 4, 32); EXPECT_STATUS(x.call(), bad, "head_dim = N / (n_heads + 2 n_kv_heads) = 512 / 16 = 32", "64 or 128"); }
  { C x; x.positions.dtype = i32; EXPECT_STATUS(x.call(), bad, "positions has dtype int32, expected fp32"); }
  { C x; x.positions.data = nullptr; EXPECT_STATUS(x.call(), bad, "coda::qkv_rope: positions is null"); }
  { C x; x.freqs = coda::matrix(fake(4), fp32, 2, 256); EXPECT_STATUS(x.call(), bad, "freqs must have shape (2, N) = (2, 512)"); }
  { C x; x.freqs = coda::matrix(fake(4), fp32, 2, 512, 514); EXPECT_STATUS(x.call(), bad, "freqs's rows are 2056 bytes apart", "multiple of 4"); }
  { C x; x.freqs.dtype = bf16; EXPECT_STATUS(x.call(), bad, "freqs has dtype bf16, expected fp32"); }
  { C x; x.freqs = coda::vector(fake(4), fp32, 1024); EXPECT_STATUS(x.call(), bad, "freqs must be a matrix (rank 2)"); }
  { C x; x.rstd.shape[0] = 1; EXPECT_STATUS(x.call(), bad, "rstd must have length M = 200, got 1"); }
  { C x; x.out.shape[1] = 256; EXPECT_STATUS(x.call(), bad, "out must have shape (M, N) = (200, 512)"); }
  { C x; x.out.data = fake(4, 0); EXPECT_STATUS(x.call(), bad, "out overlaps freqs"); }
  { C x(4, 2, 64, true); x.kw = {}; EXPECT_STATUS(x.call(), bad, "needs both q_norm_weight and k_norm_weight", "no k_norm_weight"); }
  { C x(4, 2, 64, true); x.qw.shape[0] = 128; EXPECT_STATUS(x.call(), bad, "q_norm_weight must have length head_dim = 64, got 128"); }
  { C x(4, 2, 64, true); x.qw.dtype = fp16; EXPECT_STATUS(x.call(), bad, "q_norm_weight has dtype fp16; use fp32 or bf16"); }
  { C x(4, 2, 64, true); x.kw.dtype = bf16; EXPECT_STATUS(x.call(), bad, "q_norm_weight has dtype fp32 but k_norm_weight has bf16"); }
  { C x(4, 2, 64, true); x.eps = -1e-6f; EXPECT_STATUS(x.call(), bad, "eps = -1e-06 must be a finite value >= 0"); }
  {
    C x(4, 2, 64, true);  // natural alignment is enough for the QK-norm weights (read by a small kernel)
    x.qw = coda::vector(fake(6, 2), bf16, 64);
    x.kw = coda::vector(fake(7, 2), bf16, 64);
    expect_valid(Op::kQkvRopeQkNorm64, bf16, "qkv_rope_qk_norm64_bf16", [&] { return x.call(); }, "bf16 QK-norm weights");
    x.qw.data = fake(6, 1);
    EXPECT_STATUS(x.call(), bad, "q_norm_weight's data pointer", "not 2-byte aligned");
  }
  // The kernel follows QK-norm and head_dim; eps only matters with QK-norm; rstd may be absent.
  { C x; x.eps = -1.0f; expect_valid(Op::kQkvRope, bf16, "qkv_rope_bf16", [&] { return x.call(); }, "hd 64"); }
  { C x(2, 1, 128); x.rstd = {}; expect_valid(Op::kQkvRope, bf16, "qkv_rope_bf16", [&] { return x.call(); }, "hd 128"); }
  { C x(4, 2, 64, true); expect_valid(Op::kQkvRopeQkNorm64, bf16, "qkv_rope_qk_norm64_bf16", [&] { return x.call(); }, "norm 64"); }
  { C x(2, 1, 128, true); expect_valid(Op::kQkvRopeQkNorm128, bf16, "qkv_rope_qk_norm128_bf16", [&] { return x.call(); }, "norm 128"); }
  {
    C x(32, 8, 128, true);  // Llama 3 8B's heads: 48 heads of 128
    x.dt = fp16;
    x.A.dtype = x.B.dtype = x.out.dtype = fp16;
    expect_valid(Op::kQkvRopeQkNorm128, fp16, "qkv_rope_qk_norm128_fp16", [&] { return x.call(); }, "8B fp16");
  }
  if (coda::is_built(Op::kQkvRopeQkNorm64, bf16)) {
    const size_t need = coda::qkv_rope_workspace_size(bf16, 200, 512, 136, 64, true);
    EXPECT(need >= floats(200) + 2 * floats(512));  // ones, norm_a, norm_b
    C x(4, 2, 64, true);
    x.ws.bytes = need - 256;
    EXPECT_STATUS(x.call(), StatusCode::kBadWorkspace, "qkv_rope_workspace_size");
  }

  // rope_frequencies: the numbers of coda_ext.ops.rope_frequencies, as {column, hi bits, lo bits};
  // tests/unit/test_libgen.py checks these tables against Python.
  auto bits = [](float f) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    return b;
  };
  struct Want {
    int64_t col;
    uint32_t hi, lo;
  };
  auto check_table = [&](const char* what, const std::vector<float>& t, int64_t N, const Want* want, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      const bool ok = bits(t[size_t(want[i].col)]) == want[i].hi && bits(t[size_t(N + want[i].col)]) == want[i].lo;
      ::check::expect(ok, (std::string(what) + " column " + std::to_string(want[i].col)).c_str(), __FILE__, __LINE__);
    }
  };
  {
    // ROPE_TABLE rope_frequencies(64, 4, 2, theta=500000)
    const Want want[] = {
        {0, 0x3e22f983u, 0x31dc9c88u},   {1, 0x3e22f983u, 0x31dc9c88u},   {2, 0x3dd84ce5u, 0x312eb289u},
        {3, 0x3dd84ce5u, 0x312eb289u},   {63, 0x3500c2b3u, 0x28a1c80eu},  {64, 0x3e22f983u, 0x31dc9c88u},
        {255, 0x3500c2b3u, 0x28a1c80eu}, {256, 0x3e22f983u, 0x31dc9c88u}, {300, 0x37a13d00u, 0xaa98b436u},
        {383, 0x3500c2b3u, 0x28a1c80eu}, {384, 0x0u, 0x0u},               {511, 0x0u, 0x0u},
    };  // END ROPE_TABLE
    const int64_t N = (4 + 2 * 2) * 64;
    std::vector<float> t(size_t(2 * N), -1.0f);
    EXPECT(coda::rope_frequencies(64, 4, 2, 500000.0, nullptr, t.data(), 2 * N).ok());
    check_table("rope_frequencies(64, 4, 2, 500000)", t, N, want, sizeof(want) / sizeof(want[0]));
  }
  {
    // ROPE_TABLE rope_frequencies(128, 2, 1, inv_freq=[0.01, 0.02, ..., 0.64])
    const Want want[] = {
        {0, 0x3ad09b8au, 0xae7a18ebu},   {1, 0x3ad09b8au, 0xae7a18ebu}, {127, 0x3dd09b8au, 0xb17a18ebu},
        {255, 0x3dd09b8au, 0xb17a18ebu}, {256, 0x3ad09b8au, 0xae7a18ebu}, {511, 0x0u, 0x0u},
    };  // END ROPE_TABLE
    const int64_t N = (2 + 2 * 1) * 128;
    std::vector<double> inv(64);
    for (int i = 0; i < 64; ++i) inv[size_t(i)] = (i + 1) * 0.01;
    std::vector<float> t(size_t(2 * N));
    EXPECT(coda::rope_frequencies(128, 2, 1, 10000.0, inv.data(), t.data(), 2 * N).ok());
    check_table("rope_frequencies(128, 2, 1, inv_freq)", t, N, want, sizeof(want) / sizeof(want[0]));
  }
  std::vector<float> t(1024);
  EXPECT_STATUS(coda::rope_frequencies(63, 4, 2, 1e4, nullptr, t.data(), 1024), bad, "head_dim = 63 must be even");
  EXPECT_STATUS(coda::rope_frequencies(64, 4, 0, 1e4, nullptr, t.data(), 1024), bad, "n_kv_heads = 0");
  EXPECT_STATUS(coda::rope_frequencies(64, 4, 2, 0.0, nullptr, t.data(), 1024), bad, "theta = 0");
  EXPECT_STATUS(coda::rope_frequencies(64, 4, 2, 1e4, nullptr, t.data(), 1000), bad, "out holds 1000 floats",
                "2 * 512 = 1024");
  EXPECT_STATUS(coda::rope_frequencies(64, 4, 2, 1e4, nullptr, nullptr, 1024), bad, "out is null");
}

// ---- lm_head_cross_entropy -------------------------------------------------------------------
struct CrossEntropyCase {
  int64_t M = 200, N = 1003, K = 136;  // N need not be a multiple of 8 (no D)
  DType dt = bf16;
  TensorRef A, B, target, rstd, loss, lse;
  int32_t ignore_index = -100;
  Reduction reduction = Reduction::kMean;
  coda::Workspace ws{fake(9), size_t(1) << 24};
  CrossEntropyCase() {
    A = coda::matrix(fake(1), dt, M, K);
    B = coda::matrix(fake(2), dt, N, K);
    target = coda::vector(fake(3), i32, M);
    rstd = coda::vector(fake(4), fp32, M);
    loss = coda::vector(fake(5), fp32, 1);
    lse = coda::vector(fake(6), fp32, M);
  }
  coda::Status call() const {
    return coda::lm_head_cross_entropy(A, B, target, rstd, ignore_index, reduction, loss, lse, ws, nullptr);
  }
};

void test_lm_head_cross_entropy() {
  using C = CrossEntropyCase;
  { C x; x.B = coda::matrix(fake(2), bf16, int64_t(1) << 24, x.K); EXPECT_STATUS(x.call(), bad, "16777216 classes", "2^24"); }
  { C x; x.target.dtype = fp32; EXPECT_STATUS(x.call(), bad, "target has dtype fp32, expected int32"); }
  { C x; x.target.dtype = DType::kBFloat16; EXPECT_STATUS(x.call(), bad, "target has dtype bf16, expected int32"); }
  { C x; x.target.data = fake(3, 4); EXPECT_STATUS(x.call(), bad, "target's data pointer", "16-byte aligned"); }
  { C x; x.target.data = nullptr; EXPECT_STATUS(x.call(), bad, "coda::lm_head_cross_entropy: target is null"); }
  { C x; x.reduction = Reduction(3); EXPECT_STATUS(x.call(), bad, "reduction 3 is not one of kNone (0), kSum (1), kMean (2)"); }
  { C x; x.loss = coda::vector(fake(5), fp32, x.M); EXPECT_STATUS(x.call(), bad, "loss must have length 1 (reduction kSum or kMean) = 1, got 200"); }
  { C x; x.reduction = Reduction::kNone; EXPECT_STATUS(x.call(), bad, "loss must have length M (reduction kNone) = 200, got 1"); }
  { C x; x.lse.dtype = bf16; EXPECT_STATUS(x.call(), bad, "lse has dtype bf16, expected fp32"); }
  { C x; x.lse.data = fake(5, 0); EXPECT_STATUS(x.call(), bad, "loss overlaps lse"); }
  { C x; x.rstd.stride[0] = 2; EXPECT_STATUS(x.call(), bad, "rstd must be contiguous"); }
  { C x; x.loss.data = fake(3, 400); EXPECT_STATUS(x.call(), bad, "loss overlaps target"); }
  for (int r = 0; r < coda::kNumReductions; ++r) {
    C x;
    x.reduction = Reduction(r);
    if (x.reduction == Reduction::kNone) x.loss = coda::vector(fake(5), fp32, x.M);
    x.rstd = r == 1 ? TensorRef{} : x.rstd;
    x.ignore_index = r == 2 ? 0 : -100;
    expect_valid(Op::kLmHeadCrossEntropy, bf16, "lm_head_cross_entropy_bf16", [&] { return x.call(); },
                 coda::reduction_name(Reduction(r)));
  }
  if (coda::is_built(Op::kLmHeadCrossEntropy, bf16)) {
    const size_t need = coda::lm_head_cross_entropy_workspace_size(bf16, 200, 1003, 136);
    EXPECT(need >= 2 * floats(200) + 200 * 4 * 4);  // ones, target logits; two partials per (row, tile)
    C x;
    x.ws = {fake(9, 128), need};
    EXPECT_STATUS(x.call(), StatusCode::kBadWorkspace, "256-byte aligned");
  }
}

}  // namespace

extern "C" int coda_c_block_ops_checks(void);  // test_block_ops_c_api.c: the C API of these ops

int main(int argc, char** argv) {
  const std::string section = argc > 1 ? argv[1] : "all";
  const bool all = section == "all";
  bool known = all;
  std::printf("SM90 device: %s\n", g_have_sm90 ? "yes (valid-argument calls are left to the GPU tests)" : "no");
  struct {
    const char* name;
    void (*run)();
  } sections[] = {
      {"common", test_common},
      {"linear_residual_norm", test_linear_residual_norm},
      {"rms_linear", test_rms_linear},
      {"linear_swiglu", test_linear_swiglu},
      {"qkv_rope", test_qkv_rope},
      {"lm_head_cross_entropy", test_lm_head_cross_entropy},
  };
  for (const auto& s : sections) {
    if (all || section == s.name) {
      known = true;
      s.run();
    }
  }
  if (all || section == "c_api") {
    known = true;
    ::check::expect(coda_c_block_ops_checks() == 0, "C API checks (test_block_ops_c_api.c)", __FILE__, __LINE__);
  }
  if (!known) {
    std::fprintf(stderr, "unknown section '%s'\n", section.c_str());
    return 2;
  }
  return ::check::finish(("test_block_ops_host " + section).c_str());
}
