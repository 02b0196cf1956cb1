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
