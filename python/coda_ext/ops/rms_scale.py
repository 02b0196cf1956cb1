"""RMSNorm-scaled linear (+ activation): the consuming half of a fused RMSNorm,

    out = act(rstd ⊙row (x @ weightᵀ))

with x = h = residual ⊙ norm_weight from linear_residual_norm and rstd its statistic (fp32).
activation: None, "silu", "relu", "gelu" (erf) or "gelu_tanh".

Backward (autograd), with u = x @ weightᵀ and pre = rstd ⊙row u (the op's output without activation:
the saved output itself, else recomputed by this op without activation, one GEMM, rather than saved):

    dpre  = dout · act'(pre)           (fp32; torch's own activation backward)
    du    = rstd · dpre                rounded once to x's dtype
    drstd = Σ_k u_k dpre_k = Σ_k pre_k dpre_k / rstd
    dx    = du @ weight (coda_ext::linear_dx),   dweight = duᵀ @ x (coda_ext::weight_grad)
"""
from __future__ import annotations

import torch

from .. import graphs
from . import common

NAME = "rms_linear"
ACTIVATIONS = graphs.ACTIVATIONS
_TORCH_ACT = {
    None: lambda v: v, "silu": torch.nn.functional.silu, "relu": torch.relu,
    "gelu": torch.nn.functional.gelu, "gelu_tanh": lambda v: torch.nn.functional.gelu(v, approximate="tanh"),
}


#: The op's epilogue graph of an activation (coda_ext.graphs).
graph = graphs.rms_linear


def reference(x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor, activation: str | None = None):
    """fp32 reference: act(rstd[:, None] * (x @ weightᵀ))."""
    return _TORCH_ACT[activation](rstd.float()[..., None] * (x.float() @ weight.float().t()))


@common.direct
@torch.library.custom_op("coda_ext::rms_linear", mutates_args=())
def _op(x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor, activation: str) -> torch.Tensor:
    return common.run_gemm(NAME, **_gemm(x, weight, rstd, activation)).out


def _gemm(x, weight, rstd, activation):
    """The op's GEMM, as common.run_gemm and check_gemm take it."""
    return dict(build=graph, args=(_activation(activation),), A=x, W=weight, inputs={"rstd": rstd})


def _activation(activation: str | None) -> str | None:
    """One of ACTIVATIONS (the custom op's "" is None)."""
    if (activation or None) not in ACTIVATIONS:
        raise ValueError(f"{NAME}: activation must be one of {list(ACTIVATIONS)}, got {activation!r}")
    return activation or None


@_op.register_fake
def _fake(x, weight, rstd, activation):
    common.check_gemm(NAME, **_gemm(x, weight, rstd, activation))
    return x.new_empty(x.shape[0], weight.shape[0])


def _act_backward(activation: str, dout: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """dout · act'(pre), fp32 in and out: the backward of _TORCH_ACT[activation] as torch computes it."""
    aten = torch.ops.aten
    if not activation:
        return dout
    if activation == "silu":
        return aten.silu_backward(dout, pre)
    if activation == "relu":
        return aten.threshold_backward(dout, pre, 0)
    if activation == "gelu":
        return aten.gelu_backward(dout, pre, approximate="none")
    if activation == "gelu_tanh":
        return aten.gelu_backward(dout, pre, approximate="tanh")
    raise ValueError(f"{NAME}: activation must be one of {list(ACTIVATIONS)}, got {activation!r}")


def _setup_context(ctx, inputs, output):
    x, weight, rstd, activation = inputs
    ctx.activation = activation
    ctx.save_for_backward(x, weight, rstd, None if activation else output)


def _backward(ctx, dout):
    x, weight, rstd, out = ctx.saved_tensors
    need_x, need_w, need_rstd, _ = ctx.needs_input_grad
    pre = out if out is not None else common.call("rms_linear", x, weight, rstd, "")
    pre = pre.float()
    dpre = _act_backward(ctx.activation, dout.float(), pre)
    r = rstd.float()[:, None]
    drstd = (pre * dpre).sum(-1) / rstd.float() if need_rstd else None
    dx = dweight = None
    if need_x or need_w:
        du = (r * dpre).to(x.dtype).contiguous()
        if need_x:
            dx = common.call("linear_dx", du, weight.contiguous())
        if need_w:
            dweight = common.call("weight_grad", du, x.contiguous(), None)
    return dx, dweight, drstd, None


_op.register_autograd(_backward, setup_context=_setup_context)


def rms_linear(x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor,
               activation: str | None = None) -> torch.Tensor:
    """act(rstd ⊙row (x @ weightᵀ)) in x's dtype. x (..., K), weight (N, K), rstd (...) fp32."""
    _activation(activation)
    common.check_linear(NAME, x, weight)
    lead = tuple(x.shape[:-1])
    common.check_rows(NAME, "rstd", rstd, lead, None, torch.float32, x.device)
    out = common.call("rms_linear", common.rows(x), weight, rstd.reshape(-1), activation or "")
    return out.reshape(*lead, weight.shape[0])


BUILDS = [(graph, (a,), "kk") for a in ACTIVATIONS]
