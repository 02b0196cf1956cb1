"""benchmarks/bench_fused_ops.py and its backward family (backward_gemms.py) without a GPU: the rows, the
kernels they need, the GEMM and unfused math each row times, and the results rows the goals read."""
from __future__ import annotations

import json

import pytest
import torch

from benchmarks import backward_gemms as bg
from benchmarks import bench_fused_ops as bfo
from benchmarks import goals
from coda_ext import graphs, interpret
from coda_ext.models import LlamaConfig
from coda_ext.models.functions import training_kernels
from coda_ext.ops import linear_grad, lm_head_ce, norm_backward, swiglu_backward
from coda_ext.runtime import TunedOp, auto_items

TINY = {"tiny": dict(d=64, F=128, hq=2, hkv=1, hd=16)}
TINY_HEAD = dict(model="tiny", M=32, K=64, V=1536, chunk_bytes=2**16)   # chunks of 1024 and 512 columns
LLAMA = {"8B": LlamaConfig(hidden_size=4096, intermediate_size=14336, head_dim=128),
         "1B": LlamaConfig(hidden_size=2048, intermediate_size=8192, head_dim=64)}


def tiny_rows():
    return bg.cases(TINY, (32,), lm_head=TINY_HEAD)


def test_backward_rows_are_the_training_steps_gemms(capsys):
    rows = bfo.backward_cases()
    assert len(rows) == 2 * 3 * len(bg.STEP_OPS) + 2 * len(bg.LM_HEAD_OPS)   # two chunk widths at 8192 tokens
    by = {(g.op, g.model, g.tokens): g for g in rows}
    g = by["swiglu_backward_linear", "8B", 16384]
    assert (g.M, g.N, g.K, g.major) == (16384, 14336, 4096, "kn")
    g = by["rms_norm_backward_linear_dx_in", "1B", 16384]
    assert (g.M, g.N, g.K, g.major, g.args) == (16384, 2048, 16384, "kn", (True,))
    g = by["weight_grad_accumulate", "1B", 1024]
    assert (g.M, g.N, g.K, g.major, g.args) == (16384, 2048, 1024, "mn", (True,))
    assert by["linear_residual", "8B", 128].pass_name == "forward"
    head = [g for g in rows if g.op.startswith("lm_head")]
    assert sorted({g.N for g in head if g.op == "lm_head_dlogits"}) == [13568, 16384]
    assert bfo.main(["--dry-run", "--backward", "--models", "1B", "--ms", "16384"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == f"{len(bg.STEP_OPS) + 2 * len(bg.LM_HEAD_OPS)} rows, " + out[-1].split(", ")[1]
    line = next(x for x in out if x.startswith("backward swiglu_backward_linear 1B"))
    assert "16384x8192x2048 kn" in line and "[identity " in line and "torch.compile" in line
    assert "ping_128x192x64_c1x1_s8_kn]" in line   # the operand layout and the tiles the op launches (tuning)


def test_every_kernel_of_a_training_step_is_prebuilt():
    """build_items() of both families holds every kernel a Llama layer's training step launches (and
    the plain twin of every config it picks)."""
    items = bfo.build_items()
    have = {(g.build().digest(), cfg.tag) for g, _, cfg in items}
    identity = graphs.identity().build().digest()
    for model, config in LLAMA.items():
        for g, _, cfg in training_kernels(config, 16384, lm_head=False):
            assert (g.build().digest(), cfg.tag) in have, (model, cfg.tag)
    assert all((identity, cfg.tag) in have for _, _, cfg in items)
    head = lm_head_ce.gemms(bfo.LM_HEAD["M"], bfo.LM_HEAD["V"], bfo.LM_HEAD["K"], True)   # forward and backward
    assert {(g.build().digest(), cfg.tag) for g, _, cfg in auto_items(head, "bfloat16")} <= have


def test_ops_of_the_other_family_are_refused(capsys):
    with pytest.raises(SystemExit):
        bfo.main(["--dry-run", "--ops", "linear_dx"])
    assert "--backward" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bfo.main(["--dry-run", "--backward", "--ops", "qkv_rope"])


@pytest.mark.parametrize("g", tiny_rows(), ids=lambda g: f"{g.op}-{g.M}x{g.N}x{g.K}")
def test_each_row_times_the_ops_gemm_and_its_math(g):
    """operands() is the GEMM the op launches (its module's own _gemm: graph, layout, the same views), and
    eager() (what torch.compile compiles) is the op's math: its fp32 reference, or for the LM head's
    GEMMs the graph's."""
    s = bg.inputs(g, 0, device="cpu")
    A, W = bg.operands(g, s)
    assert (A.shape, W.shape) == ((g.M, g.K), (g.N, g.K))
    gemm = {"swiglu_backward_linear": lambda: swiglu_backward._gemm(s.get("dz"), s.get("w"), s.get("z")),
            "linear_dx": lambda: linear_grad._gemm("linear_dx", s["dz"], s["w"].t(), None),
            "linear_residual": lambda: linear_grad._gemm("linear_residual", s["x"], s["w"], s["res"])}.get(g.op)
    if g.kind == "norm":
        gemm = lambda: norm_backward._gemm(s["dz"], s["w"], s["x"], s["rstd"], s["gamma"], s["zdz"], s.get("acc"))  # noqa: E731
    elif g.op.startswith("weight_grad"):
        gemm = lambda: linear_grad._gemm("weight_grad", s["dz"].t(), s["x"].t(), s.get("acc"))  # noqa: E731
    if gemm is not None:
        d = gemm()
        assert d["build"](*d["args"]).build().digest() == g.graph().build().digest() and d["major"] == g.major
        for mine, theirs in ((A, d["A"]), (W, d["W"])):
            assert (mine.data_ptr(), mine.shape, mine.stride()) == (theirs.data_ptr(), theirs.shape, theirs.stride())
    if g.op == "swiglu_backward_linear":
        ref = swiglu_backward.reference(s["dz"], s["w"], s["z"])
    elif g.kind == "norm":
        ref = norm_backward.reference(s["dz"], s["w"], s["x"], s["rstd"], s["gamma"], s["zdz"], s.get("acc"))
    elif g.kind == "dlogits":
        out = interpret(g.graph(), A, W, **{k: s[k] for k in ("rstd", "lse", "coef", "g_target", "target")})
        ref = out.dacc, out.drstd
    else:   # the linear family: D = acc [+ residual]
        out = interpret(g.graph(), A.float(), W.float(), **({"residual": s.get("acc", s.get("res"))}
                                                           if g.accumulates or g.kind == "residual" else {}))
        ref = out.out
    got = bg.eager(g, s)
    got, ref = (got if isinstance(got, tuple) else (got,)), (ref if isinstance(ref, tuple) else (ref,))
    assert len(got) == len(ref)
    for a, b in zip(got, ref):
        assert a.shape == b.shape
        torch.testing.assert_close(a.float(), b.float(), atol=0.05, rtol=0.02)


def test_rows_record_the_mainloop_and_epilogue_shares():
    times = {"cublas": [1.0, 1.0, 1.0], "coda": [1.2, 1.1, 1.3], bfo.PLAIN: [1.0, 1.1, 1.0],
             "eager": [2.0, 2.0, 2.0]}
    g = bfo.backward_cases(("1B",), (16384,), lm_head=False, ops=("rms_norm_backward_linear",))[0]
    row = bfo.summarize_row(bfo.row_fields(g), times, "ping_128x128x64_c1x1_kn", True)
    assert (row["pass"], row["op"], row["tokens"], row["M"], row["N"], row["K"], row["major"]) == \
        ("backward", "rms_norm_backward_linear", 16384, 16384, 2048, 3072, "kn")
    assert row["results"]["coda"]["median_ratio_to_cublas"] == pytest.approx(1.2)
    assert row["mainloop_ratio"] == pytest.approx(1.0)
    assert row["epilogue_ratio"] == pytest.approx(1.2)          # per round 1.2, 1.0, 1.3
    assert bfo.row_fields(("qkv_rope", "8B", 128, 6144, 4096))["pass"] == "forward"


def _row(op, M, coda, pass_=None, **extra):
    res = {"cublas": {"median_ratio_to_cublas": 1.0}, "coda": {"median_ratio_to_cublas": coda}}
    row = {"op": op, "model": "8B", "M": M, "N": 4096, "K": 4096, "results": res, **extra}
    return row if pass_ is None else dict(row, **{"pass": pass_, "tokens": M})


def test_merge_keeps_both_families_and_replaces_a_case_by_the_later_file(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bfo, "plot", lambda *a, **k: None)
    old = {"gpu": {"gpu": "H100"}, "results": [_row("qkv_rope", 16384, 1.2), _row("swiglu_y", 16384, 0.94)]}
    new = {"gpu": {"gpu": "H100"}, "results": [_row("qkv_rope", 16384, 0.99, "forward"),
                                               _row("linear_dx", 16384, 1.01, "backward"),
                                               _row("linear_dx", 16384, 1.05, "backward", N=2048)]}
    a, b, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "ops.json"
    a.write_text(json.dumps(old))
    b.write_text(json.dumps(new))
    assert bfo.main(["--merge", str(a), str(b), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert sorted((r["op"], r["results"]["coda"]["median_ratio_to_cublas"]) for r in doc["results"]) == \
        [("linear_dx", 1.01), ("linear_dx", 1.05), ("qkv_rope", 0.99), ("swiglu_y", 0.94)]
    assert "qkv_rope (ready op), training shapes: median <= 1.00; median 0.990 over 1 shape: met" in doc["goals"]
    assert any(x.startswith("linear_dx (backward GEMM)") and x.endswith("missed") for x in doc["goals"])
    assert "linear_dx (backward GEMM)" in capsys.readouterr().out


SMOKE = {"tiny": dict(d=128, F=256, hq=2, hkv=1, hd=64)}


def test_every_row_runs_and_its_op_agrees_with_its_unfused_math(kernel_standin, monkeypatch):
    """run() end to end on the CPU, both families at a tiny model: the ready ops and the LM head's graph
    ops launch on the stand-in kernels (the graph's interpreter), the plain twin interprets the identity
    graph, timing calls every variant on both input sets. Each row's op (what is timed as "coda") agrees
    with its eager math (what torch.compile compiles) and with cuBLAS's GEMM in shape; the row records the
    config the op's dispatch picks."""
    import coda_ext

    outputs: dict = {}

    def fake_timing(variants, reps):
        for name, fn in variants.items():
            outputs[name] = [fn(0), fn(1)]
        return {name: [1.0 + 0.1 * (name == "coda"), 1.0 + 0.2 * (name == "coda")] for name in variants}

    def twin(graph, dtype, config):
        return lambda A, W: interpret(graph, A, W).out.to(A.dtype)

    monkeypatch.setattr(bfo, "MODELS", SMOKE)
    monkeypatch.setattr(bfo, "LM_HEAD", dict(model="tiny", M=32, K=128, V=1024))
    monkeypatch.setattr(bfo, "DEVICE", "cpu")
    monkeypatch.setattr(bfo, "_peak_memory", lambda fn: 0.0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "stand-in")
    monkeypatch.setattr(coda_ext, "compile", twin)
    monkeypatch.setattr(bfo.common, "compile_for_one_shape", lambda fn, *a, **k: fn)
    monkeypatch.setattr(bfo.common, "time_interleaved", fake_timing)

    def tuple_of(x):
        x = tuple(x.values()) if isinstance(x, dict) else x
        return x if isinstance(x, tuple) else (x,)

    selected = bfo.cases(("tiny",), (32,)) + bfo.backward_cases(("tiny",), (32,))
    for case in selected:
        outputs.clear()
        row = bfo.run([case], reps=2)[0]
        assert set(row["results"]) == {"cublas", "coda", bfo.PLAIN, "eager", "torch.compile"}
        assert row["mainloop_ratio"] == 1.0 and row["epilogue_ratio"] == pytest.approx(1.15)
        graph, major, mnk = bfo.kernel_of(case)
        assert row["config"] == TunedOp(graph, "bfloat16", tune=False, major=major).config_for(*mnk).tag
        for i in (0, 1):
            gemm, plain = outputs["cublas"][i], outputs[bfo.PLAIN][i]
            assert gemm.shape == plain.shape == mnk[:2]
            torch.testing.assert_close(plain.float(), gemm.float(), atol=0.02, rtol=0.02)
            coda, eager = tuple_of(outputs["coda"][i]), tuple_of(outputs["eager"][i])
            for a, b in zip(coda, eager):   # the LM head's forward returns (loss, lse); its eager math the loss
                assert a.shape == b.shape, row["op"]
                torch.testing.assert_close(a.float(), b.float(), atol=0.06, rtol=0.03, msg=row["op"])


def test_sustained_rows_time_blocks_at_the_power_limit(kernel_standin, monkeypatch):
    """run(sustained=True) times every variant with common.time_sustained (a quarter of the rounds, at least
    three), never one call at a time."""
    import coda_ext

    seen = {}

    def sustained(variants, reps):
        seen["reps"], seen["variants"] = reps, set(variants)
        return {name: [1.0, 1.0, 1.0] for name in variants}

    def interleaved(variants, reps):
        raise AssertionError("timed one call at a time")

    monkeypatch.setattr(bfo, "MODELS", SMOKE)
    monkeypatch.setattr(bfo, "DEVICE", "cpu")
    monkeypatch.setattr(bfo, "_peak_memory", lambda fn: 0.0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "stand-in")
    monkeypatch.setattr(coda_ext, "compile", lambda graph, dtype, config: (lambda A, W: interpret(graph, A, W).out))
    monkeypatch.setattr(bfo.common, "compile_for_one_shape", lambda fn, *a, **k: fn)
    monkeypatch.setattr(bfo.common, "time_sustained", sustained)
    monkeypatch.setattr(bfo.common, "time_interleaved", interleaved)
    case = bfo.backward_cases(("tiny",), (32,))[0]
    row = bfo.run([case], reps=20, sustained=True)[0]
    assert seen["reps"] == 5 and {"cublas", "coda", bfo.PLAIN} <= seen["variants"]
    assert row["epilogue_ratio"] == 1.0 and row["results"]["coda"]["median_ratio_to_cublas"] == 1.0


def test_no_compile_leaves_torch_compile_out(kernel_standin, monkeypatch, capsys):
    """--no-compile: no row compiles or times torch.compile (a full run's compile time, about 15 s a training row, is
    most of its time), the dry run lists it nowhere, and the torch.compile goal reads "not measured"."""
    import coda_ext

    def no_compile(fn, *a, **k):
        raise AssertionError("torch.compile called")

    models = bfo.MODELS
    monkeypatch.setattr(bfo, "MODELS", SMOKE)
    monkeypatch.setattr(bfo, "DEVICE", "cpu")
    monkeypatch.setattr(bfo, "_peak_memory", lambda fn: 0.0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "stand-in")
    monkeypatch.setattr(coda_ext, "compile", lambda graph, dtype, config: (lambda A, W: interpret(graph, A, W).out))
    monkeypatch.setattr(bfo.common, "compile_for_one_shape", no_compile)
    monkeypatch.setattr(bfo.common, "time_interleaved", lambda variants, reps: {n: [1.0, 1.0] for n in variants})
    rows = bfo.run(bfo.cases(("tiny",), (32,))[:1] + bfo.backward_cases(("tiny",), (32,))[:1], reps=2,
                   no_compile=True)
    assert all(set(r["results"]) == {"cublas", "coda", bfo.PLAIN, "eager"} for r in rows)
    goal = next(g for g in goals.check(op_rows=rows) if g.name == "no fused op slower than torch.compile")
    assert goal.verdict == "not measured"
    assert bfo.with_compile(16384) and not bfo.with_compile(128) and bfo.with_compile(128, compile_all=True)
    assert not bfo.with_compile(16384, compile_all=True, no_compile=True)
    monkeypatch.setattr(bfo, "MODELS", models)
    assert bfo.main(["--dry-run", "--backward", "--models", "1B", "--ms", "16384", "--no-compile"]) == 0
    out = capsys.readouterr().out
    assert "torch.compile" not in out and "backward swiglu_backward_linear 1B" in out
