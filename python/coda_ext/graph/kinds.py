"""The node kinds of the epilogue IR, one entry each: the registry every layer reads.

An entry gives a kind's name, its arity, its dtype rule, its reference semantics (the function the
interpreter runs, semantics.py), the C++ that implements it, its nominal cost and its flags. The
verifier checks graphs against it, the interpreter evaluates it, the emitter takes each element-wise
kind's functor from it, the IO model its flops and traffic (analysis/costs.py), and ir.py derives
its kind tuples (LEAF_KINDS, ..., ARITY) from it. tests/unit/test_node_kinds.py checks that every
layer covers exactly these kinds and that every C++ name exists in csrc/.

A new element-wise primitive is one entry here (flag "compute") plus its functor in
csrc/epilogues/functors.hpp (CODA_EPI_FUNCTOR); users reach it through a builder function
(graph/math.py), and the fuzz tables (tests/helpers/fuzz_strategies.py) ask for a row of it.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from . import semantics as sem
from .semantics import pointwise

#: Element types a stored or loaded tensor may have (names as in torch).
DTYPES = ("bfloat16", "float16", "float32")
#: Integer element types a row or column vector may have (targets, positions); the epilogue
#: converts them to fp32, exact below 2**24.
INT_DTYPES = ("int32", "int64")
#: Byte element types a tile or a store may have: integers 0..255, exact in fp32 (a store rounds to the nearest
#: and saturates). With hi16, lo8 and join24 an fp32 value lives in a bfloat16 and a uint8 tensor (3 bytes).
BYTE_DTYPES = ("uint8",)

#: Dtype rules: the element types a kind's `dtype` attribute may name.
DTYPE_RULES: dict[str, tuple[str, ...]] = {
    "fp32": (),                          # fp32 math in the epilogue; no dtype attribute
    "float": DTYPES,                     # a tensor it loads or stores: the op's dtype where none is given
    "tensor": DTYPES + BYTE_DTYPES,      # a tile or a store: also bytes; the op's dtype where none is given
    "float_or_int": DTYPES + INT_DTYPES,  # a vector: also integers (targets, positions)
    "pair16": ("bfloat16", "float16"),   # 16-bit pairs (one 32-bit element each): the op's where none is given
    "cast": DTYPES,                      # the dtype it rounds to, always given
    "input": (),                         # the element type of the pair tile it reads (set when lowering)
}
#: Rules whose dtype, where the graph gives none, is the op's (passes/resolve_dtypes.py).
OP_DEFAULT_RULES = ("float", "tensor", "float_or_int", "pair16")

#: Flags, and what each means.
FLAGS = {
    "input": "a runtime input the caller passes (it gets a launch slot)",
    "sink": "produces no value: the main output, a store or a reduction",
    "reduction": "a row or column reduction: fp32 partials per tile, finished by a finalize kernel",
    "compute": "emitted as Compute<Cfg, cpp>, cpp a functor of csrc/epilogues/functors.hpp",
    "commutative": "its operands may be swapped (the canonical form sorts them)",
    "compare": "1.0 where true, 0.0 where false",
    "packed": "packed pairs (M, N) of 32-bit elements: a pair tile feeds only unpack, a pack only pair_store",
    "pair": "half width (M x N/2): pairwise over adjacent columns (2i, 2i+1); can only be stored",
    "segment": "reads a whole segment of its row (every column of it in one epilogue subtile)",
    "lowered": "introduced by the lowering passes (codegen's plan for keep_first); never built by users",
}

#: Nominal flops of one special-function op plus its range reduction (exp, log, sqrt, tanh, sin, ...).
TRANSCENDENTAL = 4.0


@dataclasses.dataclass(frozen=True)
class Kind:
    """One node kind. flops: nominal fp32 flops per element of its result (1 per add, mul, compare or
    select, 2 per fma, TRANSCENDENTAL per special function, composites as the sum of their parts);
    0.0 where they depend on the node's op or activation (analysis/costs.py node_flops).
    cpp: for a "compute" kind its functor F (emitted as Compute<Cfg, F>), else the visitor node
    template of csrc/epilogues that implements it; None for the two kinds without a visitor of
    their own: output (D is the fusion's root value, which CUTLASS's collective epilogue stores)
    and pair_gate (lowered with its store into pair_gated_store)."""

    name: str
    arity: int | None        # inputs; None: any number (keep_first)
    dtype: str               # a DTYPE_RULES key
    interpret: Callable      # semantics.py: (env, node, *inputs) -> value (a sink: None)
    cpp: str | None
    flops: float
    flags: frozenset[str]


def _k(name: str, arity: int | None, dtype: str, interpret: Callable, cpp: str | None, flops: float,
       *flags: str) -> Kind:
    return Kind(name, arity, dtype, interpret, cpp, flops, frozenset(flags))


def _compare(fn: Callable) -> Callable:
    return pointwise(lambda a, b: fn(a, b).to(a.dtype))


_T = TRANSCENDENTAL

# Order matters: the derived tuples of ir.py keep it, and the canonical form orders sinks by it.
_ENTRIES = (
    # leaves: the GEMM accumulator and the runtime inputs of the epilogue
    _k("accumulator", 0, "fp32", sem.accumulator, "Accumulator", 0.0),
    _k("scalar", 0, "fp32", sem.scalar, "Scalar", 0.0),
    _k("row_vector", 0, "float_or_int", sem.row_vector, "RowVector", 0.0, "input"),
    _k("col_vector", 0, "float_or_int", sem.col_vector, "ColVector", 0.0, "input"),
    _k("tile", 0, "tensor", sem.tile, "TileLoad", 0.0, "input"),
    _k("col_index", 0, "fp32", sem.col_index, "ColIndex", 0.0),
    _k("pair_tile", 0, "pair16", sem.pair_tile, "TileLoad", 0.0, "input", "packed"),  # (M, 2N) read as N pairs
    # element-wise math, one input
    _k("neg", 1, "fp32", pointwise(torch.neg), "Neg", 1.0, "compute"),
    _k("abs", 1, "fp32", pointwise(torch.abs), "Abs", 1.0, "compute"),
    _k("exp", 1, "fp32", pointwise(torch.exp), "Exp", _T, "compute"),
    _k("log", 1, "fp32", pointwise(torch.log), "Log", _T, "compute"),
    _k("sqrt", 1, "fp32", pointwise(torch.sqrt), "Sqrt", _T, "compute"),
    _k("rsqrt", 1, "fp32", pointwise(torch.rsqrt), "Rsqrt", _T, "compute"),
    _k("square", 1, "fp32", pointwise(torch.square), "Square", 1.0, "compute"),
    _k("tanh", 1, "fp32", pointwise(torch.tanh), "Tanh", _T, "compute"),
    _k("sigmoid", 1, "fp32", pointwise(torch.sigmoid), "Sigmoid", _T + 2, "compute"),        # 1 / (1 + exp(-x))
    _k("silu", 1, "fp32", pointwise(F.silu), "Silu", _T + 3, "compute"),                     # x * sigmoid(x)
    _k("relu", 1, "fp32", pointwise(torch.relu), "Relu", 1.0, "compute"),
    _k("gelu_tanh", 1, "fp32", pointwise(lambda x: F.gelu(x, approximate="tanh")), "GeluTanh", _T + 7,
       "compute"),                                                 # 0.5 x (1 + tanh(c (x + 0.044715 x^3)))
    _k("gelu_erf", 1, "fp32", pointwise(lambda x: F.gelu(x, approximate="none")), "GeluErf", _T + 5,
       "compute"),                                                 # 0.5 x (1 + erf(x / sqrt 2)) = x Φ(x)
    _k("gelu_erf_grad", 1, "fp32", pointwise(sem.gelu_erf_grad), "GeluErfGrad", 2 * _T + 6,
       "compute"),                                                 # Φ(x) + x φ(x): GELU's derivative
    _k("gelu_tanh_grad", 1, "fp32", pointwise(sem.gelu_tanh_grad), "GeluTanhGrad", 2 * _T + 8,
       "compute"),                                                 # d/dx of the tanh form
    _k("cast", 1, "cast", sem.cast, "Cast", 1.0),
    _k("cos_turns", 1, "fp32", pointwise(lambda t: torch.cos(2 * math.pi * t)), "CosTurns", _T + 1, "compute"),
    _k("sin_turns", 1, "fp32", pointwise(lambda t: torch.sin(2 * math.pi * t)), "SinTurns", _T + 1, "compute"),
    # full width: y[:, 2i] = x[:, 2i+1], y[:, 2i+1] = x[:, 2i] (RoPE's partner column); a register shuffle
    _k("pair_swap", 1, "fp32", sem.pair_swap, "PairSwap", 0.0, "compute"),
    # one element (attr half: 0 even, 1 odd column) of each pair of a pair_tile; a shift or mask, and a widening
    _k("unpack", 1, "input", sem.unpack, "Unpack", 1.0),
    # an fp32 value rounded to 24 bits (8 exponent, 15 mantissa bits) and split: its top 16 bits as a value exact in
    # bfloat16, the next 8 as an integer 0..255 exact in uint8; join24 puts the two back together (integer ops)
    _k("hi16", 1, "fp32", pointwise(sem.hi16), "Hi16", 3.0, "compute"),
    _k("lo8", 1, "fp32", pointwise(sem.lo8), "Lo8", 4.0, "compute"),
    # element-wise math, two inputs
    _k("add", 2, "fp32", pointwise(torch.add), "Add", 1.0, "compute", "commutative"),
    _k("sub", 2, "fp32", pointwise(torch.sub), "Sub", 1.0, "compute"),
    _k("mul", 2, "fp32", pointwise(torch.mul), "Mul", 1.0, "compute", "commutative"),
    _k("div", 2, "fp32", pointwise(torch.div), "Div", 1.0, "compute"),
    _k("max", 2, "fp32", pointwise(torch.maximum), "Max", 1.0, "compute", "commutative"),
    _k("min", 2, "fp32", pointwise(torch.minimum), "Min", 1.0, "compute", "commutative"),
    _k("join24", 2, "fp32", pointwise(sem.join24), "Join24", 3.0, "compute"),
    # rotate_pairs(x, t): each pair (x[2i], x[2i+1]) rotated by 2π·t[2i] (RoPE), full width;
    # a cos and a sin per pair, two products and a sum
    _k("rotate_pairs", 2, "fp32", sem.rotate_pairs, "RotatePairs", _T + 3, "compute"),
    _k("eq", 2, "fp32", _compare(torch.eq), "Eq", 1.0, "compute", "compare", "commutative"),
    _k("ne", 2, "fp32", _compare(torch.ne), "Ne", 1.0, "compute", "compare", "commutative"),
    _k("lt", 2, "fp32", _compare(torch.lt), "Lt", 1.0, "compute", "compare"),
    _k("le", 2, "fp32", _compare(torch.le), "Le", 1.0, "compute", "compare"),
    _k("gt", 2, "fp32", _compare(torch.gt), "Gt", 1.0, "compute", "compare"),
    _k("ge", 2, "fp32", _compare(torch.ge), "Ge", 1.0, "compute", "compare"),
    # element-wise math, three inputs
    _k("fma", 3, "fp32", pointwise(lambda a, b, c: a * b + c), "Fma", 2.0, "compute"),
    _k("where", 3, "fp32", pointwise(lambda c, a, b: torch.where(c != 0, a, b)), "Where", 1.0, "compute"),
    # frac(pos · (hi + lo)) in turns: product, FMA error recovery, fractional part
    _k("turns", 3, "fp32", sem.turns, "Turns", 5.0, "compute"),
    # pack(a, b): the pairs a pair_store writes as (M, 2N), columns interleaved; two roundings and a shift-or
    _k("pack", 2, "pair16", sem.pack, "Pack", 2.0, "packed"),
    # act(x[:, 2i]) * x[:, 2i+1] (flops: its activation's and the product)
    _k("pair_gate", 1, "fp32", sem.pair_gate, None, 0.0, "pair"),
    # segment_reduce(x; size, op): each segment's reduction broadcast back (flops: by op)
    _k("segment_reduce", 1, "fp32", sem.segment_reduce, "SegmentReduce", 0.0, "segment"),
    # sinks, in the order the canonical form sorts them
    _k("output", 1, "fp32", sem.store, None, 0.0, "sink"),
    _k("store", 1, "tensor", sem.store, "TileStore", 0.0, "sink"),
    _k("row_reduce", 1, "fp32", sem.row_reduce, "RowReduce", 0.0, "sink", "reduction"),
    _k("col_reduce", 1, "fp32", sem.col_reduce, "ColReduce", 0.0, "sink", "reduction"),
    _k("pair_store", 1, "pair16", sem.pair_store, "TileStore", 0.0, "sink"),  # (M, 2N): 32-bit pairs
    # introduced by lowering: store(pair_gate(x)) and the root that keeps side outputs alive
    _k("pair_gated_store", 1, "float", sem.pair_gated_store, "PairGatedStore", 0.0, "sink", "pair", "lowered"),
    _k("keep_first", None, "fp32", sem.keep_first, "KeepFirst", 0.0, "compute", "lowered"),
)

#: Every node kind by name, in registry order.
KINDS: dict[str, Kind] = {k.name: k for k in _ENTRIES}


def with_flag(flag: str, *, without: str | None = None) -> tuple[str, ...]:
    """The kinds that have `flag` (and not `without`), in registry order."""
    return tuple(k.name for k in KINDS.values() if flag in k.flags and (without is None or without not in k.flags))
