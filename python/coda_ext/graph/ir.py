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

from .kinds import BYTE_DTYPES, DTYPES, INT_DTYPES, KINDS, with_flag  # noqa: F401  (the dtype lists: ir's names)

# --- node kinds: derived from the registry (kinds.py), in its order ----------------------------

#: Leaves: the GEMM accumulator and the runtime inputs of the epilogue.
LEAF_KINDS = tuple(k.name for k in KINDS.values() if k.arity == 0)
_MATH = [k for k in KINDS.values() if not k.flags & {"sink", "pair", "segment", "packed", "lowered"}]
#: Element-wise math, by arity (pair_swap and rotate_pairs are full width; unpack reads a pair_tile).
UNARY_KINDS = tuple(k.name for k in _MATH if k.arity == 1)
#: Comparisons give 1.0 where true and 0.0 where false.
COMPARE_KINDS = with_flag("compare")
BINARY_KINDS = tuple(k.name for k in _MATH if k.arity == 2)
TERNARY_KINDS = tuple(k.name for k in _MATH if k.arity == 3)
#: Packed pairs: a pair_tile input (M, 2N) is read as N pairs per row (a 32-bit container of two
#: 16-bit elements keeps the tile N wide); unpack gives either element, pack(a, b) makes the
#: pairs a pair_store writes as (M, 2N), columns interleaved (a, b). Packed values feed only
#: unpack (pair_tile) or pair_store (pack).
PACKED_KINDS = with_flag("packed")
COMMUTATIVE_KINDS = with_flag("commutative")
#: Values that read a whole segment of their row (every column of it must be in the same
#: epilogue subtile): segment_reduce(x; size, op) broadcasts each segment's reduction back.
SEGMENT_KINDS = with_flag("segment")
#: Project visitor nodes: pairwise ops on adjacent columns (2i, 2i+1) -> half width.
PAIR_KINDS = with_flag("pair", without="lowered")
#: Sinks: the main output D, aux stores and reductions. They produce no value.
SINK_KINDS = with_flag("sink", without="lowered")
#: Kinds introduced by lowering passes (never built by users).
LOWERED_KINDS = with_flag("lowered")
#: Inputs of every kind of fixed arity (keep_first takes any number).
ARITY = {k.name: k.arity for k in KINDS.values() if k.arity is not None}
#: Inputs supplied by the caller at run time (they get launch slots).
INPUT_KINDS = with_flag("input")
_SINKS = frozenset(with_flag("sink"))

#: Reduction ops a row/col reduction supports (logsumexp: row reductions only; a segment
#: reduction takes sum, max or sumsq).
REDUCE_OPS = ("sum", "max", "sumsq", "logsumexp")
ROW_ONLY_REDUCE_OPS = ("logsumexp",)
#: Gate activations of pair_gate.
PAIR_ACTIVATIONS = ("silu", "sigmoid", "relu", "gelu_tanh", "gelu_erf")
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
        return self.kind in _SINKS

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
