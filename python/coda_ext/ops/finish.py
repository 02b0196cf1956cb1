"""The small step after a fused GEMM's reduction, as one kernel:

    rstd_(sumsq, n_cols, eps)       sumsq ← rsqrt(sumsq / n_cols + eps)   in place, fp32 (the RMSNorm statistic)

linear_residual_norm's kernel finishes Σ_n out² per row (the reduction's finalize launch); the statistic the next
GEMM reads is rsqrt(Σ/N + eps). As three PyTorch operations that was three launches and two temporaries after the
GEMM (3.6 % of the Llama-1B-like output projection's op on an H200: 1.119x cuBLAS against 1.083x for its GEMM and
finalize alone); on a GPU it is one Triton kernel over the vector in place (libcoda's finish.cu does the same in
C++), elsewhere the same math in PyTorch, in place. The division is IEEE-rounded as PyTorch's is, so both paths
give the same bits.
"""
from __future__ import annotations

import functools

import torch

from . import common

#: Rows each program finishes.
BLOCK = 1024


@functools.cache
def _kernel():
    triton = common.import_triton("finishes the RMSNorm statistic", "triton")
    tl = common.import_triton("finishes the RMSNorm statistic", "triton.language")

    @triton.jit
    def rstd_kernel(ptr, n, n_cols, eps, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        s = tl.load(ptr + offs, mask=mask, other=1.0)
        tl.store(ptr + offs, tl.math.rsqrt(tl.math.div_rn(s, n_cols) + eps), mask=mask)

    return rstd_kernel


def rstd_(sumsq: torch.Tensor, n_cols: int, eps: float) -> torch.Tensor:
    """sumsq (a contiguous fp32 vector of Σ x² per row over n_cols columns; off the GPU any floating dtype, as the
    CPU stand-ins of the kernels give) ← rsqrt(sumsq / n_cols + eps), in place; returns it."""
    floating = sumsq.dtype == torch.float32 or (sumsq.is_floating_point() and not sumsq.is_cuda)
    if not floating or not sumsq.is_contiguous() or sumsq.dim() != 1:
        raise ValueError(f"rstd_: sumsq must be a contiguous 1-D float32 tensor, got {sumsq.dtype} "
                         f"{tuple(sumsq.shape)}, contiguous={sumsq.is_contiguous()}")
    if n_cols <= 0:
        raise ValueError(f"rstd_: n_cols must be positive, got {n_cols}")
    n = sumsq.numel()
    if not sumsq.is_cuda or n == 0:
        return torch.rsqrt_(sumsq.div_(n_cols).add_(eps))
    _launch(sumsq, n, float(n_cols), float(eps))
    return sumsq


def _launch(sumsq: torch.Tensor, n: int, n_cols: float, eps: float) -> None:
    """The kernel's launch on sumsq's GPU (benchmarks/host_overhead.py stubs it, as it stubs the GEMM's)."""
    with torch.cuda.device(sumsq.device):
        _kernel()[(-(-n // BLOCK),)](sumsq, n, n_cols, eps, BLOCK=BLOCK, num_warps=4)
