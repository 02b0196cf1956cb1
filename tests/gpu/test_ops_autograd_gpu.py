"""Autograd of the ready ops (linear_residual_norm, rms_linear, linear_swiglu, linear_swiglu_train,
qkv_rope) on an SM90 GPU: the gradients of every differentiable input through the registered backward
formulas (element-wise torch math + the coda_ext::linear_dx / coda_ext::weight_grad GEMMs) against
fp32 autograd of the op's reference, with the rule of docs/design.md: max error ≤ 2× the error of the same
math done and differentiated by PyTorch in bf16, plus a small floor. Forward and backward allocate
from a NaN-filled memory pool. Also: torch.library.opcheck with inputs that require grad (autograd
registration, AOT autograd with dynamic shapes), torch.compile(fullgraph=True) of forward + backward,
and the NotImplementedError of qkv_rope's backward with QK-norm.

Shapes: Llama-3-1B-like (d 2048, F 8192, 32/8 heads, head_dim 64), x of (2, 77, ·) and (333, ·).
The CPU tests of the same formulas (without kernels) are tests/unit/test_ops_autograd.py.
"""
from __future__ import annotations

import math
import os

import pytest
import torch
import torch.nn.functional as F

import coda_ext as ce
from coda_ext import ops
from coda_ext.ops import linear_grad, qkv, residual_norm, rms_scale, swiglu
from coda_ext.runtime import auto_items
from tests.helpers import rand
from tests.helpers.checks import assert_within_rule, nan_memory
from tests.helpers.references import ACTIVATIONS, EPS, THETA, qkv_in_dtype

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
D, FF, NH, NKV, HD = 2048, 8192, 32, 8, 64
NQKV = (NH + 2 * NKV) * HD
LEADS = ((2, 77), (333,))
BF16 = torch.bfloat16

#: (id, public function, its graph variant (module, graph args)) of each case; rms_linear and
#: linear_swiglu also run the variant their backward recomputes with.
CASES = {
    "linear_residual_norm": (residual_norm, (), (D, FF)),
    "rms_linear-none": (rms_scale, (None,), (FF, D)),
    "rms_linear-silu": (rms_scale, ("silu",), (FF, D)),
    "linear_swiglu": (swiglu, (True, False), (2 * FF, D)),
    "linear_swiglu_train": (swiglu, (True, True), (2 * FF, D)),
    "linear_swiglu_train-plain": (swiglu, (False, True), (2 * FF, D)),
    "qkv_rope": (qkv, (True, False, HD), (NQKV, D)),
    "qkv_rope-plain": (qkv, (False, False, HD), (NQKV, D)),
}
RECOMPUTE = {"rms_linear-silu": (rms_scale, (None,)), "linear_swiglu": (swiglu, (True, True))}
QK_NORM = (qkv, (True, True, HD))


def build_items(sms: int | None = None) -> list:
    """(graph, dtype, config) of every kernel these tests run: each forward variant, the variant a
    backward recomputes with, and the dX (layout kn) and weight-gradient (layout mn) GEMMs."""
    gemms = []
    for name, (module, variant, (n, k)) in CASES.items():
        for lead in LEADS:
            m = math.prod(lead)
            gemms.append((module.graph(*variant), "kk", (m, n, k)))
            if name in RECOMPUTE:
                rmod, rvar = RECOMPUTE[name]
                gemms.append((rmod.graph(*rvar), "kk", (m, n, k)))
            gemms.append((linear_grad.graph(False), "kn", (m, k, n)))     # dacc (M, N) @ W (N, K)
            gemms.append((linear_grad.graph(False), "mn", (n, k, m)))     # daccᵀ (N, M) @ x (M, K)
            if name == "qkv_rope":
                gemms.append((QK_NORM[0].graph(*QK_NORM[1]), "kk", (m, n, k)))
    return auto_items(gemms, "bfloat16", sms)


@pytest.fixture(scope="module", autouse=True)
def kernels():
    ce.prebuild(build_items(), jobs=os.cpu_count())



# --- the cases: inputs, the op, its fp32 reference, the same math in bf16 ----------------------------


class Case:
    """One op at one shape: differentiable inputs (bf16, rstd fp32), the op on them (public function),
    the fp32 reference and the PyTorch-in-bf16 version of the same math, and the outputs' cotangents."""

    def __init__(self, name: str, lead: tuple):
        self.name, self.lead = name, lead
        gen = rand.generator(name, lead, device=DEVICE)
        def r(*s, scale=1.0):
            return rand.randn(gen, *s, dtype=BF16, scale=scale)
        _, variant, (n, k) = CASES[name]
        rstd = rand.positive(gen, lead)
        x, w = r(*lead, k), r(n, k, scale=k ** -0.5)
        op = name.split("-")[0]
        if op == "linear_residual_norm":
            self.inputs = [x, w, r(*lead, n), r(n)]
            self.fused = lambda *t: ops.linear_residual_norm(*t, eps=EPS)
            self.ref = lambda *t: residual_norm.reference(*t, eps=EPS)
            self.in_dtype = self._residual_norm_bf16
            shapes = [(*lead, n), (*lead, n), lead]
        elif op == "rms_linear":
            act = variant[0]
            self.inputs = [x, w, rstd]
            self.fused = lambda *t: ops.rms_linear(*t, activation=act)
            self.ref = lambda *t: rms_scale.reference(*t, act)
            self.in_dtype = lambda xx, ww, rr: ACTIVATIONS[act](F.linear(xx, ww) * rr.to(BF16)[..., None])
            shapes = [(*lead, n)]
        elif op.startswith("linear_swiglu"):
            scaled, train = variant
            self.inputs = [x, w] + ([rstd] if scaled else [])
            fn = ops.linear_swiglu_train if train else ops.linear_swiglu
            self.fused = lambda *t: fn(*t)
            self.ref = lambda *t: swiglu.reference(*t) if train else swiglu.reference(*t)[0]
            self.in_dtype = lambda *t: self._swiglu_bf16(*t) if train else self._swiglu_bf16(*t)[0]
            shapes = [(*lead, n // 2)] + ([(*lead, n)] if train else [])
        else:
            scaled = variant[0]
            self.inputs = [x, w] + ([rstd] if scaled else [])
            pos = rand.indices(gen, lead, high=100_000)
            freqs = ops.rope_frequencies(HD, NH, NKV, theta=THETA, device=DEVICE)
            self.fused = lambda xx, ww, rr=None: ops.qkv_rope(xx, ww, pos, freqs, NH, NKV, rstd=rr)
            self.ref = lambda xx, ww, rr=None: qkv.reference(xx, ww, pos, NH, NKV, theta=THETA, rstd=rr)
            self.in_dtype = lambda xx, ww, rr=None: qkv_in_dtype(F.linear(xx, ww), pos, NH, NKV, THETA, rstd=rr)
            self.pos, self.freqs = pos, freqs
            shapes = [(*lead, n)]
        # cotangents: bf16 values (exact in fp32 too), one per output
        self.cot = [rand.randn(gen, s, dtype=BF16).float() for s in shapes]

    @staticmethod
    def _residual_norm_bf16(x, w, res, nw):
        out = F.linear(x, w) + res
        return out, out * nw, torch.rsqrt(out.pow(2).mean(-1) + EPS)

    @staticmethod
    def _swiglu_bf16(x, w, rstd=None):
        z = F.linear(x, w)
        if rstd is not None:
            z = z * rstd.to(BF16)[..., None]
        return F.silu(z[..., 0::2]) * z[..., 1::2], z

    @property
    def label(self) -> str:
        return f"{self.name} {'x'.join(map(str, self.lead))}"


def grads(fn, inputs, cot) -> list:
    """Gradients of Σ output·cotangent w.r.t. every input (fresh leaves)."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    outs = fn(*leaves)
    outs = outs if isinstance(outs, tuple) else (outs,)
    return list(torch.autograd.grad(outs, leaves, [c.to(o.dtype) for o, c in zip(outs, cot)]))


def check(label: str, got, ref, base, inputs, report) -> None:
    assert len(got) == len(ref) == len(base) == len(inputs), label
    for i, (g, r, b, t) in enumerate(zip(got, ref, base, inputs)):
        what = f"{label} grad[{i}]"
        assert g.shape == t.shape and g.dtype == t.dtype, f"{what}: {tuple(g.shape)} {g.dtype} for {t.dtype} input"
        assert_within_rule(what, g, r, b, report, "torch_bf16_err", "PyTorch in bf16")


def reference_grads(case: Case) -> tuple[list, list]:
    """(fp32 reference gradients, PyTorch-in-bf16 gradients) of a case."""
    ref = grads(case.ref, [t.float() for t in case.inputs], case.cot)
    base = grads(case.in_dtype, case.inputs, case.cot)
    return ref, base


@pytest.mark.parametrize("lead", LEADS, ids=lambda lead: "x".join(map(str, lead)))
@pytest.mark.parametrize("name", list(CASES))
def test_gradients_match_reference(name, lead, report):
    case = Case(name, lead)
    grads(case.fused, case.inputs, case.cot)           # loads the kernels (and rope_backward's fused pass)
    with nan_memory():
        got = grads(case.fused, case.inputs, case.cot)
    torch.cuda.synchronize()
    check(case.label, got, *reference_grads(case), case.inputs, report)


@pytest.mark.parametrize("name", list(CASES))
def test_compile_fullgraph_backward(name, report):
    """torch.compile(fullgraph=True) of the op and its backward (the GEMMs opaque custom ops, the
    element-wise math compiled): no graph break, gradients within the same tolerance."""
    case = Case(name, (2, 77))
    torch._dynamo.reset()
    compiled = torch.compile(case.fused, fullgraph=True)
    got = grads(compiled, case.inputs, case.cot)
    torch.cuda.synchronize()
    check(case.label + " compiled", got, *reference_grads(case), case.inputs, report)


def _custom_op_args(case: Case) -> tuple[str, list, list]:
    """(custom op name, its arguments on 2-D rows as the public function passes them, indices of the
    differentiable ones)."""
    rows = [t.reshape(-1, t.shape[-1]) if t.dim() == len(case.lead) + 1 else t for t in case.inputs]
    op = case.name.split("-")[0]
    if op == "linear_residual_norm":
        return op, rows + [EPS], [0, 1, 2, 3]
    if op == "rms_linear":
        return op, rows[:2] + [rows[2].reshape(-1), CASES[case.name][1][0] or ""], [0, 1, 2]
    if op.startswith("linear_swiglu"):
        rstd = rows[2].reshape(-1) if len(rows) > 2 else None
        return op, rows[:2] + [rstd], [0, 1] + ([2] if rstd is not None else [])
    rstd = rows[2].reshape(-1) if len(rows) > 2 else None
    return op, [rows[0], rows[1], case.pos.reshape(-1).float(), case.freqs, rstd, None, None, NH, NKV, EPS], \
        [0, 1] + ([4] if rstd is not None else [])


@pytest.mark.parametrize("name", list(CASES))
def test_opcheck_with_gradients(name):
    """torch.library.opcheck of the custom op with inputs that require grad: the autograd registration,
    and AOT autograd (dynamic shapes) giving eager mode's outputs and gradients. qkv_rope's eager
    backward runs rope_backward's fused (torch.compile) pass, which a trace cannot enter, so its traced
    backward computes the same math unfused, rounding differently: its AOT check runs without gradients
    (test_compile_fullgraph_backward checks its traced gradients against the reference)."""
    case = Case(name, (2, 77))
    op, args, diff = _custom_op_args(case)
    for i in diff:
        args[i] = args[i].detach().clone().requires_grad_()
    overload = getattr(torch.ops.coda_ext, op).default
    utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    if op == "qkv_rope":
        torch.library.opcheck(overload, tuple(args), test_utils=utils)
        plain = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
        torch.library.opcheck(overload, tuple(plain), test_utils=("test_aot_dispatch_dynamic",))
    else:
        torch.library.opcheck(overload, tuple(args), test_utils=utils + ("test_aot_dispatch_dynamic",))


@pytest.mark.parametrize("lead", LEADS, ids=lambda lead: "x".join(map(str, lead)))
def test_qkv_rope_qk_norm_gradients(lead, report):
    """QK-norm (per-head RMSNorm of Q and K before RoPE): gradients of x, the weight, rstd and both norm
    weights against the fp32 reference, within the rule of docs/design.md against PyTorch in bf16."""
    case = Case("qkv_rope", lead)
    gen = rand.generator("qk-norm", lead, device=DEVICE)
    qw, kw = rand.positive(gen, HD, dtype=BF16), rand.positive(gen, HD, dtype=BF16)
    rstd = rand.positive(gen, lead)
    x, w = case.inputs[:2]
    pos, freqs = case.pos, case.freqs

    def fused(xx, ww, q, k, rr):
        return ops.qkv_rope(xx, ww, pos, freqs, NH, NKV, rstd=rr, q_norm_weight=q, k_norm_weight=k, eps=EPS)

    def ref(xx, ww, q, k, rr):
        return qkv.reference(xx, ww, pos, NH, NKV, theta=THETA, rstd=rr, q_norm_weight=q, k_norm_weight=k, eps=EPS)

    def in_bf16(xx, ww, q, k, rr):
        return qkv_in_dtype(F.linear(xx, ww), pos, NH, NKV, THETA, rstd=rr, q_norm_weight=q, k_norm_weight=k,
                            eps=EPS)

    inputs = [x, w, qw, kw, rstd]
    cot = [rand.randn(gen, *lead, w.shape[0], dtype=BF16).float()]
    grads(fused, inputs, cot)
    with nan_memory():
        got = grads(fused, inputs, cot)
    torch.cuda.synchronize()
    want = grads(ref, [t.float() for t in inputs[:4]] + [rstd], cot)
    base = grads(in_bf16, inputs, cot)
    check(f"qkv_rope QK-norm {'x'.join(map(str, lead))}", got, want, base, inputs, report)
