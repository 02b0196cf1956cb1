"""canonicalize: one canonical form per graph, so equal graphs emit byte-identical C++.

- drops values that feed no sink;
- merges structurally equal nodes (common subexpressions);
- orders the operands of commutative ops by their structure;
- numbers nodes by a post-order walk from the sinks, sinks sorted by (kind, name).
Names come from canonical position only, never from creation order.
"""
from __future__ import annotations

import hashlib
from typing import Any

from . import ir

_SINK_ORDER = {k: i for i, k in enumerate(ir.SINK_KINDS + ("pair_gated_store",))}


def canonicalize(graph: ir.GraphIR) -> ir.GraphIR:
    nodes = graph.nodes
    keys: list[str] = []
    for n in nodes:
        child = [keys[j] for j in n.inputs]
        if n.kind in ir.COMMUTATIVE_KINDS:
            child.sort()
        keys.append(hashlib.sha1(repr((n.kind, n.attrs, tuple(child))).encode()).hexdigest())

    def operands(i: int) -> list[int]:
        ins = list(nodes[i].inputs)
        if nodes[i].kind in ir.COMMUTATIVE_KINDS:
            ins.sort(key=lambda j: keys[j])
        return ins

    sinks = [i for i, n in enumerate(nodes) if n.is_sink]
    sinks.sort(key=lambda i: (_SINK_ORDER[nodes[i].kind], nodes[i].name or "", keys[i]))

    new_index: dict[str, int] = {}
    out: list[ir.Node] = []

    def visit(i: int) -> int:
        # Iterative post-order walk (graphs can be deep chains).
        stack = [(i, False)]
        while stack:
            j, expanded = stack.pop()
            if keys[j] in new_index:
                continue
            if not expanded:
                stack.append((j, True))
                stack.extend((c, False) for c in reversed(operands(j)) if keys[c] not in new_index)
                continue
            ins = tuple(new_index[keys[c]] for c in operands(j))
            out.append(ir.Node(nodes[j].kind, ins, nodes[j].attrs))
            new_index[keys[j]] = len(out) - 1
        return new_index[keys[i]]

    for s in sinks:
        visit(s)
    return ir.GraphIR(tuple(out))


def as_ir(graph: Any) -> ir.GraphIR:
    """The verified, canonical IR of a builder Graph or of an ir.GraphIR (the one conversion every
    entry point — compile, interpret, explain — goes through)."""
    if isinstance(graph, ir.GraphIR):
        from .verify import verify

        return canonicalize(verify(graph))
    if hasattr(graph, "build"):
        return graph.build()
    raise TypeError(f"expected a coda_ext.Graph or its built IR, got {type(graph).__name__}")
