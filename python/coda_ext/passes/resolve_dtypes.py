"""resolve_dtypes: gives every input and store without an explicit dtype the op's dtype."""
from __future__ import annotations

from ..graph import ir

_HAS_DTYPE = ir.INPUT_KINDS + ("store",)


def resolve_dtypes(graph: ir.Graph, dtype: str) -> ir.Graph:
    nodes = []
    for n in graph.nodes:
        if n.kind in _HAS_DTYPE and n.attr("dtype") is None:
            attrs = dict(n.attrs)
            attrs["dtype"] = dtype
            n = ir.Node(n.kind, n.inputs, ir.make_attrs(**attrs))
        nodes.append(n)
    return ir.Graph(tuple(nodes))
