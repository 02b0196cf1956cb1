"""The RoPE backward's element-wise pass as one Triton kernel (rope_backward on a GPU, the table in
rope_frequencies' layout):

    dz[:, :n_rot] = pairs of (dq | dk) rotated back by −θ      dz[:, n_rot:] = dv
    zdz           = Σ_k qkv_k · (dq | dk | dv)_k   per row, fp32

It reads attention's three gradients where they lie (each as rows of one stride: no concatenation, which
was a copy of the whole gradient before the pass) and qkv once, writes dz once: the bytes of the pass and
nothing else. One program takes BLOCK_M rows through all three parts; a head's pairs share one row of the
(M, head_dim/2) cosine and sine tables.
"""
from __future__ import annotations

import contextlib
import functools

import torch

#: Rows per program; pairs per column block (2 · BLOCK_P columns of a part at a time).
BLOCK_M, BLOCK_P = 8, 128


@functools.cache
def _kernel():
    try:
        from . import _rope_triton
    except ImportError as e:   # CUDA builds of torch on Linux bring it
        raise ImportError("coda_ext runs the RoPE backward on the GPU with a Triton kernel, and triton does not "
                          f"import ({e}); install the triton that matches your torch (pip install triton)") from e

    return _rope_triton.rope_backward_kernel


def as_rows(t: torch.Tensor, M: int, width: int) -> torch.Tensor | None:
    """t as an (M, width) view whose columns are adjacent (one row stride), or None where its layout has none."""
    try:
        v = t.view(M, width)
    except RuntimeError:
        return None
    return v if width <= 1 or v.stride(1) == 1 else None


def rope_backward(parts: tuple[torch.Tensor, torch.Tensor, torch.Tensor], qkv: torch.Tensor, cos: torch.Tensor,
                  sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dz (M, N) in the parts' dtype, zdz (M,) fp32) from dq, dk, dv given as (M, w) row views (as_rows),
    qkv (M, N) with adjacent columns, cos and sin (M, 1, head_dim/2) fp32 contiguous (one head's table)."""
    dq, dk, dv = parts
    M, N = qkv.shape
    half = cos.shape[-1]
    widths = tuple(p.shape[1] for p in parts)
    if sum(widths) != N or any(w % 2 for w in widths) or qkv.stride(1) != 1:
        raise ValueError(f"rope_backward: parts of widths {widths} do not make qkv's {N} columns in pairs")
    if not (cos.is_contiguous() and sin.is_contiguous() and cos.shape == (M, 1, half) == sin.shape):
        raise ValueError(f"rope_backward: cos and sin must be contiguous (M, 1, head_dim/2), got {tuple(cos.shape)}")
    dz = torch.empty((M, N), dtype=dq.dtype, device=qkv.device)
    zdz = torch.empty(M, dtype=torch.float32, device=qkv.device)
    if M:
        with torch.cuda.device(qkv.device) if qkv.is_cuda else contextlib.nullcontext():   # CPU: Triton's interpreter
            _kernel()[(-(-M // BLOCK_M),)](dq, dq.stride(0), dk, dk.stride(0), dv, dv.stride(0), qkv, qkv.stride(0),
                                           cos, sin, dz, dz.stride(0), zdz, M, *widths, HALF=half,
                                           BLOCK_M=BLOCK_M, BLOCK_P=BLOCK_P, num_warps=4)
    return dz, zdz
