"""The tile scheduler's launch arguments (swizzle, raster order) on the epilogue GEMMs of an ablation family:
how much of the epilogue's cost is the mainloop's DRAM traffic. Swizzle and raster are launch arguments,
so every config here reuses its base config's kernel (nothing is built beyond benchmarks.ablate_epilogue's).

    python -m benchmarks.sweep_raster --family dswiglu [--variants acc full] [--reps 10]
    ncu --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum -k regex:device_kernel \\
        python -m benchmarks.sweep_raster --family dswiglu --once      # each kernel once, in the printed order

Each kernel is timed alone (random inputs, shared by the configs of one graph) interleaved with the bare
cuBLAS GEMM of the shape (median of per-round ratios). Results (--out): sweep_raster_, the family and _<gpu>,
<gpu> the GPU it runs on (on an H100: sweep_raster_dswiglu_h100.json).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys

import torch

import coda_ext as ce
from benchmarks import ablate_epilogue as ab
from benchmarks.common import gpu_info, results_path, summarize, time_interleaved, write_json
from tests.helpers import rand

#: 16 is past CUTLASS's own cap (csrc/kernels/wide_swizzle.cuh): strips of 16 tiles, 2048 rows of 128
SWIZZLES = (1, 2, 4, 8, 16)
RASTERS = ("along_m", "along_n")


def configs(base) -> list:
    return [dataclasses.replace(base, swizzle=s, raster=r) for s in SWIZZLES for r in RASTERS]


def kernels(family: str, names: list[str] | None, base_index: list[int] | None = None) -> dict:
    """{variant: [(config, op)]} of the family's variants (all, or `names` by prefix) in every base config
    of the family (or those numbered in `base_index`), under every swizzle and raster."""
    make, bases, _ = ab.FAMILIES[family]
    if base_index:
        bases = [bases[i] for i in base_index]
    out = {}
    for name, graph in make().items():
        if names and not any(name.startswith(n) for n in names):
            continue
        out[name] = [(c, ce.compile(graph, "bfloat16", c)) for b in bases for c in configs(b)]
    return out


def run(family: str, shape: tuple[int, int, int], ops: dict, reps: int, once: bool) -> dict:
    M, N, K = shape
    gen = rand.generator("raster", family, device="cuda")
    fns = {}
    base = [rand.operands(gen, M, N, K, torch.bfloat16) for _ in range(2)]
    fns["cublas_gemm"] = lambda i: torch.nn.functional.linear(*base[i])
    for name, cops in ops.items():
        sets = [rand.op_inputs(cops[0][1], M, N, K, gen) for _ in range(2)]   # one graph: the same inputs
        for cfg, op in cops:
            fns[f"{name} [{cfg.tag}]"] = lambda i, op=op, s=sets: op(s[i][0], s[i][1], **s[i][2])
    if once:
        for name, fn in fns.items():
            print(f"{M}x{N}x{K} {name}", flush=True)
            fn(0)
            torch.cuda.synchronize()
        return {}
    return summarize(time_interleaved(fns, reps), "cublas_gemm")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--family", default="dswiglu", choices=[f for f in ab.FAMILIES if ab.FAMILIES[f][2]])
    p.add_argument("--variants", nargs="*", default=None, help="variant names (prefixes) of the family; default all")
    p.add_argument("--bases", type=int, nargs="*", default=None,
                   help="the family's base configs to sweep, by index (default all; benchmarks.ablate_epilogue)")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--once", action="store_true", help="run each kernel once (for a profiler) and time nothing")
    p.add_argument("--out", default=None, help="results JSON (default: sweep_raster_<family>_<gpu>.json in "
                   "benchmarks/results/, <gpu> the GPU it runs on: h100, h200, …)")
    args = p.parse_args(argv)
    ops = kernels(args.family, args.variants, args.bases)
    doc = {"family": args.family, "env": gpu_info(), "shapes": {}}
    for label, shape in ab.FAMILIES[args.family][2].items():
        res = run(args.family, shape, ops, args.reps, args.once)
        if args.once:
            continue
        doc["shapes"][label] = {"shape": dict(zip("MNK", shape)), "results": res}
        print(f"{label} {'x'.join(map(str, shape))}")
        for name, s in res.items():
            print(f"    {name:64s} {s['median_ms']:8.3f} ms  x{s['median_ratio_to_cublas']:.3f}", flush=True)
    if not args.once:
        write_json(args.out or results_path(f"sweep_raster_{args.family}", gpu=doc["env"]["gpu"]), doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
