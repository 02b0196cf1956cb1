"""KernelConfig(tile_loads="direct") on an SM90 GPU: the epilogue's tile inputs read from global memory straight
into registers, a subtile ahead (csrc/epilogues/direct_tile_load.hpp), instead of TMA loads through shared memory;
and KernelConfig(pair_smem="staggered"): the 32-bit pair tiles and pair stores accessed in shared memory as two
staggered 4-byte halves (csrc/epilogues/staggered_pairs.hpp) instead of one 8-byte access; and
KernelConfig(epilogue_cache="evict_first"): the epilogue's TMA tile loads and stores with the L2 evict-first hint
(csrc/epilogues/evict_first.hpp); and KernelConfig(epilogue_cache="prefetch"): each tile's inputs prefetched into L2
as the producer warp starts the tile (csrc/epilogues/variants/l2_prefetch.hpp); and KernelConfig(tile_stores="direct"):
the tile outputs written from registers (csrc/epilogues/variants/direct_store.hpp); and KernelConfig(timeline=True):
the epilogue's per-tile timeline recorded (csrc/epilogues/variants/timeline.hpp), its buffer filled.

Every output equals the TMA-loading kernel's of the same config bit for bit (the same values reach the same
epilogue math), at shapes that are no tile multiple (the loads are predicated on the problem's bounds) with a few
persistent CTAs, so each runs many tiles; and is within the numerics rule against the fp64 interpreter. Graphs: a
16-bit tile with a column reduction, a tile with a row vector and a row reduction, the dSwiGLU's pair tile, the
RMSNorm backward's two tiles. Epilogue collectives: CUTLASS's ping-pong (64-row subtiles) and cooperative
(128-row), and the project's overlap and handoff kernels.

    python -m coda_ext prebuild tests/gpu/test_direct_tile_loads_gpu.py
    python -m pytest -x -q tests/gpu/test_direct_tile_loads_gpu.py
"""
from __future__ import annotations

import dataclasses
import os

import pytest

import coda_ext as ce
from coda_ext import graphs
from coda_ext.graphs import backward
from tests.gpu.test_numerics import check_against_reference
from tests.gpu.test_overlap_gpu import assert_same_bits, run
from tests.helpers import rand

#: name -> (builder, operand layout)
GRAPHS = {"gelu_bwd": (graphs.gelu_backward_dbias, "kk"), "row_reduce": (graphs.design, "kk"),
          "dswiglu": (backward.swiglu_backward_linear, "kn"),
          "rms_backward": (lambda: backward.rms_norm_backward_linear(True), "kn")}
CONFIGS = {"ping": ce.KernelConfig((128, 128, 64), (1, 1), "pingpong", swizzle=4),
           "coop": ce.KernelConfig((128, 256, 64), (2, 1), "cooperative", swizzle=4)}
#: the project's collectives, with the dSwiGLU only
MORE = {"overlap": ce.KernelConfig((128, 128, 64), (1, 1), "overlap", swizzle=4, epilogue_stages=(2, 1)),
        "handoff": ce.KernelConfig((128, 128, 64), (2, 1), "handoff", swizzle=8, epilogue_stages=(2, 1))}
#: (M, N, K, persistent CTAs): none a tile multiple (N even for the pair graph)
SHAPES = [(333, 264, 72, 2), (1000, 1032, 264, 3), (2333, 2056, 136, 0)]


def cases() -> list:
    """(name, config name): every graph in CONFIGS, the dSwiGLU in MORE too."""
    return [(g, c) for g in GRAPHS for c in CONFIGS] + [("dswiglu", c) for c in MORE]


#: the variants each case runs beside the TMA-loading, vector-accessing kernel; "staggered" only where the
#: graph has pair tiles or pair stores (the dSwiGLU); "evict_first" (the epilogue's TMA loads and stores with the
#: L2 evict-first hint, csrc/epilogues/evict_first.hpp) for the backward graphs in CUTLASS's collectives, and
#: with the staggered pairs together ("staggered_ef", "auto"'s dSwiGLU with the hint); "prefetch" (each tile's
#: inputs prefetched into L2 as the producer warp starts it, csrc/epilogues/variants/l2_prefetch.hpp) for the
#: backward graphs in every collective, the dSwiGLU's with the staggered pairs too ("staggered_pf"); "direct_stores"
#: (the tile outputs written from registers, csrc/epilogues/variants/direct_store.hpp) likewise ("staggered_ds");
#: "timeline" (the epilogue's per-tile timeline recorded) in ping-pong, "auto"'s dSwiGLU with it ("staggered_tl")
VARIANTS = {"direct": dict(tile_loads="direct"), "staggered": dict(pair_smem="staggered"),
            "evict_first": dict(epilogue_cache="evict_first"),
            "staggered_ef": dict(pair_smem="staggered", epilogue_cache="evict_first"),
            "prefetch": dict(epilogue_cache="prefetch"),
            "staggered_pf": dict(pair_smem="staggered", epilogue_cache="prefetch"),
            "direct_stores": dict(tile_stores="direct"),
            "staggered_ds": dict(pair_smem="staggered", tile_stores="direct"),
            "timeline": dict(timeline=True), "staggered_tl": dict(pair_smem="staggered", timeline=True)}


def variants(name: str, cfg: str = "ping") -> tuple:
    backward_graph = name in ("dswiglu", "rms_backward")
    hinted = ("evict_first",) if backward_graph and cfg in CONFIGS else ()
    prefetched = ("prefetch", "direct_stores") if backward_graph else ()
    traced = cfg == "ping" and backward_graph
    if name == "dswiglu":
        return ("tma", "direct", "staggered") + hinted + (("staggered_ef",) if hinted else ()) + prefetched + \
            ("staggered_pf", "staggered_ds") + (("staggered_tl",) if traced else ())
    return ("tma", "direct") + hinted + prefetched + (("timeline",) if traced else ())


def config(name: str, cfg: str, variant: str) -> ce.KernelConfig:
    return dataclasses.replace({**CONFIGS, **MORE}[cfg], major=GRAPHS[name][1], **VARIANTS.get(variant, {}))


def build_items() -> list:
    """(graph, dtype, config) of every kernel these tests launch, for `python -m coda_ext prebuild`."""
    return [(GRAPHS[g][0](), "bfloat16", config(g, c, v)) for g, c in cases() for v in variants(g, c)]


@pytest.fixture(scope="module")
def ops():
    from coda_ext.runtime import prebuild

    prebuild(build_items(), jobs=os.cpu_count())
    return {(g, c, v): ce.compile(GRAPHS[g][0](), "bfloat16", config(g, c, v)) for g, c in cases()
            for v in variants(g, c)}


@pytest.mark.parametrize("M,N,K,sms", SHAPES, ids=[f"{m}x{n}x{k}_sm{s}" for m, n, k, s in SHAPES])
@pytest.mark.parametrize("name,cfg", cases(), ids=[f"{g}-{c}" for g, c in cases()])
def test_variants_are_bit_identical_to_tma_and_within_the_rule(ops, name, cfg, M, N, K, sms):
    base = ops[(name, cfg, "tma")]
    A, W, inputs = rand.op_inputs(base, M, N, K, rand.generator("direct", name, M, N, K, device="cuda"))
    want = run(base, A, W, inputs, M, N, sms)
    for variant in variants(name, cfg)[1:]:
        op = ops[(name, cfg, variant)]
        label = f"{name}/{cfg}/{variant}/{M}x{N}x{K}/sm{sms}"
        got = run(op, A, W, inputs, M, N, sms)
        assert_same_bits(got, want, label)
        check_against_reference(op, GRAPHS[name][0](), A, W, inputs, got, label)


def test_direct_tile_loads_take_no_shared_memory():
    """The dSwiGLU's pair tile leaves the mainloop its stages: ping-pong 128 x 128 at CUTLASS's epilogue stages."""
    from coda_ext.codegen import constraints
    from coda_ext.graph.canonical import as_ir
    from coda_ext.passes import lower

    low = lower(as_ir(backward.swiglu_backward_linear()), "bfloat16")
    tma, direct = (constraints.mainloop_stages(low, "bfloat16", config("dswiglu", "ping", loads))
                   for loads in ("tma", "direct"))
    assert direct > tma


def test_timeline_records_every_tile(ops):
    """The timeline kernel fills one slot row per output tile: its epilogue's start and end in order, its warp
    group, every subtile's steps in CUTLASS's order (benchmarks/epilogue_timeline.py reads the same buffer). N has
    9 tiles, which the scheduler's swizzle 4 rounds up to 12: the 3 tiles a row past N must record nothing
    (regression: their slots were the next row's first tiles)."""
    import ctypes

    import numpy as np
    import torch

    from benchmarks import epilogue_timeline as tl

    op = ops[("dswiglu", "ping", "staggered_tl")]
    M, N, K = 1000, 1032, 264
    A, W, inputs = rand.op_inputs(op, M, N, K, rand.generator("timeline", M, N, K, device="cuda"))
    assert op._lib.coda_timeline_clear() == 0
    op(A, W, **inputs)
    torch.cuda.synchronize()
    buf = np.zeros(tl.TILES * tl.SLOTS, dtype=np.uint64)
    assert op._lib.coda_timeline_copy(ctypes.c_void_p(buf.ctypes.data), ctypes.c_ulonglong(buf.nbytes)) == 0
    rows = buf.reshape(tl.TILES, tl.SLOTS)
    tiles = -(-M // 128) * -(-N // 128)
    bad = [(t, int(r[0]), int(r[1]), int(r[127])) for t, r in enumerate(rows[:tiles])
           if not (r[0] and r[1] > r[0] and r[127] in (1, 2))]
    assert not bad, f"{len(bad)} of {tiles} tiles without a begin < end from a math warp group: {bad[:8]}"
    extra = [t for t in range(tiles, len(rows)) if rows[t].any()]
    assert not extra, f"slots written past the {tiles} tiles: rows {extra[:8]} ({len(extra)} in all)"
    for r in rows[:tiles]:   # begin_loop, previsit, postreduce, end_loop in order; subtile s's TMA store issued
        # during subtile s + 1 (after its previsit, before its postreduce), the last one's after the loop
        steps = [int(r[2 + 5 * s + k]) for s in range(8) for k in (0, 1, 2, 4)]
        assert steps == sorted(steps) and int(r[0]) <= steps[0] and steps[-1] <= int(r[1])
        for s in range(7):
            assert int(r[3 + 5 * (s + 1)]) <= int(r[5 + 5 * s]) <= int(r[4 + 5 * (s + 1)])
        assert int(r[6 + 5 * 7]) <= int(r[5 + 5 * 7]) <= int(r[1])
    assert tl.analyse(rows)["tiles"] == tiles
