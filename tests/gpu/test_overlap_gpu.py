"""The "overlap" schedule on an SM90 GPU: ping-pong whose two math warp groups' epilogues may run at the same
time (csrc/kernels/sm90_pingpong_overlap.cuh), first tested here.

Order of the checks, from the most to the least basic (run with -x to stop at the first):
1. bit-identical: with the epilogues ordered again (overlap_ordered, the kernel's debugging switch) and with
   them overlapping, every output equals ping-pong's of the same tile bit for bit (same MMA order, same
   epilogue math, reductions through the same per-tile partials and finalize), at shapes that are no tile
   multiple, with a few persistent CTAs (CompiledOp.sm_count) so each runs many tiles, odd counts included;
   ping-pong 128 x 128 and 64 x 128 in 1 x 1 clusters, 128 x 192 in 2 x 1 and 128 x 128 in 1 x 2 (A and W
   multicast across the cluster; the ordered variant for the 1 x 1 tiles only);
2. the numerics rule against the fp64 interpreter (tests/helpers/checks.py, as test_numerics.py);
3. repeated launches give the same bits (a race between the warp groups' buffers would show up as a flip);
4. GPT-2's GELU shapes (16384 x 3072 x 768) on the whole GPU.
Each graph is a kind of epilogue traffic: a GELU forward with D and two TMA stores, a tile load with a
column reduction (GPT-2's GELU backward), a row reduction with a row vector and a tile load, a plain GEMM.

    python -m coda_ext prebuild tests/gpu/test_overlap_gpu.py && python -m pytest -x -q tests/gpu/test_overlap_gpu.py
"""
from __future__ import annotations

import os

import pytest
import torch

import coda_ext as ce
from coda_ext import graphs
from tests.gpu.test_numerics import check_against_reference
from tests.helpers import checks, rand
from tests.helpers.selection import selected

#: name -> (builder, operand layout)
GRAPHS = {"gelu_fwd": (graphs.bias_gelu_stores, "kn"), "gelu_bwd": (graphs.gelu_backward_dbias, "kk"),
          "row_reduce": (graphs.design, "kk"), "plain": (graphs.identity, "kk"),
          # BERT's dX GEMM of the GELU derivative reads W N-major: overlap 128 x 128 ran it 3.6 % faster than
          # cooperative 128 x 256, and "auto" takes it there (tuning._light_kn_sums)
          "gelu_bwd_kn": (graphs.gelu_backward_dbias, "kn")}
#: (tile, cluster): the two ping-pong tiles in 1x1 clusters, 128x192 in 2x1 (the SwiGLU forward's best
#: ping-pong config at the Llama shapes) and 128x128 in 1x2: A and W multicast across the cluster
TILES = (((128, 128, 64), (1, 1)), ((64, 128, 64), (1, 1)), ((128, 192, 64), (2, 1)), ((128, 128, 64), (1, 2)))
BASE = TILES[0]
#: the ordered debugging kernel is built for the 1x1 tiles only (it tells a buffer bug from an order bug)
ORDERED = TILES[:2]
SCHEDULES = ("pingpong", "overlap_ordered", "overlap")
#: (M, N, K, persistent CTAs): none a tile multiple; 1-3 CTAs give each many tiles (9 to 72 a CTA, odd and
#: even counts per warp group); 0 is one CTA per SM.
SHAPES = [(333, 264, 72, 2), (1000, 1032, 264, 3), (777, 520, 136, 1), (2333, 2056, 136, 0)]
GPT2 = (16384, 3072, 768)


def config(tile, schedule, major):
    return ce.KernelConfig(tile[0], tile[1], schedule, swizzle=4, major=major)


def schedules(tile) -> tuple:
    return SCHEDULES if tile in ORDERED else ("pingpong", "overlap")


def tile_id(tile) -> str:
    (tm, tn, _), (cm, cn) = tile
    return f"{tm}x{tn}_c{cm}x{cn}"


def build_items(names=tuple(GRAPHS)) -> list:
    """(graph, dtype, config) of every kernel these tests launch (those of `names`' graphs), for
    `python -m coda_ext prebuild`."""
    return [(GRAPHS[n][0](), "bfloat16", config(tile, s, GRAPHS[n][1])) for n in names
            for tile in TILES for s in schedules(tile)]


@pytest.fixture(scope="module")
def ops(request):
    """The kernels of the graphs the selected tests take (pytest -k gelu_bwd_kn: that graph's only), built in
    parallel first."""
    from coda_ext.runtime import prebuild

    names = selected(request, "name", GRAPHS)
    prebuild(build_items(names), jobs=os.cpu_count())
    return {(name, tile, s): ce.compile(GRAPHS[name][0](), "bfloat16", config(tile, s, GRAPHS[name][1]))
            for name in names for tile in TILES for s in schedules(tile)}


def run(op, A, W, inputs, M, N, sm_count):
    """sm_count persistent clusters' worth of CTAs (0: the whole GPU)."""
    cm, cn = op.config.cluster
    op.sm_count = sm_count * cm * cn
    got = op(A, W, out=checks.nan_outputs(op, M, N), **inputs)
    torch.cuda.synchronize()
    return got


def assert_same_bits(got, want, label):
    assert set(got) == set(want), label
    for name in want:
        a, b = got[name], want[name]
        same = torch.equal(a, b) or (a.dtype.is_floating_point and torch.equal(torch.isnan(a), torch.isnan(b))
                                     and torch.equal(a.nan_to_num(), b.nan_to_num()))
        if not same:
            diff = (a.float() - b.float()).abs()
            where = torch.nonzero(diff.nan_to_num(float("inf")) > 0)
            pytest.fail(f"{label}/{name}: {len(where)} elements differ from ping-pong's, first at "
                        f"{where[:4].tolist()} (max |diff| {diff.nan_to_num(float('inf')).max().item():.3g})")


@pytest.mark.parametrize("M,N,K,sms", SHAPES, ids=[f"{m}x{n}x{k}_sm{s}" for m, n, k, s in SHAPES])
@pytest.mark.parametrize("tile", TILES, ids=tile_id)
@pytest.mark.parametrize("name", GRAPHS)
def test_overlap_is_bit_identical_to_pingpong_and_within_the_rule(ops, name, tile, M, N, K, sms):
    base = ops[(name, tile, "pingpong")]
    gen = rand.generator("overlap", name, M, N, K, device="cuda")
    A, W, inputs = rand.op_inputs(base, M, N, K, gen)
    want = run(base, A, W, inputs, M, N, sms)
    for schedule in schedules(tile)[1:]:   # the ordered debugging kernel first: the buffers, then the order
        label = f"{name}/{schedule}/{tile_id(tile)}/{M}x{N}x{K}/sm{sms}"
        got = run(ops[(name, tile, schedule)], A, W, inputs, M, N, sms)
        assert_same_bits(got, want, label)   # an element left unwritten (NaN-poisoned) differs too
    check_against_reference(ops[(name, tile, "overlap")], GRAPHS[name][0](), A, W, inputs, got, label)


def assert_relaunches_give_the_same_bits(op, name):
    """50 launches with 3 persistent CTAs (clusters; each many tiles) and 50 on the whole GPU: one result each
    (a race between warp groups' buffers would show up as a flip)."""
    M, N, K = 1000, 1032, 264
    A, W, inputs = rand.op_inputs(op, M, N, K, torch.Generator(device="cuda").manual_seed(11))
    for sms in (3, 0):
        first = run(op, A, W, inputs, M, N, sms)
        for i in range(50):
            assert_same_bits(run(op, A, W, inputs, M, N, sms), first, f"{name}/sm{sms}/launch {i + 1}")


@pytest.mark.parametrize("name", GRAPHS)
def test_overlap_relaunches_give_the_same_bits(ops, name):
    assert_relaunches_give_the_same_bits(ops[(name, BASE, "overlap")], name)


@pytest.mark.parametrize("name", ["gelu_fwd", "gelu_bwd", "gelu_bwd_kn"])
def test_overlap_at_gpt2_gelu_shapes(ops, name):
    M, N, K = GPT2
    base = ops[(name, BASE, "pingpong")]
    A, W, inputs = rand.op_inputs(base, M, N, K, rand.generator("gpt2", name, device="cuda"))
    want = run(base, A, W, inputs, M, N, 0)
    got = run(ops[(name, BASE, "overlap")], A, W, inputs, M, N, 0)
    assert_same_bits(got, want, f"{name}/gpt2")
    check_against_reference(ops[(name, BASE, "overlap")], GRAPHS[name][0](), A, W, inputs, got,
                            f"{name}/gpt2")
