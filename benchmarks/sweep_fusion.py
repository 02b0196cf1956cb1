"""The kernels automatic fusion launches, one at a time: each distinct fused epilogue of a model's training
step (coda_ext.fusion.plan, traced on the CPU), timed alone at its GEMM shape in the config "auto" picks and
in other kernel configs, against the bare cuBLAS GEMM of the same shape and operand layout, beside the IO
model's prediction for it. Where a fused step loses to torch.compile because its kernels are slow (BERT's
GEMMs have K = 768 or 3072: a short mainloop under a long epilogue), this says by how much, kernel by
kernel, and which config would do better.

    python -m benchmarks.sweep_fusion [--models bert-base] [--reps 10] [--dry-run]
    python -m benchmarks.sweep_fusion --epilogue --sites f686e3c8 4ddb4d57   # epilogue subtiles and stages
    python -m benchmarks.sweep_fusion --ablate --sites 65aa8f6c    # what each part of an epilogue costs, and a chart
    python -m benchmarks.sweep_fusion --set direct --prebuild       # tile inputs read into registers
    python -m benchmarks.sweep_fusion --set overlap --prebuild      # overlapping epilogues, shallower load stages
    python -m coda_ext prebuild benchmarks/sweep_fusion.py      # its kernels, in parallel, ahead

Results (--out): sweep_fusion_<gpu>.json in benchmarks/results/, <gpu> the GPU it runs on (h100, h200, …).
"""
from __future__ import annotations

import argparse
import sys

from benchmarks import bench_autofusion as af
from benchmarks import common

DEFAULT_MODELS = ("bert-base",)
#: The configs tried beside "auto"'s, in each kernel's operand layout: the two schedules' usual tiles,
#: ping-pong 64 x 128 (half the accumulator a thread: room for a long epilogue's registers), and ping-pong
#: 128 x 128 swizzle 4 with overlapping epilogues ("overlap": "auto"'s over K <= 1024) beside the plain one.
ALTERNATIVES = (((128, 128, 64), (1, 1), "pingpong", 4), ((128, 128, 64), (1, 1), "overlap", 4),
                ((128, 192, 64), (1, 1), "pingpong", 8),
                ((64, 256, 64), (1, 1), "pingpong", 8), ((64, 128, 64), (1, 1), "pingpong", 4),
                ((128, 128, 64), (1, 1), "cooperative", 4),
                ((128, 256, 64), (2, 1), "cooperative", 4), ((256, 128, 64), (1, 1), "cooperative", 4))
#: --epilogue: around these bases, the epilogue's subtile width EPI_N (None: CUTLASS's 32; its rows are the
#: schedule's, 64 in ping-pong and overlap, 128 in cooperative) and its (load, store) stages, each beside the plain
#: GEMM in the base config (its mainloop alone). At K = 768 a tile's mainloop is short and every subtile's loads
#: are a round trip; with two store stages each subtile's store waits for the store before the last to have read
#: its shared memory, so (4, 4) lets more of them be in flight.
#: --set direct: the configs tried beside "auto"'s with the epilogue's tile inputs read straight into registers
#: (tile_loads="direct": no shared-memory stages for them, so the mainloop keeps its stages and the overlap schedule,
#: whose epilogue buffers are allocated twice, fits epilogues that load several tiles), and in overlap 128 x 128 its
#: tile outputs written from registers too (tile_stores="direct"). For the graphs that load tiles.
DIRECT = (dict(tile=(128, 128, 64), cluster=(1, 1), schedule="pingpong", swizzle=4, tile_loads="direct"),
          dict(tile=(128, 128, 64), cluster=(1, 1), schedule="overlap", swizzle=4, tile_loads="direct"),
          dict(tile=(128, 128, 64), cluster=(1, 1), schedule="overlap", swizzle=4, tile_loads="direct",
               tile_stores="direct"),
          dict(tile=(128, 192, 64), cluster=(1, 1), schedule="pingpong", swizzle=8, tile_loads="direct"),
          dict(tile=(128, 256, 64), cluster=(2, 1), schedule="cooperative", swizzle=4, tile_loads="direct"))
#: --set overlap: ping-pong 128 x 128 with overlapping epilogues (CUTLASS's epilogue stages, and shallower tile-load
#: stages, (2, 1) and (1, 1), so that its two copies of the epilogue's buffers leave the mainloop its stages), ping-pong
#: with (2, 1), and cooperative 128 x 256 2 x 1 (swizzle 4): for the sites "auto" runs in another schedule.
OVERLAP = (dict(tile=(128, 128, 64), cluster=(1, 1), schedule="overlap", swizzle=4),
           dict(tile=(128, 128, 64), cluster=(1, 1), schedule="overlap", swizzle=4, epilogue_stages=(2, 1)),
           dict(tile=(128, 128, 64), cluster=(1, 1), schedule="overlap", swizzle=4, epilogue_stages=(1, 1)),
           dict(tile=(128, 128, 64), cluster=(1, 1), schedule="pingpong", swizzle=4, epilogue_stages=(2, 1)),
           dict(tile=(128, 256, 64), cluster=(2, 1), schedule="cooperative", swizzle=4))
#: --set NAME: the config sets tried beside "auto"'s instead of ALTERNATIVES (direct: only where the graph loads tiles).
SETS = {"direct": DIRECT, "overlap": OVERLAP}
EPILOGUE_BASES = (((128, 128, 64), (1, 1), "pingpong", 4), ((128, 128, 64), (1, 1), "overlap", 4),
                  ((128, 128, 64), (1, 1), "cooperative", 4))
EPILOGUE_VARIANTS = ((None, None), (64, None), (128, None), (None, (8, 2)), (None, (4, 4)))


#: --ablate: the unary kinds whose math a "no_math" variant skips (the transcendental ones and costlier).
def _costly(kind: str) -> bool:
    from coda_ext.graph import kinds

    k = kinds.KINDS[kind]
    return k.arity == 1 and "compute" in k.flags and k.flops >= kinds.TRANSCENDENTAL


def ablations(graph, dtype: str) -> dict:
    """What each part of an epilogue costs: the graph, then variants of it with parts removed, by name (each
    distinct from the others and verified): without its column or row reductions or both, without its stores,
    with its fp32 stores in the op's 16-bit dtype, its main output alone or left out, and with its costly unary math
    (exp, GELU, ...) skipped (the node reads through to its input). Timed in one config beside the plain GEMM,
    the differences split the epilogue's time between reductions, stores and math."""
    from coda_ext.errors import GraphError
    from coda_ext.graph import ir
    from coda_ext.graph.verify import verify
    from coda_ext.passes.prune import prune

    def edit(drop=lambda n: False, through=lambda n: False, attrs=lambda n: n.attrs):
        index: dict[int, int] = {}
        nodes: list = []
        for i, n in enumerate(graph.nodes):
            if drop(n):
                continue
            if through(n):
                index[i] = index[n.inputs[0]]
                continue
            index[i] = len(nodes)
            nodes.append(ir.Node(n.kind, tuple(index[j] for j in n.inputs), attrs(n)))
        return prune(ir.GraphIR(tuple(nodes)))

    sinks = [n for n in graph.nodes if n.is_sink]
    out = {"full": graph}
    if any(n.kind == "col_reduce" for n in sinks):
        out["no_col_reduce"] = edit(drop=lambda n: n.kind == "col_reduce")
    if any(n.kind == "row_reduce" for n in sinks):
        out["no_row_reduce"] = edit(drop=lambda n: n.kind == "row_reduce")
    out["no_reductions"] = edit(drop=lambda n: n.kind in ("row_reduce", "col_reduce"))
    out["no_stores"] = edit(drop=lambda n: n.kind == "store")
    out["stores_16bit"] = edit(attrs=lambda n: ir.make_attrs(**{**dict(n.attrs), "dtype": dtype})
                               if n.kind == "store" and n.attr("dtype") == "float32" else n.attrs)
    out["output_only"] = edit(drop=lambda n: n.is_sink and n.kind != "output")
    out["no_output"] = edit(drop=lambda n: n.kind == "output")
    out["no_math"] = edit(through=lambda n: _costly(n.kind))
    seen: set = set()
    keep = {}
    for name, g in out.items():
        if not any(n.is_sink for n in g.nodes) or g.digest() in seen:
            continue
        try:
            verify(g)
        except GraphError:   # a variant the IR cannot express is not timed
            continue
        seen.add(g.digest())
        keep[name] = g
    return keep


def kernels(name: str, tiny: bool = False) -> list[dict]:
    """The distinct fused kernels of model `name`'s training step: per (graph, layout, GEMM shape) one
    entry with its site, how often a step launches it, and the IO model's times (planned on the CPU;
    tiny: bench_autofusion's tiny config of the model)."""
    import coda_ext.fusion as cf

    backend = af.plan_backend(name, af.parse(["--tiny"] if tiny else []))[0]
    cost = cf.CostModel()
    found: dict = {}
    for low in backend.lowered:
        site = low.site
        if site is None or low.mnk is None or site.dtype not in ("bfloat16", "float16"):
            continue
        key = (site.kernel_key, tuple(low.mnk))
        if key not in found:
            k = cost.kernel(site.graph, site.dtype, tuple(low.mnk), major=site.major)
            found[key] = {"site": site, "mnk": tuple(low.mnk), "launches": 0,
                          "io_fused_us": k.fused_s * 1e6, "io_compile_us": k.compile_s * 1e6}
        found[key]["launches"] += 1
    return list(found.values())


def configs(site, mnk, epilogue: bool = False, named: str | None = None) -> list:
    """The auto config at mnk, then the alternatives that fit the graph (shared memory, segments), without
    repeats, each in the site's operand layout (epilogue: EPILOGUE_BASES × EPILOGUE_VARIANTS instead; named: the set
    SETS[named] instead, "direct" only for a graph that loads tiles)."""
    import coda_ext as ce
    from benchmarks.sweep_backward import fits, loads_tiles
    from coda_ext.config import PINGPONG_SCHEDULES
    from coda_ext.graph.canonical import as_ir

    auto = auto_config(site, mnk)
    out = {auto.tag: auto}
    if named:
        tries = [] if named == "direct" and not loads_tiles(as_ir(site.graph)) else \
            [ce_config(d, site.major) for d in SETS[named]]
    elif not epilogue:
        tries = [ce.KernelConfig(tile, cluster, schedule, swizzle=swizzle, major=site.major)
                 for tile, cluster, schedule, swizzle in ALTERNATIVES]
    else:
        tries = [
            ce.KernelConfig(tile, cluster, schedule, swizzle=swizzle, major=site.major, epilogue_stages=st,
                            epilogue_tile=None if en is None else (64 if schedule in PINGPONG_SCHEDULES else 128, en))
            for tile, cluster, schedule, swizzle in EPILOGUE_BASES for en, st in EPILOGUE_VARIANTS
            if en is None or tile[1] % en == 0]   # subtiles that divide the tile
    for c in tries:
        if c.tag not in out and fits(site.graph, c):
            out[c.tag] = c
    return list(out.values())


def ce_config(fields: dict, major: str):
    """The KernelConfig of one entry of a named set (SETS), in the operand layout `major`."""
    import coda_ext as ce

    return ce.KernelConfig(**fields, major=major)


def plain_configs(site, mnk, epilogue: bool = False) -> list:
    """The configs whose plain GEMM (identity epilogue) the sweep times beside them: the epilogue bases as the
    site's layout runs them (--epilogue only)."""
    import coda_ext as ce

    if not epilogue:
        return []
    return [ce.KernelConfig(tile, cluster, schedule, swizzle=swizzle, major=site.major)
            for tile, cluster, schedule, swizzle in EPILOGUE_BASES]


def auto_config(site, mnk):
    """The config "auto" picks for the site at mnk (its operand layout)."""
    from coda_ext.runtime.tuned import TunedOp

    return TunedOp(site.graph, site.dtype, tune=False, major=site.major).config_for(*mnk)


def build_items(models=DEFAULT_MODELS, epilogue: bool = False, sites: tuple[str, ...] = (),
                ablate: bool = False, named: str | None = None) -> list:
    """Every kernel the sweep times: python -m coda_ext prebuild benchmarks/sweep_fusion.py."""
    from coda_ext import graphs

    items = {}
    for name in models:
        for k in selected(kernels(name), sites):
            if ablate:
                c = auto_config(k["site"], k["mnk"])
                for g in ablations(k["site"].graph, k["site"].dtype).values():
                    items[(g.digest(), k["site"].dtype, c.tag)] = (g, k["site"].dtype, c)
                items[("identity", k["site"].dtype, c.tag)] = (graphs.identity(), k["site"].dtype, c)
                continue
            for c in configs(k["site"], k["mnk"], epilogue, named):
                items[(k["site"].kernel_key, c.tag)] = (k["site"].graph, k["site"].dtype, c)
            for c in plain_configs(k["site"], k["mnk"], epilogue):
                items[("identity", k["site"].dtype, c.tag)] = (graphs.identity(), k["site"].dtype, c)
    return list(items.values())


def selected(entries: list[dict], sites: tuple[str, ...]) -> list[dict]:
    """The entries whose graph digest starts with one of `sites` (all where none is given)."""
    return [e for e in entries if not sites or any(e["site"].graph.digest().startswith(s) for s in sites)]


def cublas_gemm(a, w, out=None):
    """The bare cuBLAS GEMM a @ wᵀ (w in the site's layout), written like the fused kernel writes its output: rows
    padded to 16 bytes where N is no multiple of 8 (a 50257-wide vocabulary), where cuBLAS's own contiguous
    output would have it take its unaligned path (13.2 ms at GPT-2's LM head on an H200, where torch.compile's
    GEMM into padded rows took 1.76 ms)."""
    import torch

    from coda_ext.runtime import checks

    if out is None:
        out = checks.empty_rows((a.shape[0], w.shape[0]), a.dtype, a.device)
    return torch.mm(a, w.t(), out=out)


def ablate(entry: dict, reps: int, built_only: bool = False) -> dict:
    """The site's ablations (`ablations`) in its auto config, each with its own inputs, interleaved with the
    plain GEMM in that config ("plain") and the bare cuBLAS GEMM of the shape and layout."""
    import coda_ext as ce
    from coda_ext import graphs, jit
    from coda_ext.graph.canonical import as_ir
    from tests.helpers import rand

    site, (M, N, K) = entry["site"], entry["mnk"]
    c = auto_config(site, (M, N, K))
    variants = {**ablations(site.graph, site.dtype), "plain": graphs.identity()}
    ops = {name: ce.compile(g, site.dtype, c) for name, g in variants.items()
           if not built_only or jit.cached(jit.kernel_source(g, site.dtype, c))}
    gen = rand.generator("sweep_fusion", site.graph.digest(), device="cuda")
    sets = {name: [rand.op_inputs(op, M, N, K, gen) for _ in range(2)] for name, op in ops.items()}
    base = sets.get("plain") or next(iter(sets.values()))   # the plain GEMM's operands, or any variant's
    outs = [cublas_gemm(a, w) for a, w, _ in base]
    fns = {"cublas_gemm": lambda i, s=base: cublas_gemm(s[i][0], s[i][1], outs[i])}
    for name, op in ops.items():
        fns[name] = lambda i, op=op, s=sets[name]: op(s[i][0], s[i][1], **s[i][2])
    summary = common.summarize(common.time_interleaved(fns, reps), "cublas_gemm")
    return {"graph": site.graph.digest()[:8], "major": site.major, "mnk": [M, N, K], "launches": entry["launches"],
            "config": c.tag, "variants": summary,
            "graphs": {name: as_ir(g).text() for name, g in variants.items() if name in ops}}


def sweep(entry: dict, reps: int, epilogue: bool = False, built_only: bool = False, named: str | None = None) -> dict:
    """One kernel in each of its configs, interleaved with the bare cuBLAS GEMM of its shape and layout (and,
    with epilogue, the plain GEMM in each base config: "plain_<tag>"). built_only: the configs whose kernel is
    in the cache (after a prebuild where some failed), no nvcc here."""

    import coda_ext as ce
    from coda_ext import graphs, jit
    from tests.helpers import rand

    site, (M, N, K) = entry["site"], entry["mnk"]

    def usable(graph, c) -> bool:
        return not built_only or jit.cached(jit.kernel_source(graph, site.dtype, c))

    ops = {c.tag: ce.compile(site.graph, site.dtype, c) for c in configs(site, (M, N, K), epilogue, named)
           if usable(site.graph, c)}
    plain = {f"plain_{c.tag}": ce.compile(graphs.identity(), site.dtype, c)
             for c in plain_configs(site, (M, N, K), epilogue) if usable(graphs.identity(), c)}
    first = next(iter(ops.values()))
    gen = rand.generator("sweep_fusion", site.graph.digest(), device="cuda")
    sets = [rand.op_inputs(first, M, N, K, gen) for _ in range(2)]
    outs = [cublas_gemm(a, w) for a, w, _ in sets]
    fns = {"cublas_gemm": lambda i: cublas_gemm(sets[i][0], sets[i][1], outs[i])}
    for tag, op in ops.items():
        fns[tag] = lambda i, op=op: op(sets[i][0], sets[i][1], **sets[i][2])
    for tag, op in plain.items():
        fns[tag] = lambda i, op=op: op(sets[i][0], sets[i][1])
    summary = common.summarize(common.time_interleaved(fns, reps), "cublas_gemm")
    auto = next(iter(ops))
    best = min(ops, key=lambda t: summary[t]["median_ms"])
    return {"graph": site.graph.digest()[:8], "major": site.major, "mnk": [M, N, K], "launches": entry["launches"],
            "io_fused_us": entry["io_fused_us"], "io_compile_us": entry["io_compile_us"], "auto": auto,
            "best": best, "variants": summary}


#: --ablate's chart: the variants in the order they are drawn (top to bottom in each site's group).
ABLATION_ORDER = ("full", "no_output", "stores_16bit", "no_stores", "no_row_reduce", "no_col_reduce", "no_reductions",
                  "no_math", "output_only", "plain")


def plot_ablation(doc: dict, path, before: dict | None = None) -> None:
    """--ablate's results at a glance: per site, each variant's time as a multiple of the bare cuBLAS GEMM of its
    shape (1.0 marked), and, given a `before` document of the same sites, its times as hollow bars beside."""
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for m in doc["models"].values() for r in m]
    old = {(r["graph"], tuple(r["mnk"])): r for m in (before or {}).get("models", {}).values() for r in m}
    labels, values, prior = [], [], []
    for r in rows:
        v = r["variants"]
        for name in (n for n in ABLATION_ORDER if n in v):
            labels.append(f"{r['graph']} {'x'.join(map(str, r['mnk']))} {r['major']}  {name}")
            values.append(v[name]["median_ratio_to_cublas"])
            o = old.get((r["graph"], tuple(r["mnk"])), {}).get("variants", {}).get(name)
            prior.append(o["median_ratio_to_cublas"] if o else float("nan"))
        labels.append("")
        values.append(float("nan"))
        prior.append(float("nan"))
    if not rows:
        return
    fig, ax = plt.subplots(figsize=(9, 0.22 * len(labels) + 1.2))
    ys = list(range(len(labels)))[::-1]
    if before:
        ax.barh([y + 0.2 for y in ys], prior, 0.4, fill=False, edgecolor="0.5", label="before")
        ax.barh([y - 0.2 for y in ys], values, 0.4, color="C0", label="after")
        ax.legend(fontsize=7)
    else:
        ax.barh(ys, values, 0.7, color="C0")
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_yticks(ys)
    ax.set_yticklabels(labels, fontsize=6)
    ax.set_xlabel("time / bare cuBLAS GEMM of the shape (median)")
    env = doc.get("env") or {}
    ax.set_title(f"fused sites with parts removed, {env.get('gpu', '')} (sweep_fusion --ablate)", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), choices=list(af.MODELS))
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--out", default=None, help="results JSON (default: sweep_fusion_<gpu>.json in benchmarks/results/)")
    p.add_argument("--dry-run", action="store_true", help="list the kernels and configs; no GPU")
    p.add_argument("--epilogue", action="store_true",
                   help="sweep the epilogue's subtile and load stages (EPILOGUE_BASES x EPILOGUE_VARIANTS) beside "
                        "each base's plain GEMM, instead of the tiles")
    p.add_argument("--ablate", action="store_true",
                   help="time each site's epilogue with parts removed (reductions, stores, math) in its auto "
                        "config beside the plain GEMM there, instead of the configs")
    p.add_argument("--set", dest="named", default=None, choices=list(SETS),
                   help="the configs of SETS[NAME] beside auto's, instead of the tiles (direct: tile inputs read "
                        "straight into registers, for the sites that load tiles; overlap: overlapping epilogues)")
    p.add_argument("--sites", nargs="+", default=(), help="only the kernels whose graph digest starts so")
    p.add_argument("--prebuild", action="store_true", help="build the swept kernels in parallel first")
    args = p.parse_args(argv)
    if args.prebuild and not args.dry_run:
        import coda_ext as ce

        try:
            ce.prebuild(build_items(args.models, args.epilogue, tuple(args.sites), args.ablate, args.named))
        except ce.CompileError as e:   # the others are built: sweep those
            print(f"prebuild: {str(e).splitlines()[0]}", flush=True)
    doc = {"env": None, "models": {}}
    for name in args.models:
        entries = selected(kernels(name), tuple(args.sites))
        print(f"{name}: {len(entries)} distinct fused kernels at their shapes, "
              f"{sum(e['launches'] for e in entries)} launches a step", flush=True)
        if args.dry_run:
            for e in entries:
                tags = ([f"{auto_config(e['site'], e['mnk']).tag}: " + " ".join(ablations(e["site"].graph,
                                                                                     e["site"].dtype))]
                        if args.ablate else [c.tag for c in configs(e["site"], e["mnk"], args.epilogue, args.named)])
                print(f"  {e['site'].graph.digest()[:8]} {e['site'].major} {'x'.join(map(str, e['mnk']))} "
                      f"x{e['launches']}: IO model {e['io_fused_us']:.1f} us (compile-style "
                      f"{e['io_compile_us']:.1f}); configs {tags}")
            continue
        rows = []
        for e in entries:
            if args.ablate:
                row = ablate(e, args.reps, built_only=args.prebuild)
                v = row["variants"]
                parts = ", ".join(f"{n} {v[n]['median_ms'] * 1e3:.1f}" for n in v if n != "cublas_gemm")
                print(f"  {row['graph']} {row['major']} {'x'.join(map(str, row['mnk']))} {row['config']}: cuBLAS "
                      f"{v['cublas_gemm']['median_ms'] * 1e3:.1f} us; {parts} us", flush=True)
                rows.append(row)
                continue
            row = sweep(e, args.reps, args.epilogue, built_only=args.prebuild, named=args.named)
            v, auto, best = row["variants"], row["auto"], row["best"]
            print(f"  {row['graph']} {row['major']} {'x'.join(map(str, row['mnk']))} x{row['launches']}: cuBLAS "
                  f"{v['cublas_gemm']['median_ms'] * 1e3:.1f} us; auto {auto} "
                  f"{v[auto]['median_ratio_to_cublas']:.3f}x ({v[auto]['median_ms'] * 1e3:.1f} us, IO model "
                  f"{row['io_fused_us']:.1f}); best {best} {v[best]['median_ratio_to_cublas']:.3f}x", flush=True)
            rows.append(row)
        doc["models"][name] = rows
    if args.dry_run:
        return 0
    doc["env"] = common.gpu_info()
    out = common.write_json(args.out or common.results_path("sweep_fusion_ablate" if args.ablate else "sweep_fusion"),
                            doc)
    if args.ablate:
        plot_ablation(doc, out.with_suffix(".png"))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
