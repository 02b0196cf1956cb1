"""Where the epilogue time goes: an epilogue graph taken apart, node kind by node kind.

    python -m benchmarks.ablate_epilogue [--family design] [--shape M N K] [--reps 30]
    python -m benchmarks.ablate_epilogue --family dswiglu       # the dSwiGLU epilogue, at the 8B and 1B shapes

Families: "design" (the design graph of docs/design.md, operands "kk", one shape) and the backward
epilogues of the training step, "dswiglu" (`graphs.swiglu_backward_linear`) and "rms_backward"
(`graphs.rms_norm_backward_linear(True)`), read N-major ("kn") as the step runs them, at the Llama
shapes of 16384 tokens. Each variant is a kernel timed alone (random inputs, tests.helpers.rand),
interleaved with the bare cuBLAS GEMM of the same shape (median of per-round ratios), for each
kernel configuration of the family. The variant "acc" is the plain GEMM in the same config (the
mainloop's share); the step between two variants is what one node kind costs. Prints a table and
writes JSON (--out; default: ablation_<gpu>.json, or ablation_<family>_<gpu>.json, in benchmarks/results/,
<gpu> the GPU it runs on: h100, h200, …).
"""
from __future__ import annotations

import argparse
import sys

import torch

import coda_ext as ce
from benchmarks.common import gpu_info, results_path, summarize, time_interleaved, write_json
from tests.helpers import rand

KK_CONFIGS = [
    ce.KernelConfig((128, 256, 64), (1, 2), "cooperative", swizzle=4),
    ce.KernelConfig((128, 128, 64), (1, 1), "pingpong", swizzle=4),
]
KN_CONFIGS = [
    ce.KernelConfig((128, 128, 64), (1, 1), "pingpong", swizzle=4, major="kn"),
    ce.KernelConfig((128, 256, 64), (2, 1), "cooperative", swizzle=4, major="kn"),
    # 2x1 clusters: each CTA pair shares its W tile through TMA multicast, and a swizzle of 8 clusters walks
    # strips of 16 M tiles (2048 rows), twice CUTLASS's 1x1 limit of 8 (docs/measured.md, "What the peer
    # does differently")
    ce.KernelConfig((128, 128, 64), (2, 1), "pingpong", swizzle=8, major="kn"),
]
#: (M, N, K) of the backward families: the 8B-like and 1B-like Llama layers at 16384 tokens.
DSWIGLU_SHAPES = {"8B": (16384, 14336, 4096), "1B": (16384, 8192, 2048)}
RMS_SHAPES = {"8B": (16384, 4096, 14336), "1B": (16384, 2048, 8192)}


def design_variants() -> dict:
    """The design graph (coda_ext.graphs), one epilogue feature at a time."""
    from coda_ext import graphs

    return {
        "acc": graphs.identity(),
        "acc+bias": graphs.acc_bias(),
        "acc*aux": graphs.acc_aux(),
        "silu(acc)": graphs.silu_acc(),
        "acc;rowsum": graphs.acc_rowsum(),
        "silu*aux+bias": graphs.silu_aux_bias(),
    }


def dswiglu_variants() -> dict:
    from coda_ext import graphs

    return {
        "acc": graphs.identity(),
        "z in; D=acc*u": graphs.pair_tile_read(),
        "z in; dz": graphs.swiglu_backward_linear(store_y=False, reduce=False),
        "z in; dz, y": graphs.swiglu_backward_linear(reduce=False),
        "z in; dz, zdz": graphs.swiglu_backward_linear(store_y=False),
        "full (dz, y, zdz)": graphs.swiglu_backward_linear(),
    }


def rms_variants() -> dict:
    from coda_ext import graphs

    return {
        "acc": graphs.identity(),
        "dx (x in)": graphs.rms_norm_backward_linear(False, store_n=False, dgamma=False),
        "dx (x, dx_in in)": graphs.rms_norm_backward_linear(True, store_n=False, dgamma=False),
        "dx, n": graphs.rms_norm_backward_linear(True, dgamma=False),
        "dx, dgamma": graphs.rms_norm_backward_linear(True, store_n=False),
        "full (dx, n, dgamma)": graphs.rms_norm_backward_linear(True),
    }


#: family -> (variants, configs, {label: (M, N, K)} or None for --shape)
FAMILIES = {
    "design": (design_variants, KK_CONFIGS, None),
    "dswiglu": (dswiglu_variants, KN_CONFIGS, DSWIGLU_SHAPES),
    "rms_backward": (rms_variants, KN_CONFIGS, RMS_SHAPES),
}


def variants(family: str = "design") -> dict:
    return FAMILIES[family][0]()


def build_items(families=tuple(FAMILIES)):
    return [(g, "bfloat16", c) for f in families for g in variants(f).values() for c in FAMILIES[f][1]]


def ablate(family: str, shape: tuple[int, int, int], reps: int) -> dict:
    M, N, K = shape
    make, cfgs, _ = FAMILIES[family]
    ops = {f"{name} [{cfg.tag}]": ce.compile(g, "bfloat16", cfg) for name, g in make().items() for cfg in cfgs}
    gen = rand.generator("ablate", family, device="cuda")
    sets = {name: [rand.op_inputs(op, M, N, K, gen) for _ in range(2)] for name, op in ops.items()}
    base = [rand.operands(gen, M, N, K, torch.bfloat16) for _ in range(2)]
    fns = {"cublas_gemm": lambda i: torch.nn.functional.linear(*base[i])}
    for name, op in ops.items():
        fns[name] = lambda i, op=op, s=sets[name]: op(s[i][0], s[i][1], **s[i][2])
    return summarize(time_interleaved(fns, reps), "cublas_gemm")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--family", default="design", choices=list(FAMILIES))
    p.add_argument("--shape", nargs=3, type=int, default=None, help="M N K (default: the family's shapes)")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--out", default=None, help="results JSON (default: ablation_<gpu>.json for design, "
                                               "ablation_, the family and _<gpu> otherwise: "
                                               "ablation_dswiglu_<gpu>.json; <gpu>: the GPU it runs on, h100, h200, …)")
    args = p.parse_args()
    if args.out is None:
        args.out = results_path("ablation" if args.family == "design" else f"ablation_{args.family}")
    shapes = FAMILIES[args.family][2] or {"": (8192, 8192, 4096)}
    if args.shape:
        shapes = {"": tuple(args.shape)}
    results = {}
    for label, shape in shapes.items():
        summary = ablate(args.family, shape, args.reps)
        M, N, K = shape
        results[label or "shape"] = {"shape": {"M": M, "N": N, "K": K}, "results": summary}
        print(f"{label} {M}x{N}x{K}")
        print(f"{'variant':52s} {'median ms':>10s} {'x cuBLAS':>9s}")
        for name, s in summary.items():
            print(f"{name:52s} {s['median_ms']:10.3f} {s['median_ratio_to_cublas']:9.3f}", flush=True)
    doc = {"family": args.family, "shapes": results, "env": gpu_info()}
    if args.family == "design" and len(results) == 1:   # the committed design file's shape
        doc = {"shape": next(iter(results.values()))["shape"], "results": next(iter(results.values()))["results"],
               "env": gpu_info()}
    write_json(args.out, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
