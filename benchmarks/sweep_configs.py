"""Sweeps kernel configs (tile, cluster, schedule; swizzle at launch) of one graph across shapes,
against the bare cuBLAS GEMM: the measurements behind the config heuristic (coda_ext/tuning.py).

    python -m benchmarks.sweep_configs [--cases identity,design] [--shapes llama | M,N,K ...]
        [--swizzles 1,4,8] [--rasters heuristic,along_m,along_n] [--only TAG,...]
        [--epilogues auto,64x64,64x64/d3,d4] [--reps 20] [--out FILE.json] [--dry-run]

--epilogues times each selected config also with other epilogue subtiles and TMA store stages (EPI_MxEPI_N, /dN or
dN: N store stages, the load stages CUTLASS's 4; "auto": the config as it is); those kernels are built in parallel
before the timing.

--out defaults to sweep_<gpu>.json in benchmarks/results/, <gpu> the GPU it runs on (h100, h200, …).
Kernels: `python -m coda_ext prebuild benchmarks/sweep_configs.py` builds the sweep ahead.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import coda_ext as ce
from benchmarks import bench_graphs, common, graphs
from coda_ext import graphs as coda_graphs
from tests.helpers import rand

K = ce.KernelConfig
#: Compiled variants (swizzle is a launch argument and varies without recompiling).
SWEEP = (
    K((128, 128, 64), (1, 1), "pingpong"), K((128, 128, 64), (2, 1), "pingpong"),
    K((128, 128, 64), (1, 2), "pingpong"), K((64, 256, 64), (1, 1), "pingpong"),
    K((64, 256, 64), (2, 1), "pingpong"), K((128, 128, 64), (2, 1), "cooperative"),
    K((128, 256, 64), (1, 1), "cooperative"), K((128, 256, 64), (2, 1), "cooperative"),
    K((128, 256, 64), (1, 2), "cooperative"), K((256, 128, 64), (1, 1), "cooperative"),
    K((256, 128, 64), (2, 1), "cooperative"), K((256, 128, 64), (1, 2), "cooperative"),
    K((128, 128, 64), (1, 1), "streamk"), K((128, 256, 64), (1, 1), "streamk"),
    K((64, 128, 64), (1, 1), "pingpong"), K((128, 128, 64), (1, 1), "cooperative"),
    K((128, 192, 64), (1, 1), "pingpong"), K((128, 192, 64), (2, 1), "pingpong"),
    K((128, 192, 64), (1, 2), "pingpong"), K((128, 128, 64), (1, 1), "overlap"),
    K((128, 256, 64), (2, 1), "streamk"), K((128, 192, 64), (1, 1), "streamk"),
    K((128, 192, 64), (2, 1), "streamk"), K((128, 192, 64), (2, 1), "cooperative"),
)
SWEEP_CASES = ("identity", "design")
#: Graphs swept beside the goal graphs: the training LM head's logits GEMM (exp(logits) stored, Σ exp per row;
#: ops.lm_head_ce.train_graph unscaled), at its 2048-row chunks: --cases lm_head_train --shapes 2048,128256,2048
#: and the ready ops whose epilogues miss at the training shapes: linear + residual + norm statistic (--shapes
#: 16384,2048,2048 16384,4096,4096), QKV + RoPE (1B: head_dim 64, 16384,3072,2048) and QKV + QK-norm + RoPE as
#: the ready op launches it (the input norm's rstd applied; head_dim 64, and 128 as the 8B shape has it:
#: 16384,6144,4096).
CASES = {**graphs.CASES, "lm_head_train": (lambda: coda_graphs.lm_head_cross_entropy_train(False), None),
         "residual_norm": (coda_graphs.linear_residual_norm, None),
         "qkv_rope": (lambda: coda_graphs.qkv_rope(False, False, 64), None),
         "qkv_rope_qknorm": (lambda: coda_graphs.qkv_rope(True, True, 64), None),
         "qkv_rope_qknorm_8b": (lambda: coda_graphs.qkv_rope(True, True, 128), None)}


def build_items(case_names=SWEEP_CASES):
    return [(CASES[c][0](), "bfloat16", cfg) for c in case_names for cfg in SWEEP]


def selected(only: str | None):
    """SWEEP, or the configs whose tag contains one of the comma-separated parts of `only`."""
    return [c for c in SWEEP if not only or any(part in c.tag for part in only.split(","))]


def epilogue_variants(configs, specs: str = "auto") -> list:
    """Each config in each comma-separated epilogue spec: "auto" (as it is), "EPI_MxEPI_N" (the subtile), "dN" (N TMA
    store stages, CUTLASS's 4 load stages) or both, "64x64/d3"; a spec the config cannot take is left out."""
    out = []
    for cfg in configs:
        for spec in specs.split(","):
            changes = {}
            for part in spec.split("/"):
                if part.startswith("d"):
                    changes["epilogue_stages"] = (4, int(part[1:]))
                elif part != "auto":
                    changes["epilogue_tile"] = tuple(int(x) for x in part.split("x"))
            try:
                out.append(dataclasses.replace(cfg, **changes))
            except ce.UnsupportedError as e:
                print(f"{cfg.tag} {spec}: left out ({e})", file=sys.stderr)
    return out


def sweep_case(name: str, shapes, swizzles, reps: int, sweep=SWEEP, rasters=("heuristic",)) -> dict:
    import torch
    import torch.nn.functional as F

    graph = CASES[name][0]().build()
    ce.prebuild([(graph, "bfloat16", cfg) for cfg in sweep], jobs=os.cpu_count())   # in parallel, not one by one
    # one kernel per compiled config; the swizzle variants load the same cached library
    configs = [dataclasses.replace(cfg, swizzle=s, raster=r) for cfg in sweep for s in swizzles for r in rasters]
    ops = {c.tag: ce.compile(graph, "bfloat16", c) for c in configs}
    first = next(iter(ops.values()))
    out = {}
    for M, N, Kd in shapes:
        sets = [rand.op_inputs(first, M, N, Kd, rand.generator(seed, device="cuda")) for seed in (0, 1)]
        variants = {"cublas_gemm": lambda i: F.linear(sets[i][0], sets[i][1])}
        for tag, op in ops.items():
            variants[tag] = lambda i, op=op: op(sets[i][0], sets[i][1], **sets[i][2])
        summary = common.summarize(common.time_interleaved(variants, reps), "cublas_gemm")
        for s in summary.values():
            s["tflops"] = 2.0 * M * N * Kd / (s["median_ms"] * 1e-3) / 1e12
        best = min((t for t in summary if t != "cublas_gemm"), key=lambda t: summary[t]["median_ratio_to_cublas"])
        print(f"{name} {M}x{N}x{Kd}: cuBLAS {summary['cublas_gemm']['median_ms']:.3f} ms "
              f"({summary['cublas_gemm']['tflops']:.0f} TFLOP/s); best {best} "
              f"{summary[best]['median_ratio_to_cublas']:.3f}x", flush=True)
        out[f"{M}x{N}x{Kd}"] = {"best": best, "variants": summary}
        sets = variants = None
        torch.cuda.empty_cache()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default="identity", help=f"comma-separated, from {list(CASES)}")
    p.add_argument("--shapes", nargs="+", default=["llama"], help="presets (llama, design) or M,N,K")
    p.add_argument("--swizzles", default="1,4,8")
    p.add_argument("--rasters", default="heuristic", help="comma-separated: heuristic, along_m, along_n")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--only", default=None, help="comma-separated parts of config tags to keep, e.g. sk_,coop_128x256")
    p.add_argument("--epilogues", default="auto", help="comma-separated epilogue subtiles / store stages to time each "
                   "config in: auto, 64x64, d3, 64x64/d3")
    p.add_argument("--out", default=None, help="results JSON (default: sweep_<gpu>.json in benchmarks/results/, "
                   "<gpu> the GPU it runs on: h100, h200, …)")
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args(argv)
    shapes = bench_graphs.parse_shapes(args.shapes)
    swizzles = [int(s) for s in args.swizzles.split(",")]
    names = [c for c in args.cases.split(",") if c]
    sweep = epilogue_variants(selected(args.only), args.epilogues)
    if args.dry_run:
        for cfg in sweep:
            print(names, ", ".join(dataclasses.replace(cfg, swizzle=s).tag for s in swizzles))
        print(f"shapes: {shapes}")
        return 0
    env = common.gpu_info()
    rasters = args.rasters.split(",")
    result = {name: sweep_case(name, shapes, swizzles, args.reps, sweep, rasters) for name in names}
    out = args.out or common.results_path("sweep", gpu=env["gpu"])
    out = common.write_json(out, {"env": env, "reps": args.reps, "results": result})
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
