"""The kernels automatic fusion launches, one at a time: each distinct fused epilogue of a model's training
step (coda_ext.fusion.plan, traced on the CPU), timed alone at its GEMM shape in the config "auto" picks and
in other kernel configs, against the bare cuBLAS GEMM of the same shape and operand layout, beside the IO
model's prediction for it. Where a fused step loses to torch.compile because its kernels are slow (BERT's
GEMMs have K = 768 or 3072: a short mainloop under a long epilogue), this says by how much, kernel by
kernel, and which config would do better.

    python -m benchmarks.sweep_fusion [--models bert-base] [--reps 10] [--dry-run]
    python -m coda_ext prebuild benchmarks/sweep_fusion.py      # its kernels, in parallel, ahead

Results (--out): sweep_fusion_<gpu>.json in benchmarks/results/, <gpu> the GPU it runs on (h100, h200, …).
"""
from __future__ import annotations

import argparse
import sys

from benchmarks import bench_autofusion as af
from benchmarks import common

DEFAULT_MODELS = ("bert-base",)
#: The configs tried beside "auto"'s, in each kernel's operand layout: the two schedules' usual tiles.
ALTERNATIVES = (((128, 128, 64), (1, 1), "pingpong", 4), ((128, 192, 64), (1, 1), "pingpong", 8),
                ((64, 256, 64), (1, 1), "pingpong", 8), ((128, 128, 64), (1, 1), "cooperative", 4),
                ((128, 256, 64), (2, 1), "cooperative", 4), ((256, 128, 64), (1, 1), "cooperative", 4))


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
            k = cost.kernel(site.graph, site.dtype, tuple(low.mnk))
            found[key] = {"site": site, "mnk": tuple(low.mnk), "launches": 0,
                          "io_fused_us": k.fused_s * 1e6, "io_compile_us": k.compile_s * 1e6}
        found[key]["launches"] += 1
    return list(found.values())


def configs(site, mnk) -> list:
    """The auto config at mnk, then the alternatives that fit the graph (shared memory, segments), without
    repeats, each in the site's operand layout."""
    import coda_ext as ce
    from benchmarks.sweep_backward import fits
    from coda_ext.runtime.tuned import TunedOp

    auto = TunedOp(site.graph, site.dtype, tune=False, major=site.major).config_for(*mnk)
    out = {auto.tag: auto}
    for tile, cluster, schedule, swizzle in ALTERNATIVES:
        c = ce.KernelConfig(tile, cluster, schedule, swizzle=swizzle, major=site.major)
        if c.tag not in out and fits(site.graph, c):
            out[c.tag] = c
    return list(out.values())


def build_items(models=DEFAULT_MODELS) -> list:
    """Every kernel the sweep times: python -m coda_ext prebuild benchmarks/sweep_fusion.py."""
    items = {}
    for name in models:
        for k in kernels(name):
            for c in configs(k["site"], k["mnk"]):
                items[(k["site"].kernel_key, c.tag)] = (k["site"].graph, k["site"].dtype, c)
    return list(items.values())


def sweep(entry: dict, reps: int) -> dict:
    """One kernel in each of its configs, interleaved with the bare cuBLAS GEMM of its shape and layout."""

    import coda_ext as ce
    from tests.helpers import rand

    site, (M, N, K) = entry["site"], entry["mnk"]
    ops = {c.tag: ce.compile(site.graph, site.dtype, c) for c in configs(site, (M, N, K))}
    first = next(iter(ops.values()))
    gen = rand.generator("sweep_fusion", site.graph.digest(), device="cuda")
    sets = [rand.op_inputs(first, M, N, K, gen) for _ in range(2)]
    fns = {"cublas_gemm": lambda i: sets[i][0] @ sets[i][1].t()}
    for tag, op in ops.items():
        fns[tag] = lambda i, op=op: op(sets[i][0], sets[i][1], **sets[i][2])
    summary = common.summarize(common.time_interleaved(fns, reps), "cublas_gemm")
    auto = next(iter(ops))
    best = min(ops, key=lambda t: summary[t]["median_ms"])
    return {"graph": site.graph.digest()[:8], "major": site.major, "mnk": [M, N, K], "launches": entry["launches"],
            "io_fused_us": entry["io_fused_us"], "io_compile_us": entry["io_compile_us"], "auto": auto,
            "best": best, "variants": summary}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), choices=list(af.MODELS))
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--out", default=None, help="results JSON (default: sweep_fusion_<gpu>.json in benchmarks/results/)")
    p.add_argument("--dry-run", action="store_true", help="list the kernels and configs; no GPU")
    args = p.parse_args(argv)
    doc = {"env": None, "models": {}}
    for name in args.models:
        entries = kernels(name)
        print(f"{name}: {len(entries)} distinct fused kernels at their shapes, "
              f"{sum(e['launches'] for e in entries)} launches a step", flush=True)
        if args.dry_run:
            for e in entries:
                tags = [c.tag for c in configs(e["site"], e["mnk"])]
                print(f"  {e['site'].graph.digest()[:8]} {e['site'].major} {'x'.join(map(str, e['mnk']))} "
                      f"x{e['launches']}: IO model {e['io_fused_us']:.1f} us (compile-style "
                      f"{e['io_compile_us']:.1f}); configs {tags}")
            continue
        rows = []
        for e in entries:
            row = sweep(e, args.reps)
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
    out = common.write_json(args.out or common.results_path("sweep_fusion"), doc)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
