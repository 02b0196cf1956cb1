"""Call-time checks of a compiled op's arguments. Every failure names the argument and the
fix, and happens before anything reaches a kernel: no CUDA fault from a bad input."""
from __future__ import annotations

from typing import Any

import torch

from ..errors import UnsupportedError

_ALIGN = 16  # bytes: TMA base addresses and leading strides; vector loads of broadcasts


def require_sm90(device: torch.device) -> None:
    if not torch.cuda.is_available():
        raise UnsupportedError("running a compiled coda_ext op needs a CUDA GPU with SM90 (H100/H200); "
                               "use coda_ext.interpret(graph, A, W, ...) on this machine")
    cap = torch.cuda.get_device_capability(device)
    if cap != (9, 0):
        name = torch.cuda.get_device_name(device)
        raise UnsupportedError(f"{name} has compute capability {cap[0]}.{cap[1]}; coda_ext kernels need SM90 "
                               "(H100/H200). Use coda_ext.interpret(...) instead")


def check_tensor(name: str, t: Any, *, dtype: torch.dtype, device: torch.device | None,
                 shape: tuple[int, ...], row_align: int = _ALIGN) -> torch.Tensor:
    """Type, device, dtype, shape, unit inner stride, 16-byte aligned base, rows `row_align`-byte aligned."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device} but the GEMM operands are on {device}; move it with .to({str(device)!r})")
    if t.dtype != dtype:
        raise TypeError(f"{name} has dtype {t.dtype}, expected {dtype}; convert it with .to({dtype})")
    if t.dim() != len(shape):
        raise ValueError(f"{name} must have {len(shape)} dimension(s) {shape}, got shape {tuple(t.shape)}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
    if t.numel() > 0 and t.stride(-1) != 1:
        raise ValueError(f"{name} must have a contiguous last dimension (stride 1), got strides {t.stride()}; "
                         "call .contiguous()")
    if t.data_ptr() % _ALIGN:
        raise ValueError(f"{name}'s data pointer is not {_ALIGN}-byte aligned; pass a fresh or .clone()d tensor")
    if t.dim() == 2:
        if t.stride(0) < t.shape[1]:
            raise ValueError(f"{name} has row stride {t.stride(0)} < {t.shape[1]} columns (overlapping rows); "
                             "call .contiguous()")
        if (t.stride(0) * t.element_size()) % row_align:
            raise ValueError(f"{name}'s rows are {t.stride(0) * t.element_size()} bytes apart; they must be a "
                             f"multiple of {row_align} bytes (pad the last dimension to a multiple of "
                             f"{max(1, row_align // t.element_size())})")
    return t


def check_operands(A: Any, W: Any, dtype: torch.dtype, has_d: bool = True, major: str = "kk") -> tuple[int, int, int]:
    """A (M, K) and W (N, K) on one SM90 GPU, each contiguous along the dimension `major` names
    (config.MAJORS: "k" for A or W, "m" for A, "n" for W). Returns (M, N, K). has_d: the kernel
    writes D (its rows must be 16-byte aligned for the TMA store)."""
    for name, t in (("A", A), ("W", W)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise ValueError(f"{name} must be 2-D, got shape {tuple(t.shape)}")
    if not A.is_cuda:
        raise ValueError(f"A is on {A.device}; coda_ext kernels run on a CUDA device: move A and W with .cuda()")
    M, K = A.shape
    N = W.shape[0]
    if W.shape[1] != K:
        raise ValueError(f"A is (M, K) = {tuple(A.shape)} but W is {tuple(W.shape)}: W must be (N, K) with the "
                         "same K, as torch.nn.Linear stores it")
    if M < 1 or N < 1 or K < 1:
        raise ValueError(f"empty problem: M={M}, N={N}, K={K}; every dimension must be at least 1")
    if max(M, N, K) >= 2**31:
        raise ValueError(f"M, N and K must be < 2**31, got {(M, N, K)}")
    for name, t, rows, m in (("A", A, "M", major[0]), ("W", W, "N", major[1])):
        if m == "k":
            check_tensor(name, t, dtype=dtype, device=A.device, shape=tuple(t.shape))
        else:
            _check_transposed(name, t, dtype, A.device, rows)
    esize = A.element_size()
    if has_d and (N * esize) % _ALIGN:
        raise ValueError(f"N = {N} (W.shape[0]) gives output rows of {N * esize} bytes; N must be a multiple of "
                         f"{_ALIGN // esize} for the TMA store of D")
    require_sm90(A.device)
    return M, N, K


def _check_transposed(name: str, t: torch.Tensor, dtype: torch.dtype, device: torch.device, rows: str) -> None:
    """An operand read with its first dimension contiguous: a transposed view such as x.t()."""
    what = f"{name} ({rows}, K) = {tuple(t.shape)}"
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but A is on {device}; put the operands on one device")
    if t.dtype != dtype:
        raise TypeError(f"{name} has dtype {t.dtype}, expected {dtype}; convert it with .to({dtype})")
    per16 = _ALIGN // t.element_size()
    if t.stride(0) != 1 or t.stride(1) < t.shape[0]:
        raise ValueError(f"{what} must be contiguous along {rows} (a transposed view such as x.t(), strides (1, ld) "
                         f"with ld >= {t.shape[0]}), got strides {t.stride()}; this op reads {name} in that layout")
    if t.shape[0] % per16 or t.stride(1) % per16 or t.data_ptr() % _ALIGN:
        raise ValueError(f"{what} is read along {rows}: {rows} and the stride of K must be multiples of {per16} "
                         f"elements and the data 16-byte aligned (got {rows} = {t.shape[0]}, strides {t.stride()}); "
                         "pad the contiguous dimension")


def check_scalar_value(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"{name} is a runtime scalar and must be a Python int or float, got {type(v).__name__}")
    return float(v)


def check_scalar_pointer(name: str, t: Any, device: torch.device) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} is a device-pointer scalar and must be a one-element torch.Tensor, "
                        f"got {type(t).__name__}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}; it must be on {device}")
    if t.dtype != torch.float32 or t.numel() != 1:
        raise TypeError(f"{name} must be a one-element float32 tensor, got {t.dtype} with {t.numel()} elements")
    return t


def _extent(t: torch.Tensor) -> tuple[int, int]:
    if t.numel() == 0:
        return (t.data_ptr(), t.data_ptr())
    last = sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
    return (t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size())


def check_no_overlap(outputs: dict[str, torch.Tensor], inputs: dict[str, torch.Tensor]) -> None:
    """Outputs may overlap neither each other nor any input."""
    items = list(outputs.items())
    for i, (a, ta) in enumerate(items):
        lo_a, hi_a = _extent(ta)
        others = items[i + 1:] + list(inputs.items())
        for b, tb in others:
            lo_b, hi_b = _extent(tb)
            if lo_a < hi_b and lo_b < hi_a:
                raise ValueError(f"output {a!r} overlaps {b!r} in memory; give every output its own tensor")
