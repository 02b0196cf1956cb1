"""The bad-input matrix (tests/helpers/bad_inputs.py) on CPU: every argument check of a compiled op runs
for real; only what needs a GPU is stood in for -- the op's library is a stub with the two entry
points, CPU tensors pass for CUDA ones (the other device is "meta"), and the launch is replaced
by a sentinel raised after the last check. Each case must raise its TypeError/ValueError naming
the argument and the fix; each control must reach the launch.
"""
from __future__ import annotations

import pytest
import torch

import coda_ext as ce
from tests.helpers import bad_inputs

COUNT = {"cases": 0}


@pytest.fixture(scope="module")
def ops(stub_library):
    from coda_ext.runtime.op import CompiledOp

    out = {}
    for name, make in bad_inputs.GRAPHS.items():
        ks = ce.kernel_source(make(), "bfloat16")
        out[name] = CompiledOp(ks.graph, ks.lowered, ks.dtype, ks.config, stub_library, ks.source)
    return out


def _call(op, call: bad_inputs.Call, with_out: bool):
    if with_out or call.out:
        return op(call.A, call.W, out=call.out, **call.inputs)
    return op(call.A, call.W, **call.inputs)


@pytest.mark.parametrize("with_out", [False, True], ids=["plain", "out="])
@pytest.mark.parametrize("case", bad_inputs.CASES, ids=[c.id for c in bad_inputs.CASES])
def test_bad_input_raises_naming_the_argument(request, ops, cpu_as_gpu, case, with_out):
    """Through both call paths: the torch custom op (no out=) and the direct launch (out= given)."""
    if not with_out and case.id in bad_inputs.KNOWN_PLAIN:
        request.applymarker(pytest.mark.xfail(strict=True, reason=bad_inputs.KNOWN_PLAIN[case.id]))
    M, N, K = case.shape
    call = bad_inputs.good_call(case.graph, M, N, K, torch.bfloat16, "cpu")
    case.edit(call, "meta")
    if with_out and "out" not in call.out and ops[case.graph].output_name:
        call.out["out"] = torch.empty(M, N, dtype=torch.bfloat16)
    with pytest.raises(case.error, match=case.message):
        _call(ops[case.graph], call, with_out)
    COUNT["cases"] += 1


@pytest.mark.parametrize("control", bad_inputs.GOOD, ids=[g[0] for g in bad_inputs.GOOD])
def test_valid_calls_reach_the_launch(ops, cpu_as_gpu, control):
    _, graph, (M, N, K), edit = control
    call = bad_inputs.good_call(graph, M, N, K, torch.bfloat16, "cpu")
    edit(call, "meta")
    with pytest.raises(cpu_as_gpu):
        _call(ops[graph], call, with_out=True)
    COUNT["cases"] += 1


def test_operands_on_the_cpu_are_refused(ops):
    """Without the stand-ins: a CPU call says to move A and W to the GPU, before anything else."""
    call = bad_inputs.good_call("main", 37, 72, 64, torch.bfloat16, "cpu")
    with pytest.raises(ValueError, match=r"A is on cpu; coda_ext kernels run on a CUDA device: .*\.cuda\(\)"):
        _call(ops["main"], call, with_out=True)
    COUNT["cases"] += 1


def test_zz_count(capsys):
    with capsys.disabled():
        print(f"\nbad inputs: {COUNT['cases']} cases checked on CPU")
    assert COUNT["cases"] == 0 or COUNT["cases"] >= 2 * len(bad_inputs.CASES)
