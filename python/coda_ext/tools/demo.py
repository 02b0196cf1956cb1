"""The main job: build an epilogue graph, show what it compiles to, compile it, and run it.

    python -m coda_ext demo [--M 4096 --N 4096 --K 4096] [--compile | --no-compile]

On an SM90 GPU the kernel is compiled (nvcc, a minute or more on first use, then cached), runs,
and is compared with the PyTorch reference of the same graph. Elsewhere the reference interpreter
runs on the CPU and the demo says what is missing to run the kernel; it compiles the kernel only
when asked (--compile: nvcc needs no GPU, the cached kernel then loads on a GPU machine).
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

import coda_ext as ce
from coda_ext import graphs


def build_graph() -> ce.Graph:
    """The README example (coda_ext.graphs.example): bias, SiLU, a residual tile, an extra store of an
    intermediate, the main output D and a per-row statistic."""
    return graphs.example()


def sm90_problem() -> str | None:
    """None on an SM90 GPU; else what is missing to run a kernel here."""
    if not torch.cuda.is_available():
        return "there is no CUDA GPU here (needs an SM90 GPU: H100/H200)"
    if torch.cuda.get_device_capability() != (9, 0):
        return f"{torch.cuda.get_device_name()} is not an SM90 GPU"
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m coda_ext demo", description=__doc__.splitlines()[0])
    p.add_argument("--M", type=int, default=4096)
    p.add_argument("--N", type=int, default=4096)
    p.add_argument("--K", type=int, default=4096)
    when = p.add_mutually_exclusive_group()
    when.add_argument("--compile", action="store_true",
                      help="compile the kernel even without an SM90 GPU (nvcc only, a minute or more)")
    when.add_argument("--no-compile", action="store_true", help="never run nvcc (show the source and interpret)")
    args = p.parse_args(argv)

    g = build_graph()
    ir = g.build()
    print(f"== the graph (canonical IR, digest {ir.digest()})\n{ir.text()}\n")
    source = ce.emit_source(g, torch.bfloat16)
    print("== what it compiles to (the emitted CUTLASS SM90 translation unit)\n" + source)

    problem = sm90_problem()
    gpu = problem is None
    missing = [] if gpu else [problem]
    op = None
    if args.no_compile:
        missing.append("compilation was skipped (--no-compile)")
    elif not gpu and not args.compile:
        missing.append("the kernel was not compiled: without an SM90 GPU nothing could run it; "
                       "`python -m coda_ext demo --compile` builds it anyway (nvcc, no GPU needed, "
                       "a minute or more; progress on stderr)")
    else:
        try:
            start = time.monotonic()
            op = ce.compile(g, torch.bfloat16)
            print(f"== compiled: {op}\n   library {op.library_path} ({time.monotonic() - start:.1f} s "
                  "including any cache hit)\n")
        except ce.CompileError as e:
            missing.append(f"the kernel could not be compiled: {e}")

    device = "cuda" if gpu else "cpu"
    M, N, K = (args.M, args.N, args.K) if gpu else (min(args.M, 256), min(args.N, 256), min(args.K, 256))
    gen = torch.Generator(device=device).manual_seed(0)
    A = (torch.randn(M, K, generator=gen, device=device) * K ** -0.25).to(torch.bfloat16)
    W = (torch.randn(N, K, generator=gen, device=device) * K ** -0.25).to(torch.bfloat16)
    bias = torch.randn(N, generator=gen, device=device).to(torch.bfloat16)
    residual = torch.randn(M, N, generator=gen, device=device).to(torch.bfloat16)
    ref = ce.interpret(g, A, W, bias=bias, residual=residual)  # fp32 PyTorch reference
    print(f"== reference interpreter (fp32 PyTorch on {device}), M={M} N={N} K={K}")
    for name, t in ref.items():
        print(f"   {name:6s} shape {tuple(t.shape)}  mean {t.float().mean().item():+.4f}")

    if op is not None and gpu:
        out = op(A, W, bias=bias, residual=residual)
        torch.cuda.synchronize()
        print("\n== compiled op on the GPU vs the fp32 reference")
        for name, t in out.items():
            err = (t.float() - ref[name].float()).abs().max().item()
            scale = ref[name].float().abs().max().item()
            print(f"   {name:6s} max |error| {err:.3e}   (max |value| {scale:.3e})")
        return 0
    print("\n== the compiled op was not run: " + "; ".join(missing))
    return 0


if __name__ == "__main__":
    sys.exit(main())
