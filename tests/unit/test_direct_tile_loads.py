"""KernelConfig(tile_loads="direct"), KernelConfig(pair_smem="staggered") and KernelConfig(epilogue_cache=
"evict_first" | "prefetch") without a GPU: the tile inputs are emitted as the register-loading node
(csrc/epilogues/direct_tile_load.hpp) and take no shared memory in the stage plan; the pair tiles and pair stores as
the staggered-access nodes (csrc/epilogues/staggered_pairs.hpp); the TMA tile loads and stores inside the
evict-first nodes (csrc/epilogues/evict_first.hpp), or the tile loads inside the L2-prefetching node of a variant
header the source alone includes (csrc/epilogues/variants/l2_prefetch.hpp, digested into those kernels' keys only);
each has its own tag; bad values are refused with the choices."""
from __future__ import annotations

import dataclasses
import pathlib
import re

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
    assert EPILOGUE_CACHE == ("normal", "evict_first", "prefetch") and PING.epilogue_cache == "normal"
    hinted = dataclasses.replace(PING, epilogue_cache="evict_first")
    assert hinted.tag == PING.tag + "_ef"
    assert dataclasses.replace(hinted, pair_smem="staggered").tag == PING.tag + "_ps_ef"
    with pytest.raises(ce.UnsupportedError, match=r"epilogue_cache must be one of \('normal', 'evict_first', "
                                                 r"'prefetch'\), got 'evict_last'"):
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


def test_prefetch_wraps_the_tma_tile_loads_and_includes_its_variant_header():
    """epilogue_cache="prefetch" wraps every TMA tile load (staggered or not) in the L2-prefetching node and includes
    its variant header after the kernel templates; stores keep their nodes; no other source includes the header;
    with direct tile loads (nothing to prefetch) the config is refused with the fix."""
    pf = dataclasses.replace(PING, epilogue_cache="prefetch")
    assert pf.tag == PING.tag + "_pf" and dataclasses.replace(pf, pair_smem="staggered").tag == PING.tag + "_ps_pf"
    with pytest.raises(ce.UnsupportedError, match="with tile_loads='direct' there are none: use tile_loads='tma'"):
        dataclasses.replace(DIRECT, epilogue_cache="prefetch")
    include = '#include "epilogues/variants/l2_prefetch.hpp"'
    src = ce.emit_source(graphs.swiglu_backward_linear(), "bfloat16", dataclasses.replace(pf, pair_smem="staggered"))
    assert "L2PrefetchLoad<TileLoadStaggered<Cfg, float>>" in src
    assert "TileStoreStaggered<Cfg, float>;" in src and "L2PrefetchLoad<TileStore" not in src
    assert src.index('#include "kernels/epilogue_gemm.cuh"') < src.index(include)
    rms = ce.emit_source(graphs.rms_norm_backward_linear(True), "bfloat16", pf)
    assert rms.count("L2PrefetchLoad<TileLoad<Cfg, cutlass::bfloat16_t>>") == 2   # x and dx_in
    for cache in ("normal", "evict_first"):
        other = ce.emit_source(graphs.rms_norm_backward_linear(True), "bfloat16",
                               dataclasses.replace(PING, epilogue_cache=cache))
        assert "L2Prefetch" not in other and "variants/" not in other
    header = (ROOT / "csrc" / "epilogues" / "variants" / "l2_prefetch.hpp").read_text()
    assert "struct L2PrefetchLoad {" in header and "prefetch(this->params_ptr->tma_load_aux" in header
    for path in (ROOT / "csrc").rglob("*"):   # a variant header is included by emitted sources only (libgen's too)
        if path.is_file() and path.suffix in (".hpp", ".cuh", ".h", ".cpp", ".cu"):
            text = path.read_text(errors="ignore")
            if "Written by `python -m coda_ext libgen" not in text:
                assert not re.search(r'#include\s+"[^"]*variants/', text), path


def test_direct_stores_write_the_tile_outputs_from_registers():
    """tile_stores="direct" emits every store and pair store as the register-writing node of its variant header
    (the pairs as 32-bit elements, never staggered or hinted: no shared memory to access) and gives their shared
    memory back; bad values are refused with the choices."""
    from coda_ext.config import TILE_STORES

    assert TILE_STORES == ("tma", "direct") and PING.tile_stores == "tma"
    ds = dataclasses.replace(PING, tile_stores="direct")
    assert ds.tag == PING.tag + "_ds"
    with pytest.raises(ce.UnsupportedError, match=r"tile_stores must be one of \('tma', 'direct'\), got 'stg'"):
        ce.KernelConfig(tile_stores="stg")
    src = ce.emit_source(graphs.swiglu_backward_linear(), "bfloat16",
                         dataclasses.replace(ds, pair_smem="staggered", epilogue_cache="evict_first"))
    assert "TileStoreDirect<Cfg, float>;" in src and "TileStoreDirect<Cfg, cutlass::bfloat16_t>;" in src
    assert "EvictFirstLoad<TileLoadStaggered<Cfg, float>>" in src   # the loads keep theirs
    assert "TileStoreStaggered" not in src and "EvictFirstStore" not in src
    assert '#include "epilogues/variants/direct_store.hpp"' in src
    both = ce.emit_source(graphs.swiglu_backward_linear(), "bfloat16",
                          dataclasses.replace(ds, epilogue_cache="prefetch"))
    assert both.count('#include "epilogues/variants/') == 2
    low = lower(as_ir(graphs.swiglu_backward_linear()), "bfloat16")
    assert not any("store" in k for k in constraints.epilogue_buffers(low, "bfloat16", ds))
    tma = sum(constraints.epilogue_buffers(low, "bfloat16", PING).values())   # dz 16 KB and y 8 KB at (4, 2)
    assert tma - sum(constraints.epilogue_buffers(low, "bfloat16", ds).values()) == 24 * 1024
    header = (ROOT / "csrc" / "epilogues" / "variants" / "direct_store.hpp").read_text()
    assert "struct TileStoreDirect {" in header and "Sm90AuxStore<0," in header


def test_gated_tma_store_stages_the_half_width_output():
    """gated_store="tma" (the default) emits the gated pair output (SwiGLU's y) as the TMA-staging node of its variant
    header, included only by the sources of graphs that have one (a plain GEMM's source, and so its key, is the same
    in either config); its stages take EPI_M x EPI_N / 2 elements each in the shared-memory plan; "registers" keeps
    the register-writing node, with its own tag; bad values refused with the choices."""
    from coda_ext.config import GATED_STORES
    from coda_ext.graphs import forward

    gt = dataclasses.replace(PING, major="kk")
    regs = dataclasses.replace(gt, gated_store="registers")
    assert GATED_STORES == ("tma", "registers") and gt.gated_store == "tma" and ce.DEFAULT_CONFIG.gated_store == "tma"
    assert regs.tag == gt.tag + "_gr"
    with pytest.raises(ce.UnsupportedError, match=r"gated_store must be one of \('tma', 'registers'\), got 'smem'"):
        ce.KernelConfig(gated_store="smem")
    swiglu = forward.linear_swiglu(True, True)
    src = ce.emit_source(swiglu, "bfloat16", gt)
    assert "PairGatedStoreTma<Cfg, cutlass::bfloat16_t, scalar::Silu>;" in src
    assert '#include "epilogues/variants/pair_gated_tma_store.hpp"' in src
    reg_src = ce.emit_source(swiglu, "bfloat16", regs)
    assert "PairGatedStore<Cfg, cutlass::bfloat16_t, scalar::Silu>;" in reg_src and "variants/" not in reg_src
    assert ce.emit_source(graphs.identity(), "bfloat16", gt) == ce.emit_source(graphs.identity(), "bfloat16", regs)
    low = lower(as_ir(swiglu), "bfloat16")
    parts = constraints.epilogue_buffers(low, "bfloat16", gt)
    assert parts["gated store 'y'"] == 2 * 64 * 16 * 2   # StagesD 2 of a 64 x 32 subtile, at half width, bf16
    assert "gated store 'y'" not in constraints.epilogue_buffers(low, "bfloat16", regs)
    header = (ROOT / "csrc" / "epilogues" / "variants" / "pair_gated_tma_store.hpp").read_text()
    assert "struct PairGatedStoreTma {" in header and "SM90_TMA_STORE" in header


def test_gated_store_falls_back_to_registers_where_staging_does_not_fit():
    """A graph whose tile loads and stores fill shared memory beside register gated stores keeps compiling:
    kernel_source writes its gated output from registers where the TMA stage would cost the mainloop one of its first
    three stages (regression: a fuzz sample graph in 64 x 64 subtiles needed 170 KB with the stage, 162 KB without,
    and failed to compile), and keeps TMA where the mainloop keeps its stages (the training SwiGLU)."""
    from coda_ext.graphs import crowded_smem
    from coda_ext.jit import kernel_source

    ks = kernel_source(crowded_smem(), "float16", cfg := dataclasses.replace(ce.DEFAULT_CONFIG, major="mn"))
    assert ks.lowered.find("pair_gated_store") and ks.config.gated_store == "registers"
    assert constraints.mainloop_stages(ks.lowered, "float16", dataclasses.replace(ks.config, gated_store="tma")) < 2
    assert "PairGatedStore<" in ks.source and "PairGatedStoreTma" not in ks.source
    from coda_ext.graphs import forward

    assert kernel_source(forward.linear_swiglu(True, True), "bfloat16", cfg).config.gated_store == "tma"
