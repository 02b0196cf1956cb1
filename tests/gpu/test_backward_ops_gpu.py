"""The backward GEMM ops (coda_ext.ops: linear_dx, weight_grad, linear_residual, rms_norm_backward_linear,
swiglu_backward_linear, qkv_rope_backward, the LM head + cross-entropy backward) on an SM90 GPU against
their fp32 references, with the rule of docs/design.md: max error ≤ 2× the error of the same math done by
PyTorch in the op's dtype, plus a small floor. Outputs come from a NaN-filled memory pool.

Shapes: Llama-3-1B-like (d 2048, F 8192) and 8B (d 4096, F 14336) at token counts that are not
tile multiples (333, 2×77) and M = 1.
"""
from __future__ import annotations

import math
import os

import pytest
import torch
import torch.nn.functional as F

import coda_ext as ce
from coda_ext import graphs, ops
from coda_ext.graph import semantics
from coda_ext.ops import linear_grad, lm_head_ce, norm_backward, swiglu_backward
from coda_ext.runtime import auto_items
from tests.helpers import rand
from tests.helpers.checks import assert_within_rule, max_err, nan_memory

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
MODELS = {"1b": (2048, 8192), "8b": (4096, 14336)}
#: (d, f) of the cases beside the models': "gate_up_8b" is Llama-8B's gate/up weight gradient as weight_grad runs it
#: (dW (28672, 4096)), whose grid of cooperative 128x256 tiles leaves the last wave nearly empty: over 4100 tokens
#: the heuristic takes stream-K (tuning.STREAMK_LARGE)
DIMS = {**MODELS, "gate_up_8b": (28672, 4096)}
LEADS = ((333,), (2, 77), (1,))
DTYPES = ("bfloat16", "float16")


def _cases():
    out = []
    for model in MODELS:
        out += [(op, model, lead, "bfloat16") for lead in LEADS
                for op in ("linear_dx", "weight_grad", "weight_grad_acc", "weight_grad_scaled", "linear_residual",
                           "norm_backward", "norm_backward_acc", "swiglu_backward")]
        out += [(op, model, (333,), "float16") for op in ("linear_dx", "weight_grad", "norm_backward_acc",
                                                          "swiglu_backward")]
    # 33 M tiles over K = 16384 and N = 2048: the RMSNorm backward with dx_in in ping-pong 128x192 (tuning's
    # _deep_narrow_kn), rows that are not a multiple of the tile
    return out + [("norm_backward_acc", "1b", (4100,), "bfloat16")] + \
        [(op, "gate_up_8b", (4100,), "bfloat16") for op in ("weight_grad", "weight_grad_acc", "weight_grad_scaled")]


CASES = _cases()


def _gemm(op: str, d: int, f: int, tokens: int) -> tuple:
    """(module graph args, major, (M, N, K) of the GEMM as launched) of a case."""
    return {
        "linear_dx": ((False,), "kn", (tokens, f, d)),          # dz (M, d) @ W_down (d, f)
        "weight_grad": ((False,), "mn", (d, f, tokens)),        # dzᵀ (d, M) @ x (M, f)
        "weight_grad_acc": ((True,), "mn", (d, f, tokens)),
        "weight_grad_scaled": ((True, True), "mn", (d, f, tokens)),   # scale · dzᵀ @ x + accumulate
        "linear_residual": ((True,), "kk", (tokens, d, f)),
        "norm_backward": ((False,), "kn", (tokens, d, 3 * d)),  # dz (M, 3d) @ W (3d, d): a QKV-like consumer
        "norm_backward_acc": ((True,), "kn", (tokens, d, 2 * f)),
        "swiglu_backward": ((), "kn", (tokens, f, d)),
    }[op]


_MODULE = {"linear_dx": linear_grad, "weight_grad": linear_grad, "weight_grad_acc": linear_grad,
           "weight_grad_scaled": linear_grad,
           "linear_residual": linear_grad, "norm_backward": norm_backward, "norm_backward_acc": norm_backward,
           "swiglu_backward": swiglu_backward}


def build_items(sms: int | None = None) -> list:
    """(graph, dtype, config) of every kernel the cases (and the LM head test) run, for prebuild."""
    items = []
    for dtype in DTYPES:
        gemms = []
        for op, model, lead, dt in CASES:
            if dt == dtype:
                args, major, mnk = _gemm(op, *DIMS[model], math.prod(lead))
                gemms.append((_MODULE[op].graph(*args), major, mnk))
        if dtype == "bfloat16":
            gemms += [g for M, V, d in LM_SHAPES for g in lm_head_ce.gemms(M, V, d, True, LM_CHUNK_BYTES)]
            # the statistics forward without rstd (test_lm_head_train_gradients' loss check, "plain")
            gemms += [(lm_head_ce.graph(False), "kk", (M, V, d)) for M, V, d in LM_SHAPES]
            gemms += [g for M, V, d in LM_SHAPES for s in (False, True)
                      for g in lm_head_ce.gemms(M, V, d, s, train=True, train_chunk_bytes=LM_TRAIN_CHUNK_BYTES)]
            gemms += [(graphs.weight_grad_split(True, final), "mn", SPLIT_SHAPE) for final in (False, True)]
            for backend in lm_head_ce.DW_BACKENDS:   # the weight gradient's kernels of each (none for cuBLAS)
                with lm_head_ce.dw_backend(backend):
                    gemms += [g for M, V, d in LM_SHAPES for g in lm_head_ce.dw_gemms(M, V, d, LM_TRAIN_CHUNK_BYTES)]
        items += auto_items(gemms, dtype, sms)
    return items + [(swiglu_backward.graph(), "bfloat16", c) for c in PADDED_CONFIGS]


LM_SHAPES = ((333, 32000, 2048), (1024, 128256, 2048))   # (M, V, d)
LM_CHUNK_BYTES = 8 * 2**20
LM_TRAIN_CHUNK_BYTES = 16 * 2**20      # the training path in chunks of 256 (V 32000) and 128 rows (V 128256)


#: (V, d, rows) of the split weight-gradient kernel's ragged test: d = 272 bytes of uint8 a row (16-byte rows, a
#: partial last N tile in every config), 77 rows (a partial last K tile)
SPLIT_SHAPE = (336, 272, 77)


#: Configs of the dSwiGLU whose last N tile is partly beyond N = 1000 (the row sum zdz runs without a per-element
#: bounds test, codegen/oob.py): 128 wide (1000 = 7 · 128 + 104) and 192 wide (5 · 192 + 40), the latter also in
#: 64 x 16 epilogue subtiles
PADDED_CONFIGS = (ce.KernelConfig((128, 128, 64), (1, 1), "pingpong", swizzle=8, major="kn"),
                  ce.KernelConfig((128, 192, 64), (1, 1), "pingpong", swizzle=8, major="kn"),
                  ce.KernelConfig((128, 192, 64), (1, 1), "pingpong", swizzle=8, major="kn", epilogue_tile=(64, 16)))


@pytest.fixture(scope="module", autouse=True)
def kernels():
    ce.prebuild(build_items(), jobs=os.cpu_count())


def _inputs(op, model, lead, dtype):
    gen = rand.generator(op, model, lead, dtype, device=DEVICE)
    dt = getattr(torch, dtype)
    d, f = DIMS[model]
    def r(*s, scale=1.0):
        return rand.randn(gen, *s, dtype=dt, scale=scale)
    rstd = rand.positive(gen, lead)
    if op == "linear_dx":
        return (r(*lead, d), r(d, f, scale=f ** -0.5))
    if op.startswith("weight_grad"):
        acc = r(d, f, scale=0.1) if op != "weight_grad" else None
        return (r(*lead, d, scale=0.3), r(*lead, f), acc) + ((0.375,) if op.endswith("scaled") else ())
    if op == "linear_residual":
        return (r(*lead, f), r(d, f, scale=f ** -0.5), r(*lead, d))
    if op.startswith("norm_backward"):
        n_out = 3 * d if op == "norm_backward" else 2 * f
        zdz = rand.randn(gen, lead, scale=10.0)
        dx_in = r(*lead, d) if op.endswith("acc") else None
        return (r(*lead, n_out), r(n_out, d, scale=n_out ** -0.5), r(*lead, d), rstd, r(d), zdz, dx_in)
    return (r(*lead, d), r(d, f, scale=f ** -0.5), r(*lead, 2 * f))   # swiglu_backward


def _run(op, args):
    fn = {"linear_dx": ops.linear_dx, "weight_grad": ops.weight_grad, "weight_grad_acc": ops.weight_grad,
          "weight_grad_scaled": ops.weight_grad,
          "linear_residual": ops.linear_residual, "norm_backward": ops.rms_norm_backward_linear,
          "norm_backward_acc": ops.rms_norm_backward_linear, "swiglu_backward": ops.swiglu_backward_linear}[op]
    out = fn(*args)
    return out if isinstance(out, tuple) else (out,)


def _reference(op, args):
    if op == "linear_dx":
        return (linear_grad.reference_linear_dx(*args),)
    if op.startswith("weight_grad"):
        return (linear_grad.reference_weight_grad(*args),)
    if op == "linear_residual":
        return (linear_grad.reference_linear_residual(*args),)
    if op.startswith("norm_backward"):
        return norm_backward.reference(*args)
    return swiglu_backward.reference(*args)


def _in_dtype(op, args):
    """The same math by PyTorch in the inputs' dtype (GEMM in it, then each pointwise step in it)."""
    if op == "linear_dx":
        return (args[0] @ args[1],)
    if op.startswith("weight_grad"):
        dz, x, acc = args[:3]
        out = dz.reshape(-1, dz.shape[-1]).t() @ x.reshape(-1, x.shape[-1])
        if len(args) > 3:
            out = out * args[3]
        return (out if acc is None else out + acc,)
    if op == "linear_residual":
        return (F.linear(args[0], args[1]) + args[2],)
    if op.startswith("norm_backward"):
        dz, w, x, rstd, gamma, zdz, dx_in = args
        dt = dz.dtype
        acc = dz @ w
        r = rstd.to(dt)[..., None]
        xhat = x * r
        dx = (acc * gamma - xhat * (zdz.to(dt)[..., None] / x.shape[-1])) * r
        if dx_in is not None:
            dx = dx + dx_in
        return dx, xhat * gamma, (acc * xhat).reshape(-1, x.shape[-1]).sum(0)
    dy, w, z = args
    acc = dy @ w
    g, u = z[..., 0::2], z[..., 1::2]
    sig = torch.sigmoid(g)
    dg, du = acc * u * sig * (1 + g * (1 - sig)), acc * F.silu(g)
    return torch.stack([dg, du], -1).flatten(-2), F.silu(g) * u, (g * dg + u * du).sum(-1)


def _check(label, got, ref, base, report):
    assert len(got) == len(ref) == len(base), label
    for i, (g, r, b) in enumerate(zip(got, ref, base)):
        assert_within_rule(f"{label}[{i}]", g, r, b, report, "torch_dtype_err", "torch in the op's dtype")



@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-{'x'.join(map(str, c[2]))}-{c[3]}")
def test_backward_op(case, report):
    op, model, lead, dtype = case
    args = _inputs(op, model, lead, dtype)
    with nan_memory():
        got = _run(op, args)
    torch.cuda.synchronize()
    _check("-".join(map(str, case)), got, _reference(op, args), _in_dtype(op, args), report)


@pytest.mark.parametrize("config", PADDED_CONFIGS, ids=lambda c: c.tag)
def test_swiglu_backward_row_sum_over_a_padded_last_tile(config, report):
    """F = 1000: the last N tile's columns beyond F hold TMA's zeros, where the summand g·dg + u·du is 0 (dg's factor
    1 + g(1 − σ(g)) is 1 there), so the row sum adds them without a bounds test; its rows must still equal the
    reference's (z's padding read as 0, not as whatever lies beyond a row)."""
    gen = rand.generator("padded_dswiglu", config.tag, device=DEVICE)
    M, d, f = 333, 512, 1000
    dy = rand.randn(gen, M, d, dtype=torch.bfloat16)
    w = rand.randn(gen, d, f, dtype=torch.bfloat16, scale=d ** -0.5)
    z = rand.randn(gen, M, 2 * f, dtype=torch.bfloat16, scale=3.0)
    op = ce.compile(swiglu_backward.graph(), "bfloat16", config)
    with nan_memory():
        r = op(dy, w.t(), z=z)
    torch.cuda.synchronize()
    args = (dy, w, z)
    _check(f"padded-{config.tag}", (r.dz, r.y, r.zdz), _reference("swiglu_backward", args),
           _in_dtype("swiglu_backward", args), report)


def test_backward_ops_repeat_bit_identical():
    """Same inputs, same kernels: the same bits (the dγ column partials finish in a fixed order)."""
    args = _inputs("norm_backward_acc", "1b", (333,), "bfloat16")
    first = _run("norm_backward_acc", args)
    for _ in range(3):
        again = _run("norm_backward_acc", args)
        assert all(torch.equal(a, b) for a, b in zip(first, again))


@pytest.mark.parametrize("model", MODELS)
def test_swiglu_backward_over_z_is_bit_identical(model):
    """swiglu_backward_linear(..., overwrite_z=True) writes dz over z (the epilogue reads each pair of z before it
    writes dz's there): the same bits as into a tensor of its own, at a row count that is not a tile multiple."""
    dy, w, z = _inputs("swiglu_backward", model, (333,), "bfloat16")
    want = ops.swiglu_backward_linear(dy, w, z)
    zz = z.clone()
    got = ops.swiglu_backward_linear(dy, w, zz, overwrite_z=True)
    torch.cuda.synchronize()
    assert got[0] is zz
    for g, t in zip(got, want):
        assert torch.equal(g, t)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_backward_matches_autograd(dtype):
    """qkv_rope_backward on the GPU: dz is the autograd gradient of the fp64 RoPE reference."""
    gen = rand.generator("rope_backward", dtype, device=DEVICE)
    nh, nkv, hd, M = 32, 8, 64, 333
    N = (nh + 2 * nkv) * hd
    dt = getattr(torch, dtype)
    pos = rand.indices(gen, M, high=100_000)
    freqs = ops.rope_frequencies(hd, nh, nkv, theta=500000.0, device=DEVICE)
    z = rand.randn(gen, M, N, dtype=torch.float64).requires_grad_()
    dqkv = rand.randn(gen, M, N, dtype=dt)
    heads = z.unflatten(-1, (nh + 2 * nkv, hd))
    t = pos.double()[:, None, None] * ops.default_inv_freq(hd, 500000.0).to(DEVICE)
    c, s = torch.cos(t), torch.sin(t)
    a, b = heads[:, : nh + nkv, 0::2], heads[:, : nh + nkv, 1::2]
    rot = torch.stack([a * c - b * s, b * c + a * s], -1).flatten(-2)
    qkv = torch.cat([rot, heads[:, nh + nkv:]], 1).flatten(-2)
    (dz_ref,) = torch.autograd.grad(qkv, z, dqkv.double())
    dz, zdz = ops.qkv_rope_backward(dqkv, qkv.detach().to(dt), pos, freqs, nh, nkv)
    assert dz.dtype == dt
    tol = 2 * (dz_ref.to(dt).double() - dz_ref).abs().max().item() + 1e-6
    assert max_err(dz, dz_ref) <= tol
    zdz_ref = (qkv.detach().to(dt).double() * dqkv.double()).sum(-1)
    assert max_err(zdz, zdz_ref) <= 1e-4 * (1 + zdz_ref.abs().max().item())


@pytest.mark.parametrize("layout", ["rows", "heads_transposed", "whole"])
def test_rope_backward_kernel_reads_gradients_where_they_lie(layout):
    """The Triton pass (rope_kernel) over attention's three gradients as they come: (B, S, heads, hd) rows,
    a (B, heads, S, hd) layout seen as (B, S, heads, hd) (no row view: the concatenating path), or one dqkv;
    dz and zdz against the fp32 reference, rows not a multiple of the kernel's block, outputs poisoned."""
    from coda_ext.ops import rope_backward as rb

    gen = rand.generator("rope_backward parts", layout, device=DEVICE)
    B, S, nh, nkv, hd = 3, 347, 32, 8, 64
    N, M = (nh + 2 * nkv) * hd, B * S
    pos = rand.indices(gen, B, S, high=100_000)
    freqs = ops.rope_frequencies(hd, nh, nkv, theta=500000.0, device=DEVICE)
    qkv = rand.randn(gen, B, S, N, dtype=torch.bfloat16)
    if layout == "heads_transposed":
        parts = tuple(rand.randn(gen, B, h, S, hd, dtype=torch.bfloat16).transpose(1, 2) for h in (nh, nkv, nkv))
    else:
        parts = tuple(rand.randn(gen, B, S, h, hd, dtype=torch.bfloat16) for h in (nh, nkv, nkv))
    dqkv = torch.cat([p.reshape(B, S, -1) for p in parts], -1) if layout == "whole" else parts
    ref_dz, ref_zdz = rb.reference(dqkv, qkv, pos, freqs, nh, nkv)
    poison = torch.full((M * N,), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    del poison                                   # the next allocation of this size reuses NaN-filled memory
    dz, zdz = ops.qkv_rope_backward(dqkv, qkv, pos, freqs, nh, nkv)
    assert dz.shape == (B, S, N) and zdz.shape == (B, S)
    tol = 2 * (ref_dz.to(torch.bfloat16).float() - ref_dz).abs().max().item() + 1e-6
    assert max_err(dz, ref_dz) <= tol
    assert max_err(zdz, ref_zdz) <= 1e-4 * (1 + ref_zdz.abs().max().item())


def test_rope_backward_kernel_opcheck():
    """torch.library.opcheck of the kernel's custom op (coda_ext::rope_backward_rows): schema, fake and AOT
    dispatch with dynamic shapes."""
    from coda_ext.ops import rope_backward as rb
    from coda_ext.ops import rope_kernel

    gen = rand.generator("rope_backward opcheck", device=DEVICE)
    nh, nkv, hd, M = 8, 2, 64, 77
    freqs = ops.rope_frequencies(hd, nh, nkv, theta=500000.0, device=DEVICE)
    qkv = rand.randn(gen, M, (nh + 2 * nkv) * hd, dtype=torch.bfloat16)
    parts = tuple(rand.randn(gen, M, h * hd, dtype=torch.bfloat16) for h in (nh, nkv, nkv))
    cos, sin = rb._cos_sin(rand.indices(gen, M, high=100_000), freqs, hd)
    torch.library.opcheck(torch.ops.coda_ext.rope_backward_rows.default, (*parts, qkv, cos, sin))
    assert rope_kernel.available()


def test_rope_backward_kernel_under_torch_compile():
    """Traced by torch.compile (fullgraph) the RoPE backward launches the same Triton kernel (a custom op
    Inductor keeps): the compiled result equals the eager one bit for bit, also at a second row count."""
    torch._dynamo.reset()
    nh, nkv, hd = 32, 8, 64
    freqs = ops.rope_frequencies(hd, nh, nkv, theta=500000.0, device=DEVICE)
    def fn(parts, qkv, pos):
        return ops.qkv_rope_backward(parts, qkv, pos, freqs, nh, nkv, shared_heads=True)

    compiled = torch.compile(fn, fullgraph=True)
    for B, S in ((2, 301), (3, 77)):
        gen = rand.generator("rope_backward compiled", B, S, device=DEVICE)
        qkv = rand.randn(gen, B, S, (nh + 2 * nkv) * hd, dtype=torch.bfloat16)
        parts = tuple(rand.randn(gen, B, S, h, hd, dtype=torch.bfloat16) for h in (nh, nkv, nkv))
        pos = rand.indices(gen, B, S, high=100_000)
        want, got = fn(parts, qkv, pos), compiled(parts, qkv, pos)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("shape", LM_SHAPES, ids=lambda s: f"M{s[0]}-V{s[1]}-d{s[2]}")
def test_lm_head_cross_entropy_backward(shape, report, monkeypatch):
    """Gradients of the mean loss w.r.t. x, W and rstd against fp32 autograd, several vocabulary
    chunks (a small chunk budget), ignored tokens, through torch.autograd."""
    monkeypatch.setattr(lm_head_ce, "CHUNK_BYTES", LM_CHUNK_BYTES)
    M, V, d = shape
    gen = rand.generator(shape, device=DEVICE)
    x = rand.randn(gen, M, d, dtype=torch.bfloat16, scale=2.0)
    w = rand.randn(gen, V, d, dtype=torch.bfloat16, scale=d ** -0.5)
    rstd = rand.positive(gen, M)
    target = rand.targets(gen, M, vocab=V)

    def grads(xx, ww, rr, fn):
        xx, ww, rr = (t.detach().requires_grad_() for t in (xx, ww, rr))
        loss = fn(xx, ww, rr)
        return torch.autograd.grad(loss, (xx, ww, rr))

    def torch_loss(xx, ww, rr):
        logits = (xx @ ww.t()) * rr.to(xx.dtype)[:, None]
        return F.cross_entropy(logits, target)

    with nan_memory():
        got = grads(x, w, rstd, lambda a, b, c: ops.lm_head_cross_entropy(a, b, target, c)[0])
    torch.cuda.synchronize()
    ref = grads(x.float(), w.float(), rstd, torch_loss)
    base = grads(x, w, rstd, torch_loss)
    _check(f"lm_head_ce_backward-M{M}-V{V}", got, ref, base, report)


def _lm_head_case(shape, scale_rstd=1.0):
    M, V, d = shape
    gen = rand.generator(shape, "train", device=DEVICE)
    x = rand.randn(gen, M, d, dtype=torch.bfloat16, scale=2.0)
    w = rand.randn(gen, V, d, dtype=torch.bfloat16, scale=d ** -0.5)
    rstd = rand.positive(gen, M) * scale_rstd
    return x, w, rstd, rand.targets(gen, M, vocab=V)


def _lm_head_grads(x, w, rstd, target, loss_fn):
    """Gradients of the mean loss w.r.t. x, W (and rstd when given) by torch.autograd."""
    leaves = [t.detach().requires_grad_() for t in (x, w) + ((rstd,) if rstd is not None else ())]
    loss = loss_fn(*leaves, *([None] if rstd is None else []))
    return torch.autograd.grad(loss, leaves)


def _torch_lm_loss(target):
    def fn(xx, ww, rr):
        logits = xx @ ww.t()
        logits = logits if rr is None else logits * rr.to(xx.dtype)[:, None]
        return F.cross_entropy(logits, target)
    return fn


@pytest.mark.parametrize("dw", lm_head_ce.DW_BACKENDS)
@pytest.mark.parametrize("scaled", [False, True], ids=["plain", "rstd"])
@pytest.mark.parametrize("shape", LM_SHAPES, ids=lambda s: f"M{s[0]}-V{s[1]}-d{s[2]}")
def test_lm_head_train_gradients(shape, scaled, dw, report, monkeypatch):
    """ops.lm_head_cross_entropy_loss's training path (gradients with the loss, three GEMMs, rows in chunks with
    a partial last one; the weight gradient's GEMMs on either backend) against fp32 autograd, with the rule; the
    loss equals the statistics op's."""
    monkeypatch.setattr(lm_head_ce, "TRAIN_CHUNK_BYTES", LM_TRAIN_CHUNK_BYTES)
    x, w, rstd, target = _lm_head_case(shape)
    rstd = rstd if scaled else None
    fused = lambda a, b, c: ops.lm_head_cross_entropy_loss(a, b, target, c)   # noqa: E731
    with nan_memory(), lm_head_ce.dw_backend(dw):
        got = _lm_head_grads(x, w, rstd, target, fused)
    torch.cuda.synchronize()
    ref = _lm_head_grads(x.float(), w.float(), rstd, target, _torch_lm_loss(target))
    base = _lm_head_grads(x, w, rstd, target, _torch_lm_loss(target))
    _check(f"lm_head_train-{'x'.join(map(str, shape))}-{'rstd' if scaled else 'plain'}-dw_{dw}", got, ref, base,
           report)
    loss_train = ops.lm_head_cross_entropy_loss(x, w.detach().requires_grad_(), target, rstd)
    loss_stats, _ = ops.lm_head_cross_entropy(x, w, target, rstd)
    assert abs(loss_train.item() - loss_stats.item()) <= 1e-5 * abs(loss_stats.item())


def test_lm_head_train_out_of_range_takes_the_exact_path(report, monkeypatch):
    """Logits ~ 100 (lse beyond LSE_RANGE): exp(logits) cannot be held in bf16 with its row scale. The forward's
    range check (read after its GEMMs are queued) finds it: a RuntimeWarning, and the exact path's loss (the
    statistics op's) and gradients, which follow the rule."""
    monkeypatch.setattr(lm_head_ce, "TRAIN_CHUNK_BYTES", LM_TRAIN_CHUNK_BYTES)
    monkeypatch.setattr(lm_head_ce, "CHUNK_BYTES", LM_CHUNK_BYTES)
    shape = LM_SHAPES[0]
    x, w, rstd, target = _lm_head_case(shape, scale_rstd=12.0)
    loss_stats, lse = ops.lm_head_cross_entropy(x, w, target, rstd)
    assert lse.abs().max().item() > lm_head_ce.LSE_RANGE
    fused = lambda a, b, c: ops.lm_head_cross_entropy_loss(a, b, target, c)   # noqa: E731
    ref = _lm_head_grads(x.float(), w.float(), rstd, target, _torch_lm_loss(target))
    base = _lm_head_grads(x, w, rstd, target, _torch_lm_loss(target))
    with pytest.warns(RuntimeWarning, match="come from the exact path"):
        got = _lm_head_grads(x, w, rstd, target, fused)
    _check("lm_head_train-out-of-range", got, ref, base, report)
    with pytest.warns(RuntimeWarning, match="come from the exact path"):
        loss = ops.lm_head_cross_entropy_loss(x, w.detach().requires_grad_(), target, rstd)
    assert abs(loss.item() - loss_stats.item()) <= 1e-5 * abs(loss_stats.item())


def test_scale_by_writes_nothing_at_one_and_scales_otherwise():
    """ops.scale.scale_by_ on the GPU (its Triton kernel): a factor of exactly 1 writes nothing (a NaN with a
    payload keeps its bits; a write would make it the canonical NaN), any other factor scales every element in
    fp32, rounded once, at sizes that are not multiples of its block; the host reads no value (it is captured
    in a CUDA graph)."""
    from coda_ext.ops import scale

    gen = torch.Generator(device="cuda").manual_seed(3)
    for dtype, n in ((torch.bfloat16, 4096 * 7 + 3), (torch.float32, 1000), (torch.bfloat16, 5)):
        t = torch.randn(n, generator=gen, device="cuda").to(dtype)
        bits = t.view(torch.int16 if dtype == torch.bfloat16 else torch.int32)
        bits[0] = 0x7FA5 if dtype == torch.bfloat16 else 0x7FA00005   # a NaN whose payload a write would lose
        before = t.clone()
        scale.scale_by_([t], torch.ones((), device="cuda"))
        assert torch.equal(t.view(bits.dtype), before.view(bits.dtype))
        f = torch.tensor(0.37, device="cuda")
        scale.scale_by_([t], f)
        want = (before.float() * 0.37).to(dtype)
        assert torch.equal(t[1:], want[1:]) and torch.isnan(t[0])
    # no host read: it records into a CUDA graph (a sync would fail the capture), and the replay scales
    t = torch.randn(3000, generator=gen, device="cuda").to(torch.bfloat16)
    f = torch.tensor(2.0, device="cuda")
    scale.scale_by_([t], torch.ones((), device="cuda"))   # warm-up outside the capture
    before = t.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        scale.scale_by_([t], f)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(t, (before.float() * 2).to(torch.bfloat16))


@pytest.mark.parametrize("final", [False, True], ids=["hi-lo", "final dW"])
def test_weight_grad_split_at_ragged_edges(final, report):
    """graphs.weight_grad_split accumulating at (V, d, rows) = SPLIT_SHAPE, as the LM head's training path launches it
    (lm_head_ce._dw_split, its outputs written over its inputs): uint8 and bfloat16 tiles TMA-loaded and -stored with
    a partial last N tile (272 columns) and K tile (77 rows). The accumulator parts are views of wider, NaN-poisoned
    buffers: the kernel writes no column beyond d (the poison stays), join24(hi, lo) equals eᵀ @ y + the previous sum
    to the split's 2^-16 (fp32 accumulation beside it), the final dW within bfloat16's rounding."""
    V, d, rows = SPLIT_SHAPE
    gen = rand.generator("weight_grad_split ragged", final, device=DEVICE)
    e_t = rand.randn(gen, rows, V, dtype=torch.bfloat16).t()     # eᵀ (V, rows), V contiguous as e.t() is
    y = rand.randn(gen, rows, d, dtype=torch.bfloat16)
    prev = rand.randn(gen, V, d, dtype=torch.float32, scale=4.0)
    hi_buf = torch.full((V, d + 8), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    lo_buf = torch.full((V, d + 16), 0xAB, dtype=torch.uint8, device=DEVICE)
    hi, lo = hi_buf[:, :d], lo_buf[:, :d]
    hi.copy_(semantics.hi16(prev).to(torch.bfloat16))
    lo.copy_(semantics.lo8(prev).to(torch.uint8))
    start = semantics.join24(hi.float(), lo.float()).double()
    want = e_t.double() @ y.double() + start
    got = lm_head_ce._dw_split(e_t, y, (hi, lo), final)
    torch.cuda.synchronize()
    assert torch.isnan(hi_buf[:, d:].float()).all() and (lo_buf[:, d:] == 0xAB).all(), "a write beyond d"
    # the split's rounding (relative) beside the fp32 accumulation's worst case (K units of fp32 rounding of Σ|eᵀ y|)
    accumulation = rows * 2.0 ** -24 * (e_t.double().abs() @ y.double().abs())
    if final:
        assert got.data_ptr() == hi.data_ptr() and got.dtype == torch.bfloat16
        value, bound = got.double(), 2.0 ** -8 + 2.0 ** -14   # a bfloat16 rounding (2^-8) of the split sum
    else:
        assert got[0].data_ptr() == hi.data_ptr() and got[1].data_ptr() == lo.data_ptr()
        value, bound = semantics.join24(got[0].float(), got[1].float()).double(), 2.0 ** -15
    err = ((value - want).abs() / (bound * want.abs() + accumulation)).max().item()
    report(f"weight_grad_split-{V}x{d}x{rows}-{'final' if final else 'hi_lo'}: max error {err:.3f} of the bound "
           f"({bound:.3e} relative + the fp32 accumulation's)")
    assert err <= 1.0, err
