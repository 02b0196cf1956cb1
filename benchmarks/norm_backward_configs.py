"""The RMSNorm-backward epilogue (ops.rms_norm_backward_linear with dx_in, the gate/up dX GEMM of a
Llama layer) under several kernel configs against the cuBLAS GEMM of the same shape, interleaved:
the measurement behind tuning.heuristic's rule that no 128x256 config may leave its mainloop fewer
than three pipeline stages.

    python -m coda_ext prebuild benchmarks/norm_backward_configs.py -j 16
    python -m benchmarks.norm_backward_configs       # prints one line per (shape, config)
"""
from __future__ import annotations

import sys

from benchmarks import common
from tests.helpers import rand

SHAPES = {"1b": (32768, 2048, 8192), "8b": (8192, 4096, 14336)}   # tokens, d, F: the GEMM is M x d x 2F


def configs():
    import coda_ext as ce

    return [ce.KernelConfig(tile=(128, 256, 64), cluster=(2, 1), schedule="cooperative", swizzle=4, major="kn"),
            ce.KernelConfig(tile=(128, 128, 64), schedule="cooperative", swizzle=4, major="kn"),
            ce.KernelConfig(tile=(128, 128, 64), schedule="pingpong", swizzle=4, major="kn")]


def build_items():
    from coda_ext import graphs

    return [(graphs.rms_norm_backward_linear(True), "bfloat16", c) for c in configs()]


def main() -> None:
    import torch

    import coda_ext as ce
    from coda_ext import graphs

    g = graphs.rms_norm_backward_linear(True)
    print(common.gpu_info(), flush=True)
    for name, (M, d, F) in SHAPES.items():
        N2 = 2 * F
        sets = []
        gen = rand.generator(name, device="cuda")
        for _ in range(2):
            def r(*s, sc=1.0):
                return rand.randn(gen, *s, dtype=torch.bfloat16, scale=sc)
            sets.append(dict(dz=r(M, N2), w=r(N2, d, sc=N2 ** -0.5), x=r(M, d), rstd=rand.positive(gen, M),
                             g=r(d), zdz=rand.randn(gen, M), dx_in=r(M, d)))
        variants = {"cublas": lambda i: sets[i]["dz"] @ sets[i]["w"]}
        for c in configs():
            op = ce.compile(g, "bfloat16", c)
            variants[c.tag] = lambda i, op=op: op(sets[i]["dz"], sets[i]["w"].t(), x=sets[i]["x"], rstd=sets[i]["rstd"],
                                                norm_weight=sets[i]["g"], zdz=sets[i]["zdz"], inv_d=1.0 / d,
                                                dx_in=sets[i]["dx_in"])
        for f in variants.values():
            f(0)
            f(1)
        for k, v in common.summarize(common.time_interleaved(variants, 20), "cublas").items():
            print(name, k, f"{v['median_ms']:.3f} ms", f"{v['median_ratio_to_cublas']:.3f}x", flush=True)


if __name__ == "__main__":
    sys.exit(main())
