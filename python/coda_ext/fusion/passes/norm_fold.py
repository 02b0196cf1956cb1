"""A layer norm folded into the GEMMs that read its output.

For y = (x − μ) ⊙row rstd ⊙col γ + β (decompose's layer norm: μ, rstd per row, γ, β per column) read
as the A operand of z = y @ Wᵀ:

    z = rstd ⊙row (x @ (W ⊙ γ)ᵀ − μ ⊗ s) + W β,       s_j = Σ_k (W ⊙ γ)_jk

so the GEMM reads x — stored by the epilogue that produced it and reduced its statistics there
(norm_stats) — and its epilogue finishes the normalisation from four vectors: μ and rstd (length M),
s and W β (length N). W ⊙ γ, s and W β are computed each step from the weights (N × K: small beside
the M × K activations); s sums the weight as the GEMM reads it (rounded to its dtype), so the μ
term cancels exactly what x's mean contributes. Nothing then writes y in the forward pass: an
element-wise reader of y (a residual add) gets its own copy of the normalisation, which its GEMM's
epilogue can compute from x, μ, rstd, γ and β as it loads them, and the backward's readers (the
weight gradients dzᵀ @ y) recompute y there — in the epilogue of the dX GEMM that takes the layer
norm's backward, which loads x, μ and rstd already (partition.candidates).

A layer norm is folded when every reader of y in the forward (no tangent behind it) is a GEMM that
reads it as A, K-major, and can anchor an epilogue on the target (rules.anchor_problem), or
element-wise math; and the weights' extra traffic is worth it (CostModel.fold_pays). The folded
GEMM's epilogue must take the fold's math (in a 16-bit GEMM, x @ (W⊙γ)ᵀ rounded before μ ⊗ s is
subtracted would lose the centred value): the frontend lowers the graph, and folds it again without
the layer norms whose math did not join (frontend.fuse_graph).

norm_fold(gm, target, unfolded, cost) is a pure function; the folds it made are in the returned
module's meta["coda_norm_folds"] (a list of Fold).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Collection

import torch
from torch import fx

from .. import aten_ir, fx_util, rules
from ..cost import CostModel
from .emit import Emit
from .layout import GEMM

aten = torch.ops.aten
prims = torch.ops.prims
META = "coda_norm_folds"
_HALF = (torch.bfloat16, torch.float16)


@dataclasses.dataclass(frozen=True)
class Norm:
    """y = ((xf − mean) · rstd) [· weight] [+ bias], rounded to y's dtype; xf is x or x widened to fp32."""

    y: fx.Node
    x: fx.Node
    xf: fx.Node
    mean: fx.Node
    rstd: fx.Node
    weight: fx.Node | None
    bias: fx.Node | None


@dataclasses.dataclass(frozen=True)
class Fold:
    """One layer norm folded: its output's name, and per GEMM the new GEMM's name and the names of the
    math its epilogue must take (the outer product μ ⊗ s, the subtraction, the scale by rstd, + W β)."""

    norm: str
    gemms: tuple[tuple[str, tuple[str, ...]], ...]


def _call(x, *targets) -> bool:
    return isinstance(x, fx.Node) and x.op == "call_function" and x.target in targets


def _operands(node: fx.Node, like: fx.Node, vector: tuple[int, ...]) -> tuple[fx.Node, fx.Node] | None:
    """(a, v) of a binary node whose operands are a value shaped like `like` and a node shaped `vector`,
    in either order."""
    if len(node.args) != 2 or node.kwargs.get("alpha", 1) != 1:
        return None
    a, v = node.args
    for p, q in ((a, v), (v, a)):
        if isinstance(p, fx.Node) and isinstance(q, fx.Node) and fx_util.shape(p) == fx_util.shape(like) \
                and fx_util.shape(q) == vector:
            return p, q
    return None


def match(y: fx.Node) -> Norm | None:
    """The layer norm whose output y is (decompose's form, after the other passes), else None."""
    shape = fx_util.shape(y)
    if len(shape) < 2 or not fx_util.is_static(y):
        return None
    v = y
    if _call(v, prims.convert_element_type.default) and fx_util.dtype(v.args[0]) == torch.float32:
        v = v.args[0]
    bias = weight = None
    if _call(v, aten.add.Tensor) and (ab := _operands(v, v, (shape[-1],))):
        v, bias = ab
    if _call(v, aten.mul.Tensor) and (aw := _operands(v, v, (shape[-1],))):
        v, weight = aw
    row = shape[:-1] + (1,)
    if not (_call(v, aten.mul.Tensor) and (xr := _operands(v, v, row))):
        return None
    xc, rstd = xr
    if not (_call(xc, aten.sub.Tensor) and len(xc.args) == 2 and xc.kwargs.get("alpha", 1) == 1):
        return None
    xf, mean = xc.args
    if not (isinstance(xf, fx.Node) and isinstance(mean, fx.Node) and fx_util.shape(mean) == row
            and fx_util.shape(xf) == shape):
        return None
    x = xf.args[0] if aten_ir.is_widening(xf) else xf
    return Norm(y, x, xf, mean, rstd, weight, bias)


def readers(y: fx.Node) -> list[tuple[fx.Node, list[fx.Node]]]:
    """(reader, the aliases between y and it) for every node that reads y's value."""
    out, todo = [], [(y, [])]
    while todo:
        v, path = todo.pop()
        for u in v.users:
            if aten_ir.is_alias(u):
                todo.append((u, path + [u]))
            else:
                out.append((u, path))
    return out


def _plan(norm: Norm, backward: set[fx.Node], target: str, cost: CostModel
          ) -> tuple[list[fx.Node], list[tuple[fx.Node, list[fx.Node]]]] | None:
    """(GEMMs to fold, element-wise readers to give a copy) if the layer norm is to be folded, else None."""
    gemms, copies = [], []
    if not fx_util.is_contiguous(norm.x) or fx_util.dtype(norm.x) != fx_util.dtype(norm.y):
        return None
    for u, path in readers(norm.y):
        if u in backward:
            continue
        held = path[-1] if path else norm.y
        if _call(u, GEMM) and u.args[0] is held and u.args[1] is not held and u.args[2][0] == "k" \
                and len(fx_util.shape(held)) == 2 \
                and rules.anchor_problem(fx_util.val(held), fx_util.val(u.args[1]), u.args[2], target) is None:
            gemms.append(u)
        elif u.op == "call_function" and aten_ir.math_problem(u) is None \
                and fx_util.shape(u)[-1:] == fx_util.shape(norm.y)[-1:]:
            copies.append((u, path))
        else:
            return None
    weights = sum(fx_util.nbytes(u.args[1]) for u in gemms)
    if not gemms or not cost.fold_pays(fx_util.nbytes(norm.y), weights):
        return None
    return gemms, copies


def _normalise(b: Emit, norm: Norm) -> fx.Node:
    """A fresh copy of the layer norm's output (for one element-wise reader)."""
    y = b.mul(b.sub(norm.xf, norm.mean), norm.rstd)
    if norm.weight is not None:
        y = b.mul(y, norm.weight)
    if norm.bias is not None:
        y = b.add(y, norm.bias)
    return b.to(y, fx_util.dtype(norm.y))


def _fold(b: Emit, norm: Norm, gemm: fx.Node) -> tuple[str, tuple[str, ...]]:
    """Replaces gemm = GEMM(y, W, major) by the folded form (module docstring)."""
    a, w, major = gemm.args
    M, K = fx_util.shape(a)
    kdim = 1 if major[1] == "k" else 0            # W stored (N, K) or (K, N)

    def along_k(vec: fx.Node) -> fx.Node:
        return vec if kdim == 1 else b(aten.unsqueeze.default, vec, 1)

    x = norm.x if fx_util.shape(norm.x) == (M, K) else b(aten.reshape.default, norm.x, [M, K])
    wg = w if norm.weight is None else b.to(b.mul(w, along_k(norm.weight)), fx_util.dtype(w))
    s = b.sum(b.to(wg, torch.float32), [kdim])
    acc = b(GEMM, x, wg, major)
    acc.meta[fx_util.GEMM_ID] = fx_util.gemm_id(gemm)
    mean = b(aten.reshape.default, norm.mean, [M, 1])
    rstd = b(aten.reshape.default, norm.rstd, [M, 1])
    outer = b.mul(mean, s)
    centred = b.sub(acc, outer)
    z = b.mul(centred, rstd)
    math = [outer, centred, z]
    if norm.bias is not None:
        c = b.sum(b.mul(b.to(w, torch.float32), along_k(b.to(norm.bias, torch.float32))), [kdim])
        z = b.add(z, c)
        math.append(z)
    fx_util.replace(gemm, b.to(z, fx_util.dtype(gemm)))
    return acc.name, tuple(n.name for n in math)


def norm_fold(gm: fx.GraphModule, target: str = "interpret", unfolded: Collection[str] = (),
              cost: CostModel | None = None) -> fx.GraphModule:
    """gm with every layer norm that pays folded into the GEMMs that read it, except those whose output
    is named in `unfolded`."""
    gm = fx_util.clone(gm)
    graph = gm.graph
    cost = cost or CostModel()
    backward = fx_util.tangent_dependent(gm)
    folds: list[Fold] = []
    seen: set[fx.Node] = set()
    erased: set[fx.Node] = set()
    for node in list(graph.nodes):
        if node in erased or not _call(node, GEMM):
            continue
        y = aten_ir.alias_root(node.args[0])
        if y in seen or y.name in unfolded:
            continue
        seen.add(y)
        norm = match(y)
        plan = None if norm is None else _plan(norm, backward, target, cost)
        if plan is None:
            continue
        gemms, copies = plan
        for u, path in copies:
            with graph.inserting_before(u):
                env = {norm.y: _normalise(Emit(graph, fx_util.pass_tag(u)), norm)}
                for p in path:
                    env[p] = graph.node_copy(p, lambda n: env.get(n, n))
            held = path[-1] if path else norm.y
            u.replace_input_with(held, env[held])
        done = []
        for g in gemms:
            with graph.inserting_before(g):
                done.append(_fold(Emit(graph, fx_util.pass_tag(g)), norm, g))
            graph.erase_node(g)
            erased.add(g)
        folds.append(Fold(y.name, tuple(done)))
    gm = fx_util.finish(gm)
    gm.meta[META] = folds
    return gm
