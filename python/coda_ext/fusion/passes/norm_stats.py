"""Layer norm statistics in one pass over the row, where a GEMM's epilogue can take them.

decompose writes a layer norm's variance as PyTorch computes it, two passes over the row: the mean
first, then the mean of the centred squares, Σ(x − μ)²/n. The second sum needs the first, and an
epilogue ends at a reduction, so only Σx could join the epilogue of the GEMM (+ bias + residual) that
produces x. This pass rewrites the variance as

    var = max(Σx²/n − μ², 0)        (μ = Σx/n)

so both row sums, Σx and Σx·x, read x itself: both join that epilogue (two row reductions, fp32
partials), and only (M, 1)-sized math is left after it. The one-pass form loses about
eps32 · (μ² + σ²) / σ² of the variance to cancellation (a row whose mean is ten times its spread:
about 1e-5 relative, far below a 16-bit activation's rounding); the clamp keeps it non-negative.

The rewrite applies only where x is computed by element-wise math from a GEMM output (a layer norm
after an embedding sum keeps the two-pass form: no epilogue can take its statistics).
norm_stats(gm) is a pure function.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import fx

from .. import aten_ir, fx_util
from .emit import Emit

aten = torch.ops.aten
prims = torch.ops.prims

#: How far back through element-wise math a layer norm's input is followed to find a GEMM.
SEARCH_DEPTH = 16
_GEMMS = {aten.mm.default, aten.addmm.default, aten.linear.default}


def _node(x: Any, *targets: Any) -> bool:
    return isinstance(x, fx.Node) and x.op == "call_function" and x.target in targets


def _row_sum_of(node: Any) -> fx.Node | None:
    """x for node = sum(x, [last], keepdim=True) / n with n the row length, else None."""
    if not (_node(node, aten.div.Scalar) and _node(node.args[0], aten.sum.dim_IntList)):
        return None
    s = node.args[0]
    x = s.args[0]
    rank = len(fx_util.shape(x))
    dims = s.args[1] if len(s.args) > 1 else None
    keep = s.args[2] if len(s.args) > 2 else s.kwargs.get("keepdim", False)
    if rank == 0 or list(dims or []) not in ([rank - 1], [-1]) or not keep or s.kwargs.get("dtype") is not None:
        return None
    return x if node.args[1] == fx_util.shape(x)[-1] else None


def _alpha_one(node: fx.Node) -> bool:
    return node.kwargs.get("alpha", 1) == 1 and len(node.args) <= 2


def reaches_gemm(x: Any, depth: int = SEARCH_DEPTH) -> bool:
    """Whether x is computed from a GEMM output through element-wise math and views (so an epilogue
    of that GEMM could reduce it)."""
    todo, seen = [(x, 0)], set()
    while todo:
        n, d = todo.pop()
        if not isinstance(n, fx.Node) or n in seen or d > depth or n.op != "call_function":
            continue
        seen.add(n)
        if n.target in _GEMMS or "fusion_gemm" in str(n.target):
            return True
        if n.target in aten_ir.MATH or n.target in aten_ir.VIEWS:
            todo += [(a, d + 1) for a in n.all_input_nodes]
    return False


def two_pass_variance(var: fx.Node) -> tuple[fx.Node, fx.Node] | None:
    """(x, mean) when var = Σ(x − mean)²/n over the last dim with mean = Σx/n: decompose's layer norm."""
    centred_sq = _row_sum_of(var)
    if not _node(centred_sq, aten.mul.Tensor) or centred_sq.args[0] is not centred_sq.args[1]:
        return None
    xc = centred_sq.args[0]
    if not (_node(xc, aten.sub.Tensor) and _alpha_one(xc)):
        return None
    x, mean = xc.args[:2]
    if not isinstance(x, fx.Node) or _row_sum_of(mean) is not x:
        return None
    return x, mean


def norm_stats(gm: fx.GraphModule) -> fx.GraphModule:
    """gm with every two-pass layer-norm variance whose input comes from a GEMM in one pass (above)."""
    gm = fx_util.clone(gm)
    graph = gm.graph
    for node in list(graph.nodes):
        found = two_pass_variance(node) if _node(node, aten.div.Scalar) else None
        if found is None:
            continue
        x, mean = found
        source = x.args[0] if _node(x, prims.convert_element_type.default) else x
        if not reaches_gemm(source):
            continue
        n = fx_util.shape(x)[-1]
        b = Emit(graph, fx_util.pass_tag(node))
        with graph.inserting_before(node):
            ex2 = b.div(b.sum(b.mul(x, x), [len(fx_util.shape(x)) - 1], True), n)
            var = b(aten.clamp_min.default, b.sub(ex2, b.mul(mean, mean)), 0.0)
        fx_util.replace(node, var)
        graph.erase_node(node)
    return fx_util.finish(gm)
