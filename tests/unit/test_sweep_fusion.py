"""benchmarks/sweep_fusion.py without a GPU: the fused kernels of a model's planned training step, each with
the configs it is timed in (auto's first), and the dry run that lists them."""
from __future__ import annotations

import pytest

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
