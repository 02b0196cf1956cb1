"""Build a list of kernels ahead of time, in parallel, on any machine with nvcc (no GPU needed).

    python -m coda_ext prebuild path/to/cases.py [-j JOBS]
    python -m coda_ext prebuild --ops [OP ...] [--dtypes bfloat16]   # the ready ops' kernels

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

from ..jit import cached, kernel_source
from ..runtime import expand_items, prebuild


def load_items(path: str):
    """build_items() of a Python file, imported as `python FILE` would run it: its folder first on
    sys.path (so it imports its siblings) and the module registered under a name of its own."""
    folder = os.path.dirname(os.path.abspath(path))
    if folder not in sys.path:
        sys.path.insert(0, folder)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m coda_ext prebuild", description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", help="Python files defining build_items()")
    parser.add_argument("--ops", nargs="*", metavar="OP", default=None,
                        help="the ready ops' kernels (coda_ext.ops; all of them, or the named ones: "
                             f"{', '.join(ready_op_names())}), every config 'auto' may pick")
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float16"], help="dtypes of --ops")
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count(), help="parallel nvcc processes")
    args = parser.parse_args(argv)
    if not args.files and args.ops is None:
        parser.error("name files defining build_items(), or --ops")
    listed = [item for f in args.files for item in load_items(f)]
    if args.ops is not None:
        listed += ready_op_items(args.ops, args.dtypes)
    items = list(expand_items(listed))
    distinct = {ks.source: ks for ks in (kernel_source(*item) for item in items)}
    hits = sum(cached(ks) for ks in distinct.values())
    start = time.monotonic()
    prebuild(items, jobs=args.jobs)
    print(f"coda_ext: {len(distinct)} kernels ready in {time.monotonic() - start:.0f} s "
          f"({hits} already in the cache, {len(distinct) - hits} compiled)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
