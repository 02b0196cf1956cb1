"""What a fused kernel accepts: the one home of the kernel's limits as the fusion compiler applies them.

target "cuda": the SM90 kernel (README "Requirements on inputs"): bf16/fp16 GEMM operands of one
dtype, K and N multiples of 8, operands stored contiguously (read in place through `major`).
target "interpret": the reference interpreter (CPU tests): any float GEMM, any layout.
Both: at most graph.verify.MAX_SLOTS runtime inputs and outputs and MAX_REDUCTIONS reductions per
graph; tiles are float; vectors float or integer (bool vectors are widened to fp32 by the call);
stores are float.
"""
from __future__ import annotations

import torch

from ..graph.verify import MAX_REDUCTIONS, MAX_SLOTS

TARGETS = ("cuda", "interpret")
GEMM_DTYPES = {"cuda": (torch.bfloat16, torch.float16),
               "interpret": (torch.bfloat16, torch.float16, torch.float32)}
FLOAT = (torch.bfloat16, torch.float16, torch.float32)
VECTOR = FLOAT + (torch.int32, torch.int64, torch.bool)
ALIGN = 8   # elements: 16 bytes of a 16-bit dtype

__all__ = ["MAX_REDUCTIONS", "MAX_SLOTS", "TARGETS", "anchor_problem", "loadable"]


def anchor_problem(a: torch.Tensor, w: torch.Tensor, major: str, target: str) -> str | None:
    """Why a GEMM of stored operands a, w (coda_ext::fusion_gemm) cannot anchor an epilogue, or None."""
    if target not in TARGETS:
        raise ValueError(f"fusion target must be one of {TARGETS}, got {target!r}")
    if a.dtype != w.dtype or a.dtype not in GEMM_DTYPES[target]:
        want = "/".join(str(d).replace("torch.", "") for d in GEMM_DTYPES[target])
        return f"GEMM operands {a.dtype} x {w.dtype}: the {target} kernel takes {want} (one dtype)"
    if a.dim() != 2 or w.dim() != 2:
        return "not a 2-D GEMM"
    if target == "cuda":
        K = a.shape[1] if major[0] == "k" else a.shape[0]
        N = w.shape[0] if major[1] == "k" else w.shape[1]
        if K % ALIGN or N % ALIGN:
            return f"K = {K} and N = {N} must be multiples of {ALIGN} (16-byte rows)"
        if not (a.is_contiguous() and w.is_contiguous()):
            return "an operand is not stored contiguously (the kernel reads it in place; a copy would cost a pass)"
    return None


def loadable(role: str, dtype: torch.dtype) -> bool:
    """Whether an epilogue can read a tensor of `dtype` in `role` (tile, row, col, scalar)."""
    if role == "tile":
        return dtype in FLOAT
    return dtype in VECTOR
