"""Random epilogue graphs for property-based tests, and an independent fp64 reference of them.

A case is a short program against the public builder, kept as steps, so it can be printed
(`case.program()`: the repro for a bug report), built (`case.build()`), evaluated here
(`evaluate`, `reference`: written from the README's semantics, sharing no code with
coda_ext.interpret) and shrunk by Hypothesis. Node kinds come from three tables with one row
per builder call -- LEAVES, OPS, SINKS -- and a row whose `needs` names something coda_ext (or
coda_ext.Graph) does not have yet is left out: a new kind is one row.

Packed pairs: `v3 = g.pair_tile('pt1')` is one step whose value is the pair of halves; operands
name them as (step, half) -- `v3[0]` (even columns), `v3[1]` (odd) in the program -- and a
pair tile is never an operand itself. `g.store_pairs(name, a, b)` is a sink of two operands.

Random choices come from a `Chooser`: Hypothesis' `draw` (tests/unit) or a seeded
random.Random (tests/gpu, whose graphs must be known before anything compiles).

Modes: "any" draws any math (NaN, inf and all). "gpu" keeps values finite and comparable with
an fp32 kernel: log/sqrt/rsqrt and divisors get |x| (+ 0.5), exp a bounded argument, where()
a comparison as condition, turns() input leaves.

Comparing an fp32 device with the fp64 reference (`check_device`): the reference is evaluated
in four lanes -- fp64, fp32, and twice fp32 with a random relative perturbation of 2**-21..2**-20
after every rounding op (other roundings, as a kernel's). Results of comparisons, where(),
casts and turns() whose decision can flip within 8x the lanes' spread are "fragile"; so is
everything computed from them (a reduction: its whole row or column). The rest follows
the rule of docs/design.md (error <= 2x the error of PyTorch in the op's dtype + a floor), and outputs
computed by exact rows only (selections, comparisons, casts of inputs) must match bit for bit.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import random
import string
from collections.abc import Callable
from typing import Any

import torch

import coda_ext as ce
from tests.helpers import rand

TORCH = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
         "int32": torch.int32, "int64": torch.int64}
FLOATS = ("bfloat16", "float16", "float32")
PAIR_DTYPES = ("bfloat16", "float16")   # pair tiles and pair stores: 16-bit elements
CONSTANTS = (2.0, 0.5, -1.5, 0.0, 1.0, -0.25, 3.0, 0.1, -0.0, 1e-3)


def fp32(x: float) -> float:
    """What the builder does to a Python number: epilogue constants are fp32."""
    return float(torch.tensor(x, dtype=torch.float32))


@functools.cache
def accepts(snippet: str) -> bool:
    """True if the builder accepts `snippet` (g: a fresh Graph; probes features that may land later)."""
    try:
        g = ce.Graph()
        exec(snippet, {"ce": ce, "g": g})
        g.build()
        return True
    except (ce.GraphError, AttributeError, TypeError, ValueError):
        return False


def vector_dtypes() -> tuple[str, ...]:
    ints = ("int32", "int64") if accepts("g.output(g.accumulator() + g.row_vector('r', 'int32'))") else ()
    return FLOATS + ints


def row_reduce_ops() -> tuple[str, ...]:
    lse = ("logsumexp",) if accepts("g.row_reduce('r', g.accumulator(), 'logsumexp')") else ()
    return ("sum", "max", "sumsq") + lse


def no_output_graphs() -> bool:
    return accepts("g.store('s', g.accumulator())")


# --- the math, written for fp64 and fp32 tensors ---------------------------------------------

_INV_SQRT_2PI = (2 * math.pi) ** -0.5


def _sigmoid(x): return 1 / (1 + torch.exp(-x))
def _silu(x): return x * _sigmoid(x)
def _relu(x): return torch.where(x > 0, x, torch.where(torch.isnan(x), x, torch.zeros_like(x)))
def _gelu_erf(x): return 0.5 * x * (1 + torch.erf(x * math.sqrt(0.5)))
def _gelu_erf_grad(x): return 0.5 * (1 + torch.erf(x * math.sqrt(0.5))) + x * torch.exp(-0.5 * x * x) * _INV_SQRT_2PI
def _gelu_tanh(x): return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)))
def _gelu_tanh_grad(x): return torch.func.grad(lambda v: _gelu_tanh(v).sum())(x)
def _cast(x, dtype): return x.to(TORCH[dtype]).to(x.dtype)
def _where(c, a, b): return torch.where(c != 0, a, b)
def _compare(fn): return lambda a, b: fn(a, b).to(torch.promote_types(a.dtype, b.dtype))


def _turns(pos, hi, lo):
    """frac(pos * (hi + lo)) in [-0.5, 0.5], exactly (in fp64), in the inputs' dtype."""
    t = pos.double() * (hi.double() + lo.double())
    return (t - torch.round(t)).to(pos.dtype)


def _round24(x):
    """x rounded to 16 significant bits (to nearest, ties to even): what join24(hi16(x), lo8(x)) keeps of it."""
    m, e = torch.frexp(x)
    return torch.ldexp(torch.round(m * 2 ** 16), e - 16).to(x.dtype)


def _pair_swap(x):
    return x.reshape(x.shape[0], -1, 2).flip(-1).reshape(x.shape)


def _halves(t):
    """pair_tile: (even, odd) with even[:, i] = t[:, 2i], odd[:, i] = t[:, 2i+1]."""
    return t[:, 0::2], t[:, 1::2]


def _interleave(even, odd):
    """out[:, 2i] = even[:, i], out[:, 2i+1] = odd[:, i] (both M x N)."""
    return torch.stack([even, odd], dim=-1).reshape(even.shape[0], 2 * even.shape[1])


def _store_pairs(even, odd, dtype):
    """store_pairs: the two values interleaved, each rounded to the 16-bit dtype (None: unrounded)."""
    return _interleave(_cast(even, dtype), _cast(odd, dtype)) if dtype else _interleave(even, odd)


def _logsumexp(x, dim):
    m = x.amax(dim, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    return m.squeeze(dim) + torch.log(torch.exp(x - m).sum(dim))


REDUCE = {"sum": lambda x, d: x.sum(d), "max": lambda x, d: x.amax(d), "sumsq": lambda x, d: (x * x).sum(d),
          "logsumexp": _logsumexp}
ACTIVATIONS = {"silu": _silu, "sigmoid": _sigmoid, "relu": _relu, "gelu_tanh": _gelu_tanh, "gelu_erf": _gelu_erf}


def _segment(x, size, op):
    M, N = x.shape
    return REDUCE[op](x.reshape(M, N // size, size), 2).repeat_interleave(size, dim=1)


def _pair_gate(x, act):
    return ACTIVATIONS[act](x[:, 0::2]) * x[:, 1::2]


def _rotate_pairs(x, t):
    """(x[2i], x[2i+1]) rotated by 2 pi t[2i]."""
    a, b, theta = x[:, 0::2], x[:, 1::2], 2 * math.pi * t[:, 0::2]
    c, s = torch.cos(theta), torch.sin(theta)
    return torch.stack([a * c - b * s, b * c + a * s], dim=-1).reshape(x.shape)


# --- fragility: decisions an fp32 evaluation may take the other way ---------------------------

def _spread(x):
    """How far the fp32 lanes of a value are from its fp64 lane (inf where one is NaN)."""
    return torch.nan_to_num(sum((x[0] - xi.double()).abs() for xi in x[1:]), nan=math.inf)


def _slack(x):
    """How far a kernel's fp32 value may land from the fp64 one: 8x the lanes' spread + 2**-20 relative."""
    return 8 * _spread(x) + 2.0 ** -20 * x[0].abs()


def _near_tie(xs, out, **_):
    a, b = xs
    return (a[0] - b[0]).abs() < _slack(a) + _slack(b)


def _near_zero(xs, out, **_):
    return xs[0][0].abs() < _slack(xs[0])


def _near_half_turn(xs, out, **_):
    return 0.5 - out[0].abs() < _slack(out)


def _near_rounding_tie(xs, out, dtype):
    """A cast rounds the other way (a 1-ulp step) within 2x the lanes' spread of a rounding tie."""
    if dtype == "float32":
        return torch.zeros((), dtype=torch.bool)
    x, s = xs[0][0], 2 * _spread(xs[0])
    return (x - s).to(TORCH[dtype]) != (x + s).to(TORCH[dtype])


# --- the tables ----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Row:
    """One builder call. code: a str.format template ({0}.. operands, {name}, params by name)."""

    kind: str                       # the IR node kind the call adds
    code: str
    ref: Callable | None = None     # ops: (*operands, **params) -> tensor; leaves: (lane, name, **params)
    params: tuple = ()              # ((param, choices or a function giving them), ...)
    needs: str | None = None        # a coda_ext or coda_ext.Graph attribute the call needs
    exact: bool = False             # the result is one of its inputs, 0 or 1 (rounds nothing itself)
    layout: str = "map"             # map | swap | rotate | segment | pair (read the operands at full M x N);
    #                                 packed: a pair tile (its value is the pair of halves, never an operand)
    decide: Callable | None = None  # elements where the result may flip under fp32 rounding
    guard: str | None = None        # how mode "gpu" keeps the operands in range
    input: str | None = None        # leaves: the runtime input (value, pointer, row, col, tile, pair)
    adds: tuple = ()                # other IR kinds the call adds (pair_tile: unpack; store_pairs: pack)
    variants: tuple = ()            # more features a case with this row should exercise (kind:variant)

    @property
    def arity(self) -> int:
        fields = [f for _, f, _, _ in string.Formatter().parse(self.code) if f and f.isdigit()]
        return max(map(int, fields)) + 1 if fields else 0

    def available(self) -> bool:
        return self.needs is None or hasattr(ce, self.needs) or hasattr(ce.Graph, self.needs)

    def choices(self, param: str) -> tuple:
        c = dict(self.params)[param]
        return c() if callable(c) else c


def _input(lane, name, **_):
    return lane.inputs[name]


#: What a case may read of a pair tile (features "pair_tile:<use>").
PAIR_TILE_USES = ("even half only", "odd half only", "both halves")


LEAVES = [
    Row("accumulator", "g.accumulator()", lambda lane, name: lane.acc),
    Row("scalar", "g.scalar(value={value!r})", lambda lane, name, value: lane.const(value),
        params=(("value", CONSTANTS),), exact=True),
    Row("scalar", "g.scalar({name!r})", _input, input="value", exact=True),
    Row("scalar", "g.scalar({name!r}, pointer=True)", _input, input="pointer", exact=True),
    Row("row_vector", "g.row_vector({name!r})", _input, input="row", exact=True),
    Row("row_vector", "g.row_vector({name!r}, {dtype!r})", _input, params=(("dtype", vector_dtypes),),
        input="row", exact=True),
    Row("col_vector", "g.col_vector({name!r})", _input, input="col", exact=True),
    Row("col_vector", "g.col_vector({name!r}, {dtype!r})", _input, params=(("dtype", vector_dtypes),),
        input="col", exact=True),
    Row("tile", "g.tile({name!r})", _input, input="tile", exact=True),
    Row("tile", "g.tile({name!r}, {dtype!r})", _input, params=(("dtype", FLOATS),), input="tile", exact=True),
    Row("col_index", "g.col_index()", lambda lane, name: lane.col_index, needs="col_index", exact=True),
    Row("pair_tile", "g.pair_tile({name!r})", _input, needs="pair_tile", input="pair", exact=True, layout="packed",
        adds=("unpack",), variants=PAIR_TILE_USES),
    Row("pair_tile", "g.pair_tile({name!r}, {dtype!r})", _input, params=(("dtype", PAIR_DTYPES),),
        needs="pair_tile", input="pair", exact=True, layout="packed", adds=("unpack",), variants=PAIR_TILE_USES),
]

OPS = [
    Row("neg", "-{0}", torch.neg, exact=True),
    Row("neg", "ce.neg({0})", torch.neg, exact=True),
    Row("abs", "abs({0})", torch.abs, exact=True),
    Row("abs", "ce.abs({0})", torch.abs, exact=True),
    Row("exp", "ce.exp({0})", torch.exp, guard="bounded"),
    Row("log", "ce.log({0})", torch.log, guard="positive"),
    Row("sqrt", "ce.sqrt({0})", torch.sqrt, guard="nonnegative"),
    Row("rsqrt", "ce.rsqrt({0})", torch.rsqrt, guard="positive"),
    Row("square", "ce.square({0})", lambda x: x * x),
    Row("tanh", "ce.tanh({0})", torch.tanh),
    Row("sigmoid", "ce.sigmoid({0})", _sigmoid),
    Row("silu", "ce.silu({0})", _silu),
    Row("relu", "ce.relu({0})", _relu, exact=True),
    Row("gelu_erf", "ce.gelu({0})", _gelu_erf),
    Row("gelu_erf", "ce.gelu({0}, approximate='none')", _gelu_erf),
    Row("gelu_tanh", "ce.gelu({0}, approximate='tanh')", _gelu_tanh),
    Row("gelu_erf_grad", "ce.gelu_grad({0})", _gelu_erf_grad),
    Row("gelu_tanh_grad", "ce.gelu_grad({0}, approximate='tanh')", _gelu_tanh_grad),
    Row("cast", "ce.cast({0}, {dtype!r})", _cast, params=(("dtype", FLOATS),), exact=True, decide=_near_rounding_tie),
    Row("cos_turns", "ce.cos_turns({0})", lambda t: torch.cos(2 * math.pi * t), needs="cos_turns"),
    Row("sin_turns", "ce.sin_turns({0})", lambda t: torch.sin(2 * math.pi * t), needs="sin_turns"),
    Row("pair_swap", "ce.pair_swap({0})", _pair_swap, needs="pair_swap", exact=True, layout="swap"),
    Row("rotate_pairs", "ce.rotate_pairs({0}, {1})", _rotate_pairs, needs="rotate_pairs", layout="rotate"),
    Row("add", "{0} + {1}", torch.add),
    Row("add", "ce.add({0}, {1})", torch.add),
    Row("sub", "{0} - {1}", torch.sub),
    Row("sub", "ce.sub({0}, {1})", torch.sub),
    Row("mul", "{0} * {1}", torch.mul),
    Row("mul", "ce.mul({0}, {1})", torch.mul),
    Row("div", "{0} / {1}", torch.div, guard="divisor"),
    Row("div", "ce.div({0}, {1})", torch.div, guard="divisor"),
    Row("max", "ce.maximum({0}, {1})", torch.maximum, exact=True),
    Row("min", "ce.minimum({0}, {1})", torch.minimum, exact=True),
    Row("eq", "ce.eq({0}, {1})", _compare(torch.eq), needs="eq", exact=True, decide=_near_tie),
    Row("ne", "ce.ne({0}, {1})", _compare(torch.ne), needs="ne", exact=True, decide=_near_tie),
    Row("lt", "ce.lt({0}, {1})", _compare(torch.lt), needs="lt", exact=True, decide=_near_tie),
    Row("le", "ce.le({0}, {1})", _compare(torch.le), needs="le", exact=True, decide=_near_tie),
    Row("gt", "ce.gt({0}, {1})", _compare(torch.gt), needs="gt", exact=True, decide=_near_tie),
    Row("ge", "ce.ge({0}, {1})", _compare(torch.ge), needs="ge", exact=True, decide=_near_tie),
    Row("fma", "ce.fma({0}, {1}, {2})", lambda a, b, c: a * b + c),
    Row("join24", "ce.join24(ce.hi16({0}), ce.lo8({0}))", _round24, needs="join24", adds=("hi16", "lo8")),
    Row("where", "ce.where({0}, {1}, {2})", _where, needs="where", exact=True, decide=_near_zero, guard="condition"),
    Row("turns", "ce.turns({0}, {1}, {2})", _turns, needs="turns", decide=_near_half_turn, guard="leaves"),
    Row("segment_reduce", "ce.segment_reduce({0}, {size}, {op!r})", _segment, needs="segment_reduce",
        params=(("size", (32, 64, 128)), ("op", ("sum", "sumsq"))), layout="segment"),
    Row("segment_reduce", "ce.segment_reduce({0}, {size}, {op!r})", _segment, needs="segment_reduce",
        params=(("size", (32, 64, 128)), ("op", ("max",))), layout="segment", exact=True),
    Row("pair_gate", "ce.pair_gate({0}, {act!r})", _pair_gate, params=(("act", tuple(ACTIVATIONS)),), layout="pair"),
    Row("pair_gate", "ce.swiglu_pairs({0})", lambda x: _pair_gate(x, "silu"), layout="pair"),
]

SINKS = [
    Row("output", "g.output({0})"),
    Row("output", "g.output({0}, name={name!r})"),
    Row("store", "g.store({name!r}, {0})"),
    Row("store", "g.store({name!r}, {0}, dtype={dtype!r})", params=(("dtype", FLOATS),)),
    Row("row_reduce", "g.row_reduce({name!r}, {0})"),
    Row("row_reduce", "g.row_reduce({name!r}, {0}, {op!r})", params=(("op", row_reduce_ops),)),
    Row("col_reduce", "g.col_reduce({name!r}, {0}, {op!r})", params=(("op", ("sum", "max", "sumsq")),)),
    Row("pair_store", "g.store_pairs({name!r}, {0}, {1})", _store_pairs, needs="store_pairs", adds=("pack",)),
    Row("pair_store", "g.store_pairs({name!r}, {0}, {1}, dtype={dtype!r})", _store_pairs,
        params=(("dtype", PAIR_DTYPES),), needs="store_pairs", adds=("pack",)),
]

TABLES = {"leaf": LEAVES, "op": OPS, "sink": SINKS}


def rows(table: str) -> list[int]:
    """Indices of the rows of `table` that the installed coda_ext supports."""
    return [i for i, r in enumerate(TABLES[table]) if r.available()]


# --- cases -------------------------------------------------------------------------------------

def is_ref(a) -> bool:
    """An operand naming a value -- a step index, or (step, half) of a pair tile -- not a number."""
    return not isinstance(a, float)


def step_of(a) -> int:
    """The step an operand reference reads."""
    return a[0] if isinstance(a, tuple) else a


def expr(a) -> str:
    """An operand as the program writes it: v3, v3[1] (a pair tile's odd half) or a number."""
    if isinstance(a, tuple):
        return f"v{a[0]}[{a[1]}]"
    return f"v{a}" if isinstance(a, int) else repr(a)


@dataclasses.dataclass(frozen=True)
class Step:
    table: str                  # leaf | op | sink
    row: int                    # index into TABLES[table]
    args: tuple = ()            # operands: step indices (int), (step, half) of a pair tile, or numbers (float)
    params: tuple = ()          # ((param, value), ...)
    name: str | None = None

    @property
    def spec(self) -> Row:
        return TABLES[self.table][self.row]

    def param(self, key: str, default: Any = None) -> Any:
        return dict(self.params).get(key, default)


@dataclasses.dataclass(frozen=True)
class Case:
    steps: tuple[Step, ...]
    dtype: str = "bfloat16"     # the op's dtype: GEMM operands, inputs and stores without one
    config: Any = None          # a KernelConfig (GPU tests), None for the default

    def lines(self) -> list[str]:
        out = ["g = ce.Graph()"]
        for i, s in enumerate(self.steps):
            args = [expr(a) for a in s.args]
            call = s.spec.code.format(*args, name=s.name, **dict(s.params))
            out.append(call if s.table == "sink" else f"v{i} = {call}")
        return out

    def program(self) -> str:
        return "\n".join(self.lines())

    def build(self) -> ce.Graph:
        ns = {"ce": ce}
        exec(self.program(), ns)
        return ns["g"]

    def __repr__(self) -> str:
        return f"Case(dtype={self.dtype!r}, config={getattr(self.config, 'tag', None)!r}):\n{self.program()}"

    @property
    def major(self) -> str:
        """The operand layout of the config (KernelConfig.major: "kk" when none)."""
        return getattr(self.config, "major", "kk")

    # --- what the graph needs and gives -----------------------------------------------------

    def layout(self, a) -> str:
        """The layout of the row that made operand `a` (a pair tile's half, a number: map)."""
        return self.steps[a].spec.layout if isinstance(a, int) else "map"

    def values(self) -> list[str]:
        """Every full-width value as the program names it (v4, v3[0]): what a line added to the
        program may use as an operand."""
        out = []
        for i, s in enumerate(self.steps):
            if s.table != "sink" and s.spec.layout == "packed":
                out += [expr((i, 0)), expr((i, 1))]
            elif s.table != "sink" and s.spec.layout != "pair":
                out.append(expr(i))
        return out

    @property
    def n_multiple(self) -> int:
        """N must be a multiple of this (pairs of columns, segments)."""
        m = 1
        for s in self.steps:
            if s.spec.layout in ("swap", "rotate", "pair"):
                m = math.lcm(m, 2)
            if s.spec.layout == "segment":
                m = math.lcm(m, s.param("size"))
        return m

    def inputs(self) -> list[tuple[str, str, str]]:
        """(name, input kind, dtype) of every runtime input."""
        return [(s.name, s.spec.input, s.param("dtype", self.dtype)) for s in self.steps
                if s.table == "leaf" and s.spec.input]

    def outputs(self) -> dict[str, tuple[str, str, bool]]:
        """name -> (sink kind, dtype of the result, half width)."""
        out = {}
        for s in self.steps:
            if s.table == "sink":
                kind = s.spec.kind
                half = self.layout(s.args[0]) == "pair"
                dtype = "float32" if kind.endswith("reduce") else s.param("dtype", self.dtype)
                out[s.name] = (kind, dtype, half)
        return out

    def output_shape(self, name: str, M: int, N: int) -> tuple[int, ...]:
        """The shape of output `name` for an (M, N) problem: (M, 2N) for pair stores."""
        kind, _, half = self.outputs()[name]
        return {"row_reduce": (M,), "col_reduce": (N,), "pair_store": (M, 2 * N)}.get(kind, (M, N // 2 if half else N))

    def features(self) -> set[str]:
        """What the case exercises: row codes, kinds, and kind:param=value."""
        f = set()
        for i, s in enumerate(self.steps):
            f |= {s.spec.code, s.spec.kind} | set(s.spec.adds) | {f"{s.spec.kind}:{k}={v}" for k, v in s.params}
            if any(isinstance(a, float) for a in s.args):
                f.add(f"{s.spec.kind}:number operand")
            if s.table == "sink" and self.layout(s.args[0]) == "pair":
                f.add(f"{s.spec.kind}:half width")
            if s.spec.layout == "packed":
                halves = {a[1] for t in self.steps for a in t.args if isinstance(a, tuple) and a[0] == i}
                f.add(f"{s.spec.kind}:{PAIR_TILE_USES[2 if len(halves) == 2 else min(halves, default=0)]}")
        if not any(s.spec.kind == "output" for s in self.steps):
            f.add("no output")
        return f


def make_case(*calls: tuple, dtype: str = "bfloat16") -> Case:
    """A Case written by hand: (row code, operands, params, name) per call; operands are indices of
    earlier calls, (index, half) of an earlier pair tile, or Python numbers (floats)."""
    steps = []
    for code, args, params, name in calls:
        table, row = next((t, i) for t in TABLES for i, r in enumerate(TABLES[t]) if r.code == code)
        steps.append(Step(table, row, tuple(args), tuple(params.items()), name))
    return Case(tuple(steps), dtype)


class Chooser:
    """Random choices from Hypothesis (`draw`) or from a seeded random.Random; both shrink/start at lo."""

    def __init__(self, draw: Callable | None = None, rng: random.Random | None = None):
        self._draw, self._rng = draw, rng

    def integer(self, lo: int, hi: int) -> int:
        if self._draw is not None:
            from hypothesis import strategies as st

            return self._draw(st.integers(lo, hi))
        return self._rng.randint(lo, hi)

    def choice(self, seq):
        seq = list(seq)
        return seq[self.integer(0, len(seq) - 1)]


_PREFIX = {"value": "s", "pointer": "p", "row": "r", "col": "c", "tile": "t", "pair": "pt", "output": "d",
           "store": "st", "row_reduce": "rr", "col_reduce": "cr", "pair_store": "ps"}


class _Maker:
    def __init__(self, ch: Chooser, mode: str):
        self.ch, self.mode = ch, mode
        self.steps: list[Step] = []
        self.values: list = []           # full-width values: step indices, (step, half) of pair tiles
        self.halves: list[int] = []      # pair-op results: only a store may take them
        self.on_acc: set[int] = set()    # values computed from the accumulator
        self.compares: set[int] = set()
        self.segment: int | None = None  # one segment size per graph
        self.counter = 0

    def add(self, table: str, row: int, args=(), params=(), name=None) -> int:
        self.steps.append(Step(table, row, tuple(args), tuple(params), name))
        i = len(self.steps) - 1
        r = TABLES[table][row]
        if table != "sink" and r.layout == "packed":
            self.values += [(i, 0), (i, 1)]
        elif table != "sink":
            (self.halves if r.layout == "pair" else self.values).append(i)
            if r.kind == "accumulator" or any(isinstance(a, int) and a in self.on_acc for a in args):
                self.on_acc.add(i)
            if r.decide is _near_tie:
                self.compares.add(i)
        return i

    def name(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def params(self, r: Row) -> tuple:
        out = []
        for key, _ in r.params:
            value = self.segment if key == "size" and self.segment else self.ch.choice(r.choices(key))
            if key == "size":
                self.segment = value
            out.append((key, value))
        return tuple(out)

    def leaf(self, exclude: tuple[str, ...] = ()):
        """A new leaf; of a pair tile, one half (the other stays available as a value)."""
        i = self.ch.choice([i for i in rows("leaf") if LEAVES[i].kind not in exclude])
        r = LEAVES[i]
        j = self.add("leaf", i, (), self.params(r), self.name(_PREFIX[r.input]) if r.input else None)
        return (j, self.ch.integer(0, 1)) if r.layout == "packed" else j

    def operand(self, number_ok: bool):
        pick = self.ch.integer(0, 9)
        if pick >= 8 and number_ok:
            return self.ch.choice(CONSTANTS)
        if pick >= 6 and len(self.steps) < 40:
            return self.leaf()
        return self.values[-1 - self.ch.integer(0, len(self.values) - 1)]

    def apply(self, kind: str, *args) -> int:
        i = next(i for i in rows("op") if OPS[i].kind == kind and OPS[i].code.startswith("ce."))
        return self.add("op", i, args)

    def guard(self, r: Row, args: list) -> list:
        g = r.guard
        if g in ("positive", "nonnegative"):
            args[0] = self.apply("abs", args[0])
            if g == "positive":
                args[0] = self.apply("add", args[0], 0.5)
        elif g == "bounded":
            args[0] = self.apply("min", args[0], 8.0)
        elif g == "divisor":
            b = args[1]
            args[1] = abs(b) + 0.5 if isinstance(b, float) else self.apply("add", self.apply("abs", b), 0.5)
        elif g == "condition" and is_ref(args[0]) and args[0] not in self.compares:
            args[0] = self.apply("gt", args[0], 0.0)
        elif g == "leaves":
            args = [self.leaf(exclude=("accumulator",)) for _ in args]
        return args

    def op(self) -> None:
        i = self.ch.choice(rows("op"))
        r = OPS[i]
        value = self.ch.integer(0, r.arity - 1)   # this operand is a Value, the others may be numbers
        args = [self.operand(number_ok=r.arity > 1 and j != value) for j in range(r.arity)]
        if self.mode == "gpu" and r.guard:
            args = self.guard(r, args)
        self.add("op", i, args, self.params(r))

    def sink(self, value=None, kinds: tuple = ("store", "row_reduce", "col_reduce", "pair_store")) -> None:
        """A sink of `value` (else a random value); a sink of two (store_pairs) takes it as either
        operand, the other a value or a number."""
        i = self.ch.choice([i for i in rows("sink") if SINKS[i].kind in kinds])
        r = SINKS[i]
        if value is None:
            pool = self.values + self.halves if r.kind == "store" else self.values
            value = pool[-1 - self.ch.integer(0, len(pool) - 1)]
        args = [value]
        if r.arity > 1:
            args = [self.operand(number_ok=True) for _ in range(r.arity - 1)]
            args.insert(self.ch.integer(0, len(args)), value)
        name = "out" if r.code == "g.output({0})" else self.name(_PREFIX[r.kind])
        self.add("sink", i, args, self.params(r), name)

    def finish(self) -> list[Step]:
        """Drops steps that feed no sink (an unused input is a GraphError) and renumbers."""
        live = set()
        for i in range(len(self.steps) - 1, -1, -1):
            if self.steps[i].table == "sink" or i in live:
                live.add(i)
                live |= {step_of(a) for a in self.steps[i].args if is_ref(a)}
        index, out = {}, []

        def renumbered(a):
            if isinstance(a, tuple):
                return (index[a[0]], a[1])
            return index[a] if isinstance(a, int) else a

        for i, s in enumerate(self.steps):
            if i in live:
                index[i] = len(out)
                out.append(dataclasses.replace(s, args=tuple(renumbered(a) for a in s.args)))
        return out


def draw_case(ch: Chooser, mode: str = "any", max_ops: int = 10, configs: tuple = (None,)) -> Case:
    """A random valid graph: leaves, up to `max_ops` ops on them, an output (or, where the builder
    allows graphs without one, sometimes none) and up to three more stores and reductions."""
    m = _Maker(ch, mode)
    dtype = ch.choice(("bfloat16", "float16"))
    m.add("leaf", 0)  # the accumulator
    for _ in range(ch.integer(1, max_ops)):
        m.op()
    main = [v for v in m.values if v in m.on_acc]
    main = main[-1] if ch.integer(0, 3) < 3 else ch.choice(main)
    m.sink(main, ("output",) if not no_output_graphs() or ch.integer(0, 4) else ("store", "row_reduce", "pair_store"))
    for half in list(m.halves):
        if ch.integer(0, 1):
            m.sink(half, ("store",))
    for _ in range(ch.integer(0, 3)):
        m.sink()
    return Case(tuple(m.finish()), dtype, ch.choice(configs))


def hypothesis_cases(mode: str = "any", max_ops: int = 10):
    """A Hypothesis strategy of Cases."""
    from hypothesis import strategies as st

    @st.composite
    def cases(draw):
        return draw_case(Chooser(draw=draw), mode, max_ops)

    return cases()


def seeded_cases(n: int, seed: int, mode: str = "gpu", max_ops: int = 10, configs: tuple = (None,)) -> list[Case]:
    """`n` random cases from a fixed seed (the same list on every machine)."""
    rng = random.Random(seed)
    return [draw_case(Chooser(rng=rng), mode, max_ops, configs) for _ in range(n)]


def _variants(table: str, every_row: bool) -> list[tuple[int, tuple]]:
    """(row, params) for the available rows with every dtype/op/act they take (other params: the
    first). every_row=False keeps one row per distinct node (`-x` and ce.neg(x) build the same)."""
    out, seen = [], set()
    for i in rows(table):
        r = TABLES[table][i]
        keys = [k for k, _ in r.params if k in ("dtype", "op", "act")]
        first = tuple((k, r.choices(k)[0]) for k, _ in r.params if k not in keys and k != "size")
        for values in itertools.product(*(r.choices(k) for k in keys)):
            node = (r.kind, r.input, r.params and tuple(zip(keys, values)), r.exact)
            if every_row or node not in seen:
                seen.add(node)
                out.append((i, first + tuple(zip(keys, values))))
    return out


#: What `coverage_cases(compact=True)` leaves out: variants that instantiate no other C++ (int64
#: vectors are narrowed to int32 before the launch; a pair op's activation is a unary op's functor),
#: and rows that leave the dtype to the op's where another row of the kind names every dtype (`_by_default`).
_REDUNDANT = {("dtype", "int64"), ("act", "sigmoid"), ("act", "relu"), ("act", "gelu_tanh"), ("act", "gelu_erf")}


def _by_default(table: str, i: int) -> bool:
    """Row i takes no dtype, and another available row of the same call takes it (g.tile(name) and
    g.tile(name, dtype)): its node is one of that row's (the op's dtype is bf16 or fp16)."""
    r, others = TABLES[table][i], [TABLES[table][j] for j in rows(table)]
    return "dtype" not in dict(r.params) and any(
        o.kind == r.kind and o.input == r.input and "dtype" in dict(o.params) for o in others)


def coverage_cases(n: int = 2, every_row: bool = False, compact: bool = False, mode: str = "gpu") -> list[Case]:
    """`n` fixed graphs that together use every available node kind with every dtype, reduction op
    and activation it takes (every row of the tables with every_row; only what changes the emitted
    C++ with compact): the ops are applied in chains of four (compact: eight) from the accumulator, each
    chain's end is added to a total, which every sink takes (a pair op's result is stored; store_pairs
    takes the total and the accumulator). Both halves of each pair tile are used.
    Segment sizes: 32, 64, 32, ... Mode "gpu" guards the operands as random cases do."""
    def keep(table):
        return lambda variant: not compact or not (set(variant[1]) & _REDUNDANT or _by_default(table, variant[0]))

    leaves = list(filter(keep("leaf"), _variants("leaf", every_row)[1:]))
    ops = list(filter(keep("op"), _variants("op", every_row)))
    sinks = [v for v in _variants("sink", every_row) if SINKS[v[0]].kind != "output" and keep("sink")(v)]
    store = next(i for i in rows("sink") if SINKS[i].code == "g.store({name!r}, {0})")
    cases = []
    for k in range(n):
        m = _Maker(Chooser(rng=random.Random(k)), mode)
        m.segment = (32, 64)[k % 2]
        acc = m.add("leaf", 0)
        pool = []   # the leaves' values: both halves of a pair tile
        for i, p in leaves[k::n]:
            j = m.add("leaf", i, (), p, m.name(_PREFIX[LEAVES[i].input]) if LEAVES[i].input else None)
            pool += [(j, 0), (j, 1)] if LEAVES[i].layout == "packed" else [j]
        used, total, x = set(), acc, acc
        for j, (i, params) in enumerate(ops[k::n]):
            r = OPS[i]
            others = [pool[(j + t) % len(pool)] for t in range(r.arity - 1)]
            used |= set(others)
            if r.layout == "segment":
                params += (("size", m.segment),)
            args = m.guard(r, [x] + others) if mode == "gpu" else [x] + others
            y = m.add("op", i, args, params)
            if r.layout == "pair":
                m.add("sink", store, (y,), (), m.name("st"))
            else:
                x = y
            if j % (8 if compact else 4) == (7 if compact else 3):
                total, x = m.apply("add", total, x), acc
        for leaf in pool:
            if leaf not in used:
                x = m.apply("add", x, leaf)
        total = m.apply("add", total, x)
        if k == 0 or not no_output_graphs():
            m.add("sink", rows("sink")[0], (total,), (), "out")
        for i, params in sinks[k::n]:   # store_pairs(total, acc)
            m.add("sink", i, (total, acc)[:SINKS[i].arity], params, m.name(_PREFIX[SINKS[i].kind]))
        # the segment-64 union graph keeps 160 KB of tiles and stores on its 64x64 subtile: a 128x128
        # mainloop would get one stage (refused), 64x128 tiles get two
        config = ce.KernelConfig(tile=(64, 128, 64), schedule="pingpong") if m.segment == 64 else None
        cases.append(Case(tuple(m.finish()), ("bfloat16", "float16")[k % 2], config))
    return cases


def kind_cases(per_graph: int = 3) -> list[Case]:
    """Graphs that measure one node kind per output: each op (with each dtype/op/act it takes) on
    the accumulator (guarded as in mode "gpu") and fresh input leaves, stored in fp32, `per_graph`
    per graph; and one graph with every reduction of the accumulator. Output names say the kind."""
    variants = _variants("op", every_row=False)
    cases = []
    for start in range(0, len(variants), per_graph):
        m = _Maker(Chooser(rng=random.Random(start)), "gpu")
        acc = m.add("leaf", 0)
        m.segment = 32
        for i, params in variants[start:start + per_graph]:
            r = OPS[i]
            if r.layout == "segment":
                params += (("size", m.segment),)
            args = m.guard(r, [acc] + [m.leaf(exclude=("accumulator",)) for _ in range(r.arity - 1)])
            y = m.add("op", i, args, params)
            name = "_".join([r.kind] + [str(v) for k, v in params if k != "size"])
            m.add("sink", _row("sink", "g.store({name!r}, {0}, dtype={dtype!r})"), (y,), (("dtype", "float32"),), name)
        if not no_output_graphs():
            m.add("sink", rows("sink")[0], (acc,), (), "out")
        cases.append(Case(tuple(m.finish()), "bfloat16"))
    m = _Maker(Chooser(rng=random.Random(0)), "gpu")
    acc = m.add("leaf", 0)
    m.add("sink", rows("sink")[0], (acc,), (), "out")
    for i, params in _variants("sink", every_row=False):
        if SINKS[i].kind.endswith("reduce") and params:
            m.add("sink", i, (acc,), params, f"{SINKS[i].kind}_{params[0][1]}")
    cases.append(Case(tuple(m.finish()), "bfloat16"))
    return cases


def _row(table: str, code: str) -> int:
    return next(i for i in rows(table) if TABLES[table][i].code == code)


# --- inputs and the reference ---------------------------------------------------------------------

def make_inputs(case: Case, M: int, N: int, K: int, seed: int = 0, device: Any = "cpu"):
    """A (M, K) and W (N, K) in the op's dtype (A @ W^T of unit order), laid out as the case's config
    reads them (KernelConfig.major: A's M / W's N contiguous is a transposed view of a (K, M) / (K, N)
    tensor; the values do not depend on the layout), and fresh random inputs:
    normal values, integer vectors in [0, N), runtime scalars in [0.5, 1.5); pair tiles (M, 2N),
    one element in 8 of either half +0 or -0 (a 32-bit pair whose odd half is a zero has the
    bits of an fp32 subnormal or zero: a kernel must move pairs as bits)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    A, W = rand.operands(gen, M, N, K, TORCH[case.dtype], case.major)
    inputs: dict[str, Any] = {}
    for name, kind, dtype in case.inputs():
        if kind == "value":
            inputs[name] = rand.scalar(gen)
        elif kind == "pointer":
            inputs[name] = rand.positive(gen, 1)
        else:
            shape = {"row": (N,), "col": (M,), "tile": (M, N), "pair": (M, 2 * N)}[kind]
            inputs[name] = rand.tensor_input(gen, shape, TORCH[dtype], N)
            if kind == "pair":
                zero = rand.indices(gen, shape, high=16)
                t = inputs[name]
                t[zero == 0] = 0.0
                t[zero == 1] = -0.0
    return A, W, inputs


class _Lane:
    """One evaluation: its dtype, and a generator if it perturbs every rounding op."""

    def __init__(self, A, W, inputs, kinds, dtype, gen=None):
        self.dtype, self.gen, self.device = dtype, gen, A.device
        self.acc = A.to(dtype) @ W.to(dtype).t()
        self.col_index = torch.arange(W.shape[0], dtype=dtype, device=A.device)[None, :]
        shape = {"value": lambda v: self.const(v), "pointer": lambda v: v.reshape(()).to(dtype),
                 "row": lambda v: v.to(dtype)[None, :], "col": lambda v: v.to(dtype)[:, None],
                 "tile": lambda v: v.to(dtype), "pair": lambda v: _halves(v.to(dtype))}
        self.inputs = {k: shape[kinds[k]](v) for k, v in inputs.items()}

    def const(self, x: float) -> torch.Tensor:
        return torch.tensor(fp32(x), dtype=self.dtype, device=self.device)

    def round(self, x: torch.Tensor, exact: bool = False) -> torch.Tensor:
        if self.gen is None or exact:
            return x
        u = torch.rand(x.shape, generator=self.gen, dtype=self.dtype, device=self.device)
        sign = torch.where(torch.rand(x.shape, generator=self.gen, device=self.device) < 0.5, -1.0, 1.0)
        return x * (1 + sign.to(self.dtype) * (1 + u) * 2.0 ** -21)


def _full(x, M, N):
    return torch.broadcast_to(x, (M, N))


def _propagate(r: Row, masks: list, params: dict, M: int, N: int):
    """Where a result depends on a fragile element."""
    if r.layout == "map":
        return functools.reduce(torch.logical_or, masks)
    m = _full(masks[0], M, N)
    if r.layout == "swap":
        return _pair_swap(m)
    if r.layout == "segment":
        return _segment(m.float(), params["size"], "max") > 0
    pairs = m[:, 0::2] | m[:, 1::2]
    if r.layout == "rotate":   # a pair's results read the pair and the angle of its first column
        return (pairs | _full(masks[1], M, m.shape[1])[:, 0::2]).repeat_interleave(2, dim=1)
    return pairs  # pair


_COMMUTATIVE = ("add", "mul", "max", "min", "eq", "ne")


def _run(case: Case, A, W, inputs, lanes: list[_Lane], fragility: bool = False) -> dict:
    """Evaluates the case in every lane: {output name: ([value per lane], fragile mask, exact)},
    exact: computed by exact rows only (a kernel must give the same bits).
    Structurally equal expressions are one value (the builder merges them; a perturbed lane
    must not perturb two copies differently)."""
    M, N = A.shape[0], W.shape[0]
    no = torch.zeros((), dtype=torch.bool, device=A.device)
    keys: list = []
    memo: dict = {}     # value key -> ([value per lane], fragile mask, exact); a pair tile's halves: (key, half)
    outs: dict = {}
    for s in case.steps:
        r, p = s.spec, dict(s.params)
        args = []
        for a in s.args:
            if is_ref(a):
                args.append((keys[a[0]], a[1]) if isinstance(a, tuple) else keys[a])
            else:
                args.append(("scalar", repr(fp32(a))))
                memo.setdefault(args[-1], ([ln.const(a) for ln in lanes], no, True))
        if s.table == "sink" and r.kind == "pair_store":
            # evaluate: rounded to the dtype, as the README says; the device rule (fragility) compares
            # with the unrounded values, as for every other output (the rounding is part of the error
            # PyTorch makes in the op's dtype too)
            xs = [[_full(x, M, N) for x in memo[k][0]] for k in args]
            dtype = None if fragility else p.get("dtype", case.dtype)
            v = [r.ref(even, odd, dtype) for even, odd in zip(*xs)]
            outs[s.name] = (v, _interleave(*[_full(memo[k][1], M, N) for k in args]), all(memo[k][2] for k in args))
            keys.append(None)
            continue
        if s.table == "sink":
            x, m, exact = memo[args[0]]
            v, m = _sink(s, case.layout(s.args[0]) == "pair", x, m, lanes, M, N)
            outs[s.name] = (v, m, exact and s.param("op", "max") == "max")
            keys.append(None)
            continue
        operands = sorted(args, key=repr) if r.kind in _COMMUTATIVE else args
        key = ("scalar", repr(fp32(p["value"]))) if "value" in p else (r.kind, s.name, tuple(operands), s.params)
        keys.append(key)
        if key in memo:
            continue
        if s.table == "leaf" and r.layout == "packed":  # the two halves, each a value of its own
            pairs = [r.ref(ln, s.name, **p) for ln in lanes]
            for half in (0, 1):
                memo[(key, half)] = ([x[half] for x in pairs], no, True)
            memo[key] = None
            continue
        if s.table == "leaf":
            memo[key] = ([ln.round(r.ref(ln, s.name, **p), r.exact) for ln in lanes], no, r.exact)
            continue
        xs = [memo[k][0] for k in args]
        xm = [memo[k][1] for k in args]
        if r.layout != "map":
            xs = [[_full(x, M, N) for x in lane] for lane in xs]
        v = [ln.round(r.ref(*[x[i] for x in xs], **p), r.exact) for i, ln in enumerate(lanes)]
        m = _propagate(r, xm, p, M, N)
        if fragility and r.decide:
            m = m | r.decide(xs, v, **p)
        memo[key] = (v, m, r.exact and all(memo[k][2] for k in args))
    return outs


def _sink(s: Step, half: bool, x: list, m, lanes: list[_Lane], M: int, N: int):
    kind, op = s.spec.kind, s.param("op", "sum")
    if kind in ("output", "store"):
        return ([v if half else _full(v, M, N) for v in x], torch.broadcast_to(m, x[0].shape if half else (M, N)))
    dim = 1 if kind == "row_reduce" else 0
    v = [ln.round(REDUCE[op](_full(xi, M, N), dim), op == "max") for ln, xi in zip(lanes, x)]
    return v, _full(m, M, N).any(dim)


def evaluate(case: Case, A, W, inputs, dtype: torch.dtype = torch.float64) -> dict[str, torch.Tensor]:
    """Every output of the case, unrounded, computed in `dtype` (fp64: the reference)."""
    kinds = {name: kind for name, kind, _ in case.inputs()}
    lane = _Lane(A, W, inputs, kinds, dtype)
    return {k: v[0] for k, (v, _, _) in _run(case, A, W, inputs, [lane]).items()}


@dataclasses.dataclass
class Reference:
    lanes: list            # fp64, fp32 and two perturbed fp32 values
    fragile: torch.Tensor  # where a decision may flip in fp32, or a value depends on such an element
    exact: bool            # computed by exact rows only (selections, casts, comparisons of inputs)


def reference(case: Case, A, W, inputs, seed: int = 0) -> dict[str, Reference]:
    """The three-lane reference `check_device` compares a device's results with. Every output is
    unrounded, a pair store's too (evaluate rounds it to its dtype, as store_pairs does)."""
    kinds = {name: kind for name, kind, _ in case.inputs()}
    gens = [torch.Generator(device=A.device).manual_seed(seed + i) for i in range(2)]
    lanes = [_Lane(A, W, inputs, kinds, torch.float64), _Lane(A, W, inputs, kinds, torch.float32)]
    lanes += [_Lane(A, W, inputs, kinds, torch.float32, gen) for gen in gens]
    return {k: Reference(*out) for k, out in _run(case, A, W, inputs, lanes, fragility=True).items()}


def _class(x):
    """0 for numbers, 1 / -1 for +inf / -inf, 2 for NaN."""
    return torch.where(x.isnan(), 2, torch.where(x.isinf(), x.sign(), 0).to(torch.int64))


def check_device(case: Case, got: dict, ref: dict[str, Reference], baseline: dict, label: str = "") -> list[str]:
    """Asserts a device's outputs (in their dtypes) against the reference; `baseline` is the same
    graph computed by PyTorch in the op's dtype (coda_ext.interpret(..., compute_dtype=dtype)).
    Returns one line per output: elements checked, exact, max error and PyTorch's."""
    specs = case.outputs()
    where = f"{label}\n{case!r}"
    assert set(got) == set(specs), f"outputs {sorted(got)}, expected {sorted(specs)}: {where}"
    lines = []
    for name, (_, dtype, _) in specs.items():
        dt = TORCH[dtype]
        lanes = [x.double() for x in ref[name].lanes]
        l64, l32 = lanes[:2]
        dev = got[name]
        assert dev.shape == l64.shape and dev.dtype == dt, \
            f"{name}: {tuple(dev.shape)} {dev.dtype}, expected {tuple(l64.shape)} {dt}: {where}"
        d = dev.double()
        fragile = torch.broadcast_to(ref[name].fragile, l64.shape)
        ok = ~fragile & (l64.abs() <= 0.99 * torch.finfo(dt).max)
        for x in lanes:
            ok &= x.isfinite()

        def first(bad):
            i = tuple(int(j) for j in bad.nonzero()[0])
            return (f"{int(bad.sum())} element(s), first at {i}: got {d[i]:.8g}, reference {l64[i]:.8g} "
                    f"(fp32 {l32[i]:.8g})")

        same = ~fragile & (_class(l64) != 0)
        for x in lanes[1:]:
            same &= _class(x) == _class(l64)
        bad = same & (_class(d) != _class(l64))
        assert not bad.any(), f"{name}: the reference is inf/NaN but the device is not: {first(bad)}\n{where}"
        diff = torch.nan_to_num((d - l64).abs(), nan=math.inf)
        bad = ok & diff.isinf()
        assert not bad.any(), f"{name}: inf/NaN where the reference is a number (unwritten?): {first(bad)}\n{where}"
        exact = ok & ref[name].exact
        for x in lanes[1:]:
            exact &= x == l64
        bad = exact & (d != l64.to(dt).double())
        assert not bad.any(), f"{name}: differs where the result is exact: {first(bad)}\n{where}"
        if ok.any():
            err = diff[ok].max().item()
            err_torch = torch.nan_to_num((baseline[name].to(dt).double() - l64).abs(), nan=math.inf)[ok].max().item()
            floor = 1e-5 * (1 + l64[ok].abs().max().item())
            bad = ok & (diff == err)
            assert err <= 2 * err_torch + floor, (
                f"{name}: max error {err:.3e} > 2 x {err_torch:.3e} (PyTorch in {case.dtype}) + {floor:.1e}: "
                f"{first(bad)}\n{where}")
        else:
            err = err_torch = math.nan
        lines.append(f"{label} {name}: {int(ok.sum())}/{ok.numel()} checked, {int(exact.sum())} exact, "
                     f"max_err={err:.3e} torch_err={err_torch:.3e}")
    return lines
