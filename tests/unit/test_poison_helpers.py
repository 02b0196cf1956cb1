"""The GPU tests' poisoned outputs (nan_outputs in tests/helpers/checks.py), on CPU tensors."""
from __future__ import annotations

import torch

from tests.helpers.checks import nan_outputs


class _Op:
    """An op with a 16-bit and a uint8 output (graphs.weight_grad_split's hi and lo)."""

    output_names = ("hi", "lo")

    def empty_output(self, name, M, N, device):
        return torch.empty(M, N, dtype=torch.bfloat16 if name == "hi" else torch.uint8, device=device)


def test_integer_outputs_are_poisoned_with_every_bit_set():
    # a uint8 output was filled with NaN, which raised before the launch (the sanitizer's major_mn family)
    out = nan_outputs(_Op(), 3, 5, "cpu")
    assert out["hi"].isnan().all()
    assert out["lo"].dtype == torch.uint8 and (out["lo"] == 255).all()
