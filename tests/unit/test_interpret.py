"""The reference interpreter against hand-written PyTorch, node kind by node kind.

Fresh random inputs (fixed seed per test), M and N that are not multiples of a tile (37 x 72)
and M = 1; fp64 and fp32 compute. The interpreter and the hand-written reference do the same
math in the same dtype, so the tolerance is torch's default for that dtype (a few ulps).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import coda_ext as ce
from tests.helpers import rand

K = 24
SHAPES = [(37, 72), (1, 72)]
CDTYPES = [torch.float64, torch.float32]


def _operands(seed: int, M: int, N: int, cd: torch.dtype):
    gen = torch.Generator().manual_seed(seed)
    A = rand.randn(gen, M, K, dtype=torch.float64)
    W = rand.randn(gen, N, K, dtype=torch.float64, scale=K ** -0.5)
    return A, W, (A.to(cd) @ W.to(cd).t()), gen


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want)


shapes = pytest.mark.parametrize("M,N", SHAPES)
cdtypes = pytest.mark.parametrize("cd", CDTYPES, ids=["fp64", "fp32"])


@shapes
@cdtypes
def test_accumulator(M, N, cd):
    A, W, acc, _ = _operands(1, M, N, cd)
    g = ce.Graph()
    g.output(g.accumulator())
    out = ce.interpret(g, A, W, compute_dtype=cd)
    assert list(out) == ["out"]
    _close(out.out, acc)


@shapes
@cdtypes
def test_scalars_constant_value_pointer(M, N, cd):
    A, W, acc, gen = _operands(2, M, N, cd)
    g = ce.Graph()
    a = g.accumulator()
    g.output(a * g.scalar("alpha") + g.scalar(value=0.75) - g.scalar("shift", pointer=True) * 2)
    scale = torch.randn(1, generator=gen)
    out = ce.interpret(g, A, W, compute_dtype=cd, alpha=-1.5, shift=scale)
    _close(out.out, acc * -1.5 + 0.75 - scale.to(cd) * 2)


@shapes
@cdtypes
def test_row_col_vectors_and_tile(M, N, cd):
    A, W, acc, gen = _operands(3, M, N, cd)
    g = ce.Graph()
    a = g.accumulator()
    g.output(a * g.col_vector("rstd") + g.row_vector("bias") - g.tile("res"))
    rstd, bias, res = torch.randn(M, generator=gen), torch.randn(N, generator=gen), torch.randn(M, N, generator=gen)
    out = ce.interpret(g, A, W, compute_dtype=cd, rstd=rstd, bias=bias, res=res)
    _close(out.out, acc * rstd.to(cd)[:, None] + bias.to(cd)[None, :] - res.to(cd))


def _pos(x):  # a positive argument for log/sqrt/rsqrt
    return abs(x) + 0.5


UNARY = [
    ("neg", ce.neg, torch.neg, None),
    ("abs", ce.abs, torch.abs, None),
    ("exp", ce.exp, torch.exp, None),
    ("log", ce.log, torch.log, _pos),
    ("sqrt", ce.sqrt, torch.sqrt, _pos),
    ("rsqrt", ce.rsqrt, torch.rsqrt, _pos),
    ("square", ce.square, torch.square, None),
    ("tanh", ce.tanh, torch.tanh, None),
    ("sigmoid", ce.sigmoid, torch.sigmoid, None),
    ("silu", ce.silu, F.silu, None),
    ("relu", ce.relu, torch.relu, None),
    ("gelu_erf", ce.gelu, lambda x: F.gelu(x, approximate="none"), None),
    ("gelu_tanh", lambda v: ce.gelu(v, approximate="tanh"), lambda x: F.gelu(x, approximate="tanh"), None),
]


@pytest.mark.parametrize("kind,fn,ref,pre", UNARY, ids=[u[0] for u in UNARY])
@shapes
@cdtypes
def test_unary(kind, fn, ref, pre, M, N, cd):
    A, W, acc, _ = _operands(4, M, N, cd)
    g = ce.Graph()
    a = g.accumulator()
    arg = pre(a) if pre else a
    g.output(fn(arg))
    built = g.build()
    assert built[built[built.named("out")].inputs[0]].kind == kind
    x = (acc.abs() + 0.5) if pre else acc
    _close(ce.interpret(g, A, W, compute_dtype=cd).out, ref(x))


BINARY = [
    ("add", ce.add, torch.add),
    ("sub", ce.sub, torch.sub),
    ("mul", ce.mul, torch.mul),
    ("div", ce.div, torch.div),
    ("max", ce.maximum, torch.maximum),
    ("min", ce.minimum, torch.minimum),
]


@pytest.mark.parametrize("kind,fn,ref", BINARY, ids=[b[0] for b in BINARY])
@shapes
@cdtypes
def test_binary(kind, fn, ref, M, N, cd):
    A, W, acc, gen = _operands(5, M, N, cd)
    t = torch.randn(M, N, generator=gen)
    g = ce.Graph()
    g.output(fn(g.tile("t"), g.accumulator()))
    built = g.build()
    assert built[built[built.named("out")].inputs[0]].kind == kind
    _close(ce.interpret(g, A, W, compute_dtype=cd, t=t).out, ref(t.to(cd), acc))


@shapes
@cdtypes
def test_fma(M, N, cd):
    A, W, acc, gen = _operands(6, M, N, cd)
    r, t = torch.randn(N, generator=gen), torch.randn(M, N, generator=gen)
    g = ce.Graph()
    g.output(ce.fma(g.accumulator(), g.row_vector("r"), g.tile("t")))
    _close(ce.interpret(g, A, W, compute_dtype=cd, r=r, t=t).out, acc * r.to(cd) + t.to(cd))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@shapes
@cdtypes
def test_cast_rounds(dtype, M, N, cd):
    A, W, acc, _ = _operands(7, M, N, cd)
    g = ce.Graph()
    g.output(ce.cast(g.accumulator(), dtype) * 3.0)
    got = ce.interpret(g, A, W, compute_dtype=cd).out
    rounded = acc.to(dtype).to(cd)
    _close(got, rounded * 3.0)
    assert got.dtype == cd
    assert not torch.equal(rounded, acc)                    # rounding did happen
    assert torch.equal((got / 3.0).to(dtype).to(cd), got / 3.0)


def test_cast_to_fp32_rounds_fp64_compute():
    A, W, acc, _ = _operands(8, 37, 72, torch.float64)
    g = ce.Graph()
    g.output(ce.cast(g.accumulator(), torch.float32))
    got = ce.interpret(g, A, W, compute_dtype=torch.float64).out
    assert torch.equal(got, acc.float().double())
    assert not torch.equal(got, acc)


ACTS = {
    "silu": F.silu, "sigmoid": torch.sigmoid, "relu": torch.relu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "gelu_erf": lambda x: F.gelu(x, approximate="none"),
}


@pytest.mark.parametrize("act", list(ACTS))
@shapes
@cdtypes
def test_pair_gate(act, M, N, cd):
    A, W, acc, _ = _operands(9, M, N, cd)
    g = ce.Graph()
    z = g.accumulator()
    g.output(z)
    g.store("y", ce.pair_gate(z * 0.5, act))
    out = ce.interpret(g, A, W, compute_dtype=cd)
    x = acc * 0.5
    assert out.y.shape == (M, N // 2)
    _close(out.y, ACTS[act](x[:, 0::2]) * x[:, 1::2])
    _close(out.out, acc)


@cdtypes
def test_swiglu_pairs_is_silu_pair_gate(cd):
    A, W, acc, _ = _operands(10, 37, 72, cd)
    g = ce.Graph()
    z = g.accumulator()
    g.output(z)
    g.store("y", ce.swiglu_pairs(z))
    _close(ce.interpret(g, A, W, compute_dtype=cd).y, F.silu(acc[:, 0::2]) * acc[:, 1::2])


def test_pair_gate_of_broadcast_value():
    A, W, _acc, gen = _operands(11, 37, 72, torch.float64)
    b = torch.randn(72, generator=gen, dtype=torch.float64)
    g = ce.Graph()
    g.output(g.accumulator())
    g.store("y", ce.pair_gate(g.row_vector("b") * 1.0, "relu"))
    y = ce.interpret(g, A, W, compute_dtype=torch.float64, b=b).y
    assert y.shape == (37, 36)
    _close(y, (torch.relu(b[0::2]) * b[1::2]).expand(37, 36))


@shapes
@cdtypes
def test_stores_full_and_broadcast(M, N, cd):
    A, W, acc, gen = _operands(12, M, N, cd)
    c, r = torch.randn(M, generator=gen), torch.randn(N, generator=gen)
    g = ce.Graph()
    a = g.accumulator()
    g.output(ce.tanh(a))
    g.store("raw", a, dtype="float32")
    g.store("colx", g.col_vector("c") * 2.0)       # broadcast values are stored full size
    g.store("rowx", g.row_vector("r") + 1.0)
    out = ce.interpret(g, A, W, compute_dtype=cd, c=c, r=r)
    assert sorted(out) == ["colx", "out", "raw", "rowx"]
    _close(out.raw, acc)
    _close(out.colx, (c.to(cd) * 2.0)[:, None].expand(M, N))
    _close(out.rowx, (r.to(cd) + 1.0)[None, :].expand(M, N))
    _close(out.out, torch.tanh(acc))


REDUCE_REF = {
    "sum": lambda x, d: x.sum(d),
    "max": lambda x, d: x.amax(d),
    "sumsq": lambda x, d: (x * x).sum(d),
}


@pytest.mark.parametrize("op", list(REDUCE_REF))
@shapes
@cdtypes
def test_reductions(op, M, N, cd):
    A, W, acc, gen = _operands(13, M, N, cd)
    b = torch.randn(N, generator=gen)
    g = ce.Graph()
    y = g.accumulator() + g.row_vector("b")
    g.output(y)
    g.row_reduce("rows", y, op)
    g.col_reduce("cols", ce.exp(y * 0.1), op)
    out = ce.interpret(g, A, W, compute_dtype=cd, b=b)
    yy = acc + b.to(cd)
    assert out.rows.shape == (M,) and out.cols.shape == (N,)
    _close(out.rows, REDUCE_REF[op](yy, 1))
    _close(out.cols, REDUCE_REF[op](torch.exp(yy * 0.1), 0))


@cdtypes
def test_reduction_of_broadcast_value(cd):
    A, W, _acc, gen = _operands(14, 37, 72, cd)
    c = torch.randn(37, generator=gen)
    g = ce.Graph()
    g.output(g.accumulator())
    cv = g.col_vector("c") * 1.0
    g.row_reduce("rs", cv, "sum")     # each row: N copies of c[m]
    g.col_reduce("cs", cv, "max")     # each column: max over c
    out = ce.interpret(g, A, W, compute_dtype=cd, c=c)
    _close(out.rs, c.to(cd) * 72)
    _close(out.cs, c.to(cd).max().expand(72))


@shapes
def test_several_outputs_example_graph(M, N):
    """The README example: bias, SiLU, residual, an aux store and a sum-of-squares reduction."""
    A, W, acc, gen = _operands(15, M, N, torch.float64)
    bias, res = torch.randn(N, generator=gen), torch.randn(M, N, generator=gen)
    g = ce.Graph()
    a = g.accumulator()
    pre = a + g.row_vector("bias")
    y = ce.silu(pre) * g.tile("residual")
    g.store("pre", pre)
    g.output(y)
    g.row_reduce("sqsum", y * y, "sum")
    out = ce.interpret(g, A, W, compute_dtype=torch.float64, bias=bias, residual=res)
    assert sorted(out) == ["out", "pre", "sqsum"]
    p = acc + bias.double()
    yy = F.silu(p) * res.double()
    _close(out.pre, p)
    _close(out.out, yy)
    _close(out.sqsum, (yy * yy).sum(1))
    assert out["sqsum"] is out.sqsum


def test_exact_on_small_integers():
    """A pure element-wise graph on small-integer inputs: every intermediate is an exact fp32
    integer, so the interpreter must match the hand-written fp32 math bit for bit."""
    gen = torch.Generator().manual_seed(16)
    M, N = 37, 72
    A = torch.randint(-3, 4, (M, K), generator=gen).float()
    W = torch.randint(-3, 4, (N, K), generator=gen).float()
    b = torch.randint(-5, 6, (N,), generator=gen).float()
    c = torch.randint(-5, 6, (M,), generator=gen).float()
    t = torch.randint(-5, 6, (M, N), generator=gen).float()
    g = ce.Graph()
    a = g.accumulator()
    cv = g.col_vector("c")
    x = ce.maximum(a - g.row_vector("b"), g.tile("t")) * 2 + ce.minimum(-a, cv)
    y = ce.fma(abs(x), g.scalar("s"), ce.square(cv)) - ce.relu(3 - a)
    g.output(y)
    g.store("x", x)
    g.row_reduce("rmax", y, "max")
    g.col_reduce("csum", x, "sum")
    out = ce.interpret(g, A, W, b=b, c=c, t=t, s=2)
    acc = A @ W.t()
    xr = torch.maximum(acc - b, t) * 2 + torch.minimum(-acc, c[:, None])
    yr = xr.abs() * 2 + torch.square(c)[:, None] - torch.relu(3 - acc)
    assert torch.equal(out.out, yr)
    assert torch.equal(out.x, xr)
    assert torch.equal(out.rmax, yr.amax(1))
    assert torch.equal(out.csum, xr.sum(0))


def test_low_precision_compute_dtype():
    A, W, acc64, _ = _operands(17, 37, 72, torch.float64)
    g = ce.Graph()
    g.output(ce.silu(g.accumulator()))
    got = ce.interpret(g, A, W, compute_dtype=torch.bfloat16).out
    assert got.dtype == torch.bfloat16
    want = F.silu(A.bfloat16() @ W.bfloat16().t())
    assert torch.equal(got, want)
    assert not torch.equal(got.double(), F.silu(acc64))


def test_builder_graph_and_ir_give_the_same_result():
    A, W, _, gen = _operands(18, 37, 72, torch.float32)
    b = torch.randn(72, generator=gen)
    g = ce.Graph()
    g.output(ce.gelu(g.accumulator() * g.row_vector("b")))
    assert torch.equal(ce.interpret(g, A, W, b=b).out, ce.interpret(g.build(), A, W, b=b).out)


def test_named_main_output():
    A, W, acc, _ = _operands(19, 5, 8, torch.float32)
    g = ce.Graph()
    g.output(g.accumulator(), name="d")
    out = ce.interpret(g, A, W)
    assert list(out) == ["d"]
    _close(out.d, acc)


# --- argument errors and Outputs --------------------------------------------------------------


def _two_input_graph():
    g = ce.Graph()
    g.output(g.accumulator() * g.row_vector("gamma") + g.scalar("beta"))
    return g


def test_missing_input():
    A, W, _, _ = _operands(20, 5, 8, torch.float32)
    with pytest.raises(TypeError, match=r"missing input\(s\) \['gamma'\]; the graph's inputs are \['beta', 'gamma'\]"):
        ce.interpret(_two_input_graph(), A, W, beta=1.0)


def test_extra_input():
    A, W, _, _ = _operands(21, 5, 8, torch.float32)
    with pytest.raises(TypeError, match=r"unexpected input\(s\) \['bias'\]"):
        ce.interpret(_two_input_graph(), A, W, beta=1.0, gamma=torch.ones(8), bias=torch.ones(8))


def test_bad_operand_shapes():
    g = ce.Graph()
    g.output(g.accumulator())
    with pytest.raises(ValueError, match=r"A is \(M, K\) = \(5, 4\) but W is \(8, 3\): W must be \(N, K\) with "
                                         r"the same K"):
        ce.interpret(g, torch.ones(5, 4), torch.ones(8, 3))
    with pytest.raises(ValueError, match=r"A must be 2-D, got shape \(5,\)"):
        ce.interpret(g, torch.ones(5), torch.ones(8, 5))


def test_not_a_graph():
    with pytest.raises(TypeError, match=r"expected a coda_ext.Graph or its built IR, got int"):
        ce.interpret(3, torch.ones(2, 2), torch.ones(2, 2))


def test_outputs_attribute_access():
    A, W, acc, _ = _operands(22, 5, 8, torch.float32)
    g = ce.Graph()
    a = g.accumulator()
    g.output(a)
    g.row_reduce("rsum", a)
    out = ce.interpret(g, A, W)
    assert isinstance(out, ce.Outputs) and isinstance(out, dict)
    assert out.rsum is out["rsum"]
    _close(out.rsum, acc.sum(1))
    with pytest.raises(AttributeError, match=r"no output named 'rsm'; outputs are \['out', 'rsum'\]"):
        _ = out.rsm
    assert not hasattr(out, "csum")


# --- known bug ------------------------------------------------------------------------------------


def test_negative_zero_constant_is_not_merged_with_zero():
    A, W, _, _ = _operands(23, 5, 8, torch.float32)
    g = ce.Graph()
    a = g.accumulator()
    g.output(a * 0.0 + 1.0 / g.scalar(value=-0.0))
    out = ce.interpret(g, A, W).out
    assert torch.isneginf(out).all()
