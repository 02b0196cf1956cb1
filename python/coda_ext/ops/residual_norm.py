"""linear + residual + RMSNorm statistics (CODA K1/K3): the down or output projection adds the
residual stream, applies the next norm's weight and produces the norm's statistic:

    out  = x @ weightᵀ + residual          (the new residual stream, stored)
    h    = out ⊙ norm_weight               (the next GEMM's input, stored)
    rstd = rsqrt(mean(out², -1) + eps)     (fp32, from deterministic per-tile partials)

so RMSNorm(out) @ Wᵀ = rstd ⊙row (h @ Wᵀ) is finished by the next GEMM's epilogue (rms_linear,
linear_swiglu, qkv_rope). The statistic is summed from the fp32 value of out before rounding.

Backward (autograd), from the saved x, weight, out, rstd and norm_weight: with incoming gradients
(dout, dh, drstd) (any of them may be absent), in fp32 then rounded once to x's dtype,

    g      = dout + dh ⊙ γ − drstd · rstd³ · out / N      (dL/dout in total)
    dx     = g @ weight          (coda_ext::linear_dx)     dweight = gᵀ @ x   (coda_ext::weight_grad)
    dresidual = g,               dγ = Σ_rows dh ⊙ out (fp32, then γ's dtype)
"""
from __future__ import annotations

import torch

from .. import graphs
from . import common, finish

NAME = "linear_residual_norm"


#: The op's epilogue graph (coda_ext.graphs).
graph = graphs.linear_residual_norm


def reference(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor,
              eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp32 reference (any device): (out, h, rstd) in fp32."""
    out = x.float() @ weight.float().t() + residual.float()
    h = out * norm_weight.float()
    rstd = torch.rsqrt(out.pow(2).mean(-1) + eps)
    return out, h, rstd


@common.direct
@torch.library.custom_op("coda_ext::linear_residual_norm", mutates_args=())
def _op(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor,
        eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r = common.run_gemm(NAME, **_gemm(x, weight, residual, norm_weight))
    return r.out, r.h, finish.rstd_(r.sumsq, weight.shape[0], eps)


def _gemm(x, weight, residual, norm_weight):
    """The op's GEMM, as common.run_gemm and check_gemm take it."""
    return dict(build=graph, args=(), A=x, W=weight, inputs={"residual": residual, "norm_weight": norm_weight})


@_op.register_fake
def _fake(x, weight, residual, norm_weight, eps):
    common.check_gemm(NAME, **_gemm(x, weight, residual, norm_weight))
    M, N = x.shape[0], weight.shape[0]
    return x.new_empty(M, N), x.new_empty(M, N), x.new_empty(M, dtype=torch.float32)


def _setup_context(ctx, inputs, output):
    x, weight, _, norm_weight, _ = inputs
    out, _, rstd = output
    ctx.set_materialize_grads(False)  # an output that does not reach the loss gets None, not zeros
    ctx.save_for_backward(x, weight, out, rstd, norm_weight)


def _backward(ctx, dout, dh, drstd):
    x, weight, out, rstd, norm_weight = ctx.saved_tensors
    need_x, need_w, need_res, need_gamma, _ = ctx.needs_input_grad
    o = out.float()
    dgamma = None
    if need_gamma and dh is not None:
        dgamma = (dh.float() * o).sum(0).to(norm_weight.dtype)
    dx = dweight = dres = None
    if need_x or need_w or need_res:
        g = torch.zeros_like(o) if dout is None else dout.float()
        if dh is not None:
            g = g + dh.float() * norm_weight.float()
        if drstd is not None:
            g = g - (drstd.float() * rstd.float().pow(3) / o.shape[-1])[:, None] * o
        g = g.to(x.dtype).contiguous()
        if need_x:
            dx = common.call("linear_dx", g, weight.contiguous())
        if need_w:
            dweight = common.call("weight_grad", g, x.contiguous(), None)
        if need_res:
            dres = g
    return dx, dweight, dres, dgamma, None


_op.register_autograd(_backward, setup_context=_setup_context)


def linear_residual_norm(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor,
                         eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, h, rstd): out = x @ weightᵀ + residual, h = out ⊙ norm_weight (both x's dtype), rstd (fp32)
    the RMSNorm statistic of out. x (..., K), weight (N, K), residual (..., N), norm_weight (N,)."""
    common.check_linear(NAME, x, weight)
    lead, N = tuple(x.shape[:-1]), weight.shape[0]
    common.check_rows(NAME, "residual", residual, lead, N, x.dtype, x.device)
    common.check_vector(NAME, "norm_weight", norm_weight, N, x.device, x.dtype)
    out, h, rstd = common.call("linear_residual_norm", common.rows(x), weight, common.rows(residual),
                                                           norm_weight, float(eps))
    return out.reshape(*lead, N), h.reshape(*lead, N), rstd.reshape(lead)


BUILDS = [(graph, (), "kk")]
