"""The fusion compiler's graph passes, each on small FX graphs traced with fake tensors (make_fx): the
rewritten graph computes the same values as the original (fp64 inputs, tight tolerance), holds the ops
the pass promises and none of those it removes, and the input module is left unchanged."""
from __future__ import annotations

import operator

import pytest
import torch
import torch.nn.functional as F
from torch import fx
from torch.fx.experimental.proxy_tensor import make_fx

import coda_ext as ce
from coda_ext.fusion import fx_util, passes
from coda_ext.fusion.passes import GEMM, cse, decompose, fold, layout

aten = torch.ops.aten


def trace(fn, *args) -> fx.GraphModule:
    return make_fx(fn, tracing_mode="fake")(*args)


def targets(gm: fx.GraphModule) -> list:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def run(gm: fx.GraphModule, *args):
    out = gm(*args)
    return out if isinstance(out, (list, tuple)) else [out]


def same(gm_a: fx.GraphModule, gm_b: fx.GraphModule, *args, rtol=1e-10, atol=1e-12) -> None:
    for a, b in zip(run(gm_a, *args), run(gm_b, *args), strict=True):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(g, *shape, dtype=torch.float64):
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)


def test_every_pass_leaves_its_input_module_unchanged():
    g = gen()
    x, w, b = randn(g, 6, 4), randn(g, 5, 4), randn(g, 5)
    gm = trace(lambda x, w, b: F.gelu(torch.addmm(b, x, w.t())).detach() * 1, x, w, b)
    before = gm.code
    for p in passes.PIPELINE:
        out = p(gm)
        assert gm.code == before and out is not gm
    assert GEMM in targets(passes.run(gm))


# --- decompose ----------------------------------------------------------------------------------

def test_addmm_becomes_a_gemm_and_a_bias_add():
    g = gen(1)
    x, w, b = randn(g, 6, 4), randn(g, 5, 4), randn(g, 5)
    gm = trace(lambda x, w, b: torch.addmm(b, x, w.t(), beta=0.5, alpha=2.0), x, w, b)
    out = decompose(gm)
    assert aten.addmm.default not in targets(out) and aten.mm.default in targets(out)
    same(gm, out, x, w, b)


def test_linear_on_a_3d_input():
    g = gen(2)
    x, w, b = randn(g, 2, 3, 4), randn(g, 5, 4), randn(g, 5)
    gm = trace(lambda x, w, b: aten.linear.default(x, w, b), x, w, b)
    out = decompose(gm)
    assert aten.linear.default not in targets(out) and aten.mm.default in targets(out)
    same(gm, out, x, w, b)


@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_forward_and_backward(affine):
    g = gen(3)
    x, dy = randn(g, 2, 3, 8) * 3 + 1, randn(g, 2, 3, 8)
    w, b = (randn(g, 8), randn(g, 8)) if affine else (None, None)

    def fn(x, dy, w, b):
        y, mean, rstd = aten.native_layer_norm.default(x, [8], w, b, 1e-5)
        grads = aten.native_layer_norm_backward.default(dy, x, [8], mean, rstd, w, b, [True, affine, affine])
        return [y, mean, rstd] + [t for t in grads if t is not None]

    gm = trace(fn, x, dy, w, b)
    out = decompose(gm)
    assert not {aten.native_layer_norm.default, aten.native_layer_norm_backward.default} & set(targets(out))
    assert aten.sum.dim_IntList in targets(out)
    same(gm, out, x, dy, w, b, rtol=1e-9, atol=1e-10)


def test_layer_norm_in_bf16_keeps_fp32_statistics():
    g = gen(4)
    x, w, b = randn(g, 4, 8, dtype=torch.bfloat16), randn(g, 8, dtype=torch.bfloat16), randn(g, 8, dtype=torch.bfloat16)
    gm = trace(lambda x, w, b: list(aten.native_layer_norm.default(x, [8], w, b, 1e-5)), x, w, b)
    out = decompose(gm)
    got, want = run(out, x, w, b), run(gm, x, w, b)
    assert [t.dtype for t in got] == [t.dtype for t in want]
    torch.testing.assert_close(got[0], want[0], rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(got[2], want[2], rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not hasattr(aten, "_fused_rms_norm_backward"), reason="this torch has no fused RMSNorm op")
def test_rms_norm_forward_and_backward():
    """aten._fused_rms_norm(_backward) (what F.rms_norm runs on CUDA; its backward has no CPU kernel):
    the decomposition against autograd of the written-out RMSNorm."""
    g = gen(5)
    x, dy, w = randn(g, 2, 3, 8), randn(g, 2, 3, 8), randn(g, 8)

    def fn(x, dy, w):
        y, rstd = aten._fused_rms_norm.default(x, [8], w, 1e-6)
        dx, dw = aten._fused_rms_norm_backward.default(dy, x, [8], rstd, w, [True, True])
        return [y, rstd, dx, dw]

    out = decompose(trace(fn, x, dy, w))
    assert not {aten._fused_rms_norm.default, aten._fused_rms_norm_backward.default} & set(targets(out))
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    rstd = torch.rsqrt(xr.square().mean(-1, keepdim=True) + 1e-6)
    y = xr * rstd * wr
    y.backward(dy)
    for got, want in zip(run(out, x, dy, w), [y, rstd, xr.grad, wr.grad]):
        torch.testing.assert_close(got, want.detach(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_backward_is_one_epilogue_node(monkeypatch, approximate):
    """GELU's backward, exact or tanh form, stays one op, which an epilogue runs as dy · gelu_grad(x) (one node;
    the exact form's decomposition was a dozen, a division and a select among them, the tanh form's 20)."""
    from coda_ext.fusion import aten_ir

    g = gen(6)
    x = torch.cat([randn(g, 64) * 4, torch.tensor([0.0, 1e-4, -1e-4, 2e-3, -8.0, 8.0], dtype=torch.float64)])
    dy = randn(g, x.numel())
    gm = trace(lambda dy, x: aten.gelu_backward.default(dy, x, approximate=approximate), dy, x)
    out = decompose(gm)
    assert aten.gelu_backward.default in targets(out)
    node = next(n for n in out.graph.nodes if n.target is aten.gelu_backward.default)
    rule = aten_ir.MATH[aten.gelu_backward.default]
    assert rule.check(node) is None

    class Value:   # what the lowering's values do here: record the math
        def __init__(self, text: str):
            self.text = text

        def __mul__(self, other: Value) -> Value:
            return Value(f"{self.text} * {other.text}")

    monkeypatch.setattr(aten_ir.cm, "gelu_grad", lambda v, approximate: Value(f"gelu_grad({v.text}, {approximate})"))
    got = rule.emit(node, lambda a: Value({node.args[0]: "dy", node.args[1]: "x"}[a]))
    assert got.text == f"dy * gelu_grad(x, {approximate})"
    want = aten.gelu_backward.default(dy, x, approximate=approximate)
    grad = ce.graph.semantics.gelu_erf_grad if approximate == "none" else ce.graph.semantics.gelu_tanh_grad
    torch.testing.assert_close(dy * grad(x), want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("op,args", [
    (aten.silu_backward.default, "x"), (aten.sigmoid_backward.default, "y"),
    (aten.tanh_backward.default, "y"), (aten.threshold_backward.default, "relu"),
])
def test_activation_backwards(op, args):
    g = gen(7)
    dy, x = randn(g, 5, 7), randn(g, 5, 7)
    if args == "relu":
        gm = trace(lambda dy, x: op(dy, x, 0.0), dy, x)
    else:
        gm = trace(lambda dy, x: op(dy, x), dy, torch.sigmoid(x) if args == "y" else x)
    out = decompose(gm)
    assert op not in targets(out)
    same(gm, out, dy, x)


def test_mean_becomes_a_sum_and_a_division():
    g = gen(8)
    x = randn(g, 3, 4, 5)
    gm = trace(lambda x: [x.mean(-1, keepdim=True), x.mean([0, 1])], x)
    out = decompose(gm)
    assert aten.mean.dim not in targets(out)
    same(gm, out, x)


def _cross_entropy_joint(reduction: int):
    """Cross-entropy's forward and backward as AOTAutograd's joint graph has them (ignore_index -100)."""
    def fn(x, t, grad):
        logp = aten._log_softmax.default(x, 1, False)
        loss, total = aten.nll_loss_forward.default(logp, t, None, reduction, -100)
        dlogp = aten.nll_loss_backward.default(grad, logp, t, None, reduction, -100, total)
        return [loss, total, aten._log_softmax_backward_data.default(dlogp, logp, 1, torch.float64)]

    return fn


@pytest.mark.parametrize("reduction", [0, 1, 2])
def test_cross_entropy_reads_the_logits_not_the_log_probabilities(reduction):
    g = gen(9)
    x, grad = randn(g, 6, 10), randn(g, 6) if reduction == 0 else randn(g)
    t = torch.tensor([1, 9, -100, 0, 4, -100])

    gm = trace(_cross_entropy_joint(reduction), x, t, grad)
    out = decompose(gm)
    gone = {aten._log_softmax.default, aten.nll_loss_forward.default, aten.nll_loss_backward.default,
            aten._log_softmax_backward_data.default}
    assert not gone & set(targets(out))
    assert aten.logsumexp.default in targets(out)
    # the picked target is a row reduction of x itself, not of x - lse
    picks = [n for n in out.graph.nodes if n.target is aten.where.self and n.args[1].op == "placeholder"]
    assert picks and picks[0].args[1].name == "x_1"
    # the backward's row sum of nll_loss's gradient is the value each row holds: no reduction over the classes
    sums = [n for n in out.graph.nodes if n.target is aten.sum.dim_IntList]
    assert all(fx_util.shape(n.args[0]) != (6, 10) or (n.args[0].target is aten.where.self
               and n.args[0].args[1].op == "placeholder") for n in sums)
    same(gm, out, x, t, grad)


@pytest.mark.parametrize("reduction", [0, 1, 2])
def test_cross_entropy_gathers_the_target_where_no_epilogue_takes_the_logits(reduction):
    """On the "cuda" target, 10 classes (not a multiple of 8) are no GEMM's N: the picked logit is a gather (one
    element a row), not a row sum over where(onehot, x, 0), which the fallback would run as a pass over the
    logits (GPT-2's 50257, BERT's 30522), and the logsumexp is in the form Inductor computes in one pass (its
    online softmax: amax, sub, exp, sum); 16 classes keep the row reductions an epilogue takes."""
    g = gen(9)
    for classes, gathers in ((10, True), (16, False)):
        x, grad = randn(g, 6, classes), randn(g, 6) if reduction == 0 else randn(g)
        t = torch.tensor([1, 9, -100, 0, 4, -100])

        gm = trace(_cross_entropy_joint(reduction), x, t, grad)
        out = decompose(gm, "cuda")
        assert (aten.gather.default in targets(out)) == gathers
        # the logsumexp: one reduction an epilogue runs, or Inductor's online-softmax form (amax, sub, exp, sum)
        assert (aten.logsumexp.default in targets(out)) != gathers
        if gathers:
            top = next(n for n in out.graph.nodes if n.target is aten.amax.default)
            sub = next(u for u in top.users if u.target is aten.sub.Tensor)
            (e,) = sub.users
            (total,) = e.users
            assert top.args[1:] == ([1], True) and e.target is aten.exp.default
            assert total.target is aten.sum.dim_IntList and total.args[1:] == ([1], True)
        picks = [n for n in out.graph.nodes if n.target is aten.sum.dim_IntList
                 and fx_util.shape(n.args[0]) == (6, classes) and n.args[0].target is aten.where.self]
        assert len(picks) == (0 if gathers else 1)   # the forward's pick; the backward's row sum is none
        same(gm, out, x, t, grad)


def test_softmax_and_its_backward():
    g = gen(10)
    x, dy = randn(g, 4, 9), randn(g, 4, 9)

    def fn(x, dy):
        y = aten._softmax.default(x, -1, False)
        return [y, aten._softmax_backward_data.default(dy, y, -1, torch.float64)]

    gm = trace(fn, x, dy)
    out = decompose(gm)
    assert aten._softmax.default not in targets(out)
    same(gm, out, x, dy)


def test_dropout_with_p_zero_is_the_identity_and_other_dropout_stays():
    g = gen(11)
    x = randn(g, 4, 8)
    gm = trace(lambda x: [aten.native_dropout.default(x * 2, 0.0, True)[0],
                          aten.native_dropout.default(x, 0.5, True)[0]], x)
    out = decompose(gm)
    assert targets(out).count(aten.native_dropout.default) == 1     # p = 0.5 is random: left alone
    y0, y1 = run(out, x)
    torch.testing.assert_close(y0, x * 2)
    assert set(torch.unique(y1 / x).tolist()) <= {0.0, 2.0}


# --- fold -----------------------------------------------------------------------------------------

def test_fold_removes_identities_and_folds_constants():
    g = gen(12)
    x = randn(g, 3, 4)

    def fn(x):
        c = torch.ones_like(x) * 3.0 + 1.0                       # a constant: 4 everywhere
        y = x.detach().to(torch.float64).view(3, 4) * 1
        return [y * c, torch.zeros_like(x) + x]

    gm = trace(fn, x)
    out = fold(gm)
    ts = targets(out)
    assert aten.detach.default not in ts and aten.ones_like.default not in ts and aten.zeros_like.default not in ts
    fulls = [n for n in out.graph.nodes if n.target is aten.full.default]
    assert sorted(n.args[1] for n in fulls) == [0.0, 4.0]
    same(gm, out, x)


def test_fold_evaluates_constant_math_with_eager_type_promotion():
    gm = trace(lambda x: x + (torch.full([], 2.0, dtype=torch.float32) * 3), torch.zeros(2, dtype=torch.bfloat16))
    out = fold(gm)
    consts = [n for n in out.graph.nodes if n.target in (aten.full.default, aten.scalar_tensor.default)]
    assert len(consts) == 1 and consts[0].args[-1] == 6.0 if consts[0].target is aten.scalar_tensor.default \
        else consts[0].args[1] == 6.0
    x = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)
    assert run(out, x)[0].dtype == torch.bfloat16 and run(out, x)[0].tolist() == [7.0, 8.0]


# --- cse -----------------------------------------------------------------------------------------

def test_cse_merges_repeats_but_never_random_ops():
    g = gen(13)
    x, w = randn(g, 3, 4), randn(g, 5, 4)

    def fn(x, w):
        a = x @ w.t()
        b = x @ w.t()
        r1 = aten.native_dropout.default(x, 0.5, True)[0]
        r2 = aten.native_dropout.default(x, 0.5, True)[0]
        return [a + b, r1, r2]

    gm = trace(fn, x, w)
    out = cse(gm)
    assert targets(out).count(aten.mm.default) == 1 and targets(out).count(aten.t.default) == 1
    assert targets(out).count(aten.native_dropout.default) == 2
    torch.testing.assert_close(run(out, x, w)[0], 2 * (x @ w.t()))


def test_cse_keeps_int_and_float_arguments_apart():
    x = torch.arange(6).reshape(2, 3)
    gm = trace(lambda x: [x * 2, x * 2.0], x)
    out = cse(gm)
    a, b = run(out, x)
    assert a.dtype == torch.int64 and b.dtype == torch.float32


# --- layout -------------------------------------------------------------------------------------

@pytest.mark.parametrize("case,major", [("forward", "kk"), ("dx", "kn"), ("dw", "mn"), ("a_t", "mk")])
def test_transposes_become_operand_layouts(case, major):
    g = gen(14)
    x, w, dz, v = randn(g, 6, 4), randn(g, 5, 4), randn(g, 6, 5), randn(g, 5, 6)
    fns = {"forward": (lambda x, w, dz, v: x @ w.t()),          # a linear layer: x @ Wᵀ
           "dx": (lambda x, w, dz, v: dz @ w),                   # its dX GEMM
           "dw": (lambda x, w, dz, v: dz.t() @ x),               # its weight gradient
           "a_t": (lambda x, w, dz, v: x.t().t().t() @ v.t())}   # Aᵀ read in place (three transposes)
    gm = trace(fns[case], x, w, dz, v)
    out = layout(gm)
    gemms = [n for n in out.graph.nodes if n.target is GEMM]
    assert len(gemms) == 1 and gemms[0].args[2] == major
    assert aten.t.default not in targets(out) and aten.mm.default not in targets(out)
    assert all(a.op == "placeholder" for a in gemms[0].args[:2])
    same(gm, out, x, w, dz, v)


def test_a_transpose_pair_cancels():
    g = gen(15)
    x = randn(g, 3, 4)
    gm = trace(lambda x: x.t().t() + 1, x)
    out = layout(gm)
    assert aten.t.default not in targets(out)
    same(gm, out, x)


def test_the_pipeline_on_a_linear_gelu_layer():
    g = gen(16)
    x, w, b = randn(g, 2, 3, 4), randn(g, 5, 4), randn(g, 5)
    gm = trace(lambda x, w, b: F.gelu(F.linear(x, w, b)), x, w, b)
    out = passes.run(gm)
    assert GEMM in targets(out) and aten.addmm.default not in targets(out)
    assert [n.target for n in out.graph.nodes if n.target is operator.getitem] == []
    same(gm, out, x, w, b)


def test_decompositions_keep_the_partitioner_tag_of_the_op_they_replace():
    """Regression: the default partition runs every node after the last one tagged "is_forward" in the backward;
    the untagged nodes of a decomposed forward op (a log_softmax's logsumexp) after it were recomputed there (GPT-2's
    backward took a second pass over its fp32 logits). Every node a decomposition adds carries the tag of the op it
    replaces."""
    g = gen(11)
    x, t, grad = randn(g, 6, 10), torch.tensor([1, 9, -100, 0, 4, -100]), randn(g)

    gm = trace(_cross_entropy_joint(1), x, t, grad)
    for n in gm.graph.nodes:
        if n.op == "call_function":
            backward = "backward" in str(n.target)
            n.meta[fx_util.PARTITIONER_TAG] = "is_backward" if backward else "is_forward"
    for target in ("interpret", "cuda"):
        out = decompose(gm, target)
        tags = {n.meta.get(fx_util.PARTITIONER_TAG) for n in out.graph.nodes if n.op == "call_function"}
        assert tags == {"is_forward", "is_backward"}
        lse = [n for n in out.graph.nodes if n.target in (aten.logsumexp.default, aten.amax.default)]
        assert lse and all(n.meta[fx_util.PARTITIONER_TAG] == "is_forward" for n in lse)
