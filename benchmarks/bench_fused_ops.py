"""The ready ops (coda_ext.ops) at the Llama shapes of docs/design.md against the bare cuBLAS GEMM of the
same shape, and with --backward the training step's backward epilogue GEMMs (benchmarks/backward_gemms.py:
the dX GEMMs with the SwiGLU and RMSNorm backward in their epilogues, the weight gradients, linear_residual,
the LM head backward's GEMMs). Every row times, interleaved in one process: the op; the bare cuBLAS GEMM of
the same shape and operand layout; the plain GEMM in the kernel config and layout the op ran
("plain_same_config", the identity graph: the mainloop's share; the op over it is the epilogue's); eager
PyTorch and torch.compile of the unfused math (and Liger-Kernel's fused linear cross-entropy for the LM
head). Ratios are medians of per-round ratios to cuBLAS; peak memory above what was allocated before.
The speed goals of the rows are benchmarks/goals.py's.

    python -m coda_ext prebuild benchmarks/bench_fused_ops.py -j 16   # every kernel of both families
    python -m benchmarks.bench_fused_ops [--backward] [--models 8B 1B] [--ms 16384 1024 128] [--ops ...]
        [--no-lm-head | --only-lm-head] [--compile-all-shapes | --no-compile] [--sustained] [--out NAME] [--dry-run]
    python -m benchmarks.bench_fused_ops --merge results/f.json results/b.json --out ops_h200  # b: --backward

torch.compile is timed at the training shapes (M = 16384 tokens, the LM head's 8192; compiling per shape
costs ~10-30 s each), at every shape with --compile-all-shapes, at none with --no-compile (the coda rows alone, a few
seconds each; the torch.compile goal is then not measured). --dry-run lists the rows and the kernels
they need (no GPU). Writes results/<out>.json (rows of both families, each marked "pass": forward or
backward; default: ops_<gpu>.json, <gpu> the GPU it runs on: h100, h200, …) and the .png beside it.
--sustained times every variant at the GPU's power limit, where a training step runs (common.time_sustained:
blocks of back-to-back calls; docs/measured.md "The step at the GPU's power limit"), into ops_sustained_<gpu>.json.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

from benchmarks import backward_gemms, common, goals
from tests.helpers import rand

MODELS = {"8B": dict(d=4096, F=14336, hq=32, hkv=8, hd=128), "1B": dict(d=2048, F=8192, hq=32, hkv=8, hd=64)}
MS = (16384, 1024, 128)
OPS = ("residual_norm_down", "residual_norm_o", "rms_linear_silu", "swiglu_y", "swiglu_train", "qkv_rope",
       "qkv_rope_qknorm")
BACKWARD_OPS = backward_gemms.OPS
LM_HEAD = backward_gemms.LM_HEAD
PLAIN = goals.PLAIN
#: where the inputs live (the CPU tests run the rows on stand-in kernels)
DEVICE = "cuda"


def shapes(model) -> dict:
    """op -> (N, K) of each forward op (but the LM head) at `model`'s sizes."""
    c = MODELS[model]
    d, F = c["d"], c["F"]
    qn = (c["hq"] + 2 * c["hkv"]) * c["hd"]
    return {"residual_norm_down": (d, F), "residual_norm_o": (d, d), "rms_linear_silu": (F, d),
            "swiglu_y": (2 * F, d), "swiglu_train": (2 * F, d), "qkv_rope": (qn, d), "qkv_rope_qknorm": (qn, d)}


def cases(models=tuple(MODELS), ms=MS, lm_head=True, ops=OPS):
    """(op, model, M, N, K) of every case."""
    out = []
    for m in models:
        for M in ms:
            out += [(op, m, M, *shapes(m)[op]) for op in ops]
    if lm_head:
        out.append(("lm_head_ce", LM_HEAD["model"], LM_HEAD["M"], LM_HEAD["V"], LM_HEAD["K"]))
    return out


def backward_cases(models=tuple(MODELS), ms=MS, lm_head=True, ops=BACKWARD_OPS) -> list:
    """The --backward rows (backward_gemms.Gemm): the step's GEMMs per model and token count, the LM head's."""
    return backward_gemms.cases({m: MODELS[m] for m in models}, ms, ops, LM_HEAD if lm_head else None)


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


def kernel_of(case):
    """(graph, operand layout, (M, N, K) as launched) of a forward case or a backward row."""
    if isinstance(case, backward_gemms.Gemm):
        return case.graph(), case.major, (case.M, case.N, case.K)
    op, model, M, N, K = case
    return graph_of(op, model), "kk", (M, N, K)


def build_items(selected=None):
    """Every kernel the rows run (both families by default): each op's kernel in the config "auto" picks at
    its shape, and the plain GEMM (identity graph) in that config and layout."""
    from coda_ext import graphs
    from coda_ext.runtime import auto_items

    selected = cases() + backward_cases() if selected is None else selected
    items = auto_items([kernel_of(c) for c in selected], "bfloat16")
    twins = {cfg.tag: (graphs.identity(), "bfloat16", cfg) for _, _, cfg in items}
    return items + list(twins.values())


def _plain_twin(graph, major, A, W):
    """(the config the op runs for this call, the plain GEMM built with it): the op's TunedOp choice
    (what tuning remembered, else the heuristic) for operands A (M, K) and W (N, K) in `major`."""
    import torch

    import coda_ext as ce
    from coda_ext import graphs
    from coda_ext.runtime import TunedOp

    cfg = TunedOp(graph, "bfloat16", tune=False, major=major).choose(A, W, {}, torch.cuda.get_device_name(A.device))
    return cfg, ce.compile(graphs.identity(), "bfloat16", cfg)


def _variants(op, model, M, N, K, with_compile, with_liger):
    """({name: fn(i)} on two rotated input sets, the first the bare cuBLAS GEMM; the op's config)."""
    import torch
    import torch.nn.functional as F

    from coda_ext import ops

    dt, dev, eps = torch.bfloat16, DEVICE, 1e-6
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

    cfg, twin = _plain_twin(graph_of(op, model), "kk", sets[0]["x"], sets[0]["w"])
    v = {"cublas": lambda i: F.linear(sets[i]["x"], sets[i]["w"]), "coda": lambda i: coda(sets[i]),
         PLAIN: lambda i: twin(sets[i]["x"], sets[i]["w"]), "eager": lambda i: eager(sets[i])}
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
    return v, cfg


def _backward_variants(g, with_compile):
    """The same for a backward row (backward_gemms.Gemm): cuBLAS is torch.mm(A, W.t()) on the GEMM's
    operand views, the layout the op reads."""
    import torch

    sets = [backward_gemms.inputs(g, i, DEVICE) for i in range(2)]
    gemm = [backward_gemms.operands(g, s) for s in sets]
    cfg, twin = _plain_twin(g.graph(), g.major, *gemm[0])
    v = {"cublas": lambda i: torch.mm(gemm[i][0], gemm[i][1].t()), "coda": lambda i: backward_gemms.call(g, sets[i]),
         PLAIN: lambda i: twin(*gemm[i]), "eager": lambda i: backward_gemms.eager(g, sets[i])}
    if with_compile:
        compiled = common.compile_for_one_shape(lambda s: backward_gemms.eager(g, s))
        v["torch.compile"] = lambda i: compiled(sets[i])
    return v, cfg


def _peak_memory(fn) -> float:
    return common.peak_memory_gb(fn)[0]


def row_fields(case) -> dict:
    """What identifies a row in the results file."""
    if isinstance(case, backward_gemms.Gemm):
        return {"pass": case.pass_name, "op": case.op, "model": case.model, "tokens": case.tokens, "M": case.M,
                "N": case.N, "K": case.K, "major": case.major}
    op, model, M, N, K = case
    return {"pass": "forward", "op": op, "model": model, "tokens": M, "M": M, "N": N, "K": K, "major": "kk"}


def row_key(row: dict) -> tuple:
    """A row's case (rows of earlier files have no "pass": they are forward rows)."""
    return row.get("pass", "forward"), row["op"], row["model"], row["M"], row["N"], row["K"]


def summarize_row(fields: dict, times: dict[str, list[float]], config: str, fused: bool) -> dict:
    """A results row from per-round times {variant: [ms]}: ratios to cuBLAS, the mainloop's share (the plain
    GEMM in the op's config / cuBLAS) and the epilogue's (the op / that plain GEMM, median of per-round
    ratios)."""
    summary = common.summarize(times, "cublas")
    return {**fields, "config": config, "fused": fused, "results": summary,
            "mainloop_ratio": summary[PLAIN]["median_ratio_to_cublas"],
            "epilogue_ratio": statistics.median(c / p for c, p in zip(times["coda"], times[PLAIN]))}


def _fused(graph) -> bool:
    from coda_ext import graphs

    return graph.build().digest() != graphs.identity().build().digest()


def with_compile(tokens: int, compile_all: bool = False, no_compile: bool = False) -> bool:
    """Whether a row times torch.compile: at the training shapes (every shape with compile_all), never with
    no_compile."""
    return not no_compile and (compile_all or tokens not in goals.SMALL_M)


def run(selected, reps, compile_all=False, sustained=False, no_compile=False):
    """Rows of the selected cases; sustained: each variant timed as blocks of back-to-back calls at the GPU's
    power limit (common.time_sustained, a quarter of the rounds) instead of alone after an L2 flush; no_compile:
    without torch.compile (no compile time; its goal then not measured)."""
    results = []
    for case in selected:
        fields = row_fields(case)
        comp = with_compile(fields["tokens"], compile_all, no_compile)
        if isinstance(case, backward_gemms.Gemm):
            variants, cfg = _backward_variants(case, with_compile=comp)
        else:
            variants, cfg = _variants(*case, with_compile=comp, with_liger=case[0] == "lm_head_ce")
        for fn in variants.values():  # warm up: kernels, torch.compile, autotuning
            fn(0)
            fn(1)
        n = reps if fields["op"] != "lm_head_ce" else max(5, reps // 3)
        times = common.time_sustained(variants, max(3, n // 4)) if sustained else common.time_interleaved(variants, n)
        row = summarize_row(fields, times, cfg.tag, _fused(kernel_of(case)[0]))
        row["peak_gb"] = {k: _peak_memory(fn) for k, fn in variants.items()}
        results.append(row)
        r = {k: v["median_ratio_to_cublas"] for k, v in row["results"].items()}
        print(f"{fields['op']:30s} {fields['model']} T={fields['tokens']:5d} {fields['M']}x{fields['N']}x{fields['K']} "
              f"{fields['major']} {cfg.tag}: " + " ".join(f"{k}={r[k]:.3f}" for k in r)
              + f"  epilogue={row['epilogue_ratio']:.3f}  cublas={row['results']['cublas']['median_ms']:.3f} ms",
              flush=True)
    return results


def dry_run(selected, compile_all=False, no_compile=False) -> list[str]:
    """One line per row: its variants and the two kernels it needs (op and plain twin, config "auto" picks on
    an H100); then the count of distinct kernels (build them with `python -m coda_ext prebuild
    benchmarks/bench_fused_ops.py`)."""
    from coda_ext import graphs, tuning
    from coda_ext.runtime import TunedOp

    out, kernels, identity = [], set(), graphs.identity().build().digest()
    for case in selected:
        f = row_fields(case)
        graph, major, mnk = kernel_of(case)
        cfg = TunedOp(graph, "bfloat16", tune=False, major=major).config_for(*mnk, tuning.DEFAULT_SMS)
        digest = graph.build().digest()
        kernels |= {(digest, cfg.tag), (identity, cfg.tag)}
        compiled = ", torch.compile" if with_compile(f["tokens"], compile_all, no_compile) else ""
        out.append(f"{f['pass']} {f['op']} {f['model']} tokens={f['tokens']} {f['M']}x{f['N']}x{f['K']} {major}: "
                   f"cublas, coda [{digest} {cfg.tag}], {PLAIN} [identity {cfg.tag}], eager{compiled}")
    out.append(f"{len(selected)} rows, {len(kernels)} kernels")
    return out


def gpu_name(doc: dict) -> str | None:
    """The GPU a results document was measured on (its "gpu": common.gpu_info()'s record, or a name)."""
    gpu = doc.get("gpu")
    return gpu.get("gpu") if isinstance(gpu, dict) else gpu


def plot(results, path, gpu: str | None = None):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in results if r["op"] != "lm_head_ce"]
    names = ["coda", PLAIN, "torch.compile", "eager"]
    fig, axes = plt.subplots(2, 1, figsize=(max(10, 0.45 * len(rows)), 9), gridspec_kw={"height_ratios": [3, 1.2]})
    ax = axes[0]
    width = 0.8 / len(names)
    for j, name in enumerate(names):
        xs = [i + (j - 1.5) * width for i, r in enumerate(rows) if name in r["results"]]
        ys = [min(r["results"][name]["median_ratio_to_cublas"], 2.5) for r in rows if name in r["results"]]
        ax.bar(xs, ys, width, label=name)
    ax.axhline(1.0, color="k", lw=1)
    ax.axhline(goals.BACKWARD_GEMM, color="r", lw=0.8, ls="--", label=f"backward goal {goals.BACKWARD_GEMM}")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([f"{'bwd ' if r.get('pass') == 'backward' else ''}{r['op']} {r['model']} "
                        f"T={r.get('tokens', r['M'])}" for r in rows], rotation=75, fontsize=7)
    ax.set_ylabel("time / bare cuBLAS GEMM (capped at 2.5)")
    ax.set_ylim(0.8, 2.6)
    ax.legend(fontsize=8)
    on = f"{gpu}, " if gpu else ""
    ax.set_title(f"coda_ext ready ops and backward GEMMs vs the bare GEMM of the same shape ({on}bf16; lower is "
                 "better)")
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


def select(a, p) -> list:
    """The rows the arguments ask for: the forward family, or with --backward the backward one."""
    family = BACKWARD_OPS if a.backward else OPS
    chosen = a.ops or list(family)
    other = [o for o in chosen if o not in family]
    if other:
        p.error(f"--ops {other} are not in the {'backward' if a.backward else 'forward'} family; "
                f"choose from {list(family)}" + ("" if a.backward else " (or pass --backward)"))
    if a.backward:
        step = [] if a.only_lm_head else [o for o in chosen if o in backward_gemms.STEP_OPS]
        head = [] if a.no_lm_head else [o for o in chosen if o in backward_gemms.LM_HEAD_OPS]
        return backward_cases(a.models, a.ms, lm_head=bool(head), ops=step + head)
    selected = [] if a.only_lm_head else cases(a.models, a.ms, lm_head=False, ops=chosen)
    return selected + ([] if a.no_lm_head else cases((), (), lm_head=True))


def merge(paths: list[str]) -> dict:
    """One results file from several runs (e.g. the forward and the backward family); a later file's row
    replaces an earlier one of the same case."""
    parts = [json.loads(pathlib.Path(f).read_text()) for f in paths]
    doc = dict(parts[0])
    rows = {}
    for part in parts:
        rows.update({row_key(r): r for r in part["results"]})
    doc["results"] = list(rows.values())
    doc["runs"] = [part["gpu"] for part in parts]
    return doc


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backward", action="store_true", help="the training step's backward GEMMs (backward_gemms.py) "
                   "instead of the forward ops")
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--ms", nargs="+", type=int, default=list(MS), help="token counts")
    p.add_argument("--no-lm-head", action="store_true")
    p.add_argument("--only-lm-head", action="store_true")
    p.add_argument("--ops", nargs="+", default=None, choices=list(OPS) + list(BACKWARD_OPS),
                   help="default: every op of the family")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--sustained", action="store_true", help="time at the GPU's power limit, as a training step runs: "
                   "blocks of back-to-back calls (common.time_sustained) instead of one call after an L2 flush and a "
                   "pause; results default to ops_sustained_<gpu>.json")
    p.add_argument("--compile-all-shapes", action="store_true", help="torch.compile at every shape, not only the "
                   "training shapes")
    p.add_argument("--no-compile", action="store_true", help="leave torch.compile out at every shape (no compile "
                   "time; the torch.compile goal is then not measured)")
    p.add_argument("--out", default=None, help="a name under benchmarks/results/, or a path ending in .json "
                   "(default: ops_<gpu>, <gpu> the GPU it runs on, or with --merge the merged runs': h100, h200, …)")
    p.add_argument("--merge", nargs="+", default=None, help="combine earlier result files instead of running")
    p.add_argument("--dry-run", action="store_true", help="list the rows and the kernels they need; no GPU")
    a = p.parse_args(argv)
    if a.merge:
        doc = merge(a.merge)
    else:
        selected = select(a, p)
        if a.dry_run:
            print("\n".join(dry_run(selected, a.compile_all_shapes, a.no_compile)))
            return 0
        doc = {"gpu": common.gpu_info(), "timing": "sustained" if a.sustained else "interleaved",
               "results": run(selected, a.reps, a.compile_all_shapes, a.sustained, a.no_compile)}
    if a.out is None:   # named by the GPU the rows were measured on (the first merged file's)
        out = common.results_path("ops_sustained" if a.sustained else "ops", gpu=gpu_name(doc) or "cpu")
    else:
        out = pathlib.Path(a.out) if a.out.endswith(".json") else common.RESULTS / f"{a.out}.json"
    doc["goals"] = goals.lines(goals.check(op_rows=doc["results"]))
    common.write_json(out, doc)
    try:
        plot(doc["results"], out.with_suffix(".png"), gpu_name(doc))
    except ImportError as e:
        print(f"no plot: {e}", file=sys.stderr)
    print("\n".join(doc["goals"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
