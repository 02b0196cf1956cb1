"""Decompositions: composite ATen ops rewritten into the element-wise math and last-dim / leading-dim
reductions an epilogue runs (aten_ir.MATH, aten_ir.REDUCTIONS).

- addmm / linear: a GEMM (mm) and a bias add;
- layer norm and RMSNorm, forward and backward: row statistics, then element-wise math (two passes
  over the row, as PyTorch computes them: the variance of the centred values; norm_stats makes it one
  where a GEMM epilogue can take it); the backward reads the forward's fp32 statistics (PyTorch's CPU
  kernel rounds them to a 16-bit input's dtype, its CUDA kernel does not);
- SiLU, sigmoid, tanh and ReLU backward: their derivatives as element-wise math (SwiGLU is
  silu(gate) * up: its parts decompose); GELU's backward, exact or tanh form, stays one op, which an
  epilogue runs as dy · gelu_grad(x) (one functor: the tanh form's derivative written out was 20 nodes);
- softmax / log-softmax and their backward; mean;
- cross-entropy: nll_loss(log_softmax(x)) becomes logsumexp(x) - x[target], both row reductions of x,
  and its backward exp(x - lse) - onehot, so the log-probabilities are never materialised; x[target] is
  a gather where no epilogue can take the logits (target "cuda", a class count that is not a multiple of
  rules.ALIGN: BERT's and GPT-2's vocabularies): the row sum of where(onehot, x, 0) would cost the fallback a
  pass over the logits; there the logsumexp takes the form Inductor computes in one pass (max, then the sum
  of exp(x - max), its online softmax); the backward's row sum of nll_loss's gradient is the one value each
  row holds, never a reduction (as a reduction, Inductor ran GPT-2's fallback backward in 5.31 ms against
  2.03 for the pointwise form);
- dropout with p = 0 or in eval mode becomes the identity; other dropout is left as it is (random: an
  epilogue has no seeded RNG, so it is not fused).

Statistics run in fp32 for 16-bit inputs, as PyTorch's kernels do. decompose(gm, target) is a pure function.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from .. import fx_util
from ..rules import ALIGN
from .emit import Emit

aten = torch.ops.aten
prims = torch.ops.prims

Rule = Callable[[fx.Node, Emit], Any]
#: node.meta keys, read within the pass only: on a decomposed nll_loss_backward, its row sums (fp32, keepdim),
#: known without a reduction; on a logsumexp in the online form, the value it reduces
ROW_SUM = "coda_row_sum"
LSE_OF = "coda_lse_of"


def _arg(node: fx.Node, i: int, name: str, default: Any = None) -> Any:
    return node.args[i] if len(node.args) > i else node.kwargs.get(name, default)


def _out_dtype(node: fx.Node, i: int | None = None) -> torch.dtype:
    v = node.meta["val"]
    return (v[i] if i is not None else v).dtype


def _last(x: fx.Node) -> int:
    return len(fx_util.shape(x)) - 1


# --- GEMMs ------------------------------------------------------------------------------------

def _addmm(node: fx.Node, b: Emit) -> fx.Node:
    bias, m1, m2 = node.args[:3]
    beta, alpha = node.kwargs.get("beta", 1), node.kwargs.get("alpha", 1)
    y = b(aten.mm.default, m1, m2)
    if alpha != 1:
        y = b.mul(y, alpha)
    if beta == 0:
        return y
    return b.add(y, bias if beta == 1 else b.mul(bias, beta))


def _linear(node: fx.Node, b: Emit) -> fx.Node:
    x, w = node.args[:2]
    bias = _arg(node, 2, "bias")
    shape = fx_util.shape(x)
    x2 = x if len(shape) == 2 else b(aten.reshape.default, x, [-1, shape[-1]])
    y = b(aten.mm.default, x2, b(aten.t.default, w))
    if bias is not None:
        y = b.add(y, bias)
    return y if len(shape) == 2 else b(aten.reshape.default, y, list(fx_util.shape(node)))


# --- norms ------------------------------------------------------------------------------------

def _mean_last(b: Emit, x: Any, n: int) -> fx.Node:
    return b.div(b.sum(x, [_last(x)], True), n)


def _layer_norm(node: fx.Node, b: Emit) -> list | None:
    x, shape, w, bias, eps = node.args[:5]
    if len(shape) != 1:
        return None
    n = shape[0]
    xf = b.wide(x)
    mean = _mean_last(b, xf, n)
    xc = b.sub(xf, mean)
    rstd = b.unary(aten.rsqrt, b.add(_mean_last(b, b.mul(xc, xc), n), eps))
    y = b.mul(xc, rstd)
    if w is not None:
        y = b.mul(y, w)
    if bias is not None:
        y = b.add(y, bias)
    return [b.to(y, _out_dtype(node, 0)), b.to(mean, _out_dtype(node, 1)), b.to(rstd, _out_dtype(node, 2))]


def _as_computed(stat: Any) -> Any:
    """A statistic as the forward computed it: PyTorch's CPU layer norm rounds a 16-bit input's mean and
    rstd to its dtype (its CUDA kernel keeps them in fp32); the backward reads the fp32 values, as on
    CUDA, so it shares the forward's normalised values."""
    if isinstance(stat, fx.Node) and stat.target is prims.convert_element_type.default \
            and fx_util.dtype(stat) in (torch.bfloat16, torch.float16) and fx_util.dtype(stat.args[0]) == torch.float32:
        return stat.args[0]
    return stat


def _layer_norm_backward(node: fx.Node, b: Emit) -> list | None:
    dy, x, shape, mean, rstd, w, bias, mask = node.args[:8]
    if len(shape) != 1:
        return None
    mean, rstd = _as_computed(mean), _as_computed(rstd)
    n = shape[0]
    dyf, xf = b.wide(dy), b.wide(x)
    xhat = b.mul(b.sub(xf, mean), rstd)
    g = b.mul(dyf, w) if w is not None else dyf
    outs: list = [None, None, None]
    if mask[0]:
        a = _mean_last(b, g, n)
        c = _mean_last(b, b.mul(g, xhat), n)
        outs[0] = b.to(b.mul(b.sub(b.sub(g, a), b.mul(xhat, c)), rstd), _out_dtype(node, 0))
    leading = list(range(len(fx_util.shape(x)) - 1))
    if mask[1] and w is not None:
        outs[1] = b.to(b.sum(b.mul(dyf, xhat), leading), _out_dtype(node, 1))
    if mask[2] and bias is not None:
        outs[2] = b.to(b.sum(dyf, leading), _out_dtype(node, 2))
    return outs


def _rms_norm(node: fx.Node, b: Emit) -> list | None:
    x, shape, w = node.args[:3]
    eps = _arg(node, 3, "eps")
    if len(shape) != 1:
        return None
    if eps is None:
        eps = torch.finfo(fx_util.dtype(x)).eps
    xf = b.wide(x)
    rstd = b.unary(aten.rsqrt, b.add(_mean_last(b, b.mul(xf, xf), shape[0]), eps))
    y = b.mul(xf, rstd)
    if w is not None:
        y = b.mul(y, w)
    return [b.to(y, _out_dtype(node, 0)), b.to(rstd, _out_dtype(node, 1))]


def _rms_norm_backward(node: fx.Node, b: Emit) -> list | None:
    dy, x, shape, rstd, w, mask = node.args[:6]
    if len(shape) != 1:
        return None
    dyf, xf = b.wide(dy), b.wide(x)
    xhat = b.mul(xf, rstd)
    g = b.mul(dyf, w) if w is not None else dyf
    outs: list = [None, None]
    if mask[0]:
        c = _mean_last(b, b.mul(g, xhat), shape[0])
        outs[0] = b.to(b.mul(b.sub(g, b.mul(xhat, c)), rstd), _out_dtype(node, 0))
    if mask[1] and w is not None:
        leading = list(range(len(fx_util.shape(x)) - 1))
        outs[1] = b.to(b.sum(b.mul(dyf, xhat), leading), _out_dtype(node, 1))
    return outs


def _mean(node: fx.Node, b: Emit) -> fx.Node | None:
    x, dims = node.args[:2]
    keep = _arg(node, 2, "keepdim", False)
    if not dims or node.kwargs.get("dtype") is not None:
        return None
    shape = fx_util.shape(x)
    count = math.prod(shape[d] for d in dims)
    wide = torch.float32 if fx_util.dtype(x) in (torch.bfloat16, torch.float16) else None
    return b.to(b.div(b.sum(x, dims, keep, dtype=wide), count), _out_dtype(node))


# --- activations' derivatives -----------------------------------------------------------------

def _silu_backward(node: fx.Node, b: Emit) -> fx.Node:
    dy, x = node.args[:2]
    dyf, xf = b.wide(dy), b.wide(x)
    s = b.unary(aten.sigmoid, xf)
    return b.to(b.mul(b.mul(dyf, s), b.add(b.mul(xf, b.sub(1.0, s)), 1.0)), _out_dtype(node))


def _sigmoid_backward(node: fx.Node, b: Emit) -> fx.Node:
    dy, y = node.args[:2]
    yf = b.wide(y)
    return b.to(b.mul(b.mul(b.wide(dy), yf), b.sub(1.0, yf)), _out_dtype(node))


def _tanh_backward(node: fx.Node, b: Emit) -> fx.Node:
    dy, y = node.args[:2]
    yf = b.wide(y)
    return b.to(b.mul(b.wide(dy), b.sub(1.0, b.mul(yf, yf))), _out_dtype(node))


def _threshold_backward(node: fx.Node, b: Emit) -> fx.Node:
    dy, x, threshold = node.args[:3]
    return b.where(b(aten.le.Scalar, x, threshold), b.const(0.0, dy), dy)


# --- softmax and cross-entropy ----------------------------------------------------------------

def _softmax_parts(node: fx.Node, b: Emit, online: bool = False) -> tuple[fx.Node, fx.Node] | None:
    """(x in fp32, its logsumexp over the last dim, keepdim): one logsumexp reduction, which an epilogue runs
    per row, or (online) max(x) + log(sum(exp(x - max(x)))), the form Inductor computes in one pass over x
    (its online-softmax pattern; its own logsumexp takes two): for the fallback, where no epilogue can take x (on
    the "cuda" target, a last dim that is not a multiple of 8: a loss's vocabulary, or any such softmax)."""
    x, dim = node.args[:2]
    if dim % len(fx_util.shape(x)) != _last(x):
        return None
    xf = b.wide(x)
    if not online:
        return xf, b(aten.logsumexp.default, xf, [_last(x)], True)
    top = b(aten.amax.default, xf, [_last(x)], True)
    lse = b.add(top, b.unary(aten.log, b.sum(b.unary(aten.exp, b.sub(xf, top)), [_last(x)], True)))
    lse.meta[LSE_OF] = xf
    return xf, lse


def _log_softmax(node: fx.Node, b: Emit, online: bool = False) -> fx.Node | None:
    parts = _softmax_parts(node, b, online)
    return None if parts is None else b.to(b.sub(*parts), _out_dtype(node))


def _softmax(node: fx.Node, b: Emit, online: bool = False) -> fx.Node | None:
    parts = _softmax_parts(node, b, online)
    return None if parts is None else b.to(b.unary(aten.exp, b.sub(*parts)), _out_dtype(node))


def _log_softmax_backward(node: fx.Node, b: Emit) -> fx.Node | None:
    g, out, dim = node.args[:3]
    if dim % len(fx_util.shape(g)) != _last(g):
        return None
    gf, outf = b.wide(g), b.wide(out)
    total = g.meta.get(ROW_SUM) if len(fx_util.shape(g)) == 2 else None
    if total is None:
        total = b.sum(gf, [_last(g)], True)
    return b.to(b.sub(gf, b.mul(b.unary(aten.exp, outf), total)), _out_dtype(node))


def _softmax_backward(node: fx.Node, b: Emit) -> fx.Node | None:
    g, out, dim = node.args[:3]
    if dim % len(fx_util.shape(g)) != _last(g):
        return None
    gf, outf = b.wide(g), b.wide(out)
    return b.to(b.mul(outf, b.sub(gf, b.sum(b.mul(gf, outf), [_last(g)], True))), _out_dtype(node))


def _onehot(b: Emit, target: fx.Node, classes: int) -> fx.Node:
    """(M, C) bool: column == target[m] (no column for an out-of-range ignore_index)."""
    cols = b(aten.arange.start_step, 0, classes, 1, dtype=fx_util.dtype(target),
             device=fx_util.val(target).device)
    return b(aten.eq.Tensor, cols, b(aten.unsqueeze.default, target, 1))


def _log_softmax_input(logp: Any) -> tuple[fx.Node, fx.Node] | None:
    """(x, lse) when logp is x - logsumexp(x) over the last dim (a decomposed log_softmax), possibly
    converted to a 16-bit dtype."""
    if isinstance(logp, fx.Node) and logp.target is prims.convert_element_type.default:
        logp = logp.args[0]
    if not (isinstance(logp, fx.Node) and logp.target is aten.sub.Tensor):
        return None
    x, lse = logp.args[:2]
    if isinstance(lse, fx.Node) and ((lse.target is aten.logsumexp.default and lse.args[0] is x)
                                     or lse.meta.get(LSE_OF) is x):
        return x, lse
    return None


def _pick(b: Emit, x: fx.Node, target: fx.Node, ignore: int, gather: bool) -> fx.Node:
    """x[m, target[m]], 0 where target is ignore_index: a row reduction of where(onehot, x, 0), which an epilogue
    computes on the logits' tile, or (gather) a gather, which reads one element a row. Any other target out of
    range is an error, as in PyTorch's nll_loss (the gather faults on it; the row reduction gives 0)."""
    if not gather:
        return b.sum(b.where(_onehot(b, target, fx_util.shape(x)[1]), x, b.const(0.0, x)), [1])
    safe = b.where(b(aten.ne.Scalar, target, ignore), target, b.const(0, target))
    return b(aten.squeeze.dim, b(aten.gather.default, x, 1, b(aten.unsqueeze.default, safe, 1)), 1)


def _nll_loss(node: fx.Node, b: Emit, gather: bool = False) -> list | None:
    logp, target, weight, reduction, ignore = node.args[:5]
    if weight is not None or len(fx_util.shape(logp)) != 2 or reduction not in (0, 1, 2):
        return None
    split = _log_softmax_input(logp)
    if split is not None:   # log_softmax(x)[target] = x[target] - lse: a row reduction of x itself
        x, lse = split
        picked = b.sub(_pick(b, x, target, ignore, gather), b(aten.squeeze.dim, lse, 1))
    else:
        picked = _pick(b, logp, target, ignore, gather)
    valid = b(aten.ne.Scalar, target, ignore)
    losses = b.where(valid, b.unary(aten.neg, picked), b.const(0.0, picked))
    dtype = _out_dtype(node, 0)
    total = b.to(b(aten.sum.default, b.to(valid, dtype)), _out_dtype(node, 1))
    if reduction == 0:
        loss, total = losses, b.const(0.0, losses, _out_dtype(node, 1))   # as PyTorch: no total without reduction
    else:
        loss = b(aten.sum.default, losses)
        if reduction == 1:
            loss = b.div(loss, total)
    return [b.to(loss, dtype), total]


def _nll_loss_backward(node: fx.Node, b: Emit) -> fx.Node | None:
    grad, logp, target, weight, reduction, ignore, total = node.args[:7]
    if weight is not None or len(fx_util.shape(logp)) != 2 or reduction not in (0, 1, 2):
        return None
    classes = fx_util.shape(logp)[1]
    valid = b(aten.unsqueeze.default, b(aten.ne.Scalar, target, ignore), 1)
    hit = b(aten.mul.Tensor, _onehot(b, target, classes), valid)
    scale = b.unary(aten.neg, b.div(grad, total) if reduction == 1 else grad)
    if reduction == 0:
        scale = b(aten.unsqueeze.default, scale, 1)
    out = b.to(b.where(hit, scale, b.const(0.0, logp)), _out_dtype(node))
    # each row holds one value (or none: an ignored target, or one out of range, which hits no class): its row
    # sum, as the rounded gradient holds it, without a reduction
    hits = b(aten.logical_and.default, valid, b(aten.unsqueeze.default, b(aten.logical_and.default, b(
        aten.ge.Scalar, target, 0), b(aten.lt.Scalar, target, classes)), 1))
    held = b.to(b.where(hits, scale, b.const(0.0, logp)), _out_dtype(node))
    out.meta[ROW_SUM] = b.wide(held)
    return out


# --- dropout --------------------------------------------------------------------------------------

def _dropout(node: fx.Node, b: Emit) -> list | None:
    x, p, train = node.args[:3]
    if train and p != 0:
        return None   # random: left to the fallback
    kept = b(aten.clone.default, x) if x.op == "placeholder" else x
    ones = b(aten.full.default, list(fx_util.shape(x)), True, dtype=torch.bool, device=fx_util.val(x).device)
    return [kept, ones]


RULES: dict[Any, Rule] = {
    aten.addmm.default: _addmm,
    aten.linear.default: _linear,
    aten.native_layer_norm.default: _layer_norm,
    aten.native_layer_norm_backward.default: _layer_norm_backward,
    aten.mean.dim: _mean,
    aten.silu_backward.default: _silu_backward,
    aten.sigmoid_backward.default: _sigmoid_backward,
    aten.tanh_backward.default: _tanh_backward,
    aten.threshold_backward.default: _threshold_backward,
    aten._log_softmax.default: _log_softmax,
    aten._softmax.default: _softmax,
    aten._log_softmax_backward_data.default: _log_softmax_backward,
    aten._softmax_backward_data.default: _softmax_backward,
    aten.nll_loss_forward.default: _nll_loss,
    aten.nll_loss_backward.default: _nll_loss_backward,
    aten.native_dropout.default: _dropout,
}
if hasattr(aten, "_fused_rms_norm"):
    RULES[aten._fused_rms_norm.default] = _rms_norm
if hasattr(aten, "_fused_rms_norm_backward"):
    RULES[aten._fused_rms_norm_backward.default] = _rms_norm_backward


def _unfusable_classes(x: Any, target: str) -> bool:
    """Whether x's last dim (a (log-)softmax's or nll_loss's classes) is one no epilogue of `target` can take
    (the "cuda" kernel's N is a multiple of ALIGN)."""
    shape = fx_util.shape(x)
    return target == "cuda" and len(shape) >= 1 and shape[-1] % ALIGN != 0


def decompose(gm: fx.GraphModule, target: str = "interpret") -> fx.GraphModule:
    """gm with every op of RULES rewritten (where its rule applies) into epilogue primitives, for `target`'s
    kernel (rules.TARGETS)."""
    gm = fx_util.clone(gm)
    graph = gm.graph
    for node in list(graph.nodes):
        rule = RULES.get(node.target) if node.op == "call_function" else None
        if rule is None or not fx_util.is_static(node):
            continue
        with graph.inserting_before(node):
            if rule is _nll_loss and _unfusable_classes(node.args[0], target):
                out = _nll_loss(node, Emit(graph, fx_util.pass_tag(node)), gather=True)
            elif rule in (_log_softmax, _softmax) and _unfusable_classes(node.args[0], target):
                out = rule(node, Emit(graph, fx_util.pass_tag(node)), online=True)
            else:
                out = rule(node, Emit(graph, fx_util.pass_tag(node)))
        if out is None:
            continue
        if isinstance(out, list):
            fx_util.replace_outputs(node, out)
            for user in list(node.users):
                if not user.users:
                    graph.erase_node(user)
        else:
            fx_util.replace(node, out)
        if not node.users:
            graph.erase_node(node)
    for node in graph.nodes:   # node references: no later pass reads them
        node.meta.pop(ROW_SUM, None)
        node.meta.pop(LSE_OF, None)
    return fx_util.finish(gm)
