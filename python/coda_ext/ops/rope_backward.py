"""RoPE backward and the ZdZ statistic of the QKV GEMM (element-wise: dqkv comes from attention,
not from a GEMM, so this pass stays outside epilogues):

    dz[q, k heads] = R(θ)ᵀ dqkv      (each adjacent pair rotated back by −θ; V passes through)
    zdz            = Σ_k qkv_k · dqkv_k      per row, fp32

The rotation is orthogonal, so Σ qkv·dqkv = Σ z·dz of the pre-RoPE z: the RMSNorm backward in the
QKV dX GEMM (norm_backward) needs no saved z. Angles are reduced exactly, per pair frequency
(head_dim/2 of them), in fp64, as the forward epilogue does.
"""
from __future__ import annotations

import torch

from . import common

NAME = "qkv_rope_backward"


def _cos_sin(positions: torch.Tensor, freqs: torch.Tensor, head_dim: int):
    """cos, sin (M, 1, head_dim/2) fp32 of the forward's angles (the first head's pair frequencies)."""
    f = freqs[:, 0:head_dim:2].double()                       # (2, hd/2): hi, lo in turns
    t = positions.reshape(-1, 1).double() * (f[0] + f[1])
    t = t - torch.round(t)
    angle = 2 * torch.pi * t
    return torch.cos(angle).float()[:, None, :], torch.sin(angle).float()[:, None, :]


def reference(dqkv: torch.Tensor, qkv: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor, n_heads: int,
              n_kv_heads: int):
    """(dz, zdz), in fp32."""
    return _backward(dqkv.float(), qkv.float(), positions, freqs, n_heads, n_kv_heads)


def _backward(dqkv, qkv, positions, freqs, n_heads, n_kv_heads):
    lead, N = tuple(dqkv.shape[:-1]), dqkv.shape[-1]
    hd = N // (n_heads + 2 * n_kv_heads)
    d = common.rows(dqkv).unflatten(-1, (n_heads + 2 * n_kv_heads, hd))
    cos, sin = _cos_sin(positions, freqs, hd)
    qk = d[:, : n_heads + n_kv_heads].float()
    a, b = qk[..., 0::2], qk[..., 1::2]
    back = torch.stack([a * cos + b * sin, b * cos - a * sin], dim=-1).flatten(-2)
    dz = torch.cat([back.to(d.dtype), d[:, n_heads + n_kv_heads:]], dim=1).flatten(-2)
    zdz = (common.rows(qkv).float() * common.rows(dqkv).float()).sum(-1)
    return dz.reshape(*lead, N), zdz.reshape(lead)


def qkv_rope_backward(dqkv: torch.Tensor, qkv: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor,
                      n_heads: int, n_kv_heads: int):
    """(dz, zdz): the gradient of qkv_rope's pre-RoPE output (..., N) in dqkv's dtype, and the row
    statistic Σ qkv·dqkv (fp32) for the norm backward. Inputs as qkv_rope took them (without QK-norm)."""
    for name, t in (("dqkv", dqkv), ("qkv", qkv)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{NAME}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if dqkv.shape != qkv.shape:
        raise ValueError(f"{NAME}: dqkv {tuple(dqkv.shape)} and qkv {tuple(qkv.shape)} must have one shape")
    N = dqkv.shape[-1]
    if n_heads < 1 or n_kv_heads < 1 or N % (n_heads + 2 * n_kv_heads) or (N // (n_heads + 2 * n_kv_heads)) % 2:
        raise ValueError(f"{NAME}: the last dimension {N} is not (n_heads + 2·n_kv_heads) heads of an even head_dim")
    if not isinstance(freqs, torch.Tensor) or tuple(freqs.shape) != (2, N):
        raise ValueError(f"{NAME}: freqs must be the (2, {N}) table of coda_ext.ops.rope_frequencies")
    common.check_rows(NAME, "positions", positions, tuple(dqkv.shape[:-1]), None, None, dqkv.device)
    return _backward(dqkv, qkv, positions, freqs, n_heads, n_kv_heads)
