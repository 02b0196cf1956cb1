"""The epilogue-graph IR: one immutable node type and an immutable graph.

A graph is a tuple of nodes in topological order; a node names its inputs by position.
Nodes are frozen dataclasses with structural equality, so graphs are hashable and two
structurally equal graphs compare (and hash) equal. `canonicalize` (in canonical.py) gives
every graph one canonical node order, which is what makes emitted C++ byte-identical.
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

# --- node kinds -------------------------------------------------------------------------

#: Leaves: the GEMM accumulator and the runtime inputs of the epilogue.
LEAF_KINDS = ("accumulator", "scalar", "row_vector", "col_vector", "tile", "col_index", "pair_tile")
#: Element-wise math, by arity.
UNARY_KINDS = (
    "neg", "abs", "exp", "log", "sqrt", "rsqrt", "square", "tanh", "sigmoid", "silu", "relu",
    "gelu_tanh", "gelu_erf", "cast", "cos_turns", "sin_turns",
    "pair_swap",  # full width: y[:, 2i] = x[:, 2i+1], y[:, 2i+1] = x[:, 2i] (RoPE's partner column)
    "unpack",     # one element (attr half: 0 even, 1 odd column) of each pair of a pair_tile
)
#: Comparisons give 1.0 where true and 0.0 where false.
COMPARE_KINDS = ("eq", "ne", "lt", "le", "gt", "ge")
#: rotate_pairs(x, t): each adjacent pair (x[2i], x[2i+1]) rotated by 2π·t[2i] (RoPE), full width.
BINARY_KINDS = ("add", "sub", "mul", "div", "max", "min", "rotate_pairs") + COMPARE_KINDS
TERNARY_KINDS = ("fma", "where", "turns")
#: Packed pairs: a pair_tile input (M, 2N) is read as N pairs per row (a 32-bit container of two
#: 16-bit elements keeps the tile N wide); unpack gives either element, pack(a, b) makes the
#: pairs a pair_store writes as (M, 2N), columns interleaved (a, b). Packed values feed only
#: unpack (pair_tile) or pair_store (pack).
PACKED_KINDS = ("pair_tile", "pack")
COMMUTATIVE_KINDS = ("add", "mul", "max", "min", "eq", "ne")
#: Values that read a whole segment of their row (every column of it must be in the same
#: epilogue subtile): segment_reduce(x; size, op) broadcasts each segment's reduction back.
SEGMENT_KINDS = ("segment_reduce",)
#: Project visitor nodes: pairwise ops on adjacent columns (2i, 2i+1) -> half width.
PAIR_KINDS = ("pair_gate",)
#: Sinks: the main output D, aux stores and reductions. They produce no value.
SINK_KINDS = ("output", "store", "row_reduce", "col_reduce", "pair_store")
#: Kinds introduced by lowering passes (never built by users).
LOWERED_KINDS = ("pair_gated_store", "keep_first")

ARITY = {
    **{k: 0 for k in LEAF_KINDS},
    **{k: 1 for k in UNARY_KINDS},
    **{k: 2 for k in BINARY_KINDS},
    **{k: 3 for k in TERNARY_KINDS},
    "pack": 2,
    **{k: 1 for k in PAIR_KINDS},
    **{k: 1 for k in SEGMENT_KINDS},
    **{k: 1 for k in SINK_KINDS},
    "pair_gated_store": 1,
}

#: Inputs supplied by the caller at run time (they get launch slots).
INPUT_KINDS = ("row_vector", "col_vector", "tile", "pair_tile")
#: Reduction ops a row/col reduction supports (logsumexp: row reductions only; a segment
#: reduction takes sum, max or sumsq).
REDUCE_OPS = ("sum", "max", "sumsq", "logsumexp")
ROW_ONLY_REDUCE_OPS = ("logsumexp",)
#: Gate activations of pair_gate.
PAIR_ACTIVATIONS = ("silu", "sigmoid", "relu", "gelu_tanh", "gelu_erf")
#: Element types a stored or loaded tensor may have (names as in torch).
DTYPES = ("bfloat16", "float16", "float32")
#: Integer element types a row or column vector may have (targets, positions); the epilogue
#: converts them to fp32, exact below 2**24.
INT_DTYPES = ("int32", "int64")
#: Scalar modes: a value fixed at compile time, a runtime float, or a device pointer.
SCALAR_MODES = ("constant", "value", "pointer")

Attrs = tuple[tuple[str, Any], ...]


def make_attrs(**kwargs: Any) -> Attrs:
    """Attributes as a sorted tuple of (key, value), dropping None values."""
    return tuple(sorted((k, v) for k, v in kwargs.items() if v is not None))


@dataclasses.dataclass(frozen=True, eq=False)
class Node:
    """One operation: its kind, the positions of its inputs, and its attributes.

    Equality and hashing go through repr(attrs), so constants that compare equal as floats
    but differ in meaning (0.0 and -0.0) are different nodes."""

    kind: str
    inputs: tuple[int, ...] = ()
    attrs: Attrs = ()

    def _key(self) -> tuple:
        return (self.kind, self.inputs, repr(self.attrs))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Node) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def attr(self, key: str, default: Any = None) -> Any:
        for k, v in self.attrs:
            if k == key:
                return v
        return default

    @property
    def name(self) -> str | None:
        return self.attr("name")

    @property
    def is_sink(self) -> bool:
        return self.kind in SINK_KINDS or self.kind == "pair_gated_store"

    def describe(self, index: int | None = None) -> str:
        where = f"node {index} " if index is not None else ""
        label = f" {self.name!r}" if self.name else ""
        return f"{where}({self.kind}{label})"


@dataclasses.dataclass(frozen=True)
class GraphIR:
    """An epilogue graph: nodes in topological order (inputs of node i are all < i)."""

    nodes: tuple[Node, ...]

    def __len__(self) -> int:
        return len(self.nodes)

    def __getitem__(self, i: int) -> Node:
        return self.nodes[i]

    def consumers(self) -> list[list[int]]:
        """consumers()[i] lists the nodes that read node i, in order (repeats kept)."""
        out: list[list[int]] = [[] for _ in self.nodes]
        for j, node in enumerate(self.nodes):
            for i in node.inputs:
                out[i].append(j)
        return out

    def live(self) -> list[bool]:
        """live()[i]: node i is a sink or feeds one (the one liveness walk: verify and prune use it)."""
        live = [False] * len(self.nodes)
        for i in range(len(self.nodes) - 1, -1, -1):
            if self.nodes[i].is_sink:
                live[i] = True
            if live[i]:
                for j in self.nodes[i].inputs:
                    live[j] = True
        return live

    def find(self, kind: str) -> list[int]:
        return [i for i, n in enumerate(self.nodes) if n.kind == kind]

    def named(self, name: str) -> int:
        for i, n in enumerate(self.nodes):
            if n.name == name and (n.kind in INPUT_KINDS or n.kind == "scalar" or n.is_sink):
                return i
        raise KeyError(name)

    def text(self) -> str:
        """A readable, deterministic listing (also the basis of the digest)."""
        lines = []
        for i, n in enumerate(self.nodes):
            args = ", ".join(f"%{j}" for j in n.inputs)
            attrs = ", ".join(f"{k}={v!r}" for k, v in n.attrs)
            sep = "; " if args and attrs else ""
            lines.append(f"%{i} = {n.kind}({args}{sep}{attrs})")
        return "\n".join(lines)

    def digest(self) -> str:
        return hashlib.sha256(self.text().encode()).hexdigest()[:16]

    # --- interface: runtime inputs and outputs, in slot order ---------------------------

    def input_nodes(self) -> list[int]:
        """Runtime inputs (vectors, tiles, runtime scalars), sorted by name."""
        idx = [
            i for i, n in enumerate(self.nodes)
            if n.kind in INPUT_KINDS or (n.kind == "scalar" and n.attr("mode") != "constant")
        ]
        return sorted(idx, key=lambda i: self.nodes[i].name)

    def output_nodes(self) -> list[int]:
        """Sinks other than D that produce a tensor (stores, reductions), sorted by name."""
        idx = [i for i, n in enumerate(self.nodes) if n.is_sink and n.kind != "output"]
        return sorted(idx, key=lambda i: self.nodes[i].name)

    def slots(self) -> list[int]:
        """Launch slot order: inputs, then outputs (names are unique across both)."""
        return self.input_nodes() + self.output_nodes()
