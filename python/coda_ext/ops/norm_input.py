"""The RMSNorm of a tensor that no GEMM produced (a layer's input, the embedding): its statistic
and the weighted input the next GEMM reads, in one pass,

    rstd = rsqrt(mean(x², -1) + eps)   (fp32)        h = x ⊙ γ   (x's dtype)

so RMSNorm(x) @ Wᵀ = rstd ⊙row (h @ Wᵀ) finishes in the consuming GEMM's epilogue (rms_linear,
linear_swiglu, qkv_rope, lm_head_cross_entropy). Element-wise (not a GEMM epilogue): on a GPU one Triton
kernel (norm_kernel; for a layout or dtype it does not read, or a call that records a gradient, one generated
by torch.compile with the row count dynamic); traced by torch.compile, its math for Inductor; elsewhere eager
PyTorch.
"""
from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import is_fake

from . import common, norm_kernel

NAME = "rms_norm_input"


def _math(x: torch.Tensor, weight: torch.Tensor, eps: float):
    rstd = torch.rsqrt(x.float().pow(2).mean(-1) + eps)
    return x * weight.to(x.dtype), rstd


_fused = common.compiled_rows(_math)


def reference(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6):
    """fp32 reference: (h, rstd)."""
    return _math(x.float(), weight.float(), eps)


def _kernel_reads(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether norm_kernel takes the call: contiguous rows of a float dtype with columns, nothing to
    differentiate (its custom op has no backward: a call that records a gradient takes the generated kernel),
    triton importable."""
    grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    return (x.dtype in (torch.bfloat16, torch.float16, torch.float32) and x.shape[-1] > 0 and not grad
            and x.is_contiguous() and weight.is_contiguous() and norm_kernel.available())


def rms_norm_input(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, rstd): h = x ⊙ weight in x's dtype, rstd (...) fp32 the RMSNorm statistic of x (..., d)."""
    if not isinstance(x, torch.Tensor) or not isinstance(weight, torch.Tensor):
        raise TypeError(f"{NAME}: x and weight must be torch.Tensors")
    if weight.shape != (x.shape[-1],):
        raise ValueError(f"{NAME}: weight must have shape ({x.shape[-1]},) (x's last dimension), got "
                         f"{tuple(weight.shape)}")
    if weight.device != x.device:
        raise ValueError(f"{NAME}: weight is on {weight.device} but x is on {x.device}")
    traced = torch.compiler.is_compiling() or is_fake(x)
    if x.is_cuda and not traced:
        if _kernel_reads(x, weight):
            h, rstd = norm_kernel.rms_norm_rows(x.view(-1, x.shape[-1]), weight, eps)
            return h.view(x.shape), rstd.view(x.shape[:-1])
        return _fused(x, weight, eps)
    return _math(x, weight, eps)
