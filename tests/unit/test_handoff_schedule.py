"""The "handoff" schedule without a GPU: cooperative MMAs whose epilogue runs on two warp groups of its own
(csrc/kernels/sm90_cooperative_handoff.cuh). The configs accept the tiles its math threads' registers hold and
refuse the rest with the fix, have their own tag, emit the project's kernel, and the accumulator buffer is
counted when the mainloop's stages are planned."""
from __future__ import annotations

import dataclasses
import pathlib

import pytest

import coda_ext as ce
from coda_ext import graphs
from coda_ext.codegen import constraints
from coda_ext.config import HANDOFF_TILES, PINGPONG_SCHEDULES, SCHEDULES
from coda_ext.graph.canonical import as_ir
from coda_ext.passes import lower

ROOT = pathlib.Path(__file__).resolve().parents[2]
HOFF = ce.KernelConfig((128, 128, 64), (2, 1), "handoff", swizzle=8)
COOP = dataclasses.replace(HOFF, schedule="cooperative")


def test_handoff_accepts_its_tiles_and_refuses_the_rest_with_the_fix():
    assert "handoff" in SCHEDULES and "handoff" not in PINGPONG_SCHEDULES
    for tm, tn in HANDOFF_TILES:
        for cluster in ((1, 1), (2, 1), (1, 2)):
            ce.KernelConfig((tm, tn, 64), cluster, "handoff")
    for tile in ((128, 256, 64), (256, 128, 64), (128, 192, 64)):
        with pytest.raises(ce.UnsupportedError, match=r"handoff schedule runs tiles .*96 registers.*cooperative"):
            ce.KernelConfig(tile, (1, 1), "handoff")
    with pytest.raises(ce.UnsupportedError, match="TILE_M=64 is not supported by the handoff schedule"):
        ce.KernelConfig((64, 128, 64), (1, 1), "handoff")
    with pytest.raises(ce.UnsupportedError, match=r"handoff schedule runs in clusters .*cluster=\(2, 2\)"):
        ce.KernelConfig((128, 128, 64), (2, 2), "handoff")
    # 128-row epilogue subtiles, as the cooperative epilogue it runs
    ce.KernelConfig((128, 128, 64), (1, 1), "handoff", epilogue_tile=(128, 16))
    with pytest.raises(ce.UnsupportedError, match="handoff schedule's epilogue runs subtiles of 128 rows"):
        ce.KernelConfig((128, 128, 64), (1, 1), "handoff", epilogue_tile=(64, 32))


def test_handoff_tag_and_emitted_kernel():
    assert HOFF.tag == "hoff_128x128x64_c2x1_s8"
    src = ce.emit_source(graphs.design(), "bfloat16", HOFF)
    assert "coda::kernels::CooperativeHandoff>;" in src
    config = (ROOT / "csrc" / "kernels" / "config.cuh").read_text()
    assert "struct CooperativeHandoff : Cooperative {" in config
    assert "#include \"sm90_cooperative_handoff.cuh\"" in (ROOT / "csrc" / "kernels" / "epilogue_gemm.cuh").read_text()


def test_handoff_runs_the_cooperative_epilogue():
    """128-row subtiles and 8 warps of column partials, as the cooperative schedule's."""
    assert constraints.epilogue_tile(HOFF) == constraints.epilogue_tile(COOP) == (128, 32)
    bwd = lower(as_ir(graphs.gelu_backward_dbias()), "bfloat16")
    constraints.check_column_partials(bwd, "bfloat16", HOFF)
    assert constraints.epilogue_copies(HOFF) == 1


def test_handoff_counts_the_accumulator_buffer():
    """Two chunk buffers of a quarter of a 128 x 128 tile's fp32 accumulators (32 KB) come out of the mainloop's
    stages (32 KB each): one fewer than the cooperative kernel of the same tile (the dSwiGLU at (2, 1): 4)."""
    low = lower(as_ir(graphs.identity()), "bfloat16")
    assert constraints.handoff_bytes(HOFF) == 128 * 128 * 2 and constraints.handoff_bytes(COOP) == 0
    assert constraints.mainloop_stages(low, "bfloat16", COOP) - constraints.mainloop_stages(low, "bfloat16", HOFF) == 1
    dswiglu = lower(as_ir(graphs.swiglu_backward_linear()), "bfloat16")
    assert constraints.mainloop_stages(dswiglu, "bfloat16", dataclasses.replace(HOFF, epilogue_stages=(2, 1))) == 4


def test_handoff_refusal_names_the_accumulator_buffer():
    """The dSwiGLU's epilogue with 6 load stages fits the cooperative 128 x 128 kernel (2 mainloop stages) but not
    beside the handoff buffers; with (2, 1) it fits."""
    dswiglu = graphs.swiglu_backward_linear()
    ce.kernel_source(dswiglu, "bfloat16", dataclasses.replace(COOP, epilogue_stages=(6, 2)))
    with pytest.raises(ce.UnsupportedError, match="the accumulator handoff 32 KB"):
        ce.kernel_source(dswiglu, "bfloat16", dataclasses.replace(HOFF, epilogue_stages=(6, 2)))
    ce.kernel_source(dswiglu, "bfloat16", dataclasses.replace(HOFF, epilogue_stages=(2, 1)))


def test_sweep_backward_times_handoff():
    from benchmarks import sweep_backward as sb

    tags = {c.tag for c in sb.configs("kn", loads=True)}
    assert {"hoff_128x128x64_c2x1_s8_kn", "hoff_128x128x64_c2x1_s8_kn_ec2d1"} <= tags
