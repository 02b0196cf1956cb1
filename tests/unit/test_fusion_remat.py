"""fusion/passes/remat.py on hand-written joint graphs (a forward, and a backward reading a tangent): which forward
values the backward recomputes, that it computes the same values, that the copies count as backward, and that a
16-bit leaf is read rounded by the forward's math too."""
from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from coda_ext.fusion import aten_ir, fx_util
from coda_ext.fusion.analyze import analyze
from coda_ext.fusion.passes import remat

aten = torch.ops.aten
C, K = 0.7978845608, 0.044715


def gelu_tanh_joint(a, w1, w2, tangents_1):
    """GPT-2's GELU written out, and its backward as autograd writes it: the backward reads t, x and 1 + t."""
    x = a @ w1.t()
    t = torch.tanh(C * (x + K * x * x * x))
    one_t = 1 + t
    y = 0.5 * x * one_t
    out = y @ w2.t()
    dy = tangents_1 @ w2
    g = dy * x * 0.5
    gu = (g - g * t * t) * C                      # tanh's backward reads t
    dx = dy * one_t * 0.5 + gu + gu * (3 * K) * x * x
    return [out, dx.t() @ a]


def _args(dtype=torch.float32, seed=0):   # epilogue math is fp32 (fp64 graphs are not fused)
    g = torch.Generator().manual_seed(seed)
    shapes = ((6, 8), (16, 8), (8, 16), (6, 8))
    return [torch.randn(s, generator=g, dtype=torch.float64).to(dtype) for s in shapes]


def _trace(fn, args):
    return make_fx(fn, tracing_mode="fake")(*args)


def _read_by_backward(gm) -> set:
    """Forward values (not recomputed copies) a backward node or copy reads."""
    bw = fx_util.tangent_dependent(gm) | {n for n in gm.graph.nodes if n.meta.get(fx_util.RECOMPUTED)}
    return {n for n in gm.graph.nodes if n.op != "output" and n not in bw and any(u in bw for u in n.users)}


def _math_read(gm) -> list:
    return [n for n in _read_by_backward(gm) if n.op == "call_function" and n.target in aten_ir.MATH]


def test_the_backward_recomputes_an_activation_from_its_gemm_output():
    args = _args()
    gm = _trace(gelu_tanh_joint, args)
    assert len(_math_read(gm)) >= 2                     # t and 1 + t cross to the backward
    out = remat(gm)
    assert _math_read(out) == []                        # only the GEMM output x (and a, w2) cross now
    assert any(n.target is aten.mm.default for n in _read_by_backward(out))
    copies = [n for n in out.graph.nodes if n.meta.get(fx_util.RECOMPUTED)]
    assert copies and all(fx_util.PARTITIONER_TAG not in n.meta for n in copies)
    assert any(n.target is aten.tanh.default for n in copies)
    for got, want in zip(out(*args), gm(*args), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    an = analyze(out, "interpret", forward_outputs=1)
    flags = {an.fx_nodes[i]: (an.pgraph[i].forward, an.pgraph[i].backward) for i in range(len(an.fx_nodes))}
    assert all(flags[n] == (False, True) for n in copies if n in flags)   # backward to the partitioner
    assert remat(gm).graph.python_code("self").src == out.graph.python_code("self").src   # deterministic, pure
    assert _math_read(gm)                               # the input graph is left as it was


def test_a_16_bit_leaf_is_read_rounded_by_the_forward_math_too():
    """The backward recomputes from x as stored (bf16); the forward's GELU reads x through a conversion marked
    ROUNDED (an epilogue's cast), so both evaluate at the same x."""
    args = _args(torch.bfloat16)
    out = remat(_trace(gelu_tanh_joint, args))
    rounded = [n for n in out.graph.nodes if n.meta.get(fx_util.ROUNDED)]
    assert len(rounded) == 1 and rounded[0].target is aten._to_copy.default
    assert rounded[0].args[0].target is aten.mm.default and fx_util.dtype(rounded[0]) == torch.bfloat16
    forward_readers = list(rounded[0].users)
    assert forward_readers and not any(u.meta.get(fx_util.RECOMPUTED) for u in forward_readers)
    assert aten_ir.MATH[aten._to_copy.default].check(rounded[0]) is None


def test_what_does_not_pay_or_cannot_be_recomputed_stays():
    """A product of two GEMM outputs (two full-size tensors to keep for one), an exp (its argument's rounding
    amplified) and a value a backward GEMM reads as its operand are kept as they are."""
    def joint(a, w1, w2, tangents_1):
        x1, x2 = a @ w1.t(), a @ w2.t()
        p = x1 * x2
        e = torch.exp(x1 * 0.5)
        s = x1 * 2.0
        out = p + e + s
        return [out, (tangents_1 * p * e).t() @ a, s.t() @ tangents_1]

    g = torch.Generator().manual_seed(1)
    args = [torch.randn(s, generator=g) for s in ((6, 8), (16, 8), (16, 8), (6, 16))]
    gm = _trace(joint, args)
    out = remat(gm)
    assert not any(n.meta.get(fx_util.RECOMPUTED) for n in out.graph.nodes)
    assert {n.target for n in _math_read(out)} >= {aten.mul.Tensor, aten.exp.default}


def _bf16(*shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).to(torch.bfloat16) for s in shapes]


def test_groups_sharing_a_leaf_copy_forward_nodes_not_their_rounded_reads():
    """Regression: a later group copied forward nodes an earlier group had already rewired to read its rounded
    leaf, so the backward read the rounded copy as well as the leaf (two full-size tensors kept for one)."""
    def joint(a, w1, w2, tangents_1):
        h, k = a @ w1.t(), a @ w2.t()
        v1a, v1b = h * 2.0, h * 3.0                  # leaves {h}
        v2, v3, v4 = v1a + k, v1b * k, v1a - k       # leaves {h, k}
        out = v1a + v1b + v2 + v3 + v4
        return [out, (tangents_1 * v1a * v1b * v2 * v3 * v4).t() @ a]

    out = remat(_trace(joint, _bf16((6, 8), (16, 8), (16, 8), (6, 16))))
    read = _read_by_backward(out)
    assert not any(n.meta.get(fx_util.ROUNDED) for n in read)
    assert sum(n.target is aten.mm.default for n in read) == 2
    copies = [n for n in out.graph.nodes if n.meta.get(fx_util.RECOMPUTED)]
    assert not any(a.meta.get(fx_util.ROUNDED) for n in copies for a in n.all_input_nodes)


def test_each_copy_goes_before_its_own_first_reader():
    """Regression: a group's copies all went before its earliest backward reader, which could precede a leaf of
    another member (a row maximum computed after it): the graph read a node before defining it."""
    def joint(a, w1, tangents_1):
        x = a @ w1.t()
        s1, s2 = x * 2.0, x * 3.0
        g1 = tangents_1 * s1                        # the first backward reader
        r = x.amax(-1, keepdim=True)                # a small leaf defined after it
        s3 = x * r
        return [s1 + s2 + s3, (g1 * s2 * s3).t() @ a]

    g = torch.Generator().manual_seed(2)
    args = [torch.randn(s, generator=g) for s in ((6, 8), (16, 8), (6, 16))]
    gm = _trace(joint, args)
    out = remat(gm)
    out.graph.lint()
    assert any(n.meta.get(fx_util.RECOMPUTED) for n in out.graph.nodes)
    for got, want in zip(out(*args), gm(*args), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_the_rewrite_is_deterministic_with_two_rounded_leaves():
    """Regression: the leaves were visited in set order (object ids): node names changed from call to call."""
    def joint(a, w1, w2, tangents_1):
        x1, x2 = a @ w1.t(), a @ w2.t()
        s1, s2, s3 = x1 * x2, x1 + x2, x1 - x2
        return [s1 + s2 + s3, (tangents_1 * s1 * s2 * s3).t() @ a]

    gm = _trace(joint, _bf16((6, 8), (16, 8), (16, 8), (6, 16)))
    codes = {remat(gm).graph.python_code("self").src for _ in range(8)}
    assert len(codes) == 1
    rounded = [n for n in remat(gm).graph.nodes if n.meta.get(fx_util.ROUNDED)]
    assert [n.args[0].name for n in rounded] == sorted(n.args[0].name for n in rounded)


def test_an_input_leaf_is_not_rounded_a_computed_one_is():
    """A graph input is exact in its dtype: no rounding between it and the forward math; a value computed in the
    step (here a GEMM output plus a bias, read through a view, as GPT-2's Conv1D makes it) is read rounded
    (regression: only bare GEMM outputs were, and GPT-2's gradients broke the rule again)."""
    def joint(a, b, tangents_1):
        u, v = a * 2.0, a * 3.0
        return [u + v, tangents_1 * u * v]

    out = remat(_trace(joint, _bf16((6, 8), (8,), (6, 8))))
    assert any(n.meta.get(fx_util.RECOMPUTED) for n in out.graph.nodes)
    assert not any(n.meta.get(fx_util.ROUNDED) for n in out.graph.nodes)

    def joint_bias(a, w, b, tangents_1):
        x = (a @ w.t() + b).view(2, 3, 16)
        u, v = x * 2.0, x * 3.0
        return [u + v, tangents_1 * u * v]

    out = remat(_trace(joint_bias, _bf16((6, 8), (16, 8), (16,), (2, 3, 16))))
    rounded = [n for n in out.graph.nodes if n.meta.get(fx_util.ROUNDED)]
    assert len(rounded) == 1 and rounded[0].args[0].target is aten.view.default


def loss_joint(a, w, target_rows, tangents_1):
    """A causal LM's loss as the decomposed joint graph has it: the 16-bit logits (returned), an fp32 copy reshaped,
    log-probabilities x - lse for the loss and, tagged as the default partition places them, their exp read by the
    backward."""
    logits = (a @ w.t()).view(2, 3, 10)
    x = logits.float().view(6, 10)
    lse = torch.logsumexp(x, 1, keepdim=True)
    logp = x - lse
    loss = -(logp * target_rows).sum()
    grad = (torch.exp(logp) * tangents_1.sum() - target_rows * tangents_1.sum()).to(a.dtype)
    return [loss, logits, grad.t() @ a]


def _tag_by_placement(gm, backward_from: str) -> None:
    """AOTAutograd's tags: nodes before the first one whose name starts with backward_from are forward."""
    tag = "is_forward"
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        if n.name.startswith(backward_from):
            tag = "is_backward"
        n.meta[fx_util.PARTITIONER_TAG] = tag


def test_the_log_probabilities_of_returned_16_bit_logits_are_recomputed_not_kept():
    """The backward's exp(x - lse) reads x - lse of an fp32 copy of the bf16 logits the forward returns anyway: kept,
    that is an fp32 tensor of the logits' size (GPT-2's 3.3 GB); recomputed, the backward widens the logits again
    (exact) and reads one value a row. The backward is what the default partition places there (its tags), though
    exp(x - lse) depends on no tangent."""
    g = torch.Generator().manual_seed(5)
    a = torch.randn(6, 8, generator=g).to(torch.bfloat16)
    w = torch.randn(10, 8, generator=g).to(torch.bfloat16)
    rows = torch.nn.functional.one_hot(torch.tensor([1, 9, 0, 4, 2, 3]), 10).float()
    args = [a, w, rows, torch.ones(6, 10)]
    gm = _trace(loss_joint, args)
    _tag_by_placement(gm, "exp")
    backward = fx_util.backward_part(gm)
    fp32_kept = [n for n in gm.graph.nodes if n.op == "call_function" and n not in backward
                 and fx_util.dtype(n) == torch.float32
                 and fx_util.shape(n) == (6, 10) and any(u in backward for u in n.users)]
    assert fp32_kept                                    # x - lse crosses to the backward
    out = remat(gm)
    backward = fx_util.backward_part(out)
    assert not [n for n in out.graph.nodes if n.op == "call_function" and n not in backward
                and fx_util.dtype(n) == torch.float32 and fx_util.shape(n) == (6, 10)
                and any(u in backward for u in n.users)]
    copies = [n for n in out.graph.nodes if n.meta.get(fx_util.RECOMPUTED)]
    assert any(aten_ir.is_widening(n) for n in copies)
    for got, want in zip(out(*args), gm(*args), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
