"""Where a fused kernel's time goes, tile by tile: the epilogue's per-tile timeline (KernelConfig(timeline=True),
csrc/epilogues/variants/timeline.hpp) of the backward epilogue GEMMs, beside their plain twin (the identity graph in
the same config), in the heuristic's config; with --forward the same of forward ready ops.

    python -m coda_ext prebuild benchmarks/epilogue_timeline.py -j 16
    python -m benchmarks.epilogue_timeline [--models 1B 8B] [--ops swiglu_backward_linear ...]
    python -m benchmarks.epilogue_timeline --ablate     # the dSwiGLU taken apart (benchmarks/ablate_epilogue.py's
                                                        # variants, and its math alone on the accumulator)
    CODA_TIMELINE_ITEMS=forward,ablate python -m coda_ext prebuild benchmarks/epilogue_timeline.py -j 16
    python -m benchmarks.epilogue_timeline --forward [--ablate] [--ops residual_norm_o qkv_rope qkv_rope_qknorm]

--forward: the rows are the forward ops residual_norm_o, qkv_rope and qkv_rope_qknorm (their graphs and (N, K) as
benchmarks/bench_fused_ops.py has them; operands K-major, as the ops launch them), in the heuristic's config; with
--ablate each one's parts beside it (forward_ablation_graphs). The prebuild calls build_items() without arguments:
CODA_TIMELINE_ITEMS (comma-separated words "forward", "ablate") picks the rows it lists, as the flags do.

Per kernel, from one launch after warm-up (cycles of each SM's clock, converted with the clock the launch ran at):
- epilogue: a math warp group's epilogue of one tile (consumer begin() to end()), and its steps per subtile s
  (CUTLASS's collectives issue subtile s - 1's TMA store inside subtile s, after its math): wait_inputs (begin_loop
  to previsit: the tile inputs' wait), math (previsit to the previous subtile's store issue: the math, the
  shared-memory fence and the warp group's barrier), store (to postreduce: the store's commit, the wait for the
  next store stage, a barrier, the reductions and the shared-memory writes), next (to the next subtile's start);
- period: the time between two consecutive tiles' MMAs ending on an SM (both warp groups' tiles in order), the
  kernel's time per tile; split into mma (a tile's MMAs, from the moment both its warp group's previous epilogue and
  the other group's MMAs were done, to its own epilogue's start) and epilogue_bound (the tensor cores idle because
  the warp group whose turn it was was still in its previous epilogue); epilogue_share (epilogue / period) and
  handover (from one epilogue's end to the next one's start on the SM): ping-pong runs the two groups' epilogues
  one at a time, so a share near 1 with a short handover is a kernel paced by its epilogues — a wait that
  epilogue_bound does not see, as begin() is recorded after the epilogue order barrier and end() before the TMA
  store drain;
- load_lead: how long before a subtile's turn its tile inputs were issued by the load warp (negative: issued after
  the consumer began to wait).
Results: epilogue_timeline_<gpu>.json (medians, µs; epilogue_timeline_forward_<gpu>.json with --forward, _ablation
after either with --ablate) and a PNG of a few SMs' timelines.
"""
from __future__ import annotations

import argparse
import ctypes
import dataclasses
import itertools
import os
import statistics

from benchmarks import backward_gemms, common

MODELS = {"8B": dict(d=4096, F=14336, hq=32, hkv=8, hd=128), "1B": dict(d=2048, F=8192, hq=32, hkv=8, hd=64)}
OPS = ("swiglu_backward_linear", "rms_norm_backward_linear_dx_in", "rms_norm_backward_linear")
FORWARD_OPS = ("residual_norm_o", "qkv_rope", "qkv_rope_qknorm")
SLOTS, SUBTILES, TILES = 128, 16, 16384   # timeline.hpp's kTimelineSlots, kTimelineSubtiles, kTimelineTiles
STEPS = ("wait_inputs", "math", "store", "next")
#: each step of subtile s as (slot, subtile offset) pairs (from, to): slots 0 begin_loop, 1 previsit, 2 postreduce,
#: 3 tma_store (recorded for subtile s - 1 during subtile s), 4 end_loop
STEP_SLOTS = {"wait_inputs": ((0, 0), (1, 0)), "math": ((1, 0), (3, -1)), "store": ((3, -1), (2, 0)),
              "next": ((2, 0), (0, 1))}


@dataclasses.dataclass(frozen=True)
class Forward:
    """A forward row: ready op `op` of `model` at M tokens, its graph and (N, K) bench_fused_ops'; operands
    K-major, as the op launches them (the fields a backward_gemms.Gemm row has that the timeline reads)."""
    op: str
    model: str
    M: int
    N: int
    K: int
    major: str = "kk"

    def graph(self):
        from benchmarks import bench_fused_ops

        return bench_fused_ops.graph_of(self.op, self.model)


def rows(models=tuple(MODELS), tokens: int = 16384, ops=None, forward: bool = False) -> list:
    """The backward rows (backward_gemms.Gemm) of `ops` (default OPS), or with forward the Forward rows of `ops`
    (default FORWARD_OPS)."""
    if forward:
        from benchmarks import bench_fused_ops

        return [Forward(op, m, tokens, *bench_fused_ops.shapes(m)[op]) for m in models for op in ops or FORWARD_OPS]
    return backward_gemms.cases({m: MODELS[m] for m in models}, (tokens,), ops or OPS)


def ablation_graphs() -> dict:
    """name -> graph: the dSwiGLU's ablation variants (benchmarks/ablate_epilogue.py) and its math alone on the
    accumulator (graphs.swiglu_backward_math)."""
    from benchmarks import ablate_epilogue
    from coda_ext import graphs

    return {**ablate_epilogue.dswiglu_variants(), "math only, no z": graphs.swiglu_backward_math()}


def forward_ablation_graphs(op: str, model: str) -> dict:
    """name -> graph: a forward row's parts, each the op's graph less one part. qkv_rope(_qknorm): "z only" (z = acc
    ⊙row rstd stored as the op's one output, no RoPE or QK-norm), "rope, constant vectors" (the op's graph with
    positions and frequencies launch scalars: no vector loads for the rotation; rstd and QK-norm's weights stay
    vectors), qknorm only "qknorm, no rope" (the norm and the store); residual_norm_o: "residual only" (no row
    statistic), "reduction only" (no residual tile). {} for other ops."""
    from coda_ext import graphs

    hd = MODELS[model]["hd"]
    if op.startswith("qkv_rope"):
        qk_norm = op == "qkv_rope_qknorm"
        out = {"z only": graphs.qkv_rope(True, False, hd, rope=None),
               "rope, constant vectors": graphs.qkv_rope(True, qk_norm, hd, rope="scalars")}
        return {**out, "qknorm, no rope": graphs.qkv_rope(True, True, hd, rope=None)} if qk_norm else out
    if op == "residual_norm_o":
        return {"residual only": graphs.linear_residual_norm(reduce=False),
                "reduction only": graphs.linear_residual_norm(residual=False)}
    return {}


def row_ablations(g) -> dict:
    """The ablation variants of row g (ablation_graphs() for the dSwiGLU, forward_ablation_graphs for a forward
    row; {} for the others)."""
    if isinstance(g, Forward):
        return forward_ablation_graphs(g.op, g.model)
    return ablation_graphs() if g.op == "swiglu_backward_linear" else {}


def config(g):
    """The heuristic's config of row g with the timeline: the op's graph and its plain twin both run in it. Fitted to
    the graph as its kernel is (QK-norm's epilogue tile holds one head), so the twin and the variants run in the
    kernel's own config."""
    import coda_ext as ce
    from benchmarks import sweep_backward

    fitted = ce.kernel_source(g.graph(), "bfloat16", sweep_backward.heuristic_config(g)).config
    return dataclasses.replace(fitted, timeline=True)


def item_options() -> tuple[bool, bool]:
    """(forward, ablate) from CODA_TIMELINE_ITEMS: comma-separated words "forward" and "ablate" (unset: neither),
    the rows the prebuild's build_items() lists."""
    words = {w.strip() for w in os.environ.get("CODA_TIMELINE_ITEMS", "").split(",") if w.strip()}
    if words - {"forward", "ablate"}:
        raise SystemExit(f"CODA_TIMELINE_ITEMS: unknown {sorted(words - {'forward', 'ablate'})}; use forward, ablate")
    return "forward" in words, "ablate" in words


def build_items(models=tuple(MODELS), tokens: int = 16384, ops=None, ablate: bool | None = None,
                forward: bool | None = None) -> list:
    """Every kernel the run with these options launches; forward and ablate default to CODA_TIMELINE_ITEMS's."""
    from coda_ext import graphs

    forward = item_options()[0] if forward is None else forward
    ablate = item_options()[1] if ablate is None else ablate
    items = []
    for g in rows(models, tokens, ops, forward):
        cfg = config(g)
        items += [(g.graph(), "bfloat16", cfg), (graphs.identity(), "bfloat16", cfg),
                  (g.graph(), "bfloat16", dataclasses.replace(cfg, timeline=False))]
        if ablate:
            items += [(graph, "bfloat16", cfg) for graph in row_ablations(g).values()]
    return items


def record(op, args) -> list:
    """The timeline buffer after one launch of `op` (warmed up before), as a list of per-tile slot lists."""
    import numpy as np
    import torch

    lib = op._lib
    for _ in range(3):
        op(*args[:2], **args[2])
    torch.cuda.synchronize()
    assert lib.coda_timeline_clear() == 0
    op(*args[:2], **args[2])
    torch.cuda.synchronize()
    buf = np.zeros(TILES * SLOTS, dtype=np.uint64)
    assert lib.coda_timeline_copy(ctypes.c_void_p(buf.ctypes.data), ctypes.c_ulonglong(buf.nbytes)) == 0
    return buf.reshape(TILES, SLOTS)


def analyse(buf) -> dict:
    """Medians (µs) of the epilogue's steps, the period per tile and its split, the loads' lead (module docstring)."""
    tiles = [row for row in buf if row[0] and row[1]]
    by_sm: dict = {}
    for r in tiles:
        by_sm.setdefault(int(r[126]), []).append(r)
    # each SM's clock over its whole span (globaltimer counts ns, coarsely: one span, not one tile); where no SM ran two
    # tiles (a small problem), the ratio of all tiles' summed spans
    spans = [(max(int(r[1]) for r in rs) - min(int(r[0]) for r in rs),
              max(int(r[125]) for r in rs) - min(int(r[124]) for r in rs)) for rs in by_sm.values() if len(rs) > 1]
    if spans:
        ghz = statistics.median(float(c) / float(ns) for c, ns in spans if ns > 0)
    else:
        ns = sum(int(r[125]) - int(r[124]) for r in tiles)
        if ns <= 0:
            raise ValueError("timeline: no tile spans any globaltimer time; the clock cannot be read")
        ghz = sum(float(r[1] - r[0]) for r in tiles) / ns
    us = 1e-3 / ghz   # µs per cycle
    out = {"tiles": len(tiles), "clock_ghz": ghz,
           "epilogue": statistics.median(float(r[1] - r[0]) * us for r in tiles)}
    for step in STEPS:
        (a, da), (b, db) = STEP_SLOTS[step]
        vals = [float(r[2 + 5 * (i + db) + b]) - float(r[2 + 5 * (i + da) + a]) for r in tiles
                for i in range(1, SUBTILES - 1) if r[2 + 5 * (i + da) + a] and r[2 + 5 * (i + db) + b]]
        out[step] = statistics.median(vals) * us if vals else None
    out["subtiles"] = statistics.median(sum(1 for s in range(SUBTILES) if r[2 + 5 * s]) for r in tiles)
    lead = [float(r[2 + 5 * s]) - float(r[83 + s]) for r in tiles for s in range(SUBTILES)
            if r[83 + s] and r[2 + 5 * s]]
    out["load_lead"] = statistics.median(lead) * us if lead else None
    out["loads_late"] = sum(1 for x in lead if x < 0) / len(lead) if lead else None
    # per SM: the tiles in the order their MMAs ended (epilogue starts), both warp groups
    periods, mma, bound, handover = [], [], [], []
    for rs in by_sm.values():
        seq = sorted((int(r[0]), int(r[1]), int(r[127])) for r in rs)
        last_end = {seq[0][2]: seq[0][1]}   # warp group -> its last epilogue's end
        for (b0, e0, _), (b1, e1, wg1) in itertools.pairwise(seq):
            periods.append(b1 - b0)
            handover.append(b1 - e0)
            ready = last_end.get(wg1, 0)   # the warp group's previous epilogue done
            start = max(b0, ready)
            mma.append(b1 - start)
            bound.append(max(0, ready - b0))
            last_end[wg1] = e1
    if not periods:   # one tile per SM: no schedule to split
        out.update(dict.fromkeys(("period", "period_mean", "mma", "mma_mean", "epilogue_bound_mean",
                                  "epilogue_bound_share", "epilogue_share", "handover")))
        return out
    out["period"] = statistics.median(periods) * us
    out["period_mean"] = statistics.fmean(periods) * us
    out["mma"] = statistics.median(mma) * us
    out["mma_mean"] = statistics.fmean(mma) * us
    out["epilogue_bound_mean"] = statistics.fmean(bound) * us
    out["epilogue_bound_share"] = sum(bound) / sum(periods)
    # ping-pong runs the two groups' epilogues one at a time: an epilogue share near 1 with a short handover (the next
    # epilogue starting as the previous one ends) is a kernel paced by its epilogues, which epilogue_bound cannot see
    # (begin() is recorded after the epilogue order barrier, end() before the TMA store drain)
    out["epilogue_share"] = out["epilogue"] / out["period"]
    out["handover"] = statistics.median(handover) * us
    return out


def plot(timelines: dict, path) -> None:
    """A few SMs' timelines (one row per warp group): each tile's epilogue, its subtiles' input waits in red."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(timelines), 1, figsize=(13, 2.2 * len(timelines)), squeeze=False)
    for ax, (label, (buf, ghz)) in zip(axes[:, 0], timelines.items()):
        tiles = [r for r in buf if r[0] and r[1] and int(r[126]) < 2]
        if not tiles:
            continue
        t0 = min(int(r[0]) for r in tiles)
        us = 1e-3 / ghz
        for r in tiles:
            y = int(r[126]) * 2 + int(r[127]) % 2
            ax.barh(y, (int(r[1]) - int(r[0])) * us, left=(int(r[0]) - t0) * us, color="tab:blue", height=0.8)
            for s in range(SUBTILES):
                a, b = int(r[2 + 5 * s]), int(r[3 + 5 * s])
                if a and b:
                    ax.barh(y, (b - a) * us, left=(a - t0) * us, color="tab:red", height=0.8)
        ax.set_yticks(range(4), ["SM0 group 2", "SM0 group 1", "SM1 group 2", "SM1 group 1"])
        ax.set_xlim(0, 200)
        ax.set_title(f"{label}: epilogues (blue) and their input waits (red); gaps are the warp group's MMAs",
                     fontsize=9)
    axes[-1, 0].set_xlabel("µs from the first epilogue")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> None:
    import torch

    import coda_ext as ce
    from coda_ext import graphs
    from tests.helpers import rand

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--forward", action="store_true", help="the forward ops (FORWARD_OPS) instead of the backward")
    p.add_argument("--ops", nargs="+", default=None, choices=list(OPS) + list(FORWARD_OPS),
                   help="default: every op of the family (OPS, or FORWARD_OPS with --forward)")
    p.add_argument("--ablate", action="store_true",
                   help="the dSwiGLU rows only (with --forward: every forward row), each ablation variant's "
                        "timeline beside the whole epilogue's")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    family = FORWARD_OPS if args.forward else OPS
    if args.ablate and not args.forward:
        args.ops = ["swiglu_backward_linear"]
    args.ops = args.ops or list(family)
    if set(args.ops) - set(family):
        p.error(f"--ops {sorted(set(args.ops) - set(family))} are not in the "
                f"{'forward' if args.forward else 'backward'} family; choose from {list(family)}")
    env = common.gpu_info()
    doc = {"env": env, "rows": []}
    timelines = {}
    for g in rows(args.models, args.tokens, args.ops, args.forward):
        cfg = config(g)
        gen = torch.Generator(device="cuda").manual_seed(0)
        row = {"op": g.op, "model": g.model, "M": g.M, "N": g.N, "K": g.K, "config": cfg.tag}
        for name, graph, c in (("fused", g.graph(), cfg), ("plain", graphs.identity(), cfg)):
            op = ce.compile(graph, "bfloat16", c)
            inputs = rand.op_inputs(op, g.M, g.N, g.K, gen)
            buf = record(op, inputs)
            row[name] = analyse(buf)
            if not doc["rows"]:   # the first row's fused kernel and plain twin are drawn
                timelines[f"{g.model} {g.op} {name}"] = (buf, row[name]["clock_ghz"])
        if args.ablate:   # each variant's timeline in the same config: what each part costs the MMAs beside it
            row["ablation"] = {}
            for vname, graph in row_ablations(g).items():
                op = ce.compile(graph, "bfloat16", cfg)
                row["ablation"][vname] = analyse(record(op, rand.op_inputs(op, g.M, g.N, g.K, gen)))
                v = row["ablation"][vname]
                print(f"    ablation {vname:22s} period {v['period_mean']:7.3f}  epilogue {v['epilogue']:7.3f} µs",
                      flush=True)
        # the timeline's own cost: the fused kernel with and without it, interleaved
        bare = ce.compile(g.graph(), "bfloat16", dataclasses.replace(cfg, timeline=False))
        traced = ce.compile(g.graph(), "bfloat16", cfg)
        a = rand.op_inputs(bare, g.M, g.N, g.K, gen)
        times = common.time_interleaved({"bare": lambda i: bare(a[0], a[1], **a[2]),
                                         "timeline": lambda i: traced(a[0], a[1], **a[2])}, 10)
        row["timeline_overhead"] = statistics.median(t / b for t, b in zip(times["timeline"], times["bare"]))
        doc["rows"].append(row)
        f, q = row["fused"], row["plain"]
        print(f"{g.model} {g.op} {g.M}x{g.N}x{g.K} [{cfg.tag}] timeline cost x{row['timeline_overhead']:.3f}; "
              f"{f['tiles']} tiles at {f['clock_ghz']:.2f} GHz", flush=True)
        for k in ("period", "period_mean", "mma", "mma_mean", "epilogue_bound_mean", "epilogue_bound_share",
                  "epilogue_share", "handover",
                  "epilogue", "subtiles", *STEPS, "load_lead", "loads_late"):
            fv, qv = f.get(k), q.get(k)
            print(f"    {k:22s} fused {fv if fv is None else round(fv, 3)!s:>9}   plain "
                  f"{qv if qv is None else round(qv, 3)!s:>9}", flush=True)
    stem = "epilogue_timeline" + ("_forward" if args.forward else "") + ("_ablation" if args.ablate else "")
    out = args.out or common.results_path(stem, gpu=env["gpu"])
    print(f"wrote {common.write_json(out, doc)}")
    plot(timelines, str(out).replace(".json", ".png"))


if __name__ == "__main__":
    main()
