"""The "overlap" schedule against ping-pong of the same tile: epilogues that may run at the same time in both
math warp groups (csrc/kernels/sm90_pingpong_overlap.cuh), timed at one shape with the bare cuBLAS GEMM.

    python -m coda_ext prebuild benchmarks/bench_overlap.py && python -m benchmarks.bench_overlap

Each graph's kernels in ping-pong, overlap with its epilogues ordered again (overlap_ordered: the buffers'
cost alone) and overlap, 128 x 128 tiles with swizzle 4, timed interleaved with cuBLAS (median of per-round
ratios; common.time_interleaved). Results (--out): overlap_<gpu>.json in benchmarks/results/.
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


def main(argv=None) -> int:
    import torch

    import coda_ext as ce
    from benchmarks import common
    from coda_ext import graphs
    from tests.helpers import checks, rand

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", type=int, nargs=3, default=(16384, 3072, 768), metavar=("M", "N", "K"))
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--out", default=None, help="results JSON (default: overlap_<gpu>.json in benchmarks/results/)")
    args = p.parse_args(argv)
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
