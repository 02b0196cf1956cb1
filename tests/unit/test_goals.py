"""benchmarks/goals.py: the speed goals checked against synthetic results files (no GPU): bench_graphs'
graphs and bench_fused_ops' forward and backward rows, met and missed, with the mainloop / epilogue split."""
from __future__ import annotations

import json

import pytest

from benchmarks import goals, graphs

TRAIN, TRAIN2, SMALL = "16384x16384x2048", "8192x8192x4096", "128x6144x4096"


def entry(coda: float, compile_: float = 1.2, mainloop: float | None = None, config: str = "ping_128x128x64_c1x1_s4"):
    """One shape of a bench_graphs case."""
    e = {"variants": {"cublas_gemm": {"median_ratio_to_cublas": 1.0},
                      "coda_auto": {"median_ratio_to_cublas": coda, "ratio_iqr": [coda - 0.01, coda + 0.01]},
                      "torch_compile": {"median_ratio_to_cublas": compile_}},
         "coda_ratio": coda, "auto_config": config}
    if mainloop is not None:
        e["mainloop_ratio"] = mainloop
        e["epilogue_ratio"] = coda / mainloop
        e["variants"][goals.PLAIN] = {"median_ratio_to_cublas": mainloop}
    return e


def results(**cases):
    return {name: {"shapes": shapes} for name, shapes in cases.items()}


def op_row(op, coda, tokens=16384, model="8B", pass_="forward", mainloop=None, compile_=None, fused=True,
           mnk=None):
    """One bench_fused_ops row (mnk: the GEMM as launched; default tokens x 4096 x 4096)."""
    M, N, K = mnk or (tokens, 4096, 4096)
    res = {"cublas": {"median_ratio_to_cublas": 1.0},
           "coda": {"median_ratio_to_cublas": coda, "ratio_iqr": [coda - 0.01, coda + 0.01]}}
    row = {"pass": pass_, "op": op, "model": model, "tokens": tokens, "M": M, "N": N, "K": K, "major": "kn",
           "config": "ping_128x128x64_c1x1_kn", "fused": fused, "results": res}
    if compile_ is not None:
        res["torch.compile"] = {"median_ratio_to_cublas": compile_}
    if mainloop is not None:
        res[goals.PLAIN] = {"median_ratio_to_cublas": mainloop}
        row.update(mainloop_ratio=mainloop, epilogue_ratio=coda / mainloop)
    return row


def by_name(gs):
    return {g.name: g for g in gs}


def test_bounds_come_from_one_home():
    assert goals.row_bound("swiglu", (16384, 28672, 4096)) == graphs.CASES["swiglu"][1] == 0.97
    assert goals.row_bound("swiglu", (128, 28672, 4096)) == goals.SMALL_M_BOUND
    assert goals.row_bound("design", "1024x6144x4096") == goals.SMALL_M_BOUND
    assert goals.row_bound("design", TRAIN) == graphs.CASES["design"][1]
    assert goals.op_bound("swiglu_train") == graphs.CASES["rstd_swiglu"][1] == 0.97
    assert goals.op_bound("swiglu_y") == graphs.CASES["swiglu_y"][1] == 0.95
    assert goals.op_bound("qkv_rope") == goals.FORWARD_OP == 1.00
    assert graphs.CASES["identity"][1] == 0.98 and goals.BACKWARD_GEMM == 1.02


def test_plain_gemm_goal_is_the_median_at_m_4096_and_up():
    g = by_name(goals.check(results(identity={TRAIN: entry(0.975), TRAIN2: entry(0.985), SMALL: entry(1.10)})))
    plain = g["plain GEMM, M >= 4096"]
    assert plain.met and plain.measured == "median 0.980 over 2 shapes"   # the 128-row shape is not counted
    g = by_name(goals.check(results(identity={TRAIN: entry(0.99), TRAIN2: entry(0.975), SMALL: entry(0.9)})))
    plain = g["plain GEMM, M >= 4096"]
    assert plain.met is False and [r.shape for r in plain.misses] == [TRAIN]
    assert plain.misses[0].split == "mainloop 0.990 (a plain GEMM)"


def test_swiglu_graph_goals_and_a_missed_median_carries_its_split():
    g = by_name(goals.check(results(swiglu={TRAIN: entry(0.96), TRAIN2: entry(0.965), SMALL: entry(1.2)},
                                    swiglu_y={TRAIN: entry(1.158, mainloop=1.041), TRAIN2: entry(0.94)})))
    assert g["swiglu (graph), training shapes"].met
    miss = g["swiglu_y (graph), training shapes"]       # median 1.049 > 0.95
    assert miss.met is False and miss.measured.startswith("median 1.049 over 2 shapes")
    assert [r.shape for r in miss.misses] == [TRAIN]
    assert miss.misses[0].split == "mainloop 1.041, epilogue 1.112"


def test_forward_ready_ops_each_against_its_bound():
    rows = [op_row("qkv_rope", 0.99), op_row("qkv_rope", 1.0, model="1B"), op_row("qkv_rope", 1.5, tokens=128),
            op_row("swiglu_train", 0.975, mainloop=0.96), op_row("swiglu_y", 0.94),
            op_row("linear_residual", 1.01, mainloop=0.99)]   # a forward op timed in the backward family
    g = by_name(goals.check(op_rows=rows))
    assert g["qkv_rope (ready op), training shapes"].met          # median 0.995; the 128-token row is not counted
    swiglu = g["swiglu_train (ready op), training shapes"]
    assert swiglu.met is False and swiglu.target == "median <= 0.97"
    assert swiglu.measured == "median 0.975 over 1 shape (mainloop 0.960, epilogue 1.016)"
    assert g["swiglu_y (ready op), training shapes"].met
    assert g["linear_residual (ready op), training shapes"].met is False
    assert g["every backward epilogue GEMM"].met is None           # no backward rows: not measured


def test_backward_gemms_median_and_split():
    rows = [op_row("swiglu_backward_linear", 1.01, pass_="backward", mainloop=1.0),
            op_row("swiglu_backward_linear", 1.03, pass_="backward", model="1B", mainloop=1.0),
            op_row("rms_norm_backward_linear_dx_in", 1.10, pass_="backward", mainloop=1.01),
            op_row("rms_norm_backward_linear_dx_in", 1.20, pass_="backward", model="1B", mainloop=1.02),
            op_row("weight_grad_down", 1.0, pass_="backward", fused=False, mnk=(4096, 14336, 16384)),
            op_row("weight_grad_down", 2.0, pass_="backward", fused=False, tokens=128, mnk=(4096, 14336, 128))]
    g = by_name(goals.check(op_rows=rows))
    assert g["swiglu_backward_linear (backward GEMM), training shapes"].met   # median 1.02
    norm = g["rms_norm_backward_linear_dx_in (backward GEMM), training shapes"]
    assert norm.met is False and norm.target == "median <= 1.02"
    assert [(r.label, r.split) for r in norm.misses] == [
        ("rms_norm_backward_linear_dx_in 1B", "mainloop 1.020, epilogue 1.176"),
        ("rms_norm_backward_linear_dx_in 8B", "mainloop 1.010, epilogue 1.089")]
    wgrad = g["weight_grad_down (backward GEMM), training shapes"]           # a weight gradient's tokens are its K
    assert wgrad.met and wgrad.measured == "median 1.000 over 1 shape"
    assert g["every forward ready op"].met is None
    text = goals.render(goals.check(op_rows=rows), {"ops.json": {"gpu": "H100"}})
    assert ("| rms_norm_backward_linear_dx_in (backward GEMM), training shapes | rms_norm_backward_linear_dx_in 1B "
            "| 16384x4096x4096 |") in text
    assert "epilogue 1.176" in text and "not measured" in text


def test_no_fused_op_slower_than_torch_compile_at_any_shape():
    graph_rows = results(identity={SMALL: entry(1.03, compile_=1.0)},               # a plain GEMM: not counted
                         design={SMALL: entry(1.1, compile_=1.05), TRAIN: entry(1.0, compile_=1.2)})
    op_rows = [op_row("qkv_rope", 1.1, compile_=1.3),
               op_row("weight_grad_o", 1.01, pass_="backward", fused=False, compile_=1.0),   # plain: not counted
               op_row("swiglu_backward_linear", 1.3, pass_="backward", compile_=1.28),
               op_row("qkv_rope", 1.5, tokens=128)]                                          # not timed: not counted
    goal = by_name(goals.check(graph_rows, op_rows))["no fused op slower than torch.compile"]
    assert goal.met is False and goal.target == "<= torch.compile at each of 4 rows"
    assert [(r.case, r.shape) for r in goal.misses] == [("design", SMALL),
                                                        ("swiglu_backward_linear", "16384x4096x4096")]
    faster = [op_row("qkv_rope", 1.1, compile_=1.3)]
    assert by_name(goals.check(op_rows=faster))["no fused op slower than torch.compile"].met


def test_the_other_graph_families_and_small_m_keep_their_goals():
    shapes = {TRAIN: entry(1.01), "16384x6144x4096": entry(1.07), SMALL: entry(1.02, compile_=1.01)}
    g = by_name(goals.check(results(residual=shapes)))
    assert g["residual (graph)"].met                               # median 1.02
    assert not g["residual (graph), worst shape"].met
    assert g["small M, every graph"].met
    assert g["plain GEMM, M >= 4096"].met is None                  # no identity rows


def test_rows_of_an_earlier_ops_file_are_forward_rows_without_a_split():
    old = {"op": "residual_norm_o", "model": "1B", "M": 16384, "N": 2048, "K": 2048,
           "results": {"cublas": {"median_ratio_to_cublas": 1.0}, "coda": {"median_ratio_to_cublas": 1.12},
                       "torch.compile": {"median_ratio_to_cublas": 1.1}}}
    g = by_name(goals.check(op_rows=[old]))
    goal = g["residual_norm_o (ready op), training shapes"]
    assert goal.met is False and goal.misses[0].split == "not measured"
    assert g["no fused op slower than torch.compile"].met is False


def test_cli_reads_both_files_and_writes_the_report(tmp_path, capsys):
    graphs_file, ops_file, out = tmp_path / "graphs.json", tmp_path / "ops.json", tmp_path / "goals.md"
    graphs_file.write_text(json.dumps({"env": {"gpu": "H100", "commit": "abc"},
                                       "results": results(identity={TRAIN: entry(0.97)})}))
    ops_file.write_text(json.dumps({"gpu": {"gpu": "H100", "commit": "def"},
                                    "results": [op_row("linear_dx", 1.05, pass_="backward", mainloop=1.04)]}))
    assert goals.main(["--graphs", str(graphs_file), "--ops", str(ops_file), "--out", str(out)]) == 0
    text = out.read_text()
    assert text == capsys.readouterr().out
    assert "graphs.json: GPU H100" in text and "commit def" in text
    assert "| plain GEMM, M >= 4096 | median <= 0.98 | median 0.970 over 1 shape | met |" in text
    assert ("| linear_dx (backward GEMM), training shapes | median <= 1.02 | median 1.050 over 1 shape (mainloop "
            "1.040, epilogue 1.010) | missed |") in text
    assert "1 of 2 measured goals met; 3 not measured." in text     # forward ops, torch.compile, small M
    assert goals.main(["--graphs", str(graphs_file), "--ops", str(tmp_path / "none.json")]) == 0
    assert "not measured" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        goals.main(["--graphs", str(tmp_path / "none.json"), "--ops", str(tmp_path / "none.json")])
