// csrc/lib/block_ops.cpp — libcoda's Transformer-block ops (coda/ops.hpp): linear_residual_norm,
// rms_linear, linear_swiglu, qkv_rope, lm_head_cross_entropy. Their kernels are emitted from the
// graphs of coda_ext.ops (python -m coda_ext libgen); every CodaLaunch slot index comes from
// kernels/ops/contract_generated.h, written by the same generator from the same graphs.
//
// Around the GEMM an op may run small kernels of its own (kernels/ops/finish.cu): a vector of
// ones in place of an absent rstd, the QK-norm weight vectors, rstd from the sum of squares, the
// cross-entropy loss. Their buffers are the first host_workspace_bytes(op, M, N) bytes of the
// caller's workspace; the GEMM kernel gets the rest.
#include "coda/coda.hpp"
#include "detail.hpp"
#include "kernels/ops/contract_generated.h"
#include "kernels/ops/finish.h"

namespace coda {

namespace gen = ops::gen;
using detail::Access;
using detail::Validator;

static_assert(int(Reduction::kNone) == CODA_FINISH_REDUCTION_NONE && int(Reduction::kSum) == CODA_FINISH_REDUCTION_SUM &&
                  int(Reduction::kMean) == CODA_FINISH_REDUCTION_MEAN,
              "coda::Reduction and kernels/ops/finish.h disagree");
static_assert(int(DType::kBFloat16) == CODA_FINISH_BF16 && int(DType::kFloat16) == CODA_FINISH_FP16 &&
                  int(DType::kFloat32) == CODA_FINISH_FP32,
              "coda::DType and kernels/ops/finish.h disagree");
// The qkv kernels with QK-norm read their slots in one order (the graphs differ only in head_dim).
static_assert(gen::qkv_rope_qk_norm64::slot::kEps == gen::qkv_rope_qk_norm128::slot::kEps &&
                  gen::qkv_rope_qk_norm64::slot::kFreqHi == gen::qkv_rope_qk_norm128::slot::kFreqHi &&
                  gen::qkv_rope_qk_norm64::slot::kFreqLo == gen::qkv_rope_qk_norm128::slot::kFreqLo &&
                  gen::qkv_rope_qk_norm64::slot::kNormA == gen::qkv_rope_qk_norm128::slot::kNormA &&
                  gen::qkv_rope_qk_norm64::slot::kNormB == gen::qkv_rope_qk_norm128::slot::kNormB &&
                  gen::qkv_rope_qk_norm64::slot::kPositions == gen::qkv_rope_qk_norm128::slot::kPositions &&
                  gen::qkv_rope_qk_norm64::slot::kRstd == gen::qkv_rope_qk_norm128::slot::kRstd &&
                  gen::qkv_rope_qk_norm64::kNumSlots == gen::qkv_rope_qk_norm128::kNumSlots,
              "the two QK-norm kernels of qkv_rope read their slots in different orders");
static_assert(gen::linear_swiglu::slot::kRstd == gen::linear_swiglu_train::slot::kRstd &&
                  gen::linear_swiglu::slot::kY == gen::linear_swiglu_train::slot::kY &&
                  gen::linear_swiglu::kNumSlots == gen::linear_swiglu_train::kNumSlots && !gen::linear_swiglu::kHasD &&
                  gen::linear_swiglu_train::kHasD,
              "linear_swiglu's two kernels disagree on their slots");
static_assert(!gen::lm_head_cross_entropy::kHasD && gen::linear_residual_norm::kHasD && gen::qkv_rope::kHasD &&
                  gen::rms_linear::kHasD,
              "a generated kernel's main output changed; update block_ops.cpp");

namespace {

constexpr size_t kAlign = 256;
size_t aligned(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
size_t floats(int64_t n) { return aligned(size_t(n) * sizeof(float)); }

CodaSlot pointer_slot(const void* ptr, int64_t ld = 0) {
  CodaSlot s{};
  s.ptr = const_cast<void*>(ptr);
  s.ld = ld;
  return s;
}
CodaSlot pointer_slot(const TensorRef& t) { return pointer_slot(t.data, t.rank == 2 ? t.stride[0] : 0); }
CodaSlot value_slot(float value) {
  CodaSlot s{};
  s.value = value;
  return s;
}

bool present(const TensorRef& t) { return t.data != nullptr; }

// The small kernels, or kNotBuilt (a libcoda whose CMake compiled a block op's kernel always has them).
Status finish_kernels(const Validator& v, const detail::FinishKernels** out) {
  *out = detail::finish_kernels();
  if (*out == nullptr)
    return Status(StatusCode::kNotBuilt, detail::cat("coda::", v.op(), ": this libcoda was built without its small "
                                                     "kernels (kernels/ops/finish.cu); reconfigure and rebuild"));
  return Status();
}

Status launched(const Validator& v, const char* what, int cuda_error) {
  if (cuda_error == 0) return Status();
  const cudaError_t err = static_cast<cudaError_t>(cuda_error);
  return Status(StatusCode::kLaunchFailed,
                detail::cat("coda::", v.op(), ": ", what, " launch failed: ", cudaGetErrorName(err), " (",
                            cudaGetErrorString(err), ")"));
}

// An optional length-M fp32 rstd: validated when present.
Status optional_rstd(Validator& v, const TensorRef& rstd) {
  if (!present(rstd)) return Status();
  return v.vector("rstd", rstd, DType::kFloat32, v.M(), "M", Access::kVector, /*output=*/false);
}

}  // namespace

namespace detail {
size_t host_workspace_bytes(Op op, int64_t M, int64_t N) {
  switch (op) {
    case Op::kLinearSwiglu:
    case Op::kLinearSwigluTrain:
    case Op::kQkvRope:
      return floats(M);  // ones in place of an absent rstd
    case Op::kQkvRopeQkNorm64:
    case Op::kQkvRopeQkNorm128:
      return floats(M) + 2 * floats(N);  // ones; norm_a, norm_b
    case Op::kLmHeadCrossEntropy:
      return 2 * floats(M);  // ones; the target logits
    default:
      return 0;
  }
}
}  // namespace detail

Status linear_residual_norm(const TensorRef& A, const TensorRef& B, const TensorRef& residual,
                            const TensorRef& norm_weight, float eps, const TensorRef& D, const TensorRef& H,
                            const TensorRef& rstd, Workspace workspace, cudaStream_t stream, const Options& options) {
  namespace g = gen::linear_residual_norm;
  Validator v("linear_residual_norm");
  CODA_CHECK(v.operands(A, B));
  CODA_CHECK(v.matrix("residual", residual, v.dtype(), v.M(), v.N(), "M", "N", Access::kTma, /*output=*/false));
  CODA_CHECK(v.vector("norm_weight", norm_weight, v.dtype(), v.N(), "N", Access::kVector, /*output=*/false));
  CODA_CHECK(v.nonnegative("eps", eps));
  CODA_CHECK(v.matrix("D", D, v.dtype(), v.M(), v.N(), "M", "N", Access::kTma, /*output=*/true));
  CODA_CHECK(v.matrix("H", H, v.dtype(), v.M(), v.N(), "M", "N", Access::kTma, /*output=*/true));
  CODA_CHECK(v.vector("rstd", rstd, DType::kFloat32, v.M(), "M", Access::kNatural, /*output=*/true));
  CodaLaunch L = detail::make_launch(v, A, B, D);
  L.num_slots = g::kNumSlots;
  L.slots[g::slot::kNormWeight] = pointer_slot(norm_weight);
  L.slots[g::slot::kResidual] = pointer_slot(residual);
  L.slots[g::slot::kH] = pointer_slot(H);
  L.slots[g::slot::kSumsq] = pointer_slot(rstd);  // Σ D², turned into rstd in place below
  detail::KernelEntry kernel;
  char* host = nullptr;
  CODA_CHECK(detail::prepare(v, Op::kLinearResidualNorm, L, workspace, options, &kernel, &host));
  const detail::FinishKernels* finish = nullptr;
  CODA_CHECK(finish_kernels(v, &finish));
  CODA_CHECK(detail::run(v, kernel, L, stream));
  return launched(v, "the rstd kernel", finish->rstd(static_cast<float*>(rstd.data), v.M(), v.N(), eps, stream));
}

Status rms_linear(const TensorRef& A, const TensorRef& B, const TensorRef& rstd, Activation act, const TensorRef& D,
                  Workspace workspace, cudaStream_t stream, const Options& options) {
  namespace g = gen::rms_linear;
  Validator v("rms_linear");
  CODA_CHECK(v.operands(A, B));
  CODA_CHECK(v.vector("rstd", rstd, DType::kFloat32, v.M(), "M", Access::kVector, /*output=*/false));
  CODA_CHECK(v.activation(act));
  CODA_CHECK(v.matrix("D", D, v.dtype(), v.M(), v.N(), "M", "N", Access::kTma, /*output=*/true));
  CodaLaunch L = detail::make_launch(v, A, B, D);
  L.num_slots = g::kNumSlots;
  L.slots[g::slot::kRstd] = pointer_slot(rstd);
  L.slots[g::slot::kActivation] = value_slot(static_cast<float>(static_cast<int32_t>(act)));
  return detail::launch(v, Op::kRmsLinear, L, workspace, stream, options);
}

Status linear_swiglu(const TensorRef& A, const TensorRef& B, const TensorRef& rstd, const TensorRef& Z,
                     const TensorRef& Y, Workspace workspace, cudaStream_t stream, const Options& options) {
  namespace g = gen::linear_swiglu;  // the slots of both kernels (static_assert above)
  Validator v("linear_swiglu");
  const bool with_z = present(Z);
  CODA_CHECK(v.operands(A, B, /*n_aligned=*/with_z));
  if (v.N() % 2 != 0)
    return v.fail(detail::cat("N = ", v.N(), " is odd; B's rows are interleaved (gate, up) pairs, so N must be even "
                              "(coda_ext.ops.interleave_gate_up builds such a B)"));
  CODA_CHECK(optional_rstd(v, rstd));
  if (with_z) CODA_CHECK(v.matrix("Z", Z, v.dtype(), v.M(), v.N(), "M", "N", Access::kTma, /*output=*/true));
  CODA_CHECK(v.matrix("Y", Y, v.dtype(), v.M(), v.N() / 2, "M", "N/2", Access::kNatural, /*output=*/true));
  CodaLaunch L = detail::make_launch(v, A, B, Z);  // Z absent: D = nullptr, the kernel writes no D
  if (!with_z) L.ldd = v.N();
  L.num_slots = g::kNumSlots;
  L.slots[g::slot::kY] = pointer_slot(Y);
  const Op op = with_z ? Op::kLinearSwigluTrain : Op::kLinearSwiglu;
  detail::KernelEntry kernel;
  char* host = nullptr;
  CODA_CHECK(detail::prepare(v, op, L, workspace, options, &kernel, &host));
  if (present(rstd)) {
    L.slots[g::slot::kRstd] = pointer_slot(rstd);
  } else {
    const detail::FinishKernels* finish = nullptr;
    CODA_CHECK(finish_kernels(v, &finish));
    float* ones = reinterpret_cast<float*>(host);
    CODA_CHECK(launched(v, "the fill kernel", finish->fill(ones, v.M(), 1.0f, stream)));
    L.slots[g::slot::kRstd] = pointer_slot(ones);
  }
  return detail::run(v, kernel, L, stream);
}

Status qkv_rope(const TensorRef& A, const TensorRef& B, const TensorRef& positions, const TensorRef& freqs,
                int32_t n_heads, int32_t n_kv_heads, const TensorRef& rstd, const TensorRef& q_norm_weight,
                const TensorRef& k_norm_weight, float eps, const TensorRef& out, Workspace workspace,
                cudaStream_t stream, const Options& options) {
  Validator v("qkv_rope");
  CODA_CHECK(v.operands(A, B));
  if (n_heads < 1 || n_kv_heads < 1)
    return v.fail(detail::cat("n_heads = ", n_heads, " and n_kv_heads = ", n_kv_heads, " must both be at least 1"));
  const int64_t heads = int64_t(n_heads) + 2 * int64_t(n_kv_heads);
  if (v.N() % heads != 0)
    return v.fail(detail::cat("B has N = ", v.N(), " rows, not a multiple of n_heads + 2 n_kv_heads = ", heads,
                              " heads; B must be [W_q; W_k; W_v] with (n_heads + 2 n_kv_heads) * head_dim rows"));
  const int64_t head_dim = v.N() / heads;
  if (head_dim != 64 && head_dim != 128)
    return v.fail(detail::cat("head_dim = N / (n_heads + 2 n_kv_heads) = ", v.N(), " / ", heads, " = ", head_dim,
                              " is not supported; use 64 or 128"));
  CODA_CHECK(v.vector("positions", positions, DType::kFloat32, v.M(), "M", Access::kVector, /*output=*/false));
  CODA_CHECK(v.matrix("freqs", freqs, DType::kFloat32, 2, v.N(), "2", "N", Access::kVector, /*output=*/false));
  if ((freqs.stride[0] * 4) % 16 != 0)
    return v.fail(detail::cat("freqs's rows are ", freqs.stride[0] * 4, " bytes apart (leading stride ",
                              freqs.stride[0], "); the kernel reads each row with 16-byte vector loads: use a leading "
                              "stride that is a multiple of 4 (the table of coda::rope_frequencies is (2, N), "
                              "contiguous)"));
  CODA_CHECK(optional_rstd(v, rstd));
  if (present(q_norm_weight) != present(k_norm_weight))
    return v.fail(detail::cat("QK-norm needs both q_norm_weight and k_norm_weight (", present(q_norm_weight) ? "" : "no ",
                              "q_norm_weight, ", present(k_norm_weight) ? "" : "no ",
                              "k_norm_weight given); pass both, or {} for both"));
  const bool qk_norm = present(q_norm_weight);
  if (qk_norm) {
    for (auto [name, w] : {std::pair<const char*, const TensorRef*>{"q_norm_weight", &q_norm_weight},
                           {"k_norm_weight", &k_norm_weight}}) {
      if (w->dtype != DType::kFloat32 && w->dtype != v.dtype())
        return v.fail(detail::cat(name, " has dtype ", dtype_name(w->dtype), "; use fp32 or ", dtype_name(v.dtype()),
                                  " (the dtype of A)"));
      CODA_CHECK(v.vector(name, *w, w->dtype, head_dim, "head_dim", Access::kNatural, /*output=*/false));
    }
    if (k_norm_weight.dtype != q_norm_weight.dtype)
      return v.fail(detail::cat("q_norm_weight has dtype ", dtype_name(q_norm_weight.dtype), " but k_norm_weight has ",
                                dtype_name(k_norm_weight.dtype), "; give both the same dtype"));
    CODA_CHECK(v.nonnegative("eps", eps));
  }
  CODA_CHECK(v.matrix("out", out, v.dtype(), v.M(), v.N(), "M", "N", Access::kTma, /*output=*/true));

  CodaLaunch L = detail::make_launch(v, A, B, out);
  const Op op = !qk_norm ? Op::kQkvRope : head_dim == 64 ? Op::kQkvRopeQkNorm64 : Op::kQkvRopeQkNorm128;
  detail::KernelEntry kernel;
  char* host = nullptr;
  CODA_CHECK(detail::prepare(v, op, L, workspace, options, &kernel, &host));
  const detail::FinishKernels* finish = nullptr;
  CODA_CHECK(finish_kernels(v, &finish));
  const char* freq_lo = static_cast<const char*>(freqs.data) + freqs.stride[0] * int64_t(sizeof(float));
  float* ones = reinterpret_cast<float*>(host);
  const void* rstd_ptr = rstd.data;
  if (!present(rstd)) {
    CODA_CHECK(launched(v, "the fill kernel", finish->fill(ones, v.M(), 1.0f, stream)));
    rstd_ptr = ones;
  }
  if (!qk_norm) {
    namespace g = gen::qkv_rope;
    L.num_slots = g::kNumSlots;
    L.slots[g::slot::kFreqHi] = pointer_slot(freqs.data);
    L.slots[g::slot::kFreqLo] = pointer_slot(freq_lo);
    L.slots[g::slot::kPositions] = pointer_slot(positions);
    L.slots[g::slot::kRstd] = pointer_slot(rstd_ptr);
  } else {
    namespace g = gen::qkv_rope_qk_norm128;  // == qkv_rope_qk_norm64's (static_assert above)
    float* norm_a = reinterpret_cast<float*>(host + floats(v.M()));
    float* norm_b = reinterpret_cast<float*>(host + floats(v.M()) + floats(v.N()));
    CODA_CHECK(launched(v, "the QK-norm vector kernel",
                        finish->qk_norm_vectors(q_norm_weight.data, k_norm_weight.data, int32_t(q_norm_weight.dtype),
                                                head_dim, n_heads, n_kv_heads, norm_a, norm_b, stream)));
    L.num_slots = g::kNumSlots;
    L.slots[g::slot::kEps] = value_slot(eps);
    L.slots[g::slot::kFreqHi] = pointer_slot(freqs.data);
    L.slots[g::slot::kFreqLo] = pointer_slot(freq_lo);
    L.slots[g::slot::kNormA] = pointer_slot(norm_a);
    L.slots[g::slot::kNormB] = pointer_slot(norm_b);
    L.slots[g::slot::kPositions] = pointer_slot(positions);
    L.slots[g::slot::kRstd] = pointer_slot(rstd_ptr);
  }
  return detail::run(v, kernel, L, stream);
}

Status lm_head_cross_entropy(const TensorRef& A, const TensorRef& B, const TensorRef& target, const TensorRef& rstd,
                             int32_t ignore_index, Reduction reduction, const TensorRef& loss, const TensorRef& lse,
                             Workspace workspace, cudaStream_t stream, const Options& options) {
  namespace g = gen::lm_head_cross_entropy;
  Validator v("lm_head_cross_entropy");
  CODA_CHECK(v.operands(A, B, /*n_aligned=*/false));
  if (v.N() >= (int64_t(1) << 24))
    return v.fail(detail::cat("a vocabulary of N = ", v.N(), " classes is not supported: the epilogue compares "
                              "column indices in fp32, exact below 2^24"));
  CODA_CHECK(v.vector("target", target, DType::kInt32, v.M(), "M", Access::kVector, /*output=*/false));
  CODA_CHECK(optional_rstd(v, rstd));
  const int32_t r = static_cast<int32_t>(reduction);
  if (r < 0 || r >= kNumReductions)
    return v.fail(detail::cat("reduction ", r, " is not one of kNone (0), kSum (1), kMean (2)"));
  if (reduction == Reduction::kNone)
    CODA_CHECK(v.vector("loss", loss, DType::kFloat32, v.M(), "M (reduction kNone)", Access::kNatural, true));
  else
    CODA_CHECK(v.vector("loss", loss, DType::kFloat32, 1, "1 (reduction kSum or kMean)", Access::kNatural, true));
  CODA_CHECK(v.vector("lse", lse, DType::kFloat32, v.M(), "M", Access::kNatural, /*output=*/true));

  CodaLaunch L = detail::make_launch(v, A, B, TensorRef{});  // no D: the logits never reach memory
  L.ldd = v.N();
  detail::KernelEntry kernel;
  char* host = nullptr;
  CODA_CHECK(detail::prepare(v, Op::kLmHeadCrossEntropy, L, workspace, options, &kernel, &host));
  const detail::FinishKernels* finish = nullptr;
  CODA_CHECK(finish_kernels(v, &finish));
  float* ones = reinterpret_cast<float*>(host);
  float* target_logit = reinterpret_cast<float*>(host + floats(v.M()));
  const void* rstd_ptr = rstd.data;
  if (!present(rstd)) {
    CODA_CHECK(launched(v, "the fill kernel", finish->fill(ones, v.M(), 1.0f, stream)));
    rstd_ptr = ones;
  }
  L.num_slots = g::kNumSlots;
  L.slots[g::slot::kRstd] = pointer_slot(rstd_ptr);
  L.slots[g::slot::kTarget] = pointer_slot(target);
  L.slots[g::slot::kLse] = pointer_slot(lse);
  L.slots[g::slot::kTargetLogit] = pointer_slot(target_logit);
  CODA_CHECK(detail::run(v, kernel, L, stream));
  return launched(v, "the loss kernel",
                  finish->cross_entropy(static_cast<const float*>(lse.data), target_logit,
                                        static_cast<const int32_t*>(target.data), v.M(), v.N(), ignore_index, r,
                                        static_cast<float*>(loss.data), stream));
}

}  // namespace coda
