"""KernelConfig(tile_loads="direct"), KernelConfig(pair_smem="staggered") and KernelConfig(epilogue_cache=
"evict_first") without a GPU: the tile inputs are emitted as the register-loading node
(csrc/epilogues/direct_tile_load.hpp) and take no shared memory in the stage plan; the pair tiles and pair stores as
the staggered-access nodes (csrc/epilogues/staggered_pairs.hpp); the TMA tile loads and stores inside the
evict-first nodes (csrc/epilogues/evict_first.hpp); each has its own tag; bad values are refused with the choices."""
from __future__ import annotations

import dataclasses
import pathlib

import pytest

import coda_ext as ce
from coda_ext import graphs
from coda_ext.codegen import constraints
from coda_ext.config import EPILOGUE_CACHE, PAIR_SMEM, TILE_LOADS
from coda_ext.graph.canonical import as_ir
from coda_ext.passes import lower

ROOT = pathlib.Path(__file__).resolve().parents[2]
PING = ce.KernelConfig((128, 128, 64), (1, 1), "pingpong", swizzle=4, major="kn")
DIRECT = dataclasses.replace(PING, tile_loads="direct")


def test_tile_loads_values_and_tag():
    assert TILE_LOADS == ("tma", "direct") and PING.tile_loads == "tma"
    assert DIRECT.tag == PING.tag + "_dl"
    with pytest.raises(ce.UnsupportedError, match=r"tile_loads must be one of \('tma', 'direct'\), got 'smem'"):
        ce.KernelConfig(tile_loads="smem")


@pytest.mark.parametrize("build,dtype", [(graphs.swiglu_backward_linear, "float"), (graphs.gelu_backward_dbias, None)])
def test_direct_configs_emit_the_register_loading_node(build, dtype):
    tma = ce.emit_source(build(), "bfloat16", PING)
    direct = ce.emit_source(build(), "bfloat16", DIRECT)
    assert "TileLoad<Cfg," in tma and "TileLoadDirect" not in tma
    assert "TileLoadDirect<Cfg," in direct and "TileLoad<Cfg," not in direct
    if dtype:   # a pair tile: 32-bit elements, two 16-bit values each
        assert f"TileLoadDirect<Cfg, {dtype}>" in direct
    nodes = (ROOT / "csrc" / "epilogues" / "nodes.hpp").read_text()
    assert "struct TileLoadDirect {" in nodes and '#include "direct_tile_load.hpp"' in nodes


def test_graphs_without_tiles_emit_the_same_source():
    """tile_loads changes nothing where no tile is read: one kernel (one cache entry) for both."""
    assert ce.emit_source(graphs.identity(), "bfloat16", PING) == ce.emit_source(graphs.identity(), "bfloat16", DIRECT)


def test_direct_tiles_take_no_shared_memory():
    """The dSwiGLU's pair tile (4 stages of 64 x 32 fp32: 32 KB) leaves the plan, and the mainloop a stage more; the
    RMSNorm backward's two bf16 tiles likewise."""
    for build, name in ((graphs.swiglu_backward_linear, "pair tile 'z'"),
                        (lambda: graphs.rms_norm_backward_linear(True), "tile 'x'")):
        low = lower(as_ir(build()), "bfloat16")
        assert name in constraints.epilogue_buffers(low, "bfloat16", PING)
        assert name not in constraints.epilogue_buffers(low, "bfloat16", DIRECT)
        assert constraints.mainloop_stages(low, "bfloat16", DIRECT) > constraints.mainloop_stages(low, "bfloat16", PING)


def test_sweep_backward_times_direct_loads_beside_the_heuristic():
    from benchmarks import sweep_backward as sb

    auto = ce.KernelConfig((128, 128, 64), (1, 1), "pingpong", swizzle=8, raster="along_n", major="kn")
    tags = {c.tag for c in sb.configs("kn", loads=True, auto=auto)}
    assert {auto.tag, auto.tag + "_dl", "hoff_128x128x64_c2x1_s8_kn_ec2d1_dl"} <= tags
    assert auto.tag + "_ps" not in tags
    assert auto.tag + "_ps" in {c.tag for c in sb.configs("kn", loads=True, auto=auto, pairs=True)}


def test_pair_smem_values_tag_and_emitted_nodes():
    assert PAIR_SMEM == ("vector", "staggered") and PING.pair_smem == "vector"
    staggered = dataclasses.replace(PING, pair_smem="staggered")
    assert staggered.tag == PING.tag + "_ps"
    with pytest.raises(ce.UnsupportedError, match=r"pair_smem must be one of \('vector', 'staggered'\), got 'v4'"):
        ce.KernelConfig(pair_smem="v4")
    src = ce.emit_source(graphs.swiglu_backward_linear(), "bfloat16", staggered)
    assert "TileLoadStaggered<Cfg, float>" in src and "TileStoreStaggered<Cfg, float>" in src
    assert "TileLoad<Cfg, float>" not in src and "TileStore<Cfg, float>" not in src
    assert "TileStore<Cfg, cutlass::bfloat16_t>" in src   # the bf16 y store is no pair store: CUTLASS's copy
    # 16-bit tiles (ldmatrix / stmatrix, conflict-free already) keep CUTLASS's copy
    rms = ce.emit_source(graphs.rms_norm_backward_linear(True), "bfloat16", staggered)
    assert "Staggered" not in rms
    # direct loads take the pair tile; the pair store stays staggered
    both = ce.emit_source(graphs.swiglu_backward_linear(), "bfloat16",
                          dataclasses.replace(staggered, tile_loads="direct"))
    assert "TileLoadDirect<Cfg, float>" in both and "TileStoreStaggered<Cfg, float>" in both
    nodes = (ROOT / "csrc" / "epilogues" / "nodes.hpp").read_text()
    assert "struct TileLoadStaggered {" in nodes and "struct TileStoreStaggered {" in nodes


def test_epilogue_cache_values_tag_and_emitted_nodes():
    """epilogue_cache="evict_first" wraps every TMA tile load and store of the epilogue (staggered or not) in the
    evict-first nodes; tiles read directly, reductions and vectors keep theirs."""
    assert EPILOGUE_CACHE == ("normal", "evict_first") and PING.epilogue_cache == "normal"
    hinted = dataclasses.replace(PING, epilogue_cache="evict_first")
    assert hinted.tag == PING.tag + "_ef"
    assert dataclasses.replace(hinted, pair_smem="staggered").tag == PING.tag + "_ps_ef"
    with pytest.raises(ce.UnsupportedError, match=r"epilogue_cache must be one of \('normal', 'evict_first'\), "
                                                 r"got 'evict_last'"):
        ce.KernelConfig(epilogue_cache="evict_last")
    dswiglu = graphs.swiglu_backward_linear()
    src = ce.emit_source(dswiglu, "bfloat16", dataclasses.replace(hinted, pair_smem="staggered"))
    assert "EvictFirstLoad<TileLoadStaggered<Cfg, float>>" in src
    assert "EvictFirstStore<TileStoreStaggered<Cfg, float>>" in src
    assert "EvictFirstStore<TileStore<Cfg, cutlass::bfloat16_t>>" in src   # y
    rms = ce.emit_source(graphs.rms_norm_backward_linear(True), "bfloat16", hinted)
    assert rms.count("EvictFirstLoad<TileLoad<Cfg, cutlass::bfloat16_t>>") == 2   # x and dx_in
    assert "EvictFirstStore<TileStore<Cfg, cutlass::bfloat16_t>>" in rms          # n
    assert "EvictFirst" not in ce.emit_source(graphs.rms_norm_backward_linear(True), "bfloat16", PING)
    direct = ce.emit_source(dswiglu, "bfloat16", dataclasses.replace(hinted, tile_loads="direct"))
    assert "TileLoadDirect<Cfg, float>" in direct and "EvictFirstLoad" not in direct
    assert "EvictFirstStore<TileStore<Cfg, float>>" in direct
    nodes = (ROOT / "csrc" / "epilogues" / "nodes.hpp").read_text()
    assert "struct EvictFirstLoad {" in nodes and "struct EvictFirstStore {" in nodes
