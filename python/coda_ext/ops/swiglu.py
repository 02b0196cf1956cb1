"""linear + SwiGLU on interleaved gate/up columns (CODA K2):

    z = [rstd ⊙row] (x @ weightᵀ)          weight rows alternate gate, up (interleave_gate_up)
    y[:, i] = silu(z[:, 2i]) · z[:, 2i+1]   half width, computed from the fp32 accumulator

`linear_swiglu` writes only y (no M × 2F tensor: the graph has no main output);
`linear_swiglu_train` also writes z, the pre-activation the backward pass needs.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

import coda_ext as ce

from . import common

NAME = "linear_swiglu"


def graph(scaled: bool, store_preact: bool) -> ce.Graph:
    g = ce.Graph()
    z = g.accumulator()
    if scaled:
        z = z * g.col_vector("rstd", "float32")
    if store_preact:
        g.output(z, name="z")
    g.store("y", ce.swiglu_pairs(z))
    return g


def reference(x: torch.Tensor, weight: torch.Tensor, rstd: Optional[torch.Tensor] = None):
    """fp32 reference: (y, z)."""
    z = x.float() @ weight.float().t()
    if rstd is not None:
        z = rstd.float()[..., None] * z
    return F.silu(z[..., 0::2]) * z[..., 1::2], z


def _run(x, weight, rstd, store_preact):
    op = common.graph_op(graph, common.dtype_name(x.dtype), "auto", rstd is not None, store_preact)
    return op.run(x, weight, {} if rstd is None else {"rstd": rstd}, {})


@torch.library.custom_op("coda_ext::linear_swiglu", mutates_args=())
def _op(x: torch.Tensor, weight: torch.Tensor, rstd: Optional[torch.Tensor]) -> torch.Tensor:
    return _run(x, weight, rstd, False).y


@_op.register_fake
def _fake(x, weight, rstd):
    return x.new_empty(x.shape[0], weight.shape[0] // 2)


@torch.library.custom_op("coda_ext::linear_swiglu_train", mutates_args=())
def _op_train(x: torch.Tensor, weight: torch.Tensor, rstd: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    r = _run(x, weight, rstd, True)
    return r.y, r.z


@_op_train.register_fake
def _fake_train(x, weight, rstd):
    M, N = x.shape[0], weight.shape[0]
    return x.new_empty(M, N // 2), x.new_empty(M, N)


def _check(x, weight, rstd):
    common.check_linear(NAME, x, weight)
    if weight.shape[0] % 2:
        raise ValueError(f"{NAME}: weight has {weight.shape[0]} rows; gate/up rows come in interleaved pairs, so "
                         "it must be even (build it with coda_ext.ops.interleave_gate_up)")
    lead = tuple(x.shape[:-1])
    if rstd is not None:
        common.check_rows(NAME, "rstd", rstd, lead, None, torch.float32, x.device)
    return lead, None if rstd is None else rstd.reshape(-1)


def linear_swiglu(x: torch.Tensor, weight: torch.Tensor, rstd: Optional[torch.Tensor] = None) -> torch.Tensor:
    """y = silu(z[:, 0::2]) · z[:, 1::2] with z = [rstd ⊙row] x @ weightᵀ; only y (..., N/2) is written.
    weight (N, K): rows interleaved gate, up (coda_ext.ops.interleave_gate_up)."""
    lead, r = _check(x, weight, rstd)
    return torch.ops.coda_ext.linear_swiglu(common.rows(x), weight, r).reshape(*lead, weight.shape[0] // 2)


def linear_swiglu_train(x: torch.Tensor, weight: torch.Tensor,
                        rstd: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, z): as linear_swiglu, and the pre-activation z (..., N) for the backward pass."""
    lead, r = _check(x, weight, rstd)
    y, z = torch.ops.coda_ext.linear_swiglu_train(common.rows(x), weight, r)
    return y.reshape(*lead, weight.shape[0] // 2), z.reshape(*lead, weight.shape[0])


BUILDS = [(graph, (s, p), "kk") for s in (False, True) for p in (False, True)]
