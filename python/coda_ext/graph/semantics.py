"""What the node kinds compute, in PyTorch: the reference semantics the interpreter runs.

kinds.py points every kind at its function (Kind.interpret): element-wise kinds at
`pointwise(f)`, the others at a function below. Each takes (env, node, *inputs), the values of
the node's inputs, and returns the node's value; a sink records its tensor in env.outs and
returns None. Values are in env.cd, unrounded: an (M, N) tensor or one that broadcasts to it (a
scalar (), a row (1, N), a column (M, 1)); a pair tile's or a pack's pairs are (M, N, 2), a pair
op's result (M, N/2).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

_TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
                 "int32": torch.int32, "int64": torch.int64, "uint8": torch.uint8}

#: Reduction ops (row, column and segment reductions) over dimension d.
REDUCE: dict[str, Callable[[torch.Tensor, int], torch.Tensor]] = {
    "sum": lambda x, d: x.sum(dim=d),
    "max": lambda x, d: x.amax(dim=d),
    "sumsq": lambda x, d: (x * x).sum(dim=d),
    "logsumexp": lambda x, d: torch.logsumexp(x, dim=d),
}


def torch_dtype(name: str) -> torch.dtype:
    return _TORCH_DTYPES[name]


@dataclasses.dataclass
class Env:
    """What an evaluation reads besides the node's inputs: the operands, the runtime inputs by name,
    the compute dtype, the graph and the kind registry (kinds.KINDS); outs collects the outputs."""

    A: torch.Tensor                 # (M, K)
    W: torch.Tensor                 # (N, K)
    inputs: Mapping[str, Any]
    cd: torch.dtype
    graph: Any                      # ir.GraphIR
    kinds: Mapping[str, Any]        # kind name -> kinds.Kind
    outs: dict = dataclasses.field(default_factory=dict)

    @property
    def M(self) -> int:
        return self.A.shape[0]

    @property
    def N(self) -> int:
        return self.W.shape[0]

    def full(self, x: torch.Tensor) -> torch.Tensor:
        """Broadcasts a value that does not depend on the tile (a scalar, a vector) to M x N."""
        return x if tuple(x.shape) == (self.M, self.N) else torch.broadcast_to(x, (self.M, self.N)).contiguous()

    def apply(self, kind: str, *x: torch.Tensor) -> torch.Tensor:
        """The value of element-wise `kind` (a pair op's activation) on `x`."""
        return self.kinds[kind].interpret(self, None, *x)

    def element_dtype(self) -> str:
        """The op's dtype, where a graph leaves a pack's dtype to it: A's if 16-bit, else bfloat16."""
        if self.A.dtype in (torch.bfloat16, torch.float16):
            return str(self.A.dtype).replace("torch.", "")
        return "bfloat16"


def pointwise(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """The evaluation of an element-wise kind: fn of its input values (broadcasting)."""
    def evaluate(env: Env, node: Any, *x: torch.Tensor) -> torch.Tensor:
        return fn(*x)

    evaluate.__name__ = f"pointwise({getattr(fn, '__name__', 'fn')})"
    return evaluate


def gelu_tanh_grad(x: torch.Tensor) -> torch.Tensor:
    """d/dx GELU(x) (the tanh form 0.5 x (1 + tanh(y)), y = √(2/π) (x + 0.044715 x³)):
    0.5 (1 + tanh(y)) + 0.5 x (1 - tanh²(y)) y'."""
    k = math.sqrt(2.0 / math.pi)
    t = torch.tanh(k * (x + 0.044715 * x * x * x))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x)


def gelu_erf_grad(x: torch.Tensor) -> torch.Tensor:
    """d/dx GELU(x) (the erf form): Φ(x) + x φ(x)."""
    return 0.5 * (1.0 + torch.erf(x * math.sqrt(0.5))) + x * torch.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


def _bits24(x: torch.Tensor) -> torch.Tensor:
    """The fp32 bits of x rounded to its top 24 (to nearest, ties to even), as int64 in [0, 2**32); a NaN stays a
    NaN (quieted, its top bits kept)."""
    b = x.to(torch.float32).view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    nan = (b & 0x7FFFFFFF) > 0x7F800000
    return torch.where(nan, b | 0x00400000, b + 0x7F + ((b >> 8) & 1)) & 0xFFFFFF00


def _from_bits(b: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The fp32 value of bits b (int64 in [0, 2**32)), in like's dtype."""
    b = b & 0xFFFFFFFF
    return torch.where(b >= 2**31, b - 2**32, b).to(torch.int32).view(torch.float32).to(like.dtype)


def hi16(x: torch.Tensor) -> torch.Tensor:
    """x rounded to 24 bits with its low 16 bits cleared: a value bfloat16 holds exactly (join24 of it and lo8(x) is
    x to 15 mantissa bits)."""
    return _from_bits(_bits24(x) & 0xFFFF0000, x)


def lo8(x: torch.Tensor) -> torch.Tensor:
    """Bits 8..15 of x rounded to 24 bits, as an integer 0..255 (what hi16 drops)."""
    return ((_bits24(x) >> 8) & 0xFF).to(x.dtype)


def join24(hi: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    """The fp32 value whose top 16 bits are hi's (a bfloat16 value) and the next 8 lo (an integer 0..255, rounded
    and clamped as a uint8 store would): the inverse of (hi16, lo8)."""
    hi, lo = torch.broadcast_tensors(hi, lo)
    h = hi.to(torch.float32).view(torch.int32).to(torch.int64) & 0xFFFF0000
    byte = torch.nan_to_num(lo.to(torch.float32), nan=0.0).round().clamp(0, 255).to(torch.int64)   # as fmaxf/fminf
    return _from_bits(h | (byte << 8), hi)


# --- leaves --------------------------------------------------------------------------------

def accumulator(env: Env, node: Any) -> torch.Tensor:
    return env.A.to(env.cd) @ env.W.to(env.cd).t()


def scalar(env: Env, node: Any) -> torch.Tensor:
    mode = node.attr("mode")
    if mode == "constant":
        return torch.tensor(node.attr("value"), dtype=env.cd, device=env.A.device)
    if mode == "value":
        return torch.tensor(float(env.inputs[node.name]), dtype=env.cd, device=env.A.device)
    return env.inputs[node.name].to(device=env.A.device, dtype=env.cd).reshape(())


def row_vector(env: Env, node: Any) -> torch.Tensor:
    return env.inputs[node.name].to(env.cd)[None, :]


def col_vector(env: Env, node: Any) -> torch.Tensor:
    return env.inputs[node.name].to(env.cd)[:, None]


def tile(env: Env, node: Any) -> torch.Tensor:
    return env.inputs[node.name].to(env.cd)


def col_index(env: Env, node: Any) -> torch.Tensor:
    return torch.arange(env.N, dtype=env.cd, device=env.A.device)[None, :]


def pair_tile(env: Env, node: Any) -> torch.Tensor:
    """The (M, 2N) input as (M, N, 2) pairs."""
    return env.inputs[node.name].to(env.cd).reshape(env.M, env.N, 2)


# --- values that are not plain element-wise math ----------------------------------------------

def cast(env: Env, node: Any, x: torch.Tensor) -> torch.Tensor:
    return x.to(torch_dtype(node.attr("dtype"))).to(env.cd)


def unpack(env: Env, node: Any, pairs: torch.Tensor) -> torch.Tensor:
    return pairs[..., node.attr("half")]


def pack(env: Env, node: Any, even: torch.Tensor, odd: torch.Tensor) -> torch.Tensor:
    """(M, N, 2) pairs, each element rounded to the stored dtype."""
    dt = torch_dtype(node.attr("dtype") or env.element_dtype())
    return torch.stack([env.full(v).to(dt).to(env.cd) for v in (even, odd)], dim=-1)


def turns(env: Env, node: Any, position: torch.Tensor, hi: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    """frac(position * (hi + lo)) in [-0.5, 0.5], computed in fp64 (the exact definition)."""
    p, h, l_ = torch.broadcast_tensors(position, hi, lo)
    t = p.double() * (h.double() + l_.double())
    return (t - torch.round(t)).to(env.cd)


def pair_swap(env: Env, node: Any, x: torch.Tensor) -> torch.Tensor:
    """Swaps columns 2i and 2i+1."""
    x = env.full(x)
    return x.reshape(x.shape[0], -1, 2).flip(-1).reshape(x.shape)


def rotate_pairs(env: Env, node: Any, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Rotates each pair (x[2i], x[2i+1]) by 2π·t[2i]."""
    x, t = env.full(x), env.full(t)
    theta = 2 * math.pi * t[:, 0::2]
    a, b = x[:, 0::2], x[:, 1::2]
    c, s = torch.cos(theta), torch.sin(theta)
    return torch.stack([a * c - b * s, b * c + a * s], dim=-1).reshape(x.shape)


def segment_reduce(env: Env, node: Any, x: torch.Tensor) -> torch.Tensor:
    """Reduces each run of `size` columns of every row and broadcasts the result back."""
    size = node.attr("size")
    M, N = env.M, env.N
    r = REDUCE[node.attr("op")](env.full(x).reshape(M, N // size, size), 2)
    return r[:, :, None].expand(M, N // size, size).reshape(M, N)


def pair_gate(env: Env, node: Any, x: torch.Tensor) -> torch.Tensor:
    """act(x[:, 2i]) * x[:, 2i+1], half width."""
    x = env.full(x)
    return env.apply(node.attr("act"), x[:, 0::2]) * x[:, 1::2]


def keep_first(env: Env, node: Any, *x: torch.Tensor) -> torch.Tensor:
    """The root a plan adds to keep side outputs alive: its first input (D)."""
    return x[0]


# --- sinks -----------------------------------------------------------------------------------

def store(env: Env, node: Any, x: torch.Tensor) -> None:
    """The main output or a store: the value at M x N (a pair op's result as it is, M x N/2)."""
    half = "pair" in env.kinds[env.graph[node.inputs[0]].kind].flags
    env.outs[node.name] = x if half else env.full(x)


def pair_store(env: Env, node: Any, pairs: torch.Tensor) -> None:
    env.outs[node.name] = pairs.reshape(env.M, 2 * env.N)


def row_reduce(env: Env, node: Any, x: torch.Tensor) -> None:
    env.outs[node.name] = REDUCE[node.attr("op")](env.full(x), 1)


def col_reduce(env: Env, node: Any, x: torch.Tensor) -> None:
    env.outs[node.name] = REDUCE[node.attr("op")](env.full(x), 0)


def pair_gated_store(env: Env, node: Any, x: torch.Tensor) -> None:
    """store(pair_gate(x)) as the lowering passes fuse it."""
    env.outs[node.name] = pair_gate(env, node, x)
