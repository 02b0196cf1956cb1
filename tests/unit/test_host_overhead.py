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


def test_the_kernel_path_copies_only_a_repeated_result():
    """run_site on the kernel's path (launch stubbed): a site whose results repeat one output get distinct
    tensors (the second a copy); distinct outputs are handed on as the kernel wrote them."""
    import dataclasses
    from unittest import mock

    from benchmarks import host_overhead, sweep_fusion

    entry = sweep_fusion.kernels("mlp", tiny=True)[0]
    site = entry["site"]
    with host_overhead.stubbed_launch():
        twice = host_overhead.site_call(dataclasses.replace(site, outputs=(site.outputs[0],) * 2), entry["mnk"])
        once = host_overhead.site_call(site, entry["mnk"])
        with mock.patch.object(torch.Tensor, "is_cuda", True):
            a, b = twice()
            results = once()
    assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()
    assert len({r.untyped_storage().data_ptr() for r in results}) == len(results)


def test_ready_ops_host_time_through_the_stubbed_launch(tmp_path):
    """--ready-ops: each ready op of a Llama layer timed through its whole path with the launch stubbed (no GPU,
    no kernel), a row per op and the layer's sum; nothing stays patched after."""
    import json

    import torch

    from benchmarks import host_overhead
    from coda_ext.jit import binding

    out = tmp_path / "ho.json"
    assert host_overhead.main(["--models", "--ready-ops", "--calls", "3", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    ops = doc["ready_ops"]["ops"]
    assert [r["op"] for r in ops] == list(host_overhead.READY_OPS)
    assert all(r["host_us"] > 0 for r in ops) and doc["ready_ops"]["layer_ms"] > 0
    assert doc["models"] == {}
    assert not torch.zeros(1).is_cuda and binding.load_binding.__name__ == "load_binding"
