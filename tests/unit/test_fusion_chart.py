"""coda_ext.analysis.fusion_chart: the report of automatic fusion drawn (bytes kept per fused kernel, the IO
model's fused and compile-style times, what was left to the fallback), and its rows summed from the report."""
from __future__ import annotations

import pytest
import torch

import coda_ext.fusion as cf
from coda_ext.analysis import fusion_chart
from coda_ext.analysis.fusion_chart import left_out, rows
from tests.unit.test_fusion_backend import MLP, mlp_inputs

pytest.importorskip("matplotlib")


def _report():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = MLP().to(torch.bfloat16)
    x, t = mlp_inputs()
    return cf.plan(model, args=(x.to(torch.bfloat16), t)).report


def test_rows_sum_the_report():
    report = _report()
    got = rows(report)
    fused = [k for k in report.kernels if k.kernel]
    assert got and sum(r["count"] for r in got) == len(fused)
    assert sum(r["bytes_kept"] for r in got) == sum(k.bytes_kept for k in fused)
    assert [r["bytes_kept"] for r in got] == sorted((r["bytes_kept"] for r in got), reverse=True)
    assert all(r["fused_s"] > 0 and r["compile_s"] > 0 for r in got)
    assert sum(n for _, n in left_out(report, top=1000)) == sum(len(g.left_out) for g in report.graphs)


def test_draws_a_png(tmp_path):
    path = fusion_chart(_report(), tmp_path / "fusion.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_an_empty_report_says_why(tmp_path):
    with pytest.raises(ValueError, match="has the fused model run once"):
        fusion_chart(cf.FusionReport(), tmp_path / "x.png")
