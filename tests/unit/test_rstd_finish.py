"""ops.finish.rstd_ on the CPU (its GPU kernel: tests/gpu/test_ops_gpu.py): in place, the same values as
PyTorch's rsqrt(sumsq / n + eps), and refusals that name the problem."""
from __future__ import annotations

import pytest
import torch

from coda_ext.ops import finish
from tests.helpers import rand


@pytest.mark.parametrize("n", [1, 37, 4099])
def test_in_place_and_equal_to_the_pytorch_formula(n):
    s = rand.positive(rand.generator("rstd_", n), n) * 50.0
    want = torch.rsqrt(s / 2048 + 1e-6)
    ptr = s.data_ptr()
    got = finish.rstd_(s, 2048, 1e-6)
    assert got.data_ptr() == ptr and torch.equal(got, want)


def test_empty_vector():
    assert finish.rstd_(torch.empty(0), 8, 1e-5).numel() == 0


@pytest.mark.parametrize("sumsq, n_cols, message", [
    (lambda: torch.ones(4, dtype=torch.int32), 8, "float32"),
    (lambda: torch.ones(4, 2), 8, "1-D"),
    (lambda: torch.ones(8)[::2], 8, "contiguous"),
    (lambda: torch.ones(4), 0, "positive"),
])
def test_refusals_name_the_problem(sumsq, n_cols, message):
    with pytest.raises(ValueError, match=message):
        finish.rstd_(sumsq(), n_cols, 1e-6)
