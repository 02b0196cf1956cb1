// csrc/lib/ops.cpp — libcoda's public ops (coda/ops.hpp): validate the operands of each op,
// fill its CodaLaunch slots as csrc/kernels/ops/contract.h lays them out, and launch.
#include "coda/coda.hpp"
#include "detail.hpp"
#include "kernels/ops/contract.h"
#include "kernels/ops/contract_generated.h"

namespace coda {

static_assert(int(Activation::kIdentity) == ops::act::kIdentity && int(Activation::kRelu) == ops::act::kRelu &&
                  int(Activation::kSilu) == ops::act::kSilu && int(Activation::kGeluTanh) == ops::act::kGeluTanh &&
                  int(Activation::kGelu) == ops::act::kGelu && kNumActivations == 5,
              "coda::Activation and the kernels' numbering (kernels/ops/contract.h) disagree");

using detail::Access;
using detail::Validator;

namespace {

CodaSlot pointer_slot(const TensorRef& t) {
  CodaSlot s{};
  s.ptr = t.data;
  s.ld = t.rank == 2 ? t.stride[0] : 0;
  return s;
}

}  // namespace

Status gemm(const TensorRef& A, const TensorRef& B, const TensorRef& D, Workspace workspace, cudaStream_t stream,
            const Options& options) {
  Validator v("gemm");
  CODA_CHECK(v.operands(A, B));
  CODA_CHECK(v.matrix("D", D, v.dtype(), v.M(), v.N(), "M", "N", Access::kTma, /*output=*/true));
  CodaLaunch L = detail::make_launch(v, A, B, D);
  return detail::launch(v, Op::kGemm, L, workspace, stream, options);
}

Status gemm_bias_act(const TensorRef& A, const TensorRef& B, const TensorRef& bias, Activation act,
                     const TensorRef& D, Workspace workspace, cudaStream_t stream, const Options& options) {
  Validator v("gemm_bias_act");
  CODA_CHECK(v.operands(A, B));
  CODA_CHECK(v.vector("bias", bias, v.dtype(), v.N(), "N", Access::kVector, /*output=*/false));
  CODA_CHECK(v.activation(act));
  CODA_CHECK(v.matrix("D", D, v.dtype(), v.M(), v.N(), "M", "N", Access::kTma, /*output=*/true));
  CodaLaunch L = detail::make_launch(v, A, B, D);
  L.num_slots = 2;
  L.slots[ops::slot::kBias] = pointer_slot(bias);
  L.slots[ops::slot::kActivation].value = static_cast<float>(static_cast<int32_t>(act));
  return detail::launch(v, Op::kGemmBiasAct, L, workspace, stream, options);
}

Status gemm_residual(const TensorRef& A, const TensorRef& B, const TensorRef& residual, const TensorRef& D,
                     Workspace workspace, cudaStream_t stream, const Options& options) {
  Validator v("gemm_residual");
  CODA_CHECK(v.operands(A, B));
  CODA_CHECK(v.matrix("residual", residual, v.dtype(), v.M(), v.N(), "M", "N", Access::kTma, /*output=*/false));
  CODA_CHECK(v.matrix("D", D, v.dtype(), v.M(), v.N(), "M", "N", Access::kTma, /*output=*/true));
  CodaLaunch L = detail::make_launch(v, A, B, D);
  L.num_slots = 1;
  L.slots[ops::slot::kResidual] = pointer_slot(residual);
  return detail::launch(v, Op::kGemmResidual, L, workspace, stream, options);
}

Status gemm_swiglu(const TensorRef& A, const TensorRef& B, const TensorRef& Z, const TensorRef& Y,
                   Workspace workspace, cudaStream_t stream, const Options& options) {
  Validator v("gemm_swiglu");
  CODA_CHECK(v.operands(A, B));
  CODA_CHECK(v.matrix("Z", Z, v.dtype(), v.M(), v.N(), "M", "N", Access::kTma, /*output=*/true));
  CODA_CHECK(v.matrix("Y", Y, v.dtype(), v.M(), v.N() / 2, "M", "N/2", Access::kNatural, /*output=*/true));
  CodaLaunch L = detail::make_launch(v, A, B, Z);
  L.num_slots = 1;
  L.slots[ops::slot::kGatedOut] = pointer_slot(Y);
  return detail::launch(v, Op::kGemmSwiglu, L, workspace, stream, options);
}

Status gemm_row_sumsq(const TensorRef& A, const TensorRef& B, const TensorRef& D, const TensorRef& sumsq,
                      Workspace workspace, cudaStream_t stream, const Options& options) {
  Validator v("gemm_row_sumsq");
  CODA_CHECK(v.operands(A, B));
  CODA_CHECK(v.matrix("D", D, v.dtype(), v.M(), v.N(), "M", "N", Access::kTma, /*output=*/true));
  CODA_CHECK(v.vector("sumsq", sumsq, DType::kFloat32, v.M(), "M", Access::kNatural, /*output=*/true));
  CodaLaunch L = detail::make_launch(v, A, B, D);
  L.num_slots = 1;
  L.slots[ops::slot::kRowSumSq] = pointer_slot(sumsq);
  return detail::launch(v, Op::kGemmRowSumSq, L, workspace, stream, options);
}

size_t workspace_size(const Problem& p) {
  if (p.M < 1 || p.N < 1 || p.K < 1 || p.M >= (int64_t(1) << 31) || p.N >= (int64_t(1) << 31) ||
      p.K >= (int64_t(1) << 31))
    return 0;
  const detail::KernelEntry kernel = detail::find_kernel(p.op, p.dtype);
  return kernel ? detail::host_workspace_bytes(p.op, p.M, p.N) + kernel.workspace_size(p.M, p.N, p.K) : 0;
}

bool is_built(Op op, DType dtype) { return static_cast<bool>(detail::find_kernel(op, dtype)); }

KernelConfig kernel_config() {
  return {ops::kTileM, ops::kTileN, ops::kTileK, ops::kClusterM, ops::kClusterN,
          ops::kCooperative ? "cooperative" : "pingpong"};
}

namespace {
Raster raster_of(int launch_order) {
  return launch_order == ops::gen::kRasterAlongM   ? Raster::kAlongM
         : launch_order == ops::gen::kRasterAlongN ? Raster::kAlongN
                                                   : Raster::kHeuristic;
}
}  // namespace

KernelConfig kernel_config(Op op) {
  switch (op) {
    case Op::kGemm:
    case Op::kGemmBiasAct:
    case Op::kGemmResidual:
    case Op::kGemmSwiglu:
    case Op::kGemmRowSumSq:
      return kernel_config();
#define CODA_OP_CONFIG(op, ns)                                                                             \
  case Op::op: {                                                                                           \
    namespace g = ops::gen::ns;                                                                            \
    return {g::kTileM,          g::kTileN,          g::kTileK,   g::kClusterM,        g::kClusterN, g::kSchedule, \
            g::kEpilogueTileM, g::kEpilogueTileN, g::kSwizzle, raster_of(g::kRaster)};                     \
  }
      CODA_GENERATED_KERNELS(CODA_OP_CONFIG)
#undef CODA_OP_CONFIG
  }
  return {0, 0, 0, 0, 0, "", 0, 0, 0, Raster::kHeuristic};
}

namespace detail {
LaunchDefaults launch_defaults(Op op) {
  switch (op) {
#define CODA_OP_DEFAULTS(op, ns) \
  case Op::op: return {ops::gen::ns::kSwizzle, ops::gen::ns::kRaster};
    CODA_GENERATED_KERNELS(CODA_OP_DEFAULTS)
#undef CODA_OP_DEFAULTS
    default: return {};  // the gemm_* ops: swizzle 1, CUTLASS's raster heuristic
  }
}
}  // namespace detail

Status check_device() { return detail::check_current_device("check_device"); }

}  // namespace coda
