"""The SwiGLU GEMMs beside the expert peer, forward and backward: QuACK's `gemm_act` (SwiGLU on interleaved gate/up
columns, y with and without the pre-activation z) and `gemm_dgated` (the same epilogue as coda_ext's dSwiGLU: dz
interleaved, y, and with its `dswiglu_dpreact_mod` the row sum Σ g·dg + u·du) against coda_ext's fused kernels,
their plain twins and the bare cuBLAS GEMM of the same shape, interleaved in one process; × cuBLAS, medians of
per-round ratios.

    pip install quack-kernels nvidia-cutlass-dsl[cu13]     # the peer (not a coda_ext dependency)
    python -m coda_ext prebuild benchmarks/peer_quack.py -j 16
    python -m benchmarks.peer_quack [--models 1B 8B] [--reps 20] [--sustained] [--plain]

Backward: acc = dy @ W_down (M × F, K = d): A = dy (M, d), B = W_down (d, F) as torch stores it (F contiguous); z
the saved (M, 2F) interleaved gate/up. Forward: acc = x @ W_gate_upᵀ (M × 2F, K = d), W (2F, d) as torch stores it.
QuACK runs its default config (tuned=False, as its users call it untuned) and, with --tuned, its autotuner's pick.
Results: peer_quack_<gpu>.json in the results folder (`--out` to choose).
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import statistics

from benchmarks import common, sweep_backward

OP = "swiglu_backward_linear"


def rows(models=("1B", "8B"), tokens: int = 16384) -> list:
    return sweep_backward.rows(models, tokens, (OP,))


def forward_graphs() -> dict:
    """name -> coda_ext's forward SwiGLU graph (the ready op linear_swiglu's, unscaled): y alone, and z and y."""
    from coda_ext.graphs import forward

    return {"coda_y": forward.linear_swiglu(False, False), "coda_z_y": forward.linear_swiglu(False, True)}


def forward_config(graph, M: int, N: int, K: int):
    """The heuristic's config for a forward graph at (M, N, K), operands as nn.Linear stores them ("kk")."""
    return sweep_backward.graph_heuristic(graph, M, N, K, "kk")


def other_gated_store(cfg):
    """cfg with the gated pair output written the other way (KernelConfig.gated_store), timed beside it."""
    import dataclasses

    return dataclasses.replace(cfg, gated_store="registers" if cfg.gated_store == "tma" else "tma")


def forward_shape(model: str, tokens: int) -> tuple:
    m = sweep_backward.MODELS[model]
    return tokens, 2 * m["F"], m["d"]


def build_items(models=("1B", "8B"), tokens: int = 16384) -> list:
    """coda_ext's kernels these rows run: the fused dSwiGLU and the forward SwiGLU graphs, each with its plain twin,
    in the heuristic's configs."""
    from coda_ext import graphs

    items = []
    for g in rows(models, tokens):
        cfg = sweep_backward.heuristic_config(g)
        items += [(g.graph(), "bfloat16", cfg), (graphs.identity(), "bfloat16", cfg)]
    for model in models:
        for graph in forward_graphs().values():
            cfg = forward_config(graph, *forward_shape(model, tokens))
            items += [(graph, "bfloat16", cfg), (graph, "bfloat16", other_gated_store(cfg)),
                      (graphs.identity(), "bfloat16", cfg)]
    return items + plain_items(models, tokens)


def quack_variants(A, B, z, tuned: bool) -> tuple:
    """({name: callable(i)} of QuACK's dSwiGLU GEMMs on (A, B, z), the dz buffer they write); the ones its installed
    version lacks are left out (and named on stderr)."""
    import sys

    import torch
    from quack import gemm_interface as qi

    M, N = A.shape[0], B.shape[1]
    dz = torch.empty(M, 2 * N, dtype=A.dtype, device=A.device)
    y = torch.empty(M, N, dtype=A.dtype, device=A.device)
    out = {"quack_dz_y": lambda i: qi.gemm_dact(A, B, z, activation="swiglu", dx_out=dz, postact_out=y,
                                                 tuned=tuned)}
    try:
        from quack.epilogue.library import dswiglu_dpreact_mod

        out["quack_dz_y_zdz"] = lambda i: dswiglu_dpreact_mod(A, B, z, out={"D": dz, "postact": y}, tuned=tuned)
    except ImportError as e:
        print(f"quack: no dswiglu_dpreact_mod ({e}); the row sum variant is left out", file=sys.stderr)
    return out, dz


def runs(fn, name: str) -> bool:
    """Whether one call of a QuACK variant runs; where this QuACK spells its API otherwise, says so (the variant is
    then left out, not timed)."""
    try:
        fn(0)
    except (TypeError, KeyError, ValueError, RuntimeError, NotImplementedError) as e:
        print(f"    {name}: failed ({type(e).__name__}: {e}); not timed", flush=True)
        return False
    return True


def check(A, B, z, fn, dz, name: str) -> float | None:
    """Max |dz − reference| / max |reference| of one QuACK call (fp32 reference): the peer computes what we time.
    None where the call fails (its message printed): that variant is then not timed."""
    import torch

    acc = A.float() @ B.float()
    g, u = z.float()[:, 0::2], z.float()[:, 1::2]
    s = torch.sigmoid(g)
    dg = acc * u * s * (1 + g * (1 - s))
    du = acc * g * s
    dz.fill_(float("nan"))
    if not runs(fn, name):
        return None
    ref = torch.stack((dg, du), dim=-1).reshape(dz.shape)
    err = float((dz.float() - ref).abs().max() / ref.abs().max())
    print(f"    {name}: dz max error {err:.2e} of max |dz|", flush=True)
    return err


def keep_checked(fns: dict, out, ref, message: str, variants: dict) -> dict:
    """{name: max |out - ref| / max |ref|} of each QuACK call that runs (out NaN-poisoned before it, the error
    printed with `message`); those calls join `variants`, the ones that fail are left out (runs says why)."""
    errors = {}
    for name, fn in fns.items():
        out.fill_(float("nan"))
        if not runs(fn, name):
            continue
        errors[name] = float((out.float() - ref).abs().max() / ref.abs().max())
        print(f"    {name}: " + message.format(errors[name]), flush=True)
        variants[name] = fn
    return errors


def summary(times: dict) -> dict:
    base = times["cublas"]
    return {k: {"ms": statistics.median(v), "ratio_to_cublas": statistics.median(t / b for t, b in zip(v, base))}
            for k, v in times.items()}


def report(row: dict) -> None:
    print(f"{row['model']} {row['op']} {row['M']}x{row['N']}x{row['K']} (coda {row['coda_config']}): " + ", ".join(
        f"{k} {x['ms']:.3f} ms x{x['ratio_to_cublas']:.3f}" for k, x in row["variants"].items()), flush=True)


def forward_row(model: str, M: int, N: int, K: int, timer, reps: int, tuned: bool, peer: bool = True) -> dict:
    """The forward SwiGLU at (M, N = 2F, K = d): cuBLAS (F.linear), coda_ext's graphs, each also with its gated output
    written the other way ("_gt_registers" / "_gt_tma": KernelConfig.gated_store), and their plain twins; with
    `peer`, QuACK's gemm_act with and without z, its y checked against an fp32 reference."""
    import torch
    import torch.nn.functional as F

    import coda_ext as ce
    from coda_ext import graphs
    from tests.helpers import rand

    gen = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(M, K, generator=gen, device="cuda").to(torch.bfloat16)
    W = (torch.randn(N, K, generator=gen, device="cuda") / K ** 0.5).to(torch.bfloat16)
    variants, configs = {"cublas": lambda i: F.linear(x, W)}, {}
    for name, graph in forward_graphs().items():
        cfg = forward_config(graph, M, N, K)
        fused, plain = ce.compile(graph, "bfloat16", cfg), ce.compile(graphs.identity(), "bfloat16", cfg)
        fa, pa = rand.op_inputs(fused, M, N, K, gen), rand.op_inputs(plain, M, N, K, gen)
        other = ce.compile(graph, "bfloat16", other_gated_store(cfg))
        oa = rand.op_inputs(other, M, N, K, gen)
        variants[name] = lambda i, op=fused, a=fa: op(a[0], a[1], **a[2])
        variants[f"{name}_gt_{other.config.gated_store}"] = lambda i, op=other, a=oa: op(a[0], a[1], **a[2])
        variants[name + "_plain"] = lambda i, op=plain, a=pa: op(a[0], a[1], **a[2])
        configs[name] = cfg.tag
    if not peer:
        return {"op": "swiglu", "model": model, "M": M, "N": N, "K": K, "coda_config": configs,
                "variants": summary(timer(variants, reps))}
    from quack import gemm_interface as qi

    z = torch.empty(M, N, dtype=x.dtype, device=x.device)
    y = torch.empty(M, N // 2, dtype=x.dtype, device=x.device)
    quack = {"quack_z_y": lambda i: qi.gemm_act(x, W.t(), activation="swiglu", preact_out=z, postact_out=y,
                                                 store_preact=True, tuned=tuned),
             "quack_y": lambda i: qi.gemm_act(x, W.t(), activation="swiglu", postact_out=y, store_preact=False,
                                              tuned=tuned)}
    acc = x.float() @ W.float().t()
    ref = F.silu(acc[:, 0::2]) * acc[:, 1::2]
    errors = keep_checked(quack, y, ref, "y max error {:.2e} of max |y|", variants)
    return {"op": "swiglu", "model": model, "M": M, "N": N, "K": K, "coda_config": configs, "quack_errors": errors,
            "variants": summary(timer(variants, reps))}


#: (tile, cluster, swizzle, raster) in which the plain GEMMs run side by side: QuACK's SM90 default (ping-pong
#: 128 x 192 in 2 x 1 clusters, swizzle 8, its tiles walked along N; coda_ext also at CUTLASS's heuristic raster and
#: swizzle 2, whose grid CUTLASS's scheduler pads less), 128 x 192 1 x 1 (the 8B forward's) along N and at
#: swizzle 4 (TALL_192 before it took swizzle 8 along N), and the ping-pong 128 x 128 1 x 1 the backward epilogues use
PLAIN_CONFIGS = (((128, 192), (2, 1), 8, "along_n"), ((128, 192), (2, 1), 8, "heuristic"),
                 ((128, 192), (2, 1), 2, "heuristic"), ((128, 192), (1, 1), 8, "along_n"),
                 ((128, 192), (1, 1), 4, "heuristic"), ((128, 128), (1, 1), 8, "heuristic"))


def plain_shapes(models, tokens: int) -> list:
    """(model, M, N, K) of the forward SwiGLU GEMMs and the dSwiGLU's GEMM (as K-major operands)."""
    out = []
    for model in models:
        m = sweep_backward.MODELS[model]
        out += [(model, tokens, 2 * m["F"], m["d"]), (model, tokens, m["F"], m["d"])]
    return out


def plain_items(models=("1B", "8B"), tokens: int = 16384) -> list:
    """coda_ext's plain GEMMs of the plain rows: the identity graph in each PLAIN_CONFIGS config and in the
    heuristic's."""
    from coda_ext import KernelConfig, graphs

    items = []
    for _, M, N, K in plain_shapes(models, tokens):
        items.append((graphs.identity(), "bfloat16", sweep_backward.graph_heuristic(graphs.identity(), M, N, K, "kk")))
        items += [(graphs.identity(), "bfloat16", KernelConfig(tile=(*t, 64), cluster=c, schedule="pingpong",
                                                                swizzle=s, raster=r)) for t, c, s, r in PLAIN_CONFIGS]
    return items


def plain_row(model: str, M: int, N: int, K: int, timer, reps: int) -> dict:
    """The bare GEMM D = x Wᵀ at (M, N, K): cuBLAS, QuACK's `gemm` in its default config and in each PLAIN_CONFIGS
    config, coda_ext's identity graph in the heuristic's config and in the same PLAIN_CONFIGS, each in the fitted
    grid and in CUTLASS's padded one; every QuACK output checked against cuBLAS's."""
    import dataclasses

    import torch
    import torch.nn.functional as F
    from quack import gemm_interface as qi
    from quack.gemm_config import GemmConfig

    import coda_ext as ce
    from coda_ext import KernelConfig, graphs

    gen = torch.Generator(device="cuda").manual_seed(2)
    x = torch.randn(M, K, generator=gen, device="cuda").to(torch.bfloat16)
    W = (torch.randn(N, K, generator=gen, device="cuda") / K ** 0.5).to(torch.bfloat16)
    ref = F.linear(x, W).float()
    out = torch.empty(M, N, dtype=x.dtype, device=x.device)
    variants = {"cublas": lambda i: F.linear(x, W)}
    quack = {"quack_default": lambda i: qi.gemm(x, W.t(), out=out, tuned=False)}
    cfgs = {"coda_heuristic": sweep_backward.graph_heuristic(graphs.identity(), M, N, K, "kk")}
    for (tm, tn), (cm, cn), sw, raster in PLAIN_CONFIGS:
        tag = f"{tm}x{tn}_{cm}x{cn}"
        if "quack_" + tag not in quack:   # QuACK's own swizzle (8) and raster
            qc = GemmConfig(tile_m=tm, tile_n=tn, cluster_m=cm, cluster_n=cn, pingpong=True, max_swizzle_size=8,
                            is_dynamic_persistent=False)
            quack["quack_" + tag] = lambda i, qc=qc: qi.gemm_tuned.fn(x, W.t(), out, config=qc)
        cfg = KernelConfig(tile=(tm, tn, 64), cluster=(cm, cn), schedule="pingpong", swizzle=sw, raster=raster)
        name = f"coda_{tag}_s{sw}" + ("" if raster == "heuristic" else f"_{raster}")
        cfgs[name] = cfg
        cfgs[name + "_padded"] = dataclasses.replace(cfg, grid="padded")   # CUTLASS's grid
    errors = keep_checked(quack, out, ref, "max error {:.2e} of max |D| against cuBLAS", variants)
    for name, cfg in cfgs.items():
        op = ce.compile(graphs.identity(), "bfloat16", cfg)
        variants[name] = lambda i, op=op: op(x, W)
    return {"op": "plain", "model": model, "M": M, "N": N, "K": K,
            "coda_config": {k: c.tag for k, c in cfgs.items()}, "quack_errors": errors,
            "variants": summary(timer(variants, reps))}


def main(argv=None) -> None:
    import torch

    import coda_ext as ce
    from coda_ext import graphs
    from tests.helpers import rand

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["1B", "8B"], choices=list(sweep_backward.MODELS))
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--sustained", action="store_true", help="time at the GPU's sustained (power-limited) clocks")
    p.add_argument("--tuned", action="store_true", help="QuACK's autotuned config instead of its default")
    p.add_argument("--no-forward", action="store_true", help="the dSwiGLU rows only")
    p.add_argument("--plain", action="store_true",
                   help="the bare GEMMs of these shapes only: cuBLAS, QuACK's and coda_ext's in the same configs")
    p.add_argument("--plain-shapes", nargs="+", default=None, metavar="M,N,K",
                   help="with --plain: these shapes instead of the models' (e.g. an LM head's 4096,128256,2048)")
    p.add_argument("--no-peer", action="store_true",
                   help="the forward rows without QuACK (coda_ext, its plain twins and cuBLAS; QuACK not needed)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.no_peer and (args.plain or args.no_forward):
        p.error("--no-peer times the forward rows only: leave out --plain and --no-forward")
    peer = {}
    if not args.no_peer:
        try:
            import quack
        except ImportError as e:
            raise SystemExit(f"peer_quack needs QuACK: pip install quack-kernels 'nvidia-cutlass-dsl[cu13]' ({e}); "
                             "--no-peer times the forward rows without it") from e
        peer["quack"] = getattr(quack, "__version__", "?")
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            peer["cutlass_dsl"] = importlib.metadata.version("nvidia-cutlass-dsl")
    env = {**common.gpu_info(), **peer}
    doc = {"env": env, "sustained": args.sustained, "quack_tuned": args.tuned, "rows": []}
    timer = common.time_sustained if args.sustained else common.time_interleaved
    if args.plain:
        shapes = ([("custom", *map(int, t.split(","))) for t in args.plain_shapes] if args.plain_shapes
                  else plain_shapes(args.models, args.tokens))
        for shape in shapes:
            doc["rows"].append(plain_row(*shape, timer, args.reps))
            report(doc["rows"][-1])
    for g in ([] if args.plain or args.no_peer else rows(args.models, args.tokens)):
        M, N, K = g.M, g.N, g.K
        gen = torch.Generator(device="cuda").manual_seed(0)
        A = torch.randn(M, K, generator=gen, device="cuda").to(torch.bfloat16)
        B = (torch.randn(K, N, generator=gen, device="cuda") / K ** 0.5).to(torch.bfloat16)
        z = torch.randn(M, 2 * N, generator=gen, device="cuda").to(torch.bfloat16)
        cfg = sweep_backward.heuristic_config(g)
        fused = ce.compile(g.graph(), "bfloat16", cfg)
        plain = ce.compile(graphs.identity(), "bfloat16", cfg)
        fa, pa = rand.op_inputs(fused, M, N, K, gen), rand.op_inputs(plain, M, N, K, gen)
        variants = {"cublas": lambda i: torch.mm(A, B),
                    "coda": lambda i: fused(fa[0], fa[1], **fa[2]),
                    "coda_plain": lambda i: plain(pa[0], pa[1], **pa[2])}
        quack_fns, dz = quack_variants(A, B, z, args.tuned)
        errors = {name: check(A, B, z, fn, dz, name) for name, fn in quack_fns.items()}
        variants.update({name: fn for name, fn in quack_fns.items() if errors[name] is not None})
        row = {"op": "dswiglu", "model": g.model, "M": M, "N": N, "K": K, "coda_config": cfg.tag,
               "quack_errors": errors, "variants": summary(timer(variants, args.reps))}
        doc["rows"].append(row)
        report(row)
    if not (args.no_forward or args.plain):
        for model in args.models:
            doc["rows"].append(forward_row(model, *forward_shape(model, args.tokens), timer, args.reps, args.tuned,
                                           peer=not args.no_peer))
            report(doc["rows"][-1])
    stem = "peer_quack" + "".join(f"_{k}" for k in ("plain", "sustained", "tuned", "no_peer") if getattr(args, k))
    print(f"wrote {common.write_json(args.out or common.results_path(stem, gpu=env['gpu']), doc)}")


if __name__ == "__main__":
    main()
