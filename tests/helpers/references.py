"""The ready ops' math done by PyTorch in the op's dtype (the baseline of the tolerance rule, checks.py),
where more than one test or benchmark needs the same one."""
from __future__ import annotations

import torch
import torch.nn.functional as F

THETA = 500000.0   # Llama 3's RoPE base
EPS = 1e-6
#: rms_linear's activations, by the name the op takes
ACTIVATIONS = {None: lambda v: v, "silu": F.silu, "relu": torch.relu, "gelu": F.gelu,
               "gelu_tanh": lambda v: F.gelu(v, approximate="tanh")}


def qkv_in_dtype(z: torch.Tensor, pos: torch.Tensor, n_heads: int, n_kv_heads: int, theta: float = THETA,
                 rstd: torch.Tensor | None = None, q_norm_weight: torch.Tensor | None = None,
                 k_norm_weight: torch.Tensor | None = None, eps: float = EPS) -> torch.Tensor:
    """qkv_rope after its GEMM (z = x Wᵀ, (..., (H + 2 KV) · hd)) in z's dtype: the rstd scale, per-head
    RMSNorm of Q and K, RoPE on adjacent pairs (angles in fp64, cos/sin rounded to the dtype)."""
    from coda_ext import ops

    if rstd is not None:
        z = z * rstd.to(z.dtype)[..., None]
    hd = z.shape[-1] // (n_heads + 2 * n_kv_heads)
    q, k, v = z.unflatten(-1, (n_heads + 2 * n_kv_heads, hd)).split([n_heads, n_kv_heads, n_kv_heads], dim=-2)
    if q_norm_weight is not None:
        q = q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + eps) * q_norm_weight
        k = k * torch.rsqrt(k.pow(2).mean(-1, keepdim=True) + eps) * k_norm_weight
    angle = pos.double()[..., None, None] * ops.default_inv_freq(hd, theta).to(pos.device)
    cos, sin = torch.cos(angle).to(z.dtype), torch.sin(angle).to(z.dtype)

    def rotate(t):
        a, b = t[..., 0::2], t[..., 1::2]
        return torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).flatten(-2)

    return torch.cat([rotate(q), rotate(k), v], dim=-2).flatten(-2)
