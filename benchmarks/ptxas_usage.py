"""Registers and spills of the GEMM kernel of (graph, config) pairs, from ptxas -v (nvcc only, no GPU): whether
an epilogue fits a tile's register budget (a 128x192 ping-pong accumulator is 96 fp32 registers a thread).

    python -m benchmarks.ptxas_usage                    # the training step's epilogues in their candidate configs
    python -m benchmarks.ptxas_usage --jobs 4

Each kernel is compiled to a cubin with the project's nvcc flags (about a minute each). Prints one line per
kernel: registers, spill stores and loads (bytes), stack frame, and the mainloop's pipeline stages.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import re
import subprocess
import tempfile

#: ptxas -v lines of the GEMM entry (the finalize kernel's come first; the GEMM's are the last ones)
_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS = re.compile(r"Used (\d+) registers")


def cases() -> list:
    """(label, graph, config): the training step's heaviest epilogues in the configs the heuristic weighs."""
    from coda_ext import graphs, tuning

    kn = {c: dataclasses.replace(c, major="kn") for c in (tuning.PINGPONG, tuning.TALL_192_S8, tuning.LARGE)}
    return [
        ("dSwiGLU (swiglu_backward_linear)", graphs.swiglu_backward_linear(), kn[tuning.PINGPONG]),
        ("dSwiGLU (swiglu_backward_linear)", graphs.swiglu_backward_linear(), kn[tuning.TALL_192_S8]),
        ("dSwiGLU (swiglu_backward_linear)", graphs.swiglu_backward_linear(), kn[tuning.LARGE]),
        ("RMSNorm backward + dx_in", graphs.rms_norm_backward_linear(True), kn[tuning.PINGPONG]),
        ("SwiGLU forward with z", graphs.linear_swiglu(True, True), tuning.TALL_192_PAIRS),
        ("SwiGLU forward, y only", graphs.linear_swiglu(True, False), tuning.TALL_192_PAIRS),
        ("plain GEMM", graphs.identity(), tuning.TALL_192),
        ("LM head training logits", graphs.lm_head_cross_entropy_train(False), tuning.LARGE),
    ]


def usage(graph, config) -> dict:
    """{registers, spill_stores, spill_loads, stack, stages} of the GEMM kernel of (graph, config)."""
    import coda_ext as ce
    from coda_ext.codegen.constraints import mainloop_stages
    from coda_ext.jit import cache, paths

    source = ce.kernel_source(graph, "bfloat16", config).source
    with tempfile.TemporaryDirectory() as tmp:
        cu = f"{tmp}/kernel.cu"
        with open(cu, "w") as f:
            f.write(source)
        flags = [f for f in cache.NVCC_FLAGS if f not in ("-shared", "-Xcompiler=-fPIC")]
        cmd = [paths.nvcc_path(), *flags, "-cubin", "-Xptxas", "-v", *[f"-I{d}" for d in paths.include_dirs()],
               cu, "-o", f"{tmp}/kernel.cubin"]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    from coda_ext.graph.canonical import as_ir
    from coda_ext.passes import lower

    return {**parse(out), "stages": mainloop_stages(lower(as_ir(graph), "bfloat16"), "bfloat16", config)}


def parse(ptxas_output: str) -> dict:
    """{registers, spill_stores, spill_loads, stack} of the last entry function in ptxas -v's output."""
    spills, regs = _SPILL.findall(ptxas_output), _REGS.findall(ptxas_output)
    if not spills or not regs:
        raise ValueError("no 'Used N registers' / spill line in the ptxas output")
    stack, stores, loads = map(int, spills[-1])
    return {"registers": int(regs[-1]), "spill_stores": stores, "spill_loads": loads, "stack": stack}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=2)
    args = p.parse_args(argv)
    todo = cases()
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda c: usage(c[1], c[2]), todo))
    for (label, _, cfg), r in zip(todo, results):
        print(f"{label:34s} {cfg.tag:30s} {r['registers']:4d} registers, spills {r['spill_stores']:4d} B stored "
              f"{r['spill_loads']:4d} B loaded, stack {r['stack']:4d} B, {r['stages']} stages", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
