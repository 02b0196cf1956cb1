"""Graph -> kernel library: lowering, emission, the cached nvcc build, and parallel builds.

The op built on a library (and the per-shape dispatch) is runtime/, one floor up."""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import os
from collections.abc import Iterable
from typing import Any

from ..codegen import emit
from ..codegen.constraints import check_column_partials, check_shared_memory, fit_config, fit_gated_store
from ..config import DEFAULT_CONFIG, KernelConfig
from ..graph import ir
from ..graph.builder import dtype_name
from ..graph.canonical import as_ir
from ..passes import lower
from . import nvcc


@dataclasses.dataclass(frozen=True)
class KernelSource:
    graph: ir.GraphIR        # canonical user graph
    lowered: ir.GraphIR      # what was emitted
    dtype: str
    config: KernelConfig
    source: str

    @property
    def label(self) -> str:
        return f"{self.graph.digest()} [{self.dtype}, {self.config.tag}]"


def kernel_source(graph: Any, dtype: Any = "bfloat16", config: KernelConfig | None = None) -> KernelSource:
    """Verifies, lowers and emits `graph`; nothing is compiled."""
    g = as_ir(graph)
    d = dtype_name(dtype)
    if d == "float32":
        from ..errors import UnsupportedError

        raise UnsupportedError("GEMM operands must be torch.bfloat16 or torch.float16 (fp32 accumulate)")
    lowered = lower(g, d)
    cfg = fit_gated_store(lowered, d, fit_config(lowered, config or DEFAULT_CONFIG))
    check_shared_memory(lowered, d, cfg)
    check_column_partials(lowered, d, cfg)
    return KernelSource(g, lowered, d, cfg, emit(lowered, d, cfg))


def emit_source(graph: Any, dtype: Any = "bfloat16", config: KernelConfig | None = None) -> str:
    """The C++ translation unit `graph` compiles to."""
    return kernel_source(graph, dtype, config).source


def cached(source: KernelSource) -> bool:
    """True if the kernel of `source` is in the cache and usable (its checksum matches): no nvcc needed."""
    from .cache import cache_key, entry_dir

    return nvcc.check_entry(entry_dir(cache_key(source.source))) is None


#: The memory one nvcc of a kernel translation unit may take (CUTLASS's templates): parallel
#: builds are capped at the available memory / this.
NVCC_MEMORY_BYTES = 4 << 30


def available_memory() -> int | None:
    """Bytes of memory available now (MemAvailable of /proc/meminfo, else sysconf); None if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def default_jobs() -> int:
    """Parallel nvcc processes: the CPU count, capped at the available memory / NVCC_MEMORY_BYTES."""
    cpus = os.cpu_count() or 1
    memory = available_memory()
    return max(1, cpus if memory is None else min(cpus, memory // NVCC_MEMORY_BYTES))


def build_kernels(items: Iterable[tuple[Any, Any, KernelConfig | None]], jobs: int | None = None,
                  binding: bool = False) -> list[str]:
    """Builds (graph, dtype, config) kernels in parallel, one nvcc per translation unit (concrete
    configs; coda_ext.prebuild also expands "auto"/"tune"); jobs defaults to default_jobs().
    binding=True also builds the torch binding (the launcher every op needs) in the same pool, if
    it is not built yet. Two or more builds share one progress line (nvcc.Progress.batch).
    Returns the library paths in order."""
    from . import binding as torch_binding

    sources = [kernel_source(g, d, c) for g, d, c in items]
    todo = [ks for ks in {ks.source: ks for ks in sources}.values() if not cached(ks)]
    jobs_todo: list[tuple[Any, tuple]] = [(nvcc.build, (ks.source, ks.label)) for ks in todo]
    if binding and not torch_binding.built():
        jobs_todo.insert(0, (torch_binding.load_binding, ()))
    if jobs_todo:
        what = f"{len(todo)} kernel{'s' if len(todo) != 1 else ''}"
        what = what + " and the torch binding" if len(jobs_todo) > len(todo) else what
        batch = nvcc.PROGRESS.batch(what, len(jobs_todo)) if len(jobs_todo) > 1 else contextlib.nullcontext()

        def run(fn, args):
            result = fn(*args)
            nvcc.PROGRESS.advance()
            return result

        with batch, concurrent.futures.ThreadPoolExecutor(max_workers=min(len(jobs_todo),
                                                                          jobs or default_jobs())) as pool:
            for f in [pool.submit(run, fn, args) for fn, args in jobs_todo]:
                f.result()
    return [nvcc.build(ks.source, ks.label) for ks in sources]   # every one in the cache now: no nvcc


__all__ = ["NVCC_MEMORY_BYTES", "KernelSource", "available_memory", "build_kernels", "cached", "default_jobs",
           "emit_source", "kernel_source"]
