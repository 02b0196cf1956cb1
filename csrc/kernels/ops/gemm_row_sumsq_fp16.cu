// libcoda kernel: gemm_row_sumsq in fp16. One CUTLASS instantiation per translation unit, so the
// kernels of libcoda compile in parallel. The epilogue is coda::ops::GemmRowSumSq (fusions.cuh).
#include "kernels/ops/fusions.cuh"

namespace {
using Op = coda::ops::GemmRowSumSq<cutlass::half_t>;
}  // namespace

CODA_DEFINE_NAMED_ENTRY_POINTS(coda_gemm_row_sumsq_fp16, Op::Kernel, Op::fusion_arguments, Op::kReductions)
