"""Kernel bugs the fuzz tests found, one small graph each (regression tests of their fixes)."""
from __future__ import annotations

import math
import os

import pytest
import torch

import coda_ext as ce
from tests.helpers import rand


def turns_graph():
    g = ce.Graph()
    g.output(g.accumulator())
    g.store("t", ce.turns(g.col_vector("pos", "int32"), 0.25, 0.5), dtype="float32")
    return g


def logsumexp_graph():
    g = ce.Graph()
    y = g.accumulator() + g.tile("t", "float32")
    g.output(y)
    g.row_reduce("lse", y, "logsumexp")
    return g


GRAPHS = {"turns": turns_graph, "logsumexp": logsumexp_graph}


def build_items() -> list:
    """(graph, dtype, config) of every kernel these tests launch (`python -m coda_ext prebuild` builds them ahead)."""
    return [(make(), "bfloat16", None) for make in GRAPHS.values()]


@pytest.fixture(scope="module")
def ops():
    from coda_ext.runtime import prebuild  # the function (ce.prebuild is rebound by importing its CLI module)

    prebuild(build_items(), jobs=os.cpu_count())
    return {name: ce.compile(make(), "bfloat16") for name, make in GRAPHS.items()}


def _operands(M: int, N: int, K: int = 64):
    return rand.operands(torch.Generator(device="cuda").manual_seed(0), M, N, K, torch.bfloat16)


def test_regression_turns_stays_in_half_a_turn(ops):
    A, W = _operands(8, 16)
    pos = torch.arange(8, dtype=torch.int32, device="cuda")
    got = ops["turns"](A, W, pos=pos)["t"][:, 0]
    want = ce.interpret(turns_graph(), A, W, compute_dtype=torch.float64, pos=pos)["t"][:, 0]
    torch.cuda.synchronize()
    assert got.abs().max() <= 0.5, f"turns(pos, 0.25, 0.5) = {got.tolist()}, expected {want.tolist()}"
    torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-6)


def test_regression_logsumexp_propagates_nan_and_inf(ops):
    M, N = 4, 64
    A, W = _operands(M, N)
    t = torch.randn(M, N, device="cuda")
    t[1, 5] = math.nan
    t[2, 7] = math.inf
    t[3, :] = -math.inf
    got = ops["logsumexp"](A, W, t=t)["lse"]
    want = ce.interpret(logsumexp_graph(), A, W, compute_dtype=torch.float64, t=t)["lse"]
    torch.cuda.synchronize()
    assert torch.isnan(got[1]) and got[2] == math.inf and got[3] == -math.inf, \
        f"logsumexp rows (plain, NaN, +inf, all -inf): got {got.tolist()}, expected {want.tolist()}"
    torch.testing.assert_close(got[0].double(), want[0], rtol=1e-5, atol=1e-5)
