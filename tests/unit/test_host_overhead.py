"""benchmarks.host_overhead on a tiny model: every fused kernel's host time a call, and nothing patched after."""
from __future__ import annotations

import json

import torch


def test_host_overhead_measures_every_fused_kernel_and_restores_the_launch(tmp_path):
    from benchmarks import host_overhead
    from coda_ext.runtime import checks, tuned

    before = (tuned.TunedOp.op_for, tuned.TunedOp.choose, checks.require_gpu, torch.cuda.current_device)
    out = tmp_path / "host.json"
    assert host_overhead.main(["--tiny", "--models", "mlp", "--calls", "3", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    rows = doc["models"]["mlp"]["kernels"]
    assert rows and all(r["host_us"] > 0 and r["launches"] >= 1 for r in rows)
    assert doc["models"]["mlp"]["step_ms"] > 0
    assert (tuned.TunedOp.op_for, tuned.TunedOp.choose, checks.require_gpu, torch.cuda.current_device) == before
    assert not torch.zeros(1).is_cuda
