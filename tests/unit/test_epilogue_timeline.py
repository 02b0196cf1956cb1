"""KernelConfig(timeline=True) without a GPU: the first accumulator node of the graph is emitted as the recording
node of its variant header (csrc/epilogues/variants/timeline.hpp), the kernel library exports the buffer's clear and
copy functions, the tag says so, and benchmarks/epilogue_timeline.py's analysis recovers a known schedule: two warp
groups alternating 10 µs of MMAs with 12 µs epilogues (epilogue-bound by 2 µs every other tile)."""
from __future__ import annotations

import dataclasses
import pathlib

import numpy as np
import pytest

import coda_ext as ce
from benchmarks import epilogue_timeline as tl
from coda_ext import graphs

ROOT = pathlib.Path(__file__).resolve().parents[2]
PING = ce.KernelConfig((128, 128, 64), (1, 1), "pingpong", swizzle=4, major="kn")


def test_timeline_wraps_the_first_accumulator_and_exports_the_buffer():
    on = dataclasses.replace(PING, timeline=True)
    assert on.tag == PING.tag + "_tl" and not PING.timeline
    with pytest.raises(ce.UnsupportedError, match="timeline must be True or False, got 'yes'"):
        ce.KernelConfig(timeline="yes")
    src = ce.emit_source(graphs.swiglu_backward_linear(), "bfloat16", on)
    assert src.count("TimelineAccumulator;") == 1 and "= Accumulator;" in src   # its second use stays plain
    assert '#include "epilogues/variants/timeline.hpp"' in src
    assert "Timeline" not in ce.emit_source(graphs.swiglu_backward_linear(), "bfloat16", PING)
    header = (ROOT / "csrc" / "epilogues" / "variants" / "timeline.hpp").read_text()
    for name in ("coda_timeline_clear()", "coda_timeline_copy(void* dst", "struct TimelineAccumulator {"):
        assert name in header
    assert f"kTimelineSlots = {tl.SLOTS};" in header and f"kTimelineSubtiles = {tl.SUBTILES};" in header
    assert f"kTimelineTiles = {tl.TILES};" in header


def _schedule(mma: int, epilogue: int, tiles: int = 40, subtiles: int = 8) -> np.ndarray:
    """A ping-pong SM's timeline (cycles at 2 GHz): warp groups 1 and 2 take turns on the tensor cores; a turn starts
    when the other group's MMAs are done and the group's own previous epilogue is."""
    buf = np.zeros((tl.TILES, tl.SLOTS), dtype=np.uint64)
    last, ends = 1000, {1: 0, 2: 0}
    for k in range(tiles):
        wg = 1 + k % 2
        b = max(last, ends[wg]) + mma
        e = b + epilogue
        r = buf[k]
        r[0], r[1], r[124], r[125], r[126], r[127] = b, e, b // 2, e // 2, 0, wg
        for s in range(subtiles):   # begin_loop, previsit, postreduce, end_loop; subtile s - 1's store issue
            t = b + s * 3000
            r[2 + 5 * s: 7 + 5 * s] = (t, t + 500, t + 2000, 0, t + 2100)
            if s:
                r[5 + 5 * (s - 1)] = t + 1500
            r[83 + s] = t - 1000
        ends[wg], last = e, b
    return buf


def test_analysis_recovers_a_known_schedule():
    a = tl.analyse(_schedule(20000, 24000))
    assert a["tiles"] == 40 and a["clock_ghz"] == pytest.approx(2.0)
    assert a["epilogue"] == pytest.approx(12.0) and a["subtiles"] == 8
    assert [a[s] for s in tl.STEPS] == pytest.approx([0.25, 0.5, 0.25, 0.5])
    assert a["load_lead"] == pytest.approx(0.5) and a["loads_late"] == 0
    assert a["mma_mean"] == pytest.approx(10.0)
    assert a["period_mean"] == pytest.approx(11.0, rel=0.03)         # 12, 10, 12, 10 ... µs
    assert a["epilogue_bound_mean"] == pytest.approx(1.0, rel=0.03)  # 2 µs every other tile
    assert a["epilogue_share"] == pytest.approx(1.2) and a["handover"] == pytest.approx(-2.0)   # a median tile: 10 µs
    hidden = tl.analyse(_schedule(20000, 16000))                      # an epilogue shorter than the MMAs
    assert hidden["period_mean"] == pytest.approx(10.0) and hidden["epilogue_bound_mean"] == 0
    assert hidden["epilogue_share"] == pytest.approx(0.8) and hidden["handover"] == pytest.approx(2.0)


def test_analysis_of_one_tile_per_sm_reads_the_clock_from_all_tiles():
    """Regression: a problem with fewer tiles than SMs (the GPU test's) left no SM with two tiles, and the per-SM
    clock's median had no data."""
    buf = _schedule(20000, 24000, tiles=6)
    buf[:6, 126] = np.arange(6)   # every tile on its own SM
    a = tl.analyse(buf)
    assert a["tiles"] == 6 and a["clock_ghz"] == pytest.approx(2.0) and a["epilogue"] == pytest.approx(12.0)
    assert a["period"] is None and a["epilogue_bound_share"] is None


def test_ablation_adds_the_dswiglu_parts_in_the_heuristic_config():
    """--ablate times the dSwiGLU's ablation variants and its math alone (no tile input: the accumulator stands in
    for gate and up) in the same timeline config as the whole epilogue."""
    from coda_ext.graph.canonical import as_ir

    graphs_ = tl.ablation_graphs()
    assert list(graphs_)[-1] == "math only, no z" and "z in; D=acc*u" in graphs_
    math_only = as_ir(graphs_["math only, no z"])
    assert not math_only.find("pair_tile") and not math_only.find("tile") and math_only.find("sigmoid")
    items = tl.build_items(models=("1B",), ops=("swiglu_backward_linear",), ablate=True)
    configs = {c for _, _, c in items if c.timeline}
    assert len(configs) == 1 and len(items) == 3 + len(graphs_)
