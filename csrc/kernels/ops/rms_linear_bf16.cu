// libcoda kernel rms_linear_bf16: coda_ext.ops.rms_scale.graph(None) in bfloat16,
// act(rstd ⊙row A·Bᵀ), act chosen at run time (Llama 3 8B up projection).
// Config ping_128x128x64_c1x1_s4: coda_ext.tuning.heuristic at M = 16384, N = 14336, K = 4096.
// Written by `python -m coda_ext libgen csrc/kernels/ops`; do not edit (change the graph and regenerate).
// The epilogue is coda::ops::RmsLinear (fusions.cuh); the Cfg line is the emitted graph's.
#include "kernels/ops/fusions.cuh"

namespace {
using Cfg = coda::kernels::Config<cutlass::bfloat16_t, cutlass::bfloat16_t, 128, 128, 64, 1, 1, coda::kernels::Pingpong>;
using Op = coda::ops::RmsLinear<Cfg>;
}  // namespace

CODA_DEFINE_NAMED_ENTRY_POINTS(coda_rms_linear_bf16, Op::Kernel, Op::fusion_arguments, Op::kReductions)
