"""bench_distributed.py as torchrun launches it, on CPUs: two processes (gloo), tiny configs, coda's
references, aot_eager for torch.compile. The results JSON's shape and values (every variant's loss
curve is the one a single process computes on the same global batch), the plot, and the merging of
runs at several GPU counts with the goals read from them."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

from benchmarks import bench_distributed as bench  # noqa: E402  (after the importorskip)
from benchmarks import bench_hf_training as hf  # noqa: E402
from benchmarks import common  # noqa: E402

pytestmark = pytest.mark.slow

STEPS, WORLD = 3, 2


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist") / "distributed.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD}", "-m",
           "benchmarks.bench_distributed", "--device", "cpu", "--backend", "gloo", "--models", "llama-8b",
           "--layers", "1", "--steps", str(STEPS), "--rounds", "2", "--warmup", "1", "--variants", "eager",
           "compile", "liger", "coda", "--compile-backend", "aot_eager", "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=common.ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return out, proc.stdout


def one_process_losses(entry) -> list[float]:
    """Eager on one process, the whole global batch of every step: the curve the ranks must give."""
    from coda_ext.tools.train_demo import make_batches

    cfg = hf.hf_config("llama-8b", 1, tiny=True)
    model = hf.base_model(cfg, "cpu", torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    return [float(bench.step(model, opt, ids))
            for ids in make_batches(STEPS, entry["global_batch"], entry["seq"], cfg.vocab_size, 1)]


def test_results_json_and_plot(results):
    path, stdout = results
    doc = json.loads(path.read_text())
    assert doc["gpu"] == "cpu" and list(doc["runs"]) == [str(WORLD)]
    run = doc["runs"][str(WORLD)]
    assert run["world_size"] == WORLD and run["backend"] == "gloo" and list(run["models"]) == ["llama-8b"]
    entry = run["models"]["llama-8b"]
    assert entry["config"]["num_hidden_layers"] == 1 and entry["global_batch"] == 2 * WORLD
    assert entry["tokens_per_gpu"] == 2 * 32 and entry["param_dtype"] == "float32"
    liger = hf.skip_reason("liger") is None
    assert set(entry["variants"]) == {"eager", "compile", "coda"} | ({"liger"} if liger else set())
    assert liger or "liger_kernel" in entry["skipped"]["liger"]
    want = one_process_losses(entry)
    for v, row in entry["variants"].items():
        assert row["loss"] == pytest.approx(want, rel=1e-4), v   # fp32: the same curve as one process
        assert len(row["step_ms_rounds"]) == 2 and row["step_ms"] > 0
        assert row["tokens_per_s_per_gpu"] == pytest.approx(entry["tokens_per_gpu"] / row["step_ms"] * 1e3)
        assert row["mfu"] is None and row["peak_gb_per_gpu"] is None   # no GPU: neither is measured
    assert "llama-8b: 1 layers on 2 x cpu" in stdout
    assert path.with_suffix(".png").stat().st_size > 10_000


def row(tps, peak, loss):
    return {"tokens_per_s_per_gpu": tps, "peak_gb_per_gpu": peak, "loss": loss, "step_ms": 1.0, "mfu": None}


def entry(global_batch, **variants):
    return {"global_batch": global_batch, "variants": variants}


def test_runs_merge_by_gpu_count_and_goals_compare_them():
    one = {"world_size": 1, "models": {"llama-1b": entry(16, coda=row(1000.0, 30.0, [2.0, 1.0]))}}
    doc = bench.merge({}, {"gpu": "H100", "runs": {}}, 1, one)
    two = {"world_size": 2, "models": {"llama-1b": entry(16, coda=row(920.0, 20.0, [2.0, 1.004]),
                                                         liger=row(800.0, 21.0, [2.0, 1.0]),
                                                         compile=row(950.0, 19.0, [2.0, 1.0]))}}
    doc = bench.merge(doc, {"gpu": "H100", "runs": {}}, 2, two)
    assert sorted(doc["runs"]) == ["1", "2"]
    assert bench.merge(doc, {"gpu": "H200", "runs": {}}, 2, two)["runs"].keys() == {"2"}   # another GPU: apart
    lines = "\n".join(bench.goals(doc, 2, "llama-1b"))
    assert ">= 1.10x liger's: 1.150x, met" in lines
    assert ">= 1.00x compile's: 0.968x, missed" in lines
    assert "scaling efficiency (tokens/s per GPU vs 1 GPU) >= 90%: 92.0%, met" in lines
    assert "peak memory per GPU <= Liger's: 20.00 vs 21.00 GB, met" in lines
    assert "largest 0.400% over 2 steps, met" in lines


def test_results_file_is_named_by_gpu():
    assert bench.gpu_tag("NVIDIA H100 80GB HBM3") == "h100"
    assert bench.gpu_tag("NVIDIA H200") == "h200"
    assert bench.gpu_tag(None) == "cpu"
