"""The plain GEMM (identity epilogue) under every swizzle and raster order of the persistent tile scheduler,
in N-major and K-major W, at shapes whose tile counts a swizzle does not divide, in both grids: CUTLASS's
("padded": the M and N tile counts rounded up to multiples of the swizzle, the padded tiles taking their turns)
and the fitted one (only the count across the raster direction rounded up; csrc/kernels/fitted_grid.cuh;
tuning.scheduled_tiles; the heuristic's swizzle is fitted to the shape, tuning.fit_swizzle).

    python -m benchmarks.sweep_swizzle [--shapes 16384,768,3072 ...] [--reps 8] [--grids fitted padded]

Each config is timed interleaved with cuBLAS (A @ W of the same layout; median of per-round ratios).
Swizzle and raster are launch arguments: one kernel per base config and layout. Results (--out):
sweep_swizzle_<gpu>.json in benchmarks/results/.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys

import coda_ext as ce
from benchmarks.common import gpu_info, results_path, summarize, time_interleaved, write_json

#: BERT-base's dX GEMMs (d 768, FFN 3072) at 32 x 512 tokens: 6 N tiles of 128 at N = 768.
SHAPES = ((16384, 768, 3072), (16384, 3072, 768), (16384, 768, 768))
BASES = {"ping": ce.KernelConfig((128, 128, 64), (1, 1), "pingpong"),
         "coop": ce.KernelConfig((128, 128, 64), (1, 1), "cooperative"),
         "ping192": ce.KernelConfig((128, 192, 64), (1, 1), "pingpong")}
SWIZZLES = (1, 2, 4, 8)
RASTERS = ("heuristic", "along_m", "along_n")


def build_items() -> list:
    """Every kernel the sweep launches (python -m coda_ext prebuild benchmarks/sweep_swizzle.py)."""
    from coda_ext import graphs

    return [(graphs.identity(), "bfloat16", dataclasses.replace(c, major=m)) for c in BASES.values()
            for m in ("kk", "kn")]


def sweep(shape: tuple[int, int, int], reps: int, grids=("fitted", "padded")) -> dict:
    """{variant: summary}: cuBLAS in both layouts, then "<base>_<major>_s<swizzle>_<raster>[_padded]" for every
    base in N-major W under every swizzle, raster and grid, and in K-major W at its default launch (swizzle 4)."""
    import torch

    from coda_ext import graphs

    M, N, K = shape
    gen = torch.Generator(device="cuda").manual_seed(0)
    A = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=gen)
    w_kn = torch.randn(K, N, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02
    w_kk = w_kn.t().contiguous()
    fns = {"cublas_kn": lambda i: A @ w_kn, "cublas_kk": lambda i: A @ w_kk.t()}
    for name, base in BASES.items():
        for major, w in (("kn", w_kn.t()), ("kk", w_kk)):
            launches = ([(s, r, g) for s in SWIZZLES for r in RASTERS for g in grids] if major == "kn"
                        else [(4, "heuristic", g) for g in grids])
            for s, r, g in launches:
                op = ce.compile(graphs.identity(), "bfloat16",
                                dataclasses.replace(base, major=major, swizzle=s, raster=r, grid=g))
                fns[f"{name}_{major}_s{s}_{r}" + ("" if g == "fitted" else f"_{g}")] = lambda i, op=op, w=w: op(A, w)
    return summarize(time_interleaved(fns, reps), "cublas_kn")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=[",".join(map(str, s)) for s in SHAPES], help="M,N,K ...")
    p.add_argument("--reps", type=int, default=8)
    p.add_argument("--grids", nargs="+", default=["fitted", "padded"], choices=["fitted", "padded"])
    p.add_argument("--out", default=None, help="results JSON (default: sweep_swizzle_<gpu>.json in results/)")
    args = p.parse_args(argv)
    ce.prebuild(build_items())
    doc = {"env": gpu_info(), "reps": args.reps, "results": {}}
    for text in args.shapes:
        shape = tuple(int(x) for x in text.split(","))
        res = doc["results"]["x".join(map(str, shape))] = sweep(shape, args.reps, args.grids)
        print(f"== {'x'.join(map(str, shape))}", flush=True)
        for k, v in sorted(res.items(), key=lambda kv: kv[1]["median_ms"]):
            print(f"   {k:30s} {v['median_ms'] * 1e3:7.1f} us {v['median_ratio_to_cublas']:6.3f}", flush=True)
    print(f"wrote {write_json(args.out or results_path('sweep_swizzle'), doc)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
