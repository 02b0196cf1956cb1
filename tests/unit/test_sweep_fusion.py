"""benchmarks/sweep_fusion.py without a GPU: the fused kernels of a model's planned training step, each with
the configs it is timed in (auto's first), and the dry run that lists them."""
from __future__ import annotations

import dataclasses

import pytest

from coda_ext.config import PINGPONG_SCHEDULES

pytest.importorskip("scipy")

from benchmarks import sweep_fusion as sf


def test_each_fused_kernel_comes_with_autos_config_first_and_only_configs_that_fit():
    from coda_ext.runtime.tuned import TunedOp

    entries = sf.kernels("mlp")
    assert entries and all(e["launches"] >= 1 and e["io_fused_us"] > 0 for e in entries)
    assert len({(e["site"].kernel_key, e["mnk"]) for e in entries}) == len(entries)
    for e in entries:
        site = e["site"]
        cfgs = sf.configs(site, e["mnk"])
        auto = TunedOp(site.graph, site.dtype, tune=False, major=site.major).config_for(*e["mnk"])
        assert cfgs[0].tag == auto.tag and len({c.tag for c in cfgs}) == len(cfgs)
        assert all(c.major == site.major for c in cfgs)


def test_dry_run_prints_every_kernel(capsys):
    assert sf.main(["--models", "mlp", "--dry-run"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("mlp:") and len(lines) == 1 + len(sf.kernels("mlp"))


def test_epilogue_mode_varies_the_subtile_and_stages_with_each_schedules_rows():
    """--epilogue: auto's config, then EPILOGUE_BASES x EPILOGUE_VARIANTS that fit, with 64-row subtiles in
    ping-pong and overlap and 128-row ones in cooperative (CUTLASS's epilogue builder refuses the others at nvcc
    time), store stages beyond CUTLASS's two among them, and the plain GEMM of each base in the site's layout among
    the build items."""
    e = sf.kernels("mlp")[0]
    cfgs = sf.configs(e["site"], e["mnk"], epilogue=True)
    assert len({c.tag for c in cfgs}) == len(cfgs) > 1
    for c in cfgs[1:]:
        assert c.epilogue_tile is None or c.epilogue_tile[0] == (64 if c.schedule in PINGPONG_SCHEDULES else 128)
    assert any(c.epilogue_stages for c in cfgs) and any(c.epilogue_tile for c in cfgs)
    assert {c.schedule for c in cfgs if c.epilogue_stages == (4, 4)} >= {"pingpong", "overlap"}
    plain = sf.plain_configs(e["site"], e["mnk"], epilogue=True)
    assert len(plain) == len(sf.EPILOGUE_BASES) and {c.major for c in plain} == {e["site"].major}
    assert sf.plain_configs(e["site"], e["mnk"]) == []
    digest = e["site"].graph.digest()
    assert sf.selected(sf.kernels("mlp"), (digest[:8],)) and not sf.selected(sf.kernels("mlp"), ("zzzzzzzz",))
    items = sf.build_items(("mlp",), epilogue=True, sites=(digest[:8],))
    assert len(items) == len(cfgs) + len(plain)


@pytest.mark.parametrize("named", sorted(sf.SETS))
def test_a_named_set_replaces_the_alternatives_after_autos_config(named):
    """--set direct|overlap: auto's config, then the set's configs that fit, in the site's layout; "direct" only
    where the graph loads tiles (a site without tile inputs keeps auto's config alone)."""
    from benchmarks.sweep_backward import loads_tiles
    from coda_ext.graph.canonical import as_ir

    for e in sf.kernels("mlp"):
        site = e["site"]
        cfgs = sf.configs(site, e["mnk"], named=named)
        assert cfgs[0].tag == sf.configs(site, e["mnk"])[0].tag and all(c.major == site.major for c in cfgs)
        wanted = {sf.ce_config(d, site.major).tag for d in sf.SETS[named]}
        assert {c.tag for c in cfgs[1:]} <= wanted
        if named == "direct" and not loads_tiles(as_ir(site.graph)):
            assert len(cfgs) == 1
        else:
            assert len(cfgs) > 1


def test_sweep_swizzle_builds_one_kernel_per_base_and_layout():
    """benchmarks/sweep_swizzle.py: swizzle, raster and grid are launch arguments, so its builds are the bases in
    each layout; its default shapes pad CUTLASS's grid under swizzle 4 in 128-wide tiles, not the fitted one."""
    from benchmarks import sweep_swizzle as sw
    from coda_ext import tuning

    items = sw.build_items()
    assert len(items) == len({c.tag for _, _, c in items}) == 2 * len(sw.BASES)
    ping = sw.BASES["ping"]
    s4 = dataclasses.replace(ping, swizzle=4)
    assert tuning.scheduled_tiles(dataclasses.replace(s4, grid="padded"), 16384, 768) > \
        tuning.scheduled_tiles(ping, 16384, 768) == tuning.scheduled_tiles(s4, 16384, 768)


def test_ablations_remove_one_part_each_and_stay_valid_graphs():
    """--ablate, on two library graphs (graphs.reductions: the output, row sums of exp and column sums; graphs.binary:
    the output and two stores, one fp32): the graph itself first, then each part removed; every variant verifies,
    is distinct, and keeps the other parts' sinks."""
    from coda_ext import graphs
    from coda_ext.graph.canonical import as_ir
    from coda_ext.graph.verify import verify

    red = as_ir(graphs.reductions())
    ab = sf.ablations(red, "bfloat16")
    assert next(iter(ab)) == "full" and ab["full"] is red
    assert {"no_col_reduce", "no_row_reduce", "no_reductions", "no_output", "no_math"} <= set(ab)
    assert "output_only" not in ab   # the same graph as no_reductions: each variant once
    kinds = {name: sorted({n.kind for n in v.nodes if n.is_sink}) for name, v in ab.items()}
    assert kinds["no_col_reduce"] == ["output", "row_reduce"] and kinds["no_row_reduce"] == ["col_reduce", "output"]
    assert kinds["no_reductions"] == ["output"]
    assert kinds["no_output"] == ["col_reduce", "row_reduce"]
    assert not ab["no_math"].find("exp") and red.find("exp")
    stores = as_ir(graphs.binary())
    ab2 = sf.ablations(stores, "bfloat16")
    assert {"no_stores", "stores_16bit"} <= set(ab2) and "no_col_reduce" not in ab2
    assert not ab2["no_stores"].find("store")
    assert [n.attr("dtype") for n in ab2["stores_16bit"].nodes if n.kind == "store"] == \
        [("bfloat16" if n.attr("dtype") == "float32" else n.attr("dtype")) for n in stores.nodes if n.kind == "store"]
    for v in list(ab.values()) + list(ab2.values()):
        verify(v)
    assert len({v.digest() for v in ab.values()}) == len(ab) and len({v.digest() for v in ab2.values()}) == len(ab2)


def test_ablate_builds_each_variant_and_the_plain_gemm_in_autos_config():
    e = sf.kernels("mlp")[0]
    items = sf.build_items(("mlp",), sites=(e["site"].graph.digest()[:8],), ablate=True)
    auto = sf.auto_config(e["site"], e["mnk"])
    assert {c.tag for _, _, c in items} == {auto.tag}
    assert len(items) == len(sf.ablations(e["site"].graph, e["site"].dtype)) + 1


def test_the_ablation_chart_draws_each_site_before_and_after(tmp_path):
    pytest.importorskip("matplotlib")
    row = {"graph": "abcd1234", "major": "kn", "mnk": [64, 32, 16], "config": "x",
           "variants": {name: {"median_ratio_to_cublas": r, "median_ms": r}
                        for name, r in (("cublas_gemm", 1.0), ("full", 1.5), ("no_math", 1.2), ("plain", 0.98))}}
    doc = {"env": {"gpu": "test GPU"}, "models": {"m": [row]}}
    before = {"models": {"m": [{**row, "variants": {**row["variants"], "full": {"median_ratio_to_cublas": 1.9}}}]}}
    sf.plot_ablation(doc, tmp_path / "a.png", before=before)
    sf.plot_ablation(doc, tmp_path / "b.png")
    assert (tmp_path / "a.png").stat().st_size > 1000 and (tmp_path / "b.png").stat().st_size > 1000


def test_the_cublas_baseline_writes_padded_rows_where_n_is_odd():
    """The bare GEMM's output has the fused kernel's layout: rows padded to 16 bytes at an odd N (cuBLAS would
    take its unaligned path on a contiguous (M, 50257) output), the values a @ wᵀ; aligned N stays contiguous."""
    import torch

    g = torch.Generator().manual_seed(0)
    for n, stride in ((13, 16), (16, 16)):
        a, w = torch.randn(5, 24, generator=g), torch.randn(n, 24, generator=g)
        for w_layout in (w, w.t().contiguous().t()):    # K-major, and N-major as a transposed view
            got = sf.cublas_gemm(a.to(torch.bfloat16), w_layout.to(torch.bfloat16))
            assert got.shape == (5, n) and got.stride() == (stride, 1)
            torch.testing.assert_close(got.float(), a.to(torch.bfloat16).float() @ w.to(torch.bfloat16).float().t(),
                                       rtol=1e-2, atol=1e-2)
