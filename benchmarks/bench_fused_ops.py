"""The ready ops (coda_ext.ops) at the Llama shapes of docs/design.md against the
bare cuBLAS GEMM of the same shape, eager PyTorch and torch.compile of the unfused math (and
Liger-Kernel's fused linear cross-entropy for the LM head), timed interleaved in one process;
ratios are medians of per-round ratios to cuBLAS; peak memory above what was allocated before.

    python -m coda_ext prebuild benchmarks/bench_fused_ops.py -j 16   # the kernels the run needs
    python -m benchmarks.bench_fused_ops [--models 8B 1B] [--ms 16384 1024 128] [--ops ...] [--out NAME]
    python -m benchmarks.bench_fused_ops --merge results/a.json results/b.json --out ops_h100

torch.compile is timed at the training shapes (M = 16384) and for the LM head (compiling per
shape costs ~10-30 s each). Writes results/<out>.json and .png.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

from benchmarks import common
from tests.helpers import rand

MODELS = {"8B": dict(d=4096, F=14336, hq=32, hkv=8, hd=128), "1B": dict(d=2048, F=8192, hq=32, hkv=8, hd=64)}
MS = (16384, 1024, 128)
OPS = ("residual_norm_down", "residual_norm_o", "rms_linear_silu", "swiglu_y", "swiglu_train", "qkv_rope",
       "qkv_rope_qknorm")
LM_HEAD = dict(M=8192, K=4096, V=128256)
GOAL_RATIO = 1.03


def cases(models=tuple(MODELS), ms=MS, lm_head=True, ops=OPS):
    """(op, model, M, N, K) of every case."""
    out = []
    for m in models:
        c = MODELS[m]
        d, F = c["d"], c["F"]
        qn = (c["hq"] + 2 * c["hkv"]) * c["hd"]
        shapes = {"residual_norm_down": (d, F), "residual_norm_o": (d, d), "rms_linear_silu": (F, d),
                  "swiglu_y": (2 * F, d), "swiglu_train": (2 * F, d), "qkv_rope": (qn, d), "qkv_rope_qknorm": (qn, d)}
        for M in ms:
            out += [(op, m, M, *shapes[op]) for op in ops]
    if lm_head:
        out.append(("lm_head_ce", "8B", LM_HEAD["M"], LM_HEAD["V"], LM_HEAD["K"]))
    return out


def graph_of(op, model):
    from coda_ext import graphs

    hd = MODELS[model]["hd"]
    return {"residual_norm_down": lambda: graphs.linear_residual_norm(),
            "residual_norm_o": lambda: graphs.linear_residual_norm(),
            "rms_linear_silu": lambda: graphs.rms_linear("silu"),
            "swiglu_y": lambda: graphs.linear_swiglu(True, False),
            "swiglu_train": lambda: graphs.linear_swiglu(True, True),
            "qkv_rope": lambda: graphs.qkv_rope(True, False, hd),
            "qkv_rope_qknorm": lambda: graphs.qkv_rope(True, True, hd),
            "lm_head_ce": lambda: graphs.lm_head_cross_entropy(True)}[op]()


def build_items():
    from coda_ext.runtime import TunedOp

    items = []
    for op, model, M, N, K in cases():
        g = graph_of(op, model)
        items.append((g, "bfloat16", TunedOp(g, "bfloat16", tune=False).config_for(M, N, K)))
    return items


def _variants(op, model, M, N, K, with_compile, with_liger):
    """{name: fn(i)} on two rotated input sets; the first is the bare cuBLAS GEMM."""
    import torch
    import torch.nn.functional as F

    from coda_ext import ops

    dt, dev, eps = torch.bfloat16, "cuda", 1e-6
    c = MODELS[model]
    sets = []
    for i in range(2):
        gen = rand.generator(op, model, M, i, device=dev)
        s = dict(x=rand.randn(gen, M, K, dtype=dt), w=rand.randn(gen, N, K, dtype=dt, scale=K ** -0.5),
                 rstd=rand.positive(gen, M))
        if op.startswith("residual_norm"):
            s.update(res=rand.randn(gen, M, N, dtype=dt), g=rand.positive(gen, N, dtype=dt))
        if op.startswith("qkv"):
            s.update(pos=rand.indices(gen, M, high=8192), qw=rand.positive(gen, c["hd"]),
                     kw=rand.positive(gen, c["hd"]))
        if op == "lm_head_ce":
            s.update(t=rand.indices(gen, M, high=N))
        sets.append(s)
    hq, hkv, hd = c["hq"], c["hkv"], c["hd"]
    freqs = ops.rope_frequencies(hd, hq, hkv, device=dev)
    inv = ops.default_inv_freq(hd).float().to(dev)

    def rope_eager(z, pos, qw=None, kw=None):  # the unfused math in the op dtype, as a model would run it
        heads = z.view(M, hq + 2 * hkv, hd)
        q, k, v = heads.split([hq, hkv, hkv], dim=1)
        if qw is not None:
            q = (q.float() * torch.rsqrt(q.float().pow(2).mean(-1, keepdim=True) + eps) * qw).to(dt)
            k = (k.float() * torch.rsqrt(k.float().pow(2).mean(-1, keepdim=True) + eps) * kw).to(dt)
        ang = pos.float()[:, None] * inv[None]
        cos, sin = ang.cos().to(dt)[:, None], ang.sin().to(dt)[:, None]

        def rot(t):
            a, b = t[..., 0::2], t[..., 1::2]
            return torch.stack([a * cos - b * sin, b * cos + a * sin], -1).flatten(-2)
        return torch.cat([rot(q), rot(k), v], 1).view(M, N)

    def eager(s):
        z = F.linear(s["x"], s["w"])
        if op.startswith("residual_norm"):
            out = z + s["res"]
            return out, out * s["g"], torch.rsqrt(out.float().pow(2).mean(-1) + eps)
        if op == "lm_head_ce":
            return F.cross_entropy(z.float() * s["rstd"][:, None], s["t"])
        z = (z.float() * s["rstd"][:, None]).to(dt)
        if op == "rms_linear_silu":
            return F.silu(z)
        if op.startswith("swiglu"):
            y = F.silu(z[:, 0::2]) * z[:, 1::2]
            return (y, z) if op == "swiglu_train" else y
        return rope_eager(z, s["pos"], *((s["qw"], s["kw"]) if op == "qkv_rope_qknorm" else ()))

    def coda(s):
        if op.startswith("residual_norm"):
            return ops.linear_residual_norm(s["x"], s["w"], s["res"], s["g"])
        if op == "rms_linear_silu":
            return ops.rms_linear(s["x"], s["w"], s["rstd"], "silu")
        if op == "swiglu_y":
            return ops.linear_swiglu(s["x"], s["w"], s["rstd"])
        if op == "swiglu_train":
            return ops.linear_swiglu_train(s["x"], s["w"], s["rstd"])
        if op == "lm_head_ce":
            return ops.lm_head_cross_entropy(s["x"], s["w"], s["t"], s["rstd"])
        qk = dict(q_norm_weight=s["qw"], k_norm_weight=s["kw"]) if op == "qkv_rope_qknorm" else {}
        return ops.qkv_rope(s["x"], s["w"], s["pos"], freqs, hq, hkv, rstd=s["rstd"], **qk)

    v = {"cublas": lambda i: F.linear(sets[i]["x"], sets[i]["w"]), "coda": lambda i: coda(sets[i]),
         "eager": lambda i: eager(sets[i])}
    if with_compile:
        compiled = common.compile_for_one_shape(eager)
        v["torch.compile"] = lambda i: compiled(sets[i])
    if with_liger:
        try:
            from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction as Liger
            v["liger"] = lambda i: Liger.apply((sets[i]["x"].float() * sets[i]["rstd"][:, None]).to(dt),
                                               sets[i]["w"], sets[i]["t"])
        except ImportError as e:
            print(f"liger-kernel not available: {e}", file=sys.stderr)
    return v


def _peak_memory(fn) -> float:
    return common.peak_memory_gb(fn)[0]


def run(selected, reps):
    results = []
    for op, model, M, N, K in selected:
        train = M == 16384 or op == "lm_head_ce"
        variants = _variants(op, model, M, N, K, with_compile=train, with_liger=op == "lm_head_ce")
        for fn in variants.values():  # warm up: kernels, torch.compile, autotuning
            fn(0)
            fn(1)
        n = reps if op != "lm_head_ce" else max(5, reps // 3)
        summary = common.summarize(common.time_interleaved(variants, n), "cublas")
        row = {"op": op, "model": model, "M": M, "N": N, "K": K, "results": summary,
               "peak_gb": {k: _peak_memory(fn) for k, fn in variants.items()}}
        results.append(row)
        r = {k: v["median_ratio_to_cublas"] for k, v in summary.items()}
        print(f"{op:18s} {model} M={M:5d} N={N:6d} K={K:5d} " +
              " ".join(f"{k}={r[k]:.3f}" for k in r) + f"  cublas={summary['cublas']['median_ms']:.3f} ms", flush=True)
    return results


def goals(results) -> list[str]:
    lines = []
    by_op: dict[str, list[float]] = {}
    for row in results:
        if row["op"] != "lm_head_ce":
            by_op.setdefault(row["op"], []).append(row["results"]["coda"]["median_ratio_to_cublas"])
    for op, rs in by_op.items():
        med = statistics.median(rs)
        lines.append(f"{op}: median {med:.3f}x cuBLAS over {len(rs)} shapes (range {min(rs):.3f}-{max(rs):.3f}) "
                     f"goal <= {GOAL_RATIO}: {'met' if med <= GOAL_RATIO else 'missed'}")
    for row in results:
        res = row["results"]
        if "torch.compile" in res and row["op"] != "lm_head_ce":
            c, t = res["coda"]["median_ms"], res["torch.compile"]["median_ms"]
            lines.append(f"{row['op']} {row['model']} M={row['M']}: coda {c:.3f} ms vs torch.compile {t:.3f} ms: "
                         f"{'faster' if c < t else 'SLOWER'}")
        if row["op"] == "lm_head_ce":
            ratio = res["coda"]["median_ratio_to_cublas"]
            mem = row["peak_gb"]
            met = "met" if ratio <= 1.0 else "missed"
            lines.append(f"lm_head_ce: {ratio:.3f}x the logits GEMM (goal <= 1.0: {met}); "
                         "peak GB " + ", ".join(f"{k} {v:.2f}" for k, v in mem.items()))
    return lines


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in results if r["op"] != "lm_head_ce"]
    names = ["coda", "torch.compile", "eager"]
    fig, axes = plt.subplots(2, 1, figsize=(max(10, 0.45 * len(rows)), 9), gridspec_kw={"height_ratios": [3, 1.2]})
    ax = axes[0]
    width = 0.27
    for j, name in enumerate(names):
        xs = [i + (j - 1) * width for i, r in enumerate(rows) if name in r["results"]]
        ys = [min(r["results"][name]["median_ratio_to_cublas"], 2.5) for r in rows if name in r["results"]]
        ax.bar(xs, ys, width, label=name)
    ax.axhline(1.0, color="k", lw=1)
    ax.axhline(GOAL_RATIO, color="r", lw=0.8, ls="--", label=f"goal {GOAL_RATIO}")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([f"{r['op']} {r['model']} M={r['M']}" for r in rows], rotation=75, fontsize=7)
    ax.set_ylabel("time / bare cuBLAS GEMM (capped at 2.5)")
    ax.set_ylim(0.8, 2.6)
    ax.legend(fontsize=8)
    ax.set_title("coda_ext ready ops vs the bare GEMM of the same shape (H100, bf16; lower is better)")
    lm = [r for r in results if r["op"] == "lm_head_ce"]
    ax = axes[1]
    if lm:
        mem = lm[0]["peak_gb"]
        times = {k: v["median_ms"] for k, v in lm[0]["results"].items()}
        labels = list(mem)
        ax.barh(labels, [mem[k] for k in labels])
        for i, k in enumerate(labels):
            ax.text(mem[k], i, f" {mem[k]:.2f} GB, {times[k]:.1f} ms", va="center", fontsize=8)
        ax.set_xlabel("LM head + CE (8192 x 4096 x 128256): peak extra memory, GB (time in ms)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--ms", nargs="+", type=int, default=list(MS))
    p.add_argument("--no-lm-head", action="store_true")
    p.add_argument("--only-lm-head", action="store_true")
    p.add_argument("--ops", nargs="+", default=list(OPS), choices=list(OPS))
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--out", default="ops_h100")
    p.add_argument("--merge", nargs="+", default=None, help="combine earlier result files instead of running")
    a = p.parse_args(argv)
    out_dir = common.RESULTS
    if a.merge:
        parts = [json.loads(pathlib.Path(f).read_text()) for f in a.merge]
        doc = dict(parts[0])
        rows = {}  # a later file's row replaces an earlier one of the same case
        for part in parts:
            rows.update({(r["op"], r["model"], r["M"]): r for r in part["results"]})
        doc["results"] = list(rows.values())
        doc["runs"] = [part["gpu"] for part in parts]
    else:
        selected = [] if a.only_lm_head else cases(a.models, a.ms, lm_head=False, ops=a.ops)
        if not a.no_lm_head:
            selected += cases((), (), lm_head=True)
        doc = {"gpu": common.gpu_info(), "results": run(selected, a.reps)}
    doc["goals"] = goals(doc["results"])
    common.write_json(out_dir / f"{a.out}.json", doc)
    try:
        plot(doc["results"], out_dir / f"{a.out}.png")
    except ImportError as e:
        print(f"no plot: {e}", file=sys.stderr)
    print("\n".join(doc["goals"]))


if __name__ == "__main__":
    main()
