"""Times epilogue graphs, at many shapes, against the bare cuBLAS GEMM, eager PyTorch and
torch.compile of the same math, and checks each against its speed goal.

    python -m benchmarks.bench_graphs [--cases identity,swiglu,...] [--shapes llama | M,N,K ...]
        [--configs auto|default|candidates] [--max-autotune] [--sustained] [--reps 30] [--out FILE.json] [--dry-run]
    python -m benchmarks.bench_graphs --merge PART1.json PART2.json ... --out FILE.json
    python -m benchmarks.bench_graphs --annotate FILE.json     # (re)compute the speed-of-light fields; no GPU

Cases and goals: benchmarks/graphs.py (the speed goals are time / bare cuBLAS GEMM time).
`--configs auto` (the default) runs config="auto": the shape heuristic of coda_ext.tuning picks
the kernel config per shape; the JSON records which. Eager and torch.compile run the graph's own
PyTorch reference (coda_ext.interpret in the op's dtype): the same unfused math for every graph,
with no hand-written baseline to drift. Timing is interleaved with L2 flushes (common.py; --sustained:
blocks of back-to-back calls at the GPU's power limit, as a training step runs, into graphs_sustained_<gpu>.json);
figures are medians of per-round ratios to cuBLAS. Writes JSON (GPU, clocks, versions, commit,
cold compile seconds per config, the wall time to compile a graph's configs in parallel, warm
load seconds; default: graphs_<gpu>.json in benchmarks/results/, <gpu> the GPU it runs on: h100,
h200, …) and a PNG beside it with one panel per case. Every row also gets its speed of light: the IO
model's time lower bound (coda_ext.analysis, for the GPU it runs on) ÷ the measured median, per variant (1.0 =
at the bound; the coda variants against the fused kernel of their config, torch.compile against the
compile-style sequence, eager against the unfused one, cuBLAS against the plain GEMM of config
"auto"). `--dry-run` lists what would run without a GPU.
Kernels: `python -m coda_ext prebuild benchmarks/bench_graphs.py` builds the default set ahead.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import coda_ext as ce
from benchmarks import common, goals, graphs
from coda_ext import tuning
from coda_ext.analysis.roofline import current_gpu, gpu_spec
from tests.helpers import rand

#: Llama-3-8B-like training and inference shapes (M, N, K) (the list of issue 3).
SHAPES = {
    "llama": [(16384, 28672, 4096), (16384, 4096, 14336), (16384, 6144, 4096), (16384, 16384, 2048),
              (16384, 2048, 8192), (8192, 128256, 4096),
              (128, 28672, 4096), (128, 4096, 14336), (128, 6144, 4096),
              (1024, 28672, 4096), (1024, 4096, 14336), (1024, 6144, 4096)],
    "design": [(8192, 8192, 4096)],
}
DEFAULT_CASES = tuple(graphs.CASES)
#: the variant that runs the identity graph (the bare GEMM) with the config coda_auto picked
PLAIN = "plain_same_config"


def configs(which: str) -> list:
    """What the coda variants are: "auto" (one op, config per shape), or fixed KernelConfigs."""
    return {"auto": ["auto"], "default": [ce.DEFAULT_CONFIG], "candidates": list(tuning.CANDIDATES)}[which]


def variant_name(cfg) -> str:
    return "coda_auto" if cfg == "auto" else f"coda_{cfg.tag}"


def build_items(case_names=DEFAULT_CASES, which="auto"):
    """Every case's kernels, and the plain GEMM (identity graph) of each config they may run: the
    `plain_same_config` variant that splits a row's ratio into mainloop and epilogue."""
    items = [(graphs.CASES[c][0](), "bfloat16", cfg) for c in case_names for cfg in configs(which)]
    identity = graphs.CASES["identity"][0]()
    twins = {c.tag: c for name in case_names if name != "identity"
             for c in concrete_configs(graphs.CASES[name][0](), configs(which))}
    return items + [(identity, "bfloat16", c) for c in twins.values()]


def concrete_configs(graph, cfgs) -> list[ce.KernelConfig]:
    """The kernels behind the variants: "auto" stands for every config its heuristic may pick."""
    out = []
    for cfg in cfgs:
        auto = [c for _, _, c in ce.compile(graph, "bfloat16", "auto").prebuild_items()] if cfg == "auto" else []
        for c in (auto if cfg == "auto" else (cfg,)):
            if c not in out:
                out.append(c)
    return out


def compile_costs(graph, dtype: str, cfgs, cold_set: bool) -> dict:
    """Cold nvcc seconds per config (recorded in the cache entry when it was built), warm load
    seconds, and with cold_set the wall time to build all of them in parallel into an empty cache."""
    import os
    import tempfile

    from coda_ext.jit.cache import cache_key, entry_dir

    out = {"configs": {}}
    if cold_set:
        saved = os.environ.get("CODA_EXT_CACHE_DIR")
        with tempfile.TemporaryDirectory() as scratch:
            os.environ["CODA_EXT_CACHE_DIR"] = scratch
            try:
                start = time.perf_counter()
                ce.prebuild([(graph, dtype, c) for c in cfgs], jobs=len(cfgs))
                out["set_parallel_compile_s"] = round(time.perf_counter() - start, 1)
                out["set_jobs"] = len(cfgs)
                out["machine_cpus"] = os.cpu_count()
            finally:
                if saved is None:
                    os.environ.pop("CODA_EXT_CACHE_DIR", None)
                else:
                    os.environ["CODA_EXT_CACHE_DIR"] = saved
    for cfg in cfgs:
        start = time.perf_counter()
        op = ce.compile(graph, dtype, cfg)
        warm = time.perf_counter() - start
        meta = entry_dir(cache_key(op.source)) / "meta.json"
        cold = json.loads(meta.read_text()).get("compile_seconds") if meta.is_file() else None
        out["configs"][cfg.tag] = {"cold_compile_s": cold, "warm_load_s": round(warm, 4)}
    return out


def bench_case(name: str, shapes, cfgs, reps: int, max_autotune: bool, cold_set: bool = False,
               sustained: bool = False) -> dict:
    import functools

    import torch
    import torch.nn.functional as F

    graph = graphs.CASES[name][0]().build()
    goal = graphs.CASES[name][1]
    concrete = concrete_configs(graph, cfgs)
    result = {"graph": graph.text(), "goal_ratio": goal,
              "compile": compile_costs(graph, "bfloat16", concrete, cold_set), "shapes": {}}
    meta = ce.compile(graph, "bfloat16", concrete[0])  # slots and dtype (the same for every config)
    ops = {variant_name(cfg): ce.compile(graph, "bfloat16", cfg) for cfg in cfgs}
    reference = functools.partial(ce.interpret, graph, compute_dtype=meta.dtype)
    for M, N, K in shapes:
        compiled = common.compile_for_one_shape(reference, max_autotune)
        # two input sets, rotated: each larger than L2 at the real shapes
        sets = [rand.op_inputs(meta, M, N, K, rand.generator(seed, device="cuda")) for seed in (0, 1)]
        variants = {"cublas_gemm": lambda i: F.linear(sets[i][0], sets[i][1])}
        for vname, op in ops.items():
            variants[vname] = lambda i, op=op: op(sets[i][0], sets[i][1], **sets[i][2])
        twin = plain_twin(name, ops, M, N, K)
        if twin is not None:
            variants[PLAIN] = lambda i: twin(sets[i][0], sets[i][1])
        variants["torch_compile"] = lambda i: compiled(sets[i][0], sets[i][1], **sets[i][2])
        variants["eager"] = lambda i: reference(sets[i][0], sets[i][1], **sets[i][2])
        for i in (0, 1):
            compiled(sets[i][0], sets[i][1], **sets[i][2])
        torch.cuda.synchronize()
        times = (common.time_sustained(variants, max(3, reps // 6)) if sustained
                 else common.time_interleaved(variants, reps))
        summary = common.summarize(times, "cublas_gemm")
        for s in summary.values():
            s["tflops"] = 2.0 * M * N * K / (s["median_ms"] * 1e-3) / 1e12
        entry = {"variants": summary}
        if "coda_auto" in ops:
            sms = torch.cuda.get_device_properties(0).multi_processor_count
            entry["auto_config"] = ops["coda_auto"].config_for(M, N, K, sms).tag
        coda = [v for v in summary if v.startswith("coda_")]
        best = min(coda, key=lambda v: summary[v]["median_ratio_to_cublas"])
        entry["coda_ratio"] = summary[best]["median_ratio_to_cublas"]
        if PLAIN in summary:
            entry["mainloop_ratio"] = summary[PLAIN]["median_ratio_to_cublas"]
            entry["epilogue_ratio"] = entry["coda_ratio"] / entry["mainloop_ratio"]
        entry["meets_goal"] = entry["coda_ratio"] <= goals.row_bound(name, (M, N, K))
        entry["beats_torch_compile"] = summary[best]["median_ratio_to_cublas"] < \
            summary["torch_compile"]["median_ratio_to_cublas"]
        result["shapes"][f"{M}x{N}x{K}"] = entry
        print(f"{name:12s} {M}x{N}x{K}: " + "  ".join(
            f"{v} {s['median_ratio_to_cublas']:.3f}" for v, s in summary.items() if v != "cublas_gemm")
            + f"  (cuBLAS {summary['cublas_gemm']['median_ms']:.3f} ms)", flush=True)
        sets = variants = None  # free this shape's tensors before the next one
        torch.cuda.empty_cache()
    return result


def plain_twin(name: str, ops: dict, M: int, N: int, K: int):
    """The identity graph with the config coda_auto runs at this shape (None for identity itself, or
    without an auto variant): its time / cuBLAS is the mainloop's share of the row, the fused kernel's
    time / its time the epilogue's."""
    import torch

    if name == "identity" or "coda_auto" not in ops:
        return None
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return ce.compile(graphs.CASES["identity"][0](), "bfloat16", ops["coda_auto"].config_for(M, N, K, sms))


def _config(variant: str, tag: str | None):
    """The KernelConfig a coda variant ran (coda_auto: the config "auto" picked, recorded as tag)."""
    tag = tag if variant == "coda_auto" else variant[len("coda_"):]
    cfg = tuning.config_by_tag(tag, tuning.CANDIDATES + tuning.HEURISTIC_CONFIGS) if tag else None
    return cfg if cfg is not None else "auto"


def speed_of_light(case: str, shape: str, entry: dict, gpu: str = "H100 SXM") -> dict:
    """{variant: {"bound_ms", "sol"}}: the IO model's time lower bound of what the variant runs and
    bound ÷ measured median (pure model, no GPU)."""
    from coda_ext.analysis import io_model

    M, N, K = (int(x) for x in shape.split("x"))
    build = graphs.CASES[case][0]
    bounds = {"cublas_gemm": io_model(graphs.CASES["identity"][0](), "bfloat16", (M, N, K), "auto", gpu)
              .variants["fused"]}
    model = io_model(build(), "bfloat16", (M, N, K), "auto", gpu)
    bounds["torch_compile"], bounds["eager"] = model.variants["compile"], model.variants["unfused"]
    if PLAIN in entry["variants"]:
        bounds[PLAIN] = io_model(graphs.CASES["identity"][0](), "bfloat16", (M, N, K),
                                 _config("coda_auto", entry.get("auto_config")), gpu).variants["fused"]
    for v in entry["variants"]:
        if v.startswith("coda_"):
            bounds[v] = io_model(build(), "bfloat16", (M, N, K), _config(v, entry.get("auto_config")), gpu) \
                .variants["fused"]
    out = {}
    for v, variant in bounds.items():
        if v in entry["variants"]:
            bound_ms = variant.seconds(model.gpu) * 1e3
            out[v] = {"bound_ms": bound_ms, "sol": bound_ms / entry["variants"][v]["median_ms"]}
    return out


def annotate(results: dict, gpu: str | None = None) -> dict:
    """Adds entry["speed_of_light"] to every (case, shape) of a results dict, in place, for the GPU the
    results were measured on (its name as recorded; else this machine's)."""
    try:
        model = gpu_spec(gpu).name if gpu else current_gpu()
    except ValueError:   # a GPU the analysis does not model: this machine's (or the default) instead
        model = current_gpu()
    for case, r in results.items():
        for shape, entry in r["shapes"].items():
            entry["speed_of_light"] = speed_of_light(case, shape, entry, model)
    return results


#: one color per variant in every panel (other coda configs take matplotlib's cycle)
COLORS = {"coda_auto": "tab:blue", PLAIN: "tab:gray", "torch_compile": "tab:orange", "eager": "tab:red"}


def plot(results: dict, path: pathlib.Path, gpu: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, axes = plt.subplots(len(names), 1, figsize=(11, 3.2 * len(names)), squeeze=False)
    for ax, name in zip(axes[:, 0], names):
        shapes = list(results[name]["shapes"])
        variants = [v for v in results[name]["shapes"][shapes[0]]["variants"] if v != "cublas_gemm"]
        width = 0.8 / len(variants)
        for j, v in enumerate(variants):
            ratios = [results[name]["shapes"][s]["variants"][v]["median_ratio_to_cublas"] for s in shapes]
            ax.bar([i + j * width for i in range(len(shapes))], ratios, width, label=v, color=COLORS.get(v))
        ax.axhline(1.0, color="k", lw=0.8)
        ax.axhline(results[name]["goal_ratio"], color="g", ls="--", lw=0.8, label="goal (training shapes)")
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(shapes))], shapes, fontsize=7, rotation=20)
        ax.set_ylabel("time / cuBLAS GEMM")
        ax.set_title(f"{name} (bf16, {gpu})", fontsize=9)
        ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def merge(paths: list[str]):
    """One result set from runs split by --cases (each run within one process, one GPU):
    the parts must come from the same GPU model, commit and settings; each part's env is kept."""
    parts = [json.loads(pathlib.Path(p).read_text()) for p in paths]
    first = parts[0]
    for p, part in zip(paths, parts):
        for key in ("gpu", "commit", "torch"):
            if part["env"].get(key) != first["env"].get(key):
                raise SystemExit(f"--merge: {p} has {key}={part['env'].get(key)!r}, "
                                 f"{paths[0]} has {first['env'].get(key)!r}")
        if (part["reps"], part["max_autotune"]) != (first["reps"], first["max_autotune"]):
            raise SystemExit(f"--merge: {p} was run with other --reps/--max-autotune than {paths[0]}")
    results = {}
    for p, part in zip(paths, parts):
        dup = set(results) & set(part["results"])
        if dup:
            raise SystemExit(f"--merge: case(s) {sorted(dup)} appear twice (again in {p})")
        results.update(part["results"])
    env = dict(first["env"])
    env["parts"] = [{"cases": list(part["results"]), "env": part["env"]} for part in parts]
    env["merge_note"] = "cases measured in separate processes (one per part), each interleaved within itself"
    return env, results, first["reps"], first["max_autotune"]


def print_table(results: dict) -> None:
    print(f"{'case':13s} {'shape':20s} {'goal':>6s} {'coda':>7s} {'compile':>8s} {'eager':>7s} {'SoL':>5s}  config")
    for name, r in results.items():
        for shape, e in r["shapes"].items():
            v = e["variants"]
            best = min((x for x in v if x.startswith("coda_")), key=lambda x: v[x]["median_ratio_to_cublas"])
            sol = e.get("speed_of_light", {}).get(best, {}).get("sol")
            print(f"{name:13s} {shape:20s} {r['goal_ratio']:6.3f} {e['coda_ratio']:7.3f} "
                  f"{v['torch_compile']['median_ratio_to_cublas']:8.3f} {v['eager']['median_ratio_to_cublas']:7.3f} "
                  f"{'' if sol is None else f'{sol:5.2f}':>5s}  "
                  f"{e.get('auto_config', '')}{'' if e['meets_goal'] else '  (misses the goal)'}")


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
    p.add_argument("--cases", default=",".join(DEFAULT_CASES), help=f"from benchmarks/graphs.py: {list(graphs.CASES)}")
    p.add_argument("--shapes", nargs="+", default=["llama"], help="presets (llama, design) or M,N,K")
    p.add_argument("--configs", choices=("auto", "default", "candidates"), default="auto")
    p.add_argument("--max-autotune", action="store_true", help="torch.compile(mode='max-autotune')")
    p.add_argument("--cold-set", action="store_true",
                   help="also time building each graph's configs in parallel into an empty cache")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--sustained", action="store_true", help="time at the GPU's power limit, as a training step runs: "
                   "blocks of back-to-back calls (common.time_sustained, a sixth of the rounds) instead of one call "
                   "after an L2 flush and a pause; results default to graphs_sustained_<gpu>.json")
    p.add_argument("--out", default=None, help="results JSON (default: graphs_<gpu>.json in benchmarks/results/, "
                   "<gpu> the GPU it ran on, with --merge the merged runs': h100, h200, …); the PNG goes beside it")
    p.add_argument("--dry-run", action="store_true", help="list what would run; needs no GPU")
    p.add_argument("--annotate", metavar="FILE", help="recompute the speed-of-light fields of a results file in place; "
                   "no GPU")
    p.add_argument("--merge", nargs="+", metavar="FILE",
                   help="combine the JSON files of runs split by --cases into --out (and its PNG); no GPU")
    args = p.parse_args(argv)
    names = [c for c in args.cases.split(",") if c]
    unknown = [c for c in names if c not in graphs.CASES]
    if unknown:
        p.error(f"unknown case(s) {unknown}; choose from {list(graphs.CASES)}")
    shapes = parse_shapes(args.shapes)
    cfgs = configs(args.configs)
    if args.dry_run:
        for name in names:
            digest = graphs.CASES[name][0]().build().digest()
            for M, N, K in shapes:
                print(f"{name} [{digest}] {M}x{N}x{K}: cublas_gemm, "
                      + ", ".join(variant_name(c) for c in cfgs) + ", torch_compile, eager")
        return 0

    if args.annotate:
        path = pathlib.Path(args.annotate)
        data = json.loads(path.read_text())
        annotate(data["results"], (data.get("env") or {}).get("gpu"))
        common.write_json(path, data)
        print_table(data["results"])
        print(f"wrote {path}")
        return 0
    if args.merge:
        env, results, reps, max_autotune = merge(args.merge)
    else:
        env = common.gpu_info()
        results = {name: bench_case(name, shapes, cfgs, args.reps, args.max_autotune, args.cold_set, args.sustained)
                   for name in names}
        env["timing"] = "sustained" if args.sustained else "interleaved"
        env["nvidia_smi_after"] = common.gpu_info()["nvidia_smi"]
        reps, max_autotune = args.reps, args.max_autotune
    annotate(results, env.get("gpu"))
    out = args.out or common.results_path("graphs_sustained" if args.sustained and not args.merge
                                          else "graphs", gpu=env.get("gpu") or "cpu")   # named by the GPU it ran on
    out = common.write_json(out, {"env": env, "reps": reps, "max_autotune": max_autotune, "results": results})
    plot(results, out.with_suffix(".png"), env["gpu"])
    print_table(results)
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
