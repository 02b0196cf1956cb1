"""Epilogue graphs of the examples, the speed and IO benchmarks and the GPU suite: the README and
demo example, the benchmark families, the ablation's one-feature-at-a-time graphs and a fuzz sample kept as a
regression graph (crowded_smem)."""
from __future__ import annotations

from ..graph.builder import Graph
from ..graph.math import (
    add,
    cast,
    eq,
    fma,
    gelu,
    gelu_grad,
    le,
    pair_gate,
    relu,
    segment_reduce,
    silu,
    sin_turns,
    sqrt,
    swiglu_pairs,
    tanh,
)
from .backward import linear


def identity() -> Graph:
    """D = acc: a plain GEMM through coda_ext (the bare-GEMM baseline); linear(False)."""
    return linear(False)


def example() -> Graph:
    """The README and demo example: pre = acc + bias (store), D = silu(acc + bias) ⊙ residual,
    sqsum = Σ_n D² (row reduction)."""
    g = Graph()
    acc = g.accumulator()
    bias = g.row_vector("bias")          # (N,) broadcast over rows
    res = g.tile("residual")             # (M, N)
    y = silu(acc + bias) * res
    g.store("pre", acc + bias)           # an extra output of an intermediate
    g.output(y)                          # the main output D
    g.row_reduce("sqsum", y * y, "sum")  # a per-row statistic, length M
    return g


def design() -> Graph:
    """D = silu(acc) ⊙ aux + bias[n];  rowsum[m] = Σ_n D."""
    g = Graph()
    acc = g.accumulator()
    d = silu(acc) * g.tile("aux") + g.row_vector("bias")
    g.output(d)
    g.row_reduce("rowsum", d, "sum")
    return g


def bias_silu() -> Graph:
    """D = silu(acc + bias[n])."""
    g = Graph()
    g.output(silu(g.accumulator() + g.row_vector("bias")))
    return g


def bias_gelu() -> Graph:
    """D = gelu_tanh(acc + bias[n])."""
    g = Graph()
    g.output(gelu(g.accumulator() + g.row_vector("bias"), approximate="tanh"))
    return g


def bias_gelu_stores() -> Graph:
    """An MLP up projection's GELU with its input kept: D = pre = acc + bias[n]; act = gelu_tanh(pre) (bf16)
    and act_erf = gelu(pre) (fp32), two TMA stores (the overlap schedule's GPU test)."""
    g = Graph()
    pre = g.accumulator() + g.row_vector("bias")
    g.output(pre)
    g.store("act", gelu(pre, approximate="tanh"))
    g.store("act_erf", gelu(pre), dtype="float32")
    return g


def gelu_backward_dbias() -> Graph:
    """GELU's backward at the dX GEMM (GPT-2's MLP): D = dz = acc · gelu_tanh'(pre) with pre a tile load;
    dbias[n] = Σ_m dz (a column reduction)."""
    g = Graph()
    dz = g.accumulator() * gelu_grad(g.tile("pre"), approximate="tanh")
    g.output(dz)
    g.col_reduce("dbias", dz, "sum")
    return g


def rstd_scale() -> Graph:
    """D = acc · rstd[m] · gamma[n]: an RMSNorm folded into the GEMM that follows it."""
    g = Graph()
    g.output(g.accumulator() * g.col_vector("rstd", dtype="float32") * g.row_vector("gamma"))
    return g


def store_rowsum() -> Graph:
    """D = acc + bias[n], stored; rowsum[m] = Σ_n D; colsq[n] = Σ_m D²."""
    g = Graph()
    d = g.accumulator() + g.row_vector("bias")
    g.output(d)
    g.row_reduce("rowsum", d, "sum")
    g.col_reduce("colsq", d, "sumsq")
    return g


def swiglu() -> Graph:
    """SwiGLU on interleaved gate/up columns: D = acc and y = silu(acc[:, 0::2]) · acc[:, 1::2] at half
    width."""
    g = Graph()
    z = g.accumulator()
    g.output(z)
    g.store("y", swiglu_pairs(z))
    return g


def rstd_swiglu() -> Graph:
    """D = z = acc · rstd[m], y = SwiGLU of z at half width: the FFN's RMSNorm folded into gate/up."""
    g = Graph()
    z = g.accumulator() * g.col_vector("rstd", dtype="float32")
    g.output(z)
    g.store("y", swiglu_pairs(z))
    return g


# --- the ablation: one epilogue feature at a time (benchmarks/ablate_epilogue.py) -----------------

def acc_bias() -> Graph:
    """D = acc + bias[n] (a row vector)."""
    g = Graph()
    g.output(g.accumulator() + g.row_vector("bias"))
    return g


def acc_aux() -> Graph:
    """D = acc ⊙ aux (a tile load)."""
    g = Graph()
    g.output(g.accumulator() * g.tile("aux"))
    return g


def silu_acc() -> Graph:
    """D = silu(acc)."""
    g = Graph()
    g.output(silu(g.accumulator()))
    return g


def acc_rowsum() -> Graph:
    """D = acc; rowsum[m] = Σ_n acc (a row reduction)."""
    g = Graph()
    acc = g.accumulator()
    g.output(acc)
    g.row_reduce("rowsum", acc, "sum")
    return g


def silu_aux_bias() -> Graph:
    """D = silu(acc) ⊙ aux + bias[n] (design() without its reduction)."""
    g = Graph()
    g.output(silu(g.accumulator()) * g.tile("aux") + g.row_vector("bias"))
    return g


def crowded_smem() -> Graph:
    """A fuzz sample (float16) whose tile loads, stores and vectors fill shared memory beside a gated (pair) store:
    in 64 x 64 subtiles with mn operands it needed 170 KB with the gated store staged for TMA, 162 KB without
    (constraints.fit_gated_store then writes it from registers)."""
    g = Graph()
    acc, s1 = g.accumulator(), g.scalar("s1")
    r2, c3, c4 = g.row_vector("r2", "float16"), g.col_vector("c3", "bfloat16"), g.col_vector("c4", "int32")
    t5, (even, odd) = g.tile("t5", "float32"), g.pair_tile("pt6", "float16")
    v12 = cast(gelu_grad(relu(tanh(sqrt(abs(acc))))), "float16")
    v15 = add(acc, sin_turns(v12) + s1)
    v20 = segment_reduce(fma(le(eq(acc / r2, c3), c4), t5, even), 64, "sum")
    g.store("st7", pair_gate(v20, "silu"))
    v24 = add(v15, add(v20, odd))
    g.store("st8", v24, dtype="float16")
    g.row_reduce("rr9", v24, "sum")
    g.row_reduce("rr10", v24, "logsumexp")
    g.col_reduce("cr11", v24, "sumsq")
    return g
