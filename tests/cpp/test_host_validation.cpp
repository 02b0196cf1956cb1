// Host-side tests of libcoda: argument validation, workspace queries, names, the kernel table.
// Runs on any machine: no GPU, no kernel launch. Pointers are fake, aligned, far-apart device
// addresses that are never dereferenced — every call here fails validation, or stops at the
// "kernel not built" / "no SM90 device" checks that come before any launch.
#include <cstdint>
#include <set>
#include <sstream>
#include <string>

#include "check.hpp"

using coda::Activation;
using coda::DType;
using coda::Op;
using coda::StatusCode;
using coda::TensorRef;

namespace {

constexpr DType bf16 = DType::kBFloat16;
constexpr DType fp16 = DType::kFloat16;
constexpr DType fp32 = DType::kFloat32;

void* fake(int i, uintptr_t offset = 0) { return reinterpret_cast<void*>((uintptr_t(i) << 36) + offset); }

// A valid problem of every op (M, N not multiples of the tile) on fake device addresses.
struct Case {
  int64_t M = 200, N = 264, K = 136;
  DType dt = bf16;
  TensorRef A, B, D, bias, residual, Z, Y, sumsq;
  coda::Workspace ws{fake(9), size_t(1) << 24};

  explicit Case(DType dtype = bf16) : dt(dtype) {
    A = coda::matrix(fake(1), dt, M, K);
    B = coda::matrix(fake(2), dt, N, K);
    D = coda::matrix(fake(3), dt, M, N);
    bias = coda::vector(fake(4), dt, N);
    residual = coda::matrix(fake(5), dt, M, N);
    Z = coda::matrix(fake(6), dt, M, N);
    Y = coda::matrix(fake(7), dt, M, N / 2);
    sumsq = coda::vector(fake(8), fp32, M);
  }
  coda::Status gemm() const { return coda::gemm(A, B, D, ws, nullptr); }
  coda::Status bias_act(Activation act = Activation::kSilu) const {
    return coda::gemm_bias_act(A, B, bias, act, D, ws, nullptr);
  }
  coda::Status residual_op() const { return coda::gemm_residual(A, B, residual, D, ws, nullptr); }
  coda::Status swiglu() const { return coda::gemm_swiglu(A, B, Z, Y, ws, nullptr); }
  coda::Status row_sumsq() const { return coda::gemm_row_sumsq(A, B, D, sumsq, ws, nullptr); }
};

const bool g_have_sm90 = coda::check_device().ok();

// A call with valid arguments: stops at "not built" or "no SM90 device" on a machine without
// one. With an SM90 GPU the call would launch on fake pointers, so it is not made (the GPU
// tests launch every op on real memory).
template <class Call>
void expect_passes_validation(Op op, DType dtype, Call call, const char* what) {
  if (!coda::is_built(op, dtype)) {
    EXPECT_STATUS(call(), StatusCode::kNotBuilt, "was built without", "reconfigure");
  } else if (!g_have_sm90) {
    ::check::expect_status(call(), StatusCode::kUnsupportedDevice, {"SM90"}, what, __FILE__, __LINE__);
  }
}

void test_names_and_types() {
  EXPECT(std::string(coda::dtype_name(bf16)) == "bf16");
  EXPECT(std::string(coda::dtype_name(fp16)) == "fp16");
  EXPECT(std::string(coda::dtype_name(DType(42))) == "unknown");
  EXPECT(coda::dtype_size(fp32) == 4 && coda::dtype_size(bf16) == 2 && coda::dtype_size(DType(42)) == 0);
  EXPECT(std::string(coda::op_name(Op::kGemmRowSumSq)) == "gemm_row_sumsq");
  EXPECT(std::string(coda::activation_name(Activation::kGeluTanh)) == "gelu_tanh");
  EXPECT(std::string(coda::status_code_name(StatusCode::kNotBuilt)) == "kernel not built");
  std::ostringstream v;
  v << coda::kVersionMajor << "." << coda::kVersionMinor << "." << coda::kVersionPatch;
  EXPECT(v.str() == coda::version_string());

  coda::Status ok;
  EXPECT(ok.ok() && static_cast<bool>(ok) && ok.to_string() == "ok");
  coda::Status bad(StatusCode::kInvalidArgument, "coda::gemm: x");
  EXPECT(!bad.ok() && bad.to_string() == "invalid argument: coda::gemm: x");

  TensorRef m = coda::matrix(fake(1), bf16, 3, 5);
  EXPECT(m.rank == 2 && m.shape[0] == 3 && m.shape[1] == 5 && m.stride[0] == 5 && m.stride[1] == 1);
  TensorRef p = coda::matrix(fake(1), bf16, 3, 5, 16);
  EXPECT(p.stride[0] == 16);
  TensorRef vec = coda::vector(fake(1), fp32, 7);
  EXPECT(vec.rank == 1 && vec.shape[0] == 7 && vec.stride[0] == 1);

  coda::KernelConfig cfg = coda::kernel_config();
  EXPECT(cfg.tile_m == 128 && cfg.tile_n == 256 && cfg.tile_k == 64 && cfg.cluster_m == 1 && cfg.cluster_n == 1);
  EXPECT(std::string(cfg.schedule) == "cooperative");
}

void test_kernel_table() {
  // CODA_TEST_KERNELS: the kernels CMake compiled, ","-separated.
  std::set<std::string> expected;
  std::stringstream list(CODA_TEST_KERNELS);
  for (std::string item; std::getline(list, item, ',');)
    if (!item.empty()) expected.insert(item);
  for (int op = 0; op < coda::kNumOps; ++op) {
    for (DType dt : {bf16, fp16}) {
      std::string name = std::string(coda::op_name(Op(op))) + "_" + coda::dtype_name(dt);
      const bool built = coda::is_built(Op(op), dt);
      ::check::expect(built == (expected.count(name) == 1), name.c_str(), __FILE__, __LINE__);
    }
  }
  EXPECT(!coda::is_built(Op::kGemm, fp32));
  EXPECT(!coda::is_built(Op(17), bf16));
  EXPECT(!coda::is_built(Op::kGemm, DType(-3)));
}

void test_workspace_queries() {
  for (int op = 0; op < coda::kNumOps; ++op) {
    EXPECT(coda::workspace_size({Op(op), bf16, 0, 256, 64}) == 0);   // invalid problems: 0
    EXPECT(coda::workspace_size({Op(op), bf16, 128, -8, 64}) == 0);
    EXPECT(coda::workspace_size({Op(op), bf16, int64_t(1) << 31, 256, 64}) == 0);
    EXPECT(coda::workspace_size({Op(op), fp32, 128, 256, 64}) == 0);  // never built
  }
  if (coda::is_built(Op::kGemm, bf16)) EXPECT(coda::gemm_workspace_size(bf16, 200, 264, 136) == 0);
  if (coda::is_built(Op::kGemmRowSumSq, bf16)) {
    // One fp32 partial per (row, 256-column tile), rows padded to 128: (256 x 2) floats at M = 200, N = 264.
    const size_t ws = coda::gemm_row_sumsq_workspace_size(bf16, 200, 264, 136);
    EXPECT(ws >= 256 * 2 * 4 && ws < 256 * 2 * 4 + (size_t(1) << 20));
    EXPECT(ws % 256 == 0);
    EXPECT(coda::gemm_row_sumsq_workspace_size(bf16, 4096, 4096, 64) > ws);  // grows with M and N
    EXPECT(coda::gemm_row_sumsq_workspace_size(bf16, 200, 264, 4096) == ws);  // not with K
  }
}

void test_operand_checks() {
  const StatusCode bad = StatusCode::kInvalidArgument;
  Case c;
  { Case x; x.A.data = nullptr; EXPECT_STATUS(x.gemm(), bad, "coda::gemm: ", "A is null"); }
  { Case x; x.B.data = nullptr; EXPECT_STATUS(x.gemm(), bad, "B is null"); }
  { Case x; x.A = coda::vector(fake(1), bf16, 100); EXPECT_STATUS(x.gemm(), bad, "A must be a matrix (rank 2)"); }
  { Case x; x.A.dtype = fp32; EXPECT_STATUS(x.gemm(), bad, "A has dtype fp32", "bf16 or fp16"); }
  { Case x; x.A.dtype = DType(9); EXPECT_STATUS(x.gemm(), bad, "unknown dtype"); }
  { Case x; x.B.dtype = fp16; EXPECT_STATUS(x.gemm(), bad, "B has dtype fp16, expected bf16"); }
  { Case x; x.B = coda::matrix(fake(2), bf16, x.N, 144); EXPECT_STATUS(x.gemm(), bad, "B must be (N, K)", "K = 136"); }
  { Case x; x.A.shape[0] = 0; EXPECT_STATUS(x.gemm(), bad, "empty problem", "M = 0"); }
  {
    Case x;
    x.A = coda::matrix(fake(1), bf16, int64_t(1) << 31, x.K);
    EXPECT_STATUS(x.gemm(), bad, "< 2^31");
  }
  {
    Case x;
    x.K = 100;
    x.A = coda::matrix(fake(1), bf16, x.M, 100, 104);
    x.B = coda::matrix(fake(2), bf16, x.N, 100, 104);
    EXPECT_STATUS(x.gemm(), bad, "K = 100 must be a multiple of 8", "pad K");
  }
  {
    Case x;
    x.B = coda::matrix(fake(2), bf16, 260, x.K);
    EXPECT_STATUS(x.gemm(), bad, "N = 260 must be a multiple of 8");
  }
  { Case x; x.A.stride[0] = 128; EXPECT_STATUS(x.gemm(), bad, "A has leading stride 128 < 136"); }
  { Case x; x.A.stride[0] = 140; EXPECT_STATUS(x.gemm(), bad, "A's rows are 280 bytes apart", "multiple of 8"); }
  { Case x; x.A.stride[1] = 2; EXPECT_STATUS(x.gemm(), bad, "contiguous last dimension"); }
  { Case x; x.B.data = fake(2, 8); EXPECT_STATUS(x.gemm(), bad, "B's data pointer", "16-byte aligned"); }
  { Case x; x.A.stride[0] = int64_t(1) << 40; EXPECT_STATUS(x.gemm(), bad, "2^40"); }
  { Case x; x.D.data = nullptr; EXPECT_STATUS(x.gemm(), bad, "D is null", "(M, N) output"); }
  { Case x; x.D.shape[1] = 256; EXPECT_STATUS(x.gemm(), bad, "D must have shape (M, N) = (200, 264), got (200, 256)"); }
  { Case x; x.D.dtype = fp16; EXPECT_STATUS(x.gemm(), bad, "D has dtype fp16, expected bf16 (the dtype of A)"); }
  { Case x; x.D.stride[0] = 268; EXPECT_STATUS(x.gemm(), bad, "D's rows are 536 bytes apart"); }
  { Case x; x.D.data = fake(1, 64); EXPECT_STATUS(x.gemm(), bad, "D overlaps A", "own buffer"); }
  {
    coda::Options o;
    o.sm_count = -1;
    EXPECT_STATUS(coda::gemm(c.A, c.B, c.D, c.ws, nullptr, o), bad, "sm_count = -1");
    o = coda::Options();
    o.swizzle = 3;
    EXPECT_STATUS(coda::gemm(c.A, c.B, c.D, c.ws, nullptr, o), bad, "swizzle = 3 must be 1, 2, 4, 8 or 16");
    o = coda::Options();
    o.raster = coda::Raster(5);
    EXPECT_STATUS(coda::gemm(c.A, c.B, c.D, c.ws, nullptr, o), bad, "raster = 5");
    o = coda::Options();
    o.swizzle = 8;
    o.raster = coda::Raster::kAlongN;
    o.sm_count = 4;
    expect_passes_validation(Op::kGemm, bf16, [&] { return coda::gemm(c.A, c.B, c.D, c.ws, nullptr, o); },
                             "gemm with options");
    o.swizzle = 16;   // past CUTLASS's cap (csrc/kernels/wide_swizzle.cuh)
    expect_passes_validation(Op::kGemm, bf16, [&] { return coda::gemm(c.A, c.B, c.D, c.ws, nullptr, o); },
                             "gemm with swizzle 16");
  }
  expect_passes_validation(Op::kGemm, bf16, [&] { return c.gemm(); }, "gemm bf16");
  Case h(fp16);
  expect_passes_validation(Op::kGemm, fp16, [&] { return h.gemm(); }, "gemm fp16");
  // A padded leading stride (a multiple of 8) is fine.
  Case p;
  p.A = coda::matrix(fake(1), bf16, p.M, p.K, p.K + 8);
  p.D = coda::matrix(fake(3), bf16, p.M, p.N, p.N + 24);
  expect_passes_validation(Op::kGemm, bf16, [&] { return p.gemm(); }, "gemm padded strides");
}

void test_bias_act_checks() {
  const StatusCode bad = StatusCode::kInvalidArgument;
  Case c;
  { Case x; x.bias.data = nullptr; EXPECT_STATUS(x.bias_act(), bad, "coda::gemm_bias_act: bias is null"); }
  { Case x; x.bias.shape[0] = 263; EXPECT_STATUS(x.bias_act(), bad, "bias must have length N = 264, got 263"); }
  { Case x; x.bias = coda::matrix(fake(4), bf16, 1, 264); EXPECT_STATUS(x.bias_act(), bad, "bias must be a vector"); }
  { Case x; x.bias.dtype = fp32; EXPECT_STATUS(x.bias_act(), bad, "bias has dtype fp32, expected bf16"); }
  { Case x; x.bias.data = fake(4, 2); EXPECT_STATUS(x.bias_act(), bad, "bias's data pointer", "16-byte aligned"); }
  { Case x; x.bias.stride[0] = 2; EXPECT_STATUS(x.bias_act(), bad, "bias must be contiguous"); }
  EXPECT_STATUS(c.bias_act(Activation(5)), bad, "activation 5 is not one of identity (0)");
  EXPECT_STATUS(c.bias_act(Activation(-1)), bad, "activation -1");
  for (int act = 0; act < coda::kNumActivations; ++act)
    expect_passes_validation(Op::kGemmBiasAct, bf16, [&] { return c.bias_act(Activation(act)); }, "bias_act");
  Case h(fp16);
  expect_passes_validation(Op::kGemmBiasAct, fp16, [&] { return h.bias_act(Activation::kGelu); }, "bias_act fp16");
}

void test_residual_checks() {
  const StatusCode bad = StatusCode::kInvalidArgument;
  { Case x; x.residual.data = nullptr; EXPECT_STATUS(x.residual_op(), bad, "coda::gemm_residual: residual is null"); }
  { Case x; x.residual.stride[0] = 260; EXPECT_STATUS(x.residual_op(), bad, "residual has leading stride 260"); }
  { Case x; x.residual.data = fake(5, 32 + 8); EXPECT_STATUS(x.residual_op(), bad, "residual's data pointer"); }
  { Case x; x.residual.shape[0] = 199; EXPECT_STATUS(x.residual_op(), bad, "residual must have shape (M, N)"); }
  { Case x; x.D = x.residual; EXPECT_STATUS(x.residual_op(), bad, "D overlaps residual", "in-place"); }
  Case c;
  expect_passes_validation(Op::kGemmResidual, bf16, [&] { return c.residual_op(); }, "residual");
}

void test_swiglu_checks() {
  const StatusCode bad = StatusCode::kInvalidArgument;
  { Case x; x.Y = coda::matrix(fake(7), bf16, x.M, x.N); EXPECT_STATUS(x.swiglu(), bad, "Y must have shape (M, N/2) = (200, 132)"); }
  { Case x; x.Z.data = nullptr; EXPECT_STATUS(x.swiglu(), bad, "coda::gemm_swiglu: Z is null"); }
  { Case x; x.Y.data = fake(7, 1); EXPECT_STATUS(x.swiglu(), bad, "Y's data pointer", "2-byte elements"); }
  { Case x; x.Y.stride[0] = 100; EXPECT_STATUS(x.swiglu(), bad, "Y has leading stride 100 < 132"); }
  { Case x; x.Y.data = fake(6, 256); EXPECT_STATUS(x.swiglu(), bad, "Z overlaps Y"); }
  // Y only needs element alignment: a 2-byte-aligned base and an odd leading stride are fine.
  Case c;
  c.Y = coda::matrix(fake(7, 2), bf16, c.M, c.N / 2, 133);
  expect_passes_validation(Op::kGemmSwiglu, bf16, [&] { return c.swiglu(); }, "swiglu");
}

void test_row_sumsq_checks() {
  const StatusCode bad = StatusCode::kInvalidArgument;
  { Case x; x.sumsq.dtype = bf16; EXPECT_STATUS(x.row_sumsq(), bad, "sumsq has dtype bf16, expected fp32"); }
  { Case x; x.sumsq.shape[0] = 199; EXPECT_STATUS(x.row_sumsq(), bad, "sumsq must have length M = 200, got 199"); }
  { Case x; x.sumsq.data = nullptr; EXPECT_STATUS(x.row_sumsq(), bad, "coda::gemm_row_sumsq: sumsq is null"); }
  { Case x; x.sumsq.data = fake(8, 2); EXPECT_STATUS(x.row_sumsq(), bad, "not 4-byte aligned"); }
  { Case x; x.sumsq.data = fake(3, 16); EXPECT_STATUS(x.row_sumsq(), bad, "overlaps"); }
  if (coda::is_built(Op::kGemmRowSumSq, bf16)) {
    const size_t need = coda::gemm_row_sumsq_workspace_size(bf16, 200, 264, 136);
    { Case x; x.ws = {nullptr, 0}; EXPECT_STATUS(x.row_sumsq(), StatusCode::kBadWorkspace, "workspace has 0 bytes", "needs"); }
    { Case x; x.ws.bytes = need - 4; EXPECT_STATUS(x.row_sumsq(), StatusCode::kBadWorkspace, "gemm_row_sumsq_workspace_size"); }
    { Case x; x.ws.data = fake(9, 16); EXPECT_STATUS(x.row_sumsq(), StatusCode::kBadWorkspace, "256-byte aligned"); }
    { Case x; x.ws = {fake(3, 256), need}; EXPECT_STATUS(x.row_sumsq(), bad, "overlaps the workspace"); }
  } else {
    Case x;
    x.ws = {nullptr, 0};
    EXPECT_STATUS(x.row_sumsq(), StatusCode::kNotBuilt, "gemm_row_sumsq_bf16");
  }
  Case c;
  expect_passes_validation(Op::kGemmRowSumSq, bf16, [&] { return c.row_sumsq(); }, "row_sumsq");
  Case h(fp16);
  expect_passes_validation(Op::kGemmRowSumSq, fp16, [&] { return h.row_sumsq(); }, "row_sumsq fp16");
}

}  // namespace

extern "C" int coda_c_header_checks(void);  // test_c_api.c: the C API, from C

int main() {
  std::printf("SM90 device: %s\n", g_have_sm90 ? "yes (valid-argument calls are left to the GPU tests)" : "no");
  test_names_and_types();
  test_kernel_table();
  test_workspace_queries();
  test_operand_checks();
  test_bias_act_checks();
  test_residual_checks();
  test_swiglu_checks();
  test_row_sumsq_checks();
  const int c_failures = coda_c_header_checks();
  ::check::expect(c_failures == 0, "C API checks (test_c_api.c)", __FILE__, __LINE__);
  return ::check::finish("test_host_validation");
}
