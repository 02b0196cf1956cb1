"""resolve_dtypes: gives every input and store without an explicit dtype the op's dtype."""
from __future__ import annotations

from ..graph import ir
from ..graph.kinds import KINDS, OP_DEFAULT_RULES


def resolve_dtypes(graph: ir.GraphIR, dtype: str) -> ir.GraphIR:
    """Each kind's dtype rule (graph/kinds.py) says which nodes take the op's dtype; each unpack
    takes the element dtype of the pair_tile it reads (the kernel needs it)."""
    nodes: list[ir.Node] = []
    for n in graph.nodes:
        rule = KINDS[n.kind].dtype
        want = nodes[n.inputs[0]].attr("dtype") if rule == "input" else dtype
        if (rule in OP_DEFAULT_RULES or rule == "input") and n.attr("dtype") is None:
            attrs = dict(n.attrs)
            attrs["dtype"] = want
            n = ir.Node(n.kind, n.inputs, ir.make_attrs(**attrs))
        nodes.append(n)
    return ir.GraphIR(tuple(nodes))
