// libcoda kernel: gemm_bias_act in bf16. One CUTLASS instantiation per translation unit, so the
// kernels of libcoda compile in parallel. The epilogue is coda::ops::GemmBiasAct (fusions.cuh).
#include "kernels/ops/fusions.cuh"

namespace {
using Op = coda::ops::GemmBiasAct<cutlass::bfloat16_t>;
}  // namespace

CODA_DEFINE_NAMED_ENTRY_POINTS(coda_gemm_bias_act_bf16, Op::Kernel, Op::fusion_arguments, Op::kReductions)
