"""Runs benchmark graphs and the plain GEMM of the same kernel config once each, for a profiler:
the difference between a case's kernel and its identity twin is what the epilogue costs.

    ncu --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,\\
sm__throughput.avg.pct_of_peak_sustained_elapsed,launch__registers_per_thread \\
        -k regex:device_kernel --csv python -m benchmarks.profile_cases --cases bias_silu,swiglu \\
        --shape 16384,6144,4096

Kernels run in the order printed: for each case, the case's kernel (config="auto"'s choice at the
shape), then the identity graph with that config. Reductions add a finalize kernel after each.
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
    args = p.parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())
