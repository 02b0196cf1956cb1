"""fusion/passes/gelu_save.py on hand-written joint graphs: GELU's derivative computed by the forward and saved in
place of its input, the backward's gelu_backward a multiply; the same values; left alone where the backward reads
the input otherwise; the derivative a candidate of the forward GEMM's epilogue only."""
from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from coda_ext.fusion import fx_util, passes
from coda_ext.fusion.analyze import analyze
from coda_ext.fusion.partition import candidates
from coda_ext.fusion.passes import gelu_grad_forward

aten = torch.ops.aten


def _joint(form: str, extra_read: bool = False):
    def joint(a, w1, w2, tangents_1):
        x = a @ w1.t()
        y = aten.gelu.default(x, approximate=form)
        out = y @ w2.t()
        dy = tangents_1 @ w2
        dx = aten.gelu_backward.default(dy, x, approximate=form)
        if extra_read:
            dx = dx + x * dy
        return [out, dx.t() @ a, dx @ w1, tangents_1.t() @ y]
    return joint


def _args(seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = ((24, 16), (40, 16), (8, 40), (24, 8))
    return [torch.randn(s, generator=g, dtype=torch.float64).float() for s in shapes]


def _trace(fn, args):
    return make_fx(fn, tracing_mode="fake")(*args)


def _gelu_backwards(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is aten.gelu_backward.default]


@pytest.mark.parametrize("form", ["none", "tanh"])
def test_the_forward_computes_the_derivative_and_the_backward_multiplies(form):
    args = _args()
    gm = _trace(_joint(form), args)
    out = gelu_grad_forward(gm)
    backward = fx_util.tangent_dependent(out)
    (g,) = _gelu_backwards(out)
    assert g not in backward and g.meta.get(fx_util.SAVED)
    assert g.kwargs.get("approximate", "none") == form
    assert g.args[0].target is aten.full.default and g.args[0].args[1] == 1.0
    x = g.args[1]
    assert not any(u in backward for u in x.users)          # x no longer crosses to the backward: g does
    readers = [u for u in g.users if u in backward]
    assert [u.target for u in readers] == [aten.mul.Tensor]
    torch.testing.assert_close(out(*args), gm(*args), rtol=1e-6, atol=1e-6)


def test_an_input_the_backward_reads_otherwise_is_left_alone():
    gm = _trace(_joint("none", extra_read=True), _args())
    assert gelu_grad_forward(gm).code == gm.code


def test_a_graph_without_a_backward_is_left_alone():
    def forward(a, w1):
        return [aten.gelu.default(a @ w1.t())]
    gm = _trace(forward, _args()[:2])
    assert gelu_grad_forward(gm).code == gm.code


def test_the_derivative_joins_the_forward_gemms_epilogue_only():
    """Marked SAVED, the analysis counts g as forward: no backward GEMM's epilogue computes it from a load of x (as
    it would the derivative of an unrewritten gelu_backward: what only the backward reads is its candidate)."""
    gm = passes.run(_trace(_joint("none"), _args()))
    a = analyze(gm)
    (g,) = [i for i, n in enumerate(a.fx_nodes) if n.target is aten.gelu_backward.default]
    assert a.pgraph[g].forward and not a.pgraph[g].backward
    cands = candidates(a.pgraph)
    holders = [anchor for anchor, c in cands.items() if g in c]
    assert holders and all(not a.pgraph[h].backward for h in holders)
    mul = next(i for i, n in enumerate(a.fx_nodes) if n.target is aten.mul.Tensor and a.fx_nodes[g] in n.args)
    assert any(mul in c for anchor, c in cands.items() if a.pgraph[anchor].backward)


def test_the_forward_epilogue_computes_the_derivative_without_a_multiply_by_one():
    """gelu_backward(1, x) lowers to the derivative's node alone (no scalar 1 and multiply in the kernel), beside
    the GELU in the forward GEMM's epilogue; the backward GEMM's epilogue loads g and multiplies."""
    from coda_ext.fusion.lowering import lower
    from coda_ext.fusion.partition import partition

    gm = passes.run(_trace(_joint("none"), _args()))
    an = analyze(gm)
    _, lowered = lower(gm, an, partition(an.pgraph))
    kinds = [[n.kind for n in low.site.graph.nodes] for low in lowered if low.site is not None]
    forward = [k for k in kinds if "gelu_erf" in k]
    assert forward and all("gelu_erf_grad" in k and "scalar" not in k for k in forward)
    assert not any("gelu_erf_grad" in k and "gelu_erf" not in k for k in kinds)   # no backward evaluates it
