"""The RMSNorm of a layer's input (norm_input.rms_norm_input on a GPU) as one Triton kernel: each program takes
BLOCK_M rows through their columns once, writing h = x ⊙ γ in x's dtype and summing x² in fp32 for
rstd = 1 / sqrt(mean(x²) + eps). The bytes of the pass and one launch: the kernel torch.compile generated for it
cost about 0.1 ms of host time a call (its guards and wrappers), at the start of every layer's forward.
"""
from __future__ import annotations

import functools

import torch

from . import common

#: Rows per program; columns per step through a row.
BLOCK_M, BLOCK_N = 4, 512


@functools.cache
def _kernel():
    return common.import_triton("runs the layer input's RMSNorm", f"{__package__}._norm_triton").rms_norm_input_kernel


def _check(x: torch.Tensor, weight: torch.Tensor) -> None:
    """(M, N) rows with adjacent columns and a contiguous (N,) weight on x's device, refused before any launch
    (also through the custom op and while traced)."""
    if x.dim() != 2 or (x.shape[1] > 1 and x.stride(1) != 1):
        raise ValueError(f"rms_norm_input: x must be (M, N) rows with adjacent columns, got {tuple(x.shape)} "
                         f"strides {x.stride()}")
    if weight.shape != (x.shape[1],) or not weight.is_contiguous() or weight.device != x.device:
        raise ValueError(f"rms_norm_input: weight must be a contiguous ({x.shape[1]},) tensor on {x.device}, got "
                         f"{tuple(weight.shape)} on {weight.device}")


def _launch(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    _check(x, weight)
    M, N = x.shape
    h = torch.empty((M, N), dtype=x.dtype, device=x.device)
    rstd = torch.empty(M, dtype=torch.float32, device=x.device)
    if M:
        common.launch_triton(_kernel(), ((M + BLOCK_M - 1) // BLOCK_M,), x.device, x, x.stride(0), weight, h,
                             h.stride(0), rstd, M, N, float(eps), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, num_warps=4)
    return h, rstd


#: The kernel as a custom op (registered where triton is installed), so a traced graph keeps it as it is.
_op = common.triton_op("rms_norm_input_rows", _launch)


@torch.compiler.assume_constant_result
def available() -> bool:
    """Whether the kernel can run on a GPU here (triton installed and importable); a constant to Dynamo."""
    return common.triton_available(_op, _kernel)


def rms_norm_rows(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(h (M, N) in x's dtype, rstd (M,) fp32) of x (M, N) with adjacent columns and weight (N,) contiguous."""
    if x.is_cuda and _op is not None:
        return _op(x, weight, float(eps))
    return _launch(x, weight, eps)
