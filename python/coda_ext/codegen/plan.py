"""plan: arranges a lowered graph as CUTLASS visitors will run it.

Sinks (stores, reductions, pair stores) pass their input through, so each sink is threaded onto the
value it consumes: consumers of that value read the last sink of its chain. A value whose chain
feeds nothing else (a side output) is kept alive by a `keep_first` root that returns D and ignores
the rest (in a graph without D, the root's value is dropped). If, after that, every value has at
most one consumer, the graph is a tree (Sm90EVT); otherwise it is emitted as one
Sm90TopologicalVisitor. Leaves that cost nothing to repeat (the accumulator, scalars) are duplicated
per use.
"""
from __future__ import annotations

import dataclasses

from ..graph import ir

_FREE_LEAVES = ("accumulator", "scalar")


@dataclasses.dataclass(frozen=True)
class Op:
    """One visitor: the IR node it implements and the ops it reads (indices into Plan.ops)."""

    node: int              # index into the lowered graph (-1 for the synthetic keep_first root)
    kind: str
    children: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Plan:
    ops: tuple[Op, ...]    # topological order; the last op is the root (its value is D)
    is_tree: bool


def plan(graph: ir.GraphIR) -> Plan:
    nodes = graph.nodes
    out_nodes = graph.find("output")

    # Sinks attached to each value node, in node order (the chain order).
    attached: dict[int, list[int]] = {}
    for i, n in enumerate(nodes):
        if n.is_sink and n.kind != "output":
            attached.setdefault(n.inputs[0], []).append(i)

    ops: list[Op] = []
    chain_end: dict[int, int] = {}  # value node -> op index of the end of its chain

    def emit_value(i: int) -> int:
        n = nodes[i]
        kids = tuple(value_op(j) for j in n.inputs)
        ops.append(Op(i, n.kind, kids))
        end = len(ops) - 1
        for s in attached.get(i, []):
            ops.append(Op(s, nodes[s].kind, (end,)))
            end = len(ops) - 1
        return end

    def value_op(i: int) -> int:
        n = nodes[i]
        if n.kind in _FREE_LEAVES and i not in attached:
            ops.append(Op(i, n.kind, ()))          # repeated per use: no sharing
            return len(ops) - 1
        if i not in chain_end:
            chain_end[i] = emit_value(i)
        return chain_end[i]

    d_end = value_op(nodes[out_nodes[0]].inputs[0]) if out_nodes else None
    for i in sorted(attached):        # side chains that D does not reach
        value_op(i)
    dangling = tuple(e for e in sorted(set(chain_end.values())) if _uses(ops)[e] == 0 and e != d_end)
    if d_end is None and len(dangling) == 1:
        pass                          # no D: the one side chain is the root (its value is dropped)
    elif d_end is None:
        ops.append(Op(-1, "keep_first", dangling))
    elif dangling:
        ops.append(Op(-1, "keep_first", (d_end,) + dangling))
    return Plan(tuple(ops), is_tree=all(u <= 1 for u in _uses(ops)))


def _uses(ops: list[Op]) -> list[int]:
    """How many ops read each op."""
    uses = [0] * len(ops)
    for op in ops:
        for c in op.children:
            uses[c] += 1
    return uses
