"""resolve_dtypes: gives every input and store without an explicit dtype the op's dtype."""
from __future__ import annotations

from ..graph import ir

_HAS_DTYPE = ir.INPUT_KINDS + ("store", "pack", "pair_store")


def resolve_dtypes(graph: ir.GraphIR, dtype: str) -> ir.GraphIR:
    """Also gives each unpack the element dtype of the pair_tile it reads (the kernel needs it)."""
    nodes: list[ir.Node] = []
    for n in graph.nodes:
        want = nodes[n.inputs[0]].attr("dtype") if n.kind == "unpack" else dtype
        if (n.kind in _HAS_DTYPE or n.kind == "unpack") and n.attr("dtype") is None:
            attrs = dict(n.attrs)
            attrs["dtype"] = want
            n = ir.Node(n.kind, n.inputs, ir.make_attrs(**attrs))
        nodes.append(n)
    return ir.GraphIR(tuple(nodes))
