"""The layer input's RMSNorm as one Triton kernel (ops/norm_kernel.py) on the CPU: when rms_norm_input takes it,
its input checks, and its values under Triton's interpreter where triton is installed (the GPU suite runs it on
the device)."""
from __future__ import annotations

from unittest import mock

import pytest
import torch

from coda_ext import ops
from coda_ext.ops import norm_input, norm_kernel
from tests.helpers.triton_interp import assert_available_is_a_dynamo_constant, needs_triton, run_interpreted


def test_rms_norm_input_takes_the_kernel_for_rows_it_reads():
    """On a GPU (here: CUDA faked, the kernel recorded and run as the reference math) contiguous inputs go to the
    kernel as (M, N) rows and come back in x's shape; a non-contiguous x takes the generated path, a traced call
    the math (Inductor's), with the same values."""
    calls = []

    def kernel(x, weight, eps):
        calls.append(tuple(x.shape))
        h, rstd = norm_input._math(x, weight, eps)
        return h, rstd

    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 24, generator=g).to(torch.bfloat16)
    w = torch.randn(24, generator=g)
    want = norm_input._math(x, w, 1e-6)
    with mock.patch.object(norm_kernel, "rms_norm_rows", kernel), \
            mock.patch.object(norm_kernel, "available", return_value=True), \
            mock.patch.object(norm_input, "_fused", norm_input._math), \
            mock.patch.object(torch.Tensor, "is_cuda", True):
        for t, kernel_call in ((x, True), (x.transpose(0, 1), False), (x[:, :, :1], False)):
            calls.clear()
            h, rstd = ops.rms_norm_input(t, w[: t.shape[-1]], 1e-6)
            assert bool(calls) == kernel_call
            ref = norm_input._math(t, w[: t.shape[-1]], 1e-6)
            assert h.shape == t.shape and rstd.shape == t.shape[:-1]
            assert torch.equal(h, ref[0]) and torch.equal(rstd, ref[1])
        assert calls == [] and torch.equal(ops.rms_norm_input(x, w, 1e-6)[0], want[0])
        # regression: a call that records a gradient went to the custom op, which has no backward; float64 and
        # rows of no columns are not the kernel's either
        for t, wt in ((x.float().requires_grad_(), w), (x, w.clone().requires_grad_()), (x.double(), w),
                      (x[..., :0].contiguous(), w[:0])):
            calls.clear()
            h, _ = ops.rms_norm_input(t, wt, 1e-6)
            assert calls == []
        h, _ = ops.rms_norm_input(x.float().requires_grad_(), w, 1e-6)
        h.sum().backward()
        with torch.no_grad():
            calls.clear()
            ops.rms_norm_input(x.float().requires_grad_(), w, 1e-6)
            assert calls


@pytest.mark.parametrize("x,w,match", [
    (torch.zeros(2, 3, 8), torch.zeros(8), "must be \\(M, N\\) rows"),
    (torch.zeros(8, 4).t(), torch.zeros(8), "adjacent columns"),
    (torch.zeros(4, 8), torch.zeros(7), "weight must be a contiguous \\(8,\\)"),
    (torch.zeros(4, 8), torch.zeros(16)[::2], "weight must be a contiguous"),
])
def test_the_kernel_refuses_what_it_does_not_read_before_a_launch(x, w, match):
    with mock.patch.object(norm_kernel, "_kernel", side_effect=AssertionError("launched")), \
            pytest.raises(ValueError, match=match):
        norm_kernel._launch(x, w, 1e-6)


def test_available_is_a_constant_to_dynamo(monkeypatch):
    """rms_norm_input asks available() on a GPU; under a trace Dynamo must run it, not trace the import inside."""
    assert_available_is_a_dynamo_constant(norm_kernel, monkeypatch)


_INTERPRETED = """
import torch
from coda_ext.ops import norm_input, norm_kernel
g = torch.Generator().manual_seed(0)
for M, N in ((1, 8), (7, 24), (9, 700), (5, 1024)):
    for dtype, wdtype in ((torch.float32,) * 2, (torch.float16,) * 2, (torch.float16, torch.float32)):
        x = (torch.randn(M, N, generator=g) * 3).to(dtype)
        w = torch.randn(N, generator=g).to(wdtype)
        h, rstd = norm_kernel._launch(x, w, 1e-6)
        want_h, want_rstd = norm_input._math(x, w, 1e-6)
        assert torch.equal(h, want_h), (M, N, dtype)
        torch.testing.assert_close(rstd, want_rstd, rtol=2e-6, atol=0)
print("ok")
"""


@needs_triton
def test_kernel_values_under_triton_interpreter():
    """The kernel itself (Triton's interpreter on CPU tensors, in a process that starts with TRITON_INTERPRET=1)
    against the math: rows not a multiple of its block, widths not a multiple of its column step; h exactly in
    fp32 and fp16 (bf16 is left to the GPU suite: the interpreter truncates where the GPU rounds), also with an
    fp32 weight (rounded to x's dtype first, as weight.to(x.dtype)); rstd within fp32 summation order."""
    run_interpreted(_INTERPRETED)


@needs_triton
def test_eps_is_a_compile_time_constant_of_the_kernel():
    """Regression: with eps a runtime float, Inductor (the op under torch.compile) passed it to the kernel in fp64
    and Triton refused the fp32 sqrt of `acc / N + eps` (the GPU suite's compiled norm test failed)."""
    from coda_ext.ops import _norm_triton

    fn = _norm_triton.rms_norm_input_kernel
    assert "eps" in [p.name for p in fn.params if p.is_constexpr]
