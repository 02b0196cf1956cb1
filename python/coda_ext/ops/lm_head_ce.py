"""LM head + cross-entropy forward without logits: the M × V logits exist only as accumulator
tiles. Per (row, vocabulary tile) the epilogue keeps an online log-sum-exp (running max and
rescaled sum) and picks the target logit by its column index; only per-tile partials reach
memory (2 · 4 bytes per row and tile: about 0.8 % of the bf16 logits at V = 128256 with
256-column tiles), finished in a fixed order:

    logits = [rstd ⊙row] (x @ weightᵀ)       (fp32, never stored)
    lse    = logsumexp(logits, -1)
    loss   = lse − logits[m, target[m]]     (0 where target == ignore_index)

Backward (autograd): the logits are recomputed one vocabulary chunk at a time; the epilogue turns
them straight into dlogits = softmax · c − onehot(target) · g (c, g: per-row loss gradients, lse
from the forward), scaled by rstd and with the row statistic Σ acc·dlogits for rstd's gradient;
then dx += dlogits_chunk @ W_chunk and dW_chunk = dlogits_chunkᵀ @ x. Memory: one M × chunk
tensor (chunk_bytes), never the M × V logits.
"""
from __future__ import annotations

import torch

from .. import graphs
from . import common, linear_grad

NAME = "lm_head_cross_entropy"
REDUCTIONS = ("none", "sum", "mean")
#: Bytes of the one dlogits chunk the backward holds (M × chunk columns, 16-bit).
CHUNK_BYTES = 256 * 2**20


#: The op's epilogue graphs (coda_ext.graphs): graph(scaled) the forward, backward_graph(scaled) the
#: dlogits of one vocabulary chunk.
graph = graphs.lm_head_cross_entropy
backward_graph = graphs.lm_head_cross_entropy_backward


def reference(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, rstd: torch.Tensor | None = None,
              ignore_index: int = -100, reduction: str = "mean") -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 reference: (loss, lse), with torch's cross_entropy on fp32 logits."""
    logits = x.float() @ weight.float().t()
    if rstd is not None:
        logits = rstd.float()[..., None] * logits
    flat = logits.reshape(-1, logits.shape[-1])
    loss = torch.nn.functional.cross_entropy(flat, target.reshape(-1).long(), ignore_index=ignore_index,
                                             reduction=reduction)
    lse = torch.logsumexp(flat, -1).reshape(target.shape)
    return (loss.reshape(target.shape) if reduction == "none" else loss), lse


def finish(lse: torch.Tensor, target_logit: torch.Tensor, target: torch.Tensor, ignore_index: int,
           reduction: str) -> torch.Tensor:
    """Per-token losses from the two row statistics, masked and reduced as torch's cross_entropy."""
    valid = target != ignore_index
    loss = torch.where(valid, lse - target_logit, torch.zeros_like(lse))
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / valid.sum()  # mean over the tokens that count (NaN if none, as torch)


@torch.library.custom_op("coda_ext::lm_head_cross_entropy", mutates_args=())
def _op(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, rstd: torch.Tensor | None,
        ignore_index: int, reduction: str) -> tuple[torch.Tensor, torch.Tensor]:
    r = common.run_gemm(NAME, **_gemm(x, weight, target, rstd, reduction))
    return finish(r.lse, r.target_logit, target, ignore_index, reduction), r.lse


def _gemm(x, weight, target, rstd, reduction):
    """The op's GEMM, as common.run_gemm and check_gemm take it, once its other arguments are checked."""
    _check_head(weight, target, reduction)
    inputs = {"target": target.to(torch.int32)}
    if rstd is not None:
        inputs["rstd"] = rstd
    return dict(build=graph, args=(rstd is not None,), A=x, W=weight, inputs=inputs)


def _check_head(weight, target, reduction):
    """What the op asks beyond its GEMM's inputs: a reduction it knows, integer targets, a vocabulary whose
    column indices are exact in fp32."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"{NAME}: reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if target.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{NAME}: target has dtype {target.dtype}; use integer class indices (torch.int64)")
    if weight.shape[0] >= 2**24:
        raise ValueError(f"{NAME}: a vocabulary of {weight.shape[0]} is not supported (column indices are exact in "
                         "fp32 below 2**24)")


@_op.register_fake
def _fake(x, weight, target, rstd, ignore_index, reduction):
    common.check_gemm(NAME, **_gemm(x, weight, target, rstd, reduction))
    M = x.shape[0]
    loss = x.new_empty(M, dtype=torch.float32) if reduction == "none" else x.new_empty((), dtype=torch.float32)
    return loss, x.new_empty(M, dtype=torch.float32)


def lm_head_cross_entropy(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                          rstd: torch.Tensor | None = None, ignore_index: int = -100,
                          reduction: str = "mean") -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, lse): the cross-entropy of logits = [rstd ⊙row] x @ weightᵀ against target, and the
    per-token log-sum-exp (fp32, for the backward pass). x (..., d), weight (V, d), target (...) int32/int64
    with ignore_index for tokens that do not count; reduction 'none' (per token), 'sum' or 'mean'."""
    common.check_linear(NAME, x, weight)
    lead = tuple(x.shape[:-1])
    common.check_rows(NAME, "target", target, lead, None, None, x.device)
    _check_head(weight, target, reduction)
    if rstd is not None:
        common.check_rows(NAME, "rstd", rstd, lead, None, torch.float32, x.device)
        rstd = rstd.reshape(-1)
    loss, lse = torch.ops.coda_ext.lm_head_cross_entropy(common.rows(x), weight, target.reshape(-1), rstd,
                                                         int(ignore_index), reduction)
    return (loss.reshape(lead) if reduction == "none" else loss), lse.reshape(lead)


def row_gradients(dloss: torch.Tensor, dlse: torch.Tensor | None, target: torch.Tensor, ignore_index: int,
                  reduction: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(coef, g) fp32 per row: dlogits = softmax · coef − onehot(target) · g."""
    valid = (target != ignore_index).float()
    g = dloss.float() * valid if reduction in ("none", "sum") else dloss.float() / valid.sum() * valid
    coef = g if dlse is None else g + dlse.float()
    return coef, g


def chunk_columns(M: int, V: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Vocabulary columns per backward chunk: the M × chunk dlogits fit chunk_bytes (multiple of 256)."""
    cols = max(256, chunk_bytes // max(1, 2 * M) // 256 * 256)
    return min(cols, (V + 7) // 8 * 8)


def gemms(M: int, V: int, d: int, scaled: bool, chunk_bytes: int | None = None) -> list:
    """(graph, major, (M, N, K) as launched) of every GEMM a forward + backward of M tokens launches
    (for prebuild: coda_ext.runtime.auto_items). chunk_bytes: the backward's chunk budget (CHUNK_BYTES)."""
    c = chunk_columns(M, V, CHUNK_BYTES if chunk_bytes is None else chunk_bytes)
    out = [(graph(scaled), "kk", (M, V, d))]
    for cols in sorted({c, V % c} - {0}):   # per chunk width: dlogits, dx, dx accumulated, dW
        accumulate = [(linear_grad.graph(True), "kn", (M, d, cols))] if V > c else []   # from the second chunk on
        out += [(backward_graph(scaled), "kk", (M, cols, d)), (linear_grad.graph(False), "kn", (M, d, cols)),
                *accumulate, (linear_grad.graph(False), "mn", (cols, d, M))]
    return out


@torch.library.custom_op("coda_ext::lm_head_cross_entropy_backward", mutates_args=())
def _op_backward(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, rstd: torch.Tensor | None,
                 lse: torch.Tensor, coef: torch.Tensor, g: torch.Tensor,
                 chunk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dtype = common.dtype_name(x.dtype)
    M, V = x.shape[0], weight.shape[0]
    scaled = rstd is not None
    op_d = common.graph_op(backward_graph, dtype, "auto", scaled)
    op_dx = common.graph_op(linear_grad.graph, dtype, "auto", False, major="kn")
    op_dx_acc = common.graph_op(linear_grad.graph, dtype, "auto", True, major="kn")
    op_dw = common.graph_op(linear_grad.graph, dtype, "auto", False, major="mn")
    dW = torch.empty_like(weight)
    drstd = torch.zeros(M, dtype=torch.float32, device=x.device)
    target32 = target.to(torch.int32)
    inputs = {"lse": lse, "coef": coef, "g_target": g}
    if scaled:
        inputs["rstd"] = rstd
    dx = None
    for v0 in range(0, V, chunk):
        w = weight[v0:v0 + chunk]
        r = op_d.run(x, w, {**inputs, "target": target32 - v0}, {})
        if scaled:
            drstd += r.drstd
        dx = op_dx.run(r.dacc, w.t(), {}, {}).out if dx is None else \
            op_dx_acc.run(r.dacc, w.t(), {"residual": dx}, {}).out
        op_dw.run(r.dacc.t(), x.t(), {}, {"out": dW[v0:v0 + chunk]})
    return dx, dW, drstd


@_op_backward.register_fake
def _fake_backward(x, weight, target, rstd, lse, coef, g, chunk):
    return torch.empty_like(x), torch.empty_like(weight), x.new_empty(x.shape[0], dtype=torch.float32)


def _setup_context(ctx, inputs, output):
    x, weight, target, rstd, ignore_index, reduction = inputs
    ctx.save_for_backward(x, weight, target, rstd, output[1])
    ctx.ignore_index, ctx.reduction = ignore_index, reduction


def _backward(ctx, dloss, dlse):
    x, weight, target, rstd, lse = ctx.saved_tensors
    V = weight.shape[0]
    if V % 8:
        raise ValueError(f"{NAME}: the backward pass needs a vocabulary that is a multiple of 8 (got {V}); pad the "
                         "LM head's rows")
    coef, g = row_gradients(dloss, dlse, target, ctx.ignore_index, ctx.reduction)
    dx, dW, drstd = torch.ops.coda_ext.lm_head_cross_entropy_backward(
        x, weight, target, rstd, lse, coef, g, chunk_columns(x.shape[0], V))
    return dx, dW, None, (drstd if rstd is not None else None), None, None


_op.register_autograd(_backward, setup_context=_setup_context)


BUILDS = [(graph, (s,), "kk") for s in (False, True)] + [(backward_graph, (s,), "kk") for s in (False, True)]
