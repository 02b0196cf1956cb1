// libcoda kernel: gemm_swiglu in bf16. One CUTLASS instantiation per translation unit, so the
// kernels of libcoda compile in parallel. The epilogue is coda::ops::GemmSwiglu (fusions.cuh).
#include "kernels/ops/fusions.cuh"

namespace {
using Op = coda::ops::GemmSwiglu<cutlass::bfloat16_t>;
}  // namespace

CODA_DEFINE_NAMED_ENTRY_POINTS(coda_gemm_swiglu_bf16, Op::Kernel, Op::fusion_arguments, Op::kReductions)
