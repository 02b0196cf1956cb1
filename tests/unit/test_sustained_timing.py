"""The sustained (power-limited) timing of the benchmarks, the clock summary of hf_step_anatomy and the config
selection of sweep_backward, on the CPU (the GPU's events replaced by the host's clock)."""
import dataclasses
import time

import pytest

pytest.importorskip("torch")

import coda_ext as ce
from benchmarks import common, hf_step_anatomy, sweep_backward


def test_block_calls_fill_the_block():
    assert common.block_calls(1.0, 100.0) == 100
    assert common.block_calls(40.0, 100.0) == 3      # at least three calls a block
    assert common.block_calls(0.0, 100.0) == 100_000  # a call too short to time does not divide by zero


def test_time_sustained_times_blocks_per_call(monkeypatch):
    import torch

    def event_ms(fn):
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    monkeypatch.setattr(common, "event_ms", event_ms)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    calls, seen = {"a": 0, "b": 0}, set()

    def variant(name, ms):
        def run(i):
            calls[name] += 1
            seen.add(i)
            time.sleep(ms / 1e3)
        return run

    times = common.time_sustained({"a": variant("a", 2.0), "b": variant("b", 4.0)}, reps=3, warmup=1,
                                  block_ms=20.0, heat_ms=30.0)
    assert set(times) == {"a", "b"} and all(len(t) == 3 for t in times.values())
    assert all(1.9 < t < 3.5 for t in times["a"]) and all(3.9 < t < 6.0 for t in times["b"])
    assert seen == {0, 1}                       # both input sets
    assert calls["a"] >= 4 * 9 and calls["b"] >= 4 * 4   # blocks of ~20 ms: warm-up, heat and timed rounds


def test_clock_summary_reads_the_loaded_samples(tmp_path):
    csv = tmp_path / "c.csv"
    csv.write_text("2026/11/29 23:36:42.823, 1485 MHz, 689.50 W, 56\n"
                   "2026/11/29 23:36:42.928, 1395 MHz, 692.50 W, 57\n"
                   "2026/11/29 23:36:43.028, 1980 MHz, 210.00 W, 41\n"
                   "garbage\n")
    s = hf_step_anatomy.clock_summary(csv)
    assert s["samples"] == 3 and s["busy_samples"] == 2
    assert s["mean_sm_mhz"] == pytest.approx(1440.0) and s["mean_watts"] == pytest.approx(691.0)
    assert hf_step_anatomy.clock_summary(csv, min_watts=1000.0)["busy_samples"] == 0


def test_sweep_backward_takes_the_heuristics_config_and_filters_by_tag():
    (g,) = sweep_backward.rows(("1B",), 16384, ("swiglu_backward_linear",))
    auto = sweep_backward.heuristic_config(g)
    assert auto.major == "kn" == g.major       # the layout the op launches, not the default "kk"
    tags = [c.tag for c in sweep_backward.row_configs(g)]
    like = lambda **kw: dataclasses.replace(auto, **kw).tag   # noqa: E731
    assert auto.tag in tags and like(epilogue_stages=(2, 1)) in tags and like(epilogue_stages=(1, 1)) in tags
    assert like(epilogue_stages=(4, 4)) in tags and like(epilogue_tile=(64, 64)) in tags   # larger subtiles
    assert like(schedule="overlap", epilogue_stages=(2, 1)) in tags   # the overlap schedule, shallower stages
    other = "vector" if auto.pair_smem == "staggered" else "staggered"
    assert like(pair_smem=other) in tags   # the pairs the other way
    only = (auto.tag, like(epilogue_stages=(2, 1)))
    assert [c.tag for c in sweep_backward.row_configs(g, only)] == list(only)
    items = sweep_backward.build_items(("1B",), 16384, ("swiglu_backward_linear",), only)
    assert {cfg.tag for _, _, cfg in items} == set(only)   # the op's graph in both, its plain twin in the base


def test_sweep_backward_lm_head_rows_and_launch_variants():
    """--ops may name the LM head backward's GEMMs (backward_gemms.LM_HEAD: both vocabulary chunk widths), and
    --launch adds each config at other swizzles and rasters: the same kernel, so nothing more to build."""
    rows = sweep_backward.rows(("8B",), 16384, ("lm_head_dw",))
    assert [(g.op, g.M, g.N, g.K, g.major) for g in rows] == [("lm_head_dw", 13568, 4096, 8192, "mn"),
                                                              ("lm_head_dw", 16384, 4096, 8192, "mn")]
    base = sweep_backward.heuristic_config(rows[0])
    assert (base.swizzle, base.raster) == (8, "along_m")        # tuning's raster flip for this chunk
    tags = [c.tag for c in sweep_backward.row_configs(rows[0], (base.tag,), ("s2", "s8", "along_n"))]
    assert tags[-1] == base.tag and len(tags) == len(set(tags)) == 3
    assert {t.replace("_s2_", "_s8_") for t in tags} == {base.tag.replace("along_m", "along_n"), base.tag}
    plain = sweep_backward.build_items(("8B",), 16384, ("lm_head_dw",), (base.tag,))
    launched = sweep_backward.build_items(("8B",), 16384, ("lm_head_dw",), (base.tag,), ("s2", "along_n"))
    kernels = lambda items: {ce.kernel_source(g, d, c).source for g, d, c in items}   # noqa: E731
    assert kernels(launched) == kernels(plain)


def test_sweep_backward_configs_of_a_128x192_heuristic_and_stream_k():
    """A row whose heuristic config is 128 x 192 (Llama-1B's RMSNorm backward with dx_in) lists only the epilogue
    subtiles that divide its tile (a 64 x 128 subtile of a 192-wide tile raised before any timing ran), and every row
    has the stream-K twin of the cooperative 128 x 256 2 x 1; the weight gradients are sweepable by name."""
    (g,) = sweep_backward.rows(("1B",), 16384, ("rms_norm_backward_linear_dx_in",))
    auto = sweep_backward.heuristic_config(g)
    assert auto.tile[:2] == (128, 192)
    cfgs = sweep_backward.row_configs(g)
    assert auto in cfgs and all(c.epilogue_tile is None or c.tile[1] % c.epilogue_tile[1] == 0 for c in cfgs)
    assert dataclasses.replace(auto, epilogue_tile=(64, 64)) in cfgs
    assert "sk_128x256x64_c2x1_s4_kn" in {c.tag for c in cfgs}
    assert {"weight_grad_gate_up", "weight_grad_accumulate"} <= set(sweep_backward.MORE_OPS)
    (w,) = sweep_backward.rows(("8B",), 16384, ("weight_grad_gate_up",))
    assert (w.M, w.N, w.K, w.major) == (28672, 4096, 16384, "mn")


def test_sweep_backward_parses_sustained_and_more_ops(monkeypatch):
    seen = {}
    monkeypatch.setattr(common, "gpu_info", lambda: (_ for _ in ()).throw(SystemExit(0)))
    import argparse

    real = argparse.ArgumentParser.parse_args

    def spy(self, argv=None, namespace=None):
        ns = real(self, argv, namespace)
        seen.update(vars(ns))
        return ns
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", spy)
    with pytest.raises(SystemExit):
        sweep_backward.main(["--ops", "linear_residual", "--sustained", "--configs", "a", "b"])
    assert seen["sustained"] and seen["ops"] == ["linear_residual"] and seen["configs"] == ["a", "b"]


def test_clocks_while_samples_during_the_calls(monkeypatch):
    """clocks_while runs fn again and again for its seconds while nvidia-smi writes samples (here a stand-in that
    writes two loaded samples and one idle one), and summarises the loaded ones; None without nvidia-smi."""
    class FakeSmi:
        def __init__(self, argv, stdout, stderr):
            assert argv[0] == "nvidia-smi" and f"--query-gpu={common.CLOCK_QUERY}" in argv
            stdout.write("t, 1400 MHz, 690.00 W, 60\nt, 1500 MHz, 688.00 W, 61\nt, 1980 MHz, 90.00 W, 40\n")
            stdout.flush()

        def terminate(self):
            pass

        def wait(self):
            pass

    calls = []
    monkeypatch.setattr(common.subprocess, "Popen", FakeSmi)
    s = common.clocks_while(lambda: calls.append(time.sleep(0.01)), seconds=0.05)
    assert len(calls) >= 3
    assert s["busy_samples"] == 2 and s["mean_sm_mhz"] == pytest.approx(1450.0) and s["mean_watts"] == 689.0

    def missing(*a, **k):
        raise FileNotFoundError("nvidia-smi")

    monkeypatch.setattr(common.subprocess, "Popen", missing)
    assert common.clocks_while(lambda: None, seconds=0.01) is None


def test_fixed_config_compiles_each_graph_once_across_calls(monkeypatch):
    """Every timed call of an op_ variant enters fixed_config anew: the op it compiled is kept (regression: it was
    compiled again inside each timed call, host time in the timed span)."""
    import dataclasses

    import coda_ext.runtime.api as api
    from coda_ext.ops import common as ops_common

    made = []
    monkeypatch.setattr(api, "compile", lambda graph, dtype, cfg, major="kk": made.append(cfg) or object())
    monkeypatch.setattr(sweep_backward, "_FIXED_OPS", {})
    (g,) = sweep_backward.rows(("1B",), 16384, ("swiglu_backward_linear",))
    cfg = sweep_backward.heuristic_config(g)
    ops = []
    for _ in range(3):
        with sweep_backward.fixed_config(cfg):
            ops.append(ops_common.graph_op(g.build, "bfloat16", "auto", *g.args, major=g.major))
    assert len(made) == 1 and ops[0] is ops[1] is ops[2]
    other = dataclasses.replace(cfg, swizzle=1 if cfg.swizzle != 1 else 2)
    with sweep_backward.fixed_config(other):
        ops_common.graph_op(g.build, "bfloat16", "auto", *g.args, major=g.major)
    assert made == [cfg, other]   # another config: its own op
