"""LM head + cross-entropy forward without logits: the M × V logits exist only as accumulator
tiles. Per (row, vocabulary tile) the epilogue keeps an online log-sum-exp (running max and
rescaled sum) and picks the target logit by its column index; only per-tile partials reach
memory (2 · 4 bytes per row and tile: about 0.8 % of the bf16 logits at V = 128256 with
256-column tiles), finished in a fixed order:

    logits = [rstd ⊙row] (x @ weightᵀ)       (fp32, never stored)
    lse    = logsumexp(logits, -1)
    loss   = lse − logits[m, target[m]]     (0 where target == ignore_index)
"""
from __future__ import annotations

from typing import Optional

import torch

import coda_ext as ce

from . import common

NAME = "lm_head_cross_entropy"
REDUCTIONS = ("none", "sum", "mean")


def graph(scaled: bool) -> ce.Graph:
    g = ce.Graph()
    logits = g.accumulator()
    if scaled:
        logits = logits * g.col_vector("rstd", "float32")
    g.row_reduce("lse", logits, "logsumexp")
    picked = ce.where(ce.eq(g.col_index(), g.col_vector("target", "int32")), logits, 0.0)
    g.row_reduce("target_logit", picked, "sum")
    return g


def reference(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, rstd: Optional[torch.Tensor] = None,
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
def _op(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, rstd: Optional[torch.Tensor],
        ignore_index: int, reduction: str) -> tuple[torch.Tensor, torch.Tensor]:
    op = common.graph_op(graph, common.dtype_name(x.dtype), "auto", rstd is not None)
    inputs = {"target": target.to(torch.int32)}
    if rstd is not None:
        inputs["rstd"] = rstd
    r = op.run(x, weight, inputs, {})
    return finish(r.lse, r.target_logit, target, ignore_index, reduction), r.lse


@_op.register_fake
def _fake(x, weight, target, rstd, ignore_index, reduction):
    M = x.shape[0]
    loss = x.new_empty(M, dtype=torch.float32) if reduction == "none" else x.new_empty((), dtype=torch.float32)
    return loss, x.new_empty(M, dtype=torch.float32)


def lm_head_cross_entropy(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                          rstd: Optional[torch.Tensor] = None, ignore_index: int = -100,
                          reduction: str = "mean") -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, lse): the cross-entropy of logits = [rstd ⊙row] x @ weightᵀ against target, and the
    per-token log-sum-exp (fp32, for the backward pass). x (..., d), weight (V, d), target (...) int32/int64
    with ignore_index for tokens that do not count; reduction 'none' (per token), 'sum' or 'mean'."""
    common.check_linear(NAME, x, weight)
    if reduction not in REDUCTIONS:
        raise ValueError(f"{NAME}: reduction must be one of {REDUCTIONS}, got {reduction!r}")
    lead = tuple(x.shape[:-1])
    common.check_rows(NAME, "target", target, lead, None, None, x.device)
    if target.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{NAME}: target has dtype {target.dtype}; use integer class indices (torch.int64)")
    if weight.shape[0] >= 2**24:
        raise ValueError(f"{NAME}: a vocabulary of {weight.shape[0]} is not supported (column indices are exact in "
                         "fp32 below 2**24)")
    if rstd is not None:
        common.check_rows(NAME, "rstd", rstd, lead, None, torch.float32, x.device)
        rstd = rstd.reshape(-1)
    loss, lse = torch.ops.coda_ext.lm_head_cross_entropy(common.rows(x), weight, target.reshape(-1), rstd,
                                                         int(ignore_index), reduction)
    return (loss.reshape(lead) if reduction == "none" else loss), lse.reshape(lead)


BUILDS = [(graph, (s,)) for s in (False, True)]
