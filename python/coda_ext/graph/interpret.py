"""The reference interpreter: evaluates an epilogue graph with PyTorch.

It is the semantic definition of every node kind, the oracle of the tests, and what users
run where there is no SM90 GPU. Math runs in `compute_dtype` (fp32 by default, fp64 for a
tighter reference; a 16-bit dtype gives the "same math in PyTorch at that precision"
baseline of the tolerance rule). Results are returned unrounded in `compute_dtype`.
"""
from __future__ import annotations

from typing import Any, Callable

import math

import torch
import torch.nn.functional as F

from . import ir
from .canonical import as_ir


class Outputs(dict):
    """Named results of a graph: `outs["sqsum"]` or `outs.sqsum`; the main output under its name."""

    def __getattr__(self, name: str) -> torch.Tensor:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"no output named {name!r}; outputs are {sorted(self)}") from None


_TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
                 "int32": torch.int32, "int64": torch.int64}

UNARY: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt, "square": torch.square, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
    "silu": F.silu, "relu": torch.relu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_erf": lambda x: F.gelu(x, approximate="none"),
}
UNARY.update({
    "cos_turns": lambda t: torch.cos(2 * math.pi * t),
    "sin_turns": lambda t: torch.sin(2 * math.pi * t),
})
BINARY: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
    "max": torch.maximum, "min": torch.minimum,
    "eq": lambda a, b: (a == b).to(a.dtype), "ne": lambda a, b: (a != b).to(a.dtype),
    "lt": lambda a, b: (a < b).to(a.dtype), "le": lambda a, b: (a <= b).to(a.dtype),
    "gt": lambda a, b: (a > b).to(a.dtype), "ge": lambda a, b: (a >= b).to(a.dtype),
}
REDUCE: dict[str, Callable[[torch.Tensor, int], torch.Tensor]] = {
    "sum": lambda x, d: x.sum(dim=d),
    "max": lambda x, d: x.amax(dim=d),
    "sumsq": lambda x, d: (x * x).sum(dim=d),
    "logsumexp": lambda x, d: torch.logsumexp(x, dim=d),
}


def turns(position: torch.Tensor, hi: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    """frac(position * (hi + lo)) in [-0.5, 0.5], computed in fp64 (the exact definition)."""
    t = position.double() * (hi.double() + lo.double())
    return t - torch.round(t)


def pair_swap(x: torch.Tensor) -> torch.Tensor:
    """Swaps columns 2i and 2i+1."""
    return x.reshape(x.shape[0], -1, 2).flip(-1).reshape(x.shape)


def rotate_pairs(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Rotates each pair (x[2i], x[2i+1]) by 2π·t[2i]."""
    theta = 2 * math.pi * t[:, 0::2]
    a, b = x[:, 0::2], x[:, 1::2]
    c, s = torch.cos(theta), torch.sin(theta)
    return torch.stack([a * c - b * s, b * c + a * s], dim=-1).reshape(x.shape)


def segment_reduce(x: torch.Tensor, size: int, op: str) -> torch.Tensor:
    """Reduces each run of `size` columns of every row and broadcasts the result back."""
    M, N = x.shape
    seg = x.reshape(M, N // size, size)
    r = REDUCE[op](seg, 2)
    return r[:, :, None].expand(M, N // size, size).reshape(M, N)


def torch_dtype(name: str) -> torch.dtype:
    return _TORCH_DTYPES[name]


def interpret(graph: Any, A: torch.Tensor, W: torch.Tensor, *, compute_dtype: torch.dtype = torch.float32,
              **inputs: Any) -> Outputs:
    """Evaluates `graph` on A (M, K) and W (N, K): returns every output by name, unrounded."""
    g = as_ir(graph)
    expected = {g[i].name for i in g.input_nodes()}
    missing = sorted(expected - set(inputs))
    extra = sorted(set(inputs) - expected)
    if missing:
        raise TypeError(f"interpret: missing input(s) {missing}; the graph's inputs are {sorted(expected)}")
    if extra:
        raise TypeError(f"interpret: unexpected input(s) {extra}; the graph's inputs are {sorted(expected)}")
    if A.dim() != 2 or W.dim() != 2 or A.shape[1] != W.shape[1]:
        raise ValueError(f"interpret: A must be (M, K) and W (N, K), got {tuple(A.shape)} and {tuple(W.shape)}")

    M, N = A.shape[0], W.shape[0]
    for i in g.input_nodes():
        n = g[i]
        if n.kind in ir.INPUT_KINDS:
            want = {"tile": (M, N), "pair_tile": (M, 2 * N), "row_vector": (N,), "col_vector": (M,)}[n.kind]
            got = tuple(getattr(inputs[n.name], "shape", ()))
            if got != want:
                raise ValueError(f"interpret: input {n.name!r} ({n.kind}) must have shape {want}, got {got}")
    if (g.find("pair_gate") or g.find("pair_swap") or g.find("rotate_pairs")) and N % 2:
        raise ValueError(f"interpret: the graph pairs adjacent columns, so N = {N} must be even")
    for i in g.find("segment_reduce"):
        if N % g[i].attr("size"):
            raise ValueError(f"interpret: segment_reduce over {g[i].attr('size')} columns needs N = {N} to be a "
                             "multiple of it")

    cd = compute_dtype
    vals: list[Any] = [None] * len(g)
    outs = Outputs()
    for i, n in enumerate(g.nodes):
        x = [vals[j] for j in n.inputs]
        k = n.kind
        if k == "accumulator":
            vals[i] = A.to(cd) @ W.to(cd).t()
        elif k == "scalar":
            mode = n.attr("mode")
            if mode == "constant":
                vals[i] = torch.tensor(n.attr("value"), dtype=cd, device=A.device)
            elif mode == "value":
                vals[i] = torch.tensor(float(inputs[n.name]), dtype=cd, device=A.device)
            else:
                vals[i] = inputs[n.name].to(device=A.device, dtype=cd).reshape(())
        elif k == "row_vector":
            vals[i] = inputs[n.name].to(cd)[None, :]
        elif k == "col_vector":
            vals[i] = inputs[n.name].to(cd)[:, None]
        elif k == "tile":
            vals[i] = inputs[n.name].to(cd)
        elif k == "pair_tile":   # packed pairs as (M, N, 2)
            vals[i] = inputs[n.name].to(cd).reshape(M, N, 2)
        elif k == "unpack":
            vals[i] = x[0][..., n.attr("half")]
        elif k == "pack":        # each element rounds to the stored dtype
            dt = torch_dtype(n.attr("dtype") or _element_dtype(A))
            vals[i] = torch.stack([_full(v, A, W, cd).to(dt).to(cd) for v in x], dim=-1)
        elif k == "pair_store":
            outs[n.name] = x[0].reshape(M, 2 * N)
        elif k == "col_index":
            vals[i] = torch.arange(N, dtype=cd, device=A.device)[None, :]
        elif k == "pair_swap":
            vals[i] = pair_swap(_full(x[0], A, W, cd))
        elif k == "rotate_pairs":
            vals[i] = rotate_pairs(_full(x[0], A, W, cd), _full(x[1], A, W, cd))
        elif k == "turns":
            vals[i] = turns(*torch.broadcast_tensors(*x)).to(cd)
        elif k == "segment_reduce":
            vals[i] = segment_reduce(_full(x[0], A, W, cd), n.attr("size"), n.attr("op"))
        elif k == "where":
            vals[i] = torch.where(x[0] != 0, x[1], x[2])
        elif k in UNARY:
            vals[i] = UNARY[k](x[0])
        elif k == "cast":
            vals[i] = x[0].to(torch_dtype(n.attr("dtype"))).to(cd)
        elif k in BINARY:
            vals[i] = BINARY[k](x[0], x[1])
        elif k == "fma":
            vals[i] = x[0] * x[1] + x[2]
        elif k == "pair_gate":
            full = _full(x[0], A, W, cd)
            vals[i] = UNARY[n.attr("act")](full[:, 0::2]) * full[:, 1::2]
        elif k in ("output", "store"):
            half = g[n.inputs[0]].kind in ir.PAIR_KINDS
            outs[n.name] = x[0] if half else _full(x[0], A, W, cd)
        elif k == "row_reduce":
            outs[n.name] = REDUCE[n.attr("op")](_full(x[0], A, W, cd), 1)
        elif k == "col_reduce":
            outs[n.name] = REDUCE[n.attr("op")](_full(x[0], A, W, cd), 0)
        else:
            raise NotImplementedError(f"interpret: node kind {k!r}")
    return outs


def _element_dtype(A: torch.Tensor) -> str:
    """The op's dtype, where a graph leaves a pack's dtype to it: A's if 16-bit, else bfloat16."""
    return str(A.dtype).replace("torch.", "") if A.dtype in (torch.bfloat16, torch.float16) else "bfloat16"


def _full(x: torch.Tensor, A: torch.Tensor, W: torch.Tensor, cd: torch.dtype) -> torch.Tensor:
    """Broadcasts a value that does not depend on the tile (a scalar, a vector) to M x N."""
    M, N = A.shape[0], W.shape[0]
    return x if tuple(x.shape) == (M, N) else torch.broadcast_to(x, (M, N)).contiguous()
