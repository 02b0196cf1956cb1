"""Fresh random inputs, one factory per kind, for the tests and the benchmarks (never zeros: a value
an op ignores or mixes up must change its result).

Every factory draws from a torch.Generator and puts its tensor on the generator's device:

    gen = rand.generator("swiglu", lead, device="cuda")        # the same key, the same values
    A, W = rand.operands(gen, M, N, K, torch.bfloat16)         # A @ W^T of unit order
    x, w = rand.randn(gen, M, K), rand.randn(gen, N, K, scale=K ** -0.5)
    rstd = rand.positive(gen, M)                               # [0.5, 1.5): per-row scales
    pos = rand.indices(gen, M, high=100_000)                   # token positions
    target = rand.targets(gen, M, vocab=V)                     # class ids, one in ten ignored
    A, W, inputs = rand.op_inputs(op, M, N, K, gen)            # a compiled op's whole call
"""
from __future__ import annotations

import zlib
from typing import Any

import torch

INT_DTYPES = (torch.int32, torch.int64)


def generator(*key: Any, device: Any = "cpu") -> torch.Generator:
    """A generator seeded from `key` (values with a stable repr): the same key gives the same values
    in every process (unlike hash(), which Python salts per process)."""
    return torch.Generator(device=device).manual_seed(zlib.crc32(repr(key).encode()))


def _shape(shape: tuple) -> tuple:
    """(2, 3) from randn(gen, 2, 3) and from randn(gen, (2, 3))."""
    return tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)) else shape


def randn(gen: torch.Generator, *shape: Any, dtype: torch.dtype = torch.float32, scale: float = 1.0) -> torch.Tensor:
    """Normal values times `scale`, rounded to `dtype`: activations, weights (scale K**-0.5), tiles,
    vectors, cotangents."""
    return (torch.randn(_shape(shape), generator=gen, device=gen.device) * scale).to(dtype)


def positive(gen: torch.Generator, *shape: Any, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Uniform values in [0.5, 1.5): per-row scales (rstd), norm weights, pointer scalars."""
    return (torch.rand(_shape(shape), generator=gen, device=gen.device) + 0.5).to(dtype)


def scalar(gen: torch.Generator) -> float:
    """A runtime scalar argument in [0.5, 1.5), as the kernel takes it (an fp32 value)."""
    return float(torch.tensor(0.5 + torch.rand((), generator=gen, device=gen.device).item(), dtype=torch.float32))


def indices(gen: torch.Generator, *shape: Any, high: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """Uniform integers in [0, high): token positions, class targets, integer vectors."""
    return torch.randint(0, high, _shape(shape), generator=gen, device=gen.device, dtype=dtype)


def targets(gen: torch.Generator, *shape: Any, vocab: int, ignore_index: int = -100,
            ignored: float = 0.1) -> torch.Tensor:
    """Class targets in [0, vocab), about `ignored` of them set to `ignore_index`."""
    t = indices(gen, *shape, high=vocab)
    t[torch.rand(t.shape, generator=gen, device=gen.device) < ignored] = ignore_index
    return t


def operands(gen: torch.Generator, M: int, N: int, K: int, dtype: torch.dtype, major: str = "kk"):
    """A (M, K) and W (N, K) with A @ W^T of unit order (each N(0, 1) * K**-0.25), laid out as a kernel
    config of `major` reads them: A's M / W's N contiguous is a transposed view of (K, M) / (K, N)
    storage. The values do not depend on the layout."""
    A = randn(gen, M, K, dtype=dtype, scale=K ** -0.25)
    W = randn(gen, N, K, dtype=dtype, scale=K ** -0.25)
    if major[0] == "m":
        A = A.t().contiguous().t()
    if major[1] == "n":
        W = W.t().contiguous().t()
    return A, W


def tensor_input(gen: torch.Generator, shape: tuple, dtype: torch.dtype, N: int) -> torch.Tensor:
    """A graph's tensor input: integer vectors in [0, max(N, 2)) (a column index can match them), uint8 tiles
    bytes in [0, 256), every other dtype normal values."""
    if dtype in INT_DTYPES:
        return indices(gen, shape, high=max(N, 2), dtype=dtype)
    if dtype == torch.uint8:
        return indices(gen, shape, high=256, dtype=dtype)
    return randn(gen, shape, dtype=dtype)


def graph_inputs(op: Any, M: int, N: int, gen: torch.Generator) -> dict[str, Any]:
    """Fresh values for every input of a compiled op (CompiledOp, TunedOp: anything with `slots`,
    `input_names` and `input_shape`): runtime scalars, pointer scalars, then tensors by tensor_input."""
    from coda_ext.graph.interpret import torch_dtype

    out: dict[str, Any] = {}
    for s in op.slots:
        if s.kind == "scalar" and s.mode == "pointer":
            out[s.name] = positive(gen, 1)
        elif s.kind == "scalar":
            out[s.name] = scalar(gen)
        elif s.name in op.input_names:
            dt = torch_dtype(s.dtype) if s.dtype else op.dtype
            out[s.name] = tensor_input(gen, op.input_shape(s.name, M, N), dt, N)
    return out


def op_inputs(op: Any, M: int, N: int, K: int, gen: torch.Generator):
    """(A, W, inputs) of one call of a compiled op: operands in its layout (op.major), then graph_inputs."""
    A, W = operands(gen, M, N, K, op.dtype, getattr(op, "major", "kk"))
    return A, W, graph_inputs(op, M, N, gen)
