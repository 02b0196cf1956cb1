"""fold_square_reduce: reduce(sum, x * x) -> reduce(sumsq, x).

A sum of squares becomes one reduction that squares as it accumulates and passes x itself
through, so x can stay on the main path of the tree (no shared subexpression). Applies when
the square feeds only that reduction.
"""
from __future__ import annotations

from ..graph import ir
from .prune import prune


def squared(node: ir.Node) -> int | None:
    """x where node is x * x (square(x) or mul(x, x)), else None."""
    if node.kind == "square":
        return node.inputs[0]
    if node.kind == "mul" and node.inputs[0] == node.inputs[1]:
        return node.inputs[0]
    return None


def fold_square_reduce(graph: ir.GraphIR) -> ir.GraphIR:
    consumers = graph.consumers()
    nodes = list(graph.nodes)
    for i, n in enumerate(nodes):
        if n.kind in ("row_reduce", "col_reduce") and n.attr("op") == "sum":
            src = n.inputs[0]
            base = squared(nodes[src])
            if base is not None and len(consumers[src]) == 1:
                attrs = dict(n.attrs)
                attrs["op"] = "sumsq"
                nodes[i] = ir.Node(n.kind, (base,), ir.make_attrs(**attrs))
    return prune(ir.GraphIR(tuple(nodes)))
