"""RMSNorm-scaled linear (+ activation): the consuming half of a fused RMSNorm,

    out = act(rstd ⊙row (x @ weightᵀ))

with x = h = residual ⊙ norm_weight from linear_residual_norm and rstd its statistic (fp32).
activation: None, "silu", "relu", "gelu" (erf) or "gelu_tanh".
"""
from __future__ import annotations

from typing import Optional

import torch

import coda_ext as ce

from . import common

NAME = "rms_linear"
ACTIVATIONS = {
    None: lambda v: v, "silu": ce.silu, "relu": ce.relu,
    "gelu": ce.gelu, "gelu_tanh": lambda v: ce.gelu(v, approximate="tanh"),
}
_TORCH_ACT = {
    None: lambda v: v, "silu": torch.nn.functional.silu, "relu": torch.relu,
    "gelu": torch.nn.functional.gelu, "gelu_tanh": lambda v: torch.nn.functional.gelu(v, approximate="tanh"),
}


def graph(activation: Optional[str]) -> ce.Graph:
    g = ce.Graph()
    g.output(ACTIVATIONS[activation](g.accumulator() * g.col_vector("rstd", "float32")))
    return g


def reference(x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor, activation: Optional[str] = None):
    """fp32 reference: act(rstd[:, None] * (x @ weightᵀ))."""
    return _TORCH_ACT[activation](rstd.float()[..., None] * (x.float() @ weight.float().t()))


@torch.library.custom_op("coda_ext::rms_linear", mutates_args=())
def _op(x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor, activation: str) -> torch.Tensor:
    op = common.graph_op(graph, common.dtype_name(x.dtype), "auto", activation or None)
    return op.run(x, weight, {"rstd": rstd}, {}).out


@_op.register_fake
def _fake(x, weight, rstd, activation):
    return x.new_empty(x.shape[0], weight.shape[0])


def rms_linear(x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor,
               activation: Optional[str] = None) -> torch.Tensor:
    """act(rstd ⊙row (x @ weightᵀ)) in x's dtype. x (..., K), weight (N, K), rstd (...) fp32."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"{NAME}: activation must be one of {list(ACTIVATIONS)}, got {activation!r}")
    common.check_linear(NAME, x, weight)
    lead = tuple(x.shape[:-1])
    common.check_rows(NAME, "rstd", rstd, lead, None, torch.float32, x.device)
    out = torch.ops.coda_ext.rms_linear(common.rows(x), weight, rstd.reshape(-1), activation or "")
    return out.reshape(*lead, weight.shape[0])


BUILDS = [(graph, (a,), "kk") for a in ACTIVATIONS]
