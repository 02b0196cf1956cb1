"""The "overlap" schedule against ping-pong of the same tile: epilogues that may run at the same time in both
math warp groups (csrc/kernels/sm90_pingpong_overlap.cuh), timed at one shape with the bare cuBLAS GEMM.

    python -m coda_ext prebuild benchmarks/bench_overlap.py && python -m benchmarks.bench_overlap
    python -m benchmarks.bench_overlap --llama --prebuild         # the Llama step's epilogues, longer K loops

Each graph's kernels in ping-pong, overlap with its epilogues ordered again (overlap_ordered: the buffers'
cost alone) and overlap, 128 x 128 tiles with swizzle 4, timed interleaved with cuBLAS (median of per-round
ratios; common.time_interleaved). Results (--out): overlap_<gpu>.json in benchmarks/results/.

--llama: the Llama training step's heavy epilogues at their own shapes (16384 tokens; 1B and 8B), where K is
2048 to 28672 and the mainloop is longer: SwiGLU forward with z, RMSNorm-scaled SwiGLU, the residual (operands
K-major, as the forward ops launch them) and the dSwiGLU and RMSNorm backward (W read N-major, as the backward
ops do), each kernel alone in the config "auto" picks and in ping-pong and overlap of 128 x 128 tiles (the
launch arguments of "auto" where it picks that tile) and 128 x 192 tiles in 1 x 1 and 2 x 1 clusters, beside
the plain GEMM in each of those configs but overlap (the mainloop alone) and cuBLAS. Results: overlap_llama_<gpu>.json.
"""
from __future__ import annotations

import argparse
import sys

#: name -> (graph builder in coda_ext.graphs, operand layout): a GELU forward with D and two stores, GPT-2's
#: GELU backward (tile load, column sums), the design graph's row reduction, the plain GEMM
GRAPHS = {"gelu_fwd": ("bias_gelu_stores", "kn"), "gelu_bwd": ("gelu_backward_dbias", "kk"),
          "row_reduce": ("design", "kk"), "plain": ("identity", "kk")}
SCHEDULES = ("pingpong", "overlap_ordered", "overlap")
TILE = (128, 128, 64)


def config(schedule: str, major: str):
    import coda_ext as ce

    return ce.KernelConfig(TILE, (1, 1), schedule, swizzle=4, major=major)


def build_items() -> list:
    """Every kernel the benchmark times, for `python -m coda_ext prebuild benchmarks/bench_overlap.py`."""
    from coda_ext import graphs

    return [(getattr(graphs, g)(), "bfloat16", config(s, major)) for g, major in GRAPHS.values() for s in SCHEDULES]


#: --llama rows: name -> (builder in coda_ext.graphs, its args, operand layout, {model: (M, N, K)})
LLAMA = {"swiglu_z_y": ("swiglu", (), "kk", {"1B": (16384, 16384, 2048), "8B": (16384, 28672, 4096)}),
         "rstd_swiglu": ("rstd_swiglu", (), "kk", {"1B": (16384, 16384, 2048), "8B": (16384, 28672, 4096)}),
         "residual": ("linear", (True,), "kk", {"1B": (16384, 2048, 8192), "8B": (16384, 4096, 14336)}),
         "dswiglu": ("swiglu_backward_linear", (), "kn", {"1B": (16384, 8192, 2048), "8B": (16384, 14336, 4096)}),
         "rms_backward_dx_in": ("rms_norm_backward_linear", (True,), "kn",
                                {"1B": (16384, 2048, 16384), "8B": (16384, 4096, 28672)})}
#: the tiles and clusters --llama times in ping-pong and overlap, each beside its plain GEMM
LLAMA_TILES = (((128, 128, 64), (1, 1)), ((128, 192, 64), (1, 1)), ((128, 192, 64), (2, 1)))


def llama_configs(graph, major: str, M: int, N: int, K: int, sms: int = 132) -> dict:
    """{label: config} of one --llama row: "auto" (the heuristic's), then ping-pong and overlap in each of
    LLAMA_TILES (128 x 128 with auto's swizzle and raster where auto is ping-pong 128 x 128, else swizzle 4;
    128 x 192 with swizzle 8), the configs the epilogue does not fit left out (overlap only where it does not build:
    its stage rule is what the rows measure)."""
    import dataclasses

    import coda_ext as ce
    from benchmarks.sweep_backward import fits as builds
    from coda_ext import tuning

    epilogue = ce.compile(graph, "bfloat16", "auto", major=major).epilogue
    auto = dataclasses.replace(tuning.heuristic(M, N, K, sms, epilogue, major), major=major)
    out = {"auto": auto}
    for tile, cluster in LLAMA_TILES:
        for schedule in ("pingpong", "overlap"):
            if tile[:2] == (128, 128) and auto.tile == tile and auto.schedule in ("pingpong", "overlap"):
                launch = dict(swizzle=auto.swizzle, raster=auto.raster)
            else:
                launch = dict(swizzle=4 if tile[1] == 128 else 8)
            cfg = tuning.fit_swizzle(ce.KernelConfig(tile, cluster, schedule, major=major, **launch), M, N)
            # overlap is timed wherever it builds (the heuristic's stage rule, tuning._overlap_fits, is what
            # these rows measure); 128 x 192 where the epilogue fits it
            if (schedule == "overlap" or tuning.fits(cfg, epilogue)) and builds(graph, cfg):
                out[cfg.tag] = cfg
    return out


def llama_items() -> list:
    """Every kernel --llama times (its plain twins included)."""
    from coda_ext import graphs

    items, seen = [], set()
    for g, args, major, shapes in LLAMA.values():
        graph = getattr(graphs, g)(*args)
        for M, N, K in shapes.values():
            for cfg in llama_configs(graph, major, M, N, K).values():
                for gr in (graph, graphs.identity()):
                    key = (gr.build().digest(), cfg.kernel.tag)
                    if key not in seen and (gr is graph or cfg.schedule != "overlap"):
                        seen.add(key)
                        items.append((gr, "bfloat16", cfg))
    return items


def llama(args) -> int:
    import torch

    import coda_ext as ce
    from benchmarks import common
    from coda_ext import graphs
    from tests.helpers import checks, rand

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for name, (g, gargs, major, shapes) in LLAMA.items():
        graph = getattr(graphs, g)(*gargs)
        for model, (M, N, K) in shapes.items():
            configs = llama_configs(graph, major, M, N, K, sms)
            ops = {label: ce.compile(graph, "bfloat16", cfg) for label, cfg in configs.items()}
            plain = {f"plain_{cfg.tag}": ce.compile(graphs.identity(), "bfloat16", cfg)
                     for cfg in configs.values() if cfg.schedule != "overlap"}
            gen = rand.generator("overlap_llama", name, model, device="cuda")
            sets = [rand.op_inputs(ops["auto"], M, N, K, gen) for _ in range(2)]
            outs = {label: [checks.nan_outputs(op, M, N) for _ in sets] for label, op in {**ops, **plain}.items()}
            fns = {label: (lambda i, op=op, label=label: op(sets[i][0], sets[i][1], out=outs[label][i], **sets[i][2]))
                   for label, op in ops.items()}
            fns.update({label: (lambda i, op=op, label=label: op(sets[i][0], sets[i][1], out=outs[label][i]))
                        for label, op in plain.items()})
            c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
            ws = [W if W.shape[0] == N else W.t() for _, W, _ in sets]
            fns["cublas_gemm"] = lambda i: torch.mm(sets[i][0], ws[i].t(), out=c)
            summary = common.summarize(common.time_interleaved(fns, args.reps), "cublas_gemm")
            rows.append({"case": name, "model": model, "graph": g, "major": major, "mnk": [M, N, K],
                         "auto": configs["auto"].tag, "variants": summary})
            print(f"{name} {model} {M}x{N}x{K} (auto {configs['auto'].tag}): " + "  ".join(
                f"{k} {v['median_ratio_to_cublas']:.3f}" for k, v in summary.items()), flush=True)
            sets = outs = fns = None
            torch.cuda.empty_cache()
    out = common.write_json(args.out or common.results_path("overlap_llama"), {"env": common.gpu_info(), "rows": rows})
    print(f"wrote {out}")
    return 0


def main(argv=None) -> int:
    import torch

    import coda_ext as ce
    from benchmarks import common
    from coda_ext import graphs
    from tests.helpers import checks, rand

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", type=int, nargs=3, default=(16384, 3072, 768), metavar=("M", "N", "K"))
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--out", default=None, help="results JSON (default: overlap_<gpu>.json in benchmarks/results/; "
                   "overlap_llama_<gpu>.json with --llama)")
    p.add_argument("--llama", action="store_true", help="the Llama step's epilogues at their shapes (see above)")
    p.add_argument("--prebuild", action="store_true", help="build the kernels in parallel first")
    p.add_argument("--prebuild-only", action="store_true", help="build the kernels, then stop")
    p.add_argument("--jobs", type=int, default=None, help="parallel builds (default: coda_ext.prebuild's)")
    args = p.parse_args(argv)
    if args.prebuild or args.prebuild_only:
        ce.prebuild(llama_items() if args.llama else build_items(), jobs=args.jobs)
        if args.prebuild_only:
            return 0
    if args.llama:
        return llama(args)
    M, N, K = args.shape
    rows = {}
    for name, (g, major) in GRAPHS.items():
        ops = {s: ce.compile(getattr(graphs, g)(), "bfloat16", config(s, major)) for s in SCHEDULES}
        A, W, inputs = rand.op_inputs(ops["pingpong"], M, N, K, rand.generator("overlap", name, device="cuda"))
        outs = {s: checks.nan_outputs(op, M, N) for s, op in ops.items()}
        w = W if W.shape[0] == N else W.t()      # (N, K) for cuBLAS, whatever the op's layout
        c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        fns = {s: (lambda i, s=s: ops[s](A, W, out=outs[s], **inputs)) for s in ops}
        fns["cublas_gemm"] = lambda i: torch.mm(A, w.t(), out=c)
        rows[name] = {"graph": g, "major": major, "variants": common.summarize(common.time_interleaved(fns, args.reps),
                                                                              "cublas_gemm")}
        print(name, " ".join(f"{k} {v['median_ms'] * 1e3:.1f} us ({v['median_ratio_to_cublas']:.3f}x)"
                             for k, v in rows[name]["variants"].items()), flush=True)
    out = common.write_json(args.out or common.results_path("overlap"),
                            {"env": common.gpu_info(), "mnk": [M, N, K], "tile": list(TILE), "graphs": rows})
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
