"""lower_pair_stores: store(pair_gate(x)) -> pair_gated_store(x).

The half-width result of a pair op is never a tile of the main tree: the project node
Sm90PairGatedStore combines the column pairs of x and writes the half-width tensor itself,
passing x through.
"""
from __future__ import annotations

from ..graph import ir
from .prune import prune


def lower_pair_stores(graph: ir.GraphIR) -> ir.GraphIR:
    nodes = list(graph.nodes)
    for i, n in enumerate(nodes):
        if n.kind == "store" and nodes[n.inputs[0]].kind == "pair_gate":
            gate = nodes[n.inputs[0]]
            attrs = ir.make_attrs(name=n.name, dtype=n.attr("dtype"), act=gate.attr("act"))
            nodes[i] = ir.Node("pair_gated_store", gate.inputs, attrs)
    return prune(ir.GraphIR(tuple(nodes)))
