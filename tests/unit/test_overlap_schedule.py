"""The "overlap" schedules without a GPU: ping-pong whose two math warp groups' epilogues may run at the same
time (csrc/kernels/sm90_pingpong_overlap.cuh) and its debugging twin with the epilogues ordered. The configs
accept and refuse what ping-pong does, have their own tags, emit the project's kernel, and the epilogue's
shared memory is counted once per warp group when the mainloop's stages are planned."""
from __future__ import annotations

import dataclasses
import pathlib

import pytest

import coda_ext as ce
from coda_ext import graphs
from coda_ext.codegen import constraints
from coda_ext.config import OVERLAP_SCHEDULES, PINGPONG_SCHEDULES, SCHEDULES
from coda_ext.graph.canonical import as_ir
from coda_ext.passes import lower

ROOT = pathlib.Path(__file__).resolve().parents[2]
PING = ce.KernelConfig((128, 128, 64), (1, 1), "pingpong", swizzle=4)


@pytest.mark.parametrize("schedule", OVERLAP_SCHEDULES)
def test_overlap_accepts_and_refuses_like_pingpong(schedule):
    assert schedule in SCHEDULES and schedule in PINGPONG_SCHEDULES
    for tile in ((64, 128, 64), (128, 128, 64), (128, 256, 64)):
        ce.KernelConfig(tile, (1, 1), schedule)
    ce.KernelConfig((128, 128, 64), (1, 1), schedule, epilogue_tile=(64, 64))
    with pytest.raises(ce.UnsupportedError, match=f"TILE_M=32 is not supported by the {schedule} schedule"):
        ce.KernelConfig((32, 128, 64), schedule=schedule)
    with pytest.raises(ce.UnsupportedError, match=rf"{schedule} schedule's epilogue runs subtiles of 64 rows"):
        ce.KernelConfig((128, 128, 64), schedule=schedule, epilogue_tile=(128, 64))


def test_overlap_tags_are_their_own():
    assert ce.KernelConfig((128, 128, 64), (1, 1), "overlap", swizzle=4).tag == "ppo_128x128x64_c1x1_s4"
    assert ce.KernelConfig((64, 128, 64), (1, 1), "overlap_ordered", major="kn").tag == "ppoo_64x128x64_c1x1_kn"
    tags = {ce.KernelConfig((128, 128, 64), schedule=s).tag for s in SCHEDULES}
    assert len(tags) == len(SCHEDULES)


@pytest.mark.parametrize("schedule,name", [("overlap", "PingpongOverlap"),
                                           ("overlap_ordered", "PingpongOverlapOrdered")])
def test_emitted_source_names_the_overlap_kernel(schedule, name):
    src = ce.emit_source(graphs.gelu_backward_dbias(), "bfloat16", dataclasses.replace(PING, schedule=schedule))
    assert f"coda::kernels::{name}>;" in src
    ping = ce.emit_source(graphs.gelu_backward_dbias(), "bfloat16", PING)
    assert "coda::kernels::Pingpong>;" in ping and "Overlap" not in ping
    # the names exist in the kernel templates, as the debugging switch of one kernel
    config = (ROOT / "csrc" / "kernels" / "config.cuh").read_text()
    assert f"using {name} = PingpongOverlapT<{str(schedule == 'overlap_ordered').lower()}>;" in config
    assert "#include \"sm90_pingpong_overlap.cuh\"" in (ROOT / "csrc" / "kernels" / "epilogue_gemm.cuh").read_text()


def test_overlap_epilogue_subtiles_and_column_partials_are_pingpongs():
    """64-row subtiles (CUTLASS's ping-pong epilogue, one warp group of 4 warps a tile), segments included."""
    over = dataclasses.replace(PING, schedule="overlap")
    assert constraints.epilogue_tile(over) == constraints.epilogue_tile(PING) == (64, 32)
    low = lower(as_ir(graphs.qkv_rope(False, True, 64)), "bfloat16")   # QK-norm: 64-wide segment reductions
    assert constraints.fit_config(low, over).epilogue_tile == (64, 64)
    bwd = lower(as_ir(graphs.gelu_backward_dbias()), "bfloat16")
    constraints.check_column_partials(bwd, "bfloat16", over)   # 4 warps x TILE_N fp32 partials fit a 64x32 subtile


def test_overlap_counts_the_epilogue_storage_once_per_warp_group():
    """GPT-2's GELU backward (a bf16 tile load and a column reduction) leaves one mainloop stage fewer in
    "overlap" than in ping-pong (the feasibility study's sizeof figures: 6 and 5 stages); a plain GEMM none."""
    for build, fewer in ((graphs.gelu_backward_dbias, 1), (graphs.identity, 0)):
        low = lower(as_ir(build()), "bfloat16")
        ping = constraints.mainloop_stages(low, "bfloat16", PING)
        for schedule in OVERLAP_SCHEDULES:
            over = constraints.mainloop_stages(low, "bfloat16", dataclasses.replace(PING, schedule=schedule))
            assert ping - over == fewer, (build.__name__, schedule, ping, over)
    assert constraints.epilogue_copies(PING) == 1
    assert constraints.epilogue_copies(dataclasses.replace(PING, schedule="overlap")) == 2


def test_overlap_refuses_an_epilogue_that_fits_pingpong_only():
    """swiglu_backward_linear (a pair tile, two stores) with 8 load stages fits ping-pong 128x128's shared memory
    once (4 mainloop stages) but not twice: the refusal names the per-warp-group copy."""
    cfg = ce.KernelConfig((128, 128, 64), (1, 1), "pingpong", epilogue_stages=(8, 2))
    ce.kernel_source(graphs.swiglu_backward_linear(), "bfloat16", cfg)
    with pytest.raises(ce.UnsupportedError, match="once per math warp group"):
        ce.kernel_source(graphs.swiglu_backward_linear(), "bfloat16", dataclasses.replace(cfg, schedule="overlap"))


def test_sweep_fusion_times_overlap_beside_pingpong():
    from benchmarks import sweep_fusion as sf

    alts = {(tile, cluster, schedule, swizzle) for tile, cluster, schedule, swizzle in sf.ALTERNATIVES}
    assert ((128, 128, 64), (1, 1), "pingpong", 4) in alts and ((128, 128, 64), (1, 1), "overlap", 4) in alts


def test_the_heuristic_picks_overlap_only_in_1x1_clusters():
    """tuning.py's one overlap config is ping-pong 128x128 in a 1x1 cluster (the tested kernel); the ordered
    variant, a debugging switch, is never picked."""
    from coda_ext import tuning

    picked = [v for v in vars(tuning).values() if isinstance(v, ce.KernelConfig) and v.schedule in OVERLAP_SCHEDULES]
    assert picked == [tuning.OVERLAP] and tuning.OVERLAP.cluster == (1, 1)
    assert tuning.OVERLAP == dataclasses.replace(tuning.PINGPONG, schedule="overlap")


@pytest.mark.parametrize("schedule", ["overlap", "overlap_ordered"])
def test_overlap_refuses_untested_clusters(schedule):
    """The overlap kernel ran on a GPU in 1x1, 2x1 and 1x2 clusters: a 2x2 cluster is refused before any build,
    with the fix; the tested ones are taken."""
    with pytest.raises(ce.UnsupportedError, match=r"clusters .*got cluster=\(2, 2\).*pingpong"):
        ce.KernelConfig((128, 128, 64), (2, 2), schedule)
    for cluster in ((1, 1), (2, 1), (1, 2)):
        assert ce.KernelConfig((128, 128, 64), cluster, schedule).cluster == cluster
    assert ce.KernelConfig((128, 128, 64), (2, 2), "pingpong").cluster == (2, 2)
