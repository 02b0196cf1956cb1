"""Reductions whose bounds test runs only on the tiles that reach beyond the problem (csrc/epilogues/
interior_tiles.hpp), on an SM90 GPU.

The graph's three reductions all keep their per-element bounds test (codegen/oob.py cannot show their inputs 0
beyond the problem; tests/unit/test_oob.py checks it): a row sum of acc + tile - mu (mu, a per-row vector, is real
data beside the padded columns), a column sum of acc + a per-column vector (real beside the padded rows) and a row
log-sum-exp of y - 8|t| (the real elements lowered, the padding's -mu not). A tile wrongly taken for an interior
one would fold the padding's -mu, vector or exp(-mu) terms into its partials: far outside the rule. Shapes with every
tile interior (multiples of every tile), with edge tiles along N only, along M only and both; CUTLASS's epilogue
collective (ping-pong, cooperative, 128 x 192) and the project's (overlap, handoff); each output within the rule
against the fp64 interpreter, outputs poisoned before launch, and the same bits on relaunch.

    python -m coda_ext prebuild tests/gpu/test_interior_tiles_gpu.py
    python -m pytest -q tests/gpu/test_interior_tiles_gpu.py
"""
from __future__ import annotations

import os

import pytest
import torch

import coda_ext as ce
from coda_ext import graphs
from tests.gpu.test_numerics import check_against_reference
from tests.helpers import checks, rand

#: CUTLASS's epilogue collective (ping-pong, cooperative, 128 x 192) and the project's own (overlap, handoff), each
#: of which builds the residue the interior test reads
CONFIGS = {"ping_128x128": ce.KernelConfig((128, 128, 64), (1, 1), "pingpong", swizzle=4),
           "coop_128x256": ce.KernelConfig((128, 256, 64), (2, 1), "cooperative", swizzle=4),
           "ping_128x192": ce.KernelConfig((128, 192, 64), (1, 1), "pingpong", swizzle=4),
           "overlap_128x128": ce.KernelConfig((128, 128, 64), (1, 1), "overlap", swizzle=4),
           "handoff_128x128": ce.KernelConfig((128, 128, 64), (2, 1), "handoff", swizzle=4, epilogue_stages=(2, 1))}
#: (M, N, K): every tile interior (768 = 6 x 128 = 3 x 256 = 4 x 192), edge tiles along N, along M, along both
SHAPES = [(1024, 768, 128), (1024, 1000, 72), (1000, 768, 136), (1000, 1032, 264)]


graph = graphs.tested_reductions


def build_items() -> list:
    """(graph, dtype, config) of every kernel these tests launch, for `python -m coda_ext prebuild`."""
    return [(graph(), "bfloat16", cfg) for cfg in CONFIGS.values()]


@pytest.fixture(scope="module")
def ops():
    from coda_ext.runtime import prebuild

    prebuild(build_items(), jobs=os.cpu_count())
    return {name: ce.compile(graph(), "bfloat16", cfg) for name, cfg in CONFIGS.items()}


@pytest.mark.parametrize("M,N,K", SHAPES, ids=[f"{m}x{n}x{k}" for m, n, k in SHAPES])
@pytest.mark.parametrize("config", CONFIGS)
def test_interior_and_edge_tiles_within_the_rule(ops, config, M, N, K):
    op = ops[config]
    A, W, inputs = rand.op_inputs(op, M, N, K, rand.generator("interior", config, M, N, K, device="cuda"))
    got = op(A, W, out=checks.nan_outputs(op, M, N), **inputs)
    torch.cuda.synchronize()
    label = f"{config}/{M}x{N}x{K}"
    check_against_reference(op, graph(), A, W, inputs, got, label)
    again = op(A, W, out=checks.nan_outputs(op, M, N), **inputs)
    torch.cuda.synchronize()
    for name in got:
        assert torch.equal(got[name], again[name]), f"{label}/{name}: another launch gave other bits"
