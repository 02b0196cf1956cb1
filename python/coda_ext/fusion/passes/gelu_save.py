"""GELU's derivative computed by the forward: the backward multiplies instead of evaluating it.

AOTAutograd differentiates y = gelu(x) as gelu_backward(dy, x): the forward saves x and the backward evaluates
GELU's derivative at it, an erf (or tanh) and an exp an element in the epilogue of the GEMM that computes dy
(BERT's, ViT's and GPT-2's MLP: 16384 × 3072 elements a layer), where that math outlasts the tile's mainloop
at a short K. The forward evaluates the same functions at the same x for gelu(x) already (Φ(x) and exp(-x²/2)
are common to both: the epilogue's functors share them, csrc/epilogues/functors.hpp). This pass computes

    g = gelu'(x)        in the forward, beside gelu(x)        (written gelu_backward(1, x))
    dx = dy · g         in the backward, in place of gelu_backward(dy, x)

so the forward saves g in place of x (the same bytes) and the backward's epilogue is one multiply. Both are
evaluated at the x the forward's gelu used (an epilogue's unrounded fp32 value where a GEMM computes x), which
is the point autograd differentiates at; g is rounded once to x's dtype when stored, where eager PyTorch
rounds x (a 16-bit activation) and evaluates the derivative from it: one rounding either way before the
product's.

Applies to an x the forward passes to gelu and whose every backward reader is a gelu_backward of the same form
(exact or tanh): then x is no longer read by the backward and g replaces it among the saved values; an x the
backward reads otherwise would be saved beside g (more bytes), and is left as it is.
gelu_grad_forward(gm) is a pure function.
"""
from __future__ import annotations

import torch
from torch import fx

from .. import fx_util
from .emit import Emit

aten = torch.ops.aten


def _approximate(node: fx.Node, position: int) -> str:
    return node.args[position] if len(node.args) > position else node.kwargs.get("approximate", "none")


def gelu_grad_forward(gm: fx.GraphModule) -> fx.GraphModule:
    """gm (an AOTAutograd joint graph; anything else is returned as it is, in a copy) with GELU's derivative
    computed by the forward where that takes its evaluation out of the backward (above)."""
    gm = fx_util.clone(gm)
    backward = fx_util.backward_part(gm)
    sites = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is not aten.gelu.default or node in backward:
            continue
        x = node.args[0]
        form = _approximate(node, 1)
        readers = [u for u in x.users if u in backward]
        if readers and all(u.target is aten.gelu_backward.default and u.args[1] is x and u.args[0] is not x
                           and _approximate(u, 2) == form for u in readers):
            sites.append((node, x, form, readers))
    if not sites:
        return gm
    for gelu, x, form, readers in sites:
        v = fx_util.val(x)
        b = Emit(gm.graph, fx_util.pass_tag(gelu))
        with gm.graph.inserting_after(gelu):
            one = b(aten.full.default, list(v.shape), 1.0, dtype=v.dtype, device=v.device)
        with gm.graph.inserting_after(one):
            g = b(aten.gelu_backward.default, one, x, approximate=form)
        g.meta[fx_util.SAVED] = True   # computed by the forward, not by a backward GEMM's epilogue
        for u in readers:
            with gm.graph.inserting_before(u):
                dx = Emit(gm.graph, fx_util.pass_tag(u)).mul(u.args[0], g)
            fx_util.replace(u, dx)
            gm.graph.erase_node(u)
    return fx_util.finish(gm)
