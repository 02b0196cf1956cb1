"""The ready ops (coda_ext.ops) on an SM90 GPU: values against their fp32 references, opcheck,
torch.compile(fullgraph=True), CUDA-graph capture, and the LM head's memory at Llama 3's vocabulary.

The cases and the kernels they use are in ops_cases.py (built in parallel before the tests); the
tolerance rule, NaN memory and the in-dtype QKV math are tests/helpers' (checks, references).
Tolerance (docs/design.md): each output's max error against the fp32 reference is at most 2x the error
of the same math done by PyTorch in the op's dtype (F.linear in that dtype, then the pointwise
math in it) plus a small floor. The ops allocate their outputs, so every call runs in a fresh
memory pool whose free memory is filled with NaN first: an unwritten element shows.
"""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

import coda_ext as ce
from coda_ext import ops
from coda_ext.ops import lm_head_ce, qkv, residual_norm, rms_scale, swiglu
from tests.gpu import ops_cases
from tests.helpers import rand
from tests.helpers.checks import assert_within_rule, nan_memory
from tests.helpers.custom_op_calls import RecordCustomOps
from tests.helpers.references import ACTIVATIONS, EPS, THETA, qkv_in_dtype

pytestmark = pytest.mark.gpu

DEVICE = "cuda"


@pytest.fixture(scope="module", autouse=True)
def kernels():
    """Every kernel of ops_cases.py, built in parallel (cached builds load in milliseconds)."""
    ce.prebuild(ops_cases.build_items(), jobs=os.cpu_count())


def make_inputs(case: ops_cases.Case, seed: int = 0):
    """(args, kwargs) of the case's public function: fresh random tensors on the GPU."""
    gen = rand.generator(case.id, seed, device=DEVICE)
    dt, m, lead, N, K = getattr(torch, case.dtype), ops_cases.MODELS[case.model], case.lead, case.N, case.K

    def r(*shape, scale=1.0):
        return rand.randn(gen, *shape, dtype=dt, scale=scale)

    x, w = r(*lead, K), r(N, K, scale=K ** -0.5)
    rstd = rand.positive(gen, lead)
    v = case.variant
    if case.op == "linear_residual_norm":
        return (x, w, r(*lead, N), r(N)), {"eps": EPS}
    if case.op == "rms_linear":
        return (x, w, rstd), {"activation": v[0]}
    if case.op == "linear_swiglu":
        return (x, w, rstd if v[0] else None), {}
    if case.op == "qkv_rope":
        scaled, qk_norm, hd = v
        pos = rand.indices(gen, lead, high=100_000)
        freqs = ops.rope_frequencies(hd, m.n_heads, m.n_kv_heads, theta=THETA, device=DEVICE)
        kwargs = {"rstd": rstd if scaled else None, "eps": EPS}
        if qk_norm:
            kwargs.update(q_norm_weight=r(hd), k_norm_weight=r(hd))
        return (x, w, pos, freqs, m.n_heads, m.n_kv_heads), kwargs
    target = rand.targets(gen, lead, vocab=N)
    return (r(*lead, K, scale=2.0), w, target, rstd if v[0] else None), {"reduction": "none"}


def run(case, args, kwargs) -> tuple:
    out = getattr(ops, case.function)(*args, **kwargs)
    return out if isinstance(out, tuple) else (out,)


def reference(case, args, kwargs) -> tuple:
    """The op module's fp32 reference."""
    if case.op == "linear_residual_norm":
        return residual_norm.reference(*args, **kwargs)
    if case.op == "rms_linear":
        return (rms_scale.reference(*args, **kwargs),)
    if case.op == "linear_swiglu":
        y, z = swiglu.reference(*args)
        return (y, z) if case.variant[1] else (y,)
    if case.op == "qkv_rope":
        x, w, pos, _, nh, nkv = args
        return (qkv.reference(x, w, pos, nh, nkv, theta=THETA, rstd=kwargs["rstd"], eps=EPS,
                              q_norm_weight=kwargs.get("q_norm_weight"), k_norm_weight=kwargs.get("k_norm_weight")),)
    return lm_head_ce.reference(*args, **kwargs)


def in_dtype(case, args, kwargs) -> tuple:
    """The same math done by PyTorch in the op's dtype: F.linear, then every pointwise step, in it."""
    x, w = args[:2]
    dt = x.dtype
    acc = F.linear(x, w)
    if case.op == "linear_residual_norm":
        out = acc + args[2]
        return out, out * args[3], torch.rsqrt(out.pow(2).mean(-1) + EPS)
    if case.op == "rms_linear":
        return (ACTIVATIONS[kwargs["activation"]](acc * args[2].to(dt)[..., None]),)
    if case.op == "linear_swiglu":
        z = acc if args[2] is None else acc * args[2].to(dt)[..., None]
        y = F.silu(z[..., 0::2]) * z[..., 1::2]
        return (y, z) if case.variant[1] else (y,)
    if case.op == "qkv_rope":
        _, _, pos, _, nh, nkv = args
        return (qkv_in_dtype(acc, pos, nh, nkv, THETA, **kwargs),)
    target, rstd = args[2], args[3]
    logits = acc if rstd is None else acc * rstd.to(dt)[..., None]
    loss = F.cross_entropy(logits.flatten(0, -2), target.flatten(), reduction="none").reshape(target.shape)
    return loss, torch.logsumexp(logits, -1)


OUTPUTS = {"linear_residual_norm": ("out", "h", "rstd"), "rms_linear": ("out",), "linear_swiglu": ("y",),
           "linear_swiglu_train": ("y", "z"), "qkv_rope": ("qkv",), "lm_head_cross_entropy": ("loss", "lse")}


def check(case, got: tuple, ref: tuple, base: tuple, report, note: str = "") -> None:
    names = OUTPUTS[case.function]
    assert len(got) == len(ref) == len(base) == len(names), case.label
    for name, g, r, b in zip(names, got, ref, base):
        assert_within_rule(f"{case.label}{note} {name}", g, r, b, report, "torch_dtype_err", f"PyTorch in {case.dtype}")


def test_nan_memory_hands_out_nan():
    with nan_memory():
        small, large = torch.empty(7, device="cuda"), torch.empty(333, 14336, dtype=torch.bfloat16, device="cuda")
        half = torch.empty(333, 2048, dtype=torch.float16, device="cuda")
        assert all(torch.isnan(t).all() for t in (small, large, half))


def test_nan_memory_gives_memory_back():
    """Outputs that outlive the block, many times over (as every test that checks them after it does):
    the memory reserved stays bounded instead of growing ~1 GiB a use until a later test runs out."""
    torch.cuda.empty_cache()
    start = torch.cuda.memory_reserved()
    for _ in range(12):
        with nan_memory():
            out = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
        out.fill_(1)
        del out
    grown = torch.cuda.memory_reserved() - start
    assert grown < (3 << 30), f"memory reserved grew by {grown / 2**30:.1f} GiB over 12 uses"


@pytest.mark.parametrize("case", ops_cases.CASES, ids=lambda c: c.id)
def test_op_matches_reference(case, report):
    args, kwargs = make_inputs(case)
    with nan_memory():
        got = run(case, args, kwargs)
    torch.cuda.synchronize()
    check(case, got, reference(case, args, kwargs), in_dtype(case, args, kwargs), report)


FEATURES = ops_cases.feature_cases()


@pytest.mark.parametrize("case", FEATURES, ids=lambda c: c.function)
def test_opcheck(case):
    """torch.library.opcheck of the custom op with the arguments its public function passes."""
    args, kwargs = make_inputs(case)
    with RecordCustomOps() as rec:
        run(case, args, kwargs)
    assert [str(c[0]) for c in rec.calls] == [f"coda_ext.{case.function}.default"]
    torch.library.opcheck(*rec.calls[0])


@pytest.mark.parametrize("case", FEATURES, ids=lambda c: c.function)
def test_torch_compile_fullgraph_matches_eager(case):
    args, kwargs = make_inputs(case)
    fn = getattr(ops, case.function)
    compiled = torch.compile(lambda *a: fn(*a, **kwargs), fullgraph=True)
    got, want = compiled(*args), run(case, args, kwargs)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want):
        assert torch.equal(g, w), case.id


@pytest.mark.parametrize("case", FEATURES, ids=lambda c: c.function)
def test_cuda_graph_replay_matches_eager(case):
    """Captured once (after a warm-up on a side stream), replayed on new input values."""
    args, kwargs = make_inputs(case)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run(case, args, kwargs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = run(case, args, kwargs)
    new_args, new_kwargs = make_inputs(case, seed=1)
    for a, b in zip([*args, *kwargs.values()], [*new_args, *new_kwargs.values()]):
        if isinstance(a, torch.Tensor):
            a.copy_(b)
    graph.replay()
    torch.cuda.synchronize()
    for g, w in zip(static, run(case, new_args, new_kwargs)):
        assert torch.equal(g, w), case.id


def test_lm_head_llama3_vocabulary(report):
    """M = 8192, K = 4096, V = 128256: the loss ('mean' and per token) and lse within the tolerance,
    and the op's peak extra memory under 5 % of the M x V bf16 logits it never materializes."""
    case = ops_cases.LM_HEAD_LARGE
    args, _ = make_inputs(case)
    ops.lm_head_cross_entropy(*args)  # loads the kernel
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    loss, lse = ops.lm_head_cross_entropy(*args, reduction="mean")
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before
    logits_bytes = case.M * case.N * 2
    report(f"{case.label}: peak extra memory {extra / 2**20:.1f} MiB = {100 * extra / logits_bytes:.2f} % of logits")
    assert extra < 0.05 * logits_bytes
    for reduction, got in (("mean", (loss, lse)), ("none", run(case, args, {"reduction": "none"}))):
        ref = lm_head_ce.reference(*args, reduction=reduction)
        base = in_dtype(case, args, {"reduction": "none"})
        if reduction == "mean":
            base = (base[0][args[2] != -100].mean(), base[1])
        check(case, got, ref, base, report, note=f" {reduction}")


@pytest.mark.parametrize("n", [1, 1023, 16385])
def test_rstd_finish_kernel(n):
    """ops.finish.rstd_ on the GPU (its Triton kernel, linear_residual_norm's statistic): in place, the same bits as
    PyTorch's rsqrt(sumsq / N + eps) on the GPU, over row counts that are not a multiple of its block."""
    from coda_ext.ops import finish

    s = rand.positive(rand.generator("rstd_ kernel", n, device=DEVICE), n) * 3000.0
    want = torch.rsqrt(s / 4096 + 1e-5)
    ptr = s.data_ptr()
    got = finish.rstd_(s, 4096, 1e-5)
    assert got.data_ptr() == ptr and torch.equal(got, want)


@pytest.mark.parametrize("lead,d,dtype", [((333,), 2048, torch.bfloat16), ((2, 77), 4096, torch.bfloat16),
                                          ((5,), 700, torch.float16), ((1,), 8, torch.bfloat16)])
def test_rms_norm_input_kernel(lead, d, dtype):
    """The layer input's RMSNorm (ops.rms_norm_input: one Triton kernel on contiguous rows, norm_kernel.py):
    h = x ⊙ γ exactly as PyTorch rounds it in x's dtype (γ in fp32 rounded to x's dtype first), rstd against
    fp64 within fp32 summation; outputs from NaN-filled memory; widths that are not a multiple of its column
    step. Its custom op passes opcheck and runs the same under torch.compile(fullgraph=True)."""
    from coda_ext.ops import norm_kernel

    assert norm_kernel.available()
    gen = rand.generator("rms_norm_input kernel", *lead, d, device=DEVICE)
    x = (rand.randn(gen, *lead, d) * 3).to(dtype)
    w = rand.randn(gen, d)
    with nan_memory():
        h, rstd = ops.rms_norm_input(x, w, 1e-6)
    assert h.shape == x.shape and h.dtype == dtype and rstd.shape == lead and rstd.dtype == torch.float32
    assert torch.equal(h, x * w.to(dtype))
    want = torch.rsqrt(x.double().pow(2).mean(-1) + 1e-6)
    torch.testing.assert_close(rstd.double(), want, rtol=4e-6, atol=0)   # fp32 sums of up to 4096 squares
    torch.library.opcheck(torch.ops.coda_ext.rms_norm_input_rows.default, (x.reshape(-1, d), w, 1e-6))
    torch._dynamo.reset()
    compiled = torch.compile(lambda a, g: torch.ops.coda_ext.rms_norm_input_rows(a, g, 1e-6), fullgraph=True)
    ch, crstd = compiled(x.reshape(-1, d), w)                # the custom op kept in the graph: the same kernel
    assert torch.equal(ch, h.reshape(-1, d)) and torch.equal(crstd, rstd.reshape(-1))
