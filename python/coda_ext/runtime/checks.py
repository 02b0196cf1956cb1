"""Call-time checks of a compiled op's arguments. Every failure names the argument and the fix, and
happens before anything reaches a kernel: no CUDA fault from a bad input.

Order: what the graph's signature asks (coda_ext.graph.signature: names, types, dtypes, shapes), then
what the kernel needs of the memory (strides, 16-byte alignment), then that the tensors share one
device, and last that the device is an SM90 GPU (require_gpu): a mistake is reported as itself on any
device. Fake and meta tensors (torch.compile tracing, FakeTensorMode) go through the same checks
but those of data pointers, which they do not have.
"""
from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import is_fake

from ..errors import UnsupportedError
from ..graph import signature

_ALIGN = 16  # bytes: TMA base addresses and leading strides; vector loads of broadcasts


def has_data(t: torch.Tensor) -> bool:
    """False for meta and fake tensors: no data pointer to check."""
    return t.device.type != "meta" and not is_fake(t)


def require_gpu(A: torch.Tensor) -> None:
    """The last check: the operands are on an SM90 GPU."""
    if not A.is_cuda:
        raise ValueError(f"A is on {A.device}; coda_ext kernels run on a CUDA device: move A and W with .cuda()")
    require_sm90(A.device)


#: CUDA device indices already found to be SM90 (a device's capability does not change: the check costs
#: tens of microseconds, on every launch before)
_SM90_DEVICES: set[int] = set()


def require_sm90(device: torch.device) -> None:
    if device.type == "cuda" and device.index in _SM90_DEVICES:
        return
    if not torch.cuda.is_available():
        raise UnsupportedError("running a compiled coda_ext op needs a CUDA GPU with SM90 (H100/H200); "
                               "use coda_ext.interpret(graph, A, W, ...) on this machine")
    cap = torch.cuda.get_device_capability(device)
    if cap != (9, 0):
        name = torch.cuda.get_device_name(device)
        raise UnsupportedError(f"{name} has compute capability {cap[0]}.{cap[1]}; coda_ext kernels need SM90 "
                               "(H100/H200). Use coda_ext.interpret(...) instead")
    if device.type == "cuda" and device.index is not None:
        _SM90_DEVICES.add(device.index)


def padded_strides(shape: tuple[Any, ...], dtype: torch.dtype) -> tuple[Any, ...]:
    """Strides of a tensor of `shape` whose rows (the last dim) start 16 bytes apart, as the TMA store of an
    output needs: contiguous where they already do, the rows padded otherwise (N = 50257 bf16 columns: rows of
    50264). The leading dims (M, or batch and sequence) may be symbolic."""
    per = max(1, _ALIGN // dtype.itemsize)
    strides: list[Any] = [1]
    if len(shape) >= 2:
        strides.insert(0, -(-shape[-1] // per) * per)
        for d in reversed(shape[1:-1]):
            strides.insert(0, strides[0] * d)
    return tuple(strides)


def empty_rows(shape: tuple[Any, ...], dtype: torch.dtype, device: Any) -> torch.Tensor:
    """An output of `shape` with 16-byte rows (padded_strides; contiguous where they already are)."""
    if isinstance(shape[-1], int) and (shape[-1] * dtype.itemsize) % _ALIGN == 0:
        return torch.empty(shape, dtype=dtype, device=device)
    return torch.empty_strided(shape, padded_strides(shape, dtype), dtype=dtype, device=device)


def check_device(name: str, t: torch.Tensor, device: torch.device | None) -> None:
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device} but the GEMM operands are on {device}; move it with "
                         f".to({str(device)!r})")


def check_tensor(name: str, t: Any, *, dtype: torch.dtype, device: torch.device | None,
                 shape: tuple[int, ...], row_align: int = _ALIGN) -> torch.Tensor:
    """Type, dtype, shape (the signature's rules), unit inner stride, 16-byte aligned base, rows
    `row_align`-byte aligned, and on `device` (None: any)."""
    signature.check_input(name, t, dtype, shape)
    if t.numel() > 0 and t.stride(-1) != 1:
        raise ValueError(f"{name} must have a contiguous last dimension (stride 1), got strides {t.stride()}; "
                         "call .contiguous()")
    if has_data(t) and t.data_ptr() % _ALIGN:
        raise ValueError(f"{name}'s data pointer is not {_ALIGN}-byte aligned; pass a fresh or .clone()d tensor")
    if t.dim() == 2:
        if t.stride(0) < t.shape[1]:
            raise ValueError(f"{name} has row stride {t.stride(0)} < {t.shape[1]} columns (overlapping rows); "
                             "call .contiguous()")
        if (t.stride(0) * t.element_size()) % row_align:
            raise ValueError(f"{name}'s rows are {t.stride(0) * t.element_size()} bytes apart; they must be a "
                             f"multiple of {row_align} bytes (pad the last dimension to a multiple of "
                             f"{max(1, row_align // t.element_size())})")
    check_device(name, t, device)
    return t


def check_operands(A: Any, W: Any, dtype: torch.dtype, major: str = "kk",
                   names: tuple[str, str] = ("A", "W")) -> tuple[int, int, int]:
    """A (M, K) and W (N, K), each contiguous along the dimension `major` names (config.MAJORS: "k" for
    A or W, "m" for A, "n" for W), W on A's device. Returns (M, N, K). Any N: the op gives D and its other
    tile outputs 16-byte rows (empty_rows). names: how the caller calls A and W. Not checked here: that A's
    device is an SM90 GPU (require_gpu, last)."""
    M, N, K = signature.check_operands(A, W, names)
    if M < 1 or N < 1 or K < 1:
        raise ValueError(f"empty problem: M={M}, N={N}, K={K}; every dimension must be at least 1")
    if max(M, N, K) >= 2**31:
        raise ValueError(f"M, N and K must be < 2**31, got {(M, N, K)}")
    for name, t, rows, m in ((names[0], A, "M", major[0]), (names[1], W, "N", major[1])):
        if m == "k":
            check_tensor(name, t, dtype=dtype, device=A.device, shape=tuple(t.shape))
        else:
            _check_transposed(name, t, dtype, A.device, rows)
    return M, N, K


def _check_transposed(name: str, t: torch.Tensor, dtype: torch.dtype, device: torch.device, rows: str) -> None:
    """An operand read with its first dimension contiguous: a transposed view such as x.t()."""
    what = f"{name} ({rows}, K) = {tuple(t.shape)}"
    signature.check_dtype(name, t, dtype)
    per16 = _ALIGN // t.element_size()
    if t.stride(0) != 1 or t.stride(1) < t.shape[0]:
        raise ValueError(f"{what} must be contiguous along {rows} (a transposed view such as x.t(), strides (1, ld) "
                         f"with ld >= {t.shape[0]}), got strides {t.stride()}; this op reads {name} in that layout")
    if t.shape[0] % per16 or t.stride(1) % per16 or (has_data(t) and t.data_ptr() % _ALIGN):
        raise ValueError(f"{what} is read along {rows}: {rows} and the stride of K must be multiples of {per16} "
                         f"elements and the data 16-byte aligned (got {rows} = {t.shape[0]}, strides {t.stride()}); "
                         "pad the contiguous dimension")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but A is on {device}; put the operands on one device")


def check_scalar_value(name: str, v: Any) -> float:
    signature.check_scalar(name, v, pointer=False)
    return float(v)


def check_scalar_pointer(name: str, t: Any, device: torch.device) -> torch.Tensor:
    signature.check_scalar(name, t, pointer=True)
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}; it must be on {device}")
    return t


def _extent(t: torch.Tensor) -> tuple[int, int]:
    if t.numel() == 0:
        return (t.data_ptr(), t.data_ptr())
    last = sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
    return (t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size())


def check_no_overlap(outputs: dict[str, torch.Tensor], inputs: dict[str, torch.Tensor],
                     given: Any = None, aliases: dict[str, str] | None = None) -> None:
    """Outputs may overlap neither each other nor any input. given: the names of the outputs the caller
    gave (default all); the others were just allocated and overlap nothing, so they are not compared
    (each extent is computed once). aliases: {output: input} pairs where the output may be that input's
    tensor itself (same memory, shape and strides, and elements of the same size, as a bfloat16 input read over by
    a float16 output: an epilogue that reads each element before it writes it there), never a partial overlap."""
    names = [n for n in outputs if given is None or n in given]
    if not names:
        return
    aliases = aliases or {}
    for out, inp in aliases.items():
        if out in outputs and inp in inputs and not _same_tensor(outputs[out], inputs[inp]):
            raise ValueError(f"output {out!r} may alias input {inp!r} only as the same tensor (same memory, shape, "
                             "strides and element size); give it its own tensor or the input itself")
    items = [(name, _extent(outputs[name])) for name in names]
    others = items + [(name, _extent(t)) for name, t in inputs.items()]
    for i, (a, (lo_a, hi_a)) in enumerate(items):
        for b, (lo_b, hi_b) in others[i + 1:]:
            if lo_a < hi_b and lo_b < hi_a and aliases.get(a) != b:
                raise ValueError(f"output {a!r} overlaps {b!r} in memory; give every output its own tensor")


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same elements of memory: same data pointer, shape, strides and element size (the dtype may differ)."""
    return (a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()
            and a.element_size() == b.element_size())
