"""Times any epilogue graph, at many shapes, against the bare cuBLAS GEMM, eager PyTorch and
torch.compile of the same math.

    python benchmarks/bench_graphs.py [--cases design,example,swiglu] [--shapes llama | M,N,K ...]
        [--configs default|candidates] [--max-autotune] [--reps 30] [--out FILE.json] [--dry-run]

Eager and torch.compile run the graph's own PyTorch reference (coda_ext.interpret in the op's
dtype): the same unfused math for every graph, with no hand-written baseline to drift. Timing is
interleaved with L2 flushes (harness.py); figures are medians of per-round ratios to cuBLAS.
Writes JSON (GPU, clocks, versions, commit, cold compile and warm load seconds per config) and a
PNG with one panel per case. `--dry-run` lists what would run without a GPU.
Kernels: `python -m coda_ext.prebuild benchmarks/bench_graphs.py` builds the default set ahead.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "gpu"))
sys.path.insert(0, str(HERE))

import cases  # noqa: E402

import coda_ext as ce  # noqa: E402
from coda_ext import tuning  # noqa: E402

#: Llama-3-8B-like training and inference shapes (M, N, K) (the list of issue 3).
SHAPES = {
    "llama": [(16384, 28672, 4096), (16384, 4096, 14336), (16384, 6144, 4096), (16384, 16384, 2048),
              (16384, 2048, 8192), (8192, 128256, 4096),
              (128, 28672, 4096), (128, 4096, 14336), (128, 6144, 4096),
              (1024, 28672, 4096), (1024, 4096, 14336), (1024, 6144, 4096)],
    "design": [(8192, 8192, 4096)],
}
DEFAULT_CASES = ("design", "example", "swiglu")


def configs(which: str) -> list[ce.KernelConfig]:
    return [ce.DEFAULT_CONFIG] if which == "default" else list(tuning.CANDIDATES)


def build_items(case_names=DEFAULT_CASES, which="default"):
    return [(cases.CASES[c][0](), "bfloat16", cfg) for c in case_names for cfg in configs(which)]


def make_inputs(op, M: int, N: int, K: int, seed: int):
    """Fresh random A, W and graph inputs (two sets are rotated, each larger than L2 at real shapes)."""
    import torch

    from coda_ext.graph.interpret import torch_dtype

    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = op.dtype
    A = (torch.randn(M, K, generator=g, device="cuda") * K ** -0.25).to(dt)
    W = (torch.randn(N, K, generator=g, device="cuda") * K ** -0.25).to(dt)
    inputs = {}
    for s in op.slots:
        if s.kind == "tile":
            inputs[s.name] = torch.randn(M, N, generator=g, device="cuda").to(torch_dtype(s.dtype))
        elif s.kind == "row_vector":
            inputs[s.name] = torch.randn(N, generator=g, device="cuda").to(torch_dtype(s.dtype))
        elif s.kind == "col_vector":
            inputs[s.name] = (torch.rand(M, generator=g, device="cuda") + 0.5).to(torch_dtype(s.dtype))
        elif s.kind == "scalar":
            inputs[s.name] = 1.5 if s.mode == "value" else torch.full((1,), 1.5, device="cuda")
    return A, W, inputs


def compile_costs(graph, dtype: str, cfgs) -> dict:
    """Cold nvcc seconds (recorded in the cache entry when it was built) and warm load seconds."""
    from coda_ext.compile.cache import cache_key, entry_dir

    out = {}
    for cfg in cfgs:
        start = time.perf_counter()
        op = ce.compile(graph, dtype, cfg)
        warm = time.perf_counter() - start
        meta = entry_dir(cache_key(op.source)) / "meta.json"
        cold = json.loads(meta.read_text()).get("compile_seconds") if meta.is_file() else None
        out[cfg.tag] = {"cold_compile_s": cold, "warm_load_s": round(warm, 4)}
    return out


def bench_case(name: str, shapes, cfgs, reps: int, max_autotune: bool) -> dict:
    import functools

    import torch
    import torch.nn.functional as F

    from harness import summarize, time_interleaved

    graph = cases.CASES[name][0]().build()
    ops = {cfg.tag: ce.compile(graph, "bfloat16", cfg) for cfg in cfgs}
    first = next(iter(ops.values()))
    reference = functools.partial(ce.interpret, graph, compute_dtype=first.dtype)
    compiled = torch.compile(reference, mode="max-autotune" if max_autotune else None)
    result = {"graph": graph.text(), "compile": compile_costs(graph, "bfloat16", cfgs), "shapes": {}}
    for M, N, K in shapes:
        sets = [make_inputs(first, M, N, K, seed) for seed in (0, 1)]
        variants = {"cublas_gemm": lambda i: F.linear(sets[i][0], sets[i][1])}
        for tag, op in ops.items():
            variants[f"coda_{tag}"] = (lambda op: lambda i: op(sets[i][0], sets[i][1], **sets[i][2]))(op)
        variants["torch_compile"] = lambda i: compiled(sets[i][0], sets[i][1], **sets[i][2])
        variants["eager"] = lambda i: reference(sets[i][0], sets[i][1], **sets[i][2])
        for i in (0, 1):
            compiled(sets[i][0], sets[i][1], **sets[i][2])
        torch.cuda.synchronize()
        summary = summarize(time_interleaved(variants, reps), "cublas_gemm")
        for s in summary.values():
            s["tflops"] = 2.0 * M * N * K / (s["median_ms"] * 1e-3) / 1e12
        result["shapes"][f"{M}x{N}x{K}"] = summary
        sets = variants = None  # free this shape's tensors before the next one
        torch.cuda.empty_cache()
    return result


def plot(results: dict, path: pathlib.Path, gpu: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, axes = plt.subplots(len(names), 1, figsize=(11, 3.2 * len(names)), squeeze=False)
    for ax, name in zip(axes[:, 0], names):
        shapes = list(results[name]["shapes"])
        variants = [v for v in results[name]["shapes"][shapes[0]] if v != "cublas_gemm"]
        width = 0.8 / len(variants)
        for j, v in enumerate(variants):
            ratios = [results[name]["shapes"][s][v]["median_ratio_to_cublas"] for s in shapes]
            ax.bar([i + j * width for i in range(len(shapes))], ratios, width, label=v)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(shapes))], shapes, fontsize=7, rotation=20)
        ax.set_ylabel("time / cuBLAS GEMM")
        ax.set_title(f"{name} (bf16, {gpu})", fontsize=9)
        ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def parse_shapes(values: list[str]) -> list[tuple[int, int, int]]:
    out = []
    for v in values:
        if v in SHAPES:
            out += SHAPES[v]
        else:
            M, N, K = (int(x) for x in v.split(","))
            out.append((M, N, K))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default=",".join(DEFAULT_CASES), help=f"from tests/gpu/cases.py: {list(cases.CASES)}")
    p.add_argument("--shapes", nargs="+", default=["llama"], help="presets (llama, design) or M,N,K")
    p.add_argument("--configs", choices=("default", "candidates"), default="default")
    p.add_argument("--max-autotune", action="store_true", help="torch.compile(mode='max-autotune')")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--out", default=str(HERE / "results" / "graphs_h100.json"))
    p.add_argument("--dry-run", action="store_true", help="list what would run; needs no GPU")
    args = p.parse_args(argv)
    names = [c for c in args.cases.split(",") if c]
    unknown = [c for c in names if c not in cases.CASES]
    if unknown:
        p.error(f"unknown case(s) {unknown}; choose from {list(cases.CASES)}")
    shapes = parse_shapes(args.shapes)
    cfgs = configs(args.configs)
    if args.dry_run:
        for name in names:
            digest = cases.CASES[name][0]().build().digest()
            for M, N, K in shapes:
                print(f"{name} [{digest}] {M}x{N}x{K}: cublas_gemm, "
                      + ", ".join(f"coda_{c.tag}" for c in cfgs) + ", torch_compile, eager")
        return 0

    from harness import gpu_info

    env = gpu_info()
    results = {name: bench_case(name, shapes, cfgs, args.reps, args.max_autotune) for name in names}
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"env": env, "reps": args.reps, "max_autotune": args.max_autotune,
                               "results": results}, indent=1))
    plot(results, out.with_suffix(".png"), env["gpu"])
    print(f"{'case':10s} {'shape':20s} {'variant':34s} {'ms':>8s} {'x cuBLAS':>9s}")
    for name, r in results.items():
        for shape, summary in r["shapes"].items():
            for v, s in summary.items():
                print(f"{name:10s} {shape:20s} {v:34s} {s['median_ms']:8.3f} {s['median_ratio_to_cublas']:9.3f}")
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
