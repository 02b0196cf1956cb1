"""Layer norm between GEMMs: its statistics in one pass (fusion/passes/norm_stats.py), its normalisation folded
into the GEMMs that read it (fusion/passes/norm_fold.py), each on small FX graphs traced with fake tensors
(the rewritten graph computes what the original does: to fp64 or fp32 rounding, a folded GEMM being
fp32 at least), and the frontend's second round
when a fold's math finds no kernel."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from coda_ext.fusion import frontend, passes
from coda_ext.fusion.aten_ir import alias_root
from coda_ext.fusion.cost import CostModel
from coda_ext.fusion.lowering import KERNEL
from coda_ext.fusion.passes import GEMM, decompose, layout, norm_fold, norm_stats
from coda_ext.fusion.passes.norm_fold import META, match

aten = torch.ops.aten
FOLD = CostModel(fold_weight_passes=0.0)     # folds whatever the weights cost (tiny graphs)


def trace(fn, *args):
    return make_fx(fn, tracing_mode="fake")(*args)


def targets(gm) -> list:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def randn(seed: int, *shape, dtype=torch.float64, scale: float = 1.0, shift: float = 0.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale + shift).to(dtype)


def outputs(gm, *args) -> list[torch.Tensor]:
    out = gm(*args)
    return list(out) if isinstance(out, (list, tuple)) else [out]


def same(a, b, *args, rtol=1e-10, atol=1e-12) -> None:
    for x, y in zip(outputs(a, *args), outputs(b, *args), strict=True):
        torch.testing.assert_close(x, y, rtol=rtol, atol=atol)


def ln(x, w, b):
    return aten.native_layer_norm.default(x, [x.shape[-1]], w, b, 1e-5)[0]


# --- norm_stats -----------------------------------------------------------------------------------

def residual_norm(x, w0, b0, res, g, b):
    """A GEMM + bias + residual, then a layer norm of it: the statistics can join the GEMM's epilogue."""
    return ln(F.linear(x, w0, b0) + res, g, b)


def _residual_norm_args(dtype=torch.float64):
    return (randn(1, 2, 6, 8, dtype=dtype), randn(2, 16, 8, dtype=dtype, scale=0.3), randn(3, 16, dtype=dtype),
            randn(4, 2, 6, 16, dtype=dtype, shift=2.0), randn(5, 16, dtype=dtype), randn(6, 16, dtype=dtype))


def test_norm_stats_sums_x_and_its_square_where_a_gemm_produces_x():
    args = _residual_norm_args()
    gm = decompose(trace(residual_norm, *args))
    out = norm_stats(gm)
    sums = [n for n in out.graph.nodes if n.target is aten.sum.dim_IntList]
    x = sums[0].args[0]
    assert len(sums) == 2 and x.target is aten.add.Tensor                 # Σx of the residual add's value
    square = sums[1].args[0]
    assert square.target is aten.mul.Tensor and square.args == (x, x)      # and Σx·x: no Σ(x − μ)²
    assert aten.clamp_min.default in targets(out)
    same(gm, out, *args, rtol=1e-9, atol=1e-10)        # x has a mean of about 2: the one pass holds in fp64


def test_norm_stats_leaves_a_norm_no_gemm_feeds():
    x, g, b = randn(1, 4, 16, shift=1.0), randn(2, 16), randn(3, 16)
    gm = decompose(trace(ln, x, g, b))
    out = norm_stats(gm)
    assert aten.clamp_min.default not in targets(out)
    assert targets(out) == targets(gm)


def test_layer_norm_backward_reads_the_fp32_statistics_of_a_bf16_input():
    """PyTorch's CPU layer norm rounds a bf16 input's mean and rstd to bf16; the decomposed backward
    reads the fp32 values, as CUDA's does, so forward and backward share the normalised x."""
    x, dy = randn(1, 4, 16, dtype=torch.bfloat16), randn(2, 4, 16, dtype=torch.bfloat16)
    w, b = randn(3, 16, dtype=torch.bfloat16), randn(4, 16, dtype=torch.bfloat16)

    def fn(x, dy, w, b):
        y, mean, rstd = aten.native_layer_norm.default(x, [16], w, b, 1e-5)
        dx, dw, db = aten.native_layer_norm_backward.default(dy, x, [16], mean, rstd, w, b, [True, True, True])
        return [y, dx, dw, db]

    gm = trace(fn, x, dy, w, b)
    out = passes.cse(decompose(gm))
    rsqrt = [n for n in out.graph.nodes if n.target is aten.rsqrt.default]
    assert len(rsqrt) == 1 and all(u.target is not torch.ops.prims.convert_element_type.default
                                   for u in rsqrt[0].users)
    xhat = [n for n in out.graph.nodes if n.target is aten.mul.Tensor and rsqrt[0] in n.args
            and n.args[0].target is aten.sub.Tensor and n.args[0].args[0].args[0].name == "x_1"]
    assert len(xhat) == 1                                   # one normalised x, forward and backward
    xr, wr, br = (t.double().requires_grad_() for t in (x, w, b))
    yr = F.layer_norm(xr, [16], wr, br, 1e-5)
    yr.backward(dy.double())
    for got, want in zip(outputs(out, x, dy, w, b), [yr, xr.grad, wr.grad, br.grad]):
        torch.testing.assert_close(got.double(), want.detach(), rtol=2e-2, atol=3e-2)


# --- norm_fold ------------------------------------------------------------------------------------

def norm_then_linears(x, g, b, w1, b1, w2, b2):
    """A layer norm read by two linear layers (QKV-like) and a residual add."""
    y = ln(x, g, b)
    return [F.linear(y, w1, b1), F.gelu(F.linear(y, w2, b2)) + y]


def _fold_args(dtype=torch.float32):
    return (randn(1, 2, 6, 16, dtype=dtype, scale=2.0, shift=3.0), randn(2, 16, dtype=dtype, shift=1.0),
            randn(3, 16, dtype=dtype), randn(4, 12, 16, dtype=dtype), randn(5, 12, dtype=dtype),
            randn(6, 16, 16, dtype=dtype), randn(7, 16, dtype=dtype))


def _before_fold(fn, *args):
    return layout(passes.cse(passes.fold(norm_stats(decompose(trace(fn, *args))))))


def test_norm_fold_rewrites_each_gemm_to_read_x_and_matches():
    args = _fold_args()
    gm = _before_fold(norm_then_linears, *args)
    out = norm_fold(gm, cost=FOLD)
    (fold,) = out.meta[META]
    assert len(fold.gemms) == 2
    gemms = [n for n in out.graph.nodes if n.target is GEMM]
    x = next(n for n in out.graph.nodes if n.op == "placeholder")
    assert len(gemms) == 2 and all(g.args[0].args[0] is x for g in gemms)   # x (viewed 2-D), not y
    # y is no longer computed for the GEMMs: the residual add reads its own copy, computed from x
    residual = next(n for n in out.graph.nodes if n.target is aten.add.Tensor and n.args[0].target is aten.gelu.default)
    copy = match(residual.args[1])
    assert copy.x is x and copy.bias is not None and copy.y not in {g.args[0] for g in gemms}
    same(gm, out, *args, rtol=1e-5, atol=2e-5)
    same(trace(norm_then_linears, *args), out, *args, rtol=1e-5, atol=2e-5)


def conv1d_norm(x, g, b, w, bias):
    """GPT-2's Conv1D: addmm(bias, y, W) with W stored (in, out): the GEMM reads W N-major."""
    y = ln(x, g, b)
    return torch.addmm(bias, y.reshape(-1, y.shape[-1]), w)


def test_norm_fold_with_the_weight_stored_in_by_out():
    args = tuple(t.float() for t in (randn(1, 2, 6, 16, scale=2.0, shift=-1.0), randn(2, 16, shift=1.0), randn(3, 16),
                                     randn(4, 16, 24), randn(5, 24)))
    gm = _before_fold(conv1d_norm, *args)
    assert [n.args[2] for n in gm.graph.nodes if n.target is GEMM] == ["kn"]
    out = norm_fold(gm, cost=FOLD)
    assert len(out.meta[META]) == 1 and [n.args[2] for n in out.graph.nodes if n.target is GEMM] == ["kn"]
    same(gm, out, *args, rtol=1e-5, atol=2e-5)


def test_norm_fold_leaves_norms_it_should_not_fold():
    args = _fold_args()
    gm = _before_fold(norm_then_linears, *args)
    assert norm_fold(gm).meta[META] == []                                   # tiny: the weights cost more
    y = alias_root(next(n for n in gm.graph.nodes if n.target is GEMM).args[0])
    assert norm_fold(gm, cost=FOLD, unfolded={y.name}).meta[META] == []    # named as unfolded
    # a reader that is no GEMM and no element-wise math (a reduction over the rows): y is needed anyway
    other = _before_fold(lambda x, g, b, w1, b1, w2, b2: [F.linear(ln(x, g, b), w1, b1), ln(x, g, b).sum(0)], *args)
    assert norm_fold(other, cost=FOLD).meta[META] == []
    # on the GPU kernel's rules a GEMM of N = 12 (not a multiple of 8) cannot anchor an epilogue
    bf = [t.to(torch.bfloat16) for t in args]
    gm16 = _before_fold(lambda x, g, b, w1, b1, w2, b2: F.linear(ln(x, g, b), w1, b1), *bf)
    assert norm_fold(gm16, "cuda", cost=FOLD).meta[META] == []
    assert len(norm_fold(gm16, "interpret", cost=FOLD).meta[META]) == 1


def test_norm_fold_keeps_the_backward_readers_of_y():
    """In a joint graph the weight gradient dzᵀ @ y reads y: it keeps reading it (recomputed there), and
    only the forward GEMM is folded."""
    args = _fold_args()[:5] + (randn(8, 2, 6, 12, dtype=torch.float32),)

    def joint(x, g, b, w1, b1, tangents_1):
        y = ln(x, g, b)
        z = F.linear(y, w1, b1)
        dw = tangents_1.reshape(-1, 12).t() @ y.reshape(-1, 16)
        return [z, dw]

    gm = _before_fold(joint, *args)
    out = norm_fold(gm, cost=FOLD)
    (fold,) = out.meta[META]
    assert len(fold.gemms) == 1
    dw = [n for n in out.graph.nodes if n.target is GEMM and n.args[2] == "mn"]
    assert len(dw) == 1 and match(alias_root(dw[0].args[1])) is not None
    same(gm, out, *args, rtol=1e-5, atol=2e-5)


def test_folded_norms_lower_into_their_gemms_epilogues_in_bf16():
    """The whole pipeline in bf16: each folded GEMM's epilogue takes μ ⊗ s, the subtraction, the rstd
    scale and + W β (the residual add's copy of y joins the second GEMM's), within the numerics rule."""
    args = [t.to(torch.bfloat16) for t in _fold_args()]
    gm = trace(norm_then_linears, *args)
    fused, rep, _ = frontend.fuse_graph(gm, frontend.Options(cost=FOLD), "interpret", "test")
    assert len(rep.folded) == 1 and not rep.note
    assert sum(1 for n in fused.graph.nodes if n.target is KERNEL) == 2
    assert all("aten.sub.Tensor" in " ".join(k.members) for k in rep.kernels)
    assert [k.loads.count("x_1 (tile)") for k in rep.kernels] == [0, 1]   # x in bf16: the epilogue widens it
    ref = [t.double() for t in args]
    want = norm_then_linears(*ref)
    base = norm_then_linears(*args)
    for got, w, e in zip(outputs(fused, *args), want, base):
        err, err_eager = (got.double() - w).abs().max().item(), (e.double() - w).abs().max().item()
        assert err <= 2 * err_eager + 1e-5 * (1 + w.abs().max().item())


def test_a_fold_whose_math_no_kernel_takes_is_undone(monkeypatch):
    """If the partition leaves a folded GEMM plain, the fallback would subtract μ ⊗ s from a rounded
    product: the frontend folds again without that layer norm, and says so."""
    args = [t.to(torch.bfloat16) for t in _fold_args()]
    gm = trace(norm_then_linears, *args)
    real = frontend.partition

    def no_fold_math(pg, *a, **k):          # no epilogue for a GEMM whose weight is computed (W ⊙ γ)
        part = real(pg, *a, **k)
        kept = tuple(g for g in part.groups if pg[pg.sources(g.anchor)[1]].op != "math")
        return dataclasses.replace(part, groups=kept)

    monkeypatch.setattr(frontend, "partition", no_fold_math)
    fused, rep, _ = frontend.fuse_graph(gm, frontend.Options(cost=FOLD), "interpret", "test")
    assert rep.folded == () and "not folded" in rep.note
    for got, want in zip(outputs(fused, *args), norm_then_linears(*args)):
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fold_identity_holds_with_the_weight_rounded(dtype):
    """LN(x) @ Wᵀ + b = rstd ⊙ (x @ (W⊙γ)ᵀ − μ s) + W β + b with s the column sums of W⊙γ as rounded: the
    rounding of W⊙γ costs no more than eager's rounding of y."""
    x, g, b = randn(1, 64, 32, shift=0.5, dtype=dtype), randn(2, 32, dtype=dtype), randn(3, 32, dtype=dtype)
    w, bias = randn(4, 24, 32, dtype=dtype, scale=0.2), randn(5, 24, dtype=dtype)
    args = (x, g, b, w, bias)
    gm = _before_fold(lambda x, g, b, w, bias: F.linear(ln(x, g, b), w, bias), *args)
    out = norm_fold(gm, cost=FOLD)
    want = F.linear(F.layer_norm(x.double(), [32], g.double(), b.double(), 1e-5), w.double(), bias.double())
    err = (outputs(out, *args)[0].double() - want).abs().max().item()
    err_eager = (F.linear(F.layer_norm(x, [32], g, b, 1e-5), w, bias).double() - want).abs().max().item()
    assert err <= 2 * err_eager + 1e-5 * (1 + want.abs().max().item())
