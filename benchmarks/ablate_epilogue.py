"""Where the epilogue time goes: the DESIGN.md graph taken apart, node kind by node kind.

    python benchmarks/ablate_epilogue.py [--shape M N K] [--reps 30]

Each variant is timed interleaved with the bare cuBLAS GEMM of the same shape (median of
per-round ratios), for each kernel configuration in CONFIGS. Prints a table and writes JSON.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

import torch
import torch.nn.functional as F

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import coda_ext as ce  # noqa: E402
from harness import gpu_info, summarize, time_interleaved  # noqa: E402

CONFIGS = [
    ce.KernelConfig((128, 256, 64), (1, 2), "cooperative", swizzle=4),
    ce.KernelConfig((128, 128, 64), (1, 1), "pingpong", swizzle=4),
]


def variants():
    def v(build):
        g = ce.Graph()
        build(g, g.accumulator())
        return g

    return {
        "acc": v(lambda g, a: g.output(a)),
        "acc+bias": v(lambda g, a: g.output(a + g.row_vector("bias"))),
        "acc*aux": v(lambda g, a: g.output(a * g.tile("aux"))),
        "silu(acc)": v(lambda g, a: g.output(ce.silu(a))),
        "acc;rowsum": v(lambda g, a: (g.output(a), g.row_reduce("rowsum", a, "sum"))),
        "silu*aux+bias": v(lambda g, a: g.output(ce.silu(a) * g.tile("aux") + g.row_vector("bias"))),
    }


def build_items():
    return [(g, "bfloat16", c) for g in variants().values() for c in CONFIGS]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", nargs=3, type=int, default=[8192, 8192, 4096])
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--out", default=str(HERE / "results" / "ablation_h100.json"))
    args = p.parse_args()
    M, N, K = args.shape
    dt = torch.bfloat16
    sets = []
    for s in range(2):
        gen = torch.Generator(device="cuda").manual_seed(s)
        sets.append({"A": (torch.randn(M, K, generator=gen, device="cuda") * K ** -0.25).to(dt),
                     "W": (torch.randn(N, K, generator=gen, device="cuda") * K ** -0.25).to(dt),
                     "aux": torch.randn(M, N, generator=gen, device="cuda").to(dt),
                     "bias": torch.randn(N, generator=gen, device="cuda").to(dt)})
    fns = {"cublas_gemm": lambda i: F.linear(sets[i]["A"], sets[i]["W"])}
    for name, g in variants().items():
        for cfg in CONFIGS:
            op = ce.compile(g, dt, cfg)
            kw = {k: k for k in op.input_names}
            fns[f"{name} [{cfg.tag}]"] = (lambda op, kw: lambda i: op(sets[i]["A"], sets[i]["W"],
                                                                     **{k: sets[i][v] for k, v in kw.items()}))(op, kw)
    times = time_interleaved(fns, args.reps)
    summary = summarize(times, "cublas_gemm")
    result = {"shape": {"M": M, "N": N, "K": K}, "results": summary, "env": gpu_info()}
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"{'variant':44s} {'median ms':>10s} {'x cuBLAS':>9s}")
    for name, s in summary.items():
        print(f"{name:44s} {s['median_ms']:10.3f} {s['median_ratio_to_cublas']:9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
