"""The benchmark entry point's plan (--dry-run needs no GPU): cases, shape presets, configs."""
from __future__ import annotations

import json

import pytest

from benchmarks import bench_graphs, common


def test_dry_run_lists_every_case_shape_and_variant(capsys):
    assert bench_graphs.main(["--dry-run", "--cases", "design,swiglu", "--shapes", "256,512,128", "llama",
                              "--configs", "candidates"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 * (1 + len(bench_graphs.SHAPES["llama"]))
    assert lines[0].startswith("design [") and "256x512x128" in lines[0]
    for line in lines:
        assert line.count("coda_") == len(bench_graphs.tuning.CANDIDATES)
        assert "cublas_gemm" in line and "torch_compile" in line and "eager" in line


def test_auto_is_the_default_variant(capsys):
    assert bench_graphs.main(["--dry-run", "--cases", "identity", "--shapes", "256,512,128"]) == 0
    assert "coda_auto" in capsys.readouterr().out


def test_unknown_case_is_an_error():
    with pytest.raises(SystemExit):
        bench_graphs.main(["--dry-run", "--cases", "nope"])


def test_prebuild_items_cover_the_default_cases_and_their_plain_twins():
    items = bench_graphs.build_items()
    cases = len(bench_graphs.DEFAULT_CASES)
    assert cases == len(bench_graphs.graphs.CASES)
    assert all(cfg == "auto" for _, _, cfg in items[:cases])
    identity = bench_graphs.graphs.CASES["identity"][0]().build().digest()
    twins = items[cases:]
    assert twins and all(g.build().digest() == identity and cfg != "auto" for g, _, cfg in twins)
    # every config "auto" may pick for a fused case has its plain twin
    picked = {c.tag for name in bench_graphs.DEFAULT_CASES if name != "identity"
              for c in bench_graphs.concrete_configs(bench_graphs.graphs.CASES[name][0](), ["auto"])}
    assert {cfg.tag for _, _, cfg in twins} == picked


def test_every_case_has_a_goal_and_builds():
    for name, (build, goal) in bench_graphs.graphs.CASES.items():
        assert 0.9 < goal <= 1.06, name
        bench_graphs.ce.emit_source(build(), "bfloat16", bench_graphs.tuning.LARGE)


def test_torch_compile_baseline_compiles_every_shape():
    """Regression: one torch.compile'd reference reused across shapes hit dynamo's recompile
    limit and ran eagerly for every later shape and graph; the baseline is now compiled per
    shape (dynamo reset, static shapes). The limit is lowered with dynamo's own config.patch
    (monkeypatching the config module hid the setting from every later test)."""
    import torch

    with torch._dynamo.config.patch(recompile_limit=2):
        _compile_every_shape(torch)


def _compile_every_shape(torch):
    compiled_graphs = []

    def counting_backend(gm, example_inputs):
        compiled_graphs.append([tuple(t.shape) for t in example_inputs if isinstance(t, torch.Tensor)])
        return gm.forward

    def reference(a, b):
        return torch.nn.functional.silu(a @ b.t()) * 2.0

    shapes = [(m, 8, 16) for m in range(3, 9)]
    for M, N, K in shapes:
        fn = common.compile_for_one_shape(reference, backend=counting_backend)
        a, b = torch.randn(M, K), torch.randn(N, K)
        for _ in range(2):
            torch.testing.assert_close(fn(a, b), reference(a, b))
    assert len(compiled_graphs) == len(shapes)  # one static graph per shape, none fell back to eager
    assert all((M, K) in g for g, (M, _, K) in zip(compiled_graphs, shapes))


def _part(cases, commit="abc", reps=30):
    env = {"gpu": "NVIDIA H100 80GB HBM3", "commit": commit, "torch": "2.11.0+cu130"}
    results = {c: {"graph": c, "goal_ratio": 1.02, "shapes": {"128x256x64": {
        "variants": {v: {"median_ratio_to_cublas": 1.0, "median_ms": 1.0} for v in
                     ("cublas_gemm", "coda_auto", "torch_compile", "eager")},
        "coda_ratio": 1.0, "meets_goal": True, "auto_config": "x"}}} for c in cases}
    return {"env": env, "reps": reps, "max_autotune": False, "results": results}


def test_merge_combines_runs_split_by_case(tmp_path, monkeypatch, capsys):
    import json

    monkeypatch.setattr(bench_graphs, "plot", lambda *a, **k: None)
    a, b, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "all.json"
    a.write_text(json.dumps(_part(["identity", "swiglu"])))
    b.write_text(json.dumps(_part(["design"])))
    assert bench_graphs.main(["--merge", str(a), str(b), "--out", str(out)]) == 0
    merged = json.loads(out.read_text())
    assert list(merged["results"]) == ["identity", "swiglu", "design"]
    assert [p["cases"] for p in merged["env"]["parts"]] == [["identity", "swiglu"], ["design"]]
    assert "design" in capsys.readouterr().out


@pytest.mark.parametrize("other", [_part(["design"], commit="def"), _part(["design"], reps=5), _part(["identity"])])
def test_merge_refuses_parts_that_do_not_belong_together(tmp_path, monkeypatch, other):
    import json

    monkeypatch.setattr(bench_graphs, "plot", lambda *a, **k: None)
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_part(["identity"])))
    b.write_text(json.dumps(other))
    with pytest.raises(SystemExit):
        bench_graphs.main(["--merge", str(a), str(b), "--out", str(tmp_path / "x.json")])


def test_training_benchmark_plans_its_kernels_and_reports_goals():
    """bench_llama_training: every kernel the coda variants launch emits (no nvcc), and the goal lines
    read a results row (no GPU)."""
    import coda_ext as ce
    from benchmarks import bench_llama_training as blt
    from benchmarks import norm_backward_configs

    items = blt.build_items() + norm_backward_configs.build_items()
    assert len(items) >= 10
    for graph, dtype, config in items:
        ce.kernel_source(graph, dtype, config)
    variant = {"step_ms": 30.0, "non_attention_ms": 19.0, "non_attention_over_floor": 1.24, "peak_gb": 3.8,
               "peak_without_grads_gb": 3.5}
    row = {"case": "layer-1b", "variants": {"coda": variant, "torch.compile": dict(variant, step_ms=28.0)},
           "coda_breakdown": [{"kernel": "linear_dx (o.dx)", "ms": 0.36, "gemm_ms": 0.39, "ratio": 0.92},
                              {"kernel": "qkv_rope_backward (-)", "ms": 0.99, "gemm_ms": None, "ratio": None}]}
    lm = {"case": "lm-head", "variants": {"coda": {"step_ms": 50.0, "over_floor": 1.27, "peak_gb": 1.6,
                                                   "peak_without_grads_gb": -0.1},
                                          "torch.compile": {"step_ms": 38.6, "over_floor": 1.0, "peak_gb": 3.2,
                                                            "peak_without_grads_gb": 2.1}}}
    lines = blt.goals([row, lm])
    assert "1.240x its GEMM floor" in lines[0] and "missed" in lines[0]
    assert "0.920x its cuBLAS GEMM" in lines[1] and "no GEMM" in lines[2]
    assert "missed or unmeasured" in lines[3]     # a negative peak is not a measurement


def test_speed_of_light_is_the_model_bound_over_the_measured_time(tmp_path, capsys):
    from coda_ext.analysis import io_model

    ms = {"cublas_gemm": 1.0, "coda_auto": 1.1, "coda_ping_64x128x64_c1x1": 1.3, "torch_compile": 1.2, "eager": 2.0}
    entry = {"variants": {v: {"median_ms": t, "median_ratio_to_cublas": t} for v, t in ms.items()},
             "auto_config": "coop_128x256x64_c2x1_s4", "coda_ratio": 1.1, "meets_goal": False}
    data = {"env": {}, "reps": 1, "max_autotune": False,
            "results": {"swiglu": {"goal_ratio": 1.02, "shapes": {"4096x6144x4096": entry}}}}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    assert bench_graphs.main(["--annotate", str(path)]) == 0
    sol = json.loads(path.read_text())["results"]["swiglu"]["shapes"]["4096x6144x4096"]["speed_of_light"]
    assert set(sol) == set(ms)
    shape, swiglu = (4096, 6144, 4096), bench_graphs.graphs.CASES["swiglu"][0]
    coop = io_model(swiglu(), "bfloat16", shape, bench_graphs.tuning.LARGE)
    ping = io_model(swiglu(), "bfloat16", shape, bench_graphs.tuning.SKINNY)
    assert coop.config.tag == "coop_128x256x64_c2x1_s4" and ping.config.tag == "ping_64x128x64_c1x1"
    gpu = coop.gpu
    assert sol["coda_auto"]["bound_ms"] == pytest.approx(coop.variants["fused"].seconds(gpu) * 1e3)
    assert sol["coda_ping_64x128x64_c1x1"]["bound_ms"] == pytest.approx(ping.variants["fused"].seconds(gpu) * 1e3)
    auto = io_model(swiglu(), "bfloat16", shape, "auto")
    gemm = io_model(bench_graphs.graphs.CASES["identity"][0](), "bfloat16", shape, "auto")
    assert sol["torch_compile"]["bound_ms"] == pytest.approx(auto.variants["compile"].seconds(gpu) * 1e3)
    assert sol["eager"]["bound_ms"] == pytest.approx(auto.variants["unfused"].seconds(gpu) * 1e3)
    assert sol["cublas_gemm"]["bound_ms"] == pytest.approx(gemm.variants["fused"].seconds(gpu) * 1e3)
    for v, t in ms.items():
        assert sol[v]["sol"] == pytest.approx(sol[v]["bound_ms"] / t)
    assert "SoL" in capsys.readouterr().out


def test_bench_elementwise_cli_refuses_unknown_shapes(capsys):
    from benchmarks import bench_elementwise

    with pytest.raises(SystemExit):
        bench_elementwise.main(["--shapes", "3B"])
    assert "invalid choice" in capsys.readouterr().err
    assert set(bench_elementwise.SHAPES) == {"1B", "8B"}


def test_compile_time_reads_nvcc_phase_csv(tmp_path):
    from benchmarks import compile_time

    path = tmp_path / "t.csv"
    path.write_text("source file name , phase name , phase input files , phase output file , arch , tool, "
                    "metric , unit\n"
                    "/k.cu , cicc , a , b , compute_90a , nvcc , 31121.8 , ms\n"
                    "/k.cu , gcc (compiling) , a , b ,  , nvcc , 6914.0 , ms\n"
                    "/k.cu , gcc (compiling) , a , b ,  , nvcc , 13.7 , ms\n")
    assert compile_time.phases(path) == {"cicc": 31121.8, "gcc (compiling)": pytest.approx(6927.7)}


def test_compile_time_baseline_tree_replaces_only_the_project_include_dirs(tmp_path):
    from benchmarks import compile_time
    from coda_ext.jit import nvcc
    from coda_ext.jit.paths import csrc_dir

    cmd = nvcc.build_command("k.cu", "k.so")
    other = compile_time.with_csrc(cmd, tmp_path / "csrc")
    assert f"-I{tmp_path / 'csrc'}" in other and f"-I{tmp_path / 'csrc' / 'include'}" in other
    assert f"-I{csrc_dir()}" not in other
    assert [a for a in other if not a.startswith("-I")] == [a for a in cmd if not a.startswith("-I")]
    assert len(other) == len(cmd) and compile_time.with_csrc(cmd, None) == cmd


def test_lm_head_bench_prebuild_items_and_plot(tmp_path):
    """bench_lm_head's kernels (the training path's chunks and the recompute path, both heads) and its plot from
    a results document (no GPU)."""
    from benchmarks import bench_lm_head

    items = bench_lm_head.build_items(16384)
    names = {g.name if hasattr(g, "name") else type(g).__name__ for g, _, _ in items}
    assert len(items) >= 2 * 3 and names
    doc = {"env": {"gpu": "test"}, "shapes": {n: {"M": 16384, "V": V, "d": d, "variants": {
        v: {"median_ratio_to_cublas_3": 1.0 + 0.1 * k} for k, v in enumerate(bench_lm_head.VARIANTS)}}
        for n, (V, d) in bench_lm_head.SHAPES.items()}}
    bench_lm_head.plot(doc, tmp_path / "lm_head.png")
    assert (tmp_path / "lm_head.png").stat().st_size > 10_000
    # extra chunk budgets: the training path's GEMMs at their chunk rows too, and a bar of their own in the plot
    more = bench_lm_head.build_items(16384, (512,))
    assert len(more) > len(items)
    doc["shapes"]["llama-1b"]["variants"]["coda_chunk512"] = {"median_ratio_to_cublas_3": 1.1}
    bench_lm_head.plot(doc, tmp_path / "lm_head2.png")
    assert (tmp_path / "lm_head2.png").stat().st_size > 10_000


def test_lm_head_bench_chunk_budget_and_dw_backend_are_set_for_the_call_only(monkeypatch):
    """coda_chunk<MB> / coda_dw_<backend>: the call gets the chunk budget (MB MiB) as its chunk_bytes and runs under the
    weight-gradient backend asked for, restored after it, also when the call raises."""
    from benchmarks import bench_lm_head
    from coda_ext import ops
    from coda_ext.ops import lm_head_ce

    seen = []

    def fake_loss(*args, chunk_bytes=None):
        seen.append((chunk_bytes, lm_head_ce._dw["backend"]))
        raise RuntimeError("stop")

    monkeypatch.setattr(ops, "lm_head_cross_entropy_loss", fake_loss)
    for mb, dw in ((512, "cublas"), (None, "coda_f32"), (2048, None)):
        with pytest.raises(RuntimeError, match="stop"):
            bench_lm_head._with_chunk_budget(mb, dw)(None, None, None)
    assert seen == [(512 << 20, "cublas"), (None, "coda_f32"), (2048 << 20, "coda")]   # None: the default's
    assert lm_head_ce._dw["backend"] == "coda"
    more = bench_lm_head.build_items(16384, (), ("coda_f32",))   # the fp32 accumulator's kernels too
    assert len(more) > len(bench_lm_head.build_items(16384))


def test_ptxas_usage_reads_the_gemm_entry_of_ptxas_output():
    """The last entry function's line is the GEMM's (the finalize kernel's comes first)."""
    from benchmarks import ptxas_usage

    out = """ptxas info    : Compiling entry function 'finalize' for 'sm_90a'
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 38 registers, used 1 barriers, 4224 bytes smem
ptxas info    : Compiling entry function 'gemm' for 'sm_90a'
    136 bytes stack frame, 168 bytes spill stores, 180 bytes spill loads
ptxas info    : Used 168 registers, used 2 barriers, 136 bytes cumulative stack size"""
    assert ptxas_usage.parse(out) == {"registers": 168, "spill_stores": 168, "spill_loads": 180, "stack": 136}
    with pytest.raises(ValueError, match="no 'Used N registers'"):
        ptxas_usage.parse("nothing here")
    assert len(ptxas_usage.cases()) == 8


def test_sweep_configs_takes_the_lm_head_logits_graph(capsys):
    """sweep_configs sweeps the training LM head's logits GEMM beside the goal graphs (its configs at its chunk
    shapes): the case builds, and a dry run lists the selected configs."""
    from benchmarks import sweep_configs

    graph = sweep_configs.CASES["lm_head_train"][0]().build()
    names = {dict(n.attrs).get("name") for n in graph.nodes}
    assert {"e", "sumexp"} <= names
    assert sweep_configs.main(["--cases", "lm_head_train", "--shapes", "2048,128256,2048", "--only",
                               "ping_128x192x64_c2x1", "--swizzles", "8", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "['lm_head_train'] ping_128x192x64_c2x1_s8" in out and "(2048, 128256, 2048)" in out


def test_sweep_configs_times_other_epilogue_subtiles_and_store_stages(capsys):
    """--epilogues: each selected config as it is, in 64 x 64 subtiles, with 3 store stages and both; a subtile the
    schedule refuses is left out with the reason."""
    from benchmarks import sweep_configs

    assert sweep_configs.main(["--cases", "swiglu", "--shapes", "16384,16384,2048", "--only", "ping_128x192x64_c2x1",
                               "--swizzles", "8", "--epilogues", "auto,64x64,d3,64x64/d3,128x64", "--dry-run"]) == 0
    out = capsys.readouterr()
    tags = [line.split("] ")[1] for line in out.out.splitlines() if line.startswith("['swiglu']")]
    assert tags == ["ping_128x192x64_c2x1_s8", "ping_128x192x64_c2x1_e64x64_s8", "ping_128x192x64_c2x1_s8_ec4d3",
                    "ping_128x192x64_c2x1_e64x64_s8_ec4d3"]
    assert "128x64: left out" in out.err and "subtiles of 64 rows" in out.err


def test_sweep_configs_takes_the_residual_norm_and_qkv_rope_graphs(capsys):
    """The forward ops that miss at the 1B shapes sweep beside the goal graphs, the overlap schedule among the
    configs."""
    from benchmarks import sweep_configs

    kinds = {n.kind for n in sweep_configs.CASES["qkv_rope"][0]().build().nodes}
    assert "rotate_pairs" in kinds
    assert any(n.kind == "row_reduce" for n in sweep_configs.CASES["residual_norm"][0]().build().nodes)
    assert sweep_configs.main(["--cases", "residual_norm,qkv_rope", "--shapes", "16384,3072,2048", "--only",
                               "ppo_128x128x64_c1x1,ping_128x192x64_c1x1", "--swizzles", "4", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "['residual_norm', 'qkv_rope'] ppo_128x128x64_c1x1_s4" in out
    assert "['residual_norm', 'qkv_rope'] ping_128x192x64_c1x1_s4" in out


def test_bench_finish_builds_each_row_both_ways(capsys):
    """bench_finish: every row's heuristic config, with the reductions finished by a launch and in the kernel (two
    kernels: finalize is compiled in); the dry run names them."""
    from benchmarks import bench_finish

    items = bench_finish.build_items([128])
    assert len(items) == 2 * len(bench_finish.ROWS)
    assert {cfg.finalize for _, _, cfg in items} == {"launch", "kernel"}
    assert all(any(n.kind in ("row_reduce", "col_reduce") for n in g.build().nodes) for g, _, _ in items)
    assert bench_finish.main(["--ms", "128", "--dry-run"]) == 0
    assert "residual_norm_o 1B 128x2048x2048: ping_64x128x64_c1x1" in capsys.readouterr().out


def test_sustained_reaches_every_case_and_names_its_own_results(monkeypatch, tmp_path):
    """--sustained times each case at the GPU's power limit (bench_case(sustained=True)) and writes
    graphs_sustained_<gpu>.json, not the one-call-at-a-time results."""
    seen = []
    monkeypatch.setattr(common, "gpu_info", lambda: {"gpu": "NVIDIA H200", "nvidia_smi": None})
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    monkeypatch.setattr(bench_graphs, "bench_case",
                        lambda name, shapes, cfgs, reps, mat, cold, sustained: seen.append((name, sustained)) or {})
    monkeypatch.setattr(bench_graphs, "annotate", lambda results, gpu: None)
    monkeypatch.setattr(bench_graphs, "plot", lambda results, path, gpu: None)
    monkeypatch.setattr(bench_graphs, "print_table", lambda results: None)
    assert bench_graphs.main(["--sustained", "--cases", "identity,swiglu", "--shapes", "256,512,128"]) == 0
    assert seen == [("identity", True), ("swiglu", True)]
    (out,) = tmp_path.glob("graphs_sustained_*.json")
    assert '"timing": "sustained"' in out.read_text()


def test_epilogue_timeline_forward_items_are_the_ready_ops_in_the_heuristics_config(monkeypatch):
    """epilogue_timeline --forward: residual_norm_o, qkv_rope and qkv_rope_qknorm per model, their graphs and shapes
    bench_fused_ops'; per row the op and its plain twin with the timeline, the op without it, each in the config its
    kernel is emitted in (QK-norm's epilogue tile fitted). The prebuild asks for them with CODA_TIMELINE_ITEMS."""
    import coda_ext as ce
    from benchmarks import bench_fused_ops
    from benchmarks import epilogue_timeline as tl
    from coda_ext import graphs

    rows = tl.rows(forward=True)
    assert [(g.op, g.model) for g in rows] == [(op, m) for m in tl.MODELS for op in tl.FORWARD_OPS]
    assert all((g.N, g.K) == bench_fused_ops.shapes(g.model)[g.op] and g.M == 16384 for g in rows)
    items = tl.build_items(forward=True)
    assert len(items) == 3 * len(rows)
    identity = graphs.identity().build().digest()
    for g, (fused, twin, bare) in zip(rows, zip(items[0::3], items[1::3], items[2::3])):
        want = bench_fused_ops.graph_of(g.op, g.model).build().digest()
        assert fused[0].build().digest() == bare[0].build().digest() == want
        assert twin[0].build().digest() == identity
        assert fused[2].timeline and twin[2] == fused[2] and not bare[2].timeline
        for graph, dtype, cfg in (fused, twin, bare):
            assert ce.kernel_source(graph, dtype, cfg).config == cfg   # emitted as listed, no nvcc
    assert {c.epilogue_tile for g, (_, _, c) in zip(rows, items[0::3]) if g.op == "qkv_rope_qknorm"} == {(64, 128),
                                                                                                        (64, 64)}
    monkeypatch.setenv("CODA_TIMELINE_ITEMS", "forward")
    assert [(g.build().digest(), c) for g, _, c in tl.build_items()] == [(g.build().digest(), c) for g, _, c in items]
    monkeypatch.setenv("CODA_TIMELINE_ITEMS", "forward,ablate")
    ablated = tl.build_items()
    variants = sum(len(tl.forward_ablation_graphs(g.op, g.model)) for g in rows)
    assert variants == 2 * (2 + 2 + 3) and len(ablated) == len(items) + variants
    assert sum(not c.timeline for _, _, c in ablated) == len(rows)
    for graph, dtype, cfg in ablated:
        assert ce.kernel_source(graph, dtype, cfg).config == cfg
    monkeypatch.setenv("CODA_TIMELINE_ITEMS", "forward,nope")
    with pytest.raises(SystemExit):
        tl.build_items()


@pytest.mark.parametrize("op", ["residual_norm_o", "qkv_rope", "qkv_rope_qknorm"])
def test_epilogue_timeline_forward_ablations_take_one_part_away_and_run_on_random_inputs(op):
    """Each forward ablation variant builds, lacks the part it is named for, and (with the op's own graph) runs in the
    interpreter on the inputs the benchmark draws (rand.op_inputs) to finite outputs: the RoPE's positions and
    frequencies, QK-norm's eps and weights included."""
    import torch

    import coda_ext as ce
    from benchmarks import epilogue_timeline as tl
    from coda_ext.runtime.interface import GraphOp
    from tests.helpers import rand

    class Interface(GraphOp):   # an op's names and shapes, without a kernel library
        def __init__(self, ks):
            self._init_interface(ks.lowered, ks.dtype, f"test-bench-cli|{ks.graph.digest()}|{ks.config.tag}")

    (g,) = tl.rows(("1B",), 16, [op], forward=True)
    variants = tl.forward_ablation_graphs(op, "1B")
    kinds = {name: {n.kind for n in graph.build().nodes} for name, graph in variants.items()}
    vectors = {name: {n.name for n in graph.build().nodes if n.kind.endswith("_vector")}
               for name, graph in variants.items()}
    if op == "residual_norm_o":
        assert list(variants) == ["residual only", "reduction only"]
        assert "row_reduce" not in kinds["residual only"] and "tile" in kinds["residual only"]
        assert "row_reduce" in kinds["reduction only"] and "tile" not in kinds["reduction only"]
    else:
        qk = op == "qkv_rope_qknorm"
        assert list(variants) == ["z only", "rope, constant vectors"] + (["qknorm, no rope"] if qk else [])
        assert not kinds["z only"] & {"rotate_pairs", "segment_reduce"} and vectors["z only"] == {"rstd"}
        assert "rotate_pairs" in kinds["rope, constant vectors"]
        assert vectors["rope, constant vectors"] == {"rstd"} | ({"norm_a", "norm_b"} if qk else set())
        if qk:
            assert "segment_reduce" in kinds["qknorm, no rope"] and "rotate_pairs" not in kinds["qknorm, no rope"]
    cfg = tl.config(g)
    for name, graph in {"fused": g.graph(), **variants}.items():
        ks = ce.kernel_source(graph, "bfloat16", cfg)
        assert ks.config == cfg, name
        iface = Interface(ks)
        A, W, inputs = rand.op_inputs(iface, g.M, g.N, 64, torch.Generator().manual_seed(0))
        outputs = ce.interpret(graph, A, W, **inputs)
        assert set(inputs) == set(iface.input_names) and set(outputs) == set(iface.output_names), name
        for out_name, v in outputs.items():
            assert torch.isfinite(v.float()).all(), (name, out_name)


def test_epilogue_timeline_forward_cli_refuses_backward_ops():
    from benchmarks import epilogue_timeline as tl

    with pytest.raises(SystemExit):
        tl.main(["--forward", "--ops", "swiglu_backward_linear"])
    with pytest.raises(SystemExit):
        tl.main(["--ops", "qkv_rope"])
