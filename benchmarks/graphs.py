"""The epilogue graphs the speed goals are stated for, each with its goal (time / bare cuBLAS GEMM).

Shared by bench_graphs.py and `python -m coda_ext.prebuild benchmarks/graphs.py`.
"""
from __future__ import annotations

import pathlib
import sys

import coda_ext as ce

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests" / "gpu"))
from cases import design, identity, swiglu_pairs as swiglu  # noqa: E402  (one home for the graphs the GPU suite also checks)


def bias_silu():
    """D = silu(acc + bias[n])."""
    g = ce.Graph()
    g.output(ce.silu(g.accumulator() + g.row_vector("bias")))
    return g


def bias_gelu():
    """D = gelu_tanh(acc + bias[n])."""
    g = ce.Graph()
    g.output(ce.gelu(g.accumulator() + g.row_vector("bias"), approximate="tanh"))
    return g


def residual():
    """D = acc + residual (a tile load)."""
    g = ce.Graph()
    g.output(g.accumulator() + g.tile("residual"))
    return g


def rstd_scale():
    """D = acc * rstd[m] * gamma[n]: an RMSNorm folded into the GEMM that follows it."""
    g = ce.Graph()
    g.output(g.accumulator() * g.col_vector("rstd", dtype="float32") * g.row_vector("gamma"))
    return g


def store_rowsum():
    """D = acc + bias[n], stored; rowsum[m] = sum_n D; colsq[n] = sum_m D^2."""
    g = ce.Graph()
    d = g.accumulator() + g.row_vector("bias")
    g.output(d)
    g.row_reduce("rowsum", d, "sum")
    g.col_reduce("colsq", d, "sumsq")
    return g


#: name -> (builder, goal as time / bare cuBLAS GEMM time)
CASES = {
    "identity": (identity, 1 / 0.98),   # >= 0.98x cuBLAS throughput
    "bias_silu": (bias_silu, 1.02),
    "bias_gelu": (bias_gelu, 1.02),
    "residual": (residual, 1.02),
    "rstd_scale": (rstd_scale, 1.02),
    "swiglu": (swiglu, 1.02),
    "store_rowsum": (store_rowsum, 1.04),
    "design": (design, 1.04),
}
