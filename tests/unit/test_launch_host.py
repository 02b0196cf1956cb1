"""The launch path's host-side bookkeeping (no GPU, nothing built): what a launch computes once per shape."""
from __future__ import annotations

import torch

from coda_ext.runtime import op as rop


def _op(graph) -> rop.CompiledOp:
    """A CompiledOp of graph's default config without its library (the launch's bookkeeping only)."""
    from benchmarks.host_overhead import unbuilt_op

    return unbuilt_op(graph, "bfloat16")


def _graph():
    """A library graph with a main output, a stored tile and a column reduction (the RMSNorm backward's)."""
    from coda_ext import graphs

    return graphs.rms_norm_backward_linear(True)


def test_output_specs_are_each_output_s_shape_and_dtype_kept_per_problem_size(monkeypatch):
    """A launch reads every output's (shape, dtype) from one dict per (M, N) (regression: output_spec scanned
    the slots for each output on every launch, a sixth of a fused call's host time), bounded in size."""
    op = _op(_graph())
    specs = op._output_specs(300, 72)
    assert specs == {n: op.output_spec(n, 300, 72) for n in op.output_names}
    assert specs[op.output_name] == ((300, 72), torch.bfloat16)
    assert op._output_specs(300, 72) is specs and op._output_specs(301, 72) is not specs
    monkeypatch.setattr(rop, "MAX_SPEC_SHAPES", 2)
    for M in range(400, 410):
        assert op._output_specs(M, 72)[op.output_name] == ((M, 72), torch.bfloat16)
    assert len(op._specs) == 2


def test_ready_ops_skip_the_dispatcher_only_where_it_has_nothing_to_do(monkeypatch):
    """common.call runs a ready op's implementation itself under no_grad on plain CUDA tensors (here CUDA is
    faked and the launch stubbed), and goes through torch.ops where the dispatcher matters: gradients recorded,
    a dispatch mode (FakeTensorMode, tracing), the profiler, CPU tensors; the results are the same."""
    from unittest import mock

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from benchmarks.host_overhead import stubbed_launch
    from coda_ext import ops
    from coda_ext.ops import common

    x, w, res = (torch.randn(*s).to(torch.bfloat16) for s in ((64, 128), (256, 128), (64, 256)))
    direct = []
    real = common._DIRECT["linear_residual"]
    monkeypatch.setitem(common._DIRECT, "linear_residual", lambda *a: direct.append(1) or real(*a))

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with stubbed_launch(), mock.patch.object(torch.cuda, "is_current_stream_capturing", return_value=False), \
            mock.patch.object(torch.Tensor, "is_cuda", True):
        with torch.no_grad():
            got = ops.linear_residual(x, w, res)
        assert direct == [1] and got.shape == (64, 256)
        ops.linear_residual(x, w, res)                       # grad mode on: the custom op's autograd
        with torch.no_grad(), Watch():
            ops.linear_residual(x, w, res)
        with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            ops.linear_residual(x, w, res)
        with torch.no_grad():
            seen = []
            torch.func.vmap(lambda r: seen.append(common.dispatch_free()) or r)(res)
        assert seen == [False]                                # inside vmap the dispatcher applies the transform
        assert direct == [1]
        assert any(e.name == "coda_ext::linear_residual" for e in prof.events())
    assert set(common._DIRECT) >= {"linear_residual", "linear_dx", "weight_grad", "qkv_rope", "linear_residual_norm",
                                   "linear_swiglu_train", "swiglu_backward_linear", "rms_norm_backward_linear"}
    assert "swiglu_backward_linear_" not in common._DIRECT   # it writes z: the dispatcher bumps z's version


def test_kernel_symbols_name_each_loaded_kernel_by_graph_and_config(tmp_path):
    """A profiler lists a kernel by its mangled device symbol; the op reads it from its library, and
    kernel_symbols() maps it to the graph and config (the symbol of a real library: a CUTLASS device_kernel
    mangled name, also present with section prefixes that must not be taken)."""
    from coda_ext.jit import kernel_source
    from coda_ext.runtime import kernel_symbols

    symbol = "_ZN7cutlass13device_kernelINS_4gemm6kernel13GemmUniversalIN4cute5tupleIJiiiiEEEvEEvNT_6ParamsE"
    library = tmp_path / "kernel.so"
    library.write_bytes(b"\x7fELF\0.text." + symbol.encode() + b"\0junk\0" + symbol.encode() + b"\0.nv.info."
                        + symbol.encode() + b"\0")
    ks = kernel_source(_graph(), "bfloat16", None)
    op = object.__new__(rop.CompiledOp)   # CompiledOp's own __init__ would load the library
    op.graph, op.config, op.library_path = ks.graph, ks.config, str(library)
    rop._LOADED.add(op)
    assert op.device_symbol == symbol
    assert kernel_symbols()[symbol] == f"coda {ks.graph.digest()[:8]} {ks.config.tag}"
    missing = object.__new__(rop.CompiledOp)
    missing.library_path = str(tmp_path / "absent.so")
    assert missing.device_symbol is None


def test_an_op_s_key_names_its_kernel_source():
    """Two kernels of one graph and config emitted differently (an ablation's override of the emitter: the dSwiGLU
    with its row sum's bounds test kept) are two ops: one run_graph key for both ran whichever was compiled last."""
    from benchmarks.sweep_backward import bounds_tests_kept
    from coda_ext import graphs
    from coda_ext.jit import kernel_source

    ks = kernel_source(graphs.swiglu_backward_linear(), "bfloat16")
    with bounds_tests_kept():
        kept = kernel_source(graphs.swiglu_backward_linear(), "bfloat16")
    assert kept.source != ks.source and kept.config == ks.config
    key = rop.op_key(ks.graph, ks.dtype, ks.config, ks.source)
    assert key != rop.op_key(kept.graph, kept.dtype, kept.config, kept.source)
    assert key == rop.op_key(ks.graph, ks.dtype, ks.config, ks.source)
    assert key.startswith(f"{ks.graph.digest()}|{ks.dtype}|{ks.config.tag}|")
