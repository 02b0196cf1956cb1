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

import functools
import itertools

import torch

from . import common

#: Rows per program; pairs per column block (2 · BLOCK_P columns of a part at a time).
BLOCK_M, BLOCK_P = 8, 128


@functools.cache
def _kernel():
    return common.import_triton("runs the RoPE backward", f"{__package__}._rope_triton").rope_backward_kernel


def as_rows(t: torch.Tensor, M: int, width: int) -> torch.Tensor | None:
    """t as an (M, width) view with adjacent columns and one row stride, or None where its layout has none
    (decided from shape and strides, so a tracing compiler follows it without an exception)."""
    if t.numel() != M * width:
        return None
    dims = [(n, s) for n, s in zip(t.shape, t.stride()) if n != 1]
    tail, inner = 1, 1
    while dims and tail < width:   # the trailing dims that make a row: contiguous
        n, s = dims.pop()
        if s != inner:
            return None
        tail, inner = tail * n, inner * n
    if tail != width:
        return None
    row = dims[-1][1] if dims else width
    for (_, s0), (n1, s1) in itertools.pairwise(dims):   # the leading dims that make M: one stride
        if s0 != s1 * n1:
            return None
    return t.as_strided((M, width), (row, 1))


def _check(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, qkv: torch.Tensor, cos: torch.Tensor,
           sin: torch.Tensor) -> None:
    """What the kernel reads, refused before any launch (also through the custom op and while traced): three
    (M, w) parts with adjacent columns in qkv's dtype and on its device, w even, whole heads in dq and dk, the
    three making qkv's columns; cos and sin contiguous (M, 1, head_dim/2) fp32."""
    if qkv.dim() != 2 or (qkv.shape[1] > 1 and qkv.stride(1) != 1):
        raise ValueError(f"rope_backward: qkv must be (M, N) rows with adjacent columns, got {tuple(qkv.shape)} "
                         f"strides {qkv.stride()}")
    M, N = qkv.shape
    for name, t in (("dq", dq), ("dk", dk), ("dv", dv), ("cos", cos), ("sin", sin)):
        if t.device != qkv.device:
            raise ValueError(f"rope_backward: {name} is on {t.device}, qkv on {qkv.device}")
    half = cos.shape[-1] if cos.dim() == 3 else 0
    if not (half and cos.dtype == sin.dtype == torch.float32 and cos.is_contiguous() and sin.is_contiguous()
            and tuple(cos.shape) == (M, 1, half) == tuple(sin.shape)):
        raise ValueError(f"rope_backward: cos and sin must be contiguous float32 (M, 1, head_dim/2) = ({M}, 1, ...), "
                         f"got {tuple(cos.shape)} {cos.dtype} and {tuple(sin.shape)} {sin.dtype}")
    for name, t, whole_heads in (("dq", dq, True), ("dk", dk, True), ("dv", dv, False)):
        if t.dim() != 2 or t.shape[0] != M or (t.shape[1] > 1 and t.stride(1) != 1) or t.dtype != qkv.dtype:
            raise ValueError(f"rope_backward: {name} must be ({M}, w) rows with adjacent columns in {qkv.dtype}, "
                             f"got {tuple(t.shape)} strides {t.stride()} {t.dtype}")
        if t.shape[1] % (2 * half if whole_heads else 2):
            raise ValueError(f"rope_backward: {name} has {t.shape[1]} columns, not whole "
                             f"{'heads of ' + str(2 * half) if whole_heads else 'pairs'}")
    if dq.shape[1] + dk.shape[1] + dv.shape[1] != N:
        raise ValueError(f"rope_backward: dq, dk, dv of widths {(dq.shape[1], dk.shape[1], dv.shape[1])} do not "
                         f"make qkv's {N} columns")


def _launch(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, qkv: torch.Tensor, cos: torch.Tensor,
            sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    _check(dq, dk, dv, qkv, cos, sin)
    M, N = qkv.shape
    widths = (dq.shape[1], dk.shape[1], dv.shape[1])
    dz = torch.empty((M, N), dtype=dq.dtype, device=qkv.device)
    zdz = torch.empty(M, dtype=torch.float32, device=qkv.device)
    if M:
        common.launch_triton(_kernel(), ((M + BLOCK_M - 1) // BLOCK_M,), qkv.device, dq, dq.stride(0), dk,
                             dk.stride(0), dv, dv.stride(0), qkv, qkv.stride(0), cos, sin, dz, dz.stride(0), zdz,
                             M, *widths, HALF=cos.shape[-1], BLOCK_M=BLOCK_M, BLOCK_P=BLOCK_P, num_warps=4)
    return dz, zdz


#: The kernel as a custom op a tracing compiler keeps (its Triton kernel visible to Inductor), registered where
#: triton is installed (CUDA builds of torch); elsewhere rope_backward runs _launch under Triton's interpreter.
_op = common.triton_op("rope_backward_rows", _launch)


@torch.compiler.assume_constant_result
def available() -> bool:
    """Whether the kernel can run on a GPU here (triton installed and importable). A constant to a tracing
    compiler: Dynamo runs it instead of tracing the import inside, which it refuses."""
    return common.triton_available(_op, _kernel)


def rope_backward(parts: tuple[torch.Tensor, torch.Tensor, torch.Tensor], qkv: torch.Tensor, cos: torch.Tensor,
                  sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dz (M, N) in the parts' dtype, zdz (M,) fp32) from dq, dk, dv given as (M, w) row views (as_rows),
    qkv (M, N) with adjacent columns, cos and sin (M, 1, head_dim/2) fp32 contiguous (one head's table).
    Traceable by torch.compile (the custom op coda_ext::rope_backward_rows). Its inputs are checked before any
    launch (_check)."""
    if qkv.is_cuda and _op is not None:
        return _op(*parts, qkv, cos, sin)
    return _launch(*parts, qkv, cos, sin)
