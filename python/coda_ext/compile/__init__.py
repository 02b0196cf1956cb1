"""Graph -> compiled op: lowering, emission, the cached nvcc build, and parallel prebuilds."""
from __future__ import annotations

import concurrent.futures
import dataclasses
import os
from typing import Any, Iterable

from ..codegen import emit
from ..config import DEFAULT_CONFIG, KernelConfig
from ..graph import ir
from ..graph.builder import dtype_name
from ..passes import lower
from . import nvcc


@dataclasses.dataclass(frozen=True)
class KernelSource:
    graph: ir.Graph        # canonical user graph
    lowered: ir.Graph      # what was emitted
    dtype: str
    config: KernelConfig
    source: str

    @property
    def label(self) -> str:
        return f"{self.graph.digest()} [{self.dtype}, {self.config.tag}]"


def _as_ir(graph: Any) -> ir.Graph:
    if isinstance(graph, ir.Graph):
        from ..graph.verify import verify
        from ..passes import canonicalize

        return canonicalize(verify(graph))
    if hasattr(graph, "build"):
        return graph.build()
    raise TypeError(f"expected a coda_ext.Graph, got {type(graph).__name__}")


def kernel_source(graph: Any, dtype: Any = "bfloat16", config: KernelConfig | None = None) -> KernelSource:
    """Verifies, lowers and emits `graph`; nothing is compiled."""
    g = _as_ir(graph)
    d = dtype_name(dtype)
    if d == "float32":
        from ..errors import UnsupportedError

        raise UnsupportedError("GEMM operands must be torch.bfloat16 or torch.float16 (fp32 accumulate)")
    cfg = config or DEFAULT_CONFIG
    lowered = lower(g, d)
    return KernelSource(g, lowered, d, cfg, emit(lowered, d, cfg))


def emit_source(graph: Any, dtype: Any = "bfloat16", config: KernelConfig | None = None) -> str:
    """The C++ translation unit `graph` compiles to."""
    return kernel_source(graph, dtype, config).source


def compile(graph: Any, dtype: Any = "bfloat16", config: KernelConfig | str | None = None):  # noqa: A001
    """Returns a CompiledOp for `graph` with GEMM operands of `dtype`, building it on a cache miss.

    config: a KernelConfig; None for the default (coda_ext.DEFAULT_CONFIG, one kernel); "auto" for
    an op that picks a config per (N, K, M bucket, GPU): the one remembered from tuning, else a
    shape heuristic (coda_ext.tuning.heuristic) — the fast choice at any shape, compiling each
    config on its first use; "tune" for one that measures the candidate configs on the first call
    of an unknown shape. `prebuild([(graph, dtype, "auto")])` builds what "auto" may use."""
    from ..runtime.op import CompiledOp

    if isinstance(config, str):
        from ..tuning import TunedOp

        if config not in ("auto", "tune"):
            from ..errors import UnsupportedError

            raise UnsupportedError(f"config must be a KernelConfig, None, 'auto' or 'tune'; got {config!r}")
        return TunedOp(graph, dtype, tune=config == "tune")
    ks = kernel_source(graph, dtype, config)
    library = nvcc.build(ks.source, ks.label)
    return CompiledOp(ks.graph, ks.lowered, ks.dtype, ks.config, library, ks.source)


def cached(source: KernelSource) -> bool:
    """True if the kernel of `source` is already in the cache (no nvcc needed)."""
    from .cache import cache_key, entry_dir

    return (entry_dir(cache_key(source.source)) / nvcc.LIBRARY).is_file()


def prebuild(items: Iterable[tuple[Any, Any, KernelConfig | None]], jobs: int | None = None) -> list[str]:
    """Builds (graph, dtype, config) kernels in parallel, one nvcc per translation unit.
    Needs nvcc, not a GPU; the cache entries load on any machine with the same nvcc/CUTLASS.
    A config of "auto" or "tune" stands for every config such an op may use.
    Returns the library paths in order."""
    sources = [kernel_source(g, d, c) for g, d, c in expand_items(items)]
    jobs = jobs or max(1, min(len(sources), os.cpu_count() or 1))
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(nvcc.build, ks.source, ks.label) for ks in sources]
        return [f.result() for f in futures]


def expand_items(items):
    """(graph, dtype, config) items with "auto"/"tune" configs replaced by the configs they stand for."""
    for graph, dtype, config in items:
        if isinstance(config, str):
            yield from compile(graph, dtype, config).prebuild_items()
        else:
            yield graph, dtype, config


__all__ = ["KernelSource", "cached", "compile", "emit_source", "expand_items", "kernel_source", "prebuild"]
