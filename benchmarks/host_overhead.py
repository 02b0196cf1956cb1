"""The host's time per fused call, on any machine: each distinct fused kernel of a model's training step
(automatic fusion, planned on the CPU) called through the same path a compiled step takes
(coda_ext.fusion.op: operand views, inputs prepared, the op's checks and output allocation, the results
shaped), with the kernel launch itself stubbed out — no GPU, no kernel built (the op's interface comes from
the generated source). A fused step without CUDA graphs pays this once per fused GEMM (BERT-base: 110 a
step), beside the kernels; this measures it where a GPU is not at hand and tracks changes to that path.

    python -m benchmarks.host_overhead [--models bert-base] [--calls 2000]
    python -m benchmarks.host_overhead --models --ready-ops    # the Llama layer's ready ops (coda_ext.ops) only

Results (--out): host_overhead_cpu.json in benchmarks/results/ (the CPU's name in it): per kernel the
median µs per call over five batches of --calls calls, and the step's sum (µs × launches). Absolute numbers
depend on the CPU (and on what else it runs): compare runs on one machine.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import platform
import statistics
import sys
import time
import types
from unittest import mock

from benchmarks import common
from benchmarks import sweep_fusion as sf


def unbuilt_op(graph, dtype: str, config=None):
    """graph's CompiledOp in config (default: the default config) from its generated source, without its
    library: every step of a launch but the kernel (no nvcc, no GPU)."""
    from coda_ext.jit import kernel_source
    from coda_ext.runtime import op as rop

    ks = kernel_source(graph, dtype, config)
    o = object.__new__(rop.CompiledOp)
    o.graph, o.config, o.major, o.library_path, o.source = ks.graph, ks.config, ks.config.major, "", ks.source
    o._run = o._workspace = 0
    o._specs = {}
    o._init_interface(ks.lowered, ks.dtype, f"{ks.graph.digest()}|{ks.dtype}|{ks.config.tag}|unbuilt")
    return o


@contextlib.contextmanager
def stubbed_launch():
    """The launch path with its last step stubbed: the binding's launch (and ops.finish's, the small kernel a ready
    op launches after it) does nothing, any tensor counts as on an SM90 GPU, and an op's configs are built from
    their generated source without a library (restored on exit)."""
    import torch

    import coda_ext.jit.binding as binding
    from coda_ext.ops import finish
    from coda_ext.runtime import checks, tuned
    from coda_ext.runtime import op as rop

    stub = types.SimpleNamespace(launch=lambda *args: None, workspace_size=lambda *args: 0)

    def op_for(self, config):
        if config.tag not in self._ops:
            self._ops[config.tag] = unbuilt_op(self.graph, self.dtype_name, config)
        return self._ops[config.tag]

    def choose(self, A, W, inputs, gpu):
        return self.config_for(A.shape[0], W.shape[0], A.shape[1])

    def load_binding():
        return stub

    def anything(*args, **kwargs):   # require_gpu, the current device, the stream, the device's name
        return None

    # plain functions, not mocks: a mock's call costs host time of its own
    with mock.patch.multiple(binding, load_binding=load_binding), mock.patch.multiple(finish, _launch=anything), \
            mock.patch.multiple(checks, require_gpu=anything), mock.patch.multiple(rop, _raw_stream=anything), \
            mock.patch.multiple(torch.cuda, current_device=anything, get_device_name=anything), \
            mock.patch.multiple(tuned.TunedOp, op_for=op_for, choose=choose):
        yield


#: Rows of the tensors a call gets: the path does not depend on M beyond the outputs' allocation, which a
#: GPU's caching allocator makes cheap and a CPU's does not (a 16384 x 3072 output cost 30 us of malloc here)
ROWS = 512


def site_call(site, mnk: tuple[int, int, int]):
    """fn() -> the site's results: coda_ext.fusion.op.run_site's launch path on CPU tensors of the site's
    shapes, at most ROWS rows (random values; the stubbed launch leaves the outputs as allocated)."""
    import torch

    from coda_ext.fusion import op as fop
    from coda_ext.graph.semantics import torch_dtype
    from coda_ext.runtime.tuned import TunedOp

    M, N, K = mnk
    M = min(M, ROWS)
    op = TunedOp(site.graph, site.dtype, tune=False, major=site.major)
    # planned on the CPU, a site runs the interpreter: the kernel's path instead, its results in the
    # kernel's shapes at M rows (the FX shapes are the full step's)
    outputs = tuple(dataclasses.replace(o, shape=tuple(op.output_spec(o.name, M, N)[0])) for o in site.outputs)
    site = dataclasses.replace(site, execute="auto", outputs=outputs)
    dtype = torch_dtype(site.dtype)
    A, W = torch.randn(M, K, dtype=dtype), torch.randn(N, K, dtype=dtype)
    a = A if site.major[0] == "k" else A.t().contiguous()
    w = W if site.major[1] == "k" else W.t().contiguous()
    slots = {s.name: s.dtype for s in op.slots}
    shapes = {"tile": (M, N), "row": (N,), "col": (M,), "scalar": (1,)}

    def tensor(name: str, role: str) -> torch.Tensor:
        dt = torch_dtype(slots[name]) if slots.get(name) else torch.float32
        return torch.randn(*shapes[role], dtype=dt) if dt.is_floating_point else torch.zeros(*shapes[role], dtype=dt)

    inputs = [tensor(name, role) for name, role in site.inputs]
    tensors = [a, w, *inputs]
    with mock.patch.object(torch.Tensor, "is_cuda", True):   # run_site takes the kernel's path
        fop.run_site(site, tensors)                          # warm: the op, its config and its checks
    return lambda: fop.run_site(site, tensors)


#: The Llama layer's ready ops (d 2048, F 8192, 32 query and 8 key/value heads of 64: Llama-3.2-1B's widths)
#: and how often a training step calls each, per layer
READY_OPS = {"qkv_rope": 1, "linear_residual_norm": 1, "linear_swiglu_train": 1, "linear_residual": 1,
             "swiglu_backward_linear": 1, "rms_norm_backward_linear": 2, "linear_dx": 1, "weight_grad": 4}


def ready_op_calls(rows: int = ROWS, d: int = 2048, f: int = 8192, heads: tuple[int, int, int] = (32, 8, 64)):
    """{op: fn()}: each ready op of a Llama layer on CPU tensors of its shapes at `rows` tokens (random values;
    with stubbed_launch the kernel is not run), as the layer calls it."""
    import torch

    from coda_ext import ops

    nh, nkv, hd = heads
    nq = (nh + 2 * nkv) * hd
    g = torch.Generator().manual_seed(0)

    def r(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=g).to(dtype)

    x, res, gamma = r(rows, d), r(rows, d), r(d)
    rstd = r(rows, dtype=torch.float32).abs() + 1
    pos, freqs = torch.arange(rows), ops.rope_frequencies(hd, nh, nkv)
    w_qkv, w_o, w_gu, w_d = r(nq, d), r(d, nh * hd), r(2 * f, d), r(d, f)
    y, z, dy, dz_gu, zdz = r(rows, f), r(rows, 2 * f), r(rows, d), r(rows, 2 * f), r(rows, dtype=torch.float32)
    attn, dz_kv = r(rows, nh * hd), r(rows, nkv * hd)
    return {
        "qkv_rope": lambda: ops.qkv_rope(x, w_qkv, pos, freqs, nh, nkv, rstd=rstd),
        "linear_residual_norm": lambda: ops.linear_residual_norm(attn, w_o, res, gamma),
        "linear_swiglu_train": lambda: ops.linear_swiglu_train(x, w_gu, rstd),
        "linear_residual": lambda: ops.linear_residual(y, w_d, res),
        "swiglu_backward_linear": lambda: ops.swiglu_backward_linear(dy, w_d, z),
        "rms_norm_backward_linear": lambda: ops.rms_norm_backward_linear(dz_gu, w_gu, x, rstd, gamma, zdz, dx_in=res),
        "linear_dx": lambda: ops.linear_dx(dy, w_o),
        # a small weight gradient: its (N, K) output is allocated whatever the rows, and a CPU's malloc of a
        # large one (64 MB for gate/up) would time the allocator, which a GPU's caching allocator makes cheap
        "weight_grad": lambda: ops.weight_grad(dz_kv, x),
    }


def measure_ready_ops(calls: int, rows: int = ROWS) -> list[dict]:
    """[{op, per_layer, host_us}]: each ready op's host time a call through its whole path (argument checks,
    custom op, config choice, output allocation) with the launch stubbed; CUDA is faked for the tensors; under
    no_grad, as the layer's autograd Functions call them."""
    from unittest import mock

    import torch

    out = []
    with stubbed_launch(), mock.patch.object(torch.cuda, "is_current_stream_capturing", return_value=False), \
            torch.no_grad():
        for name, fn in ready_op_calls(rows).items():
            with mock.patch.object(torch.Tensor, "is_cuda", True):
                fn()   # warm: the op, its config and its checks
            out.append({"op": name, "per_layer": READY_OPS[name], "host_us": measure(fn, calls)})
    return out


def measure(fn, calls: int) -> float:
    """Median µs per call over five batches."""
    import torch

    with mock.patch.object(torch.Tensor, "is_cuda", True):
        per = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            per.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(per)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="*", default=["bert-base"],
                   help="automatic fusion's models (none: --ready-ops only)")
    p.add_argument("--tiny", action="store_true", help="the models' tiny configs (tests)")
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--out", default=None, help="results JSON (default: host_overhead_cpu.json in benchmarks/results/)")
    p.add_argument("--ready-ops", action="store_true", help="also the Llama layer's ready ops (coda_ext.ops), one "
                   "row each, and their sum over a layer's training step")
    args = p.parse_args(argv)
    doc = {"env": {"cpu": platform.processor() or platform.machine(), "python": platform.python_version(),
                   "commit": common.commit()}, "models": {}}
    for name in args.models:
        rows = []
        entries = sf.kernels(name, tiny=args.tiny)
        with stubbed_launch():
            for e in entries:
                site = e["site"]
                us = measure(site_call(site, e["mnk"]), args.calls)
                rows.append({"graph": site.graph.digest()[:8], "major": site.major, "mnk": list(e["mnk"]),
                             "launches": e["launches"], "inputs": len(site.inputs), "outputs": len(site.outputs),
                             "host_us": us})
                print(f"{name} {rows[-1]['graph']} {site.major} {'x'.join(map(str, e['mnk']))} x{e['launches']}: "
                      f"{len(site.inputs)} inputs, {len(site.outputs)} outputs: {us:.1f} us a call", flush=True)
        step = sum(r["host_us"] * r["launches"] for r in rows) / 1e3
        print(f"{name}: {step:.2f} ms of host time a step in {sum(r['launches'] for r in rows)} fused calls")
        doc["models"][name] = {"kernels": rows, "step_ms": step}
    if args.ready_ops:
        rows = measure_ready_ops(args.calls)
        for row in rows:
            print(f"ready op {row['op']}: {row['host_us']:.1f} us a call, {row['per_layer']} a layer", flush=True)
        layer = sum(r["host_us"] * r["per_layer"] for r in rows) / 1e3
        print(f"Llama layer: {layer:.2f} ms of host time a training step in {sum(r['per_layer'] for r in rows)} "
              "ready-op calls")
        doc["ready_ops"] = {"ops": rows, "layer_ms": layer}
    import torch

    doc["env"]["torch"] = torch.__version__
    out = common.write_json(args.out or common.results_path("host_overhead", gpu="cpu"), doc)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
