"""bench_hf_training.py end to end on the CPU (tiny configs, coda's references, aot_eager for
torch.compile): the results JSON's shape and values, the per-component breakdown, the plot, the cold
first step's child entry point, the model FLOPs, and Liger's patches confined to its own variant."""
from __future__ import annotations

import json
import sys
import types

import pytest
import torch

transformers = pytest.importorskip("transformers")

from benchmarks import bench_hf_training as bench  # noqa: E402  (after the importorskip)

LINEAR_PARTS = {f"{lin}.{part}" for lin in ("qkv", "o", "gate_up", "down") for part in ("fwd", "dx", "dw")}
STEPS = 3


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    torch._dynamo.reset()
    out = tmp_path_factory.mktemp("hf") / "hf_training.json"
    assert bench.main(["--device", "cpu", "--tiny", "--steps", str(STEPS), "--rounds", "2", "--warmup", "1",
                       "--layers", "1", "--compile-backend", "aot_eager", "--out", str(out),
                       "--trace", str(out.parent / "traces")]) == 0
    torch._dynamo.reset()
    return out


def test_results_json_has_every_model_and_variant(results):
    doc = json.loads(results.read_text())
    assert doc["gpu"] == "cpu" and set(doc["models"]) == {"llama-1b", "llama-8b"}
    liger = bench.skip_reason("liger") is None
    for entry in doc["models"].values():
        want = {"eager", "compile", "coda", "coda_compile"} | ({"liger"} if liger else set())
        assert set(entry["variants"]) == want
        assert liger or "liger_kernel" in entry["skipped"]["liger"]
        assert entry["tokens"] == 64 and entry["config"]["num_hidden_layers"] == 1
        eager = entry["variants"]["eager"]["loss"]
        # eager's second curve (its run-to-run spread, the loss goal's floor): a CPU repeats itself exactly
        assert entry["variants"]["eager"]["loss_repeat"] == eager and bench.eager_spread(entry) == 0
        for v, row in entry["variants"].items():
            assert {"step_ms", "peak_gb", "tokens_per_s", "mfu", "loss", "breakdown"} <= set(row)
            assert len(row["loss"]) == STEPS and row["step_ms"] > 0
            assert row["tokens_per_s"] == pytest.approx(64 / row["step_ms"] * 1e3)
            assert row["mfu"] is None and row["peak_gb"] is None   # no GPU: neither is measured
            # each phase of a step on its own (on a CPU the device's times are the host's)
            assert set(row["phases"]) == {"gpu", "host"} and row["phases"]["gpu"] == row["phases"]["host"]
            assert list(row["phases"]["host"]) == list(bench.PHASES) and min(row["phases"]["host"].values()) > 0
            # fp32 everywhere: every variant's curve is eager's to a few roundings
            assert row["loss"] == pytest.approx(eager, rel=1e-4), v
        for floor in (entry["floor"], entry["floor_sustained"]):   # each part alone, and back to back
            assert floor["step_ms"] == pytest.approx(floor["gemms_ms"] + floor["attention_ms"]
                                                     + floor["optimizer_ms"])
            assert set(floor["parts_ms"]) == {f"{lin}.{p}" for lin in ("qkv", "o", "gate_up", "down", "lm_head")
                                              for p in ("fwd", "dx", "dw")} | {"attention"}
            assert min(floor["parts_ms"].values()) > 0
    assert results.with_suffix(".png").stat().st_size > 10_000


def test_trace_writes_each_variants_profiled_step(results):
    import gzip

    doc = json.loads(results.read_text())
    for name, entry in doc["models"].items():
        for v, row in entry["variants"].items():
            path = results.parent / "traces" / row["trace"]
            assert row["trace"] == f"{name}_{v}.json.gz"
            assert json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]


def test_breakdown_names_every_gemm_of_a_layer(results):
    """Uncompiled variants: every linear's forward, dX and dW GEMM, attention forward and backward per
    layer, the LM head's GEMMs, the optimizer and the embedding; the parts add up to the total."""
    doc = json.loads(results.read_text())
    for entry in doc["models"].values():
        for v in ("eager", "coda"):
            b = entry["variants"][v]["breakdown"]
            assert LINEAR_PARTS | {"attention.fwd", "attention.bwd"} <= set(b["per_layer"]), (v, b["per_layer"])
            assert b["lm_head_loss"]["gemm"] > 0 and b["optimizer"] > 0 and b["embedding"] > 0
            parts = b["layers"] * sum(b["per_layer"].values()) + sum(b["lm_head_loss"].values()) + \
                b["optimizer"] + b["embedding"] + b["other"]
            assert parts == pytest.approx(b["total"], rel=1e-6)
        compiled = entry["variants"]["compile"]["breakdown"]   # no module scopes: by kind and shape
        assert LINEAR_PARTS <= set(compiled["per_layer"]), compiled["per_layer"]


def test_cold_child_prints_the_first_step(capsys):
    assert bench.main(["--cold-child", "--device", "cpu", "--models", "llama-8b", "--layers", "1"]) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["prebuild"] is False and row["cold_first_step_s"] == pytest.approx(row["apply_s"] + row["first_step_s"])
    args = bench.parse(["--device", "cpu", "--layers", "llama-8b=3", "--prebuild"])
    assert bench._argv_for_child(args) == ["--device", "cpu", "--batch", "2", "--seq", "32", "--lr", "0.0003",
                                           "--layers", "llama-8b=3", "--tiny", "--prebuild"]


def test_cold_only_adds_the_cold_step_to_the_earlier_entry(results, tmp_path, monkeypatch):
    """--cold-only keeps every model of the earlier run, variants included, and adds the child's entry."""
    out = tmp_path / "hf.json"
    out.write_text(results.read_text())
    child = {"cold_first_step_s": 3.0, "apply_s": 1.0, "first_step_s": 2.0, "prebuild": True, "cpus": 16}
    monkeypatch.setattr(bench, "run_cold", lambda name, argv: child)
    assert bench.main(["--device", "cpu", "--models", "llama-1b", "--cold-only", "--out", str(out)]) == 0
    before, after = json.loads(results.read_text()), json.loads(out.read_text())
    assert after["models"]["llama-1b"]["cold"] == child
    assert after["models"]["llama-1b"]["variants"] == before["models"]["llama-1b"]["variants"]
    assert after["models"]["llama-8b"] == before["models"]["llama-8b"]
    with pytest.raises(SystemExit, match="no earlier run"):
        bench.main(["--device", "cpu", "--models", "llama-1b", "--cold-only", "--out", str(tmp_path / "none.json")])


def test_step_flops_count_every_linear():
    """6 x tokens x the parameters of every 2-D weight but the embedding (the LM head counts even when
    tied), plus causal attention."""
    for name in bench.MODELS:
        cfg = bench.hf_config(name, None, tiny=False)
        with torch.device("meta"):
            model = transformers.LlamaForCausalLM(cfg)
        linear = sum(p.numel() for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n)
        if cfg.tie_word_embeddings:
            linear += model.lm_head.weight.numel()
        B, S = 8, 2048
        attention = cfg.num_hidden_layers * 3 * 2 * (2 * B * S * S * cfg.num_attention_heads * cfg.head_dim) / 2
        assert bench.step_flops(cfg, B, S) == 6 * B * S * linear + attention


def test_liger_patches_only_its_own_calls(monkeypatch):
    """Liger patches transformers' modeling_llama globals (RoPE) for every model: the variant applies them
    only around its own calls, on a copy that shares the model's parameters."""
    from transformers.models.llama import modeling_llama

    calls = []

    def apply_liger_kernel_to_llama(model=None, **kw):
        real = modeling_llama.apply_rotary_pos_emb

        def counted(*a, **k):
            calls.append(1)
            return real(*a, **k)
        modeling_llama.apply_rotary_pos_emb = counted

    fake = types.ModuleType("liger_kernel.transformers")
    fake.apply_liger_kernel_to_llama = apply_liger_kernel_to_llama
    monkeypatch.setitem(sys.modules, "liger_kernel", types.ModuleType("liger_kernel"))
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", fake)
    original = modeling_llama.apply_rotary_pos_emb
    cfg = bench.hf_config("llama-1b", 2, tiny=True)
    model = bench.base_model(cfg, "cpu", torch.float32)
    call, twin = bench.liger_variant(model)
    assert modeling_llama.apply_rotary_pos_emb is original
    assert all(a is b for a, b in zip(twin.parameters(), model.parameters()))
    ids = torch.randint(0, cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    want = model(input_ids=ids, labels=ids).loss
    assert calls == []
    got = call(input_ids=ids, labels=ids).loss
    assert len(calls) == 2 and modeling_llama.apply_rotary_pos_emb is original   # once per layer, then undone
    torch.testing.assert_close(got, want)


def test_runs_of_one_model_merge_into_the_results(tmp_path, monkeypatch):
    """One model per run (a GPU call's time limit): a later run keeps the other models of the same GPU;
    --fresh starts over."""
    monkeypatch.setattr(bench, "run_model", lambda name, args, device, gpu: {"ran": name})
    monkeypatch.setattr(bench, "report", lambda name, entry: [])
    monkeypatch.setattr(bench, "plot", lambda doc, path: None)
    out = tmp_path / "r.json"
    for models in (["llama-1b"], ["llama-8b"], ["llama-1b"]):
        assert bench.main(["--device", "cpu", "--models", *models, "--out", str(out)]) == 0
    assert json.loads(out.read_text())["models"] == {"llama-8b": {"ran": "llama-8b"}, "llama-1b": {"ran": "llama-1b"}}
    assert bench.main(["--device", "cpu", "--models", "llama-8b", "--out", str(out), "--fresh"]) == 0
    assert list(json.loads(out.read_text())["models"]) == ["llama-8b"]


def test_breakdown_counts_kernels_not_the_ranges_gpu_annotations():
    """A record_function range also appears on the GPU's timeline (a user annotation): counting it beside its
    kernels doubled 'other' and 'total' (regression)."""
    from torch.autograd import DeviceType

    def ev(start_ms, ms, annotation):
        return types.SimpleNamespace(device_type=DeviceType.CUDA, is_user_annotation=annotation,
                                     time_range=types.SimpleNamespace(start=start_ms * 1e3, end=(start_ms + ms) * 1e3,
                                                                      elapsed_us=lambda: ms * 1e3))

    # an annotation over both kernels; kernels at 0-2 ms and 4-5 ms, and one inside the first (1-1.5 ms)
    prof = types.SimpleNamespace(events=lambda: [ev(0.0, 5.0, True), ev(0.0, 2.0, False), ev(4.0, 1.0, False),
                                                 ev(1.0, 0.5, False)])
    out = bench.breakdown(prof, bench.hf_config("llama-1b", 2, tiny=True), 64, "cuda")
    assert out["other"] == pytest.approx(3.5) and out["total"] == pytest.approx(3.5)
    assert out["gpu_busy_ms"] == pytest.approx(3.0) and out["gpu_idle_ms"] == pytest.approx(2.0)


def test_coda_ops_name_their_linear_and_part():
    """The breakdown names a coda op's GEMM by its weight and the op: the dSwiGLU backward that writes dz over z
    (coda_ext::swiglu_backward_linear_) is the down projection's dX GEMM as the other form is (it was counted as
    an unnamed backward GEMM)."""
    import types

    from benchmarks import bench_hf_training as b

    cfg = types.SimpleNamespace(hidden_size=64, intermediate_size=160, head_dim=16, num_attention_heads=4,
                                num_key_value_heads=2, vocab_size=256)
    table = b.weight_table(cfg)
    for name in ("coda_ext::swiglu_backward_linear", "coda_ext::swiglu_backward_linear_"):
        op = types.SimpleNamespace(name=name, input_shapes=[[37, 64], [64, 160], [37, 320]])
        assert b.coda_linear([op], table) == "down.dx"
    op = types.SimpleNamespace(name="coda_ext::weight_grad", input_shapes=[[37, 64], [37, 160]])
    assert b.coda_linear([op], table) == "down.dw"


def test_rope_backward_kernel_counts_as_element_wise():
    """The RoPE backward's Triton kernel (the custom op coda_ext::rope_backward_rows) and its table op are
    element-wise work of the layer, not a GEMM (every other coda_ext:: op launches one)."""
    import types

    from benchmarks import bench_hf_training as b

    for name in ("coda_ext::rope_backward_rows", "coda_ext::rope_cos_sin", "coda_ext::qkv_rope_backward"):
        assert b.kind_of("rope_backward_kernel", [types.SimpleNamespace(name=name)]) == "elementwise"
    assert b.kind_of("device_kernel", [types.SimpleNamespace(name="coda_ext::weight_grad")]) == "gemm"


def test_kernel_dw_variant_is_coda_with_its_own_weight_gradient_kernels():
    """coda_kernel_dw (named, not a default variant) shares coda's model and optimizer and runs its steps with
    models.weight_grad_backend("coda"): the A/B of the layers' cuBLAS weight gradients."""
    from coda_ext.models import functions

    assert "coda_kernel_dw" not in bench.parse([]).variants
    args = bench.parse(["--device", "cpu", "--tiny", "--layers", "1", "--variants", "coda", "coda_kernel_dw"])
    cfg = bench.hf_config("llama-1b", 1, True)
    variants, skipped, _ = bench.build_variants(cfg, args, "cpu", torch.float32)
    assert set(variants) == {"coda", "coda_kernel_dw"} and not skipped
    a, b = variants["coda"], variants["coda_kernel_dw"]
    assert a["module"] is b["module"] and a["opt"] is b["opt"] and "context" not in a
    with b["context"]():
        assert functions._weight_grad["backend"] == "coda"
    assert functions._weight_grad["backend"] == "cublas"
