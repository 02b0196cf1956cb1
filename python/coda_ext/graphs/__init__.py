"""The library of ready epilogue graphs: one function per graph, each building it with the public
builder (coda_ext.graph) and saying its math. Every other part of the project takes its graphs from
here — the ready ops (coda_ext.ops) and libcoda's generated kernels, the block analysis, the demo,
the tests and the benchmarks — so the graph an op runs, the kernel libcoda ships and the graph the
IO model describes are one graph.

    forward     the forward ops: linear_residual_norm, rms_linear, linear_swiglu, qkv_rope,
                lm_head_cross_entropy (and its training form, lm_head_cross_entropy_train)
    backward    the backward GEMMs: linear (linear_residual, linear_dx, weight_grad),
                rms_norm_backward_linear, swiglu_backward_linear, lm_head_cross_entropy_backward,
                weight_grad_split (the training LM head's weight gradient, accumulated in place in 3 bytes an
                element), weight_grad_f32 (the same in an fp32 accumulator)
    epilogues   the README/demo example, the benchmark families and the ablation's graphs
    coverage    the GPU suite's graphs that, with the others, use every node kind, and tested_reductions (the
                interior-tile test's reductions that keep their bounds test)
"""
from .backward import (
    linear,
    lm_head_cross_entropy_backward,
    pair_tile_read,
    rms_norm_backward_linear,
    swiglu_backward_linear,
    swiglu_backward_math,
    weight_grad_f32,
    weight_grad_split,
)
from .coverage import binary, pair_gates, reductions, tested_reductions, unary_a, unary_b
from .epilogues import (
    acc_aux,
    acc_bias,
    acc_rowsum,
    bias_gelu,
    bias_gelu_stores,
    bias_silu,
    crowded_smem,
    design,
    example,
    gelu_backward_dbias,
    identity,
    rstd_scale,
    rstd_swiglu,
    silu_acc,
    silu_aux_bias,
    store_rowsum,
    swiglu,
)
from .forward import (
    ACTIVATIONS,
    linear_residual_norm,
    linear_swiglu,
    lm_head_cross_entropy,
    lm_head_cross_entropy_train,
    qkv_rope,
    rms_linear,
)

__all__ = [
    "ACTIVATIONS", "acc_aux", "acc_bias", "acc_rowsum", "bias_gelu", "bias_gelu_stores", "bias_silu", "binary",
    "crowded_smem", "design", "example", "gelu_backward_dbias", "identity", "linear", "linear_residual_norm",
    "linear_swiglu",
    "lm_head_cross_entropy",
    "lm_head_cross_entropy_backward", "lm_head_cross_entropy_train", "pair_gates", "pair_tile_read", "qkv_rope",
    "reductions", "rms_linear",
    "rms_norm_backward_linear", "rstd_scale", "rstd_swiglu", "silu_acc", "silu_aux_bias", "store_rowsum", "swiglu",
    "swiglu_backward_linear", "swiglu_backward_math", "tested_reductions", "unary_a", "unary_b", "weight_grad_f32",
    "weight_grad_split",
]
