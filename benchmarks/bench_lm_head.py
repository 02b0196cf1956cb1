"""The LM head + cross-entropy of a training step, forward and backward, against the three bare GEMMs it needs.

    python -m benchmarks.bench_lm_head                   # Llama-3 1B and 8B heads at 16384 tokens (GPU)
    python -m benchmarks.bench_lm_head --tokens 8192 --reps 10
    python -m benchmarks.bench_lm_head --train-chunk-mb 1024 2048     # + coda with bigger exp(logits) chunks
    python -m benchmarks.bench_lm_head --dw coda_f32 cublas           # + coda with its weight gradient on each backend

Variants (the gradients of x and W of the 'mean' loss; one process, interleaved, L2 flushed, inputs rotated):
  cublas_3   the floor: logits = x @ Wᵀ, dx = logits @ W, dW = logitsᵀ @ x, bare cuBLAS GEMMs (bf16)
  coda       ops.lm_head_cross_entropy_loss: the gradients with the loss, rows in chunks, three GEMMs
  coda_dw_<backend>  the same with the weight gradient's GEMMs on another lm_head_ce.dw_backend (--dw): coda_f32
             (coda_ext's kernel with an fp32 accumulator), cublas
  coda_recompute  ops.lm_head_cross_entropy: statistics forward, logits recomputed in the backward (four GEMMs)
  liger      liger_kernel's fused linear cross-entropy (skipped, with the reason, when it does not import)
  torch      logits in bf16, F.cross_entropy (eager)
  compile    the same math under torch.compile (one shape, static)
Per variant: median ms, the median of per-round ratios to cublas_3, peak memory beyond the inputs.
Results: lm_head_<gpu>.json in the results folder (--out; <gpu> the GPU it runs on: lm_head_h100.json on an
H100, lm_head_h200.json on an H200), and a PNG beside it.
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import time

from benchmarks import common

SHAPES = {"llama-1b": (128256, 2048), "llama-8b": (128256, 4096)}    # (V, d)
VARIANTS = ("cublas_3", "coda", "coda_recompute", "liger", "torch", "compile")
GOAL = 1.05


def build_items(tokens: int = 16384, train_chunk_mb: tuple[int, ...] = (), dw: tuple[str, ...] = ()) -> list:
    """(graph, dtype, config) of coda's kernels for every shape (for prebuild, on any machine with nvcc), with
    the training path's kernels at each extra chunk budget too (--train-chunk-mb), and the weight-gradient
    kernels of each backend in `dw` at every budget (--dw)."""
    from coda_ext.ops import lm_head_ce
    from coda_ext.runtime import auto_items

    gemms = []
    for V, d in SHAPES.values():
        gemms += lm_head_ce.gemms(tokens, V, d, False, train=True) + lm_head_ce.gemms(tokens, V, d, False)
        for mb in train_chunk_mb:
            gemms += lm_head_ce.gemms(tokens, V, d, False, train=True, train_chunk_bytes=mb << 20)
        for backend in dw:
            with lm_head_ce.dw_backend(backend):
                gemms += [g for mb in (None, *train_chunk_mb)
                          for g in lm_head_ce.dw_gemms(tokens, V, d, None if mb is None else mb << 20)]
    return auto_items(gemms, "bfloat16")


def _with_chunk_budget(mb: int | None, dw: str | None = None):
    """ops.lm_head_cross_entropy_loss with the training path's exp(logits) chunk budget at mb MiB (None: the
    default) and its weight-gradient GEMMs on `dw` (lm_head_ce.DW_BACKENDS; None: the default)."""
    import contextlib

    from coda_ext import ops
    from coda_ext.ops import lm_head_ce

    def loss(x, w, t):
        with lm_head_ce.dw_backend(dw) if dw else contextlib.nullcontext():
            return ops.lm_head_cross_entropy_loss(x, w, t, chunk_bytes=None if mb is None else mb << 20)
    return loss


def _liger():
    """Liger's fused linear cross-entropy as fn(x, W, target) -> loss, or the reason it is unavailable."""
    try:
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy
    except Exception as e:  # noqa: BLE001  (any import failure: the variant is skipped with its reason)
        return f"liger_kernel does not import: {type(e).__name__}: {e}"
    return lambda x, w, t: liger_fused_linear_cross_entropy(x, w, t)


def variants(M: int, V: int, d: int, train_chunk_mb: tuple[int, ...] = (),
             dw: tuple[str, ...] = ()) -> tuple[dict, dict]:
    """({name: fn(i)}, {name: reason skipped}) on two input sets (i = 0, 1); train_chunk_mb: also coda's training
    path at these exp(logits) chunk budgets ("coda_chunk<MB>": fewer chunks, fewer passes over the weight
    gradient's accumulator, more memory); dw: also each coda training variant with its weight-gradient GEMMs on
    these backends ("coda_dw_<backend>", "coda_dw_<backend>_chunk<MB>")."""
    import torch
    import torch.nn.functional as F

    from coda_ext import ops
    from tests.helpers import rand

    sets = []
    for i in range(2):
        gen = rand.generator("bench_lm_head", M, V, d, i, device="cuda")
        x = rand.randn(gen, M, d, dtype=torch.bfloat16)
        w = rand.randn(gen, V, d, dtype=torch.bfloat16, scale=d ** -0.5)
        sets.append((x, w, rand.targets(gen, M, vocab=V)))

    def grads(loss_fn):
        def run(i):
            x, w, t = sets[i]
            xx, ww = x.detach().requires_grad_(), w.detach().requires_grad_()
            return torch.autograd.grad(loss_fn(xx, ww, t), (xx, ww))
        return run

    def cublas_3(i):
        x, w, _ = sets[i]
        logits = x @ w.t()
        return logits @ w, logits.t() @ x

    def torch_loss(x, w, t):
        return F.cross_entropy(x @ w.t(), t)

    out = {
        "cublas_3": cublas_3,
        "coda": grads(lambda x, w, t: ops.lm_head_cross_entropy_loss(x, w, t)),
        "coda_recompute": grads(lambda x, w, t: ops.lm_head_cross_entropy(x, w, t)[0]),
        "torch": grads(torch_loss),
        "compile": grads(common.compile_for_one_shape(torch_loss)),
    }
    for mb in train_chunk_mb:
        out[f"coda_chunk{mb}"] = grads(_with_chunk_budget(mb))
    for backend in dw:
        out[f"coda_dw_{backend}"] = grads(_with_chunk_budget(None, backend))
        for mb in train_chunk_mb:
            out[f"coda_dw_{backend}_chunk{mb}"] = grads(_with_chunk_budget(mb, backend))
    skipped = {}
    liger = _liger()
    if isinstance(liger, str):
        skipped["liger"] = liger
    else:
        out["liger"] = grads(liger)
    return out, skipped


def check(M: int, V: int, d: int) -> dict:
    """Max |error| of coda's gradients against fp32 autograd, beside bf16 torch's (a sanity check, not the rule)."""
    import torch
    import torch.nn.functional as F

    from coda_ext import ops
    from tests.helpers import rand

    gen = rand.generator("bench_lm_head_check", M, V, d, device="cuda")
    x = rand.randn(gen, M, d, dtype=torch.bfloat16)
    w = rand.randn(gen, V, d, dtype=torch.bfloat16, scale=d ** -0.5)
    t = rand.targets(gen, M, vocab=V)

    def g(fn, a, b):
        a, b = a.detach().requires_grad_(), b.detach().requires_grad_()
        return torch.autograd.grad(fn(a, b), (a, b))

    ref = g(lambda a, b: F.cross_entropy(a @ b.t(), t), x.float(), w.float())
    got = g(lambda a, b: ops.lm_head_cross_entropy_loss(a, b, t), x, w)
    base = g(lambda a, b: F.cross_entropy(a @ b.t(), t), x, w)
    err = {f"{n}_coda": (c.double() - r.double()).abs().max().item() for n, c, r in zip(("dx", "dW"), got, ref)}
    err.update({f"{n}_torch_bf16": (c.double() - r.double()).abs().max().item() for n, c, r in zip(("dx", "dW"), base,
                                                                                                ref)})
    return err


def profile(M: int, V: int, d: int, rows: int = 12, trace=None) -> str:
    """torch.profiler's CUDA-time table of one forward + backward of coda's training path (after warm-up);
    trace: a path where its Chrome trace (CPU and GPU, gzipped) goes."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    fns, _ = variants(M, V, d)
    for _ in range(3):
        fns["coda"](0)
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        fns["coda"](0)
        torch.cuda.synchronize()
        wall = (time.perf_counter() - start) * 1e3
    busy, idle = common.busy_and_idle([e for e in prof.events() if common.is_kernel(e)])
    if trace is not None:
        common.write_trace(prof, pathlib.Path(trace))
    return (prof.key_averages().table(sort_by="cuda_time_total", row_limit=rows, max_name_column_width=60)
            + f"\nwall {wall:.2f} ms; GPU busy {busy:.2f} ms, idle {idle:.2f} ms between the first kernel and the last")


def plot(doc: dict, path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(doc["shapes"])
    fig, ax = plt.subplots(figsize=(8, 4))
    extra = sorted({v for n in names for v in doc["shapes"][n]["variants"] if v not in VARIANTS})   # coda_chunk<MB>
    present = [v for v in (*VARIANTS, *extra) if any(v in doc["shapes"][n]["variants"] for n in names)]
    width = 0.8 / len(present)
    for k, v in enumerate(present):
        vals = [doc["shapes"][n]["variants"].get(v, {}).get("median_ratio_to_cublas_3", 0) for n in names]
        bars = ax.bar([i + k * width for i in range(len(names))], vals, width, label=v)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.axhline(GOAL, color="k", ls="--", lw=0.8, label=f"goal {GOAL}x")
    top = max((v.get("median_ratio_to_cublas_3", 0) for n in names for v in doc["shapes"][n]["variants"].values()),
              default=1.0)
    ax.set_ylim(0, 1.3 * top)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(names))],
                  [f"{n}\n{doc['shapes'][n]['M']}x{doc['shapes'][n]['V']}x{doc['shapes'][n]['d']}" for n in names])
    ax.set_ylabel("time / three bare cuBLAS GEMMs (median ratio)")
    ax.set_title(f"LM head + cross-entropy, forward + backward ({doc['env']['gpu']})", fontsize=9)
    ax.legend(fontsize=7, ncol=6, loc="upper center")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--out", default=None, help="results JSON (default: lm_head_<gpu>.json in benchmarks/results/, "
                   "<gpu> the GPU it runs on: h100, h200, …); the PNG goes beside it")
    p.add_argument("--train-chunk-mb", nargs="*", type=int, default=[], metavar="MB",
                   help="also time coda's training path at these exp(logits) chunk budgets (default budget: "
                        "lm_head_ce.TRAIN_CHUNK_BYTES, 1 GiB)")
    p.add_argument("--dw", nargs="*", default=[], metavar="BACKEND", choices=["coda_f32", "cublas", "coda"],
                   help="also time coda's training path with its weight gradients on these lm_head_ce.dw_backend "
                        "backends (default: coda, the 24-bit split accumulator)")
    p.add_argument("--profile", action="store_true", help="also print the per-kernel time of coda's path per shape")
    p.add_argument("--trace", default=None, metavar="DIR", help="with --profile: a gzipped Chrome trace of coda's "
                   "path per shape in DIR (lm_head_<shape>.json.gz)")
    args = p.parse_args(argv)

    import torch

    env = common.gpu_info()
    doc = {"env": env, "goal_ratio_to_cublas_3": GOAL, "shapes": {}}
    for name in args.shapes:
        V, d = SHAPES[name]
        M = args.tokens
        fns, skipped = variants(M, V, d, tuple(args.train_chunk_mb), tuple(args.dw))
        times = common.time_interleaved(fns, args.reps)
        row = {"M": M, "V": V, "d": d, "skipped": skipped, "errors": check(min(M, 4096), V, d), "variants": {}}
        for v, ts in times.items():
            ratios = [t / b for t, b in zip(ts, times["cublas_3"])]
            peak, _ = common.peak_memory_gb(fns[v])
            row["variants"][v] = {"median_ms": statistics.median(ts),
                                  "median_ratio_to_cublas_3": statistics.median(ratios), "peak_gb": peak}
            print(f"{name} {v:15s} {statistics.median(ts):8.3f} ms  x{statistics.median(ratios):.3f} of 3 GEMMs  "
                  f"peak {peak:.2f} GB", flush=True)
        doc["shapes"][name] = row
        if args.profile:
            trace = pathlib.Path(args.trace) / f"lm_head_{name}.json.gz" if args.trace else None
            print(profile(M, V, d, trace=trace), flush=True)
        del fns
        torch.cuda.empty_cache()
    out = args.out or common.results_path("lm_head", gpu=env["gpu"])
    path = common.write_json(out, doc)
    plot(doc, path.with_suffix(".png"))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
