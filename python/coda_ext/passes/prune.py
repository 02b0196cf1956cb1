"""prune: drops nodes that feed no sink and renumbers the rest (order kept)."""
from __future__ import annotations

from ..graph import ir


def prune(graph: ir.Graph) -> ir.Graph:
    live = [False] * len(graph)
    for i in range(len(graph) - 1, -1, -1):
        if graph[i].is_sink:
            live[i] = True
        if live[i]:
            for j in graph[i].inputs:
                live[j] = True
    index: dict[int, int] = {}
    nodes = []
    for i, n in enumerate(graph.nodes):
        if live[i]:
            index[i] = len(nodes)
            nodes.append(ir.Node(n.kind, tuple(index[j] for j in n.inputs), n.attrs))
    return ir.Graph(tuple(nodes))
