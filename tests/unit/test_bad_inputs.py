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


def test_any_n_without_row_vectors_stores_padded_rows(stub_library, cpu_as_gpu):
    """N = 50 (a vocabulary's width is no multiple of 8): a graph without row vectors launches, its (M, N)
    outputs with rows padded to 16 bytes (the TMA store's need) and its fake giving the same strides (so a
    compiled graph's layout asserts hold); a graph with a row vector names the vector and asks for N a multiple
    of 8."""
    from coda_ext import graphs
    from coda_ext.runtime import checks
    from coda_ext.runtime.op import CompiledOp
    from coda_ext.runtime.torch_op import _run_graph_fake

    def op_of(graph):
        ks = ce.kernel_source(graph, "bfloat16")
        return CompiledOp(ks.graph, ks.lowered, ks.dtype, ks.config, stub_library, ks.source)

    A, W = torch.randn(37, 64, dtype=torch.bfloat16), torch.randn(50, 64, dtype=torch.bfloat16)
    op = op_of(graphs.unary_b())            # D and four stores, no inputs
    with pytest.raises(cpu_as_gpu) as e:
        op(A, W)
    outs = e.value.args[0]
    tiles = [t for t in outs.values() if t.dim() == 2]
    assert tiles and all(t.shape == (37, 50) and t.stride() == (56, 1) for t in tiles)
    fake = _run_graph_fake(op.key, A.to("meta"), W.to("meta"), [], [])
    assert [t.stride() for t in fake] == [outs[n].stride() for n in op.output_names]
    assert checks.padded_strides((4, 9, 50), torch.bfloat16) == (9 * 56, 56, 1)
    assert checks.padded_strides((4, 9, 48), torch.bfloat16) == (9 * 48, 48, 1)
    with pytest.raises(ValueError, match=r"N = 50 \(W.shape\[0\]\) must be a multiple of 8 for this graph: its row "
                                         r"vector input\(s\) \['bias'\]"):
        op_of(graphs.acc_bias())(A, W, bias=torch.randn(50, dtype=torch.bfloat16))
