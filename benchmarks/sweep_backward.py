"""The backward epilogue GEMMs of the training step (benchmarks/backward_gemms.py: dSwiGLU, the RMSNorm backward
with and without dx_in, the plain dX) under several kernel configs, against the bare cuBLAS GEMM of the same
shape and the plain GEMM in the same config and layout (the mainloop's share), interleaved: the measurements
behind the heuristic's choices for operands read N-major ("kn"). Per config: op_ (the ready op as the step
calls it: its other kernels and allocations included), kernel_ (its fused GEMM kernel alone, random inputs)
and plain_ (the identity graph: the mainloop alone).

    python -m coda_ext prebuild benchmarks/sweep_backward.py -j 16
    python -m benchmarks.sweep_backward [--models 1B 8B] [--ops ...] [--configs TAG ...] [--launch s2,s8,along_m ...]
        [--sustained] [--reps 10] [--bounds-tests]

Each op runs as the ready op runs it, with its graph compiled in the swept config instead of "auto".
Results: a JSON file in the results folder, named after the sweep and the GPU it runs on (sweep_backward_<gpu>.json,
<gpu>: h100, h200, …; `--out` to choose).
"""
from __future__ import annotations

import argparse
import contextlib
import statistics

from benchmarks import backward_gemms, common

MODELS = {"8B": dict(d=4096, F=14336, hq=32, hkv=8, hd=128), "1B": dict(d=2048, F=8192, hq=32, hkv=8, hd=64)}
OPS = ("swiglu_backward_linear", "rms_norm_backward_linear_dx_in", "rms_norm_backward_linear", "linear_dx")
#: also sweepable by name (--ops): the down projection's forward GEMM (residual in its epilogue), the weight
#: gradients, and the LM head backward's GEMMs of each vocabulary chunk at the benchmarks' head (backward_gemms.LM_HEAD)
MORE_OPS = ("linear_residual",) + tuple(o for o in backward_gemms.OPS if o.startswith("weight_grad")) \
    + backward_gemms.LM_HEAD_OPS


#: (STAGES_C, STAGES_D) tried beside CUTLASS's choice (4, 2) where the epilogue loads tiles: deeper load
#: stages let the producer warp fetch more of the next tile's inputs during the mainloop; shallower ones leave the
#: mainloop another stage (the dSwiGLU in 128 x 128: 6 instead of 5 at (2, 1) or (1, 1)), for MMA warps that wait
#: on their operands (docs/measured.md, the dSwiGLU under Nsight Compute).
STAGED = ((6, 2), (8, 2), (2, 1), (1, 1), (4, 4))
#: Epilogue subtiles tried beside CUTLASS's 64 x 32 where the epilogue loads tiles: fewer, larger subtiles are fewer
#: rounds of the per-subtile load wait, shared-memory fence, barrier and TMA store issue, for an epilogue whose time
#: per tile (not its bytes) exceeds the other warp group's mainloop (the 1B dSwiGLU at K = 2048).
EPILOGUE_TILES = ((64, 64), (64, 128))
#: Variants of `auto` (its pair accesses kept) where the epilogue loads tiles, for MMA warps that wait on operand
#: stages while the epilogue streams its tiles through L2 (docs/measured.md): a smaller epilogue subtile (64 x 16:
#: half the epilogue's shared memory, a sixth mainloop stage for the dSwiGLU in 128 x 128), and clusters whose CTAs
#: share operand loads (2 x 1: W multicast, 2 x 2: A and W; fewer operand bytes read from L2 per MMA).
LEAN = (dict(epilogue_tile=(64, 16)), dict(epilogue_tile=(64, 16), epilogue_stages=(8, 2)), dict(cluster=(2, 1)),
        dict(cluster=(2, 2)))
#: The overlap schedule (two warp groups' epilogues may run at once: twice the epilogue's throughput per tile)
#: with shallower epilogue stages, so that its two copies of the epilogue's shared memory leave the mainloop as many
#: stages as ping-pong's one copy does (the dSwiGLU in 128 x 128: 5; at CUTLASS's (4, 2) the overlap kernel had 3).
OVERLAP_STAGED = ((2, 1), (1, 1))
#: The handoff schedule (cooperative 128 x 128 MMAs, the epilogue on two warp groups of its own, under the next
#: tile's MMAs; measured slower than ping-pong at these epilogues, docs/measured.md): 2 x 1 clusters, with CUTLASS's
#: epilogue stages and, where the epilogue loads tiles, (2, 1): beside its 32 KB of accumulator buffers the
#: dSwiGLU's epilogue at (4, 2) leaves the mainloop 2 stages, at (2, 1) 4.
HANDOFF = dict(tile=(128, 128, 64), cluster=(2, 1), schedule="handoff", swizzle=8)



def cooperative_direct(K, major: str) -> list:
    """Cooperative tiles with the tile inputs read straight into registers (no epilogue shared memory for them): the
    deep-K dX GEMMs' fastest mainloop (cooperative 128 x 256 2 x 1, 1.017x cuBLAS at the 1B RMSNorm backward's
    16384 x 2048 x 16384) keeps its 4 stages (2 with TMA tile loads, where the op ran 1.61x cuBLAS); its epilogue
    does not overlap the next tile's MMAs, a few microseconds beside a mainloop of about 140 per tile at K = 16384."""
    return [K((128, 256, 64), (2, 1), "cooperative", swizzle=4, major=major, tile_loads="direct"),
            K((256, 128, 64), (1, 2), "cooperative", swizzle=4, major=major, tile_loads="direct")]


def loads_tiles(graph) -> bool:
    """Whether the graph's epilogue TMA-loads tiles (the inputs epilogue_stages' first count stages); a builder Graph
    or its IR."""
    ir = graph.build() if hasattr(graph, "build") else graph
    return bool(ir.find("tile") or ir.find("pair_tile"))


def has_pairs(graph) -> bool:
    """Whether the graph's epilogue moves 32-bit pair tiles or pair stores through shared memory (pair_smem applies)."""
    ir = graph.build()
    return bool(ir.find("pair_tile") or ir.find("pair_store"))


def configs(major: str = "kn", loads: bool = False, auto=None, only=(), pairs: bool = False) -> list:
    """The swept configs: the fixed list and the heuristic's own choice `auto` (when given and not in the list);
    with loads, `auto` (else ping-pong 128x128) and ping-pong 128x192 2x1 again with the STAGED load stages, and
    `auto` and handoff 128x128 2x1 with the tile inputs read straight into registers (tile_loads="direct": no shared
    memory, so the mainloop gets its stages back); with pairs, `auto` with the pair tiles and pair stores accessed
    the other way (pair_smem "staggered" 4-byte halves, free of bank conflicts, or "vector" 8-byte accesses);
    with loads also `auto` with epilogue_cache="evict_first" (its tiles' L2 lines go first) and "prefetch" (each tile's
    inputs asked of L2 as the producer warp starts it), with tile_stores="direct" (its tile outputs written from
    registers), and the LEAN variants.
    `only`: keep only the configs with these tags."""
    import dataclasses

    import coda_ext as ce

    K = ce.KernelConfig
    base = _configs(K, major)
    if auto is not None and auto not in base:
        base.append(auto)
    staged = auto or base[0]
    out = base if not loads else base + [dataclasses.replace(staged, epilogue_stages=s) for s in STAGED] + \
        [dataclasses.replace(base[3], epilogue_stages=STAGED[0])] + \
        [dataclasses.replace(staged, epilogue_tile=t) for t in EPILOGUE_TILES
         if staged.schedule != "cooperative" and staged.tile[1] % t[1] == 0] + \
        [dataclasses.replace(staged, schedule="overlap", epilogue_stages=s) for s in OVERLAP_STAGED
         if staged.schedule == "pingpong" and staged.cluster in ((1, 1), (2, 1), (1, 2))] + \
        [K(**HANDOFF, major=major, epilogue_stages=(2, 1)), dataclasses.replace(staged, tile_loads="direct"),
         K(**HANDOFF, major=major, epilogue_stages=(2, 1), tile_loads="direct")] + cooperative_direct(K, major)
    if loads:   # `auto` with its TMA tile loads and stores marked evict-first in L2, its tiles prefetched into L2;
        # the LEAN variants
        out = out + [dataclasses.replace(staged, epilogue_cache=c) for c in ("evict_first", "prefetch")] + \
            [dataclasses.replace(staged, tile_stores="direct")] + \
            [dataclasses.replace(staged, **v) for v in LEAN if staged.schedule == "pingpong"]
    if pairs:   # the other way of accessing the pairs than `auto`'s
        other = "vector" if staged.pair_smem == "staggered" else "staggered"
        out = out + [dataclasses.replace(staged, pair_smem=other)]
    return [c for c in out if not only or c.tag in only]


def heuristic_config(g):
    """The config "auto" picks for row g (its shape, epilogue and operand layout), as the ready op would."""
    return graph_heuristic(g.graph(), g.M, g.N, g.K, g.major)


def graph_heuristic(graph, M: int, N: int, K: int, major: str):
    """The heuristic's config for `graph` (a builder Graph) at (M, N, K) with operands laid out as `major`."""
    import dataclasses

    from coda_ext import tuning
    from coda_ext.passes import lower

    epilogue = tuning.Epilogue.of(lower(graph.build(), "bfloat16"))
    return dataclasses.replace(tuning.heuristic(M, N, K, tuning.DEFAULT_SMS, epilogue, major), major=major)


def _configs(K, major: str) -> list:
    return [K((128, 128, 64), (1, 1), "pingpong", swizzle=4, major=major),
            K((128, 128, 64), (2, 1), "pingpong", swizzle=8, major=major),
            K((128, 192, 64), (1, 1), "pingpong", swizzle=8, major=major),
            K((128, 192, 64), (2, 1), "pingpong", swizzle=8, major=major),
            K((64, 256, 64), (1, 1), "pingpong", swizzle=8, major=major),
            K((128, 256, 64), (2, 1), "cooperative", swizzle=4, major=major),
            K((128, 256, 64), (2, 1), "streamk", swizzle=4, major=major),
            K((128, 128, 64), (1, 1), "cooperative", swizzle=4, major=major),
            K((256, 128, 64), (1, 1), "cooperative", swizzle=4, major=major),
            K(**HANDOFF, major=major)]


def fits(graph, cfg) -> bool:
    """Whether the graph's epilogue fits the config (shared memory, segments): configs that do not are skipped."""
    import coda_ext as ce

    try:
        ce.kernel_source(graph, "bfloat16", cfg)
    except ce.UnsupportedError:
        return False
    return True


def rows(models=tuple(MODELS), tokens: int = 16384, ops=OPS) -> list:
    head = backward_gemms.LM_HEAD if any(op in backward_gemms.LM_HEAD_OPS for op in ops) else None
    return backward_gemms.cases({m: MODELS[m] for m in models}, (tokens,), ops, head)


def launch_variants(cfgs, launch=()) -> list:
    """cfgs, each followed by its variants at the launch arguments `launch` names ("s<swizzle>", "along_m",
    "along_n"; every swizzle with every raster, the config's own where a kind is not named): the same kernel."""
    import dataclasses

    swizzles = [int(x[1:]) for x in launch if x.startswith("s")]
    rasters = [x for x in launch if x.startswith("along_")]
    out = []
    for cfg in cfgs:
        for s in swizzles or [cfg.swizzle]:
            for r in rasters or [cfg.raster]:
                v = dataclasses.replace(cfg, swizzle=s, raster=r)
                if v not in out:
                    out.append(v)
        if cfg not in out:
            out.append(cfg)
    return out


def row_configs(g, only=(), launch=()) -> list:
    cfgs = configs(g.major, loads_tiles(g.graph()), heuristic_config(g), only, has_pairs(g.graph()))
    return launch_variants(cfgs, launch)


def build_items(models=tuple(MODELS), tokens: int = 16384, ops=OPS, only=(), launch=()) -> list:
    """(graph, dtype, config) of every op graph and its plain twin (identity) in every swept config."""
    from coda_ext import graphs

    items, seen = [], set()
    for g in rows(models, tokens, ops):
        for cfg in row_configs(g, only, launch):
            if not fits(g.graph(), cfg):
                continue
            # the plain twin measures the mainloop in cfg's tiles: the staged configs share their base's
            for graph in (g.graph(),) + (() if cfg.epilogue_stages else (graphs.identity(),)):
                key = (graph.build().digest(), cfg.tag)
                if key not in seen:
                    seen.add(key)
                    items.append((graph, "bfloat16", cfg))
    return items


@contextlib.contextmanager
def bounds_tests_kept():
    """Inside, the emitter keeps every reduction's per-element bounds test (codegen/oob.py's analysis overridden):
    a kernel as it was before the analysis learned to drop a test, beside the kernel without it (--bounds-tests)."""
    import importlib

    emit = importlib.import_module("coda_ext.codegen.emit")   # the module (the package exports a function emit)
    original = emit.reduction_needs_bounds_check
    emit.reduction_needs_bounds_check = lambda graph, node: True
    try:
        yield
    finally:
        emit.reduction_needs_bounds_check = original


def prebuild(items, bounds_tests: bool = False) -> None:
    """Builds the items' kernels in parallel; with bounds_tests also, in the same pool, each op kernel emitted with
    its bounds tests kept where that is another kernel."""
    import concurrent.futures

    import coda_ext as ce
    from coda_ext.jit import cached, kernel_source, nvcc

    kept = []
    if bounds_tests:
        from coda_ext import graphs

        identity = graphs.identity().build().digest()
        ops = [it for it in items if it[0].build().digest() != identity]
        plain = {kernel_source(*it).source for it in ops}
        with bounds_tests_kept():
            kept = [ks for ks in (kernel_source(*it) for it in ops) if ks.source not in plain and not cached(ks)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(kept) + 1) as pool:
        futures = [pool.submit(nvcc.build, ks.source, ks.label) for ks in kept]
        ce.prebuild(items)
        for f in futures:
            f.result()


#: The ops fixed_config compiled, kept across calls: each timed call enters fixed_config again, and compiling the
#: graph anew there (its source emitted and hashed, its library looked up) was host time inside the timed span
_FIXED_OPS: dict = {}


@contextlib.contextmanager
def fixed_config(cfg):
    """The ready ops compile their graph in `cfg` instead of "auto" while inside."""
    from coda_ext.ops import common as ops_common
    from coda_ext.runtime.api import compile as compile_graph

    original = ops_common.graph_op

    def graph_op(build, dtype, config, *args, major="kk"):
        key = (build, dtype, args, major, cfg)
        if key not in _FIXED_OPS:
            _FIXED_OPS[key] = compile_graph(build(*args), dtype, cfg, major=major)
        return _FIXED_OPS[key]

    ops_common.graph_op = graph_op
    try:
        yield
    finally:
        ops_common.graph_op = original


def sweep(g, reps: int, only=(), sustained: bool = False, launch=(), bounds_tests: bool = False) -> dict:
    import torch

    import coda_ext as ce
    from coda_ext import graphs
    from tests.helpers import rand

    sets = [backward_gemms.inputs(g, i) for i in range(2)]
    variants = {"cublas": lambda i: torch.mm(*(lambda a, w: (a, w.t()))(*backward_gemms.operands(g, sets[i])))}
    for cfg in row_configs(g, only, launch):
        if not fits(g.graph(), cfg):
            continue

        def fused(i, cfg=cfg):
            with fixed_config(cfg):
                return backward_gemms.call(g, sets[i])
        if not sustained:   # the op's own extra kernels and allocations: timed one call at a time only
            variants[f"op_{cfg.tag}"] = fused
        # the fused GEMM kernel alone (the op's other kernels and allocations out): the epilogue's own cost
        kernel = ce.compile(g.graph(), "bfloat16", cfg)
        gen = torch.Generator(device="cuda").manual_seed(len(variants))
        args = [rand.op_inputs(kernel, g.M, g.N, g.K, gen) for _ in range(2)]
        variants[f"kernel_{cfg.tag}"] = lambda i, k=kernel, a=args: k(a[i][0], a[i][1], **a[i][2])
        if bounds_tests:   # the same kernel with its reductions' bounds tests kept, where the analysis drops one
            with bounds_tests_kept():
                kept = ce.compile(g.graph(), "bfloat16", cfg)
            if kept.source != kernel.source:
                variants[f"kernel_{cfg.tag}_bounds_kept"] = lambda i, k=kept, a=args: k(a[i][0], a[i][1], **a[i][2])
        if not cfg.epilogue_stages:
            plain = ce.compile(graphs.identity(), "bfloat16", cfg)
            variants[f"plain_{cfg.tag}"] = lambda i, p=plain: p(*backward_gemms.operands(g, sets[i]))
    times = common.time_sustained(variants, reps) if sustained else common.time_interleaved(variants, reps)
    out = {}
    for name, ts in times.items():
        out[name] = {"median_ms": statistics.median(ts),
                     "ratio_to_cublas": statistics.median(t / b for t, b in zip(ts, times["cublas"]))}
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--ops", nargs="+", default=list(OPS), choices=list(OPS + MORE_OPS))
    p.add_argument("--configs", nargs="+", default=(), metavar="TAG",
                   help="only the configs with these tags (KernelConfig.tag, as printed)")
    p.add_argument("--launch", default="", help="comma-separated launch arguments to time each config at besides its "
                   "own (the same kernel): s1, s2, s4, s8, s16 (swizzle), along_m, along_n (raster)")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--sustained", action="store_true",
                   help="time each variant as blocks of back-to-back calls at the GPU's sustained (power-limited) "
                        "clocks (common.time_sustained) instead of one call after an L2 flush and a pause")
    p.add_argument("--bounds-tests", action="store_true",
                   help="also time each op kernel with its reductions' per-element bounds tests kept, where "
                        "codegen/oob.py's analysis drops one (kernel_<tag>_bounds_kept)")
    p.add_argument("--out", default=None, help="results JSON (default: sweep_backward_<gpu>.json in "
                   "benchmarks/results/, <gpu> the GPU it runs on: h100, h200, …)")
    args = p.parse_args(argv)

    env = common.gpu_info()
    # every kernel of the rows and configs asked for, in parallel (each would otherwise build on its first call)
    launch = tuple(x for x in args.launch.split(",") if x)
    prebuild(build_items(tuple(args.models), args.tokens, tuple(args.ops), tuple(args.configs), launch),
             args.bounds_tests)
    doc = {"env": env, "timing": "sustained" if args.sustained else "interleaved", "rows": []}
    for g in rows(args.models, args.tokens, args.ops):
        res = sweep(g, args.reps, tuple(args.configs), args.sustained, launch, args.bounds_tests)
        doc["rows"].append({"op": g.op, "model": g.model, "M": g.M, "N": g.N, "K": g.K, "major": g.major,
                            "variants": res})
        best = min((v for v in res if v.startswith("op_" if not args.sustained else "kernel_")),
                   key=lambda v: res[v]["ratio_to_cublas"])
        print(f"{g.model} {g.op} {g.M}x{g.N}x{g.K}: best {best} {res[best]['ratio_to_cublas']:.3f}", flush=True)
        for v, r in res.items():
            print(f"    {v:45s} {r['median_ms']:8.3f} ms  x{r['ratio_to_cublas']:.3f}", flush=True)
    out = args.out or common.results_path("sweep_backward" + ("_sustained" if args.sustained else ""), gpu=env["gpu"])
    print(f"wrote {common.write_json(out, doc)}")


if __name__ == "__main__":
    main()
