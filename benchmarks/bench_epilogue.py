"""Times a fused epilogue graph against the bare cuBLAS GEMM, eager PyTorch and torch.compile.

    python -m benchmarks.bench_epilogue [--shape M N K] [--reps 50] [--out results.json]

Method (docs/design.md, "How speed is judged"): every variant runs in one process, interleaved
(fused, cuBLAS, compile, eager, fused, ...), each call timed with CUDA events on inputs
rotated between two sets larger than L2; the figure quoted is the median of per-round
ratios to the bare cuBLAS GEMM of the same shape, with absolute medians for context.
Writes JSON (GPU, clocks, versions, commit; default: design_<gpu>.json in benchmarks/results/, <gpu> the
GPU it runs on: h100, h200, …) and a PNG plot next to it.
Kernels: `python -m coda_ext prebuild benchmarks/bench_epilogue.py` builds them ahead of time.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import coda_ext as ce
from benchmarks.common import gpu_info, results_path, summarize, time_interleaved, write_json
from tests.helpers import rand

#: Kernel configurations measured for the design graph (docs/design.md).
CONFIGS = [
    ce.DEFAULT_CONFIG,  # ping-pong 128x128x64, 1x1 cluster, swizzle 4
    ce.KernelConfig((128, 128, 64), (2, 1), "pingpong", swizzle=4),
    ce.KernelConfig((128, 256, 64), (2, 1), "cooperative", swizzle=4),
    ce.KernelConfig((128, 256, 64), (1, 2), "cooperative", swizzle=4),
]


def identity_configs():
    """The mainloop alone (a plain GEMM through coda_ext), for the configurations above."""
    return list(CONFIGS)


def design_graph():
    from coda_ext import graphs

    return graphs.design()


def identity_graph():
    from coda_ext import graphs

    return graphs.identity()


def build_items():
    items = [(design_graph(), "bfloat16", c) for c in CONFIGS]
    items += [(identity_graph(), "bfloat16", c) for c in identity_configs()]
    return items


def bench_design(M: int, N: int, K: int, reps: int) -> dict:
    import torch
    import torch.nn.functional as F

    dt = torch.bfloat16
    sets = []
    for s in range(2):
        g = rand.generator(s, device="cuda")
        A, W = rand.operands(g, M, N, K, dt)
        sets.append({"A": A, "W": W, "aux": rand.randn(g, M, N, dtype=dt), "bias": rand.randn(g, N, dtype=dt)})

    def eager(A, W, aux, bias):
        d = F.silu(F.linear(A, W)) * aux + bias
        return d, d.float().sum(dim=1)

    compiled = torch.compile(eager)
    variants = {"cublas_gemm": lambda i: F.linear(sets[i]["A"], sets[i]["W"])}
    compile_seconds = {}
    failed = {}
    for cfg in CONFIGS:
        t0 = time.monotonic()
        try:
            op = ce.compile(design_graph(), "bfloat16", cfg)
        except ce.CompileError as e:
            failed[cfg.tag] = str(e)[-2000:]
            continue
        compile_seconds[cfg.tag] = round(time.monotonic() - t0, 3)
        variants[f"coda_{cfg.tag}"] = lambda i, op=op: op(sets[i]["A"], sets[i]["W"], aux=sets[i]["aux"],
                                                          bias=sets[i]["bias"])
    for cfg in identity_configs():
        op = ce.compile(identity_graph(), "bfloat16", cfg)
        variants[f"coda_identity_{cfg.tag}"] = lambda i, op=op: op(sets[i]["A"], sets[i]["W"])
    variants["torch_compile"] = lambda i: compiled(**sets[i])
    variants["eager"] = lambda i: eager(**sets[i])
    for i in range(2):  # compile torch.compile's kernels before timing
        compiled(**sets[i])
    torch.cuda.synchronize()

    # Correctness of the timed fused ops on the timed shape (vs fp32 PyTorch).
    ref_d, ref_sum = eager(*(sets[0][k].float() for k in ("A", "W", "aux", "bias")))
    checks = {}
    for name, fn in variants.items():
        if name.startswith("coda_") and "identity" not in name:
            got = fn(0)
            rel_rowsum = (got.rowsum - ref_sum).abs() / ref_sum.abs().clamp_min(1)
            checks[name] = {"max_err_D": (got.out.float() - ref_d).abs().max().item(),
                            "max_rel_err_rowsum": rel_rowsum.max().item()}

    times = time_interleaved(variants, reps)
    flops = 2.0 * M * N * K
    summary = summarize(times, "cublas_gemm")
    for s in summary.values():
        s["tflops"] = flops / (s["median_ms"] * 1e-3) / 1e12
    return {"shape": {"M": M, "N": N, "K": K}, "graph": "D = silu(acc) * aux + bias[n]; rowsum[m] = sum_n D",
            "results": summary, "correctness": checks, "warm_load_seconds": compile_seconds, "reps": reps,
            "failed_configs": failed}


def plot(result: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["results"])
    ratios = [result["results"][n]["median_ratio_to_cublas"] for n in names]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(names) + 1.5))
    ax.barh(names, ratios, color=["tab:green" if n.startswith("coda") else "tab:gray" for n in names])
    ax.axvline(1.0, color="k", lw=0.8)
    ax.axvline(1.10, color="tab:red", lw=0.8, ls="--", label="1.10x cuBLAS")
    s = result["shape"]
    ax.set_xlabel("time / bare cuBLAS GEMM time (median of interleaved pairs; lower is better)")
    ax.set_title(f"{result['graph']}\n{s['M']}x{s['N']}x{s['K']} bf16 on {result['env']['gpu']}", fontsize=9)
    for y, r in enumerate(ratios):
        ax.text(r, y, f" {r:.3f}", va="center", fontsize=8)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", nargs=3, type=int, default=[8192, 8192, 4096], metavar=("M", "N", "K"))
    p.add_argument("--reps", type=int, default=60)
    p.add_argument("--out", default=None, help="results JSON (default: design_<gpu>.json in benchmarks/results/, "
                                               "<gpu> the GPU it runs on: h100, h200, …); the PNG goes beside it")
    args = p.parse_args()
    if args.out is None:
        args.out = results_path("design")
    result = bench_design(*args.shape, reps=args.reps)
    result["env"] = gpu_info()
    out = write_json(args.out, result)
    plot(result, out.with_suffix(".png"))
    print(f"{'variant':36s} {'median ms':>10s} {'x cuBLAS':>9s} {'TFLOP/s':>8s}")
    for name, s in result["results"].items():
        print(f"{name:36s} {s['median_ms']:10.3f} {s['median_ratio_to_cublas']:9.3f} {s['tflops']:8.0f}")
    print(json.dumps(result["correctness"], indent=1))
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
