"""Profiler view of the DESIGN.md graph vs the same mainloop as a plain GEMM (for ncu).

    ncu --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis \\
        -k regex:GemmUniversal --launch-skip 2 --launch-count 2 python benchmarks/profile_design.py

Runs each kernel (default config) three times at 8192x8192x4096 bf16: design first, then identity.
"""
from __future__ import annotations

import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests" / "gpu"))
import cases  # noqa: E402

import coda_ext as ce  # noqa: E402


def build_items():
    return [(cases.design(), "bfloat16", None), (cases.identity(), "bfloat16", None)]


def main() -> int:
    M, N, K = 8192, 8192, 4096
    g = torch.Generator(device="cuda").manual_seed(0)
    A = (torch.randn(M, K, generator=g, device="cuda") * K ** -0.25).to(torch.bfloat16)
    W = (torch.randn(N, K, generator=g, device="cuda") * K ** -0.25).to(torch.bfloat16)
    aux = torch.randn(M, N, generator=g, device="cuda").to(torch.bfloat16)
    bias = torch.randn(N, generator=g, device="cuda").to(torch.bfloat16)
    design = ce.compile(cases.design(), "bfloat16")
    identity = ce.compile(cases.identity(), "bfloat16")
    for _ in range(3):
        design(A, W, aux=aux, bias=bias)
    for _ in range(3):
        identity(A, W)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
