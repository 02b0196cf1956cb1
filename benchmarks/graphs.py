"""The epilogue graphs the speed goals are stated for, each with its goal (time / bare cuBLAS GEMM).

Shared by bench_graphs.py and `python -m coda_ext prebuild benchmarks/graphs.py`.
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


def swiglu_y():
    """y = silu(acc[:, 0::2]) * acc[:, 1::2] at half width, and no M x N output (an inference FFN)."""
    g = ce.Graph()
    g.store("y", ce.swiglu_pairs(g.accumulator()))
    return g


def rstd_swiglu():
    """Z = acc * rstd[m] stored, y = SwiGLU of Z at half width: the FFN's RMSNorm folded into gate/up."""
    g = ce.Graph()
    z = g.accumulator() * g.col_vector("rstd", dtype="float32")
    g.output(z)
    g.store("y", ce.swiglu_pairs(z))
    return g


#: name -> (builder, goal: the largest time / bare cuBLAS GEMM time a row may take at a training
#: shape). The full set of speed goals (medians, small M, torch.compile, the peer) is goals.py's.
CASES = {
    "identity": (identity, 1.03),
    "bias_silu": (bias_silu, 1.06),
    "bias_gelu": (bias_gelu, 1.06),
    "residual": (residual, 1.06),
    "rstd_scale": (rstd_scale, 1.06),
    "swiglu": (swiglu, 0.99),
    "swiglu_y": (swiglu_y, 0.96),
    "rstd_swiglu": (rstd_swiglu, 0.99),
    "store_rowsum": (store_rowsum, 1.06),
    "design": (design, 1.06),
}
