"""Weight-layout conversions between Hugging Face / torch.nn.Linear checkpoints and the layouts
the fused ops read. Convert once, at load and save, never per step; every pair round-trips.

- gate/up: separate W_gate, W_up (F, d) <-> one (2F, d) weight with rows gate₀, up₀, gate₁, up₁, …
  (linear_swiglu pairs adjacent columns).
- RoPE: Hugging Face's rotate-half order inside a head (first halves, then second halves) <->
  adjacent pairs (x₀, x_{hd/2}), (x₁, x_{hd/2+1}), … (qkv_rope rotates adjacent columns). Applies to
  the rows of W_q and W_k, to their biases and to QK-norm weights (dim selects the axis).
"""
from __future__ import annotations

import torch


def interleave_gate_up(w_gate: torch.Tensor, w_up: torch.Tensor) -> torch.Tensor:
    """(F, ...) gate and up -> (2F, ...) with rows gate₀, up₀, gate₁, up₁, ..."""
    if w_gate.shape != w_up.shape:
        raise ValueError(f"interleave_gate_up: gate {tuple(w_gate.shape)} and up {tuple(w_up.shape)} differ")
    return torch.stack([w_gate, w_up], dim=1).flatten(0, 1)


def split_gate_up(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse of interleave_gate_up: (gate, up), contiguous."""
    if w.shape[0] % 2:
        raise ValueError(f"split_gate_up: {w.shape[0]} rows cannot be gate/up pairs")
    return w[0::2].contiguous(), w[1::2].contiguous()


def _check_heads(name: str, t: torch.Tensor, head_dim: int, dim: int) -> int:
    if head_dim % 2 or head_dim < 2:
        raise ValueError(f"{name}: head_dim must be even, got {head_dim}")
    if t.shape[dim] % head_dim:
        raise ValueError(f"{name}: size {t.shape[dim]} along dim {dim} is not a multiple of head_dim {head_dim}")
    return t.shape[dim] // head_dim


def rotate_half_to_pairs(t: torch.Tensor, head_dim: int, dim: int = 0) -> torch.Tensor:
    """Rotate-half order -> adjacent pairs, head by head along `dim` (rows of W_q/W_k: dim 0)."""
    heads = _check_heads("rotate_half_to_pairs", t, head_dim, dim)
    d = dim % t.dim()
    x = t.unflatten(d, (heads, 2, head_dim // 2))
    return x.transpose(d + 1, d + 2).flatten(d, d + 2).contiguous()


def pairs_to_rotate_half(t: torch.Tensor, head_dim: int, dim: int = 0) -> torch.Tensor:
    """Adjacent pairs -> rotate-half order (the inverse of rotate_half_to_pairs)."""
    heads = _check_heads("pairs_to_rotate_half", t, head_dim, dim)
    d = dim % t.dim()
    x = t.unflatten(d, (heads, head_dim // 2, 2))
    return x.transpose(d + 1, d + 2).flatten(d, d + 2).contiguous()
