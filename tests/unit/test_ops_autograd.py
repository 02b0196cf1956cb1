"""Autograd of the ready ops (coda_ext.ops: linear_residual_norm, rms_linear, linear_swiglu,
linear_swiglu_train, qkv_rope) on the CPU, without a kernel: the backward formulas.

The custom ops need an SM90 GPU, so here each one involved (the forward ops and the backward GEMMs
coda_ext::linear_dx and coda_ext::weight_grad) gets, for the duration of a test only, a CPU kernel
that runs its module's fp32 reference (torch.library.impl(..., lib=) on a Library that the fixture
drops afterwards; the fixture checks that no CPU kernel is left behind). The custom ops are then
called directly on fp32 rows (the public functions accept 16-bit dtypes only), and
torch.autograd.grad through them (the registered backward formulas calling linear_dx and
weight_grad) is compared with torch autograd through the same fp32 reference math, tightly.
A last group calls the public functions on bf16 (..., K) inputs: gradients reach every input with
its shape and dtype, within bf16 rounding of the fp32 answer.
"""
from __future__ import annotations

import gc
import math
import types

import pytest
import torch
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd

from coda_ext import ops
from coda_ext.ops import common, linear_grad, norm_backward, qkv, residual_norm, rms_scale, swiglu, swiglu_backward
from tests.helpers import rand

F32, BF16 = torch.float32, torch.bfloat16
K, N, F2, M = 64, 72, 144, 37          # x (M, K); N output columns; F2 interleaved gate/up rows; odd M
HEADS = {64: (4, 2), 128: (2, 1)}      # head_dim -> (n_heads, n_kv_heads)
THETA = 500000.0
EPS = 1e-5


# --- CPU kernels: each custom op runs its module's fp32 reference ----------------------------------


def _inv_freq(freqs: torch.Tensor, head_dim: int) -> torch.Tensor:
    """The radians-per-position frequencies of a rope_frequencies table (its first head's pairs), fp64."""
    turns = freqs[0, 0:head_dim:2].double() + freqs[1, 0:head_dim:2].double()
    return turns * (2 * math.pi)


def _qkv_rope_kernel(x, weight, positions, freqs, rstd, norm_a, norm_b, n_heads, n_kv_heads, eps):
    hd = weight.shape[0] // (n_heads + 2 * n_kv_heads)
    qw = kw = None
    if norm_b is not None:
        qw, kw = norm_b[:hd], norm_b[n_heads * hd:(n_heads + 1) * hd]
    out = qkv.reference(x, weight, positions, n_heads, n_kv_heads, inv_freq=_inv_freq(freqs, hd), rstd=rstd,
                        q_norm_weight=qw, k_norm_weight=kw, eps=eps)
    return out.to(x.dtype)


def _residual_norm_kernel(x, weight, residual, norm_weight, eps):
    out, h, rstd = residual_norm.reference(x, weight, residual, norm_weight, eps)
    return out.to(x.dtype), h.to(x.dtype), rstd


def _swiglu_train_kernel(x, weight, rstd):
    y, z = swiglu.reference(x, weight, rstd)
    return y.to(x.dtype), z.to(x.dtype)


KERNELS = {
    "linear_residual_norm": _residual_norm_kernel,
    "rms_linear": lambda x, w, rstd, act: rms_scale.reference(x, w, rstd, act or None).to(x.dtype),
    "linear_swiglu": lambda x, w, rstd: _swiglu_train_kernel(x, w, rstd)[0],
    "linear_swiglu_train": _swiglu_train_kernel,
    "qkv_rope": _qkv_rope_kernel,
    "linear_dx": lambda dz, w: linear_grad.reference_linear_dx(dz, w).to(dz.dtype),
    "weight_grad": lambda dz, x, acc, scale=None: linear_grad.reference_weight_grad(dz, x, acc, scale).to(dz.dtype),
    "linear_residual": lambda x, w, r: linear_grad.reference_linear_residual(x, w, r).to(x.dtype),
    "rms_norm_backward_linear": lambda *a: _cast_first(norm_backward.reference(*a), 2),
    "swiglu_backward_linear": lambda *a: _cast_first(swiglu_backward.reference(*a), 2),
    "swiglu_backward_linear_": lambda dy, w, z: _swiglu_backward_over_z(dy, w, z),
}


def _swiglu_backward_over_z(dy, w, z):
    dz, y, zdz = swiglu_backward.reference(dy, w, z)
    z.copy_(dz)
    return y.to(dy.dtype), zdz


def _cast_first(outs, n):
    """The first n outputs in the 16-bit dtype of the op (the rest stay fp32), as the kernels return them."""
    return tuple(o.to(torch.bfloat16) if i < n else o for i, o in enumerate(outs))


def _has_cpu_kernel(name: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"coda_ext::{name}", "CPU")


@pytest.fixture
def reference_kernels(monkeypatch):
    """Each custom op of KERNELS runs its fp32 reference on CPU tensors, for this test only. The fakes'
    checks of what a kernel takes (common.check_gemm: 16-bit operands, strides) are off meanwhile: the
    references take the fp32 rows these tests call the custom ops with."""
    monkeypatch.setattr(common, "check_gemm", lambda *args, **kwargs: None)
    assert not any(map(_has_cpu_kernel, KERNELS)), "a CPU kernel leaked in from elsewhere"
    lib = torch.library.Library("coda_ext", "FRAGMENT")
    calls = []
    for name, fn in KERNELS.items():
        def kernel(*args, _name=name, _fn=fn):
            calls.append(_name)
            return _fn(*args)
        torch.library.impl(f"coda_ext::{name}", "cpu", kernel, lib=lib)
    yield calls
    del lib, kernel   # the registrations live as long as the Library
    gc.collect()
    assert not any(map(_has_cpu_kernel, KERNELS)), "a CPU kernel outlived its test"


# --- inputs and helpers -----------------------------------------------------------------------------


_gen, _randn = rand.generator, rand.randn


def _rstd(gen, m=M):
    return rand.positive(gen, m)


def _leaves(*tensors):
    return [t.detach().clone().requires_grad_() if t is not None else None for t in tensors]


def _grads(fn, inputs: list, cotangents) -> list:
    """torch.autograd.grad of fn(*inputs)'s outputs (with the given cotangents; None: that output
    does not reach the loss) with respect to every input that requires grad."""
    outs = fn(*inputs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    pairs = [(o, c.to(o.dtype)) for o, c in zip(outs, cotangents) if c is not None]
    wrt = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    return list(torch.autograd.grad([o for o, _ in pairs], wrt, [c for _, c in pairs], materialize_grads=True))


def _close(got: torch.Tensor, want: torch.Tensor, what: str, rtol: float = 1e-5) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, (what, got.shape, want.shape, got.dtype, want.dtype)
    scale = max(1.0, want.abs().max().item())
    torch.testing.assert_close(got.double(), want.double(), rtol=rtol, atol=rtol * scale,
                               msg=lambda m: f"{what}: {m}")


def _check(got: list, want: list, names: tuple, rtol: float = 1e-5) -> None:
    assert len(got) == len(want) == len(names)
    for g, w, name in zip(got, want, names):
        _close(g, w, name, rtol)


def _cot(gen, *shapes):
    return [None if s is None else _randn(gen, *s) for s in shapes]


# --- the backward formulas in fp32 against torch autograd of the references ---------------------------

# which of (out, h, rstd) reach the loss: all, each alone, and pairs
RN_USES = [(1, 1, 1), (1, 0, 0), (0, 1, 0), (0, 0, 1), (0, 1, 1), (1, 1, 0)]


@pytest.mark.parametrize("uses", RN_USES, ids=lambda u: "".join(n for n, on in zip(("out", "h", "rstd"), u) if on))
def test_linear_residual_norm_grads(reference_kernels, uses):
    gen = _gen("rn", uses)
    x, w, res, nw = _randn(gen, M, K), _randn(gen, N, K, scale=K ** -0.5), _randn(gen, M, N), _randn(gen, N)
    cot = _cot(gen, *[s if on else None for s, on in zip(((M, N), (M, N), (M,)), uses)])
    leaves = _leaves(x, w, res, nw)
    got = _grads(lambda *a: torch.ops.coda_ext.linear_residual_norm(*a, EPS), leaves, cot)
    want = _grads(lambda *a: residual_norm.reference(*a, eps=EPS), _leaves(x, w, res, nw), cot)
    _check(got, want, ("dx", "dweight", "dresidual", "dnorm_weight"))
    assert {"linear_dx", "weight_grad"} <= set(reference_kernels)


@pytest.mark.parametrize("activation", list(rms_scale.ACTIVATIONS))
def test_rms_linear_grads(reference_kernels, activation):
    gen = _gen("rms", activation)
    x, w, rstd = _randn(gen, M, K), _randn(gen, N, K, scale=K ** -0.5), _rstd(gen)
    cot = _cot(gen, (M, N))
    got = _grads(lambda *a: torch.ops.coda_ext.rms_linear(*a, activation or ""), _leaves(x, w, rstd), cot)
    want = _grads(lambda *a: rms_scale.reference(*a, activation), _leaves(x, w, rstd), cot)
    _check(got, want, ("dx", "dweight", "drstd"))
    # pre-activation: the saved output without an activation, else recomputed by the op (activation "")
    assert reference_kernels.count("rms_linear") == (1 if activation is None else 2)


@pytest.mark.parametrize("scaled", [False, True], ids=["plain", "rstd"])
def test_linear_swiglu_grads(reference_kernels, scaled):
    gen = _gen("swiglu", scaled)
    x, w = _randn(gen, M, K), _randn(gen, F2, K, scale=K ** -0.5)
    rstd = _rstd(gen) if scaled else None
    cot = _cot(gen, (M, F2 // 2))
    got = _grads(torch.ops.coda_ext.linear_swiglu, _leaves(x, w, rstd), cot)
    want = _grads(lambda *a: swiglu.reference(*a)[0], _leaves(x, w, rstd), cot)
    _check(got, want, ("dx", "dweight", "drstd")[:3 if scaled else 2])
    assert reference_kernels.count("linear_swiglu_train") == 1   # z recomputed in backward, not saved


@pytest.mark.parametrize("uses", [(1, 0), (1, 1), (0, 1)], ids=["y", "y+z", "z"])
@pytest.mark.parametrize("scaled", [False, True], ids=["plain", "rstd"])
def test_linear_swiglu_train_grads(reference_kernels, scaled, uses):
    gen = _gen("swiglu-train", scaled, uses)
    x, w = _randn(gen, M, K), _randn(gen, F2, K, scale=K ** -0.5)
    rstd = _rstd(gen) if scaled else None
    cot = _cot(gen, (M, F2 // 2) if uses[0] else None, (M, F2) if uses[1] else None)
    got = _grads(torch.ops.coda_ext.linear_swiglu_train, _leaves(x, w, rstd), cot)
    want = _grads(swiglu.reference, _leaves(x, w, rstd), cot)
    _check(got, want, ("dx", "dweight", "drstd")[:3 if scaled else 2])
    assert reference_kernels.count("linear_swiglu_train") == 1   # the forward only: z was saved


def _qkv_inputs(gen, head_dim, m=M, dtype=F32):
    nh, nkv = HEADS[head_dim]
    x, w = _randn(gen, m, K, dtype=dtype), _randn(gen, (nh + 2 * nkv) * head_dim, K, dtype=dtype, scale=K ** -0.5)
    pos = torch.randint(0, 100_000, (m,), generator=gen)
    pos[-1] = 100_000
    return x, w, pos, ops.rope_frequencies(head_dim, nh, nkv, theta=THETA), nh, nkv


@pytest.mark.parametrize("scaled", [False, True], ids=["plain", "rstd"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_qkv_rope_grads(reference_kernels, head_dim, scaled):
    gen = _gen("qkv", head_dim, scaled)
    x, w, pos, freqs, nh, nkv = _qkv_inputs(gen, head_dim)
    rstd = _rstd(gen) if scaled else None
    cot = _cot(gen, (M, w.shape[0]))
    pos32 = pos.to(F32)

    def op(x_, w_, r_):
        return torch.ops.coda_ext.qkv_rope(x_, w_, pos32, freqs, r_, None, None, nh, nkv, EPS)

    def ref(x_, w_, r_):
        return qkv.reference(x_, w_, pos, nh, nkv, theta=THETA, rstd=r_)

    got = _grads(op, _leaves(x, w, rstd), cot)
    want = _grads(ref, _leaves(x, w, rstd), cot)
    _check(got, want, ("dx", "dweight", "drstd")[:3 if scaled else 2])


@pytest.mark.parametrize("scaled", [False, True], ids=["plain", "rstd"])
def test_qkv_rope_qk_norm_grads(reference_kernels, scaled):
    """QK-norm: gradients of x, the weight, rstd and both norm weights (through qk_norm_vectors)
    against torch autograd of the fp32 reference."""
    gen = _gen("qkv-qknorm", scaled)
    x, w, pos, freqs, nh, nkv = _qkv_inputs(gen, 64)
    rstd = _rstd(gen) if scaled else None
    qw, kw = _randn(gen, 64) + 1.0, _randn(gen, 64) + 1.0
    cot = _cot(gen, (M, w.shape[0]))
    pos32 = pos.to(F32)

    def op(x_, w_, qw_, kw_, r_=None):
        a, b = qkv.qk_norm_vectors(qw_, kw_, nh, nkv)
        return torch.ops.coda_ext.qkv_rope(x_, w_, pos32, freqs, r_, a, b, nh, nkv, EPS)

    def ref(x_, w_, qw_, kw_, r_=None):
        return qkv.reference(x_, w_, pos, nh, nkv, theta=THETA, rstd=r_, q_norm_weight=qw_, k_norm_weight=kw_,
                             eps=EPS)

    leaves = (x, w, qw, kw) + ((rstd,) if scaled else ())
    got = _grads(op, _leaves(*leaves), cot)
    want = _grads(ref, _leaves(*leaves), cot)
    _check(got, want, ("dx", "dweight", "dq_norm", "dk_norm", "drstd")[:len(leaves)])


# --- what backward is asked for: only the inputs that need a gradient --------------------------------


def test_only_requested_gradients_are_computed(reference_kernels):
    """x alone needs a gradient: no weight-gradient GEMM runs; the weight alone: no dX GEMM; rstd alone:
    neither (the rstd gradient is a row sum)."""
    gen = _gen("requested")
    x, w, rstd = _randn(gen, M, K), _randn(gen, N, K, scale=K ** -0.5), _rstd(gen)
    for wanted, gemms in ((0, ["linear_dx"]), (1, ["weight_grad"]), (2, [])):
        leaves = [t.detach().clone().requires_grad_(i == wanted) for i, t in enumerate((x, w, rstd))]
        out = torch.ops.coda_ext.rms_linear(*leaves, "silu")
        reference_kernels.clear()
        (grad,) = torch.autograd.grad(out, leaves[wanted], torch.ones_like(out))
        assert [c for c in reference_kernels if c in ("linear_dx", "weight_grad")] == gemms
        assert grad.shape == leaves[wanted].shape


def test_non_differentiable_arguments_get_no_gradient(reference_kernels):
    """positions and freqs of qkv_rope never get a gradient (None), even when they require one."""
    gen = _gen("nondiff")
    x, w, pos, freqs, nh, nkv = _qkv_inputs(gen, 64)
    x, pos32, freqs = _leaves(x, pos.to(F32), freqs)
    out = torch.ops.coda_ext.qkv_rope(x, w, pos32, freqs, None, None, None, nh, nkv, EPS)
    dx, dpos, dfreqs = torch.autograd.grad(out.sum(), (x, pos32, freqs), allow_unused=True)
    assert dx is not None and dpos is None and dfreqs is None


def test_backward_formulas_take_absent_gradients_as_zero(reference_kernels):
    """linear_residual_norm's backward called directly: an absent output gradient (None, as autograd
    passes for an output that does not reach the loss) gives what a zero gradient gives."""
    gen = _gen("none-grads")
    x, w, res, nw = _randn(gen, M, K), _randn(gen, N, K, scale=K ** -0.5), _randn(gen, M, N), _randn(gen, N)
    out, _, rstd = residual_norm.reference(x, w, res, nw, EPS)
    ctx = types.SimpleNamespace(saved_tensors=(x, w, out, rstd, nw), needs_input_grad=(True,) * 4 + (False,))
    given = (_randn(gen, M, N), _randn(gen, M, N), _randn(gen, M))
    zeros = (torch.zeros(M, N), torch.zeros(M, N), torch.zeros(M))
    for present in RN_USES:
        got = residual_norm._backward(ctx, *[g if on else None for g, on in zip(given, present)])
        want = residual_norm._backward(ctx, *[g if on else z for g, z, on in zip(given, zeros, present)])
        for name, a, b in zip(("dx", "dweight", "dresidual"), got[:3], want[:3]):
            _close(a, b, f"{present} {name}")
        if present[1]:
            _close(got[3], want[3], f"{present} dnorm_weight")
        else:
            assert got[3] is None   # no gradient of h: none of γ


# --- torch.compile(fullgraph=True) of forward and backward -------------------------------------------


def _compiled_grads(fn, inputs, cot):
    """Gradients through torch.compile(fullgraph=True, dynamic=True) with AOT autograd (forward and
    backward graphs traced, run as traced), and the call targets of each graph."""
    graphs = []

    def keep(gm, example_inputs):
        graphs.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        return make_boxed_func(gm)

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, dynamic=True, backend=aot_autograd(fw_compiler=keep, bw_compiler=keep))
    return _grads(compiled, inputs, cot), graphs


def _op_cases():
    """(op name, its custom op's arguments on fp32 rows, indices of the differentiable ones, cotangent
    shapes of its outputs) of every op with autograd."""
    gen = _gen("op-cases")
    x, w, wgu, res, nw, rstd = (_randn(gen, M, K), _randn(gen, N, K, scale=K ** -0.5),
                                _randn(gen, F2, K, scale=K ** -0.5), _randn(gen, M, N), _randn(gen, N), _rstd(gen))
    xq, wq, pos, freqs, nh, nkv = _qkv_inputs(gen, 64)
    return [
        ("linear_residual_norm", (x, w, res, nw, EPS), (0, 1, 2, 3), ((M, N), (M, N), (M,))),
        ("rms_linear", (x, w, rstd, "gelu_tanh"), (0, 1, 2), ((M, N),)),
        ("linear_swiglu", (x, wgu, rstd), (0, 1, 2), ((M, F2 // 2),)),
        ("linear_swiglu_train", (x, wgu, rstd), (0, 1, 2), ((M, F2 // 2), (M, F2))),
        ("qkv_rope", (xq, wq, pos.to(F32), freqs, rstd, None, None, nh, nkv, EPS), (0, 1, 4), ((M, wq.shape[0]),)),
    ]


def _as_function(name, args, diff):
    """The op as a function of its differentiable arguments (the others fixed)."""
    def fn(*leaves):
        full = list(args)
        for i, t in zip(diff, leaves):
            full[i] = t
        return getattr(torch.ops.coda_ext, name)(*full)
    return fn


@pytest.mark.parametrize("case", _op_cases(), ids=lambda c: c[0])
def test_compile_fullgraph_backward(reference_kernels, monkeypatch, case):
    """torch.compile(fullgraph=True, dynamic=True): no graph break; the forward graph holds the op, the
    backward graph the dX and weight-gradient GEMM ops (opaque); the gradients are eager's. qkv_rope's
    backward traces the RoPE backward as plain torch math (rope_backward uses its own compiled kernel
    only when it runs, not while it is traced: test_rope_backward_not_fused_while_traced)."""
    name, args, diff, shapes = case
    fn, cot = _as_function(name, args, diff), _cot(_gen("cot", name), *shapes)
    got, graphs = _compiled_grads(fn, _leaves(*[args[i] for i in diff]), cot)
    want = _grads(fn, _leaves(*[args[i] for i in diff]), cot)
    assert len(graphs) == 2, graphs
    assert f"coda_ext.{name}.default" in graphs[0]
    assert {"coda_ext.linear_dx.default", "coda_ext.weight_grad.default"} <= graphs[1], graphs[1]
    _check(got, want, tuple(f"grad of argument {i}" for i in diff), rtol=1e-6)


@pytest.mark.parametrize("case", _op_cases(), ids=lambda c: c[0])
def test_opcheck_with_gradients(reference_kernels, case):
    """torch.library.opcheck with inputs that require grad: the autograd registration, and AOT autograd
    (dynamic shapes) tracing forward and backward with the gradients of eager mode."""
    name, args, diff, _ = case
    args = list(args)
    for i in diff:
        args[i] = args[i].detach().clone().requires_grad_()
    torch.library.opcheck(getattr(torch.ops.coda_ext, name).default, tuple(args),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))


# --- the public functions: bf16, leading dimensions ----------------------------------------------------


def _public_cases():
    """(id, public function of the leaves, the fp32 reference of the leaves, leaves (bf16 but rstd),
    cotangent shapes)."""
    gen = _gen("public")
    lead = (2, 5)
    def b(*s, scale=1.0):
        return _randn(gen, *s, dtype=BF16, scale=scale)
    x, w, wgu, res, nw, rstd = b(*lead, K), b(N, K, scale=K ** -0.5), b(F2, K, scale=K ** -0.5), b(*lead, N), b(N), \
        torch.rand(lead, generator=gen) + 0.5
    nh, nkv = HEADS[128]
    wq = b((nh + 2 * nkv) * 128, K, scale=K ** -0.5)
    pos, freqs = torch.randint(0, 100_000, lead, generator=gen), ops.rope_frequencies(128, nh, nkv, theta=THETA)
    return [
        ("linear_residual_norm", ops.linear_residual_norm, residual_norm.reference, (x, w, res, nw),
         ((*lead, N), (*lead, N), lead)),
        ("rms_linear", lambda *a: ops.rms_linear(*a, activation="silu"),
         lambda *a: rms_scale.reference(*a, "silu"), (x, w, rstd), ((*lead, N),)),
        ("linear_swiglu", ops.linear_swiglu, lambda *a: swiglu.reference(*a)[0], (x, wgu, rstd), ((*lead, F2 // 2),)),
        ("linear_swiglu_train", ops.linear_swiglu_train, swiglu.reference, (x, wgu, rstd),
         ((*lead, F2 // 2), (*lead, F2))),
        ("qkv_rope", lambda a, w_, r: ops.qkv_rope(a, w_, pos, freqs, nh, nkv, rstd=r),
         lambda a, w_, r: qkv.reference(a, w_, pos, nh, nkv, theta=THETA, rstd=r), (x, wq, rstd),
         ((*lead, wq.shape[0]),)),
    ]


@pytest.mark.parametrize("case", _public_cases(), ids=lambda c: c[0])
def test_public_function_grads(reference_kernels, case):
    """Through the public function (bf16, x (2, 5, K)): every input gets a gradient of its shape and
    dtype, within bf16 rounding (the GEMM operands are rounded to bf16) of the fp32 gradient."""
    name, fn, ref, inputs, shapes = case
    gen = _gen("public-cot", name)
    cot = [_randn(gen, *s) for s in shapes]
    got = _grads(fn, _leaves(*inputs), cot)
    want = _grads(ref, _leaves(*[t.float() for t in inputs]), cot)
    for g, w, t in zip(got, want, inputs):
        assert g.shape == t.shape and g.dtype == t.dtype, (name, g.shape, g.dtype, t.shape, t.dtype)
        _close(g.float(), w, name, rtol=3e-2)


def test_rope_backward_not_fused_while_traced():
    """qkv_rope_backward runs its own compiled kernel for real CUDA tensors only: while traced (fake
    tensors: torch.compile, AOT autograd, opcheck) it takes the plain math, which the tracing compiler
    fuses itself (a compiled function cannot be traced)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from coda_ext.ops import rope_backward

    real = torch.empty(3, 4)
    assert not rope_backward._tracing(real)
    with FakeTensorMode():
        assert rope_backward._tracing(torch.empty(3, 4))


@pytest.mark.parametrize("table", ["rope_frequencies", "per-head", "rotated V"])
def test_rope_backward_follows_any_frequency_table(table):
    """Regression: the backward took the first head's frequencies for every head, right for
    rope_frequencies' tables only. Now a table with other frequencies per head (or a rotated V)
    gets every pair at its own angle: dz is the autograd gradient of the fp64 rotation by the table."""
    from coda_ext.ops import rope_backward

    gen = _gen("rope-table-" + table)
    H, KV, hd, M = 4, 2, 8, 5
    N = (H + 2 * KV) * hd
    freqs = ops.rope_frequencies(hd, H, KV)
    if table != "rope_frequencies":
        n = N if table == "rotated V" else (H + KV) * hd
        pairs = torch.rand(n // 2, generator=gen, dtype=torch.float64) * 0.3
        cols = pairs.repeat_interleave(2)
        freqs[0, :n], freqs[1, :n] = cols.float(), (cols - cols.float().double()).float()
    assert rope_backward._one_head_table(freqs, H + KV, hd) == (table == "rope_frequencies")
    if table == "rope_frequencies":   # the answer is kept per table object and version
        kept = freqs[0, hd].clone()
        freqs[0, hd] = kept + 0.125
        assert not rope_backward._one_head_table(freqs, H + KV, hd)
        freqs[0, hd] = kept
        assert rope_backward._one_head_table(freqs, H + KV, hd)
    pos = torch.arange(M, dtype=torch.float32) * 37
    z = _randn(gen, M, N, dtype=torch.float64).requires_grad_()
    angle = 2 * math.pi * (pos.double()[:, None] * (freqs[0].double() + freqs[1].double())[None, 0::2])
    a, b = z[:, 0::2], z[:, 1::2]
    out = torch.stack([a * angle.cos() - b * angle.sin(), b * angle.cos() + a * angle.sin()], -1).reshape(M, N)
    dqkv = _randn(gen, M, N, dtype=torch.float64)
    (want,) = torch.autograd.grad(out, z, dqkv)
    dz, zdz = ops.qkv_rope_backward(dqkv.float(), out.detach().float(), pos, freqs, H, KV)
    torch.testing.assert_close(dz.double(), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(zdz.double(), (out.detach() * dqkv).sum(-1), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("shared_heads", [None, True])
def test_traced_rope_backward_computes_one_head_of_angles_when_told(shared_heads):
    """Regression: while torch.compile traces, the table's values cannot be read, so the RoPE backward took
    every pair of the row at its own angle: (n_heads + 2 n_kv_heads)x the fp64 cosines and sines of the eager
    pass (about +2 ms a layer for the 8B model's compiled step). shared_heads=True (what the models pass: their
    tables come from rope_frequencies) keeps one head's angles; the values equal the eager pass's. Regression
    too: the angles' cosines and sines are an op of their own (coda_ext::rope_cos_sin), which Inductor cannot
    fuse into the rotation's kernel (it did: fp64 cosines for every head, 0.48 ms a layer at 1B, 16384 tokens)."""
    from coda_ext.ops import rope_backward

    gen = _gen("rope-traced", str(shared_heads))
    H, KV, hd, M = 4, 2, 8, 6
    N = (H + 2 * KV) * hd
    freqs = ops.rope_frequencies(hd, H, KV)
    pos = torch.arange(M, dtype=torch.float32) * 11
    dqkv, qkv = _randn(gen, M, N), _randn(gen, M, N)
    widths = []

    def backend(gm, example_inputs):
        inlined = [n for n in gm.graph.nodes if n.target in (torch.cos, torch.ops.aten.cos.default)]
        assert not inlined, "the angles' cosines are an op of their own, not math the compiler fuses per head"
        op = torch.ops.coda_ext.rope_cos_sin
        tables = [n for n in gm.graph.nodes if n.target in (op, op.default)]
        widths.extend(n.meta.get("example_value", n.meta.get("val"))[0].shape[-1] for n in tables)
        return gm.forward

    fn = torch.compile(lambda d, q, p, f: rope_backward.qkv_rope_backward(d, q, p, f, H, KV, shared_heads=shared_heads),
                       backend=backend, fullgraph=True)
    torch._dynamo.reset()
    dz, zdz = fn(dqkv, qkv, pos, freqs)
    want_dz, want_zdz = ops.qkv_rope_backward(dqkv, qkv, pos, freqs, H, KV)
    torch.testing.assert_close(dz, want_dz, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(zdz, want_zdz, atol=1e-5, rtol=1e-6)
    assert widths == [hd // 2 if shared_heads else N // 2]


def test_rope_backward_refuses_a_table_that_is_not_shared_when_told_it_is():
    H, KV, hd, M = 2, 1, 8, 3
    N = (H + 2 * KV) * hd
    freqs = ops.rope_frequencies(hd, H, KV)
    freqs[0, hd] += 0.25                      # the second head rotates at other frequencies
    with pytest.raises(ValueError, match="shared_heads=True, but freqs is not rope_frequencies' layout"):
        ops.qkv_rope_backward(torch.zeros(M, N), torch.zeros(M, N), torch.zeros(M), freqs, H, KV, shared_heads=True)


def test_rope_cos_sin_op_is_the_eager_tables():
    """coda_ext::rope_cos_sin (the angles' tables as an op a tracing compiler keeps whole): the eager tables,
    (M, 1, width/2) fp32; opcheck (schema, fake, AOT dispatch); one graph under torch.compile(fullgraph=True)."""
    import torch._dynamo

    from coda_ext.ops import rope_backward

    H, KV, hd = 4, 2, 8
    freqs = ops.rope_frequencies(hd, H, KV)
    pos = torch.arange(6, dtype=torch.float32).reshape(2, 3) * 13
    want = rope_backward._cos_sin(pos, freqs, hd)
    got = torch.ops.coda_ext.rope_cos_sin(pos, freqs, hd)
    for g, w in zip(got, want, strict=True):
        assert g.shape == (6, 1, hd // 2) and g.dtype == torch.float32 and torch.equal(g, w)
    torch.library.opcheck(torch.ops.coda_ext.rope_cos_sin.default, (pos, freqs, hd))
    torch._dynamo.reset()
    compiled = torch.compile(lambda p, f: torch.ops.coda_ext.rope_cos_sin(p, f, hd)[0] * 2, fullgraph=True,
                             backend="aot_eager")
    assert torch.equal(compiled(pos, freqs), want[0] * 2)
    torch._dynamo.reset()


def test_rope_backward_takes_attention_s_three_gradients():
    """dqkv as (dq, dk, dv) (what the layer's backward gets from attention: per head, in attention's layout, or
    flattened) gives what the concatenated (..., N) gradient gives; parts of the wrong shape, dtype or type
    are refused, naming the part."""
    gen = _gen("rope-parts")
    H, KV, hd, B, S = 4, 2, 8, 2, 3
    N = (H + 2 * KV) * hd
    freqs = ops.rope_frequencies(hd, H, KV)
    pos = torch.arange(S, dtype=torch.float32).expand(B, S) * 7
    qkv, dqkv = _randn(gen, B, S, N), _randn(gen, B, S, N)
    want = ops.qkv_rope_backward(dqkv, qkv, pos, freqs, H, KV)
    dq, dk, dv = dqkv.unflatten(-1, (H + 2 * KV, hd)).split([H, KV, KV], dim=-2)
    as_attention = tuple(t.transpose(1, 2).contiguous().transpose(1, 2) for t in (dq, dk, dv))   # (B, heads, S, hd)
    for parts in ((dq, dk, dv), as_attention, tuple(t.flatten(-2) for t in (dq, dk, dv))):
        got = ops.qkv_rope_backward(parts, qkv, pos, freqs, H, KV)
        torch.testing.assert_close(got[0], want[0], atol=0, rtol=0)
        torch.testing.assert_close(got[1], want[1], atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match=r"dk must be \(2, 3, 2, 8\) or \(2, 3, 16\)"):
        ops.qkv_rope_backward((dq, dq, dv), qkv, pos, freqs, H, KV)
    with pytest.raises(ValueError, match=r"dv is torch\.float64"):
        ops.qkv_rope_backward((dq, dk, dv.double()), qkv, pos, freqs, H, KV)
    with pytest.raises(TypeError, match=r"the tuple \(dq, dk, dv\)"):
        ops.qkv_rope_backward((dq, dk), qkv, pos, freqs, H, KV)


def test_compiled_rows_makes_one_graph_for_every_row_count():
    """The element-wise passes (rope_backward, norm_input) compile with only the row count dynamic: new
    row counts reuse the graph (regression: with every size dynamic the RoPE backward ran 3.5x slower);
    the results are the plain math's. Runs Inductor's CPU backend here."""
    from torch._dynamo.utils import counters

    from coda_ext.ops import common, norm_input, rope_backward

    assert norm_input._fused.__wrapped__ is norm_input._math and rope_backward._fused.__wrapped__ is rope_backward._math

    def f(x, w):
        return x * w, (x.float() ** 2).sum(-1)

    run = common.compiled_rows(f)
    torch._dynamo.reset()
    counters.clear()
    w = torch.randn(48)
    for m in (5, 17, 300):
        x = torch.randn(m, 48)
        got, want = run(x, w), f(x, w)
        torch.testing.assert_close(got, want)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])

    # a second width gets its own graph, still with one symbolic size (the rows), not a width-dynamic one
    graphs = []

    def record(gm, example_inputs):
        graphs.append(sum(isinstance(a, torch.SymInt) for a in example_inputs))
        return gm.forward

    run = common.compiled_rows(f, backend=record)
    for m, n in ((5, 48), (17, 48), (9, 64), (300, 64), (7, 48)):
        torch.testing.assert_close(run(torch.randn(m, n), torch.randn(n)), f(torch.zeros(m, n), torch.zeros(n)),
                                   atol=float("inf"), rtol=0)   # shapes only
    assert graphs == [1, 1], graphs


def test_compiled_rows_past_the_recompile_limit_runs_eagerly():
    """A generated function that meets more input variants than Dynamo recompiles for (fullgraph=True raises then)
    runs those eagerly with a RuntimeWarning, its results the plain math's; compiled variants keep running."""
    import warnings

    import torch._dynamo

    from coda_ext.ops import common

    def f(x, w):
        return x * w, (x.float() ** 2).sum(-1)

    run = common.compiled_rows(f)
    torch._dynamo.reset()
    limit = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
    with torch._dynamo.config.patch(**{limit: 1}):
        x, w = torch.randn(5, 8), torch.randn(8)
        torch.testing.assert_close(run(x, w), f(x, w))
        with pytest.warns(RuntimeWarning, match="recompile_limit"):
            got = run(x.double(), w.double())                   # a second variant: past the limit of 1
        torch.testing.assert_close(got, f(x.double(), w.double()))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            torch.testing.assert_close(run(x, w), f(x, w))      # the compiled variant, no warning
    torch._dynamo.reset()


def _backward_op_cases():
    """The backward GEMM ops on bf16 CPU tensors (their CPU kernels: the fp32 references)."""
    gen = _gen("backward-ops")
    d, n, f = 64, 96, 48
    def r(*shape):
        return _randn(gen, *shape, dtype=BF16)
    return [
        ("linear_residual", (r(M, f), r(d, f), r(M, d))),
        ("linear_dx", (r(M, n), r(n, d))),
        ("weight_grad", (r(M, n), r(M, d), r(n, d), 0.5)),
        ("rms_norm_backward_linear", (r(M, n), r(n, d), r(M, d), _rstd(gen), r(d), _randn(gen, M), r(M, d))),
        ("swiglu_backward_linear", (r(M, d), r(d, f), r(M, 2 * f))),
    ]


@pytest.mark.parametrize("case", _backward_op_cases(), ids=lambda c: c[0])
def test_backward_ops_opcheck_and_compile(reference_kernels, case):
    """Each backward GEMM op: torch.library.opcheck (schema, fake, AOT dispatch) and
    torch.compile(fullgraph=True) giving the eager results."""
    name, args = case
    op = getattr(torch.ops.coda_ext, name)
    torch.library.opcheck(op.default, args, test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))
    want = op(*args)
    torch._dynamo.reset()
    got = torch.compile(lambda *a: op(*a), fullgraph=True, backend="aot_eager")(*args)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert torch.equal(g, w)


def test_swiglu_backward_over_z(reference_kernels):
    """overwrite_z=True: dz written over z and returned as z itself, equal to the op's own dz; the mutating
    custom op passes opcheck (schema, fake, AOT dispatch) and compiles to one graph; a non-contiguous z is
    refused."""
    gen = _gen("swiglu-over-z")
    dy, w, z = (_randn(gen, *s, dtype=BF16) for s in ((M, 64), (64, 48), (M, 96)))
    want = ops.swiglu_backward_linear(dy, w, z)
    zz = z.clone()
    got = ops.swiglu_backward_linear(dy, w, zz, overwrite_z=True)
    assert got[0] is zz and reference_kernels[-1] == "swiglu_backward_linear_"
    for g, t in zip(got, want):
        assert torch.equal(g, t)
    torch.library.opcheck(torch.ops.coda_ext.swiglu_backward_linear_.default, (dy, w, z.clone()),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))
    torch._dynamo.reset()
    zz = z.clone()
    got = torch.compile(lambda *a: ops.swiglu_backward_linear(*a, overwrite_z=True), fullgraph=True,
                        backend="aot_eager")(dy, w, zz)
    torch._dynamo.reset()
    assert torch.equal(zz, want[0]) and torch.equal(got[1], want[1])
    with pytest.raises(ValueError, match="overwrite_z needs a contiguous z"):
        ops.swiglu_backward_linear(dy, w, torch.empty(96, M, dtype=BF16).t(), overwrite_z=True)


@pytest.mark.parametrize("call, error, match", [
    (lambda r: ops.linear_dx(r(4, 8).float(), r(8, 16).float()), TypeError, "16-bit dtype"),
    (lambda r: ops.linear_dx(r(4, 9), r(8, 16)), ValueError, "must match weight"),
    (lambda r: ops.linear_dx(r(4, 16), r(8, 16).t()), ValueError, "contiguous"),
    (lambda r: ops.weight_grad(r(4, 8), r(5, 16)), ValueError, "same leading dimensions"),
    (lambda r: ops.weight_grad(r(4, 8), r(4, 16), accumulate=r(8, 8)), ValueError, "accumulate must be"),
    (lambda r: ops.weight_grad(r(4, 8), r(4, 16), scale="2"), TypeError, "scale must be a Python number"),
    (lambda r: ops.rms_norm_backward_linear(r(4, 8), r(8, 16), r(4, 16), torch.ones(4), r(16), torch.ones(5)),
     ValueError, "zdz must have shape"),
    (lambda r: ops.swiglu_backward_linear(r(4, 16), r(16, 8), r(4, 8)), ValueError, "z must have shape"),
    (lambda r: ops.rms_norm_input(r(4, 16), r(8)), ValueError, "weight must have shape"),
    (lambda r: ops.qkv_rope_backward(r(4, 256), r(4, 256), torch.zeros(4), torch.zeros(2, 128), 2, 1), ValueError,
     "freqs must be"),
])
def test_backward_ops_refuse_bad_inputs_before_any_launch(call, error, match):
    """Bad arguments name the argument and the fix, on any device, before a kernel is involved."""
    gen = _gen("bad-backward")
    with pytest.raises(error, match=match):
        call(lambda *shape: _randn(gen, *shape, dtype=BF16))


def test_rope_backward_tables_are_computed_once_for_the_layers_of_a_step(monkeypatch):
    """qkv_rope_backward's cos/sin tables (about ten small kernels) are reused while positions (the same memory,
    even through another view), the frequency table (the same tensor: the layers of a model share their config's,
    LlamaConfig.rope_table) and the width are unchanged, as between the layers of a step; another table, positions
    changed in place, or other positions recompute them; the gradients are the same either way."""
    from coda_ext.ops import rope_backward

    calls = []
    real = rope_backward._cos_sin
    monkeypatch.setattr(rope_backward, "_cos_sin", lambda *a: calls.append(a[2]) or real(*a))
    monkeypatch.setattr(rope_backward, "_LAST_TABLES", {})
    gen = _gen("rope-tables")
    nh, nkv, hd = 4, 2, 16
    N = (nh + 2 * nkv) * hd
    freqs = ops.rope_frequencies(hd, nh, nkv)
    pos = torch.arange(2 * 8).reshape(2, 8) + 5
    dqkv, qkv = _randn(gen, 2, 8, N, dtype=BF16), _randn(gen, 2, 8, N, dtype=BF16)
    first = ops.qkv_rope_backward(dqkv, qkv, pos, freqs, nh, nkv)
    again = ops.qkv_rope_backward(dqkv, qkv, pos.view(2, 8), freqs, nh, nkv)     # another view, same memory
    assert len(calls) == 1 and all(torch.equal(a, b) for a, b in zip(first, again))
    other = ops.qkv_rope_backward(dqkv, qkv, pos, freqs.clone(), nh, nkv)         # another table object
    assert len(calls) == 2 and torch.equal(other[0], first[0])
    ops.qkv_rope_backward(dqkv, qkv, pos, freqs, nh, nkv)
    assert len(calls) == 3
    pos.add_(3)                                                                    # in place: a new version
    moved = ops.qkv_rope_backward(dqkv, qkv, pos, freqs, nh, nkv)
    assert len(calls) == 4 and not torch.equal(moved[0], first[0])
    fresh = ops.qkv_rope_backward(dqkv, qkv, pos.clone(), freqs, nh, nkv)          # other memory, same values
    assert len(calls) == 5 and torch.equal(fresh[0], moved[0])


def test_the_layers_of_a_model_share_one_rope_table():
    """LlamaConfig.rope_table: one tensor per config and device, so a model's layers (built from one config, moved
    to a device) hold the same table object, which the RoPE backward's table reuse needs."""
    from coda_ext.models import CodaLlamaDecoderLayer, LlamaConfig

    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=16, num_hidden_layers=2, vocab_size=64)
    assert cfg.rope_table() is cfg.rope_table() and cfg.rope_table("cpu") is cfg.rope_table()
    layers = [CodaLlamaDecoderLayer(cfg, impl="reference").to(torch.bfloat16) for _ in range(2)]
    assert layers[0].rope_freqs is layers[1].rope_freqs and layers[0].rope_freqs.dtype == torch.float32
