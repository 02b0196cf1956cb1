"""tanh_sigmoid: 1 + tanh(u) -> 2 s and 1 - tanh(u)² -> 4 s (1 - s), with s = sigmoid(2u).

The tanh-approximated GELU written out in Python (0.5 x (1 + tanh(u)) and its derivative, which
reads 1 - tanh²) spends most of its epilogue math in tanh: about fourteen instructions per element
(two MUFU ops, a polynomial for |u| < 0.6, selects) against four for the sigmoid (ex2, rcp, two
FMAs). Where the epilogue's math outlasts a short mainloop (K = 768) that is GEMM time. The
rewritten forms are exact identities and more accurate in fp32: 1 + tanh(u) cancels where u << 0,
1 - tanh² where |u| is large; 2 s and s (1 - s) do not (1 - s loses only where s > 1/2, where
4 s (1 - s) = 1 - tanh² is the same absolute error as before). A tanh with any other reader stays as it
is (rewriting the rest would add the sigmoid to it). The reference interpreter runs the graph as written.
"""
from __future__ import annotations

from ..graph import ir
from .fold_square_reduce import squared
from .prune import prune


def _const(node: ir.Node, value: float) -> bool:
    return node.kind == "scalar" and node.attr("mode") == "constant" and node.attr("value") == value


def _scalar(value: float) -> ir.Node:
    return ir.Node("scalar", (), ir.make_attrs(mode="constant", value=value))


def _rewrites(graph: ir.GraphIR) -> dict[int, tuple[str, int]]:
    """{consumer index: ("plus", tanh index) for 1 + t, ("one_minus_sq", tanh index) for 1 - t²}, for each tanh
    whose every reader is one of these forms (else the tanh would stay and the sigmoid add to it)."""
    nodes, consumers = graph.nodes, graph.consumers()
    out: dict[int, tuple[str, int]] = {}
    for t, n in enumerate(nodes):
        if n.kind != "tanh":
            continue
        found: dict[int, tuple[str, int]] = {}
        covered = True
        for c in consumers[t]:
            cn = nodes[c]
            if cn.kind == "add" and len(set(cn.inputs)) == 2 and \
                    _const(nodes[cn.inputs[1] if cn.inputs[0] == t else cn.inputs[0]], 1.0):
                found[c] = ("plus", t)
            elif squared(cn) == t:
                subs = [s for s in consumers[c] if nodes[s].kind == "sub" and nodes[s].inputs[1] == c
                        and _const(nodes[nodes[s].inputs[0]], 1.0)]
                covered &= len(subs) == len(consumers[c])
                found.update(dict.fromkeys(subs, ("one_minus_sq", t)))
            else:
                covered = False
        if covered and found:
            out.update(found)
    return out


def tanh_sigmoid(graph: ir.GraphIR) -> ir.GraphIR:
    rewrites = _rewrites(graph)
    if not rewrites:
        return graph
    wanted: dict[int, set[str]] = {}
    for form, t in rewrites.values():
        wanted.setdefault(t, set()).add(form)
    out: list[ir.Node] = []
    index: dict[int, int] = {}       # old node -> new node giving its value
    forms: dict[tuple[int, str], int] = {}

    def add(node: ir.Node) -> int:
        out.append(node)
        return len(out) - 1

    for i, n in enumerate(graph.nodes):
        if i in rewrites:
            form, t = rewrites[i]
            index[i] = forms[(t, form)]
            continue
        index[i] = add(ir.Node(n.kind, tuple(index[j] for j in n.inputs), n.attrs))
        if i in wanted:   # s = sigmoid(2u), after u (the tanh's input) and before every consumer of the tanh
            two = add(_scalar(2.0))
            s = add(ir.Node("sigmoid", (add(ir.Node("mul", (index[n.inputs[0]], two))),)))
            if "plus" in wanted[i]:
                forms[(i, "plus")] = add(ir.Node("mul", (s, two)))
            if "one_minus_sq" in wanted[i]:
                one_minus_s = add(ir.Node("sub", (add(_scalar(1.0)), s)))
                forms[(i, "one_minus_sq")] = add(ir.Node("mul", (add(ir.Node("mul", (s, one_minus_s))),
                                                                  add(_scalar(4.0)))))
    return prune(ir.GraphIR(tuple(out)))
