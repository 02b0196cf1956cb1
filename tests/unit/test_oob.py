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


def test_values_the_padding_determines_are_evaluated_there():
    """A factor that is not 0 beyond the problem but determined there (a function of zero leaves and constants,
    evaluated in fp32) is finite, so its product with a value that is 0 there is 0: the dSwiGLU's row sum
    g·dg + u·du, whose dg carries 1 + g(1 − σ(g)) (1 where g is 0), skips the test. Values that are infinite, or
    so large that the GPU's approximations could make them so, or that read beside the padding (the partner
    column of pair_swap) or a runtime value keep it."""
    def build(g, acc):
        x = g.tile("x")
        g.output(acc)
        sig = ce.sigmoid(x)
        g.row_reduce("swiglu", x * (acc * sig * (1.0 + x * (1.0 - sig))), "sum")
        g.row_reduce("shift", acc * (ce.exp(x) + 2.0), "sum")              # e^0 + 2 = 3
        g.row_reduce("inf", acc * (1.0 / x), "sum")                         # 1/0 = inf: 0 · inf = nan
        g.row_reduce("huge", acc * ce.exp(x + 50.0), "sum")                 # e^50 > 2^64: too close to overflow
        g.row_reduce("partner", acc * (ce.pair_swap(x) + 1.0), "sum")       # the partner column is real data
        g.row_reduce("runtime", acc * (x + g.scalar("alpha")), "sum")       # a runtime scalar may be inf
        g.col_reduce("rows", acc * (g.row_vector("b") + 1.0), "sum")        # a row vector is real beyond M
    assert _needs(build) == {"swiglu": False, "shift": False, "inf": True, "huge": True, "partner": True,
                             "runtime": True, "rows": True}


def test_values_the_gpu_may_flush_or_that_are_singular_at_0_are_not_evaluated():
    """The GPU's exp and reciprocal flush subnormals to 0: a tiny value counts as unknown (e^-100 is 3.8e-44 in fp32
    on the CPU, 0 on the GPU, and 0/0 there is NaN); div, log, rsqrt and sqrt are not evaluated (beside a 0 the GPU's
    approximate input may be 0 or below where fp32's is not)."""
    def build(g, acc):
        x = g.tile("x")
        g.output(acc)
        tiny = ce.exp(x - 100.0)
        g.row_reduce("tiny", acc * tiny, "sum")
        g.row_reduce("ratio", acc * (tiny / tiny), "sum")
        g.row_reduce("log", acc * ce.log(x + 1.0), "sum")
        g.row_reduce("small", acc * ce.exp(x - 40.0), "sum")   # e^-40 = 4e-18: normal, far from the flush
    assert _needs(build) == {"tiny": True, "ratio": True, "log": True, "small": False}


def test_the_padding_evaluation_visits_each_node_once():
    """Shared subexpressions whose value is unknown are not walked again (it was exponential in the depth)."""
    import time

    g = ce.Graph()
    acc = g.accumulator()
    y = g.col_vector("v") + acc     # unknown beyond N (a column vector's real values)
    for _ in range(40):
        y = ce.sigmoid(y) + ce.tanh(y)
    g.output(acc)
    g.row_reduce("deep", acc * ce.exp(y), "sum")
    lowered = lower(g.build(), "bfloat16")
    t0 = time.perf_counter()
    assert [reduction_needs_bounds_check(lowered, i) for i in range(len(lowered))
            if lowered[i].kind == "row_reduce"] == [True]
    assert time.perf_counter() - t0 < 5.0


def test_the_library_dswiglu_row_sum_runs_without_the_bounds_test():
    from coda_ext import graphs

    src = ce.emit_source(graphs.swiglu_backward_linear(), "bfloat16")
    assert src.count("RowReduce<Cfg, ReduceSum, /*CheckOOB=*/false>") == 1


def test_the_interior_tile_gpu_tests_graph_keeps_every_bounds_test():
    """tests/gpu/test_interior_tiles_gpu.py exercises the tiles that skip the test and those that keep it
    (csrc/epilogues/interior_tiles.hpp) only if every reduction of its graph keeps the test."""
    from coda_ext.graphs import tested_reductions as graph

    lowered = lower(graph().build(), "bfloat16")
    kinds = [lowered[i].kind for i in range(len(lowered)) if lowered[i].kind in ("row_reduce", "col_reduce")]
    assert sorted(kinds) == ["col_reduce", "row_reduce", "row_reduce"]
    assert all(reduction_needs_bounds_check(lowered, i) for i in range(len(lowered))
               if lowered[i].kind in ("row_reduce", "col_reduce"))
    src = ce.emit_source(graph(), "bfloat16")
    assert "RowReduce<Cfg, ReduceSum>" in src and "CheckOOB=*/false" not in src
