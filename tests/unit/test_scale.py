"""ops.scale.scale_by_ on the CPU (its GPU kernel: tests/gpu/test_backward_ops_gpu.py): in place, in fp32 rounded
to each tensor's dtype, nothing at a factor of 1, the tensors' version counters untouched (tensors saved for a
backward stay valid), and refusals that name the problem."""
from __future__ import annotations

import pytest
import torch

from coda_ext.ops import scale
from tests.helpers import rand


def test_scales_in_place_in_fp32_and_keeps_version_counters():
    gen = rand.generator("scale")
    a, b = rand.randn(gen, 37, 5, dtype=torch.bfloat16), rand.randn(gen, 11)
    a0, b0, va, vb = a.clone(), b.clone(), a._version, b._version
    pa = a.data_ptr()
    scale.scale_by_([a, b], torch.tensor(1.0))
    assert torch.equal(a, a0) and torch.equal(b, b0)
    scale.scale_by_([a, b], torch.tensor(0.3))
    assert torch.equal(a, (a0.float() * 0.3).to(torch.bfloat16)) and torch.equal(b, b0 * 0.3)
    assert a.data_ptr() == pa and (a._version, b._version) == (va, vb)


@pytest.mark.parametrize("tensors, factor, message", [
    (lambda: [torch.ones(4)], lambda: torch.tensor([2.0]), "0-dim float32"),
    (lambda: [torch.ones(4)], lambda: torch.tensor(2.0, dtype=torch.float64), "0-dim float32"),
    (lambda: [torch.ones(4, 4).t()], lambda: torch.tensor(2.0), "contiguous"),
    (lambda: [torch.ones(4, dtype=torch.int32)], lambda: torch.tensor(2.0), "floating"),
    (lambda: [torch.ones(4, device="meta")], lambda: torch.tensor(2.0), "on cpu"),
])
def test_refusals_name_the_problem(tensors, factor, message):
    with pytest.raises(ValueError, match=message):
        scale.scale_by_(tensors(), factor())
