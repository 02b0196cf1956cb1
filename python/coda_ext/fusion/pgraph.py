"""The graph the partitioner sees: plain data, no FX, so partitions are tested on hand-made graphs.

Every value of the model's graph is one PNode: a GEMM (a possible epilogue anchor), element-wise math
or a reduction an epilogue can run, an input, or anything else. Views that only re-shape a value
without changing its rows and columns are not nodes of their own: they are their source.

A node's frame is (M, N): the GEMM output's rows and columns, or the rows and columns of a value of
element-wise math (all leading dims are rows), or of the input a reduction reduces. An epilogue
holds the nodes of one frame.
"""
from __future__ import annotations

import dataclasses

#: Kinds of PNode.
OPS = ("gemm", "math", "reduce", "input", "other")
#: How an epilogue reads an operand produced outside it: an (M, N) tile, a length-N row vector, a
#: length-M column vector, a one-element scalar, a constant, the column index; None: it cannot be
#: read from memory (a bool tile, a shape that is none of these), so its producer must be in the
#: same epilogue.
ROLES = ("tile", "row", "col", "scalar", "const", "col_index", None)


@dataclasses.dataclass(frozen=True)
class Operand:
    src: int | None     # the PNode read (None for constants and the column index)
    role: str | None    # how an epilogue would load it if src is outside the epilogue (ROLES)


@dataclasses.dataclass(frozen=True)
class PNode:
    id: int
    name: str                         # the FX node's name
    op: str                           # OPS
    target: str                       # the ATen op, for reports
    operands: tuple[Operand, ...]
    nbytes: int                       # the value's size in memory
    frame: tuple[int, int] | None = None
    axis: str | None = None           # reductions: "row" (over N) or "col" (over M)
    reduce_op: str | None = None      # reductions: sum, max, logsumexp
    storable: bool = True             # an epilogue can write the value (a float dtype)
    output: bool = False              # the graph returns it
    backward: bool = False            # it depends on a tangent (backward part of a joint graph)
    forward: bool = True              # the forward pass needs it (it feeds a forward output)
    reason: str | None = None         # why it cannot be in an epilogue (op "other", refused GEMMs)


@dataclasses.dataclass(frozen=True)
class PGraph:
    """Nodes in topological order (operands of node i come before it)."""

    nodes: tuple[PNode, ...]

    def __len__(self) -> int:
        return len(self.nodes)

    def __getitem__(self, i: int) -> PNode:
        return self.nodes[i]

    def consumers(self) -> list[list[int]]:
        """consumers()[i]: the nodes that read node i (each once, in order)."""
        out: list[list[int]] = [[] for _ in self.nodes]
        for n in self.nodes:
            for s in dict.fromkeys(o.src for o in n.operands if o.src is not None):
                out[s].append(n.id)
        return out

    def sources(self, i: int) -> list[int]:
        """The nodes node i reads (each once)."""
        return list(dict.fromkeys(o.src for o in self.nodes[i].operands if o.src is not None))

    def anchors(self) -> list[int]:
        return [n.id for n in self.nodes if n.op == "gemm"]
