"""The fusion compiler's two custom ops on CPU: torch.library.opcheck (schema, fake, autograd
registration), torch.compile(fullgraph=True), values against the plain PyTorch math, and refusals."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from coda_ext import graphs
from coda_ext.fusion import op as fop
from coda_ext.graph.canonical import as_ir

M, N, K = 24, 40, 16


def _site() -> fop.Site:
    """silu(A @ Wᵀ + bias) as one fused kernel call."""
    return fop.Site(as_ir(graphs.bias_silu()), "float32", "kk", (("bias", "row"),),
                    (fop.Output("out", (M, N), torch.float32),))


def _tensors(gen: torch.Generator) -> list[torch.Tensor]:
    return [torch.randn(M, K, generator=gen), torch.randn(N, K, generator=gen), torch.randn(N, generator=gen)]


@pytest.mark.parametrize("major", ["kk", "kn", "mk", "mn"])
def test_fusion_gemm_reads_each_layout(major):
    gen = torch.Generator().manual_seed(1)
    A, W = torch.randn(M, K, generator=gen), torch.randn(N, K, generator=gen)
    a = A if major[0] == "k" else A.t().contiguous()
    w = W if major[1] == "k" else W.t().contiguous()
    torch.testing.assert_close(fop.fusion_gemm(a, w, major), A @ W.t())
    torch.library.opcheck(fop.fusion_gemm, (a, w, major))


def test_fusion_kernel_matches_the_unfused_math_and_passes_opcheck():
    a, w, bias = _tensors(torch.Generator().manual_seed(2))
    spec = _site().spec()
    (out,) = fop.fusion_kernel(spec, [a, w, bias])
    torch.testing.assert_close(out, F.silu(a @ w.t() + bias))
    torch.library.opcheck(fop.fusion_kernel, (spec, [a, w, bias]))


def test_both_ops_compile_fullgraph():
    a, w, bias = _tensors(torch.Generator().manual_seed(3))
    spec = _site().spec()

    def step(a, w, bias):
        (y,) = fop.fusion_kernel(spec, [a, w, bias])
        return fop.fusion_gemm(y, w.t().contiguous(), "kk")

    torch._dynamo.reset()
    got = torch.compile(step, fullgraph=True, backend="aot_eager")(a, w, bias)
    torch.testing.assert_close(got, step(a, w, bias))


def test_refusals_before_any_work():
    a, w, bias = _tensors(torch.Generator().manual_seed(4))
    with pytest.raises(ValueError, match="major must be one of"):
        fop.fusion_gemm(a, w, "kx")
    stale = _site().spec().replace('"v":1', '"v":99')
    with pytest.raises(ValueError, match="spec version 99"):
        fop.fusion_kernel(stale, [a, w, bias])


def test_fusion_kernel_refuses_tensors_that_require_grad():
    """It has no autograd formula (AOTAutograd owns the backward of the graphs that call it): a call that would
    lose gradients says so instead."""
    a, w, bias = _tensors(torch.Generator().manual_seed(5))
    spec = _site().spec()
    with pytest.raises(RuntimeError, match="no autograd formula"):
        fop.fusion_kernel(spec, [a.requires_grad_(), w, bias])
    with torch.no_grad():
        (out,) = fop.fusion_kernel(spec, [a, w, bias])
    torch.testing.assert_close(out, F.silu(a.detach() @ w.t() + bias))
