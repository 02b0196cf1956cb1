"""benchmarks/goals.py: the speed goals checked against a results file (no GPU)."""
from __future__ import annotations

import json

from benchmarks import goals

TRAIN, SMALL = "16384x16384x2048", "128x6144x4096"


def entry(coda: float, compile_: float = 1.2, mainloop: float | None = None, config: str = "ping_128x128x64_c1x1_s4"):
    e = {"variants": {"cublas_gemm": {"median_ratio_to_cublas": 1.0},
                      "coda_auto": {"median_ratio_to_cublas": coda, "ratio_iqr": [coda - 0.01, coda + 0.01]},
                      "torch_compile": {"median_ratio_to_cublas": compile_}},
         "coda_ratio": coda, "auto_config": config}
    if mainloop is not None:
        e["mainloop_ratio"] = mainloop
        e["variants"]["plain_same_config"] = {"median_ratio_to_cublas": mainloop}
    return e


def results(**cases):
    return {name: {"shapes": shapes} for name, shapes in cases.items()}


def by_name(gs):
    return {g.name: g for g in gs}


def test_row_bound_uses_the_small_m_rule_at_inference_rows():
    assert goals.row_bound("swiglu", (16384, 28672, 4096)) == 0.99
    assert goals.row_bound("swiglu", (128, 28672, 4096)) == goals.SMALL_M_BOUND
    assert goals.row_bound("design", "1024x6144x4096") == goals.SMALL_M_BOUND
    assert goals.row_bound("design", TRAIN) == goals.FUSED_WORST


def test_plain_gemm_goals():
    g = by_name(goals.check(results(identity={TRAIN: entry(0.975), SMALL: entry(1.02)})))
    assert g["plain GEMM, training shapes"].met
    assert g["plain GEMM, worst shape"].met
    assert g["plain GEMM"].met                         # median of 0.975 and 1.02: 0.9975
    g = by_name(goals.check(results(identity={TRAIN: entry(0.985), SMALL: entry(0.99)})))
    assert g["plain GEMM"].met and not g["plain GEMM, training shapes"].met
    assert [r.shape for r in g["plain GEMM, training shapes"].misses] == [TRAIN]


def test_misses_carry_the_mainloop_and_epilogue_split():
    g = by_name(goals.check(results(swiglu={TRAIN: entry(1.158, mainloop=1.041)})))
    miss = g["swiglu, training shapes"]
    assert not miss.met
    assert miss.misses[0].split == "mainloop +4.1 %, epilogue +11.7 %"
    text = goals.render(goals.check(results(swiglu={TRAIN: entry(1.158, mainloop=1.041)})), {"gpu": "H100"}, "x.json")
    assert "epilogue +11.7 %" in text and "| swiglu, training shapes |" in text


def test_fused_median_and_worst_and_small_m_rules():
    shapes = {TRAIN: entry(1.01), "16384x6144x4096": entry(1.07), SMALL: entry(1.02, compile_=1.01)}
    g = by_name(goals.check(results(residual=shapes)))
    assert g["residual"].met                           # median 1.02
    assert not g["residual, worst shape"].met
    assert g["small M, every graph"].met
    assert not g["small M, never slower than torch.compile"].met


def test_peer_rows_are_compared_at_their_shape():
    g = by_name(goals.check(results(swiglu={TRAIN: entry(0.98)}, residual={"16384x2048x8192": entry(1.10)})))
    peer = g["never behind the peer (QuACK)"]
    assert not peer.met and [r.case for r in peer.misses] == ["residual"]


def test_cli_writes_the_table(tmp_path, capsys):
    path = tmp_path / "graphs.json"
    path.write_text(json.dumps({"env": {"gpu": "H100"}, "results": results(identity={TRAIN: entry(0.97)})}))
    out = tmp_path / "goals.md"
    assert goals.main([str(path), "--out", str(out)]) == 0
    assert "plain GEMM, training shapes" in out.read_text()
    assert out.read_text() == capsys.readouterr().out
