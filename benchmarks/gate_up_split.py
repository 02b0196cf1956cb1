"""The gate/up projection as one GEMM of N = 2F against two of N = F, in cuBLAS and in coda_ext's
`linear_swiglu_train` (rstd, z and y stored), at the Llama training shapes (16384 tokens; 8B-like
d 4096, F 14336; 1B-like d 2048, F 8192): whether the fused layout's wide GEMM costs anything by itself.

    python -m benchmarks.gate_up_split [--reps 15]

Interleaved rounds, L2 flushed (common.time_interleaved); ratios to the two cuBLAS GEMMs of N = F (what eager
PyTorch runs for separate gate and up projections). Results: gate_up_split_<gpu>.json in benchmarks/results/.
"""
from __future__ import annotations

import argparse
import sys

import torch

from benchmarks import common
from coda_ext import ops

SHAPES = {"8B": (16384, 4096, 14336), "1B": (16384, 2048, 8192)}   # tokens, d, F


def variants(M: int, d: int, F: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(M, d, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(2 * F, d, device="cuda", dtype=torch.bfloat16, generator=g) * d ** -0.5
    r = torch.rand(M, device="cuda", dtype=torch.float32, generator=g) + 0.5
    gate, up = w[0::2].contiguous(), w[1::2].contiguous()     # eager's two weights
    halves = (w[:F].contiguous(), w[F:].contiguous())           # the interleaved weight's two halves
    return {
        "cublas_two_F": lambda i: (x @ gate.t(), x @ up.t()),
        "cublas_one_2F": lambda i: x @ w.t(),
        "swiglu_train_one_2F": lambda i: ops.linear_swiglu_train(x, w, r),
        "swiglu_train_two_F": lambda i: (ops.linear_swiglu_train(x, halves[0], r),
                                         ops.linear_swiglu_train(x, halves[1], r)),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    doc = {"env": common.gpu_info(), "shapes": {}}
    for label, (M, d, F) in SHAPES.items():
        s = common.summarize(common.time_interleaved(variants(M, d, F), args.reps, warmup=3), "cublas_two_F")
        doc["shapes"][label] = {"M": M, "d": d, "F": F, "results": s}
        for name, v in s.items():
            print(f"{label} {name:22s} {v['median_ms']:7.3f} ms  x{v['median_ratio_to_cublas']:.3f}", flush=True)
    common.write_json(args.out or common.results_path("gate_up_split", gpu=doc["env"]["gpu"]), doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
