"""The registry of node kinds (coda_ext/graph/kinds.py) is the one list every layer reads: every
entry states every field; the verifier, the interpreter, the emitter and the cost model cover exactly
its kinds (a kind one of them lacks fails here with its name); the C++ each entry names exists in
csrc/; and a kind added to the registry alone is verified, interpreted, emitted and costed."""
from __future__ import annotations

import dataclasses
import math
import pathlib
import re

import pytest
import torch

import coda_ext as ce
from coda_ext.analysis import costs, io_model
from coda_ext.codegen.emit import FUNCTORS, node_alias
from coda_ext.graph import ir, kinds, semantics
from coda_ext.graph.kinds import KINDS, Kind
from coda_ext.graph.verify import verify
from coda_ext.passes import resolve_dtypes

ROOT = pathlib.Path(__file__).resolve().parents[2]
EPILOGUES = ROOT / "csrc" / "epilogues"
#: Kinds without a visitor of their own (Kind.cpp is None), and why.
NO_VISITOR = {"output": "D is the fusion's root value", "pair_gate": "lowered into pair_gated_store"}
#: Attributes enough for any kind's node.
ATTRS = ir.make_attrs(name="x", dtype="bfloat16", op="sum", size=32, half=1, act="silu", mode="constant", value=2.0)


def test_every_kind_has_every_field():
    assert [f.name for f in dataclasses.fields(Kind)] == ["name", "arity", "dtype", "interpret", "cpp", "flops",
                                                          "flags"]
    bad = []
    for name, k in KINDS.items():
        ok = (k.name == name and ((isinstance(k.arity, int) and 0 <= k.arity <= 3) or k.arity is None)
              and k.dtype in kinds.DTYPE_RULES and callable(k.interpret)
              and ((isinstance(k.cpp, str) and k.cpp.isidentifier()) or k.cpp is None)
              and isinstance(k.flops, float) and k.flops >= 0.0
              and isinstance(k.flags, frozenset) and k.flags <= set(kinds.FLAGS))
        if not ok:
            bad.append(name)
    assert not bad, f"registry entries with a missing or malformed field: {bad}"
    assert [n for n, k in KINDS.items() if k.arity is None] == ["keep_first"]
    assert {n for n, k in KINDS.items() if k.cpp is None} == set(NO_VISITOR)
    assert kinds.OP_DEFAULT_RULES == ("float", "tensor", "float_or_int", "pair16")


def test_ir_names_are_the_registry_s():
    """ir.py's tuples are derived from the registry (other code reads them)."""
    assert set(ir.ARITY) == set(KINDS) - {"keep_first"}
    assert all(ir.ARITY[n] == KINDS[n].arity for n in ir.ARITY)
    assert ir.LEAF_KINDS == ("accumulator", "scalar", "row_vector", "col_vector", "tile", "col_index", "pair_tile")
    assert ir.INPUT_KINDS == ("row_vector", "col_vector", "tile", "pair_tile")
    assert ir.SINK_KINDS == ("output", "store", "row_reduce", "col_reduce", "pair_store")
    assert ir.LOWERED_KINDS == ("pair_gated_store", "keep_first")
    assert ir.COMMUTATIVE_KINDS == ("add", "mul", "max", "min", "eq", "ne")
    assert (ir.PAIR_KINDS, ir.PACKED_KINDS, ir.SEGMENT_KINDS) == (("pair_gate",), ("pair_tile", "pack"),
                                                                  ("segment_reduce",))
    every = ir.LEAF_KINDS + ir.UNARY_KINDS + ir.BINARY_KINDS + ir.TERNARY_KINDS + ("pack",) + ir.PAIR_KINDS + \
        ir.SEGMENT_KINDS + ir.SINK_KINDS + ir.LOWERED_KINDS
    assert sorted(every) == sorted(KINDS)
    assert [n for n in KINDS if ir.Node(n).is_sink] == list(ir.SINK_KINDS) + ["pair_gated_store"]


# --- the verifier -------------------------------------------------------------------------------

def test_verifier_knows_every_kind_and_its_arity():
    """A node with one input too many is refused for its arity, never as an unknown kind."""
    unknown = []
    for name, k in KINDS.items():
        n_inputs = 4 if k.arity is None else k.arity + 1
        g = ir.GraphIR((ir.Node("accumulator"), ir.Node(name, (0,) * n_inputs, ATTRS)))
        with pytest.raises(ce.GraphError) as e:
            verify(g)
        if "unknown node kind" in str(e.value):
            unknown.append(name)
        elif k.arity is not None:
            assert f"takes {k.arity} inputs, got {n_inputs}" in str(e.value), name
    assert not unknown, f"the verifier does not know {unknown}"
    with pytest.raises(ce.GraphError, match="node 1 \\(frobnicate\\): unknown node kind 'frobnicate'"):
        verify(ir.GraphIR((ir.Node("accumulator"), ir.Node("frobnicate", (0,)))))


@pytest.mark.parametrize("kind, dtype, ok", [
    ("tile", "float32", True), ("tile", "int32", False), ("row_vector", "int64", True),
    ("row_vector", "int8", False), ("pair_tile", "float16", True), ("pair_tile", "float32", False),
])
def test_verifier_applies_each_kind_s_dtype_rule(kind, dtype, ok):
    g = ir.GraphIR((ir.Node("accumulator"), ir.Node(kind, (), ir.make_attrs(name="t", dtype=dtype)),
                    ir.Node("output", (0,), ir.make_attrs(name="out"))))
    if ok:
        with pytest.raises(ce.GraphError, match="never used"):   # past the dtype check
            verify(g)
    else:
        with pytest.raises(ce.GraphError, match=f"node 1 \\({kind} 't'\\): .*{dtype}"):
            verify(g)


def test_lowering_gives_the_op_s_dtype_by_rule():
    g = ir.GraphIR((ir.Node("accumulator"), ir.Node("tile", (), ir.make_attrs(name="t")),
                    ir.Node("pair_tile", (), ir.make_attrs(name="p", dtype="float16")),
                    ir.Node("unpack", (2,), ir.make_attrs(half=0)),
                    ir.Node("add", (0, 1)), ir.Node("store", (4,), ir.make_attrs(name="s"))))
    got = [n.attr("dtype") for n in resolve_dtypes(g, "bfloat16").nodes]
    assert got == [None, "bfloat16", "float16", "float16", None, "bfloat16"]


# --- the interpreter ---------------------------------------------------------------------------

M, N, K = 2, 64, 4
_A = torch.randn(M, K, generator=torch.Generator().manual_seed(0))
_W = torch.randn(N, K, generator=torch.Generator().manual_seed(1))
_X = torch.linspace(-2.0, 2.0, M * N).reshape(M, N)
_Y = torch.linspace(0.25, 3.0, M * N).reshape(M, N).flip(1)
_Z = torch.linspace(-1.0, 1.5, M * N).reshape(M, N)
_PAIRS = torch.arange(M * 2 * N, dtype=torch.float32).reshape(M, 2 * N)

def _gelu_tanh_grad(a: float) -> float:
    """The tanh-form GELU's derivative through sech² (the closed form under test uses 1 - tanh²)."""
    k = math.sqrt(2 / math.pi)
    u = k * (a + 0.044715 * a ** 3)
    return 0.5 * (1 + math.tanh(u)) + 0.5 * a * k * (1 + 3 * 0.044715 * a * a) / math.cosh(u) ** 2


def _q16(a: float) -> tuple[int, int]:
    """a (an fp32 value) as ±q · 2^(e-16) with q 16 significant bits (rounded to nearest, ties to even)."""
    m, e = math.frexp(a)
    q = round(abs(m) * 2 ** 16)
    if q == 2 ** 16:   # the rounding carried into the next power of two
        q, e = 2 ** 15, e + 1
    return int(math.copysign(1, a)) * q, e


def _hi16(a: float) -> float:
    q, e = _q16(a)
    return math.copysign((abs(q) >> 8 << 8) * 2.0 ** (e - 16), a)


def _lo8(a: float) -> float:
    return float(abs(_q16(a)[0]) & 0xFF)


def _join24(hi: float, lo: float) -> float:
    m, e = math.frexp(hi)
    top = math.trunc(m * 2 ** 8) * 2.0 ** (e - 8)   # hi's top 16 bits (a bfloat16, truncated)
    return top + math.copysign(min(max(round(lo), 0), 255) * 2.0 ** (e - 16), hi)


#: Independent references of the element-wise kinds, on Python floats.
_SCALAR = {
    "neg": lambda a: -a, "abs": abs, "exp": math.exp, "log": lambda a: math.log(abs(a)),
    "sqrt": lambda a: math.sqrt(abs(a)), "rsqrt": lambda a: 1 / math.sqrt(abs(a)), "square": lambda a: a * a,
    "tanh": math.tanh, "sigmoid": lambda a: 1 / (1 + math.exp(-a)), "silu": lambda a: a / (1 + math.exp(-a)),
    "relu": lambda a: max(a, 0.0),
    "gelu_tanh": lambda a: 0.5 * a * (1 + math.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a ** 3))),
    "gelu_erf": lambda a: 0.5 * a * (1 + math.erf(a / math.sqrt(2))),
    "gelu_erf_grad": lambda a: 0.5 * (1 + math.erf(a / math.sqrt(2))) + a * math.exp(-a * a / 2) / math.sqrt(2 * math.pi),  # noqa: E501
    "gelu_tanh_grad": lambda a: _gelu_tanh_grad(a),
    "cos_turns": lambda t: math.cos(2 * math.pi * t), "sin_turns": lambda t: math.sin(2 * math.pi * t),
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b, "div": lambda a, b: a / b,
    "max": max, "min": min, "eq": lambda a, b: float(a == b), "ne": lambda a, b: float(a != b),
    "lt": lambda a, b: float(a < b), "le": lambda a, b: float(a <= b), "gt": lambda a, b: float(a > b),
    "ge": lambda a, b: float(a >= b), "fma": lambda a, b, c: a * b + c, "where": lambda c, a, b: a if c else b,
    "hi16": _hi16, "lo8": _lo8, "join24": _join24,
}
_LOG_LIKE = ("log", "sqrt", "rsqrt")   # evaluated on |x|


def _env(graph: tuple, inputs: dict | None = None) -> semantics.Env:
    return semantics.Env(_A, _W, inputs or {}, torch.float64, ir.GraphIR(graph), KINDS)


def _structural(name: str):
    """(inputs of the kind's function, env inputs, graph, expected value or recorded output)."""
    x, acc = _X.double(), (_A.double() @ _W.double().t())
    pairs = _PAIRS.double().reshape(M, N, 2)
    graph = (ir.Node("accumulator"),)
    return {
        "accumulator": ((), {}, acc),
        "scalar": ((), {}, torch.tensor(2.0, dtype=torch.float64)),
        "row_vector": ((), {"x": torch.arange(float(N))}, torch.arange(float(N)).double()[None, :]),
        "col_vector": ((), {"x": torch.arange(float(M))}, torch.arange(float(M)).double()[:, None]),
        "tile": ((), {"x": _X}, x),
        "col_index": ((), {}, torch.arange(float(N)).double()[None, :]),
        "pair_tile": ((), {"x": _PAIRS}, pairs),
        "cast": ((torch.tensor(1 + 2 ** -10, dtype=torch.float64),), {}, torch.tensor(1.0, dtype=torch.float64)),
        "unpack": ((pairs,), {}, _PAIRS.double()[:, 1::2]),
        "pair_swap": ((x,), {}, torch.stack([x[:, 1::2], x[:, 0::2]], -1).reshape(M, N)),
        "rotate_pairs": ((x, torch.full((M, N), 0.25, dtype=torch.float64)), {},
                         torch.stack([-x[:, 1::2], x[:, 0::2]], -1).reshape(M, N)),
        "turns": ((torch.tensor(3.0), torch.tensor(0.375), torch.tensor(0.0)), {}, torch.tensor(0.125)),
        "pack": ((x, torch.tensor(1.0)), {}, torch.stack([x.to(torch.bfloat16).double(), torch.ones(M, N)], -1)),
        "pair_gate": ((x,), {}, torch.nn.functional.silu(x[:, 0::2]) * x[:, 1::2]),
        "segment_reduce": ((x,), {}, x.reshape(M, 2, 32).sum(-1, keepdim=True).expand(M, 2, 32).reshape(M, N)),
        "keep_first": ((x, acc, acc), {}, x),
        "output": ((x,), {}, {"x": x}),
        "store": ((torch.tensor(1.0),), {}, {"x": torch.ones(M, N)}),
        "row_reduce": ((x,), {}, {"x": x.sum(1)}),
        "col_reduce": ((x,), {}, {"x": x.sum(0)}),
        "pair_store": ((pairs,), {}, {"x": _PAIRS.double()}),
        "pair_gated_store": ((x,), {}, {"x": torch.nn.functional.silu(x[:, 0::2]) * x[:, 1::2]}),
    }.get(name), graph


def test_interpreter_evaluates_every_kind():
    """Each kind's function (Kind.interpret, what the interpreter runs) against an independent
    reference: Python's math for the element-wise kinds, tensors worked out here for the rest."""
    unchecked = []
    for name, k in KINDS.items():
        case, graph = _structural(name)
        node = ir.Node(name, tuple(range(k.arity or 0)), ATTRS)
        if name in _SCALAR:
            args = [torch.abs(_X) + 0.1 if name in _LOG_LIKE else _X, _Y, _Z][:k.arity]
            if name == "where":
                args = [(_X > 0).float(), _Y, _Z]
            env = _env(graph)
            got = k.interpret(env, node, *(a.double() for a in args))
            want = torch.tensor([[_SCALAR[name](*(float(a[i, j]) for a in args)) for j in range(N)] for i in range(M)],
                                dtype=torch.float64)
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, msg=lambda m, name=name: f"{name}: {m}")
        elif case is not None:
            args, inputs, want = case
            env = _env(graph, inputs)
            got = k.interpret(env, node, *args)
            if isinstance(want, dict):   # a sink: records its output, produces no value
                assert got is None, name
                got = env.outs
                assert set(got) == set(want), name
                for key in want:
                    torch.testing.assert_close(got[key].double(), want[key].double(),
                                               msg=lambda m, name=name: f"{name}: {m}")
            else:
                torch.testing.assert_close(got.double(), want.double(), msg=lambda m, name=name: f"{name}: {m}")
        else:
            unchecked.append(name)
    assert not unchecked, f"no interpreter check for {unchecked}: add a reference here"


def test_interpreter_names_a_kind_it_does_not_know():
    g = ir.GraphIR((ir.Node("accumulator"), ir.Node("frobnicate", (0,)), ir.Node("output", (1,), ATTRS)))
    with pytest.raises(ce.GraphError, match="unknown node kind 'frobnicate'"):
        ce.interpret(g, _A, _W)


# --- the emitter and the cost model ----------------------------------------------------------------

def test_emitter_names_every_kind_s_cpp():
    missing = []
    for name, k in KINDS.items():
        node = ir.Node(name, (), ATTRS)
        if k.cpp is None:
            with pytest.raises(NotImplementedError, match=f"'{name}'"):
                node_alias(node)
            continue
        try:
            alias = node_alias(node)
        except (NotImplementedError, KeyError):
            missing.append(name)
            continue
        if "compute" in k.flags:
            assert alias == f"Compute<Cfg, {k.cpp}>", name
        else:
            assert alias == k.cpp or alias.startswith(f"{k.cpp}<Cfg"), (name, alias)
    assert not missing, f"the emitter has no visitor for {missing}"
    assert FUNCTORS == {n: k.cpp for n, k in KINDS.items() if "compute" in k.flags}
    with pytest.raises(NotImplementedError, match="'frobnicate'"):
        node_alias(ir.Node("frobnicate"))


def test_cost_model_covers_every_kind():
    assert list(costs.KIND_COSTS) == list(KINDS)
    for name, k in KINDS.items():
        c = costs.kind_cost(name)
        assert c.flops == k.flops, name
        assert c.half == ("pair" in k.flags), name
    assert [n for n, c in costs.KIND_COSTS.items() if c.hbm == "read"] == list(ir.INPUT_KINDS)
    assert [n for n, c in costs.KIND_COSTS.items() if c.hbm == "partials"] == ["row_reduce", "col_reduce"]
    assert [n for n, c in costs.KIND_COSTS.items() if c.hbm == "write"] == \
        ["output", "store", "pair_store", "pair_gated_store"]
    assert costs.node_flops(ir.Node("pair_gate", (0,), ATTRS)) == KINDS["silu"].flops + 1
    with pytest.raises(ce.UnsupportedError, match=r"'frobnicate'.*graph/kinds\.py"):
        costs.kind_cost("frobnicate")


# --- the C++ ---------------------------------------------------------------------------------------

def _headers() -> str:
    return "\n".join(p.read_text() for p in sorted(EPILOGUES.glob("*.hpp")))


def test_every_cpp_name_exists_in_csrc():
    """A compute kind's functor is a one-parameter template of functors.hpp (CODA_EPI_FUNCTOR or
    written out); every other kind's visitor is a wrapper template of csrc/epilogues."""
    text = _headers()
    functors = (EPILOGUES / "functors.hpp").read_text()
    absent = []
    for name, k in KINDS.items():
        if k.cpp is None:
            continue
        if "compute" in k.flags:
            found = re.search(rf"^CODA_EPI_FUNCTOR\({k.cpp}\)$", functors, re.MULTILINE) or \
                re.search(rf"template <class T>\s*struct {k.cpp} \{{", functors)
        else:
            found = re.search(rf"^(template <[^>]*>\s*)?struct {k.cpp} \{{", text, re.MULTILINE)
        if not found:
            absent.append(f"{name}: {k.cpp}")
    assert not absent, f"C++ names the registry gives but csrc/epilogues does not define: {absent}"
    # pair_gated_store takes its activation as scalar::<functor>
    scalar = functors.split("namespace scalar {", 1)[1].split("}  // namespace scalar", 1)[0]
    for act in ir.PAIR_ACTIVATIONS:
        assert re.search(rf"^struct {KINDS[act].cpp} \{{", scalar, re.MULTILINE), act


# --- one entry is enough ------------------------------------------------------------------------------

def test_a_kind_added_to_the_registry_is_verified_interpreted_emitted_and_costed(monkeypatch):
    cube = Kind("cube", 1, "fp32", semantics.pointwise(lambda x: x * x * x), "Cube", 2.0, frozenset({"compute"}))
    monkeypatch.setitem(KINDS, "cube", cube)
    g = ir.GraphIR((ir.Node("accumulator"), ir.Node("cube", (0,)), ir.Node("output", (1,), ir.make_attrs(name="out"))))
    out = ce.interpret(g, _A, _W)["out"]
    torch.testing.assert_close(out, (_A @ _W.t()) ** 3)
    assert "using n1 = Compute<Cfg, Cube>;" in ce.emit_source(g, "bfloat16")
    assert io_model(g, "bfloat16", (128, 128, 64)).variants["fused"].flops == 2 * 128 * 128 * 64 + 2.0 * 128 * 128
