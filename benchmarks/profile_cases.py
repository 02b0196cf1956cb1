"""Runs benchmark graphs and the plain GEMM of the same kernel config once each, for a profiler:
the difference between a case's kernel and its identity twin is what the epilogue costs.

    ncu --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,\\
sm__throughput.avg.pct_of_peak_sustained_elapsed,launch__registers_per_thread \\
        -k regex:device_kernel --csv python -m benchmarks.profile_cases --cases bias_silu,swiglu \\
        --shape 16384,6144,4096

Kernels run in the order printed: for each case, the case's kernel (config="auto"'s choice at the
shape), then the identity graph with that config. Reductions add a finalize kernel after each.

    python -m benchmarks.profile_cases --family dswiglu [--config 0]

runs instead the variants of an ablation family of benchmarks/ablate_epilogue.py (the plain GEMM first)
once each at each of the family's shapes, in its config number --config.
"""
from __future__ import annotations

import argparse
import sys

import torch

import coda_ext as ce
from benchmarks import graphs
from tests.helpers import rand


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default="bias_silu,residual,swiglu,store_rowsum,design")
    p.add_argument("--shape", default="16384,6144,4096", help="M,N,K")
    p.add_argument("--family", default=None, help="an ablation family of benchmarks.ablate_epilogue")
    p.add_argument("--config", type=int, default=0, help="with --family: the index of the family's config")
    args = p.parse_args(argv)
    if args.family:
        return family(args.family, args.config)
    M, N, K = (int(x) for x in args.shape.split(","))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for name in args.cases.split(","):
        graph = graphs.CASES[name][0]()
        cfg = ce.compile(graph, "bfloat16", "auto").config_for(M, N, K, sms)
        op = ce.compile(graph, "bfloat16", cfg)
        twin = ce.compile(graphs.identity(), "bfloat16", cfg)
        A, W, inputs = rand.op_inputs(op, M, N, K, rand.generator(0, device="cuda"))
        print(f"{name} {M}x{N}x{K} {cfg.tag}: case kernel, then identity twin", flush=True)
        op(A, W, **inputs)
        twin(A, W)
        torch.cuda.synchronize()
    return 0


def family(name: str, index: int) -> int:
    from benchmarks import ablate_epilogue as ab

    make, cfgs, shapes = ab.FAMILIES[name]
    cfg = cfgs[index]
    for label, (M, N, K) in (shapes or {"": (8192, 8192, 4096)}).items():
        for variant, graph in make().items():
            op = ce.compile(graph, "bfloat16", cfg)
            A, W, inputs = rand.op_inputs(op, M, N, K, rand.generator(0, device="cuda"))
            print(f"{label} {M}x{N}x{K} {cfg.tag}: {variant}", flush=True)
            op(A, W, **inputs)
            torch.cuda.synchronize()
            del A, W, inputs
    return 0


if __name__ == "__main__":
    sys.exit(main())
