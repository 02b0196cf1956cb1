"""Weight-layout conversions between Hugging Face / torch.nn.Linear checkpoints and the layouts
the fused ops read. Convert once, at load and save, never per step; every pair round-trips.

- gate/up: separate W_gate, W_up (F, d) <-> one (2F, d) weight with rows gate₀, up₀, gate₁, up₁, …
  (linear_swiglu pairs adjacent columns; torch.cat([W_gate, W_up]) is not that layout). The ops also
  take the pair (W_gate, W_up) itself and interleave it once per weight version (gate_up_weight).
- RoPE: Hugging Face's rotate-half order inside a head (first halves, then second halves) <->
  adjacent pairs (x₀, x_{hd/2}), (x₁, x_{hd/2+1}), … (qkv_rope rotates adjacent columns). Applies to
  the rows of W_q and W_k, to their biases and to QK-norm weights (dim selects the axis).
"""
from __future__ import annotations

import weakref
from typing import Any

import torch

from . import common


def interleave_gate_up(w_gate: torch.Tensor, w_up: torch.Tensor) -> torch.Tensor:
    """(F, ...) gate and up -> (2F, ...) with rows gate₀, up₀, gate₁, up₁, ..."""
    if w_gate.shape != w_up.shape:
        raise ValueError(f"interleave_gate_up: gate {tuple(w_gate.shape)} and up {tuple(w_up.shape)} differ")
    return torch.stack([w_gate, w_up], dim=1).flatten(0, 1)


#: (id(W_gate), id(W_up)) -> (weak refs to both, their state, the interleaved copy); an entry goes with its weights
_INTERLEAVED: dict[tuple[int, int], tuple] = {}


def gate_up_weight(weight: Any, op: str = "linear_swiglu") -> torch.Tensor:
    """The (2F, d) interleaved weight the SwiGLU ops read, from what they were given: that weight itself,
    or a pair (W_gate, W_up) of (F, d) weights (as torch.nn.Linear stores them), interleaved once per
    version of both (a copy kept while they live; interleaved again when either changes: in place, an
    optimizer step, .data or .to()). The gradient of the copy flows back to W_gate and W_up. While traced
    (torch.compile, fake or meta tensors) or in CUDA-graph capture the pair is interleaved on every call."""
    if isinstance(weight, torch.Tensor):
        return weight
    pair = isinstance(weight, (tuple, list)) and len(weight) == 2
    if not (pair and all(isinstance(w, torch.Tensor) for w in weight)):
        raise TypeError(f"{op}: weight must be the interleaved (2F, d) tensor of coda_ext.ops.interleave_gate_up or a "
                        f"(W_gate, W_up) pair of (F, d) tensors, got {type(weight).__name__}")
    gate, up = weight
    if gate.shape != up.shape or gate.dtype != up.dtype or gate.device != up.device:
        raise ValueError(f"{op}: W_gate {tuple(gate.shape)} {gate.dtype} on {gate.device} and W_up {tuple(up.shape)} "
                         f"{up.dtype} on {up.device} must have one shape, dtype and device")
    if not common.readable(gate):
        return interleave_gate_up(gate, up)
    interleaved = _interleaved(gate, up)
    if torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad):
        return _Interleaved.apply(gate, up, interleaved)
    return interleaved


def _state(t: torch.Tensor) -> tuple:
    """What a change of `t` changes: its version (in-place writes), its data and layout (.data, .to())."""
    return t._version, t.data_ptr(), t.dtype, t.device, tuple(t.shape), t.stride()


def _interleaved(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    key, state = (id(gate), id(up)), (_state(gate), _state(up))
    seen = _INTERLEAVED.get(key)
    if seen is not None and seen[0]() is gate and seen[1]() is up and seen[2] == state:
        return seen[3]
    with torch.no_grad():
        w = interleave_gate_up(gate, up)

    def forget(_ref, key=key):
        _INTERLEAVED.pop(key, None)

    _INTERLEAVED[key] = (weakref.ref(gate, forget), weakref.ref(up, forget), state, w)
    return w


class _Interleaved(torch.autograd.Function):
    """The kept interleaved copy as a function of (W_gate, W_up): its gradient's rows split back."""

    @staticmethod
    def forward(ctx, gate, up, interleaved):
        return interleaved.detach()

    @staticmethod
    def backward(ctx, grad):
        return grad[0::2], grad[1::2], None


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
