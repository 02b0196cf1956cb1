"""KernelConfig(gated_store="tma") on an SM90 GPU: the half-width output of the SwiGLU pairs (pair_gated_store) staged
in shared memory and TMA-stored per subtile (csrc/epilogues/variants/pair_gated_tma_store.hpp) instead of written
from registers (csrc/epilogues/pair_gated_store.hpp).

Every output equals the register-writing kernel's of the same config bit for bit (the same values, only the path to
global memory differs), at shapes that are no tile multiple with a few persistent CTAs (each runs many tiles) and
with the whole GPU; and is within the numerics rule against the fp64 interpreter. Half-width rows of a multiple of
8 elements (16 bytes) go through TMA; the others (N / 2 = 516, 1548) are written from registers by the same kernel,
as are rows in a padded stride whose length is not a multiple of 16 bytes (regression: TMA wrote the last 16-byte
piece of each 100-element row whole, into the padding).
Graphs: the training forward (rstd-scaled, z and y), y alone (no main output D) and the unscaled z and y. Epilogue
collectives: CUTLASS's ping-pong in 128 x 128 and 128 x 192 tiles (1 x 1 and 2 x 1 clusters; 128 x 128 also in
64 x 64 subtiles, whose fragments the node writes to shared memory element by element) and cooperative 128 x 256,
and the project's overlap and handoff kernels.

    python -m coda_ext prebuild tests/gpu/test_gated_store_gpu.py
    python -m pytest -x -q tests/gpu/test_gated_store_gpu.py
"""
from __future__ import annotations

import dataclasses
import os

import pytest

import coda_ext as ce
from coda_ext.graphs import forward
from tests.gpu.test_numerics import check_against_reference
from tests.gpu.test_overlap_gpu import assert_same_bits, run
from tests.helpers import rand

GRAPHS = {"train": lambda: forward.linear_swiglu(True, True), "y_only": lambda: forward.linear_swiglu(False, False),
          "z_y": lambda: forward.linear_swiglu(False, True)}
CONFIGS = {"ping": ce.KernelConfig((128, 128, 64), (1, 1), "pingpong", swizzle=4),
           "tall192": ce.KernelConfig((128, 192, 64), (1, 1), "pingpong", swizzle=8, raster="along_n"),
           "tall192_2x1": ce.KernelConfig((128, 192, 64), (2, 1), "pingpong", swizzle=8),
           # 64 x 64 subtiles: 16 pairs a thread, written to the stage one element at a time (not the quad transpose)
           "ping_e64x64": ce.KernelConfig((128, 128, 64), (1, 1), "pingpong", swizzle=4, epilogue_tile=(64, 64)),
           "coop": ce.KernelConfig((128, 256, 64), (2, 1), "cooperative", swizzle=4),
           "overlap": ce.KernelConfig((128, 128, 64), (1, 1), "overlap", swizzle=4),
           "handoff": ce.KernelConfig((128, 128, 64), (2, 1), "handoff", swizzle=8)}
#: (M, N, K, persistent CTAs): none a tile multiple; N / 2 a multiple of 8 (TMA) but for 1032 and 3096 (registers)
SHAPES = [(333, 1040, 72, 2), (1000, 1032, 264, 3), (2333, 2064, 136, 0), (4133, 3096, 520, 5), (4133, 6160, 1064, 0)]


def cases() -> list:
    """(graph, config): the training graph in every config, the others in the 128 x 192 ones and cooperative."""
    return [("train", c) for c in CONFIGS] + [(g, c) for g in ("y_only", "z_y") for c in ("tall192_2x1", "coop")]


def config(cfg: str, store: str) -> ce.KernelConfig:
    return dataclasses.replace(CONFIGS[cfg], gated_store=store)


def build_items() -> list:
    """(graph, dtype, config) of every kernel these tests launch, for `python -m coda_ext prebuild`."""
    return [(GRAPHS[g](), "bfloat16", config(c, s)) for g, c in cases() for s in ("registers", "tma")]


@pytest.fixture(scope="module")
def ops():
    from coda_ext.runtime import prebuild

    prebuild(build_items(), jobs=os.cpu_count())
    return {(g, c, s): ce.compile(GRAPHS[g](), "bfloat16", config(c, s)) for g, c in cases()
            for s in ("registers", "tma")}


@pytest.mark.parametrize("M,N,K,sms", SHAPES, ids=[f"{m}x{n}x{k}_sm{s}" for m, n, k, s in SHAPES])
@pytest.mark.parametrize("name,cfg", cases(), ids=[f"{g}-{c}" for g, c in cases()])
def test_tma_gated_store_is_bit_identical_to_registers_and_within_the_rule(ops, name, cfg, M, N, K, sms):
    base = ops[(name, cfg, "registers")]
    A, W, inputs = rand.op_inputs(base, M, N, K, rand.generator("gated", name, M, N, K, device="cuda"))
    want = run(base, A, W, inputs, M, N, sms)
    op = ops[(name, cfg, "tma")]
    label = f"{name}/{cfg}/tma/{M}x{N}x{K}/sm{sms}"
    got = run(op, A, W, inputs, M, N, sms)
    assert_same_bits(got, want, label)   # an element left unwritten (NaN-poisoned) differs too
    check_against_reference(op, GRAPHS[name](), A, W, inputs, got, label)


#: (M, N, K, row padding): TMA with rows in a padded, 16-byte aligned stride (N / 2 = 1032 in 1040); and registers for
#: rows of 100 and 196 elements in strides of 104 and 208, where TMA wrote each row's last 16-byte piece whole
PADDED = [(300, 2064, 136, 8), (77, 200, 136, 4), (300, 392, 136, 12)]


@pytest.mark.parametrize("M,N,K,pad", PADDED, ids=[f"{m}x{n}x{k}_pad{p}" for m, n, k, p in PADDED])
def test_gated_store_leaves_the_row_padding_alone(ops, M, N, K, pad):
    import torch

    from tests.helpers import checks

    for cfg in ("ping", "tall192_2x1"):
        base, op = ops[("train", cfg, "registers")], ops[("train", cfg, "tma")]
        A, W, inputs = rand.op_inputs(base, M, N, K, rand.generator("gated-pad", M, N, K, pad, device="cuda"))
        want = run(base, A, W, inputs, M, N, 0)
        out = checks.nan_outputs(op, M, N)
        buf = torch.full((M, N // 2 + pad), float("nan"), dtype=out["y"].dtype, device="cuda")
        out["y"] = buf[:, : N // 2]
        got = op(A, W, out=out, **inputs)
        torch.cuda.synchronize()
        assert_same_bits(got, want, f"{cfg}/{M}x{N}x{K}/pad{pad}")
        assert torch.isnan(buf[:, N // 2:]).all(), f"{cfg}/{M}x{N}x{K}/pad{pad}: the gated store wrote into the padding"
