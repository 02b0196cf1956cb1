"""Where a graph's reductions are finished: inside the GEMM by the last tile of each row (column) of tiles
(KernelConfig(finalize="kernel"), csrc/epilogues/last_tile.hpp) or by a finalize launch after it ("launch", the
default: csrc/kernels/finalize.cuh).

The ready ops' GEMMs with reductions at the Llama shapes (the RMSNorm statistic of linear + residual + norm, the
dSwiGLU's row sum, the RMSNorm backward's column sums, the LM head's log-sum-exp) at inference and training row counts,
each in the heuristic's config ("auto"), built both ways, interleaved with the bare cuBLAS GEMM of its shape
(median of per-round ratios; L2 flushed before every call, as bench_fused_ops times).

    python -m coda_ext prebuild benchmarks/bench_finish.py -j 16
    python -m benchmarks.bench_finish [--ms 128 1024 4096 16384] [--reps 30] [--out NAME] [--dry-run]

Results (--out): finish_<gpu>.json in benchmarks/results/, and a plot beside it (each row both ways over cuBLAS).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys

from benchmarks.common import gpu_info, results_path, summarize, time_interleaved, write_json

MS = (128, 1024, 4096, 16384)
#: (name, graph builder and its arguments, N, K) at the Llama-3.2-1B and 3.1-8B shapes (d, FFN, vocabulary chunk)
ROWS = (("residual_norm_o 1B", "linear_residual_norm", (), 2048, 2048),
        ("residual_norm_down 8B", "linear_residual_norm", (), 4096, 14336),
        ("dswiglu 1B", "swiglu_backward_linear", (), 8192, 2048),
        ("rms_norm_backward 1B", "rms_norm_backward_linear", (False,), 2048, 2048),
        ("lm_head_ce 1B (8192-column chunk)", "lm_head_cross_entropy", (False,), 8192, 2048))


def graph(name: str, args: tuple):
    from coda_ext import graphs

    return getattr(graphs, name)(*args)


def row_config(name: str, args: tuple, M: int, N: int, K: int):
    """The heuristic's config for the row ("auto"'s first choice)."""
    import coda_ext as ce

    return ce.compile(graph(name, args), "bfloat16", "auto").config_for(M, N, K)


def build_items(ms=MS) -> list:
    """Every kernel the benchmark launches: each row's config, finished both ways."""
    return [(graph(g, a), "bfloat16", dataclasses.replace(row_config(g, a, M, N, K), finalize=w))
            for _, g, a, N, K in ROWS for M in ms for w in ("launch", "kernel")]


def measure(label: str, g: str, args: tuple, M: int, N: int, K: int, reps: int) -> dict:
    import torch

    import coda_ext as ce
    from tests.helpers import rand

    cfg = row_config(g, args, M, N, K)
    ops = {w: ce.compile(graph(g, args), "bfloat16", dataclasses.replace(cfg, finalize=w))
           for w in ("launch", "kernel")}
    sets = [rand.op_inputs(ops["launch"], M, N, K, rand.generator("finish", g, M, N, K, i, device="cuda"))
            for i in range(2)]
    dense = [(A, W.t() if W.shape == (N, K) else W) for A, W, _ in sets]   # cuBLAS's A @ Wᵀ of the same shape
    fns = {"cublas": lambda i: dense[i][0] @ dense[i][1]}
    for w, op in ops.items():
        fns[w] = lambda i, op=op: op(sets[i][0], sets[i][1], **sets[i][2])
    a, b = fns["launch"](0), fns["kernel"](0)   # the reduced vectors of both, as tests/gpu/test_finish_in_kernel_gpu.py
    torch.cuda.synchronize()
    diff = max(((a[k].float() - b[k].float()).abs().max() / b[k].float().abs().max().clamp_min(1e-30)).item()
               for k in a if a[k].dim() == 1)
    s = summarize(time_interleaved(fns, reps), "cublas")
    ratio = s["kernel"]["median_ms"] / s["launch"]["median_ms"]
    print(f"{label:36s} M={M:6d} N={N:6d} K={K:6d} {cfg.tag:36s} cublas {s['cublas']['median_ms'] * 1e3:8.1f} us  "
          f"launch {s['launch']['median_ratio_to_cublas']:.3f}  kernel {s['kernel']['median_ratio_to_cublas']:.3f}  "
          f"kernel/launch {ratio:.3f}  vector diff {diff:.1e}", flush=True)
    return {"row": label, "graph": g, "M": M, "N": N, "K": K, "config": cfg.tag, "max_vector_diff": diff,
            "kernel_over_launch": ratio, "variants": s}


def plot(doc: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = doc["rows"]
    labels = [f"{r['row']}\nM={r['M']}" for r in rows]
    launch = [r["variants"]["launch"]["median_ratio_to_cublas"] for r in rows]
    kernel = [r["variants"]["kernel"]["median_ratio_to_cublas"] for r in rows]
    fig, ax = plt.subplots(figsize=(max(8, 0.55 * len(rows)), 5))
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], launch, 0.4, label="finalize launch after the GEMM")
    ax.bar([i + 0.2 for i in x], kernel, 0.4, label="finished in the GEMM (last tile)")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, rotation=70, fontsize=7)
    ax.set_ylabel("time / bare cuBLAS GEMM (median of ratios)")
    ax.set_title(f"Reductions finished in the GEMM or by a launch ({doc['gpu']['gpu']}, {doc['commit']})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ms", type=int, nargs="+", default=list(MS))
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--out", default=None, help="a name under benchmarks/results/ or a path ending in .json")
    p.add_argument("--dry-run", action="store_true", help="list the rows and their kernels; no GPU")
    a = p.parse_args(argv)
    if a.dry_run:
        for label, g, args, N, K in ROWS:
            for M in a.ms:
                print(f"{label} {M}x{N}x{K}: {row_config(g, args, M, N, K).tag}")
        return 0
    from benchmarks.common import commit

    doc = {"gpu": gpu_info(), "commit": commit(), "reps": a.reps,
           "rows": [measure(label, g, args, M, N, K, a.reps) for label, g, args, N, K in ROWS for M in a.ms]}
    path = results_path(a.out or "finish") if not (a.out or "").endswith(".json") else a.out
    write_json(path, doc)
    plot(doc, str(path).replace(".json", ".png"))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
