"""RMSNorm backward in the epilogue of the dX GEMM that follows it (the ZdZ identity).

Forward being differentiated, per row: x̂ = rstd·x, n = x̂ ⊙ γ, z = n @ Wᵀ (the consumer GEMM's
output, rstd-scaled, before any activation or RoPE). With dz = dL/dz and acc = dz @ W = dL/dn:

    dx   = dx_in + rstd · (acc ⊙ γ − x̂ · ζ),   ζ = (1/d) Σ_k z_k dz_k  ("ZdZ", from zdz)
    n    = x̂ ⊙ γ                              (recomputed: the weight gradient is weight_grad(dz, n))
    dγ   = Σ_rows acc ⊙ x̂                      (fp32 column partials, finished deterministically)

Σ_j n_j acc_j = Σ_k z_k dz_k, so the statistic comes from where dz was made (the dSwiGLU epilogue,
the RoPE backward, the cross-entropy backward) and the norm backward needs no pass of its own.
"""
from __future__ import annotations

import torch

from .. import graphs
from . import common

NAME = "rms_norm_backward_linear"


#: The op's epilogue graph (coda_ext.graphs): graph(accumulate).
graph = graphs.rms_norm_backward_linear


def reference(dz: torch.Tensor, weight: torch.Tensor, x: torch.Tensor, rstd: torch.Tensor,
              norm_weight: torch.Tensor, zdz: torch.Tensor, dx_in: torch.Tensor | None = None):
    """fp32 reference: (dx, n, dgamma)."""
    acc = dz.float() @ weight.float()
    r = rstd.float()[..., None]
    xhat = x.float() * r
    gamma = norm_weight.float()
    dx = (acc * gamma - xhat * (zdz.float()[..., None] / x.shape[-1])) * r
    if dx_in is not None:
        dx = dx + dx_in.float()
    dgamma = (common.rows(acc) * common.rows(xhat)).sum(0)
    return dx, xhat * gamma, dgamma


@common.direct
@torch.library.custom_op("coda_ext::rms_norm_backward_linear", mutates_args=())
def _op(dz: torch.Tensor, weight: torch.Tensor, x: torch.Tensor, rstd: torch.Tensor, norm_weight: torch.Tensor,
        zdz: torch.Tensor, dx_in: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r = common.run_gemm(NAME, **_gemm(dz, weight, x, rstd, norm_weight, zdz, dx_in))
    return r.dx, r.n, r.dgamma


def _gemm(dz, weight, x, rstd, norm_weight, zdz, dx_in):
    """The op's GEMM (weight read as stored: a transposed view), as common.run_gemm and check_gemm take it."""
    inputs = {"x": x, "rstd": rstd, "norm_weight": norm_weight, "zdz": zdz, "inv_d": 1.0 / weight.shape[1]}
    if dx_in is not None:
        inputs["dx_in"] = dx_in
    return dict(build=graph, args=(dx_in is not None,), A=dz, W=weight.t(), inputs=inputs, major="kn",
                operands=("dz", "weight.t()"))


@_op.register_fake
def _fake(dz, weight, x, rstd, norm_weight, zdz, dx_in):
    common.check_gemm(NAME, **_gemm(dz, weight, x, rstd, norm_weight, zdz, dx_in))
    M, d = dz.shape[0], weight.shape[1]
    return dz.new_empty(M, d), dz.new_empty(M, d), dz.new_empty(d, dtype=torch.float32)


def rms_norm_backward_linear(dz: torch.Tensor, weight: torch.Tensor, x: torch.Tensor, rstd: torch.Tensor,
                             norm_weight: torch.Tensor, zdz: torch.Tensor, dx_in: torch.Tensor | None = None):
    """(dx, n, dgamma) of an RMSNorm whose output n fed z = n @ weightᵀ, from dz = dL/dz (..., N).
    weight (N, d) as stored; x (..., d) the norm's input (the residual stream); rstd (...) fp32;
    norm_weight γ (d,); zdz (...) fp32 = Σ_k z·dz per row; dx_in (..., d): a gradient added to dx
    (the residual path). dx and n in dz's dtype, dgamma (d,) fp32."""
    common.check_gradient_linear(NAME, dz, "dz", weight)
    lead, d = tuple(dz.shape[:-1]), weight.shape[1]
    common.check_rows(NAME, "x", x, lead, d, dz.dtype, dz.device)
    common.check_rows(NAME, "rstd", rstd, lead, None, torch.float32, dz.device)
    common.check_rows(NAME, "zdz", zdz, lead, None, torch.float32, dz.device)
    common.check_vector(NAME, "norm_weight", norm_weight, d, dz.device, dz.dtype)
    if dx_in is not None:
        common.check_rows(NAME, "dx_in", dx_in, lead, d, dz.dtype, dz.device)
        dx_in = common.rows(dx_in)
    dx, n, dgamma = common.call("rms_norm_backward_linear",
        common.rows(dz), weight, common.rows(x), rstd.reshape(-1), norm_weight, zdz.reshape(-1), dx_in)
    return dx.reshape(*lead, d), n.reshape(*lead, d), dgamma


BUILDS = [(graph, (a,), "kn") for a in (False, True)]
