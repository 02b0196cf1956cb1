"""The tolerance rule and the unwritten-output checks, shared by the GPU tests and the numerics table.

The rule (docs/design.md): a fused result's max error against a high-precision reference is at
most 2x the error of the same math done by PyTorch in the op's dtype, plus a floor of
1e-5 * (1 + max |reference|). Outputs are filled with NaN before a launch (nan_outputs, or
nan_memory for ops that allocate their own), so an element the kernel never wrote shows.
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import torch


def max_err(x: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor | None = None) -> float:
    """max |x - ref| in float64 (over `mask`); inf where x is NaN/inf and ref is not, NaN if nothing is compared."""
    d = torch.nan_to_num((x.double() - ref.double()).abs(), nan=math.inf)
    if mask is not None:
        d = d[mask]
    return d.max().item() if d.numel() else math.nan


def floor(max_ref: float) -> float:
    """The rule's absolute floor for a reference whose largest magnitude is max_ref."""
    return 1e-5 * (1.0 + max_ref)


def within_rule(err: float, err_torch: float, max_ref: float) -> bool:
    return err <= 2 * err_torch + floor(max_ref)


def assert_within_rule(label: str, got: torch.Tensor, ref: torch.Tensor, base: torch.Tensor,
                       report: Callable[[str], None], err_key: str = "torch_dtype_err",
                       baseline: str = "PyTorch in the op's dtype") -> None:
    """The rule for one tensor (base: the baseline's result), no NaN left (unwritten elements),
    reported as `label: max_err=... err_key=...`."""
    assert got.shape == ref.shape, f"{label}: shape {tuple(got.shape)} != {tuple(ref.shape)}"
    assert not torch.isnan(got).any(), f"{label}: NaN in the output (unwritten elements?)"
    err, err_torch, max_ref = max_err(got, ref), max_err(base, ref), ref.abs().max().item()
    report(f"{label}: max_err={err:.3e} {err_key}={err_torch:.3e}")
    assert within_rule(err, err_torch, max_ref), (
        f"{label}: max error {err:.3e} > 2 x {err_torch:.3e} ({baseline}) + {floor(max_ref):.1e}")


def nan_outputs(op: Any, M: int, N: int, device: Any = "cuda") -> dict[str, torch.Tensor]:
    """Every output of a compiled op for an (M, N) problem, filled with NaN (pass as out=); an integer output (a
    uint8 store) with every bit set (0xFF bytes, as nan_memory's poison)."""
    out = {}
    for name in op.output_names:   # the op's own layout: rows padded to 16 bytes where N needs it
        t = op.empty_output(name, M, N, device)
        if t.is_floating_point():
            t.fill_(math.nan)
        else:
            t.view(torch.uint8).fill_(0xFF)
        out[name] = t
    return out


@contextlib.contextmanager
def nan_memory(nbytes: int = 1 << 30):
    """Allocations inside come from a fresh CUDA memory pool whose free memory is all NaN (0xFF bytes:
    NaN in every float dtype): a large block and many small-pool blocks are taken and given back.

    The cache is emptied first. A pool whose tensors outlive the block (the outputs a test checks after
    it) keeps its free memory cached once they die, and the allocator does not release cached private-pool
    memory to retry an allocation that fails while a pool is in use (pytorch/pytorch#159674): without
    this, every earlier use leaves ~1 GiB cached and a later large test runs out of memory."""
    torch.cuda.empty_cache()
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        large = torch.full((nbytes,), 255, dtype=torch.uint8, device="cuda")
        small = [torch.full((1 << 20,), 255, dtype=torch.uint8, device="cuda") for _ in range(64)]
        del large, small
        yield
