"""Graphs that, with the ready and example graphs, use every node kind: the GPU suite checks their
numerics against the reference interpreter (tests/gpu/cases.py)."""
from __future__ import annotations

from ..graph.builder import Graph
from ..graph.math import (
    cast,
    exp,
    fma,
    gelu,
    gelu_grad,
    log,
    maximum,
    minimum,
    neg,
    pair_gate,
    relu,
    rsqrt,
    sigmoid,
    silu,
    sqrt,
    square,
    swiglu_pairs,
    tanh,
)


def unary_a() -> Graph:
    """exp, log, sqrt, rsqrt, abs, neg, square, gelu (erf); a shared |acc| makes it a DAG:
    D = gelu(acc), u1 = exp(−|acc|/8) + log(acc² + 1), u2 = sqrt(|acc|) · rsqrt(|acc| + 1)."""
    g = Graph()
    acc = g.accumulator()
    a = abs(acc)
    g.output(gelu(acc))
    g.store("u1", exp(-a * 0.125) + log(square(acc) + 1.0))
    g.store("u2", sqrt(a) * rsqrt(a + 1.0))
    return g


def unary_b() -> Graph:
    """tanh, sigmoid, silu, relu, gelu (tanh), both GELU derivatives, neg: D = silu(acc),
    t = tanh(acc/4) − σ(acc), r = relu(acc) + gelu_tanh(acc) − acc, w = (1 + th) (1 − th²) with
    th = tanh(acc/8) (the forms the lowering computes from σ(acc/4): passes.tanh_sigmoid),
    d = gelu_grad(acc/4) + gelu_grad_tanh(acc/4)."""
    g = Graph()
    acc = g.accumulator()
    g.output(silu(acc))
    g.store("t", tanh(acc * 0.25) - sigmoid(acc))
    g.store("r", relu(acc) + gelu(acc, approximate="tanh") - acc)
    th = tanh(acc * 0.125)
    g.store("w", (1.0 + th) * (1.0 - th * th))
    g.store("d", gelu_grad(acc * 0.25) + gelu_grad(acc * 0.25, approximate="tanh"))
    return g


def binary() -> Graph:
    """add, sub, mul, div, max, min, fma, cast; runtime, pointer and constant scalars; row and column
    vectors (one fp32), a tile load: x = acc·alpha, D = max(x, rstd) − min(x·scale, gamma) / (|res| + 1),
    f = fma(acc, gamma, rstd), c = fp32(fp16(acc/100) · 3)."""
    g = Graph()
    acc = g.accumulator()
    alpha = g.scalar("alpha")
    scale = g.scalar("scale", pointer=True)
    rstd = g.col_vector("rstd", dtype="float32")
    gamma = g.row_vector("gamma")
    res = g.tile("res")
    x = acc * alpha
    g.output(maximum(x, rstd) - minimum(x * scale, gamma) / (abs(res) + 1.0))
    g.store("f", fma(acc, gamma, rstd))
    g.store("c", cast(acc * 0.01, "float16") * 3.0, dtype="float32")
    return g


def reductions() -> Graph:
    """Row and column reductions: D = acc; rmax = max_n acc, rsum_exp = Σ_n exp(acc/20); csum = Σ_m acc,
    csq = Σ_m acc², cmax = max_m −acc (side chains that D does not use)."""
    g = Graph()
    acc = g.accumulator()
    g.output(acc)
    g.row_reduce("rmax", acc, "max")
    g.row_reduce("rsum_exp", exp(acc * 0.05), "sum")
    g.col_reduce("csum", acc, "sum")
    g.col_reduce("csq", acc, "sumsq")
    g.col_reduce("cmax", neg(acc), "max")
    return g


def tested_reductions() -> Graph:
    """Reductions that keep their per-element bounds test (codegen/oob.py cannot show their inputs 0 beyond the
    problem), for the interior-tile test (tests/gpu/test_interior_tiles_gpu.py, csrc/epilogues/interior_tiles.hpp):
    y = acc + t − μ (μ per row: real data beside the padded columns), D = y; rowsum = Σ_n y;
    colsum = Σ_m (acc + bias) (bias per column: real beside the padded rows); lse = log Σ_n exp(y − 8|t|) (the
    real elements lowered, the padding's −μ not: a padded element folded in shows)."""
    g = Graph()
    acc = g.accumulator()
    mu = g.col_vector("mu")
    t = g.tile("t")
    y = acc + t - mu
    g.output(y)
    g.row_reduce("rowsum", y, "sum")
    g.col_reduce("colsum", acc + g.row_vector("bias"), "sum")
    g.row_reduce("lse", y - 8.0 * abs(t), "logsumexp")
    return g


def pair_gates() -> Graph:
    """Gated activations on interleaved gate/up columns, half-width stores (16-bit, and fp32: the node's
    transpose moves 32-bit elements one shuffle each): D = acc, y = silu(acc[:, 0::2]) · acc[:, 1::2],
    yg = gelu_tanh(acc[:, 0::2] / 2) · acc[:, 1::2] / 2 (fp32)."""
    g = Graph()
    z = g.accumulator()
    g.output(z)
    g.store("y", swiglu_pairs(z))
    g.store("yg", pair_gate(z * 0.5, "gelu_tanh"), dtype="float32")
    return g
