"""linear + SwiGLU on interleaved gate/up columns (CODA K2):

    z = [rstd ⊙row] (x @ weightᵀ)          weight rows alternate gate, up (interleave_gate_up)
    y[:, i] = silu(z[:, 2i]) · z[:, 2i+1]   half width, computed from the fp32 accumulator

`linear_swiglu` writes only y (no M × 2F tensor: the graph has no main output);
`linear_swiglu_train` also writes z, the pre-activation the backward pass needs.

Backward (autograd), from z (saved by the train op; linear_swiglu recomputes it with the train op,
one GEMM) and the incoming dy (and dz, the train op's second output's gradient, if any), in fp32:

    dg = dy · u · σ(g) · (1 + g (1 − σ(g))),  du = dy · silu(g)     (g, u) = z[:, 2i], z[:, 2i+1]
    dz = (dg, du) interleaved [+ the incoming dz]
    dacc = [rstd ·] dz rounded once to x's dtype;  drstd = Σ_k z_k dz_k / rstd
    dx = dacc @ weight (coda_ext::linear_dx),  dweight = daccᵀ @ x (coda_ext::weight_grad)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import graphs
from . import common, layouts

NAME = "linear_swiglu"


#: The op's epilogue graph (coda_ext.graphs): graph(scaled, store_preact).
graph = graphs.linear_swiglu


def reference(x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor | None = None):
    """fp32 reference: (y, z)."""
    z = x.float() @ weight.float().t()
    if rstd is not None:
        z = rstd.float()[..., None] * z
    return F.silu(z[..., 0::2]) * z[..., 1::2], z


def _gemm(x, weight, rstd, store_preact):
    """The op's GEMM, as common.run_gemm and check_gemm take it."""
    return dict(build=graph, args=(rstd is not None, store_preact), A=x, W=weight,
                inputs={} if rstd is None else {"rstd": rstd})


def _run(x, weight, rstd, store_preact):
    return common.run_gemm(NAME, **_gemm(x, weight, rstd, store_preact))


@common.direct
@torch.library.custom_op("coda_ext::linear_swiglu", mutates_args=())
def _op(x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor | None) -> torch.Tensor:
    return _run(x, weight, rstd, False).y


@_op.register_fake
def _fake(x, weight, rstd):
    common.check_gemm(NAME, **_gemm(x, weight, rstd, False))
    return x.new_empty(x.shape[0], weight.shape[0] // 2)


@common.direct
@torch.library.custom_op("coda_ext::linear_swiglu_train", mutates_args=())
def _op_train(x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    r = _run(x, weight, rstd, True)
    return r.y, r.z


@_op_train.register_fake
def _fake_train(x, weight, rstd):
    common.check_gemm(NAME, **_gemm(x, weight, rstd, True))
    M, N = x.shape[0], weight.shape[0]
    return x.new_empty(M, N // 2), x.new_empty(M, N)


def _dswiglu(dy: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """dL/dz (fp32, interleaved (dg, du)) of y = silu(z[:, 0::2]) · z[:, 1::2] from dy."""
    gate, up = z[:, 0::2], z[:, 1::2]
    sig = torch.sigmoid(gate)
    dy = dy.float()
    dg = dy * up * sig * (1.0 + gate * (1.0 - sig))
    du = dy * gate * sig
    return torch.stack([dg, du], dim=-1).flatten(-2)


def _grads(ctx, x, weight, rstd, z, dy, dz_in):
    """(dx, dweight, drstd) from the saved pre-activation z and the outputs' gradients."""
    need_x, need_w, need_rstd = ctx.needs_input_grad[:3]
    zf = z.float()
    dz = torch.zeros_like(zf) if dy is None else _dswiglu(dy, zf)
    if dz_in is not None:
        dz = dz + dz_in.float()
    drstd = (zf * dz).sum(-1) / rstd.float() if rstd is not None and need_rstd else None
    dx = dweight = None
    if need_x or need_w:
        dacc = (dz if rstd is None else rstd.float()[:, None] * dz).to(x.dtype).contiguous()
        if need_x:
            dx = common.call("linear_dx", dacc, weight.contiguous())
        if need_w:
            dweight = common.call("weight_grad", dacc, x.contiguous(), None)
    return dx, dweight, drstd


def _setup_context(ctx, inputs, output):
    x, weight, rstd = inputs
    ctx.save_for_backward(x, weight, rstd)


def _backward(ctx, dy):
    x, weight, rstd = ctx.saved_tensors
    _, z = common.call("linear_swiglu_train", x, weight, rstd)
    return _grads(ctx, x, weight, rstd, z, dy, None)


def _setup_context_train(ctx, inputs, output):
    x, weight, rstd = inputs
    ctx.set_materialize_grads(False)  # z kept only for backward: its gradient is None, not zeros
    ctx.save_for_backward(x, weight, rstd, output[1])


def _backward_train(ctx, dy, dz):
    x, weight, rstd, z = ctx.saved_tensors
    return _grads(ctx, x, weight, rstd, z, dy, dz)


_op.register_autograd(_backward, setup_context=_setup_context)
_op_train.register_autograd(_backward_train, setup_context=_setup_context_train)


def _check(x, weight, rstd):
    """(lead, rstd as rows, the interleaved weight) of a checked call."""
    weight = layouts.gate_up_weight(weight, NAME)
    common.check_linear(NAME, x, weight)
    if weight.shape[0] % 2:
        raise ValueError(f"{NAME}: weight has {weight.shape[0]} rows; gate/up rows come in interleaved pairs, so "
                         "it must be even (build it with coda_ext.ops.interleave_gate_up)")
    lead = tuple(x.shape[:-1])
    if rstd is not None:
        common.check_rows(NAME, "rstd", rstd, lead, None, torch.float32, x.device)
    return lead, None if rstd is None else rstd.reshape(-1), weight


def linear_swiglu(x: torch.Tensor, weight: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
                  rstd: torch.Tensor | None = None) -> torch.Tensor:
    """y = silu(z[:, 0::2]) · z[:, 1::2] with z = [rstd ⊙row] x @ weightᵀ; only y (..., N/2) is written.
    weight: the pair (W_gate, W_up) of (F, K) weights as stored (interleaved once per weight version:
    coda_ext.ops.layouts.gate_up_weight), or the (2F, K) weight with rows interleaved gate, up
    (coda_ext.ops.interleave_gate_up; not torch.cat([W_gate, W_up]))."""
    lead, r, weight = _check(x, weight, rstd)
    return common.call("linear_swiglu", common.rows(x), weight, r).reshape(*lead, weight.shape[0] // 2)


def linear_swiglu_train(x: torch.Tensor, weight: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
                        rstd: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, z): as linear_swiglu, and the pre-activation z (..., 2F) for the backward pass (interleaved
    gate, up columns, as swiglu_backward_linear reads it)."""
    lead, r, weight = _check(x, weight, rstd)
    y, z = common.call("linear_swiglu_train", common.rows(x), weight, r)
    return y.reshape(*lead, weight.shape[0] // 2), z.reshape(*lead, weight.shape[0])


BUILDS = [(graph, (s, p), "kk") for s in (False, True) for p in (False, True)]
