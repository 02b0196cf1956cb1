"""Build a list of kernels ahead of time, in parallel, on any machine with nvcc (no GPU needed).

    python -m coda_ext prebuild path/to/cases.py [-j JOBS]
    python -m coda_ext prebuild --ops [OP ...] [--dtypes bfloat16]   # the ready ops' kernels
    python -m coda_ext prebuild --ops --dry-run                      # list and count, build nothing

The file defines build_items() -> [(graph, dtype, config), ...] (config: a KernelConfig, None for the
default, or "auto"/"tune" for every config such an op may use). The built kernels land
in the cache (CODA_EXT_CACHE_DIR or ~/.cache/coda_ext) and load on the GPU machine as long as
nvcc and CUTLASS versions match. Before building it prints how many kernels and about how long;
by default as many nvcc run at once as there are CPUs and memory for (about 4 GB each).
"""
from __future__ import annotations

import argparse
import importlib.util
import math
import os
import statistics
import sys
import time

from ..jit import NVCC_MEMORY_BYTES, cached, default_jobs, kernel_source
from ..jit.nvcc import measured_seconds
from ..runtime import expand_items, prebuild

#: nvcc seconds of one kernel when this cache has no measurement yet (measured: 31-54 s alone on
#: 2-core machines, 50-74 s on a 16-core H100 host; more when the machine is busy).
TYPICAL_KERNEL_S = 60.0


def load_items(path: str):
    """build_items() of a Python file, imported as `python FILE` would run it: its folder first on
    sys.path (so it imports its siblings) and the module registered under a name of its own. A file
    inside a package (benchmarks/, tests/gpu/) also finds its package by name, from any directory:
    the folder above the package's top comes next on sys.path, as for `python -m package.module`."""
    folder = os.path.dirname(os.path.abspath(path))
    top = folder
    while os.path.isfile(os.path.join(top, "__init__.py")):
        top = os.path.dirname(top)
    for entry in (top, folder):   # the file's folder ends up first
        if entry not in sys.path:
            sys.path.insert(0, entry)
    name = f"coda_prebuild_{len(sys.modules)}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module   # dataclasses look their module up there
    spec.loader.exec_module(module)
    if not hasattr(module, "build_items"):
        raise SystemExit(f"{path} defines no build_items()")
    return module.build_items()


def ready_op_names() -> list[str]:
    from .. import ops

    return [m.NAME for m in ops.MODULES + ops.BACKWARD_MODULES]


def ready_op_items(names: list[str], dtypes: list[str]):
    """(graph, dtype, config) of every config "auto" may use for every graph variant (and its operand
    layout) of the named ready ops (all if none named)."""
    from .. import ops

    known = {m.NAME: m for m in ops.MODULES + ops.BACKWARD_MODULES}
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise SystemExit(f"unknown ready op(s) {unknown}; known: {sorted(known)}")
    chosen = [known[n] for n in names] if names else list(known.values())
    from ..runtime.tuned import TunedOp

    return [item for m in chosen for build, args, major in m.BUILDS for d in dtypes
            for item in TunedOp(build(*args), d, tune=False, major=major).prebuild_items()]


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def estimate(to_build: int, jobs: int, measured: list[float], cpus: int | None = None) -> tuple[float, str]:
    """(seconds, how it was estimated) for building `to_build` kernels with `jobs` parallel nvcc:
    the median nvcc time of this cache's builds (else TYPICAL_KERNEL_S) per round of
    min(jobs, cpus) kernels."""
    per = statistics.median(measured) if measured else TYPICAL_KERNEL_S
    builds = f"{len(measured)} build" + ("s" if len(measured) > 1 else "")
    how = (f"{per:.0f} s per kernel, the median of {builds} in this cache" if measured
           else f"about {per:.0f} s per kernel, a typical figure: nothing built in this cache yet")
    at_once = max(1, min(jobs, cpus or os.cpu_count() or 1))
    return math.ceil(to_build / at_once) * per, how


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m coda_ext prebuild", description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", help="Python files defining build_items()")
    parser.add_argument("--ops", nargs="*", metavar="OP", default=None,
                        help="the ready ops' kernels (coda_ext.ops; all of them, or the named ones: "
                             f"{', '.join(ready_op_names())}), every config 'auto' may pick")
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float16"], help="dtypes of --ops")
    parser.add_argument("-j", "--jobs", type=int, default=None,
                        help="parallel nvcc processes (default: the CPU count, at most one per "
                             f"{NVCC_MEMORY_BYTES >> 30} GB of available memory: {default_jobs()} here)")
    parser.add_argument("--dry-run", action="store_true", help="list and count the kernels, build nothing")
    args = parser.parse_args(argv)
    if not args.files and args.ops is None:
        parser.error("name files defining build_items(), or --ops")
    listed = [item for f in args.files for item in load_items(f)]
    if args.ops is not None:
        listed += ready_op_items(args.ops, args.dtypes)
    items = list(expand_items(listed))
    distinct = {ks.source: ks for ks in (kernel_source(*item) for item in items)}
    ready = {source: cached(ks) for source, ks in distinct.items()}
    hits = sum(ready.values())
    jobs = args.jobs or default_jobs()
    if args.dry_run:
        for source, ks in distinct.items():
            print(f"{'cached' if ready[source] else 'build '}  {ks.label}")
    seconds, how = estimate(len(distinct) - hits, jobs, measured_seconds())
    print(f"coda_ext: {len(distinct)} kernels, {hits} already in the cache, {len(distinct) - hits} to build "
          f"with -j {jobs}: about {_duration(seconds)} ({how}; up to {NVCC_MEMORY_BYTES >> 30} GB of memory "
          "per nvcc)", file=sys.stderr, flush=True)
    if args.dry_run:
        return 0
    start = time.monotonic()
    prebuild(items, jobs=jobs)
    print(f"coda_ext: {len(distinct)} kernels ready in {_duration(time.monotonic() - start)} "
          f"({hits} already in the cache, {len(distinct) - hits} compiled)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
