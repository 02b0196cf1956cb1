"""The bounds-test analysis of reductions (codegen/oob.py): a sum reduction skips its
per-element bounds test only when its input is provably 0 beyond the problem."""
from __future__ import annotations

import coda_ext as ce
from coda_ext.codegen.oob import reduction_needs_bounds_check
from coda_ext.passes import lower


def _needs(build, dtype="bfloat16"):
    g = ce.Graph()
    build(g, g.accumulator())
    lowered = lower(g.build(), dtype)
    return {lowered[i].name: reduction_needs_bounds_check(lowered, i)
            for i in range(len(lowered)) if lowered[i].kind in ("row_reduce", "col_reduce")}


def test_zero_preserving_graphs_skip_the_check():
    def build(g, acc):
        d = ce.silu(acc) * g.tile("aux") + g.row_vector("bias")
        g.output(d)
        g.row_reduce("rowsum", d, "sum")
        g.col_reduce("csq", acc * 2.0, "sumsq")
    assert _needs(build) == {"rowsum": False, "csq": False}


def test_a_gelu_derivative_times_a_zero_value_skips_the_check():
    """dy · gelu_grad(x) (a GELU backward's bias gradient, summed over the rows) is 0 beyond M: dy is, and the
    derivative is bounded (0.5 at x = 0, the tile's padding). Not so where the bounded function's input may
    be infinite there (an rsqrt of the padding), or where it is added rather than multiplied."""
    def build(g, acc):
        x = g.tile("x")
        g.output(acc)
        g.col_reduce("erf", acc * ce.gelu_grad(x), "sum")
        g.col_reduce("tanh", acc * ce.gelu_grad(x, approximate="tanh"), "sum")
        g.col_reduce("sig", ce.sigmoid(x * 2.0) * acc, "sum")
        g.col_reduce("inf", acc * ce.sigmoid(ce.rsqrt(x)), "sum")   # rsqrt(0) = inf outside: not proven
        g.col_reduce("add", acc + ce.gelu_grad(x), "sum")           # 0.5 outside
    assert _needs(build) == {"erf": False, "tanh": False, "sig": False, "inf": True, "add": True}


def test_values_nonzero_outside_keep_the_check():
    def build(g, acc):
        g.output(acc)
        g.row_reduce("e", ce.exp(acc), "sum")                   # exp(0) = 1
        g.row_reduce("m", acc, "max")                           # identity is -inf, 0 would win
        g.row_reduce("c", acc + 1.0, "sum")                     # constant offset
        g.row_reduce("s", acc * g.scalar("alpha"), "sum")       # a runtime scalar may be inf
        g.row_reduce("r", acc * ce.rsqrt(acc), "sum")           # 0 * inf = nan
        g.row_reduce("v", acc + g.col_vector("rstd"), "sum")    # a column vector is real beyond N
        g.col_reduce("w", acc + g.row_vector("bias"), "sum")    # a row vector is real beyond M
        g.col_reduce("ok", acc + g.col_vector("rstd2"), "sum")  # ... but 0 beyond M
    assert _needs(build) == {"e": True, "m": True, "c": True, "s": True, "r": True, "v": True, "w": True,
                             "ok": False}


def test_emitted_source_carries_the_choice():
    g = ce.Graph()
    acc = g.accumulator()
    g.output(acc)
    g.row_reduce("a", acc, "sum")
    g.row_reduce("b", ce.exp(acc), "sum")
    src = ce.emit_source(g, "bfloat16")
    assert src.count("RowReduce<Cfg, ReduceSum, /*CheckOOB=*/false>") == 1
    assert src.count("RowReduce<Cfg, ReduceSum>") == 1
