"""Config selection (coda_ext.tuning): buckets, the on-disk memory, and dispatch — on the CPU,
with the compile step and the timer replaced by fakes."""
from __future__ import annotations

import dataclasses
import sys
import types

import pytest

import coda_ext as ce
from coda_ext import graphs, tuning
from coda_ext.runtime import TunedOp


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CODA_EXT_CACHE_DIR", str(tmp_path / "cache"))


def _graph():
    return graphs.silu_acc()


def test_m_buckets():
    assert [tuning.m_bucket(m) for m in (1, 64, 65, 128, 129, 1000, 16384, 10**6)] == \
        [64, 64, 128, 128, 256, 1024, 16384, 16384]


def test_memory_round_trip_and_key():
    key = tuning.memory_key("abc", "bfloat16", 4096, 1024, 300, "NVIDIA H100 80GB HBM3")
    assert key == "abc|bfloat16|N=4096|K=1024|M<=512|NVIDIA H100 80GB HBM3"
    assert tuning.load_memory() == {}
    tuning.remember(key, "ping_128x128x64_c1x1_s4", {"ping_128x128x64_c1x1_s4": 1.0})
    tuning.remember("other", "x", {})
    mem = tuning.load_memory()
    assert mem[key]["config"] == "ping_128x128x64_c1x1_s4" and set(mem) == {key, "other"}


def test_candidates_are_distinct_and_cover_the_heuristic():
    tags = [c.tag for c in tuning.CANDIDATES]
    assert len(set(tags)) == len(tags) and ce.DEFAULT_CONFIG in tuning.HEURISTIC_CONFIGS
    assert set(tuning.HEURISTIC_CONFIGS) <= set(tuning.CANDIDATES)


PLAIN = tuning.Epilogue(plain=True)
POINTWISE = tuning.Epilogue()
TILE = tuning.Epilogue(tile_load=True)
COLRED = tuning.Epilogue(col_reduce=True)


@pytest.mark.parametrize("M,N,K,plain,pointwise,tile,colred", [
    # the shapes: many tiles
    (16384, 28672, 4096, "TALL_192_ALONG_N", "TALL_192_ALONG_N", "TALL_192_ALONG_N", "LARGE_TALL"),
    (8192, 128256, 4096, "TALL_192_ALONG_N", "TALL_192_ALONG_N", "TALL_192_ALONG_N", "LARGE_TALL"),
    (4096, 128256, 2048, "TALL_192", "TALL_192", "TALL_192", "LARGE_TALL"),   # A (16 MiB) stays in L2
    (16384, 4096, 14336, "LARGE_TALL", "LARGE_TALL", "LARGE_TALL", "LARGE_TALL"),
    (16384, 2048, 8192, "LARGE_TALL", "LARGE_TALL", "LARGE_TALL", "LARGE_TALL"),
    (16384, 6144, 4096, "TALL_192_S8", "TALL_192_S8", "TALL_192_S8", "LARGE_TALL"),
    (16384, 16384, 2048, "TALL_192_S8", "TALL_192_S8", "TALL_192_S8", "LARGE_TALL"),
    # 43 N tiles of 192: swizzle 8 padded them to 48 in CUTLASS's grid; walked along N the fitted grid pads none
    (8192, 8192, 4096, "TALL_192_S8", "TALL_192_S8", "TALL_192_S8", "LARGE_TALL"),
    # the rules below the 128x192 one (a graph whose epilogue a 128x192 tile does not fit)
    # a wave or so, and M <= 128
    (1024, 28672, 4096, "LARGE", "LARGE", "LARGE", "LARGE"),
    (1024, 4096, 14336, "MEDIUM", "MEDIUM", "MEDIUM", "MEDIUM"),
    (1024, 6144, 4096, "WAVE_FILL", "WAVE_FILL", "WAVE_FILL", "WAVE_FILL"),
    (128, 28672, 4096, "SKINNY", "SKINNY", "SKINNY", "SKINNY"),
    (128, 4096, 14336, "SKINNY", "SKINNY", "SKINNY", "SKINNY"),
    (1, 4096, 4096, "SKINNY", "SKINNY", "SKINNY", "SKINNY"),
])
def test_heuristic(M, N, K, plain, pointwise, tile, colred):
    for epilogue, expected in ((PLAIN, plain), (POINTWISE, pointwise), (TILE, tile), (COLRED, colred)):
        got = tuning.heuristic(M, N, K, epilogue=epilogue)
        assert got == getattr(tuning, expected), (epilogue, got.tag)
        assert _kernel_of(got, tuning.heuristic_configs(epilogue))


def _kernel_of(config, configs) -> bool:
    """Whether config is one of configs but for its launch arguments (swizzle, raster: the same kernel)."""
    return any(dataclasses.replace(config, swizzle=c.swizzle, raster=c.raster) == c for c in configs)


@pytest.mark.parametrize("M,N,K,plain,pointwise,tile", [
    (16384, 28672, 4096, "LARGE_TALL", "WIDE", "LARGE_TALL"),
    (8192, 128256, 4096, "LARGE_TALL", "WIDE", "LARGE_TALL"),
    (16384, 6144, 4096, "LARGE_TALL", "PINGPONG_S8", "PINGPONG_S8"),
    (16384, 16384, 2048, "LARGE_TALL", "PINGPONG", "PINGPONG"),
])
def test_heuristic_without_the_192_tile(M, N, K, plain, pointwise, tile):
    """Where a 128x192 tile does not fit the epilogue (a 128-column segment, too little shared memory)."""
    for epilogue, expected in ((PLAIN, plain), (POINTWISE, pointwise), (TILE, tile)):
        epilogue = dataclasses.replace(epilogue, tall_192=False)
        got = tuning.heuristic(M, N, K, epilogue=epilogue)
        assert got == getattr(tuning, expected), (epilogue, got.tag)
        assert _kernel_of(got, tuning.heuristic_configs(epilogue))
        assert all(c.tile[:2] != (128, 192) for c in tuning.heuristic_configs(epilogue))


def test_the_192_tile_rule():
    """Ping-pong 128x192 at M >= 4096, K <= 4096, N >= 6144, K-major operands, no column reduction:
    swizzle 4 above N = 16384, else 8; pair graphs at N <= 16384 in 2x1 clusters."""
    pairs = tuning.Epilogue(pairs=True)
    assert tuning.heuristic(16384, 28672, 4096, epilogue=pairs) == tuning.TALL_192_ALONG_N
    assert tuning.heuristic(16384, 16384, 2048, epilogue=pairs) == tuning.TALL_192_PAIRS
    assert tuning.heuristic(16384, 16384, 2048, epilogue=POINTWISE).swizzle == 8
    assert tuning.heuristic(4096, 6144, 4096, epilogue=POINTWISE) == tuning.TALL_192_S8
    # outside the measured region the other rules decide
    assert tuning.heuristic(2048, 28672, 4096, epilogue=POINTWISE).tile[:2] != (128, 192)
    assert tuning.heuristic(16384, 4096, 4096, epilogue=POINTWISE).tile[:2] != (128, 192)
    assert tuning.heuristic(16384, 6144, 8192, epilogue=POINTWISE).tile[:2] != (128, 192)
    assert tuning.heuristic(16384, 6144, 4096, epilogue=POINTWISE, major="kn") == tuning.PINGPONG
    assert tuning.TALL_192_PAIRS in tuning.heuristic_configs(pairs)
    assert tuning.TALL_192_S8 not in tuning.heuristic_configs(pairs)
    assert not any(c.tile[:2] == (128, 192) for c in tuning.heuristic_configs(POINTWISE, "kn"))


def test_a_graph_with_128_column_segments_never_takes_the_192_tile():
    """segment_reduce(size=128) (QK-norm) needs TILE_N a multiple of 128: auto and tune skip 128x192."""
    from coda_ext.jit import kernel_source

    g = ce.Graph()
    acc = g.accumulator()
    g.output(acc * ce.rsqrt(ce.segment_reduce(acc * acc, 128, "sum")))
    e = tuning.Epilogue.of(kernel_source(g, "bfloat16").lowered)
    assert not e.tall_192
    op = TunedOp(g, "bfloat16", tune=True)
    assert all(c.tile[:2] != (128, 192) for c in op.candidates)
    assert all(c.tile[:2] != (128, 192) for _, _, c in op.prebuild_items())
    assert op.config_for(16384, 6144, 4096).tile[:2] != (128, 192)


def test_epilogue_kind_of_a_graph():
    from coda_ext.jit import kernel_source

    def kind(build):
        g = ce.Graph()
        build(g, g.accumulator())
        e = tuning.Epilogue.of(kernel_source(g, "bfloat16").lowered)
        assert e.large_stages >= 3      # light epilogues leave the 128x256 mainloop its stages
        assert 2 <= e.nodes <= tuning.LIGHT_NODES
        assert e.overlap_stages >= 3    # ... and the overlap schedule's, which holds two copies of the epilogue
        assert e.overlap_stages >= e.pingpong_stages - 1
        return dataclasses.replace(e, large_stages=tuning.Epilogue().large_stages, tall_192=True, nodes=0,
                                   overlap_stages=tuning.Epilogue().overlap_stages,
                                   pingpong_stages=tuning.Epilogue().pingpong_stages)

    assert kind(lambda g, acc: g.output(acc)) == PLAIN
    assert kind(lambda g, acc: g.output(ce.cast(acc, "float32"))) == PLAIN
    assert kind(lambda g, acc: g.output(ce.silu(acc + g.row_vector("b")))) == POINTWISE
    assert kind(lambda g, acc: g.output(acc + g.tile("r"))) == TILE
    assert kind(lambda g, acc: (g.output(acc), g.col_reduce("c", acc, "sum"))) == COLRED


def test_mid_n_takes_128x192_for_a_rope_sized_epilogue_without_tile_loads():
    """3072 <= N < 6144 divisible by 192 (Llama-1B's QKV), K >= 2048, no tile load, at most ROPE_NODES lowered nodes:
    ping-pong 128x192 (QKV + RoPE 1.033-1.037x cuBLAS against 1.088-1.095x, sweep_residual_qkv_h200.json); a tile
    load (linear + residual + norm, slower there), a heavier epilogue, a short K or N that 192 does not divide keep
    ping-pong 128x128."""
    rope = dataclasses.replace(POINTWISE, nodes=9)
    assert tuning.heuristic(16384, 3072, 2048, epilogue=rope) == tuning.TALL_192_S8
    assert tuning.heuristic(16384, 4224, 2048, epilogue=rope) == tuning.TALL_192_S8
    assert tuning.heuristic(16384, 3072, 2048, epilogue=dataclasses.replace(TILE, nodes=8)).tile[:2] == (128, 128)
    assert tuning.heuristic(16384, 3072, 2048, epilogue=dataclasses.replace(POINTWISE, nodes=19)).tile[:2] == (128, 128)
    assert tuning.heuristic(16384, 3072, 1024, epilogue=rope).tile[:2] != (128, 192)
    assert tuning.heuristic(16384, 3200, 2048, epilogue=rope).tile[:2] != (128, 192)


def test_wide_deep_pingpong_takes_swizzle_8():
    """Ping-pong 128x128 at N >= 6144 and K >= 4096 with 32 or more M tiles, K-major (an epilogue that 128x192 tiles
    do not fit: QK-norm over 128-wide heads at Llama-8B's 16384x6144x4096): swizzle 8 (1.068x cuBLAS against 1.093x,
    sweep_qknorm8b_h200.json), the same kernel; a shorter K, fewer M tiles, a tile load (unmeasured) or N-major
    operands keep swizzle 4, and libcoda's one-launch kernels PINGPONG's."""
    heads_128 = dataclasses.replace(POINTWISE, nodes=19, tall_192=False)
    cfg = tuning.heuristic(16384, 6144, 4096, epilogue=heads_128)
    assert cfg == tuning.PINGPONG_S8 and cfg.swizzle == 8 and cfg.kernel == tuning.PINGPONG.kernel
    assert tuning.heuristic(16384, 6144, 2048, epilogue=heads_128).swizzle == 4
    assert tuning.heuristic(2048, 6144, 4096, epilogue=heads_128) != tuning.PINGPONG_S8
    assert tuning.heuristic(16384, 6144, 4096, epilogue=heads_128, major="kn") != tuning.PINGPONG_S8
    # a tile load too; N = 2048 and K = 2048 keep swizzle 4
    loads = dataclasses.replace(heads_128, tile_load=True)
    assert tuning.heuristic(16384, 6144, 4096, epilogue=loads) == tuning.PINGPONG_S8
    assert tuning.heuristic(16384, 2048, 2048, epilogue=loads).swizzle == 4
    assert tuning.heuristic(16384, 4096, 2048, epilogue=loads).swizzle == 4
    assert tuning.for_every_m(tuning.PINGPONG_S8) == tuning.PINGPONG


def test_pingpong_at_n_4096_takes_swizzle_8_along_m():
    """Ping-pong 128x128 at 4096 <= N < 6144 and K >= 4096 with 32 or more M tiles, K-major or W read N-major (the dX
    GEMMs): swizzle 8 rastered along M, the same kernel (Llama-8B's linear + residual + norm statistic 1.044x cuBLAS
    against 1.072x at swizzle 4, its RMSNorm backward 1.072x against 1.095x, its dX GEMM 1.005x against 1.027x; H200,
    sweep_residual_norm_raster_h200.json, sweep_backward_kn_launch_h200.json), also where a 128x256 epilogue would
    leave its mainloop too few stages (the RMSNorm backward's); N = 2048 (Llama-1B), fewer M tiles, a shorter K and
    weight gradients keep their choice."""
    loads = dataclasses.replace(POINTWISE, nodes=19, tall_192=False, tile_load=True)
    for major in ("kk", "kn"):
        cfg = tuning.heuristic(16384, 4096, 4096, epilogue=loads, major=major)
        assert cfg == tuning.PINGPONG_S8_ALONG_M and (cfg.swizzle, cfg.raster) == (8, "along_m")
        assert cfg.kernel == tuning.PINGPONG.kernel
        assert tuning.heuristic(16384, 2048, 4096, epilogue=loads, major=major).swizzle == 4
        assert tuning.heuristic(2048, 4096, 4096, epilogue=loads, major=major) != tuning.PINGPONG_S8_ALONG_M
        assert tuning.heuristic(16384, 4096, 2048, epilogue=loads, major=major) != tuning.PINGPONG_S8_ALONG_M
    assert tuning.heuristic(16384, 4096, 4096, epilogue=loads, major="mn") != tuning.PINGPONG_S8_ALONG_M
    # N >= 6144 keeps the heuristic's raster (K-major) or swizzle 4 (N-major)
    assert tuning.heuristic(16384, 6144, 4096, epilogue=loads) == tuning.PINGPONG_S8
    # the RMSNorm backward's epilogue (two tile loads, two stores, column sums: too few stages for 128x256) at
    # Llama-8B's 16384x4096x6144 and, with dx_in, x28672
    norm_bwd = dataclasses.replace(loads, col_reduce=True, large_stages=2)
    for K in (6144, 28672):
        assert tuning.heuristic(16384, 4096, K, epilogue=norm_bwd, major="kn") == tuning.PINGPONG_S8_ALONG_M
    assert tuning.heuristic(16384, 2048, 3072, epilogue=norm_bwd, major="kn") == tuning.PINGPONG
    assert tuning.for_every_m(tuning.PINGPONG_S8_ALONG_M) == tuning.PINGPONG


def test_narrow_n_takes_128x192_for_a_light_epilogue():
    """N <= 1536 divisible by 192 (BERT's 768), K-major, no column reduction, at most LIGHT_NODES lowered
    nodes: ping-pong 128x192 swizzle 8 (1.02-1.09x cuBLAS against 1.50-1.98x, sweep_fusion_h200.json); a
    heavier epilogue, N that 192 does not divide, N-major operands or few M tiles keep the older choice."""
    light = dataclasses.replace(POINTWISE, nodes=16)
    assert tuning.heuristic(16384, 768, 768, epilogue=light) == tuning.TALL_192_S8
    assert tuning.heuristic(16384, 768, 3072, epilogue=dataclasses.replace(TILE, nodes=16)) == tuning.TALL_192_S8
    assert tuning.heuristic(16384, 1536, 768, epilogue=light) == tuning.TALL_192_S8
    heavy = dataclasses.replace(POINTWISE, nodes=tuning.LIGHT_NODES + 1)
    assert tuning.heuristic(16384, 768, 768, epilogue=heavy).tile[:2] != (128, 192)
    assert tuning.heuristic(16384, 1024, 768, epilogue=light).tile[:2] != (128, 192)     # 192 does not divide
    assert tuning.heuristic(16384, 3072, 768, epilogue=light).tile[:2] != (128, 192)     # Llama-1B's QKV: unmeasured
    assert tuning.heuristic(16384, 768, 768, epilogue=light, major="kn").tile[:2] != (128, 192)
    assert tuning.heuristic(2048, 768, 768, epilogue=light).tile[:2] != (128, 192)


def test_a_column_reduction_over_a_short_k():
    """A column reduction with K <= 1024: ping-pong 128x128 tiles with both operands K-major (GPT-2's GELU
    backward: 177 against 182 and 190 us), in the overlap schedule (160 us; overlap_h200.txt), cooperative
    128x256 2x1 N-major (but a light epilogue: the next test); a longer K keeps
    cooperative 128x256, and an epilogue that leaves 128x256 fewer than three stages ping-pong 128x128."""
    assert tuning.heuristic(16384, 3072, 768, epilogue=COLRED) == tuning.OVERLAP
    # 12 N tiles of 256 along the raster: the fitted grid pads none under swizzle 8 (CUTLASS's padded them to 16)
    assert tuning.heuristic(16384, 3072, 768, epilogue=COLRED, major="kn") == tuning.LARGE_TALL
    assert tuning.heuristic(12608, 3072, 768, epilogue=COLRED, major="kn") == tuning.LARGE   # ViT-B/16's rows
    assert tuning.heuristic(16384, 3072, 2048, epilogue=COLRED, major="kn") == tuning.LARGE_TALL
    tight = dataclasses.replace(COLRED, large_stages=2)
    assert tuning.heuristic(16384, 768, 768, epilogue=tight, major="kn") == tuning.PINGPONG   # 6 N tiles along N


def test_a_light_n_major_column_reduction_over_a_short_k_overlaps():
    """BERT-base's GELU derivative with the bias gradient (a tile load, column sums, 6 lowered nodes) N-major over
    K = 768: OVERLAP 128x128 (182.6 against 189.4 us in cooperative 128x256 2x1; sweep_fusion_overlap_kn_h200.json).
    Not over a longer K, nor for a heavier epilogue, one whose reductions test bounds (the layer-norm backward's:
    slower in it), one OVERLAP does not fit, or without a tile load (unmeasured)."""
    op = TunedOp(graphs.gelu_backward_dbias(), "bfloat16", tune=False, major="kn")
    light = op.epilogue
    assert light.tile_load and light.col_reduce and light.nodes <= tuning.LIGHT_KN_SUM_NODES
    assert not light.bounds_tests
    got = op.config_for(16384, 3072, 768)
    assert got == dataclasses.replace(tuning.OVERLAP, major="kn") and got.swizzle == 4
    assert tuning.OVERLAP in tuning.heuristic_configs(light, "kn")
    assert tuning.heuristic(12608, 3072, 768, epilogue=light, major="kn").schedule == "overlap"   # ViT-B/16's rows
    assert op.config_for(16384, 3072, 2048) == dataclasses.replace(tuning.LARGE_TALL, major="kn")
    assert TunedOp(graphs.gelu_backward_dbias(), "bfloat16", tune=False).config_for(16384, 3072, 768) == tuning.OVERLAP
    for other in (dataclasses.replace(light, nodes=tuning.LIGHT_KN_SUM_NODES + 1),
                  dataclasses.replace(light, bounds_tests=True),
                  dataclasses.replace(light, overlap_stages=light.pingpong_stages - 2),
                  dataclasses.replace(light, tile_load=False)):
        assert tuning.heuristic(16384, 3072, 768, epilogue=other, major="kn") == tuning.LARGE_TALL, other
    assert tuning.heuristic(16384, 3072, tuning.SHORT_K, epilogue=light, major="kn") == tuning.OVERLAP
    assert tuning.heuristic(16384, 3072, tuning.SHORT_K + 64, epilogue=light, major="kn") == tuning.LARGE_TALL
    # no column sums: a tile-load epilogue that takes LARGE (N > 16384) keeps it
    sums_none = dataclasses.replace(light, col_reduce=False)
    assert tuning.heuristic(16384, 28672, 768, epilogue=sums_none, major="kn") == tuning.LARGE_TALL


def test_auto_uses_the_graph_epilogue():
    g = ce.Graph()
    acc = g.accumulator()
    g.output(acc)
    g.col_reduce("c", acc, "sum")
    op = TunedOp(g, "bfloat16", tune=False)
    def flags(e):
        return (e.plain, e.tile_load, e.col_reduce)
    assert flags(op.epilogue) == flags(COLRED) and op.config_for(16384, 6144, 4096) == tuning.LARGE_TALL
    pointwise = TunedOp(_graph(), "bfloat16", tune=False)
    assert flags(pointwise.epilogue) == flags(POINTWISE) and pointwise.config_for(16384, 6144, 4096) == \
        tuning.TALL_192_S8
    assert pointwise.config_for(16384, 28672, 4096) == tuning.TALL_192_ALONG_N


def test_prebuild_expands_auto_and_tune():
    from coda_ext.runtime import expand_items

    g = _graph()
    assert [c for _, _, c in expand_items([(g, "bfloat16", "auto")])] == list(tuning.heuristic_configs())
    assert [c for _, _, c in expand_items([(g, "bfloat16", "tune"), (g, "float16", None)])] == \
        list(tuning.CANDIDATES) + [None]


class _FakeOps:
    """Stands in for compiled kernels: records which config ran; timings come from a table."""

    def __init__(self, times):
        self.times, self.ran = times, []

    def compile(self, graph, dtype, config):
        return types.SimpleNamespace(run=lambda A, W, inputs, out: self.ran.append(config.tag) or config.tag)

    def time_fn(self, fn, reps):
        tag = fn()
        return [self.times[tag]] * reps


def _tensors(M=300, N=256, K=128):
    return types.SimpleNamespace(shape=(M, K)), types.SimpleNamespace(shape=(N, K))


def test_tune_picks_the_fastest_and_remembers_it(monkeypatch):
    times = {c.tag: 1.0 for c in tuning.CANDIDATES}
    fastest = tuning.CANDIDATES[2].tag
    times[fastest] = 0.5
    fake = _FakeOps(times)
    monkeypatch.setattr(sys.modules["coda_ext.runtime.tuned"], "compile_config", fake.compile)
    monkeypatch.setattr(sys.modules["coda_ext.runtime.tuned"], "build_kernels", lambda items, jobs=None: [])
    op = TunedOp(_graph(), "bfloat16", tune=True, reps=3, time_fn=fake.time_fn)
    A, W = _tensors()
    assert op.choose(A, W, {}, "GPU-X").tag == fastest
    key = tuning.memory_key(op.digest, "bfloat16", 256, 128, 300, "GPU-X")
    assert tuning.load_memory()[key]["config"] == fastest
    # remembered: another process (a fresh op) and another M in the same bucket do not re-measure
    fake.ran.clear()
    again = TunedOp(_graph(), "bfloat16", tune=True, reps=3, time_fn=fake.time_fn)
    assert again.choose(*_tensors(M=400), {}, "GPU-X").tag == fastest and fake.ran == []
    # "auto" uses the memory, and the heuristic where nothing is known
    auto = TunedOp(_graph(), "bfloat16", tune=False)
    assert auto.choose(A, W, {}, "GPU-X").tag == fastest
    assert auto.choose(A, W, {}, "GPU-Y") == tuning.heuristic(512, 256, 128)
    assert auto.choose(*_tensors(M=5000), {}, "GPU-X") == tuning.heuristic(8192, 256, 128)


def test_compile_config_strings():
    assert isinstance(ce.compile(_graph(), "bfloat16", config="auto"), TunedOp)
    with pytest.raises(ce.UnsupportedError, match="'auto' or 'tune'"):
        ce.compile(_graph(), "bfloat16", config="fastest")


def test_tuned_op_checks_operands_before_any_work():
    import torch

    op = ce.compile(_graph(), "bfloat16", config="tune")
    with pytest.raises(ValueError, match="cuda"):
        op(torch.zeros(4, 8, dtype=torch.bfloat16), torch.zeros(8, 8, dtype=torch.bfloat16))


def test_heavy_epilogue_never_starves_the_large_mainloop():
    """The RMSNorm backward (two tile loads, two stores, a column reduction) leaves a 128x256 mainloop
    two stages: the heuristic takes ping-pong 128x128 where it would take cooperative 128x256 (measured
    1.65x vs 1.13-1.19x cuBLAS, docs/measured.md); light epilogues keep their choice."""
    from coda_ext.jit import kernel_source

    heavy = tuning.Epilogue.of(kernel_source(graphs.rms_norm_backward_linear(True), "bfloat16").lowered)
    assert heavy.col_reduce and heavy.tile_load and heavy.large_stages < 3
    assert tuning.heuristic(32768, 2048, 16384, 132, heavy) == tuning.PINGPONG
    assert tuning.heuristic(32768, 2048, 16384, 132, dataclasses.replace(heavy, large_stages=4)) == tuning.LARGE_TALL
    light = tuning.Epilogue.of(kernel_source(graphs.linear_residual_norm(), "bfloat16").lowered)
    assert light.large_stages >= 3


def test_column_reduction_with_a_too_small_epilogue_tile_is_refused_before_nvcc():
    """Regression: a cooperative 128x256 config with a 128x16 epilogue tile and a column reduction passed
    every check and stopped nvcc at column_partials.hpp's static_assert."""
    g = ce.Graph()
    acc = g.accumulator()
    g.output(acc)
    g.col_reduce("c", acc, "sum")
    cfg = ce.KernelConfig(tile=(128, 256, 64), cluster=(2, 1), schedule="cooperative", epilogue_tile=(128, 16))
    with pytest.raises(ce.UnsupportedError, match="column reduction needs an epilogue subtile"):
        ce.emit_source(g, "bfloat16", cfg)
    ce.emit_source(g, "bfloat16", dataclasses.replace(cfg, epilogue_tile=(128, 32)))


def _only_smaller_tiles_fit() -> ce.Graph:
    """A pair tile read and two pair stores: too much epilogue buffer for the first candidate (128x256)."""
    g = ce.Graph()
    acc = g.accumulator()
    e, o = g.pair_tile("z")
    g.output(acc * e + o)
    g.store_pairs("dz", acc, o)
    g.store_pairs("dh", o, acc)
    return g


def test_auto_op_of_a_graph_that_only_smaller_tiles_fit():
    """Regression: the "auto" op built its interface from the first candidate (cooperative 128x256) and so
    refused a graph with heavy epilogue buffers that the other candidates fit."""
    op = TunedOp(_only_smaller_tiles_fit(), "bfloat16", tune=False)
    assert set(op.input_names) == {"z"} and op.config_for(16384, 4096, 4096).tile != (128, 256, 64)


def test_auto_op_keeps_no_refusal_alive():
    """Regression: the "auto" op kept the refusals of the candidates a graph did not fit in a list beside the
    traceback that held it, a reference cycle holding every caller's frame: a compiled graph's tensors
    outlived their last use until the garbage collector ran (Inductor's CUDA graph trees then found them
    freed under their pool check: "storage data ptrs are not allocated in pool")."""
    import gc
    import weakref

    import torch

    def caller(t):
        return TunedOp(_only_smaller_tiles_fit(), "bfloat16", tune=False)   # the first candidate refuses it

    gc.collect()
    gc.disable()
    try:
        t = torch.empty(3)
        alive = weakref.ref(t)
        caller(t)
        del t
        assert alive() is None   # freed when its last reference went, not by the collector
    finally:
        gc.enable()


def test_tuning_memory_keeps_operand_layouts_apart():
    assert tuning.memory_key("d", "bfloat16", 8, 8, 8, "H100") != tuning.memory_key("d", "bfloat16", 8, 8, 8, "H100",
                                                                                      "mn")
    assert tuning.memory_key("d", "bfloat16", 8, 8, 8, "H100") == tuning.memory_key("d", "bfloat16", 8, 8, 8, "H100",
                                                                                      "kk")


def test_swizzle_8_only_with_enough_m_tiles():
    """Regression: swizzle 8 on the 2x1-cluster cooperative config at 1024x28672x4096 (8 M tiles)
    ran 2.05-2.24x cuBLAS (swizzle 4: 1.01-1.11x); it is kept for 32 or more M tiles."""
    assert tuning.heuristic(1024, 28672, 4096, epilogue=PLAIN) == tuning.LARGE
    assert tuning.heuristic(1024, 28672, 4096, epilogue=PLAIN).swizzle == 4
    assert tuning.heuristic(4096, 28672, 8192, epilogue=PLAIN) == tuning.LARGE_TALL
    assert tuning.heuristic(16384, 6144, 2048, epilogue=dataclasses.replace(PLAIN, tall_192=False)) == \
        tuning.LARGE_TALL


def test_fixed_kernels_launch_with_a_swizzle_that_suits_every_m():
    """libcoda's kernels take one launch default for every M: never LARGE_TALL's swizzle 8."""
    assert tuning.for_every_m(tuning.LARGE_TALL) == tuning.LARGE
    assert tuning.for_every_m(tuning.PINGPONG) == tuning.PINGPONG
    from coda_ext.tools import libgen

    picked = [libgen.kernel_config(k) for k in libgen.KERNELS]
    assert tuning.LARGE in picked and tuning.LARGE_TALL not in picked


def test_plain_gemms_with_transposed_operands_keep_ping_pong():
    """The cooperative choice for plain GEMMs was measured with K-major operands only; the backward
    GEMMs (an M- or N-major operand) keep the ping-pong config they were measured in."""
    assert tuning.heuristic(16384, 6144, 4096, epilogue=PLAIN) == tuning.TALL_192_S8
    assert tuning.heuristic(16384, 6144, 4096, epilogue=dataclasses.replace(PLAIN, tall_192=False)) == \
        tuning.LARGE_TALL
    for major in ("mk", "kn", "mn"):
        assert tuning.heuristic(16384, 6144, 4096, epilogue=PLAIN, major=major) == tuning.PINGPONG
    g = graphs.identity()
    assert TunedOp(g, "bfloat16", tune=False, major="mk").config_for(16384, 6144, 4096).tile == (128, 128, 64)


def test_pair_tile_epilogues_launch_ping_pong_with_swizzle_8_along_n():
    """The dSwiGLU epilogue (a pair tile load) in ping-pong 128x128: swizzle 8 rastered along N cut its DRAM
    reads (5.0 -> 3.9 GB) and time (1.256x -> 1.186x cuBLAS) at 16384x14336x4096, and its pair accesses
    staggered in shared memory: PINGPONG's kernel with the staggered pair nodes (swizzle and raster are launch
    arguments), and only with 32 or more M tiles."""
    from coda_ext.graphs import backward
    from coda_ext.jit import kernel_source

    e = tuning.Epilogue.of(kernel_source(backward.swiglu_backward_linear(), "bfloat16").lowered)
    assert e.pair_loads and not tuning.Epilogue.of(kernel_source(graphs.identity(), "bfloat16").lowered).pair_loads
    assert tuning.heuristic(16384, 8192, 1024, epilogue=e, major="kn") == tuning.PINGPONG_PAIR_LOADS
    # over K >= 2048, 128x192 tiles (the fitted grid: 1.043x against 1.084x at 16384x14336x4096; 1.18x against
    # 1.20x at 16384x8192x2048 once the row sum skips its bounds test, H200)
    assert e.tall_192 and tuning.heuristic(16384, 14336, 4096, epilogue=e, major="kn") == tuning.TALL_192_S8
    assert tuning.heuristic(16384, 8192, 2048, epilogue=e, major="kn") == tuning.TALL_192_S8
    assert not e.bounds_tests   # its row sum's summand is 0 beyond N (codegen/oob.py)
    # a pair-tile epilogue whose reduction keeps its bounds test: 128x192 over K >= 4096 only (1B: 1.261x vs 1.214x)
    checked = dataclasses.replace(e, bounds_tests=True)
    assert tuning.heuristic(16384, 8192, 2048, epilogue=checked, major="kn") == tuning.PINGPONG_PAIR_LOADS
    assert tuning.heuristic(16384, 14336, 4096, epilogue=checked, major="kn") == tuning.TALL_192_S8
    assert tuning.TALL_192_S8 in tuning.heuristic_configs(e, "kn")
    assert tuning.heuristic(2048, 14336, 4096, epilogue=e, major="kn") == tuning.PINGPONG
    assert tuning.heuristic(16384, 14336, 4096, epilogue=TILE, major="kn") == tuning.PINGPONG
    assert tuning.for_every_m(tuning.PINGPONG_PAIR_LOADS) == tuning.PINGPONG
    assert tuning.PINGPONG_PAIR_LOADS in tuning.heuristic_configs(e, "kn")
    assert tuning.PINGPONG_PAIR_LOADS not in tuning.heuristic_configs(TILE, "kn")
    same = {kernel_source(backward.swiglu_backward_linear(), "bfloat16", c).source
            for c in (dataclasses.replace(tuning.PINGPONG, pair_smem="staggered"), tuning.PINGPONG_PAIR_LOADS)}
    assert len(same) == 1 and tuning.PINGPONG_PAIR_LOADS.pair_smem == "staggered"


def test_wave_fill_counts_the_exact_rows_not_their_bucket():
    """The QKV weight gradient at 1B (M = 3072 rows of 128: 24 tiles; N 2048, K 16384) in 128x256 tiles is 192
    of them, a second wave 45 % full; 128x128 fills three waves 97 %. Its bucket (4096 rows) fills both, so
    the choice was made on the bucket's waves (regression: cooperative 128x256 ran it at 1.24x cuBLAS)."""
    from coda_ext import graphs
    from coda_ext.runtime.tuned import TunedOp

    assert tuning.heuristic(4096, 2048, 16384, 132) == tuning.MEDIUM            # the bucket's rows
    assert tuning.heuristic(3072, 2048, 16384, 132) == tuning.WAVE_FILL
    op = TunedOp(graphs.identity(), "bfloat16", tune=False, major="mn")
    cfg = op.config_for(3072, 2048, 16384, 132)
    assert cfg.tile == tuning.WAVE_FILL.tile and cfg.schedule == tuning.WAVE_FILL.schedule and cfg.major == "mn"
    assert op.config_for(4096, 2048, 16384, 132).tile == tuning.MEDIUM.tile   # a full bucket: as before


@pytest.mark.parametrize("tile,cluster,swizzle,M,N,padded,fitted", [
    ((128, 128, 64), (1, 1), 4, 16384, 768, 128 * 8, 128 * 6),    # 6 N tiles padded to 8 (BERT's 768-wide dX)
    ((128, 128, 64), (1, 1), 8, 16384, 768, 128 * 8, 128 * 6),
    ((128, 128, 64), (1, 1), 2, 16384, 768, 128 * 6, 128 * 6),
    ((128, 192, 64), (1, 1), 8, 16384, 768, 128 * 4, 128 * 4),    # 4 N tiles: CUTLASS lowers swizzle 8 to 4 under 6
    ((128, 192, 64), (1, 1), 8, 16384, 2048, 128 * 16, 128 * 11),  # 11 N tiles padded to 16; along N: 11
    ((128, 192, 64), (2, 1), 8, 16384, 16384, 128 * 88, 128 * 86),  # 86 N tiles: 88; along N: 86
    ((128, 256, 64), (2, 1), 8, 1024, 28672, 16 * 112, 8 * 112),  # 8 M tiles padded to 16; along M: 8
    ((64, 128, 64), (1, 1), 1, 100, 4096, 2 * 32, 2 * 32),
    # swizzle 16 (csrc/kernels/wide_swizzle.cuh): from 12 CTAs on the shorter side, 8 below
    ((128, 128, 64), (1, 1), 16, 16384, 8192, 128 * 64, 128 * 64),
    ((128, 128, 64), (1, 1), 16, 16384, 14336, 128 * 112, 128 * 112),   # 112 N tiles: a multiple of 16
    ((128, 128, 64), (1, 1), 16, 2000, 3080, 16 * 32, 16 * 32),        # 16 x 25 tiles: 16 x 32, along M
    ((128, 128, 64), (1, 1), 16, 1400, 3080, 16 * 32, 11 * 32),        # 11 M tiles: CUTLASS's 8, along M
    ((128, 128, 64), (2, 1), 16, 16384, 8192, 128 * 64, 128 * 64),
    ((128, 128, 64), (2, 1), 16, 1600, 2120, 32 * 32, 14 * 32),        # 14 x 17 CTAs in 2x1 clusters, along M
])
def test_scheduled_tiles(tile, cluster, swizzle, M, N, padded, fitted):
    """CUTLASS's grid (grid="padded") rounds both tile counts up to whole bands; the fitted grid
    (csrc/kernels/fitted_grid.cuh) only the count across the raster direction."""
    cfg = ce.KernelConfig(tile, cluster, "pingpong" if tile[1] == 192 or tile[0] == 64 else "cooperative",
                          swizzle=swizzle)
    assert tuning.scheduled_tiles(dataclasses.replace(cfg, grid="padded"), M, N) == padded
    assert tuning.scheduled_tiles(cfg, M, N) == fitted


def test_grid_is_a_launch_argument():
    cfg = ce.KernelConfig((128, 192, 64), (2, 1), "pingpong", swizzle=8)
    padded = dataclasses.replace(cfg, grid="padded")
    assert padded.tag == cfg.tag + "_padded" and padded.kernel == cfg.kernel
    with pytest.raises(ce.UnsupportedError, match="grid must be one of"):
        dataclasses.replace(cfg, grid="tight")


def test_swizzle_16_for_the_persistent_schedules_only():
    """Swizzle 16 is a launch argument of the cooperative, ping-pong and overlap kernels (past CUTLASS's cap of
    8: csrc/kernels/wide_swizzle.cuh); stream-K's scheduler stops at 8, so it is refused there with the fix, and
    any other swizzle is refused as before."""
    from coda_ext.config import applied_swizzle

    for schedule in ("cooperative", "pingpong", "overlap"):
        assert ce.KernelConfig((128, 128, 64), (1, 1), schedule, swizzle=16).tag.endswith("_s16")
    with pytest.raises(ce.UnsupportedError, match=r"stream-K.*swizzle=8"):
        ce.KernelConfig((128, 128, 64), (1, 1), "streamk", swizzle=16)
    with pytest.raises(ce.UnsupportedError, match="1, 2, 4, 8 or 16"):
        ce.KernelConfig((128, 128, 64), (1, 1), "pingpong", swizzle=32)
    assert [applied_swizzle(16, m, 64) for m in (64, 12, 11, 6, 5, 3, 2, 1)] == [16, 16, 8, 8, 4, 4, 2, 1]
    assert applied_swizzle(8, 64, 64) == 8
    # fit_swizzle halves 16 like any other: 13 M tiles across the raster padded to 16 pad the grid by 23 %
    wide = ce.KernelConfig((128, 128, 64), (1, 1), "pingpong", swizzle=16)
    assert tuning.fit_swizzle(wide, 1664, 1664).swizzle < 16
    assert tuning.fit_swizzle(wide, 1664, 16384).swizzle == 16   # along M: the 13 M tiles are not padded
    assert tuning.fit_swizzle(wide, 16384, 8192).swizzle == 16


def test_fit_swizzle():
    """The heuristic halves a swizzle that pads the persistent grid by more than MAX_SWIZZLE_PADDING (a launch
    argument: the same kernel); in the fitted grid only the count across the raster direction is padded. ViT-B/16's
    12608 rows are 100 CTAs in 2 x 1 clusters across it: swizzle 8 pads them to 112 (12 %), 4 to 104. Regression:
    BERT's 16384 x 768 dX GEMMs ran swizzle 4 over 6 N tiles of 128 padded to 8 in CUTLASS's grid at 1.79x cuBLAS
    (swizzle 2 1.01x, H200); along the raster, the fitted grid walks the 6 as they are."""
    assert tuning.heuristic(12608, 3072, 768, epilogue=tuning.Epilogue(col_reduce=True), major="kn").swizzle == 4
    for K, e in ((3072, tuning.Epilogue(tile_load=True)), (768, tuning.Epilogue(tile_load=True))):
        got = tuning.heuristic(16384, 768, K, epilogue=e, major="kn")
        assert got.tile[:2] == (128, 128) and tuning.scheduled_tiles(got, 16384, 768) == 128 * 6, got.tag
        assert tuning.fit_swizzle(dataclasses.replace(got, swizzle=4, grid="padded"), 16384, 768).swizzle == 2
    assert tuning.fit_swizzle(tuning.TALL_192_S8, 16384, 2048) is tuning.TALL_192_S8   # 11 N tiles along N
    assert tuning.fit_swizzle(dataclasses.replace(tuning.TALL_192_S8, grid="padded"), 16384, 2048).swizzle == 1
    assert tuning.fit_swizzle(tuning.TALL_192_S8, 16384, 6144) is tuning.TALL_192_S8
    assert tuning.fit_swizzle(tuning.TALL_192_PAIRS, 16384, 16384) is tuning.TALL_192_PAIRS   # 2.3 %


def test_deep_narrow_n_major_norm_backward_takes_128x192():
    """The RMSNorm backward's epilogue (tile loads, column sums), N-major, over K >= 8192 and N <= 2048 with 32 or
    more M tiles: ping-pong 128x192 (Llama-1B's dx_in GEMM 16384x2048x16384: 1.084-1.095x cuBLAS against
    1.089-1.118x in 128x128, H200); a shorter K, a wider N, K-major operands or few M tiles keep ping-pong 128x128,
    and "auto" may compile it (heuristic_configs)."""
    norm = tuning.Epilogue(tile_load=True, col_reduce=True, large_stages=2, tall_192=True, nodes=19,
                           overlap_stages=3, pingpong_stages=5)
    assert tuning.heuristic(16384, 2048, 16384, epilogue=norm, major="kn") == tuning.TALL_192
    assert tuning.TALL_192 in tuning.heuristic_configs(norm, "kn")
    for M, N, K in ((16384, 2048, 3072), (16384, 4096, 28672), (2048, 2048, 16384)):
        assert tuning.heuristic(M, N, K, epilogue=norm, major="kn").tile[:2] == (128, 128), (M, N, K)
    assert tuning.heuristic(16384, 2048, 16384, epilogue=dataclasses.replace(norm, tall_192=False),
                            major="kn").tile[:2] == (128, 128)


def test_weight_gradients_flip_the_raster_before_halving_the_swizzle():
    """A weight gradient's ("mn") swizzle that pads the grid: the other raster at the same swizzle where that one does
    not pad. The 8B LM head's last dW chunk, 13568 x 4096 x 8192: 106 M tiles across the raster (along N) padded to
    112 by swizzle 8 took swizzle 2 at 1.082x cuBLAS; along M, bands of 8 of its 16 N tiles, 1.009x (H200). Other
    layouts, and configs whose raster is set, keep halving; a grid that does not pad keeps its raster."""
    got = tuning.heuristic(13568, 4096, 8192, major="mn")
    assert (got.swizzle, got.raster) == (8, "along_m") and tuning.scheduled_tiles(got, 13568, 4096) == 106 * 16
    assert tuning.heuristic(16384, 4096, 8192, major="mn").raster == "heuristic"
    kk = tuning.heuristic(13568, 4096, 8192, major="kk")
    assert (kk.swizzle, kk.raster) == (2, "heuristic")
    fixed = dataclasses.replace(tuning.LARGE_TALL, raster="along_n")
    assert tuning.fit_swizzle(fixed, 13568, 4096, flip=True) == dataclasses.replace(fixed, swizzle=2)
    both = tuning.fit_swizzle(tuning.LARGE_TALL, 1600, 1600, flip=True)   # 13 tiles each way in 2 x 1 clusters
    assert both.raster == "heuristic" and both.swizzle < 8


def test_the_llama_shapes_keep_their_swizzles():
    """Every GEMM of a Llama-3.2-1B-like and -3.1-8B-like training step at 16384 tokens: the swizzle fit changes
    none (their grids pad by at most 2.3 %)."""
    from unittest import mock

    from coda_ext.models import functions
    from coda_ext.models.config import LlamaConfig
    from coda_ext.runtime import tuned

    seen = []

    def spy(gemms, dtype="bfloat16", sms=None):
        for graph, major, mnk in gemms:
            op = tuned.TunedOp(graph, dtype, tune=False, major=major)
            seen.append((op.config_for(*mnk, 132), op._laid_out(tuning._choice(*mnk, 132, op.epilogue, major))))
        return []

    with mock.patch.object(tuned, "auto_items", spy), functions.weight_grad_backend("coda"):
        for d, f in ((2048, 8192), (4096, 14336)):
            functions.training_kernels(LlamaConfig(hidden_size=d, intermediate_size=f, num_attention_heads=32,
                                                   num_key_value_heads=8, vocab_size=128256), 16384)
    # 16 GEMMs a model: 8 of the layers, their 4 weight gradients, the LM head's logits GEMM and its three
    # weight-gradient GEMMs (lm_head_ce.dw_backend "coda": the first chunk's, the accumulating one, the last chunk's)
    assert len(seen) == 32 and all(got == unfitted for got, unfitted in seen)


def test_short_k_epilogues_take_the_overlap_schedule():
    """Where PINGPONG is chosen with K <= SHORT_K and an epilogue to run, OVERLAP (the same tiles, the two warp
    groups' epilogues at the same time: 160 against 177 us, 208 against 224, 139 against 143 at 16384x3072x768;
    overlap_h200.txt): not for a plain GEMM, a longer K, or an epilogue that leaves OVERLAP fewer than three
    mainloop stages or two fewer than PINGPONG (it holds the epilogue's storage twice)."""
    for epilogue in (POINTWISE, TILE, COLRED):
        assert tuning.heuristic(16384, 3072, 768, epilogue=epilogue, major="kn") == \
            (tuning.OVERLAP if epilogue != COLRED else tuning.LARGE_TALL)
        assert tuning.heuristic(4096, 4096, 256, epilogue=epilogue) == tuning.OVERLAP
        assert tuning.heuristic(4096, 4096, 2048, epilogue=epilogue).schedule != "overlap"
        assert tuning.OVERLAP in tuning.heuristic_configs(epilogue)
    tight = dataclasses.replace(TILE, overlap_stages=2, pingpong_stages=3)
    halved = dataclasses.replace(TILE, overlap_stages=3, pingpong_stages=5)   # the dSwiGLU's: 1.60x against 1.26x
    one_less = dataclasses.replace(TILE, overlap_stages=5, pingpong_stages=6)   # GPT-2's GELU sites: faster
    assert tuning.heuristic(4096, 4096, 256, epilogue=one_less) == tuning.OVERLAP
    for slow in (tight, halved):
        assert tuning.heuristic(4096, 4096, 256, epilogue=slow) == tuning.PINGPONG
        assert tuning.OVERLAP not in tuning.heuristic_configs(slow)
        assert not tuning.fits(tuning.OVERLAP, slow) and tuning.fits(tuning.PINGPONG, slow)   # config="tune" skips it
    assert tuning.fits(tuning.OVERLAP, TILE)
    assert tuning.heuristic(4096, 4096, 256, epilogue=PLAIN, major="kn") == tuning.PINGPONG
    assert tuning.OVERLAP not in tuning.heuristic_configs(PLAIN)


def test_weight_gradient_with_a_nearly_empty_last_wave_takes_stream_k():
    """A weight gradient ("mn") with a light epilogue whose cooperative 128x256 2x1 grid runs 8 waves or more and leaves
    the last one at most a quarter full: the same tiles with the stream-K scheduler (Llama-8B's gate/up weight
    gradient, 28672 x 4096 x 16384: 3584 tiles, 27.15 waves on 132 SMs, 0.968x cuBLAS against 0.996x; accumulating
    0.980x against 1.005x; H200, sweep_backward_streamk_h200.json). Fuller last waves (the 8B down, o and qkv weight
    gradients, 1B's gate/up at 7.76 waves), K-major and N-major GEMMs, few waves and heavier epilogues keep the
    persistent scheduler."""
    from coda_ext import graphs
    from coda_ext.passes import lower

    plain = tuning.Epilogue.of(lower(graphs.linear(False).build(), "bfloat16"))
    accumulate = tuning.Epilogue.of(lower(graphs.linear(True).build(), "bfloat16"))
    for epilogue in (plain, accumulate):
        cfg = tuning.heuristic(28672, 4096, 16384, epilogue=epilogue, major="mn")
        assert cfg == tuning.STREAMK_LARGE and cfg.schedule == "streamk" and cfg.tile[:2] == (128, 256)
        assert tuning.STREAMK_LARGE in tuning.heuristic_configs(epilogue, "mn")
        assert tuning.STREAMK_LARGE not in tuning.heuristic_configs(epilogue, "kk")
    for M, N in ((4096, 14336), (4096, 4096), (6144, 4096), (16384, 2048)):   # 13.6, 3.9, 5.8, 7.8 waves
        assert tuning.heuristic(M, N, 16384, epilogue=plain, major="mn").schedule != "streamk", (M, N)
    assert tuning.heuristic(28672, 4096, 16384, epilogue=plain, major="kk").schedule != "streamk"
    heavy = dataclasses.replace(accumulate, nodes=tuning.LIGHT_STREAMK_NODES + 1)
    assert tuning.heuristic(28672, 4096, 16384, epilogue=heavy, major="mn").schedule != "streamk"
    reduces = dataclasses.replace(plain, col_reduce=True)
    assert tuning.STREAMK_LARGE not in tuning.heuristic_configs(reduces, "mn")
