"""Where the epilogue time goes: the design graph (docs/design.md) taken apart, node kind by node kind.

    python -m benchmarks.ablate_epilogue [--shape M N K] [--reps 30]

Each variant is timed interleaved with the bare cuBLAS GEMM of the same shape (median of
per-round ratios), for each kernel configuration in CONFIGS. Prints a table and writes JSON.
"""
from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

import coda_ext as ce
from benchmarks.common import RESULTS, gpu_info, summarize, time_interleaved, write_json
from tests.helpers import rand

CONFIGS = [
    ce.KernelConfig((128, 256, 64), (1, 2), "cooperative", swizzle=4),
    ce.KernelConfig((128, 128, 64), (1, 1), "pingpong", swizzle=4),
]


def variants():
    """The ablation's graphs (coda_ext.graphs), one epilogue feature at a time."""
    from coda_ext import graphs

    return {
        "acc": graphs.identity(),
        "acc+bias": graphs.acc_bias(),
        "acc*aux": graphs.acc_aux(),
        "silu(acc)": graphs.silu_acc(),
        "acc;rowsum": graphs.acc_rowsum(),
        "silu*aux+bias": graphs.silu_aux_bias(),
    }


def build_items():
    return [(g, "bfloat16", c) for g in variants().values() for c in CONFIGS]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", nargs=3, type=int, default=[8192, 8192, 4096])
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--out", default=str(RESULTS / "ablation_h100.json"))
    args = p.parse_args()
    M, N, K = args.shape
    dt = torch.bfloat16
    sets = []
    for s in range(2):
        gen = rand.generator(s, device="cuda")
        A, W = rand.operands(gen, M, N, K, dt)
        sets.append({"A": A, "W": W, "aux": rand.randn(gen, M, N, dtype=dt), "bias": rand.randn(gen, N, dtype=dt)})
    fns = {"cublas_gemm": lambda i: F.linear(sets[i]["A"], sets[i]["W"])}
    for name, g in variants().items():
        for cfg in CONFIGS:
            op = ce.compile(g, dt, cfg)
            kw = {k: k for k in op.input_names}
            fns[f"{name} [{cfg.tag}]"] = lambda i, op=op, kw=kw: op(sets[i]["A"], sets[i]["W"],
                                                                   **{k: sets[i][v] for k, v in kw.items()})
    times = time_interleaved(fns, args.reps)
    summary = summarize(times, "cublas_gemm")
    result = {"shape": {"M": M, "N": N, "K": K}, "results": summary, "env": gpu_info()}
    write_json(args.out, result)
    print(f"{'variant':44s} {'median ms':>10s} {'x cuBLAS':>9s}")
    for name, s in summary.items():
        print(f"{name:44s} {s['median_ms']:10.3f} {s['median_ratio_to_cublas']:9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
