"""The epilogue graphs the speed goals are stated for (from coda_ext.graphs), each with its goal
(time / bare cuBLAS GEMM).

Shared by bench_graphs.py and `python -m coda_ext prebuild benchmarks/graphs.py`.
"""
from __future__ import annotations

import functools

from coda_ext.graphs import (
    bias_gelu,
    bias_silu,
    design,
    identity,
    linear,
    linear_swiglu,
    rstd_scale,
    rstd_swiglu,
    store_rowsum,
    swiglu,
)

#: Two families are ready ops' graphs: D = acc + residual (a tile load) is linear_residual's, and
#: y = SwiGLU(acc) at half width without D is linear_swiglu's (unscaled, no pre-activation).
residual = functools.partial(linear, True)
swiglu_y = functools.partial(linear_swiglu, False, False)


#: name -> (builder, goal: time / bare cuBLAS GEMM time at the training shapes: the median's bound for
#: the plain GEMM (M >= 4096) and SwiGLU (with z, y only; the ready SwiGLU ops share them), every
#: row's for the other families). How each is checked, and the other goals, is goals.py's.
CASES = {
    "identity": (identity, 0.98),
    "bias_silu": (bias_silu, 1.06),
    "bias_gelu": (bias_gelu, 1.06),
    "residual": (residual, 1.06),
    "rstd_scale": (rstd_scale, 1.06),
    "swiglu": (swiglu, 0.97),
    "swiglu_y": (swiglu_y, 0.95),
    "rstd_swiglu": (rstd_swiglu, 0.97),
    "store_rowsum": (store_rowsum, 1.06),
    "design": (design, 1.06),
}
