"""Scaling tensors in place by a factor that lives on the device, without reading it on the host:

    scale_by_(tensors, factor)      t ← t · factor for every t, unless factor == 1 (then nothing is written)

A backward that must multiply gradients it already holds by dloss (the LM head's training path computes its
gradients in the forward) would otherwise read dloss on the host to skip the common dloss = 1 — a sync that
drains the GPU's queue at the start of the backward (about 2 ms of idle GPU a step at Llama-1B-like sizes on an
H200) — or always make a pass over them. On a GPU one small Triton kernel reads the factor on the device and
exits at once when it is 1; elsewhere the factor is read (a CPU read costs nothing). The writes go through the
tensors' memory, not autograd's in-place ops: tensors saved for a backward keep their version counter.
"""
from __future__ import annotations

import functools

import torch

from . import common

#: Elements each program scales per iteration; programs per SM of the grid (a grid-stride loop).
BLOCK, PROGRAMS_PER_SM = 4096, 4


@functools.cache
def _kernel():
    triton = common.import_triton("scales gradients", "triton")
    tl = common.import_triton("scales gradients", "triton.language")

    @triton.jit
    def scale_kernel(ptr, n, factor_ptr, BLOCK: tl.constexpr):
        f = tl.load(factor_ptr)
        if f != 1.0:   # 64-bit loop bounds: a 32-bit start + step would wrap for n near 2**31
            step = tl.num_programs(0).to(tl.int64) * BLOCK
            for start in range(tl.program_id(0).to(tl.int64) * BLOCK, n, step):
                offs = start + tl.arange(0, BLOCK)
                mask = offs < n
                v = tl.load(ptr + offs, mask=mask)
                tl.store(ptr + offs, (v.to(tl.float32) * f).to(ptr.dtype.element_ty), mask=mask)

    return scale_kernel


def scale_by_(tensors, factor: torch.Tensor) -> None:
    """t ← t · factor (computed in fp32, rounded to t's dtype) for each contiguous floating tensor t, in place;
    factor a 0-dim fp32 tensor on the tensors' device. Nothing is written where factor is exactly 1, and the host
    never reads factor on a GPU."""
    if factor.dim() != 0 or factor.dtype != torch.float32:
        raise ValueError(f"scale_by_: factor must be a 0-dim float32 tensor, got {factor.dtype} {tuple(factor.shape)}")
    for t in tensors:
        if not (t.is_contiguous() and t.is_floating_point() and t.device == factor.device):
            raise ValueError(f"scale_by_: each tensor must be contiguous, floating and on {factor.device}, got "
                             f"{t.dtype} on {t.device}, contiguous={t.is_contiguous()}")
    if not factor.is_cuda:
        f = float(factor)
        if f != 1.0:
            for t in tensors:
                t.data.mul_(f)   # .data: the tensor's own version counter is not bumped
        return
    kernel = _kernel()
    sms = torch.cuda.get_device_properties(factor.device).multi_processor_count
    with torch.cuda.device(factor.device):
        for t in tensors:
            n = t.numel()
            if n:
                grid = (min(_cdiv(n, BLOCK), PROGRAMS_PER_SM * sms),)
                kernel[grid](t, n, factor, BLOCK=BLOCK, num_warps=8)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)
