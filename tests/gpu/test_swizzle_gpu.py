"""Swizzle 16 (csrc/kernels/wide_swizzle.cuh: past CUTLASS's cap of 8) and the fitted grid
(csrc/kernels/fitted_grid.cuh: no padded tiles along the raster direction) on an SM90 GPU.

A swizzle only changes which persistent CTA takes which tile, so every output is bit-identical to the same
kernel's at swizzle 8 and 1 (each tile's MMA order, epilogue math and per-tile reduction partials are the
tile's own): the dSwiGLU epilogue (a pair tile load, two stores, row sums) and the plain GEMM read N-major as
the backward runs them, in ping-pong 128 x 128 (1 x 1, 2 x 1 and 1 x 2 clusters) and 128 x 192, cooperative and
the overlap schedule, both rasters, at shapes with 12 CTAs or more on the shorter side (16 taken) and fewer (8 or less
taken), none a tile multiple, with a few persistent CTAs and the whole GPU. Then the numerics rule at the widest
shape. The fitted grid changes which CTA takes which tile too: bit-identical to CUTLASS's padded grid at every
swizzle and raster, every element written.

    python -m coda_ext prebuild tests/gpu/test_swizzle_gpu.py && python -m pytest -x -q tests/gpu/test_swizzle_gpu.py
"""
from __future__ import annotations

import dataclasses
import os

import pytest
import torch

import coda_ext as ce
from coda_ext import graphs
from coda_ext.config import applied_swizzle
from tests.gpu.test_numerics import check_against_reference
from tests.gpu.test_overlap_gpu import assert_same_bits
from tests.helpers import checks, rand

GRAPHS = {"dswiglu": graphs.swiglu_backward_linear, "plain": graphs.identity}
CONFIGS = (ce.KernelConfig((128, 128, 64), (1, 1), "pingpong", major="kn"),
           ce.KernelConfig((128, 128, 64), (2, 1), "pingpong", major="kn"),
           ce.KernelConfig((128, 128, 64), (1, 2), "pingpong", major="kn"),
           ce.KernelConfig((128, 128, 64), (1, 1), "cooperative", major="kn"),
           ce.KernelConfig((128, 128, 64), (1, 1), "overlap", major="kn"),
           ce.KernelConfig((128, 192, 64), (1, 1), "pingpong", major="kn"))   # "auto"'s dSwiGLU over K >= 4096
#: (M, N, K, persistent CTAs, 0: one per SM): 13 x 17 CTAs of 128 x 128 and 1 x 2 of them (16 needs 12 a side)
SHAPES = [(1600, 2120, 200, 3), (1600, 2120, 200, 0), (2000, 3080, 72, 5), (200, 264, 136, 2)]


#: Stream-K 128 x 256 (the cooperative kernel with CUTLASS's stream-K scheduler), the plain GEMM K-major
STREAMK_WIDE = ce.KernelConfig((128, 256, 64), (1, 1), "streamk")


def build_items() -> list:
    return [(build(), "bfloat16", cfg) for build in GRAPHS.values() for cfg in CONFIGS] + \
        [(graphs.identity(), "bfloat16", STREAMK_WIDE)]


@pytest.fixture(scope="module")
def ops():
    ce.prebuild(build_items(), jobs=os.cpu_count())
    return {(name, cfg.tag): ce.compile(build(), "bfloat16", cfg) for name, build in GRAPHS.items() for cfg in CONFIGS}


def launch(op, cfg, A, W, inputs, M, N, ctas):
    op.config = cfg   # the launch arguments (swizzle, raster) are read from the op's config at each launch
    cm, cn = cfg.cluster
    op.sm_count = ctas * cm * cn
    got = op(A, W, out=checks.nan_outputs(op, M, N), **inputs)
    torch.cuda.synchronize()
    return got


@pytest.mark.parametrize("M,N,K,ctas", SHAPES, ids=[f"{m}x{n}x{k}_cta{c}" for m, n, k, c in SHAPES])
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.tag)
@pytest.mark.parametrize("name", GRAPHS)
def test_swizzle_16_is_bit_identical_to_8_and_1(ops, name, cfg, M, N, K, ctas):
    op = ops[(name, cfg.tag)]
    A, W, inputs = rand.op_inputs(op, M, N, K, rand.generator("swizzle16", name, M, N, device="cuda"))
    cm, cn = cfg.cluster
    tiles_m, tiles_n = -(-M // cfg.tile[0]), -(-N // cfg.tile[1])
    ctas_m, ctas_n = -(-tiles_m // cm) * cm, -(-tiles_n // cn) * cn   # CTAs in whole clusters
    for raster in ("along_m", "along_n"):
        want = launch(op, dataclasses.replace(cfg, swizzle=8, raster=raster), A, W, inputs, M, N, ctas)
        for out_name, t in want.items():   # every element written (outputs are NaN-poisoned before a launch)
            assert not torch.isnan(t).any(), f"{name}/{cfg.tag}/{raster}/swizzle 8: {out_name} has unwritten elements"
        base = launch(op, dataclasses.replace(cfg, swizzle=1, raster=raster), A, W, inputs, M, N, ctas)
        assert_same_bits(base, want, f"{name}/{cfg.tag}/{raster}/swizzle 1 vs 8")
        got = launch(op, dataclasses.replace(cfg, swizzle=16, raster=raster), A, W, inputs, M, N, ctas)
        assert_same_bits(got, want, f"{name}/{cfg.tag}/{raster}/swizzle 16 (applies "
                                    f"{applied_swizzle(16, ctas_m, ctas_n)}) vs 8")
    if ctas == 0 and M >= 1600:
        check_against_reference(op, GRAPHS[name](), A, W, inputs, got, f"{name}/{cfg.tag}/s16/{M}x{N}x{K}")


@pytest.mark.parametrize("M,N,K,ctas", SHAPES, ids=[f"{m}x{n}x{k}_cta{c}" for m, n, k, c in SHAPES])
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.tag)
@pytest.mark.parametrize("name", GRAPHS)
def test_fitted_grid_is_bit_identical_to_the_padded_grid(ops, name, cfg, M, N, K, ctas):
    """Regression: CUTLASS's scheduler padded both tile counts to whole bands, and the padded tiles ran their
    mainloop for nothing (2.3 % of the tiles at 16384 x 16384 in 128 x 192 tiles); the fitted grid walks only the
    real ones along the raster direction. Same bits, every element written, fewer tiles scheduled."""
    from coda_ext import tuning

    op = ops[(name, cfg.tag)]
    A, W, inputs = rand.op_inputs(op, M, N, K, rand.generator("fitted", name, M, N, device="cuda"))
    for raster in ("along_m", "along_n"):
        for swizzle in (1, 2, 4, 8, 16):
            padded = dataclasses.replace(cfg, swizzle=swizzle, raster=raster, grid="padded")
            fitted = dataclasses.replace(padded, grid="fitted")
            want = launch(op, padded, A, W, inputs, M, N, ctas)
            got = launch(op, fitted, A, W, inputs, M, N, ctas)
            for out_name, t in got.items():
                assert not torch.isnan(t).any(), f"{name}/{fitted.tag}: {out_name} has unwritten elements"
            assert_same_bits(got, want, f"{name}/{fitted.tag} vs {padded.tag}")
            assert tuning.scheduled_tiles(fitted, M, N) <= tuning.scheduled_tiles(padded, M, N)


def test_streamk_launches_at_every_swizzle_and_raster():
    """Regression: the stream-K scheduler's workspace depends on the launch's swizzle and raster, and the op's
    workspace was sized at swizzle 1 with the heuristic's raster: at 8192 x 128256 x 4096 in 128 x 256 tiles that
    needed none, swizzle 4 some, and the launch failed in CUTLASS's initialize ("Workspace Null"). Now the size is
    the largest over every swizzle and raster: each launch runs, its output (sampled rows, every column) is the GEMM
    within the rule against fp64, and a second launch with the same arguments gives the same bits (the split of the
    last waves, and so the order of each tile's partial sums, follows the swizzle and raster: launches that differ
    in them differ by rounding)."""
    M, N, K = 8192, 128256, 4096
    op = ce.compile(graphs.identity(), "bfloat16", STREAMK_WIDE)
    gen = rand.generator("streamk_workspace", device="cuda")
    A, W, inputs = rand.op_inputs(op, M, N, K, gen)
    rows = torch.randperm(M, generator=torch.Generator().manual_seed(3))[:64].to(A.device)
    ref = A[rows].double() @ W.double().t()
    same_dtype = (A[rows] @ W.t()).double()
    for raster in ("heuristic", "along_m", "along_n"):
        for swizzle in (1, 2, 4, 8):
            op.config = dataclasses.replace(STREAMK_WIDE, swizzle=swizzle, raster=raster)
            label = f"stream-K {M}x{N}x{K} swizzle {swizzle} {raster}"
            (first,) = op(A, W, out=checks.nan_outputs(op, M, N), **inputs).values()
            (again,) = op(A, W, out=checks.nan_outputs(op, M, N), **inputs).values()
            torch.cuda.synchronize()
            checks.assert_within_rule(label, first[rows].double(), ref, same_dtype, lambda line: None,
                                      "torch_bf16_err", "PyTorch in bfloat16")
            assert torch.equal(first, again), f"{label}: a second launch differs"
