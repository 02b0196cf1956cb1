"""The ready ops (coda_ext.ops) on the CPU, without a kernel.

Every kernel launch of an op (TunedOp.launch) is replaced by the reference interpreter running the
op's graph in fp64, so the public functions run end to end here: argument checks, how the custom
op feeds the graph's inputs and finishes its outputs (rstd, the cross-entropy), the leading batch
dimensions. Against that: the ops' fp32 references, their fakes (FakeTensorMode, opcheck), the
weight-layout conversions (Hugging Face's rotate-half RoPE), the argument errors, and
torch.compile(fullgraph=True) tracing every op without a graph break.
"""
from __future__ import annotations

import functools
import types

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.backends.registry import lookup_backend
from torch._subclasses.fake_tensor import FakeTensorMode

import coda_ext as ce
from coda_ext import ops
from coda_ext.graph.interpret import Outputs
from coda_ext.ops import lm_head_ce, qkv, residual_norm, rms_scale, swiglu
from coda_ext.runtime import TunedOp
from tests.helpers import rand
from tests.helpers.custom_op_calls import RecordCustomOps

BF16, FP16 = torch.bfloat16, torch.float16
K = 64                            # x's last dimension
N = 72                            # output width of linear_residual_norm and rms_linear (not a tile multiple)
F2 = 144                          # rows of the interleaved gate/up weight
V = 1000                          # vocabulary
HEADS = {64: (4, 2), 128: (2, 1)}  # head_dim -> (n_heads, n_kv_heads): N = 512 either way
LEADS = [(1,), (37,), (2, 5), ()]  # x (..., K): odd M, M = 1, a batch of sequences, one token as a 1-D x
THETA = 500000.0


def _lead_id(lead: tuple) -> str:
    return "x".join(map(str, lead)) or "1d"


def _interpreted(exact: bool):
    def launch(self, A, W, inputs, out, M, N):
        """The kernel's outputs from the interpreter (fp64 math): unrounded if exact, else in the
        dtypes the kernel writes (what the fakes promise). The arguments' checks ran before."""
        assert not out
        got = ce.interpret(self.graph, A, W, compute_dtype=torch.float64, **inputs)
        return Outputs({k: v if exact else v.to(self.output_spec(k, M, N)[1]) for k, v in got.items()})

    return launch


@pytest.fixture(autouse=True)
def interpreted_kernels(monkeypatch):
    monkeypatch.setattr(TunedOp, "launch", _interpreted(exact=False))


@pytest.fixture
def exact(monkeypatch):
    """The ops' results unrounded (fp64), to compare with the fp32 references tightly."""
    monkeypatch.setattr(TunedOp, "launch", _interpreted(exact=True))


@pytest.fixture
def no_kernel(monkeypatch):
    """No kernel is built or launched (the graph ops themselves, which a fake checks the arguments with, are
    made: kernel sources only)."""
    def refuse(*args):
        raise AssertionError(f"a kernel was asked for: {args}")

    monkeypatch.setattr(TunedOp, "launch", refuse)
    monkeypatch.setattr(TunedOp, "op_for", refuse)


def _close(got: torch.Tensor, ref: torch.Tensor, what: str = "") -> None:
    assert got.shape == ref.shape, f"{what}: shape {tuple(got.shape)} != {tuple(ref.shape)}"
    scale = max(1.0, ref.abs().max().item()) if ref.numel() else 1.0
    torch.testing.assert_close(got.double(), ref.double(), rtol=2e-5, atol=2e-5 * scale, equal_nan=True,
                               msg=lambda m: f"{what}: {m}")


_gen = rand.generator
_randn = functools.partial(rand.randn, dtype=BF16)   # this file's inputs are bf16 unless they say otherwise
_rstd = rand.positive


# --- each op's graph (interpreted) against its fp32 reference --------------------------------------


@pytest.mark.parametrize("lead", LEADS, ids=_lead_id)
def test_linear_residual_norm_matches_reference(exact, lead):
    gen = _gen("rn", lead)
    x, w = _randn(gen, *lead, K), _randn(gen, N, K, scale=K ** -0.5)
    res, nw = _randn(gen, *lead, N), _randn(gen, N)
    got = ops.linear_residual_norm(x, w, res, nw, eps=1e-5)
    ref = residual_norm.reference(x, w, res, nw, eps=1e-5)
    for name, g, r in zip(("out", "h", "rstd"), got, ref):
        _close(g, r, name)


@pytest.mark.parametrize("activation", list(rms_scale.ACTIVATIONS))
@pytest.mark.parametrize("lead", LEADS, ids=_lead_id)
def test_rms_linear_matches_reference(exact, lead, activation):
    gen = _gen("rms", lead, activation)
    x, w, rstd = _randn(gen, *lead, K), _randn(gen, N, K, scale=K ** -0.5), _rstd(gen, lead)
    _close(ops.rms_linear(x, w, rstd, activation=activation), rms_scale.reference(x, w, rstd, activation))


@pytest.mark.parametrize("scaled", [False, True], ids=["plain", "rstd"])
@pytest.mark.parametrize("lead", LEADS, ids=_lead_id)
def test_linear_swiglu_matches_reference(exact, lead, scaled):
    gen = _gen("swiglu", lead, scaled)
    x, w = _randn(gen, *lead, K), _randn(gen, F2, K, scale=K ** -0.5)
    rstd = _rstd(gen, lead) if scaled else None
    y_ref, z_ref = swiglu.reference(x, w, rstd)
    _close(ops.linear_swiglu(x, w, rstd), y_ref, "y")
    y, z = ops.linear_swiglu_train(x, w, rstd)
    _close(y, y_ref, "train y")
    _close(z, z_ref, "train z")


def _positions(gen, lead):
    """Token positions up to 1e5 (the largest one in every call)."""
    pos = rand.indices(gen, lead, high=100_000)
    pos.view(-1)[-1] = 100_000
    return pos


@pytest.mark.parametrize("qk_norm", [False, True], ids=["rope", "qknorm"])
@pytest.mark.parametrize("scaled", [False, True], ids=["plain", "rstd"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("lead", LEADS, ids=_lead_id)
def test_qkv_rope_matches_reference(exact, lead, head_dim, scaled, qk_norm):
    nh, nkv = HEADS[head_dim]
    gen = _gen("qkv", lead, head_dim, scaled, qk_norm)
    x, w = _randn(gen, *lead, K), _randn(gen, (nh + 2 * nkv) * head_dim, K, scale=K ** -0.5)
    pos = _positions(gen, lead)
    rstd = _rstd(gen, lead) if scaled else None
    qw, kw = (_randn(gen, head_dim), _randn(gen, head_dim)) if qk_norm else (None, None)
    freqs = ops.rope_frequencies(head_dim, nh, nkv, theta=THETA)
    got = ops.qkv_rope(x, w, pos, freqs, nh, nkv, rstd=rstd, q_norm_weight=qw, k_norm_weight=kw, eps=1e-5)
    ref = qkv.reference(x, w, pos, nh, nkv, theta=THETA, rstd=rstd, q_norm_weight=qw, k_norm_weight=kw, eps=1e-5)
    _close(got, ref)


def test_qkv_rope_with_given_inv_freq(exact):
    """Frequencies given directly (as Llama 3's scaled ones are), and float positions."""
    nh, nkv = HEADS[128]
    gen = _gen("inv_freq")
    x, w = _randn(gen, 9, K), _randn(gen, (nh + 2 * nkv) * 128, K, scale=K ** -0.5)
    pos = _positions(gen, (9,)).float()
    inv_freq = ops.default_inv_freq(128, THETA) * torch.linspace(0.125, 1.0, 64, dtype=torch.float64)
    freqs = ops.rope_frequencies(128, nh, nkv, inv_freq=inv_freq)
    _close(ops.qkv_rope(x, w, pos, freqs, nh, nkv), qkv.reference(x, w, pos, nh, nkv, inv_freq=inv_freq))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_qk_norm_vectors(dtype):
    """norm_b: each head's weight on Q and K, 0 on V; norm_a: 1 on V only; both fp32. The constant norm_a is kept per
    shape and device, not when its inputs are fake (a traced call builds its own)."""
    nh, nkv, hd = 4, 2, 8
    gen = _gen("qk_norm_vectors", dtype)
    qw, kw = rand.randn(gen, hd, dtype=dtype), rand.randn(gen, hd, dtype=dtype)
    norm_a, norm_b = qkv.qk_norm_vectors(qw, kw, nh, nkv)
    assert norm_a.dtype == norm_b.dtype == torch.float32 and norm_b.shape == norm_a.shape == ((nh + 2 * nkv) * hd,)
    assert torch.equal(norm_b, torch.cat([qw.float().repeat(nh), kw.float().repeat(nkv), torch.zeros(nkv * hd)]))
    assert torch.equal(norm_a, torch.cat([torch.zeros((nh + nkv) * hd), torch.ones(nkv * hd)]))
    assert qkv.qk_norm_vectors(qw, kw, nh, nkv)[0] is norm_a
    with FakeTensorMode() as mode:
        fake_a, _ = qkv.qk_norm_vectors(mode.from_tensor(qw), mode.from_tensor(kw), nh, nkv)
    assert fake_a is not norm_a and qkv.qk_norm_vectors(qw, kw, nh, nkv)[0] is norm_a


def test_rope_frequencies_table():
    """Per column: its pair's frequency in turns (up to sign) as an fp32 hi + lo pair, 0 on V."""
    nh, nkv, hd = 4, 2, 64
    table = ops.rope_frequencies(hd, nh, nkv, theta=THETA)
    assert table.shape == (2, (nh + 2 * nkv) * hd) and table.dtype == torch.float32
    turns = ops.default_inv_freq(hd, THETA) / (2 * torch.pi)
    want = torch.cat([turns.repeat_interleave(2).repeat(nh + nkv), torch.zeros(nkv * hd, dtype=torch.float64)])
    assert (table.double().sum(0).abs() - want).abs().max() <= 1e-15 * want.max()
    assert torch.equal(table[0].abs(), want.float())


@pytest.mark.parametrize("reduction", lm_head_ce.REDUCTIONS)
@pytest.mark.parametrize("ignore_index", [-100, 3])
@pytest.mark.parametrize("scaled", [False, True], ids=["plain", "rstd"])
@pytest.mark.parametrize("lead", LEADS, ids=_lead_id)
def test_lm_head_cross_entropy_matches_reference(exact, lead, scaled, ignore_index, reduction):
    gen = _gen("lm", lead, scaled, ignore_index, reduction)
    x, w = _randn(gen, *lead, K, scale=2.0), _randn(gen, V, K, scale=K ** -0.5)
    target = torch.randint(0, V, lead, generator=gen)
    if target.numel() > 1:  # some tokens that do not count (the first always does)
        target.view(-1)[1::3] = ignore_index
    rstd = _rstd(gen, lead) if scaled else None
    loss, lse = ops.lm_head_cross_entropy(x, w, target.to(torch.int32 if scaled else torch.int64), rstd,
                                          ignore_index=ignore_index, reduction=reduction)
    loss_ref, lse_ref = lm_head_ce.reference(x, w, target, rstd, ignore_index=ignore_index, reduction=reduction)
    _close(loss, loss_ref, "loss")
    _close(lse, lse_ref, "lse")


def test_lm_head_cross_entropy_all_ignored(exact):
    """No token counts: 'mean' is NaN and 'sum' 0, as in torch's cross_entropy."""
    gen = _gen("lm-ignored")
    x, w = _randn(gen, 4, K), _randn(gen, V, K, scale=K ** -0.5)
    target = torch.full((4,), -100)
    for reduction in lm_head_ce.REDUCTIONS:
        loss, _ = ops.lm_head_cross_entropy(x, w, target, reduction=reduction)
        _close(loss, lm_head_ce.reference(x, w, target, reduction=reduction)[0], reduction)


# --- the fakes: shapes and dtypes without a kernel --------------------------------------------------


def _calls(lead, dtype, device):
    """(name, public function, args, kwargs, expected (shape, dtype) of each output) of every op."""
    def r(*shape):
        return torch.randn(shape, device=device).to(dtype)
    x, rstd, hd = r(*lead, K), torch.rand(lead, device=device) + 0.5, 64
    nh, nkv = HEADS[hd]
    Nq = (nh + 2 * nkv) * hd
    pos = torch.randint(0, 1000, lead, device=device)
    # (a CPU-only torch cannot copy a fake tensor to cuda: the fake table is made there directly)
    freqs = ops.rope_frequencies(hd, nh, nkv) if device == "cpu" else torch.empty(2, Nq, device=device)
    qk = dict(q_norm_weight=r(hd), k_norm_weight=r(hd))
    target = torch.randint(0, V, lead, device=device)
    f32 = torch.float32
    return [
        ("linear_residual_norm", ops.linear_residual_norm, (x, r(N, K), r(*lead, N), r(N)), {},
         [((*lead, N), dtype), ((*lead, N), dtype), (lead, f32)]),
        ("rms_linear", ops.rms_linear, (x, r(N, K), rstd), {"activation": "silu"}, [((*lead, N), dtype)]),
        ("linear_swiglu", ops.linear_swiglu, (x, r(F2, K), rstd), {}, [((*lead, F2 // 2), dtype)]),
        ("linear_swiglu_train", ops.linear_swiglu_train, (x, r(F2, K)), {},
         [((*lead, F2 // 2), dtype), ((*lead, F2), dtype)]),
        ("qkv_rope", ops.qkv_rope, (x, r(Nq, K), pos, freqs, nh, nkv), {"rstd": rstd, **qk}, [((*lead, Nq), dtype)]),
        ("lm_head_cross_entropy", ops.lm_head_cross_entropy, (x, r(V, K), target, rstd), {},
         [((), f32), (lead, f32)]),
        ("lm_head_cross_entropy", ops.lm_head_cross_entropy, (x, r(V, K), target), {"reduction": "none"},
         [(lead, f32), (lead, f32)]),
    ]


@pytest.mark.parametrize("dtype", [BF16, FP16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("lead", [(333,), (2, 77)], ids=_lead_id)
def test_fakes_give_shapes_without_a_kernel(no_kernel, lead, dtype):
    with FakeTensorMode():
        outputs = {}
        for name, fn, args, kwargs, want in _calls(lead, dtype, "cuda"):
            out = fn(*args, **kwargs)
            outputs[name] = out = out if isinstance(out, tuple) else (out,)
            assert [(tuple(o.shape), o.dtype) for o in out] == [(tuple(s), d) for s, d in want], name
            assert all(o.device.type == "cuda" for o in out), name
        q, k, v = ops.split_qkv(outputs["qkv_rope"][0], *HEADS[64])
        assert (q.shape, k.shape, v.shape) == ((*lead, 4, 64), (*lead, 2, 64), (*lead, 2, 64))


@pytest.mark.parametrize("lead", [(37,), (2, 5)], ids=_lead_id)
def test_opcheck(lead):
    """torch.library.opcheck of each custom op with the arguments its public function passes:
    schema, fake vs real (here the interpreter) shapes and dtypes, AOT dispatch with dynamic shapes."""
    for name, fn, args, kwargs, _ in _calls(lead, BF16, "cpu"):
        with RecordCustomOps() as rec:
            fn(*args, **kwargs)
        assert [str(c[0]) for c in rec.calls] == [f"coda_ext.{name}.default"]
        torch.library.opcheck(*rec.calls[0])


def test_compile_fullgraph_traces_every_op():
    """torch.compile(fullgraph=True) (no graph break; dynamic shapes) puts each custom op in the graph,
    AOT-traces it through the fakes, and the compiled function gives the eager values."""
    for name, fn, args, kwargs, _ in _calls((2, 5), BF16, "cpu"):
        graphs = []

        def backend(gm, example_inputs):
            graphs.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
            return lookup_backend("aot_eager")(gm, example_inputs)

        torch._dynamo.reset()
        compiled = torch.compile(lambda *a: fn(*a, **kwargs), fullgraph=True, dynamic=True, backend=backend)
        got, want = compiled(*args), fn(*args, **kwargs)
        assert graphs, name
        for targets in graphs:  # (under dynamic=True dynamo may trace twice, specializing a float on the retry)
            assert f"coda_ext.{name}" in targets, (name, targets)
        for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            assert torch.equal(g, w), name


# --- weight layouts ---------------------------------------------------------------------------------


def test_interleave_gate_up_round_trip():
    gen = _gen("gate-up")
    for shape in [(72, 64), (72,)]:  # a weight, a bias
        gate, up = _randn(gen, *shape), _randn(gen, *shape)
        w = ops.interleave_gate_up(gate, up)
        assert w.shape == (2 * shape[0], *shape[1:])
        assert torch.equal(w[0::2], gate) and torch.equal(w[1::2], up)
        back = ops.split_gate_up(w)
        assert torch.equal(back[0], gate) and torch.equal(back[1], up)
        assert back[0].is_contiguous() and back[1].is_contiguous()


def test_interleaved_swiglu_is_gate_up_swiglu(exact):
    """linear_swiglu on the interleaved weight = silu(x W_gateᵀ) · (x W_upᵀ) on the separate ones."""
    gen = _gen("swiglu-layout")
    x, wg, wu = _randn(gen, 7, K), _randn(gen, 36, K, scale=K ** -0.5), _randn(gen, 36, K, scale=K ** -0.5)
    want = F.silu(x.double() @ wg.double().t()) * (x.double() @ wu.double().t())
    _close(ops.linear_swiglu(x, ops.interleave_gate_up(wg, wu)), want)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_rotate_half_round_trip(head_dim):
    gen = _gen("rotate-half", head_dim)
    hd2 = head_dim // 2
    one_head = torch.arange(head_dim)
    want = torch.stack([one_head[:hd2], one_head[hd2:]], -1).flatten()  # (x0, x_hd/2), (x1, x_hd/2+1), ...
    assert torch.equal(ops.rotate_half_to_pairs(one_head, head_dim), want)
    cases = [(_randn(gen, 3 * head_dim, K), 0),        # W_q rows
             (_randn(gen, 3 * head_dim), 0),           # a bias
             (_randn(gen, head_dim), 0),               # a QK-norm weight
             (_randn(gen, 5, 2 * head_dim), 1),        # activations (tokens, heads · head_dim)
             (_randn(gen, 2, 5, 2 * head_dim), -1)]
    for t, dim in cases:
        p = ops.rotate_half_to_pairs(t, head_dim, dim=dim)
        assert p.shape == t.shape and p.is_contiguous()
        assert torch.equal(ops.pairs_to_rotate_half(p, head_dim, dim=dim), t)
        back = ops.pairs_to_rotate_half(t, head_dim, dim=dim)
        assert torch.equal(ops.rotate_half_to_pairs(back, head_dim, dim=dim), t)


def _hf_rope(t, positions, inv_freq):
    """Hugging Face's Llama RoPE (rotate_half) on (..., heads, head_dim) in fp64."""
    freqs = positions.double()[..., None] * inv_freq
    emb = torch.cat([freqs, freqs], -1)[..., None, :]
    x1, x2 = t.chunk(2, -1)
    return t * emb.cos() + torch.cat([-x2, x1], -1) * emb.sin()


def _hf_rms(t, weight, eps):
    return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps) * weight.double()


@pytest.mark.parametrize("qk_norm", [False, True], ids=["llama", "qwen3"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_hf_rotate_half_rope_equals_converted_weights(exact, head_dim, qk_norm):
    """HF's rotate-half RoPE (and QK-norm) on the original weights = coda's reference and qkv_rope on
    rotate_half_to_pairs-converted weights, converted back; attention scores need no conversion."""
    nh, nkv = HEADS[head_dim]
    gen = _gen("hf", head_dim, qk_norm)
    x, pos, eps = _randn(gen, 2, 5, K), _positions(gen, (2, 5)), 1e-5
    wq, wk, wv = (_randn(gen, n * head_dim, K, scale=K ** -0.5) for n in (nh, nkv, nkv))
    qw, kw = (_randn(gen, head_dim), _randn(gen, head_dim)) if qk_norm else (None, None)
    inv_freq = ops.default_inv_freq(head_dim, THETA)

    def heads(w, n):
        return (x.double() @ w.double().t()).unflatten(-1, (n, head_dim))

    q, k, v = heads(wq, nh), heads(wk, nkv), heads(wv, nkv)
    if qk_norm:
        q, k = _hf_rms(q, qw, eps), _hf_rms(k, kw, eps)
    q, k = _hf_rope(q, pos, inv_freq), _hf_rope(k, pos, inv_freq)

    def pairs(t):
        return ops.rotate_half_to_pairs(t, head_dim)

    w = torch.cat([pairs(wq), pairs(wk), wv])
    norm = dict(q_norm_weight=pairs(qw), k_norm_weight=pairs(kw)) if qk_norm else {}
    ref = qkv.reference(x, w, pos, nh, nkv, theta=THETA, eps=eps, **norm)
    got = ops.qkv_rope(x, w, pos, ops.rope_frequencies(head_dim, nh, nkv, theta=THETA), nh, nkv, eps=eps, **norm)
    for out in (ref, got):
        cq, ck, cv = ops.split_qkv(out, nh, nkv)
        _close(ops.pairs_to_rotate_half(cq.flatten(-2), head_dim, dim=-1), q.flatten(-2), "q")
        _close(ops.pairs_to_rotate_half(ck.flatten(-2), head_dim, dim=-1), k.flatten(-2), "k")
        _close(cv, v, "v")
        group = nh // nkv
        scores = torch.einsum("...hd,...hd->...h", cq.double(), ck.double().repeat_interleave(group, -2))
        _close(scores, torch.einsum("...hd,...hd->...h", q, k.repeat_interleave(group, -2)), "q·k")


# --- argument errors, before any kernel -------------------------------------------------------------


def _valid():
    gen = _gen("valid")
    lead, hd = (2, 5), 64
    nh, nkv = HEADS[hd]
    return types.SimpleNamespace(
        x=_randn(gen, *lead, K), w=_randn(gen, N, K), res=_randn(gen, *lead, N), nw=_randn(gen, N),
        rstd=_rstd(gen, lead), w_gu=_randn(gen, F2, K), w_qkv=_randn(gen, (nh + 2 * nkv) * hd, K),
        pos=torch.randint(0, 100, lead), freqs=ops.rope_frequencies(hd, nh, nkv), nh=nh, nkv=nkv,
        qw=_randn(gen, hd), w_lm=_randn(gen, V, K), target=torch.randint(0, V, lead))


BAD_CALLS = [
    ("x dtype", lambda t: ops.rms_linear(t.x.float(), t.w, t.rstd), TypeError,
     r"rms_linear: x has dtype torch.float32; use torch.bfloat16 or torch.float16"),
    ("weight dtype", lambda t: ops.linear_swiglu(t.x, t.w_gu.half()), TypeError,
     r"linear_swiglu: weight has dtype torch.float16 but x has torch.bfloat16"),
    ("weight not a tensor", lambda t: ops.rms_linear(t.x, t.w.tolist(), t.rstd), TypeError,
     r"weight must be a torch.Tensor, got list"),
    ("weight 1-D", lambda t: ops.rms_linear(t.x, t.nw, t.rstd), ValueError, r"weight must be 2-D \(N, K\)"),
    ("mismatched K", lambda t: ops.linear_residual_norm(t.x[..., :32], t.w, t.res, t.nw), ValueError,
     r"x's last dimension \(32\) must equal weight.shape\[1\] \(K = 64\)"),
    ("devices", lambda t: ops.rms_linear(t.x, t.w.to("meta"), t.rstd), ValueError, r"put them on one device"),
    ("residual shape", lambda t: ops.linear_residual_norm(t.x, t.w, t.res[..., :-8], t.nw), ValueError,
     r"residual must have shape \(2, 5, 72\) .*got \(2, 5, 64\)"),
    ("residual flattened", lambda t: ops.linear_residual_norm(t.x, t.w, t.res.flatten(0, 1), t.nw), ValueError,
     r"residual must have shape \(2, 5, 72\)"),
    ("residual dtype", lambda t: ops.linear_residual_norm(t.x, t.w, t.res.half(), t.nw), TypeError,
     r"residual has dtype torch.float16, expected torch.bfloat16"),
    ("norm_weight length", lambda t: ops.linear_residual_norm(t.x, t.w, t.res, t.nw[:-8]), ValueError,
     r"norm_weight must have shape \(72,\)"),
    ("norm_weight dtype", lambda t: ops.linear_residual_norm(t.x, t.w, t.res, t.nw.float()), TypeError,
     r"norm_weight has dtype torch.float32"),
    ("rstd dtype", lambda t: ops.rms_linear(t.x, t.w, t.rstd.bfloat16()), TypeError,
     r"rstd has dtype torch.bfloat16, expected torch.float32"),
    ("rstd dtype swiglu", lambda t: ops.linear_swiglu(t.x, t.w_gu, t.rstd.double()), TypeError,
     r"rstd has dtype torch.float64, expected torch.float32"),
    ("rstd shape", lambda t: ops.qkv_rope(t.x, t.w_qkv, t.pos, t.freqs, t.nh, t.nkv, rstd=t.rstd[:, None]),
     ValueError, r"rstd must have shape \(2, 5\)"),
    ("rstd device", lambda t: ops.lm_head_cross_entropy(t.x, t.w_lm, t.target, t.rstd.to("meta")), ValueError,
     r"rstd is on meta but x is on cpu"),
    ("activation", lambda t: ops.rms_linear(t.x, t.w, t.rstd, activation="tanh"), ValueError,
     r"activation must be one of \[None, 'silu', 'relu', 'gelu', 'gelu_tanh'\]"),
    ("odd gate/up rows", lambda t: ops.linear_swiglu(t.x, t.w_gu[:-1]), ValueError,
     r"weight has 143 rows; gate/up rows come in interleaved pairs"),
    ("odd gate/up rows train", lambda t: ops.linear_swiglu_train(t.x, t.w_gu[:-1], t.rstd), ValueError,
     r"interleaved pairs"),
    ("head count", lambda t: ops.qkv_rope(t.x, t.w_qkv, t.pos, t.freqs, 5, 2), ValueError,
     r"weight has 512 rows, not a multiple of n_heads \+ 2·n_kv_heads = 9"),
    ("no kv heads", lambda t: ops.qkv_rope(t.x, t.w_qkv, t.pos, t.freqs, 8, 0), ValueError, r"n_heads"),
    ("head_dim", lambda t: ops.qkv_rope(t.x, t.w_qkv, t.pos, t.freqs, 8, 4), ValueError,
     r"head_dim 32 is not supported; use 64 or 128"),
    ("freqs table width", lambda t: ops.qkv_rope(t.x, t.w_qkv, t.pos, t.freqs[:, :-64], t.nh, t.nkv), ValueError,
     r"freqs must be the \(2, 512\) float32 table of coda_ext.ops.rope_frequencies"),
    ("freqs table dtype", lambda t: ops.qkv_rope(t.x, t.w_qkv, t.pos, t.freqs.double(), t.nh, t.nkv), ValueError,
     r"freqs must be the \(2, 512\) float32 table"),
    ("freqs inv_freq only", lambda t: ops.qkv_rope(t.x, t.w_qkv, t.pos, ops.default_inv_freq(64), t.nh, t.nkv),
     ValueError, r"freqs must be"),
    ("freqs device", lambda t: ops.qkv_rope(t.x, t.w_qkv, t.pos, t.freqs.to("meta"), t.nh, t.nkv), ValueError,
     r"freqs is on meta but x is on cpu"),
    ("positions shape", lambda t: ops.qkv_rope(t.x, t.w_qkv, t.pos[:, :-1], t.freqs, t.nh, t.nkv), ValueError,
     r"positions must have shape \(2, 5\)"),
    ("positions list", lambda t: ops.qkv_rope(t.x, t.w_qkv, t.pos.tolist(), t.freqs, t.nh, t.nkv), TypeError,
     r"positions must be a tensor of shape \(2, 5\), got list"),
    ("QK-norm half", lambda t: ops.qkv_rope(t.x, t.w_qkv, t.pos, t.freqs, t.nh, t.nkv, q_norm_weight=t.qw),
     ValueError, r"needs both q_norm_weight and k_norm_weight"),
    ("QK-norm length", lambda t: ops.qkv_rope(t.x, t.w_qkv, t.pos, t.freqs, t.nh, t.nkv, q_norm_weight=t.qw,
                                              k_norm_weight=t.qw[:32]), ValueError,
     r"k_norm_weight must have shape \(64,\)"),
    ("reduction", lambda t: ops.lm_head_cross_entropy(t.x, t.w_lm, t.target, reduction="avg"), ValueError,
     r"reduction must be one of \('none', 'sum', 'mean'\), got 'avg'"),
    ("target float", lambda t: ops.lm_head_cross_entropy(t.x, t.w_lm, t.target.float()), TypeError,
     r"target has dtype torch.float32; use integer class indices"),
    ("target shape", lambda t: ops.lm_head_cross_entropy(t.x, t.w_lm, t.target.flatten()), ValueError,
     r"target must have shape \(2, 5\)"),
    ("vocabulary", lambda t: ops.lm_head_cross_entropy(t.x.to("meta"), torch.empty(2**24, K, dtype=BF16, device="meta"),
                                                       t.target.to("meta")), ValueError,
     r"a vocabulary of 16777216 is not supported"),
    ("interleave shapes", lambda t: ops.interleave_gate_up(t.w, t.w[:-8]), ValueError, r"gate \(72, 64\) and up"),
    ("split odd rows", lambda t: ops.split_gate_up(t.w_gu[:-1]), ValueError, r"143 rows cannot be gate/up pairs"),
    ("rotate-half rows", lambda t: ops.rotate_half_to_pairs(t.w, 64), ValueError,
     r"size 72 along dim 0 is not a multiple of head_dim 64"),
    ("rotate-half odd head_dim", lambda t: ops.pairs_to_rotate_half(t.w, 9), ValueError, r"head_dim must be even"),
    ("rope_frequencies head_dim", lambda t: ops.rope_frequencies(63, 4, 2), ValueError, r"head_dim must be even"),
    ("rope_frequencies inv_freq", lambda t: ops.rope_frequencies(64, 4, 2, inv_freq=torch.ones(64)), ValueError,
     r"inv_freq must have shape \(32,\)"),
]


@pytest.mark.parametrize("call,exc,match", [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS])
def test_bad_arguments_raise_before_any_kernel(no_kernel, call, exc, match):
    with pytest.raises(exc, match=match):
        call(_valid())
