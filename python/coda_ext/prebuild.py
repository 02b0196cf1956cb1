"""Build a list of kernels ahead of time, in parallel, on any machine with nvcc (no GPU needed).

    python -m coda_ext.prebuild path/to/cases.py [-j JOBS]

The file defines build_items() -> [(graph, dtype, config), ...] (config: a KernelConfig, None for the
default, or "auto"/"tune" for every config such an op may use). The built kernels land
in the cache (CODA_EXT_CACHE_DIR or ~/.cache/coda_ext) and load on the GPU machine as long as
nvcc and CUTLASS versions match.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time

from .compile import cached, kernel_source
from .runtime import expand_items, prebuild


def load_items(path: str):
    spec = importlib.util.spec_from_file_location("coda_prebuild_cases", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "build_items"):
        raise SystemExit(f"{path} defines no build_items()")
    return module.build_items()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m coda_ext.prebuild", description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="Python files defining build_items()")
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count(), help="parallel nvcc processes")
    args = parser.parse_args(argv)
    items = list(expand_items(item for f in args.files for item in load_items(f)))
    distinct = {ks.source: ks for ks in (kernel_source(*item) for item in items)}
    hits = sum(cached(ks) for ks in distinct.values())
    start = time.monotonic()
    prebuild(items, jobs=args.jobs)
    print(f"coda_ext: {len(distinct)} kernels ready in {time.monotonic() - start:.0f} s "
          f"({hits} already in the cache, {len(distinct) - hits} compiled)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
