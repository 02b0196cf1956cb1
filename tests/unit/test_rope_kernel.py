"""The RoPE backward's Triton pass (ops/rope_kernel.py) on the CPU: which gradient layouts it reads in place
(as_rows, decided from strides), when rope_backward takes it, and its values under Triton's interpreter where
triton is installed (the GPU suite runs it on the device)."""
from __future__ import annotations

import itertools
from unittest import mock

import pytest
import torch

from coda_ext import ops
from coda_ext.ops import rope_backward as rb
from coda_ext.ops import rope_kernel
from tests.helpers.triton_interp import assert_available_is_a_dynamo_constant, needs_triton, run_interpreted


def _views_and_widths():
    """(tensor, M, width) cases: contiguous and permuted tensors, slices with steps, storage offsets, expands,
    size-1 dims, every width that divides the element count."""
    bases = []
    for shape in ((2, 3, 4, 6), (1, 5, 1, 8), (4, 1, 6), (3, 2, 2, 2, 3)):
        t = torch.arange(int(torch.tensor(shape).prod()), dtype=torch.float32).reshape(shape)
        bases.extend(t.permute(perm) for perm in itertools.islice(itertools.permutations(range(len(shape))), 8))
        bases.append(t[..., ::2])
        bases.append(t[:, 1:])
    buf = torch.arange(400, dtype=torch.float32)
    bases += [buf[3:].as_strided((2, 3, 8), (40, 8, 1)), buf.as_strided((3, 4, 8), (48, 8, 1), 5),
              buf.as_strided((3, 4, 8), (0, 8, 1)), buf.as_strided((2, 6), (12, 2)),
              torch.arange(8.0).reshape(1, 8).expand(4, 8)]
    for t in bases:
        n = t.numel()
        for w in range(1, n + 1):
            if n % w == 0:
                yield t, n // w, w


def test_as_rows_views_only_layouts_with_one_row_stride():
    """Every view as_rows returns holds the values of t.reshape(M, width), with adjacent columns; it refuses
    the layouts without such a view (permuted heads, steps along a row) and counts size-1 dims as nothing."""
    seen = refused = 0
    for t, M, w in _views_and_widths():
        v = rope_kernel.as_rows(t, M, w)
        if v is None:
            refused += 1
            continue
        seen += 1
        assert v.shape == (M, w) and (w == 1 or v.stride(1) == 1)
        assert torch.equal(v, t.reshape(M, w)), (t.shape, t.stride(), M, w)
        assert v.data_ptr() == t.data_ptr()
    assert seen > 20 and refused > 20
    heads_first = torch.zeros(2, 4, 5, 8).transpose(1, 2)          # (B, H, S, hd) memory as (B, S, H, hd)
    assert rope_kernel.as_rows(heads_first, 10, 32) is None
    q, k, v = torch.zeros(2, 5, 6, 8).split([4, 1, 1], dim=-2)      # views of one qkv: rows of stride 48
    assert [rope_kernel.as_rows(p, 10, p.shape[-2] * 8).stride() for p in (q, k, v)] == [(48, 1)] * 3


def _case(seed: int, B=2, S=7, nh=4, nkv=2, hd=16, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    N = (nh + 2 * nkv) * hd
    qkv = torch.randn(B, S, N, generator=g).to(dtype)
    parts = tuple(torch.randn(B, S, h, hd, generator=g).to(dtype) for h in (nh, nkv, nkv))
    pos = torch.randint(0, 100_000, (B, S), generator=g)
    return qkv, parts, pos, ops.rope_frequencies(hd, nh, nkv, theta=500000.0), nh, nkv


def test_rope_backward_takes_the_kernel_only_with_row_views(monkeypatch):
    """On a GPU (here: CUDA faked, the kernel recorded and run as the reference math) rope_backward hands the
    kernel attention's gradients in place when each part and qkv have row views with adjacent columns; a qkv
    whose columns are not adjacent or gradients in another layout take the generated path, with the same
    values (a qkv whose rows are not one view is copied to rows first). Regression: a qkv with a non-unit
    column stride reached the kernel, which refused it."""
    calls = []

    def kernel(views, qkv_rows, cos, sin):
        calls.append(tuple(v.stride() for v in views))
        n_rot = views[0].shape[1] + views[1].shape[1]
        return rb._math(torch.cat(views, 1), qkv_rows, cos, sin, n_rot)

    monkeypatch.setattr(rope_kernel, "rope_backward", kernel)
    monkeypatch.setattr(rope_kernel, "available", lambda: True)
    monkeypatch.setattr(rb, "_fused", rb._math)
    qkv, parts, pos, freqs, nh, nkv = _case(1)
    want = rb._backward(parts, qkv, pos, freqs, nh, nkv, fused=False)
    qkv_t = qkv.transpose(0, 1).contiguous().transpose(0, 1)            # (B, S, N) with S-major rows
    qkv_cols = qkv.reshape(-1, qkv.shape[-1]).t().contiguous().t().reshape(qkv.shape)   # column stride != 1
    heads_first = tuple(p.transpose(1, 2).contiguous().transpose(1, 2) for p in parts)
    with mock.patch.object(torch.Tensor, "is_cuda", True), \
            mock.patch.object(torch.cuda, "is_current_stream_capturing", return_value=False):
        for q, p, kernel_call in ((qkv, parts, True), (qkv_t, parts, True), (qkv_cols, parts, False),
                                  (qkv, heads_first, False)):
            calls.clear()
            got = rb._backward(p, q, pos, freqs, nh, nkv, fused=True)
            assert bool(calls) == kernel_call
            assert torch.equal(got[0], want[0])
            torch.testing.assert_close(got[1], want[1], rtol=1e-6, atol=1e-5)


_INTERPRETED = """
import torch
from tests.unit.test_rope_kernel import _case
from coda_ext.ops import rope_backward as rb, rope_kernel
for hd, nh, nkv in ((64, 4, 2), (128, 2, 1), (96, 3, 1), (2, 1, 1)):
    for dtype in (torch.float32, torch.float16):
        qkv, parts, pos, freqs, nh, nkv = _case(2, B=3, S=5, nh=nh, nkv=nkv, hd=hd, dtype=dtype)
        M, N = qkv.shape[0] * qkv.shape[1], qkv.shape[-1]
        views = rb._row_views(parts, M, tuple(p.shape[-2] * hd for p in parts))
        cos, sin = rb._cos_sin(pos, freqs, hd)
        dz, zdz = rope_kernel._launch(*views, qkv.reshape(M, N), cos, sin)
        want_dz, want_zdz = rb._math(torch.cat(views, 1), qkv.reshape(M, N), cos, sin, (nh + nkv) * hd)
        assert torch.equal(dz, want_dz), (hd, nh, nkv, dtype)
        assert (zdz - want_zdz).abs().max().item() <= 1e-5 * (1 + want_zdz.abs().max().item()), (hd, dtype)
print("ok")
"""


@needs_triton
def test_kernel_values_under_triton_interpreter():
    """The kernel itself (Triton's interpreter on CPU tensors, in a process that starts with TRITON_INTERPRET=1:
    Triton reads it once) against the element-wise math: head dims 2 to 128, rows not a multiple of its
    block, parts not a multiple of its column block; fp32 and fp16 exactly (bf16 is left to the GPU suite:
    the interpreter truncates where the GPU rounds)."""
    run_interpreted(_INTERPRETED)


def test_a_missing_triton_names_the_op_and_the_fix():
    """Where triton does not import, the ops that launch Triton kernels say which op needs it and how to install
    it (one message for all: ops.common.import_triton)."""
    from coda_ext.ops import common

    with pytest.raises(ImportError, match=r"coda_ext runs the RoPE backward on the GPU with a Triton kernel, and "
                                          r"triton does not import \(.*\); install the triton .*pip install triton"):
        common.import_triton("runs the RoPE backward", "coda_ext_no_such_module")


@pytest.mark.parametrize("bad,message", [
    (lambda a: {**a, "qkv": a["qkv"].t().contiguous().t()}, "qkv must be .* adjacent columns"),
    (lambda a: {**a, "dk": a["dk"][:, :-2]}, r"dk has 30 columns, not whole heads of 16"),
    (lambda a: {**a, "dv": a["dv"].float()}, "dv must be"),
    (lambda a: {**a, "cos": a["cos"][:-1]}, "cos and sin must be contiguous float32"),
    (lambda a: {**a, "sin": a["sin"].double()}, "cos and sin must be contiguous float32"),
    (lambda a: {**a, "dq": a["dq"][:-1]}, "dq must be"),
])
def test_kernel_inputs_are_refused_before_a_launch(bad, message, monkeypatch):
    """The kernel's own checks (also through its custom op and while traced): a mistake raises before anything
    launches."""
    monkeypatch.setattr(rope_kernel, "_kernel", lambda: pytest.fail("launched"))
    qkv, parts, pos, freqs, *_ = _case(3, nh=4, nkv=2, hd=16)
    M, N = qkv.shape[0] * qkv.shape[1], qkv.shape[-1]
    cos, sin = rb._cos_sin(pos, freqs, 16)
    dq, dk, dv = rb._row_views(parts, M, (64, 32, 32))
    args = bad({"dq": dq, "dk": dk, "dv": dv, "qkv": qkv.reshape(M, N), "cos": cos, "sin": sin})
    with pytest.raises(ValueError, match=message):
        rope_kernel._launch(args["dq"], args["dk"], args["dv"], args["qkv"], args["cos"], args["sin"])


def test_available_is_a_constant_to_dynamo(monkeypatch):
    """rope_backward asks available() inside compiled graphs; its check imports the Triton kernels, which Dynamo
    refuses to trace (fullgraph failed on the GPU). Regression: available() is run, not traced, by Dynamo."""
    assert_available_is_a_dynamo_constant(rope_kernel, monkeypatch)
