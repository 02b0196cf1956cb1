"""Horizontal merge: the GEMMs of one layer that read the same input become one GEMM of their concatenated
weights, forward and backward.

A transformers attention block projects its normalised input three times, x @ W_qᵀ, x @ W_kᵀ, x @ W_vᵀ (N of
2048, 512 and 512 at Llama-3.2-1B's width). With no epilogue on them they run as three GEMMs of small N in the
forward, three dX GEMMs dz_i @ W_i whose partial sums are written and read again by whatever adds them (an
epilogue loading two of them as tiles), and three weight gradients dz_iᵀ @ x. Merged:

    forward   W = cat(W_1, ..., W_k)             (ΣN_i, K), concatenated each step (the weights are parameters)
              y = x @ Wᵀ;  y_i = y[:, off_i : off_i + N_i]           (column views: nothing is copied)
    dX        Σ_i dz_i @ W_i = cat(dz_1, ..., dz_k) @ W              (one GEMM over K = ΣN_i: no partial sums)
    dW        cat(dz_1, ..., dz_k)ᵀ @ x;  dW_i = its rows off_i ...  (one GEMM, row views)

The backward's cat(dz_i) is a pass of its own unless the fallback writes its producers' results into it (Inductor
does for element-wise producers: the RoPE backward). merge_gemms(gm, allowed) merges the forward GEMMs
(coda_ext::fusion_gemm in layout "kk") that share their A operand, read parameters (graph inputs) of one dtype
and K, and are all named in `allowed` (the frontend passes the GEMMs its partition left without an epilogue:
a GEMM whose epilogue takes math of its own output — a bias, an activation — keeps it). Their dX GEMMs ("kn" on
the same weights) are merged when they meet in one sum of adds (views on the way kept), their weight gradients
("mn" against the same x) when each W_i has one. A pure function of its input module.
"""
from __future__ import annotations

from collections.abc import Collection

import torch
from torch import fx

from .. import fx_util
from .emit import Emit
from .layout import GEMM

aten = torch.ops.aten
VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


def _gemm(node: object, major: str) -> bool:
    return (isinstance(node, fx.Node) and node.op == "call_function" and node.target is GEMM
            and node.args[2] == major)


def groups(gm: fx.GraphModule, allowed: Collection[str] | None = None) -> list[list[fx.Node]]:
    """The forward GEMMs merge_gemms merges, in graph order: per A operand, the "kk" GEMMs on parameters (graph
    inputs) of one dtype and K, named in `allowed` (None: any), two or more."""
    by_input: dict[tuple, list[fx.Node]] = {}
    for node in gm.graph.nodes:
        if not _gemm(node, "kk") or (allowed is not None and node.name not in allowed):
            continue
        a, w = node.args[0], node.args[1]
        if not isinstance(w, fx.Node) or w.op != "placeholder" or len(fx_util.shape(w)) != 2:
            continue
        by_input.setdefault((a, fx_util.dtype(w), fx_util.shape(w)[1]), []).append(node)
    out = []
    for nodes in by_input.values():
        weights = [n.args[1] for n in nodes]
        if len(nodes) >= 2 and len(set(weights)) == len(weights):
            out.append(nodes)
    return out


#: gm.meta key: what merge_gemms merged, one line per group ("a, b, c (x): N 2048 + 512 + 512")
META = "coda_hmerge"


def merge_gemms(gm: fx.GraphModule, allowed: Collection[str] | None = None) -> fx.GraphModule:
    gm = fx_util.clone(gm)
    found = groups(gm, allowed)
    gm.meta[META] = tuple(f"{', '.join(n.name for n in g)} (reading {g[0].args[0].name}): N "
                          + " + ".join(str(fx_util.shape(n.args[1])[0]) for n in g) for g in found)
    if not found:
        return gm
    for group in found:
        _merge(gm.graph, group)
    return fx_util.finish(gm)


def _merge(graph: fx.Graph, group: list[fx.Node]) -> None:
    a = group[0].args[0]
    weights = [n.args[1] for n in group]
    widths = [fx_util.shape(w)[0] for w in weights]
    offsets = [sum(widths[:i]) for i in range(len(widths))]
    with graph.inserting_before(group[0]):
        emit = Emit(graph, fx_util.pass_tag(group[0]))
        w_cat = emit(aten.cat.default, weights, 0)
        merged = emit(GEMM, a, w_cat, "kk")
        merged.meta[fx_util.GEMM_ID] = _joined(group)
    for node, off, n in zip(group, offsets, widths, strict=True):
        with graph.inserting_before(node):
            part = Emit(graph, fx_util.pass_tag(node))(aten.slice.Tensor, merged, 1, off, off + n)
        fx_util.replace(node, part)
        graph.erase_node(node)
    _merge_backward(graph, a, weights, w_cat, offsets, widths)


def _merge_backward(graph: fx.Graph, x: fx.Node, weights: list[fx.Node], w_cat: fx.Node, offsets: list[int],
                    widths: list[int]) -> None:
    dx = [[u for u in w.users if _gemm(u, "kn")] for w in weights]
    if any(len(d) != 1 for d in dx):
        return
    dx = [d[0] for d in dx]
    dz = [d.args[0] for d in dx]
    if any(fx_util.shape(z) != (fx_util.shape(x)[0], n) for z, n in zip(dz, widths, strict=True)):
        return
    dw = [[u for u in z.users if _gemm(u, "mn") and u.args[1] is x] for z in dz]
    dw = [d[0] for d in dw] if all(len(d) == 1 for d in dw) else None
    root, others = _sum_of(dx)
    if root is None and dw is None:
        return
    order = {n: i for i, n in enumerate(graph.nodes)}
    last = max([*dz, w_cat], key=order.__getitem__)   # after every dz and the forward's weights
    tag = fx_util.pass_tag(dx[0])
    with graph.inserting_before(last.next):   # (inserting_after would stack the new nodes in reverse)
        emit = Emit(graph, tag)
        dz_cat = emit(aten.cat.default, dz, 1)
        if dw is not None:
            dw_cat = emit(GEMM, dz_cat, x, "mn")
            dw_cat.meta[fx_util.GEMM_ID] = _joined(dw)
            parts = [emit(aten.slice.Tensor, dw_cat, 0, off, off + n) for off, n in zip(offsets, widths, strict=True)]
        if root is not None:
            total = emit(GEMM, dz_cat, w_cat, "kn")
            total.meta[fx_util.GEMM_ID] = _joined(dx)
            if fx_util.shape(root) != fx_util.shape(total):
                total = emit(aten.view.default, total, list(fx_util.shape(root)))
    if root is not None:
        with graph.inserting_before(root):   # the other terms may come after the last dz: the sum where it was
            emit = Emit(graph, fx_util.pass_tag(root))
            for term in others:
                total = emit.add(total, term)
        fx_util.replace(root, total)
    if dw is not None:
        for node, part in zip(dw, parts, strict=True):
            fx_util.replace(node, part)


def _joined(gemms: list[fx.Node]) -> str:
    """The identity of a GEMM merged from `gemms` (fx_util.GEMM_ID): theirs, joined."""
    return "+".join(fx_util.gemm_id(g) for g in gemms)


def _sum_of(gemms: list[fx.Node]) -> tuple[fx.Node | None, list[fx.Node]]:
    """(root, other terms) of the one sum of adds whose terms include every GEMM's output (through one view each,
    all of one shape), every add on the way read only by the next; (None, []) if there is none."""
    leaves = []
    for g in gemms:
        node = g
        if len(node.users) != 1:
            return None, []
        (user,) = node.users
        if user.op == "call_function" and user.target in VIEWS:
            node = user
            if len(node.users) != 1:
                return None, []
        leaves.append(node)
    if len({fx_util.shape(v) for v in leaves}) != 1:
        return None, []
    root = leaves[0]
    while True:   # up the adds from the first term to the first that sums them all
        if len(root.users) != 1 or not _add(next(iter(root.users))):
            return None, []
        root = next(iter(root.users))
        if _covers(root, leaves):
            break
    terms = _terms(root)
    if terms is None or any(terms.count(v) != 1 for v in leaves):
        return None, []
    return root, [t for t in terms if t not in leaves]


def _add(node: fx.Node) -> bool:
    return (node.op == "call_function" and node.target is aten.add.Tensor and len(node.args) == 2
            and not node.kwargs)


def _terms(root: fx.Node) -> list[fx.Node] | None:
    """The terms of the add tree under root (adds read only by their parent in it), in order."""
    out = []
    for arg in root.args:
        if not isinstance(arg, fx.Node):
            return None
        if _add(arg) and len(arg.users) == 1:
            sub = _terms(arg)
            if sub is None:
                return None
            out += sub
        else:
            out.append(arg)
    return out


def _covers(root: fx.Node, leaves: list[fx.Node]) -> bool:
    terms = _terms(root) if _add(root) else [root]
    return terms is not None and all(v in terms for v in leaves)
