"""The graphs the GPU suite compiles: every node kind appears in at least one of them.

Shared by tests/gpu (numerics) and `python -m coda_ext prebuild tests/gpu/cases.py` (builds
them all in parallel ahead of the tests). Each case: a builder function and its dtypes.
Inputs are described so the tests can make fresh random tensors for any (M, N).
"""
from __future__ import annotations

import coda_ext as ce


def design():
    """DESIGN.md constraint 4: D = silu(acc) * aux + bias[n];  rowsum[m] = sum_n D."""
    g = ce.Graph()
    acc = g.accumulator()
    d = ce.silu(acc) * g.tile("aux") + g.row_vector("bias")
    g.output(d)
    g.row_reduce("rowsum", d, "sum")
    return g


def example():
    """The README example: bias, SiLU, residual, an aux store and a sum-of-squares reduction."""
    g = ce.Graph()
    acc = g.accumulator()
    bias = g.row_vector("bias")
    res = g.tile("residual")
    y = ce.silu(acc + bias) * res
    g.store("pre", acc + bias)
    g.output(y)
    g.row_reduce("sqsum", y * y, "sum")
    return g


def unary_a():
    """exp, log, sqrt, rsqrt, abs, neg, square, gelu (erf); a shared |acc| makes it a DAG."""
    g = ce.Graph()
    acc = g.accumulator()
    a = abs(acc)
    g.output(ce.gelu(acc))
    g.store("u1", ce.exp(-a * 0.125) + ce.log(ce.square(acc) + 1.0))
    g.store("u2", ce.sqrt(a) * ce.rsqrt(a + 1.0))
    return g


def unary_b():
    """tanh, sigmoid, silu, relu, gelu (tanh), neg."""
    g = ce.Graph()
    acc = g.accumulator()
    g.output(ce.silu(acc))
    g.store("t", ce.tanh(acc * 0.25) - ce.sigmoid(acc))
    g.store("r", ce.relu(acc) + ce.gelu(acc, approximate="tanh") - acc)
    return g


def binary():
    """add, sub, mul, div, max, min, fma, cast; runtime, pointer and constant scalars;
    row and column vectors (one fp32), a tile load."""
    g = ce.Graph()
    acc = g.accumulator()
    alpha = g.scalar("alpha")
    scale = g.scalar("scale", pointer=True)
    rstd = g.col_vector("rstd", dtype="float32")
    gamma = g.row_vector("gamma")
    res = g.tile("res")
    x = acc * alpha
    g.output(ce.maximum(x, rstd) - ce.minimum(x * scale, gamma) / (abs(res) + 1.0))
    g.store("f", ce.fma(acc, gamma, rstd))
    g.store("c", ce.cast(acc * 0.01, "float16") * 3.0, dtype="float32")
    return g


def reductions():
    """Row and column reductions: sum, max, sum of squares, side chains that D does not use."""
    g = ce.Graph()
    acc = g.accumulator()
    g.output(acc)
    g.row_reduce("rmax", acc, "max")
    g.row_reduce("rsum_exp", ce.exp(acc * 0.05), "sum")
    g.col_reduce("csum", acc, "sum")
    g.col_reduce("csq", acc, "sumsq")
    g.col_reduce("cmax", ce.neg(acc), "max")
    return g


def swiglu_pairs():
    """SwiGLU on interleaved gate/up columns: Z = acc and y = silu(Z[:, 0::2]) * Z[:, 1::2] at half width."""
    g = ce.Graph()
    z = g.accumulator()
    g.output(z)
    g.store("y", ce.swiglu_pairs(z))
    return g


def swiglu():
    """The project node: gated activation on interleaved gate/up columns, half-width stores (16-bit,
    and fp32: the node's transpose moves 32-bit elements one shuffle each)."""
    g = ce.Graph()
    z = g.accumulator()
    g.output(z)
    g.store("y", ce.swiglu_pairs(z))
    g.store("yg", ce.pair_gate(z * 0.5, "gelu_tanh"), dtype="float32")
    return g


def identity():
    """A plain GEMM through coda_ext."""
    g = ce.Graph()
    g.output(g.accumulator())
    return g


#: name -> (builder, dtypes the GPU suite runs it in)
CASES = {
    "design": (design, ("bfloat16", "float16")),
    "example": (example, ("bfloat16", "float16")),
    "unary_a": (unary_a, ("bfloat16",)),
    "unary_b": (unary_b, ("float16",)),
    "binary": (binary, ("bfloat16", "float16")),
    "reductions": (reductions, ("bfloat16",)),
    "swiglu": (swiglu, ("bfloat16", "float16")),
    "identity": (identity, ("bfloat16",)),
}


def config_cases():
    """(case, dtype, config) run at configs other than the default: every config the "auto"
    heuristic picks, with a tile load and a reduction, and stream-K with those, the pair node
    and an aux store."""
    from coda_ext import tuning

    return ([("design", "bfloat16", c) for c in tuning.HEURISTIC_CONFIGS]
            + [("reductions", "bfloat16", tuning.COOP_SMALL), ("reductions", "bfloat16", tuning.LARGE),
               ("design", "bfloat16", tuning.STREAMK), ("swiglu", "float16", tuning.STREAMK),
               ("swiglu", "bfloat16", tuning.WIDE),
               ("example", "bfloat16", tuning.STREAMK)])


def build_items():
    """(graph, dtype, config) for coda_ext.prebuild."""
    return ([(fn(), dtype, None) for fn, dtypes in CASES.values() for dtype in dtypes]
            + [(CASES[name][0](), dtype, cfg) for name, dtype, cfg in config_cases()])
