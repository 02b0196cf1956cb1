"""prune: drops nodes that feed no sink and renumbers the rest (order kept)."""
from __future__ import annotations

from ..graph import ir


def prune(graph: ir.GraphIR) -> ir.GraphIR:
    live = graph.live()
    index: dict[int, int] = {}
    nodes = []
    for i, n in enumerate(graph.nodes):
        if live[i]:
            index[i] = len(nodes)
            nodes.append(ir.Node(n.kind, tuple(index[j] for j in n.inputs), n.attrs))
    return ir.GraphIR(tuple(nodes))
