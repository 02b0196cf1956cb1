"""Transposes into operand layouts: every 2-D GEMM becomes coda_ext::fusion_gemm(a, w, major) on the
tensors as they are stored, so no transpose runs before it.

A transpose pair t(t(x)) is x. Then for mm(a, b) (A = a is M x K, W = bᵀ is N x K): a and b are
followed back through their transposes to the stored tensors; an even number of transposes leaves
the operand in its stored layout ("k": K contiguous), an odd one reads the stored tensor transposed
("m" for A, "n" for W) — KernelConfig's `major` (coda_ext.config.MAJORS): x @ Wᵀ of a linear layer is
"kk", its dX GEMM dz @ W is "kn", its weight gradient dzᵀ @ x is "mn". layout(gm) is a pure function.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import fx

from .. import (
    fx_util,
    op,  # noqa: F401  (registers the custom ops)
)
from .emit import Emit

aten = torch.ops.aten
GEMM = torch.ops.coda_ext.fusion_gemm.default


def is_transpose(node: Any) -> bool:
    """A 2-D transpose: t, transpose(0, 1) or permute([1, 0])."""
    if not isinstance(node, fx.Node) or node.op != "call_function" or len(fx_util.shape(node)) != 2:
        return False
    if node.target is aten.t.default:
        return True
    if node.target is aten.transpose.int:
        return {node.args[1] % 2, node.args[2] % 2} == {0, 1}
    if node.target is aten.permute.default:
        return [d % 2 for d in node.args[1]] == [1, 0]
    return False


def stored(node: fx.Node) -> tuple[fx.Node, int]:
    """The tensor behind a chain of transposes and the number of transposes."""
    count = 0
    while is_transpose(node):
        node, count = node.args[0], count + 1
    return node, count


def layout(gm: fx.GraphModule) -> fx.GraphModule:
    gm = fx_util.clone(gm)
    graph = gm.graph
    for node in list(graph.nodes):
        if is_transpose(node) and is_transpose(node.args[0]):
            fx_util.replace(node, node.args[0].args[0])
            graph.erase_node(node)
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not aten.mm.default:
            continue
        (a, na), (b, nb) = stored(node.args[0]), stored(node.args[1])
        major = ("k" if na % 2 == 0 else "m") + ("k" if (nb + 1) % 2 == 0 else "n")
        with graph.inserting_before(node):
            new = Emit(graph, fx_util.pass_tag(node))(GEMM, a, b, major)
        new.meta[fx_util.GEMM_ID] = new.name
        fx_util.replace(node, new)
        graph.erase_node(node)
    return fx_util.finish(gm)
