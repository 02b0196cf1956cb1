"""The "handoff" schedule on an SM90 GPU: cooperative MMAs whose epilogue runs on two warp groups of its own
(csrc/kernels/sm90_cooperative_handoff.cuh), each tile's fp32 accumulators passed through shared memory.

1. bit-identical: every output equals the cooperative kernel's of the same tile, cluster and epilogue stages
   (the same MMAs, the same fragments thread for thread, the same epilogue math, reductions through the
   same per-tile partials and finalize), at shapes that are no tile multiple, with a few persistent CTAs
   (CompiledOp.sm_count) so each runs many tiles (odd counts included), 128 x 128 tiles in 2 x 1 clusters and
   128 x 64 in 1 x 2 (A or W multicast across the cluster; 64 and 32 accumulators a thread);
2. the numerics rule against the fp64 interpreter (tests/helpers/checks.py, as test_numerics.py);
3. repeated launches give the same bits (a race on the accumulator chunk buffers would show up as a flip);
4. the training step's backward epilogues (dSwiGLU, RMSNorm backward) at the Llama-3.2-1B shapes.
Graphs: a GELU forward with D and two TMA stores, a tile load with a column reduction, a row reduction with
a row vector and a tile load, a plain GEMM, and the dSwiGLU (pair tile in, pair store, y, row reduction).

    python -m coda_ext prebuild tests/gpu/test_handoff_gpu.py && python -m pytest -x -q tests/gpu/test_handoff_gpu.py
"""
from __future__ import annotations

import os

import pytest

import coda_ext as ce
from coda_ext import graphs
from coda_ext.graphs import backward
from tests.gpu.test_numerics import check_against_reference
from tests.gpu.test_overlap_gpu import assert_relaunches_give_the_same_bits, assert_same_bits, run
from tests.helpers import rand
from tests.helpers.selection import selected

#: name -> (builder, operand layout)
GRAPHS = {"gelu_fwd": (graphs.bias_gelu_stores, "kn"), "gelu_bwd": (graphs.gelu_backward_dbias, "kk"),
          "row_reduce": (graphs.design, "kk"), "plain": (graphs.identity, "kk"),
          "dswiglu": (backward.swiglu_backward_linear, "kn")}
#: (tile, cluster)
TILES = (((128, 128, 64), (2, 1)), ((128, 64, 64), (1, 2)))
BASE = TILES[0]
#: the epilogue's load and store stages: (2, 1) leaves the dSwiGLU's 128 x 128 tile three mainloop stages
STAGES = (2, 1)
#: (M, N, K, persistent CTAs): none a tile multiple (N even for the pair graph); 1-3 CTAs give each many tiles
SHAPES = [(333, 264, 72, 2), (1000, 1032, 264, 3), (777, 520, 136, 1), (2333, 2056, 136, 0)]
#: the backward epilogues at Llama-3.2-1B's shapes (16384 tokens)
LLAMA_1B = {"dswiglu": ((16384, 8192, 2048), backward.swiglu_backward_linear, "kn"),
            "rms_backward_dx_in": ((16384, 2048, 16384), lambda: backward.rms_norm_backward_linear(True), "kn")}


def config(tile, schedule, major):
    return ce.KernelConfig(tile[0], tile[1], schedule, swizzle=4, major=major, epilogue_stages=STAGES)


def tile_id(tile) -> str:
    (tm, tn, _), (cm, cn) = tile
    return f"{tm}x{tn}_c{cm}x{cn}"


def build_items(names=(*GRAPHS, *LLAMA_1B)) -> list:
    """(graph, dtype, config) of every kernel these tests launch (those of `names`' graphs), for
    `python -m coda_ext prebuild`."""
    items = [(build(), "bfloat16", config(tile, s, major)) for n, (build, major) in GRAPHS.items() if n in names
             for tile in TILES for s in ("cooperative", "handoff")]
    items += [(build(), "bfloat16", config(BASE, s, major)) for n, (_, build, major) in LLAMA_1B.items()
              if n in names for s in ("cooperative", "handoff")]
    return items


@pytest.fixture(scope="module")
def ops(request):
    """The kernels of the graphs the selected tests take, built in parallel first."""
    from coda_ext.runtime import prebuild

    names = selected(request, "name", dict.fromkeys([*GRAPHS, *LLAMA_1B]))
    prebuild(build_items(names), jobs=os.cpu_count())
    out = {(name, tile, s): ce.compile(build(), "bfloat16", config(tile, s, major))
           for name, (build, major) in GRAPHS.items() if name in names
           for tile in TILES for s in ("cooperative", "handoff")}
    out.update({(name, BASE, s): ce.compile(build(), "bfloat16", config(BASE, s, major))
                for name, (_, build, major) in LLAMA_1B.items() if name in names for s in ("cooperative", "handoff")})
    return out


@pytest.mark.parametrize("M,N,K,sms", SHAPES, ids=[f"{m}x{n}x{k}_sm{s}" for m, n, k, s in SHAPES])
@pytest.mark.parametrize("tile", TILES, ids=tile_id)
@pytest.mark.parametrize("name", GRAPHS)
def test_handoff_is_bit_identical_to_cooperative_and_within_the_rule(ops, name, tile, M, N, K, sms):
    base = ops[(name, tile, "cooperative")]
    gen = rand.generator("handoff", name, M, N, K, device="cuda")
    A, W, inputs = rand.op_inputs(base, M, N, K, gen)
    want = run(base, A, W, inputs, M, N, sms)
    label = f"{name}/handoff/{tile_id(tile)}/{M}x{N}x{K}/sm{sms}"
    got = run(ops[(name, tile, "handoff")], A, W, inputs, M, N, sms)
    assert_same_bits(got, want, label)   # an element left unwritten (NaN-poisoned) differs too
    check_against_reference(ops[(name, tile, "handoff")], GRAPHS[name][0](), A, W, inputs, got, label)


@pytest.mark.parametrize("name", GRAPHS)
def test_handoff_relaunches_give_the_same_bits(ops, name):
    assert_relaunches_give_the_same_bits(ops[(name, BASE, "handoff")], name)


@pytest.mark.parametrize("name", LLAMA_1B)
def test_handoff_at_llama_backward_shapes(ops, name):
    (M, N, K), build, _ = LLAMA_1B[name]
    base = ops[(name, BASE, "cooperative")]
    A, W, inputs = rand.op_inputs(base, M, N, K, rand.generator("llama", name, device="cuda"))
    want = run(base, A, W, inputs, M, N, 0)
    got = run(ops[(name, BASE, "handoff")], A, W, inputs, M, N, 0)
    assert_same_bits(got, want, f"{name}/llama-1b")
    check_against_reference(ops[(name, BASE, "handoff")], build(), A, W, inputs, got, f"{name}/llama-1b")
