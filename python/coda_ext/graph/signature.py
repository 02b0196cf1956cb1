"""A graph's call signature: what `op(A, W, **inputs)` and `interpret(graph, A, W, **inputs)` take.

The rules a compiled op (coda_ext.runtime) and the reference interpreter share, so that both accept
and refuse the same calls with the same messages: inputs passed by name; A (..., K) with leading
batch dimensions as F.linear takes it (rows are tokens; per-token inputs and outputs follow) and
W (N, K); each input's type, dtype and shape; what N must be for pair and segment nodes. What only
a kernel needs (strides, alignment, one CUDA device) is coda_ext.runtime.checks'.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from . import ir

#: Inputs with one row (tiles) or one value (column vectors) per token: leading dimensions flatten.
ROW_INPUTS = ("tile", "pair_tile", "col_vector")
#: Outputs with one row per token (the main output, stores) and one value per token (row reductions).
ROW_OUTPUTS = ("output", "store", "pair_gated_store", "pair_store")
VALUE_OUTPUTS = ("row_reduce",)


def input_shape(kind: str, M: Any, N: Any) -> tuple[Any, ...] | None:
    """The shape of a tensor input of `kind` for an (M, N) problem (None: not a tensor input)."""
    return {"tile": (M, N), "pair_tile": (M, 2 * N), "row_vector": (N,), "col_vector": (M,)}.get(kind)


def by_name(args: Sequence[Any], expected: Iterable[str], call: str = "op(A, W") -> None:
    """Inputs are keyword arguments: positional ones after A and W are refused, naming the inputs
    (call: how the call starts, e.g. "interpret(graph, A, W")."""
    if args:
        names = list(expected)
        example = "".join(f", {n}=..." for n in names)
        raise TypeError(f"{len(args)} positional argument(s) after A and W: inputs are passed by name, "
                        f"{call}{example}); the graph's inputs are {names}")


def check_names(given: Iterable[str], expected: Sequence[str], takes: str = "this op takes") -> None:
    """Every expected input given, and no other."""
    given = set(given)
    missing = [n for n in expected if n not in given]
    extra = sorted(given - set(expected))
    if missing:
        raise TypeError(f"missing input(s) {missing}; {takes} {list(expected)}")
    if extra:
        raise TypeError(f"unexpected input(s) {extra}; {takes} {list(expected)}")


def check_operands(A: Any, W: Any, names: tuple[str, str] = ("A", "W")) -> tuple[int, int, int]:
    """A (M, K) and W (N, K) tensors with one K, as torch.nn.Linear stores W. Returns (M, N, K)."""
    a, w = names
    if not isinstance(A, torch.Tensor) or not isinstance(W, torch.Tensor):
        raise TypeError(f"{a} and {w} must be torch.Tensors, got {type(A).__name__} and {type(W).__name__}")
    for name, t in ((a, A), (w, W)):
        if t.dim() != 2:
            raise ValueError(f"{name} must be 2-D, got shape {tuple(t.shape)}")
    M, K = A.shape
    N = W.shape[0]
    if W.shape[1] != K:
        raise ValueError(f"{a} is (M, K) = {tuple(A.shape)} but {w} is {tuple(W.shape)}: {w} must be (N, K) with "
                         "the same K, as torch.nn.Linear stores it")
    return M, N, K


def check_dtype(name: str, t: torch.Tensor, dtype: torch.dtype) -> None:
    if t.dtype != dtype:
        raise TypeError(f"{name} has dtype {t.dtype}, expected {dtype}; convert it with .to({dtype})")


def check_input(name: str, t: Any, dtype: torch.dtype | None, shape: tuple[Any, ...]) -> torch.Tensor:
    """A tensor input: its type, dtype (None: any) and shape."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dtype is not None:
        check_dtype(name, t, dtype)
    if t.dim() != len(shape):
        raise ValueError(f"{name} must have {len(shape)} dimension(s) {shape}, got shape {tuple(t.shape)}")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
    return t


def check_scalar(name: str, v: Any, pointer: bool) -> None:
    """A runtime scalar: a Python number, or (pointer=True) a one-element float32 tensor."""
    if not pointer:
        if isinstance(v, bool) or not isinstance(v, (int, float, torch.SymInt, torch.SymFloat)):
            raise TypeError(f"{name} is a runtime scalar and must be a Python int or float, got {type(v).__name__}")
        return
    if not isinstance(v, torch.Tensor):
        raise TypeError(f"{name} is a device-pointer scalar and must be a one-element torch.Tensor, "
                        f"got {type(v).__name__}")
    if v.dtype != torch.float32 or v.numel() != 1:
        raise TypeError(f"{name} must be a one-element float32 tensor, got {v.dtype} with {v.numel()} elements")


def columns(g: ir.GraphIR) -> tuple[bool, int | None]:
    """(pairs, segment) of a graph, user-built or lowered: whether it pairs adjacent columns (N even),
    and the segment size of its segment reductions (N a multiple of it), if any."""
    pairs = any(g.find(k) for k in ("pair_gate", "pair_gated_store", "pair_swap", "rotate_pairs"))
    sizes = {g[i].attr("size") for i in g.find("segment_reduce")}
    return pairs, (max(sizes) if sizes else None)


def check_columns(N: Any, pairs: bool, segment: int | None) -> None:
    if pairs and N % 2:
        raise ValueError(f"the graph pairs adjacent columns (2i, 2i+1), so N = {N} (W.shape[0]) must be even")
    if segment and N % segment:
        raise ValueError(f"the graph reduces segments of {segment} columns, so N = {N} (W.shape[0]) must be "
                         f"a multiple of {segment}")


# --- leading batch dimensions ----------------------------------------------------------------------


def flatten_input(kind: str, t: Any) -> Any:
    """A per-token input (..., X) as (M, X), or (...) as (M,); anything else as it is."""
    if not (isinstance(t, torch.Tensor) and kind in ROW_INPUTS and t.dim() > 1):
        return t
    return t.reshape(-1, t.shape[-1]) if kind != "col_vector" else t.reshape(-1)


def unflatten_output(kind: str, t: torch.Tensor, lead: tuple[int, ...]) -> torch.Tensor:
    """A per-token output (M, X) as (*lead, X), or (M,) as lead; anything else as it is."""
    if kind in ROW_OUTPUTS:
        return t.reshape(*lead, t.shape[-1])
    if kind in VALUE_OUTPUTS:
        return t.reshape(lead)
    return t
