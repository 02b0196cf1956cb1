"""The public entry points: compile a graph into an op, and prebuild kernels ahead of time."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..config import DEFAULT_CONFIG, KernelConfig
from ..errors import UnsupportedError
from ..jit import build_kernels
from .op import compile_config
from .tuned import TunedOp


def compile(graph: Any, dtype: Any = "bfloat16", config: KernelConfig | str | None = None,  # noqa: A001
            major: str | None = None):
    """Returns an op for `graph` with GEMM operands of `dtype`, building its kernel on a cache miss.

    config: a KernelConfig; None for the default (coda_ext.DEFAULT_CONFIG, one kernel); "auto" for
    an op that picks a config per (N, K, M, GPU): the one remembered from tuning (per M bucket), else a
    shape heuristic (coda_ext.tuning.heuristic) — the fast choice at any shape, compiling each
    config on its first use; "tune" for one that measures the candidate configs on the first call
    of an unknown shape. `prebuild([(graph, dtype, "auto")])` builds what "auto" may use.
    major: the operand layout (coda_ext.config.MAJORS): "kn" reads W as a transposed view (dz @ W for
    a dX GEMM: op(dz, W.t())), "mn" both operands (the weight gradient dzᵀ @ x: op(dz.t(), x.t()));
    None keeps the config's ("kk" by default).
    Every op is a torch custom op (coda_ext::run_graph): it works under torch.compile(fullgraph=True)
    and in CUDA-graph capture."""
    import dataclasses


    if isinstance(config, str):
        if config not in ("auto", "tune"):
            raise UnsupportedError(f"config must be a KernelConfig, None, 'auto' or 'tune'; got {config!r}")
        return TunedOp(graph, dtype, tune=config == "tune", major=major or "kk")
    if major is not None:
        config = dataclasses.replace(config or DEFAULT_CONFIG, major=major)
    return compile_config(graph, dtype, config)


def expand_items(items: Iterable[tuple[Any, Any, Any]]):
    """(graph, dtype, config) items with "auto"/"tune" configs replaced by the configs they stand for."""

    for graph, dtype, config in items:
        if isinstance(config, str):
            yield from TunedOp(graph, dtype, tune=config == "tune").prebuild_items()
        else:
            yield graph, dtype, config


def prebuild(items: Iterable[tuple[Any, Any, KernelConfig | str | None]], jobs: int | None = None,
             binding: bool = False) -> list[str]:
    """Builds (graph, dtype, config) kernels in parallel, one nvcc per translation unit.
    Needs nvcc, not a GPU; the cache entries load on any machine with the same nvcc/CUTLASS.
    A config of "auto" or "tune" stands for every config such an op may use. binding=True also
    builds the torch binding every launch needs (a C++ compiler, once per torch version) in the
    same pool. Returns the library paths in order."""
    return build_kernels(list(expand_items(items)), jobs, binding=binding)
