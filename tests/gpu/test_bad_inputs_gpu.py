"""The bad-input matrix (tests/helpers/bad_inputs.py) against compiled ops on an SM90 GPU: every case raises
its TypeError/ValueError before any launch and leaves the device healthy; the controls run and
match the interpreter; NaN and inf inputs propagate as in the interpreter and never crash.
"""
from __future__ import annotations

import math
import os

import pytest
import torch

import coda_ext as ce
from tests.helpers import bad_inputs

BF = torch.bfloat16
COUNT = {"cases": 0}


def build_items() -> list:
    """(graph, dtype, config) of every kernel these tests launch (`python -m coda_ext prebuild` builds them ahead)."""
    return [(make(), "bfloat16", None) for make in bad_inputs.GRAPHS.values()]


@pytest.fixture(scope="module")
def ops():
    from coda_ext.runtime import prebuild  # the function (ce.prebuild is rebound by importing its CLI module)

    prebuild(build_items(), jobs=os.cpu_count())
    return {name: ce.compile(make(), "bfloat16") for name, make in bad_inputs.GRAPHS.items()}


def _call(op, call: bad_inputs.Call, with_out: bool):
    if with_out or call.out:
        return op(call.A, call.W, out=call.out, **call.inputs)
    return op(call.A, call.W, **call.inputs)


def _compare(graph, call: bad_inputs.Call, got: dict, what: str) -> None:
    """Same inf/NaN pattern as the fp64 interpreter; numbers within 2x PyTorch-in-bf16's error + a floor."""
    ref = ce.interpret(graph, call.A, call.W, compute_dtype=torch.float64, **call.inputs)
    same = ce.interpret(graph, call.A, call.W, compute_dtype=BF, **call.inputs)
    assert set(got) == set(ref)
    problems = []
    for name, r in ref.items():
        g = got[name].double()
        for test in (torch.isnan, lambda x: x == math.inf, lambda x: x == -math.inf):
            bad = test(g) != test(r)
            if bad.any():
                i = tuple(bad.nonzero()[0].tolist())
                problems.append(f"{name}: inf/NaN differ from the interpreter at {int(bad.sum())} element(s), "
                                f"first {i}: got {g[i].item()}, interpreter {r[i].item()}")
                break
        num = r.isfinite() & g.isfinite() & (r.abs() < 0.99 * torch.finfo(got[name].dtype).max)
        if num.any():
            err = (g - r).abs()[num].max().item()
            err_torch = (same[name].to(got[name].dtype).double() - r).abs()[num].max().item()
            floor = 1e-5 * (1 + r[num].abs().max().item())
            if err > 2 * err_torch + floor:
                problems.append(f"{name}: error {err:.3e} > 2 x {err_torch:.3e} + {floor:.1e}")
    assert not problems, f"{what}:\n" + "\n".join(problems)


@pytest.mark.parametrize("with_out", [False, True], ids=["plain", "out="])
@pytest.mark.parametrize("case", bad_inputs.CASES, ids=[c.id for c in bad_inputs.CASES])
def test_bad_input_raises_before_launch(request, ops, case, with_out):
    if not with_out and case.id in bad_inputs.KNOWN_PLAIN:
        request.applymarker(pytest.mark.xfail(strict=True, reason=bad_inputs.KNOWN_PLAIN[case.id]))
    M, N, K = case.shape
    call = bad_inputs.good_call(case.graph, M, N, K, BF, "cuda")
    case.edit(call, "cpu")
    if with_out and "out" not in call.out and ops[case.graph].output_name:
        call.out["out"] = torch.full((M, N), math.nan, dtype=BF, device="cuda")
    with pytest.raises(case.error, match=case.message):
        _call(ops[case.graph], call, with_out)
    torch.cuda.synchronize()  # no CUDA error is pending
    COUNT["cases"] += 1


@pytest.mark.parametrize("control", bad_inputs.GOOD, ids=[g[0] for g in bad_inputs.GOOD])
def test_valid_calls_run(ops, control):
    name, graph, (M, N, K), edit = control
    call = bad_inputs.good_call(graph, M, N, K, BF, "cuda")
    edit(call, "cpu")
    for t in call.out.values():
        t.fill_(math.nan)
    got = _call(ops[graph], call, with_out=True)
    torch.cuda.synchronize()
    _compare(bad_inputs.GRAPHS[graph](), call, dict(got), name)
    COUNT["cases"] += 1


def _poke(where: str, name: str, index, value: float):
    def edit(call: bad_inputs.Call) -> None:
        if where == "inputs" and not isinstance(call.inputs[name], torch.Tensor):
            call.inputs[name] = value
        else:
            t = getattr(call, where) if where in ("A", "W") else call.inputs[name]
            t[index] = value
    return edit


NONFINITE = [
    ("NaN in a tile", _poke("inputs", "res", (3, 5), math.nan)),
    ("-inf in an fp32 tile", _poke("inputs", "res32", (0, 0), -math.inf)),
    ("inf in a row vector", _poke("inputs", "bias", 7, math.inf)),
    ("NaN in a col vector", _poke("inputs", "rstd", 11, math.nan)),
    ("NaN runtime scalar", _poke("inputs", "alpha", None, math.nan)),
    ("inf runtime scalar", _poke("inputs", "alpha", None, math.inf)),
    ("inf pointer scalar", _poke("inputs", "scale", 0, math.inf)),
    ("NaN in A", _poke("A", None, (2, 9), math.nan)),
    ("inf in W", _poke("W", None, (13, 1), math.inf)),
    ("-inf in A and W", lambda c: (_poke("A", None, (5, 0), -math.inf)(c), _poke("W", None, (6, 0), -math.inf)(c))),
]


@pytest.mark.parametrize("with_out", [False, True], ids=["plain", "out="])
@pytest.mark.parametrize("edit", [e for _, e in NONFINITE], ids=[n for n, _ in NONFINITE])
def test_nonfinite_inputs_propagate(ops, edit, with_out):
    M, N, K = bad_inputs.MNK
    call = bad_inputs.good_call("main", M, N, K, BF, "cuda", seed=1)
    edit(call)
    got = _call(ops["main"], call, with_out)
    torch.cuda.synchronize()
    _compare(bad_inputs.main_graph(), call, dict(got), "nonfinite")
    COUNT["cases"] += 1


def test_zz_count(capsys):
    with capsys.disabled():
        print(f"\nbad inputs: {COUNT['cases']} cases checked on the GPU")
