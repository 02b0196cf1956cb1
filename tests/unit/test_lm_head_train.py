"""The LM head's training path on the CPU (ops.lm_head_cross_entropy_loss; coda_ext::lm_head_cross_entropy_train):
the three-GEMM algorithm of lm_head_ce.train_gradients with a reference logits GEMM in place of the kernel, and
the custom op's autograd and fake with a CPU kernel registered for the test only. The kernel itself runs in
tests/gpu/test_backward_ops_gpu.py."""
from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F

from coda_ext import graphs, ops
from coda_ext.ops import common, lm_head_ce
from tests.helpers import rand

M, V, D, CHUNK = 37, 64, 24, 16        # three chunks of rows, the last one partial


def reference_step(x, weight, target, rstd):
    """What the train_graph GEMM returns for one chunk: (e = exp(logits) in x's dtype, lse, target_logit)."""
    logits = x.double() @ weight.double().t()
    if rstd is not None:
        logits = logits * rstd.double()[:, None]
    hit = torch.arange(weight.shape[0])[None, :] == target[:, None]
    return (logits.exp().to(x.dtype), torch.logsumexp(logits, -1).float(),
            torch.where(hit, logits, 0.0).sum(-1).float())


def _inputs(dtype, scaled, seed=0):
    gen = rand.generator(("lm_head_train", str(dtype), scaled, seed))
    x = rand.randn(gen, M, D, dtype=dtype, scale=2.0)
    w = rand.randn(gen, V, D, dtype=dtype, scale=D ** -0.5)
    rstd = rand.positive(gen, M) if scaled else None
    target = rand.targets(gen, M, vocab=V)
    target[::5] = -100                  # tokens that do not count
    return x, w, target, rstd


def _reference_grads(x, w, target, rstd, reduction):
    """(loss, dx, dW, drstd) by fp64 autograd."""
    leaves = [t.detach().double().requires_grad_() if t is not None else None for t in (x, w, rstd)]
    xx, ww, rr = leaves
    logits = xx @ ww.t()
    if rr is not None:
        logits = logits * rr[:, None]
    loss = F.cross_entropy(logits, target, ignore_index=-100, reduction=reduction)
    grads = torch.autograd.grad(loss, [t for t in leaves if t is not None])
    return loss.detach(), *grads, *([None] if rr is None else [])


@pytest.mark.parametrize("scaled", [False, True])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_train_gradients_match_fp64_autograd(scaled, reduction):
    """fp32 operands: the algorithm (exp(logits) with its target entry replaced, the row scales, the fp32
    weight-gradient accumulator across chunks) equals fp64 autograd to fp32 round-off."""
    x, w, target, rstd = _inputs(torch.float32, scaled)
    loss, lse, dx, dW, drstd, in_range = lm_head_ce.train_gradients(x, w, target, rstd, -100, reduction, CHUNK,
                                                                    logits_chunk=reference_step)
    assert in_range is True
    want = _reference_grads(x, w, target, rstd, reduction)
    assert dx.dtype == torch.float32 and dW.dtype == torch.float32
    for name, got, ref in zip(("loss", "dx", "dW", "drstd"), (loss, dx, dW, drstd), want):
        if ref is None:
            continue
        scale = max(1.0, ref.abs().max().item())
        torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5 * scale, msg=lambda m, n=name: f"{n}: {m}")
    assert torch.equal(dx[target == -100], torch.zeros_like(dx[target == -100]))
    assert torch.allclose(lse.double(), (x.double() @ w.double().t() * (rstd.double()[:, None] if scaled else 1))
                          .logsumexp(-1), atol=1e-5)


def test_train_gradients_bf16_within_rounding():
    """bf16 operands: every gradient within bf16 rounding of the fp64 answer (e and the scaled rows are 16-bit)."""
    x, w, target, rstd = _inputs(torch.bfloat16, True)
    _, _, dx, dW, drstd, _ = lm_head_ce.train_gradients(x, w, target, rstd, -100, "mean", CHUNK,
                                                        logits_chunk=reference_step)
    want = _reference_grads(x, w, target, rstd, "mean")
    for name, got, ref in zip(("dx", "dW", "drstd"), (dx, dW, drstd), want[1:]):
        err = (got.double() - ref).abs().max().item()
        assert err <= 2 ** -7 * ref.abs().max().item(), (name, err)


@pytest.mark.parametrize("block", [5, 8, 32, 10**6], ids=["5 rows", "8", "32: one block", "more than V/2"])
def test_weight_gradient_takes_the_accumulator_s_memory(monkeypatch, block):
    """The 16-bit weight gradient is written into the first fp32 accumulator half's memory, block by block
    (V · d · 2 bytes less at the op's peak), with the values of the fp32 accumulator rounded once."""
    monkeypatch.setattr(lm_head_ce, "CONVERT_BLOCK_ROWS", block)
    x, w, target, rstd = _inputs(torch.bfloat16, True)
    *_, dW, _, _ = lm_head_ce.train_gradients(x, w, target, rstd, -100, "mean", CHUNK, logits_chunk=reference_step)
    monkeypatch.setattr(lm_head_ce, "accumulator_halves", lambda V, dtype: (slice(0, V),))
    *_, want, _, _ = lm_head_ce.train_gradients(x, w, target, rstd, -100, "mean", CHUNK, logits_chunk=reference_step)
    assert dW.dtype == w.dtype and dW.shape == w.shape and dW.is_contiguous()
    assert torch.equal(dW, want)
    assert dW.untyped_storage().nbytes() == w.numel() * w.element_size()


def test_weight_gradient_of_an_odd_vocabulary_or_fp32_keeps_one_accumulator():
    assert lm_head_ce.accumulator_halves(63, torch.bfloat16) == (slice(0, 63),)
    assert lm_head_ce.accumulator_halves(64, torch.float32) == (slice(0, 64),)
    assert lm_head_ce.accumulator_halves(64, torch.bfloat16) == (slice(0, 32), slice(32, 64))


def test_train_chunk_rows_and_gemms():
    assert lm_head_ce.train_chunk_rows(16384, 128256) == 4096          # 1 GiB of bf16 exp(logits)
    assert lm_head_ce.train_chunk_rows(16384, 128256, 512 * 2**20) == 2048
    assert lm_head_ce.train_chunk_rows(100, 128256) == 100             # never more rows than there are
    assert lm_head_ce.train_chunk_rows(16384, 2**24 - 8) == 128        # at least 128 rows
    launched = [g for g in lm_head_ce.gemms(5000, 128256, 2048, False, train=True) if g[1] == "kk"]
    assert [shape for _, _, shape in launched] == [(904, 128256, 2048), (4096, 128256, 2048)]


def test_dw_backend_lists_its_kernels_and_refuses_unknown_names():
    """Under dw_backend("coda") (the default) the training path's kernel list (prebuild's) carries the weight
    gradient's kernels: per chunk its split-accumulator graph (the first chunk's plain product, the middle ones
    accumulating, the last one writing the gradient) at its height; under "coda_f32" per chunk height and
    accumulator half the plain product and the accumulating one."""
    assert lm_head_ce._dw["backend"] == "coda"   # the default
    with lm_head_ce.dw_backend("cublas"):
        assert all(major == "kk" for _, major, _ in lm_head_ce.gemms(5000, 128256, 2048, False, train=True))
    assert lm_head_ce._dw["backend"] == "coda"

    def split(a, f):
        return graphs.weight_grad_split(a, f).build().digest()

    def listed(M):
        launched = lm_head_ce.gemms(M, 128256, 2048, False, train=True)
        return [(g.build().digest(), major, shape) for g, major, shape in launched if major == "mn"]

    assert listed(5000) == [(split(False, False), "mn", (128256, 2048, 4096)),
                            (split(True, True), "mn", (128256, 2048, 904))]
    assert listed(12288) == [(split(False, False), "mn", (128256, 2048, 4096)),
                             (split(True, False), "mn", (128256, 2048, 4096)),
                             (split(True, True), "mn", (128256, 2048, 4096))]
    assert listed(100) == [(split(False, True), "mn", (128256, 2048, 100))]   # one chunk: the gradient itself
    with lm_head_ce.dw_backend("coda_f32"):
        dw = listed(5000)
        plain, accumulate = (graphs.weight_grad_f32(a).build().digest() for a in (False, True))
        assert sorted(dw) == sorted((graph, "mn", (64128, 2048, rows)) for rows in (904, 4096)
                                    for graph in (plain, accumulate))
        assert {a for _, _, (_, _, a) in lm_head_ce.dw_gemms(100, 128256, 2048)} == {100}   # one chunk
        assert len(lm_head_ce.dw_gemms(100, 128256, 2048)) == 1
    with pytest.raises(ValueError, match="one of"), lm_head_ce.dw_backend("cutlass"):
        pass


def test_dw_kernel_takes_heads_whose_halves_are_16_byte_aligned(monkeypatch):
    """Under "coda_f32" the kernel reads each accumulator half of exp(logits)ᵀ along V: V/2 must be a multiple of 8
    (bf16), else the head's weight gradient stays with cuBLAS (listed nowhere, and the training path does not
    launch it). Regression: V = 50264 (a multiple of 8, V/2 = 25132 is not) was handed to the kernel, whose operand
    check raised. The split accumulator ("coda") needs V a multiple of 8 and d of 16 (its uint8 rows); where d is
    not, the head takes the fp32 accumulator's kernel ("coda_f32") if that fits, else cuBLAS (dw_runs_on)."""
    assert lm_head_ce.dw_kernel_fits(50264, 768) and not lm_head_ce.dw_kernel_fits(50257, 768)   # "coda"
    assert not lm_head_ce.dw_kernel_fits(128256, 4104)    # "coda": d not a multiple of 16
    assert not lm_head_ce.dw_kernel_fits(128256, 4096, torch.float32)
    assert [lm_head_ce.dw_runs_on(*vd) for vd in ((128256, 4096), (128256, 4104), (50264, 4104), (50257, 768))] == \
        ["coda", "coda_f32", "cublas", "cublas"]
    assert [g.build().digest() for g, _, _ in lm_head_ce.dw_gemms(5000, 128256, 4104)] == \
        [graphs.weight_grad_f32(a).build().digest() for a in (False, True)] * 2   # two chunk heights, f32 kernels
    with lm_head_ce.dw_backend("coda_f32"):
        assert lm_head_ce.dw_kernel_fits(128256, 4096) and lm_head_ce.dw_kernel_fits(32000, 2048)
        assert not lm_head_ce.dw_kernel_fits(50264, 768)      # V/2 = 25132
        assert not lm_head_ce.dw_kernel_fits(128256, 4100)    # d not a multiple of 8
        assert lm_head_ce.dw_gemms(4096, 50264, 768) == []
        assert all(g[1] == "kk" for g in lm_head_ce.gemms(4096, 50264, 768, False, train=True))
    launched = []
    monkeypatch.setattr(lm_head_ce, "_dw_gemm", lambda a, b, acc, backend: launched.append(backend) or (
        lm_head_ce._mm_f32(a, b) if acc is None else acc.add_(lm_head_ce._mm_f32(a, b))))
    monkeypatch.setattr(lm_head_ce, "_logits_chunk", reference_step)
    gen = rand.generator("dw_kernel_fits")
    x = rand.randn(gen, 40, 16, dtype=torch.bfloat16)
    with lm_head_ce.dw_backend("coda_f32"):
        for V, want in ((72, "cublas"), (80, "coda_f32")):   # V/2 = 36: not a multiple of 8; 40: one
            w = rand.randn(gen, V, 16, dtype=torch.bfloat16, scale=0.25)
            launched.clear()
            lm_head_ce.train_gradients(x, w, rand.targets(gen, 40, vocab=V), None, -100, "mean", 16)
            assert len(launched) == 6 and set(launched) == {want}   # 3 chunks x 2 halves


def _interpreted_split(calls):
    """lm_head_ce._dw_split with the reference interpreter in place of the kernel (outputs rounded to their stored
    dtypes, written over the accumulator's tensors as the kernel writes them)."""
    from coda_ext.graph.interpret import interpret

    def run(a, b, acc, final):
        calls.append((acc is not None, final))
        graph = graphs.weight_grad_split(acc is not None, final)
        out = interpret(graph, a.float(), b.t().float(), **({} if acc is None else {"hi_in": acc[0], "lo_in": acc[1]}))
        if final:
            dw = out["dw"].to(b.dtype)
            return dw if acc is None else acc[0].view(b.dtype).copy_(dw)
        hi, lo = out["hi"].to(torch.bfloat16), out["lo"].to(torch.uint8)
        assert torch.equal(hi.float(), out["hi"]) and torch.equal(lo.float(), out["lo"])   # exact in their dtypes
        return (hi, lo) if acc is None else (acc[0].copy_(hi), acc[1].copy_(lo))

    return run


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [M, CHUNK], ids=["one chunk", "three chunks"])
def test_split_accumulator_gives_the_fp32_accumulator_s_gradient(monkeypatch, dtype, rows):
    """dw_backend "coda": the weight gradient kept across chunks in 24 bits (a bfloat16 and a uint8 tensor) and
    written by the last chunk in the weight's dtype over the bfloat16 part equals the fp32 accumulator's gradient
    to within one rounding in the weight's dtype, plus 2^-16 of the partial sums per chunk (where chunks cancel,
    an element far below the tensor's largest moves by more than its own ulp: bounded by 2^-14 of the largest),
    and stays within the weight dtype's rounding of fp64 autograd."""
    calls = []
    monkeypatch.setattr(lm_head_ce, "_dw_split", _interpreted_split(calls))
    monkeypatch.setattr(lm_head_ce, "_logits_chunk", reference_step)
    gen = rand.generator(("split accumulator", str(dtype), rows))
    x = rand.randn(gen, M, 32, dtype=dtype, scale=2.0)
    w = rand.randn(gen, V, 32, dtype=dtype, scale=32 ** -0.5)
    target = rand.targets(gen, M, vocab=V)
    *_, dW, _, _ = lm_head_ce.train_gradients(x, w, target, None, -100, "sum", rows)
    assert calls == ([(False, False), (True, False), (True, True)] if rows == CHUNK else [(False, True)])
    with lm_head_ce.dw_backend("cublas"):
        *_, want, _, _ = lm_head_ce.train_gradients(x, w, target, None, -100, "sum", rows)
    assert dW.dtype == dtype and dW.shape == w.shape
    ulp = 2.0 ** (-7 if dtype == torch.bfloat16 else -10)   # one ulp, relative, at the bottom of a binade
    assert ((dW.double() - want.double()).abs() <= ulp * want.double().abs() + 2.0 ** -14 * want.abs().max()).all()
    ref = _reference_grads(x, w, target, None, "sum")[2]
    assert ((dW.double() - ref).abs() <= 2 * ulp * ref.abs().max()).all()


def test_weight_grad_split_graph_keeps_the_sum_to_24_bits():
    """graphs.weight_grad_split: each chunk's sum rounded to 24 bits and split into hi16 (bfloat16) and lo8
    (uint8), joined back by the next chunk; the final graph stores the sum in the op's dtype."""
    from coda_ext.graph.interpret import interpret
    from coda_ext.graph.semantics import join24

    gen = torch.Generator().manual_seed(0)
    A, W = (torch.randn(*s, generator=gen) for s in ((40, 7), (24, 7)))
    for accumulate in (False, True):
        ir = graphs.weight_grad_split(accumulate, False).build()
        assert sorted((n.attr("name"), n.attr("dtype")) for n in ir.nodes if n.kind == "store") == \
            [("hi", "bfloat16"), ("lo", "uint8")]
        assert sorted((n.attr("name"), n.attr("dtype")) for n in ir.nodes if n.kind == "tile") == \
            ([("hi_in", "bfloat16"), ("lo_in", "uint8")] if accumulate else [])
    first = interpret(graphs.weight_grad_split(False, False), A, W)
    exact = A.double() @ W.double().t()
    v = join24(first["hi"], first["lo"]).double()
    assert ((v - exact).abs() <= 2.0 ** -15 * exact.abs() + 1e-12).all()
    second = interpret(graphs.weight_grad_split(True, False), A, W, hi_in=first["hi"].to(torch.bfloat16),
                       lo_in=first["lo"].to(torch.uint8))
    v2 = join24(second["hi"], second["lo"]).double()
    assert ((v2 - 2 * exact).abs() <= 2.0 ** -14 * (2 * exact).abs() + 1e-12).all()
    last = interpret(graphs.weight_grad_split(True, True), A, W, hi_in=second["hi"].to(torch.bfloat16),
                     lo_in=second["lo"].to(torch.uint8))
    assert set(last) == {"dw"}
    assert ((last["dw"].double() - 3 * exact).abs() <= 2.0 ** -13 * (3 * exact).abs() + 1e-12).all()


def test_weight_grad_f32_graph_is_the_product_plus_the_accumulator():
    """graphs.weight_grad_f32: no main output, an fp32 store of acc (+ the fp32 tile it accumulates into)."""
    from coda_ext.graph.interpret import interpret

    gen = torch.Generator().manual_seed(0)
    A, W, prev = (torch.randn(*s, generator=gen, dtype=torch.float64) for s in ((5, 7), (6, 7), (5, 6)))
    for accumulate in (False, True):
        graph = graphs.weight_grad_f32(accumulate)
        ir = graph.build()
        assert [n.attr("dtype") for n in ir.nodes if n.kind == "store"] == ["float32"]
        out = interpret(graph, A, W, compute_dtype=torch.float64, **({"acc": prev} if accumulate else {}))
        assert set(out) == {"out"}
        torch.testing.assert_close(out["out"], A @ W.t() + (prev if accumulate else 0), rtol=1e-12, atol=1e-12)


# --- the custom op, with a CPU kernel that runs the algorithm on the reference GEMM ----------------------------


def _has_cpu_kernel() -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key("coda_ext::lm_head_cross_entropy_train", "CPU")


@pytest.fixture
def cpu_train_kernel(monkeypatch):
    """coda_ext::lm_head_cross_entropy_train on CPU tensors runs train_gradients with reference_step, for this
    test only (the fake's check of the kernel's operands stays on: bf16 rows pass it)."""
    monkeypatch.setattr(common, "check_gemm", lambda *args, **kwargs: None)
    assert not _has_cpu_kernel()
    lib = torch.library.Library("coda_ext", "FRAGMENT")
    calls = []

    def kernel(x, weight, target, rstd, ignore_index, reduction, chunk):
        calls.append(chunk)
        return lm_head_ce._train(x, weight, target, rstd, ignore_index, reduction, chunk, logits_chunk=reference_step)

    torch.library.impl("coda_ext::lm_head_cross_entropy_train", "cpu", kernel, lib=lib)
    yield calls
    del lib
    gc.collect()
    assert not _has_cpu_kernel()


@pytest.mark.parametrize("dloss", [3.0, 1.0], ids=["dloss 3", "dloss 1"])
@pytest.mark.parametrize("scaled", [False, True])
def test_loss_autograd_through_the_op(cpu_train_kernel, scaled, dloss):
    """loss.backward() gives the gradients the forward computed, scaled by dloss ((3 · loss).backward(); with
    dloss 1 the saved gradients themselves, no pass over them)."""
    x, w, target, rstd = _inputs(torch.bfloat16, scaled, seed=1)
    xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
    rr = rstd.clone().requires_grad_() if scaled else None
    loss = ops.lm_head_cross_entropy_loss(xx.reshape(1, M, D), ww, target.reshape(1, M), rr.reshape(1, M) if scaled
                                          else None)
    (loss if dloss == 1.0 else dloss * loss).backward()
    assert cpu_train_kernel == [M]              # one call, one chunk of all 37 rows
    want = _reference_grads(x, w, target, rstd, "mean")
    assert abs(loss.item() - want[0].item()) <= 1e-2 * abs(want[0].item())
    for name, got, ref in zip(("dx", "dW", "drstd"), (xx.grad, ww.grad, rr.grad if scaled else None), want[1:]):
        if ref is None:
            continue
        assert got.dtype == (torch.float32 if name == "drstd" else torch.bfloat16)
        err = (got.double() - dloss * ref).abs().max().item()
        assert err <= dloss * 2 ** -7 * ref.abs().max().item(), (name, err)


def test_chunk_bytes_sets_the_rows_per_chunk(cpu_train_kernel):
    """chunk_bytes (the exp(logits) budget) picks the op's rows per chunk: 128 rows of V 64 bf16 in 16 KiB, all
    300 rows by default; the loss and gradients do not depend on it; a budget that is not a positive int is
    refused before any work."""
    gen = rand.generator("lm_head_train chunk_bytes")
    x = rand.randn(gen, 300, D, dtype=torch.bfloat16, scale=2.0)
    w = rand.randn(gen, V, D, dtype=torch.bfloat16, scale=D ** -0.5)
    target = rand.targets(gen, 300, vocab=V)
    results = []
    for chunk_bytes in (None, 128 * V * 2):
        xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
        loss = ops.lm_head_cross_entropy_loss(xx, ww, target, chunk_bytes=chunk_bytes)
        loss.backward()
        results.append((loss.detach().float(), xx.grad.float(), ww.grad.float()))
    assert cpu_train_kernel == [300, 128]
    for a, b in zip(*results):
        assert (a - b).abs().max().item() <= 2 ** -7 * (1 + b.abs().max().item())
    for bad in (0, -1, 1.5, True, "1G"):
        with pytest.raises(ValueError, match="chunk_bytes must be a positive int"):
            ops.lm_head_cross_entropy_loss(x, w.requires_grad_(), target, chunk_bytes=bad)
    assert cpu_train_kernel == [300, 128]


def test_backward_fills_no_zero_gradients(cpu_train_kernel):
    """The op's other outputs (dx, dW, drstd) get no gradient: autograd must not allocate and zero a V x d
    tensor for them at the start of the backward (it did: 0.5-1 GB and ~2.5 ms a step at Llama sizes)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.sizes = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.overloadpacket in (torch.ops.aten.zeros, torch.ops.aten.zeros_like, torch.ops.aten.zero_,
                                       torch.ops.aten.new_zeros, torch.ops.aten.fill_):
                self.sizes.append(out.numel() if isinstance(out, torch.Tensor) else None)
            return out

    x, w, target, rstd = _inputs(torch.bfloat16, True, seed=3)
    xx, ww, rr = (t.clone().requires_grad_() for t in (x, w, rstd))
    loss = ops.lm_head_cross_entropy_loss(xx, ww, target, rr)
    with Record() as rec:
        loss.backward()
    assert not [n for n in rec.sizes if n is not None and n >= x.shape[0]], rec.sizes
    assert ww.grad is not None and xx.grad is not None and rr.grad is not None


def test_the_range_check_is_read_once_after_every_gemm_is_queued(cpu_train_kernel, monkeypatch):
    """The forward reads its range check once, only after the last chunk's GEMMs are queued (the host then waits
    while the GPU still has them to run; a read at the start of the backward left the GPU idle while autograd
    went on: 2.3 ms a step on an H200); the backward runs no GEMM and reads no value but dloss on the CPU (on a
    GPU ops.scale reads none)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    events = []
    for name in ("_mm_f32", "_addmm_f32_"):
        real = getattr(lm_head_ce, name)
        monkeypatch.setattr(lm_head_ce, name, lambda *a, real=real: events.append("gemm") or real(*a))
    passed = lm_head_ce._RangeCheck.passed
    monkeypatch.setattr(lm_head_ce._RangeCheck, "passed", lambda self: events.append("read") or passed(self))

    class Reads(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.reads = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.reads += func.overloadpacket in (torch.ops.aten._local_scalar_dense, torch.ops.aten.item)
            return func(*args, **(kwargs or {}))

    x, w, target, _ = _inputs(torch.bfloat16, False, seed=6)
    ww = w.clone().requires_grad_()
    loss = ops.lm_head_cross_entropy_loss(x, ww, target)
    assert events == ["gemm"] * 3 + ["read"], events   # one chunk of 37 rows: e @ W, eᵀ @ y in two halves
    events.clear()
    with Reads() as backward:
        loss.backward()
    assert events == [] and backward.reads <= 1
    assert ww.grad is not None and torch.isfinite(ww.grad.float()).all()


def test_a_range_miss_takes_the_exact_path_in_the_forward(cpu_train_kernel, monkeypatch):
    """A row out of range: a RuntimeWarning in the forward, and the loss and gradients of the exact path."""
    x, w, target, _ = _inputs(torch.bfloat16, False, seed=7)
    want = _reference_grads(x, w, target, None, "mean")
    exact = []

    def exact_train(*args):   # the exact path's answer (the CPU has no kernel to run it)
        exact.append(args[4:])
        return want[0].float(), want[1].to(x.dtype), want[2].to(w.dtype), torch.zeros(M)

    monkeypatch.setattr(lm_head_ce, "LSE_RANGE", 1e-3)       # every row out
    monkeypatch.setattr(lm_head_ce, "_exact_train", exact_train)
    xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
    with pytest.warns(RuntimeWarning, match="come from the exact path"):
        loss = ops.lm_head_cross_entropy_loss(xx, ww, target)
    assert exact == [(-100, "mean")]
    assert abs(loss.item() - want[0].item()) <= 1e-6 * abs(want[0].item())
    loss.backward()
    assert torch.equal(xx.grad, want[1].to(x.dtype)) and torch.equal(ww.grad, want[2].to(w.dtype))


def test_backward_scales_in_place_unless_the_graph_is_kept(cpu_train_kernel):
    """A backward that frees the graph scales the gradients the forward computed by dloss in place (no second
    V x d tensor); through a retained graph each backward returns fresh tensors, so gradients a caller still holds
    from an earlier backward keep their values, and accumulated .grad sums every backward's own dloss."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Muls(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket in (torch.ops.aten.mul, torch.ops.aten.mul_):
                self.ops.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    x, w, target, _ = _inputs(torch.bfloat16, False, seed=10)
    want = _reference_grads(x, w, target, None, "mean")

    def close(got, ref, dloss):
        err = (got.double() - dloss * ref).abs().max().item()
        return err <= abs(dloss) * 2 ** -6 * ref.abs().max().item()

    xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
    loss = ops.lm_head_cross_entropy_loss(xx, ww, target)
    with Muls() as m:
        (gw1,) = torch.autograd.grad(loss, ww, torch.tensor(2.0), retain_graph=True)
    assert m.ops and "mul_" not in m.ops                                   # fresh, the saved gradients untouched
    held = gw1.clone()
    (gw2,) = torch.autograd.grad(loss, ww, torch.tensor(0.5), retain_graph=True)
    assert torch.equal(gw1, held) and close(gw1, want[2], 2.0) and close(gw2, want[2], 0.5)
    (2 * loss).backward(retain_graph=True)
    loss.backward()
    assert close(ww.grad, want[2], 3.0) and close(xx.grad, want[1], 3.0)

    xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
    loss = ops.lm_head_cross_entropy_loss(xx, ww, target)
    with Muls() as m:
        (0.25 * loss).backward()
    assert "mul_" in m.ops and close(ww.grad, want[2], 0.25)               # the graph freed: in place

def test_opcheck(cpu_train_kernel):
    x, w, target, rstd = _inputs(torch.bfloat16, True, seed=2)
    args = (x, w.requires_grad_(), target, rstd, -100, "mean", CHUNK)
    torch.library.opcheck(torch.ops.coda_ext.lm_head_cross_entropy_train.default, args)


def test_no_grad_and_ineligible_calls_take_the_statistics_op(monkeypatch):
    """Without a gradient to compute, or in fp16 / with reduction='none', the loss comes from
    lm_head_cross_entropy (whose backward recomputes the logits): the training path never runs."""
    seen = []
    monkeypatch.setattr(lm_head_ce, "lm_head_cross_entropy", lambda *a: seen.append(a[5]) or (torch.zeros(()), None))
    x, w, target, _ = _inputs(torch.bfloat16, False, seed=3)
    ops.lm_head_cross_entropy_loss(x, w, target)                                    # nothing requires grad
    ops.lm_head_cross_entropy_loss(x, w.requires_grad_(), target, reduction="none")
    ops.lm_head_cross_entropy_loss(x.half(), w.half().requires_grad_(), target, reduction="sum")
    assert seen == ["mean", "none", "sum"]


@pytest.mark.parametrize("scaled", [False, True])
def test_logits_chunk_is_the_graph_and_the_target_dot_products(monkeypatch, scaled):
    """_logits_chunk (what the kernel path runs per chunk) with the train graph run by the reference
    interpreter: e, lse = log Σ e and the target logits (M dot products outside the GEMM) equal the
    reference step's (e within bf16 rounding, the statistics within fp32 round-off)."""
    import types

    import coda_ext as ce

    def graph_op(build, dtype, config, *args, major="kk"):
        def run(x, w, inputs, outs):
            r = ce.interpret(build(*args), x, w, **inputs)
            return types.SimpleNamespace(e=r.e.to(x.dtype), sumexp=r.sumexp)
        return types.SimpleNamespace(run=run)

    monkeypatch.setattr(common, "graph_op", graph_op)
    x, w, target, rstd = _inputs(torch.bfloat16, scaled, seed=4)
    e, lse, tl = lm_head_ce._logits_chunk(x, w, target, rstd)
    e_ref, lse_ref, tl_ref = reference_step(x, w, target, rstd)
    valid = target != -100
    assert e.dtype == torch.bfloat16 and e.shape == (M, V)
    torch.testing.assert_close(e.float(), e_ref.float(), rtol=2 ** -8, atol=0)
    torch.testing.assert_close(lse, lse_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(tl[valid], tl_ref[valid], rtol=1e-5, atol=1e-5)


def test_torch_compile_fullgraph_matches_eager(cpu_train_kernel):
    """The training loss under torch.compile(fullgraph=True): one graph, the same loss and gradients."""
    import torch._dynamo

    torch._dynamo.reset()
    x, w, target, rstd = _inputs(torch.bfloat16, True, seed=5)

    def grads(fn):
        xx, ww, rr = (t.clone().requires_grad_() for t in (x, w, rstd))
        loss = fn(xx, ww, target, rr)
        return (loss.detach(), *torch.autograd.grad(loss, (xx, ww, rr)))

    want = grads(ops.lm_head_cross_entropy_loss)
    got = grads(torch.compile(ops.lm_head_cross_entropy_loss, fullgraph=True, backend="aot_eager"))
    torch._dynamo.reset()
    for g, w_ in zip(got, want):
        assert torch.equal(g, w_)


@pytest.mark.parametrize("bad, message", [
    (lambda x, w, t, r: (x, w, t.float(), r), "target has dtype torch.float32; use integer class indices"),
    (lambda x, w, t, r: (x, w, t[:-1], r), "target"),
    (lambda x, w, t, r: (x, w, t, r[:-1]), "rstd"),
    (lambda x, w, t, r: (x, w[:, :-1], t, r), r"x's last dimension \(24\) must equal weight.shape\[1\]"),
    (lambda x, w, t, r: (x, w, t, r.double()), "rstd"),
])
def test_bad_inputs_are_refused_before_the_training_path(bad, message):
    """Each mistake raises, naming it, before the training path's custom op runs (no kernel is registered on
    the CPU here: reaching it would fail differently)."""
    x, w, target, rstd = _inputs(torch.bfloat16, True, seed=6)
    args = bad(x, w.requires_grad_(), target, rstd)
    with pytest.raises((TypeError, ValueError), match=message):
        ops.lm_head_cross_entropy_loss(*args)


def test_compiled_forward_takes_the_exact_path_on_a_miss(cpu_train_kernel, monkeypatch):
    """Under torch.compile the op runs its range check inside itself as in eager mode: a miss gives a
    RuntimeWarning in the forward and the exact path's gradients."""
    import torch._dynamo

    x, w, target, _ = _inputs(torch.bfloat16, False, seed=9)
    want = _reference_grads(x, w, target, None, "mean")
    exact = []

    def exact_train(*args):
        exact.append(args[4:])
        return want[0].float(), want[1].to(x.dtype), want[2].to(w.dtype), torch.zeros(M)

    monkeypatch.setattr(lm_head_ce, "LSE_RANGE", 1e-3)       # every row out
    monkeypatch.setattr(lm_head_ce, "_exact_train", exact_train)
    torch._dynamo.reset()
    fn = torch.compile(ops.lm_head_cross_entropy_loss, fullgraph=True, backend="aot_eager")
    xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
    with pytest.warns(RuntimeWarning, match="come from the exact path"):
        loss = fn(xx, ww, target)
    assert cpu_train_kernel == [M] and exact == [(-100, "mean")]
    loss.backward()
    torch._dynamo.reset()
    assert torch.equal(xx.grad, want[1].to(x.dtype)) and torch.equal(ww.grad, want[2].to(w.dtype))


def test_chunk_row_math_generated_kernels_match_the_eager_math():
    """On a GPU a chunk's row math (the target logits' dot products; dx, y and the rstd gradient after the e @ W
    GEMM) runs as kernels torch.compile generates, one graph for every chunk's row count; here the same functions
    through Inductor's CPU backend: within fp32 round-off of the eager math, the 16-bit outputs within one
    rounding."""
    from torch._dynamo.utils import counters

    assert lm_head_ce._row_dots_fused.__wrapped__ is lm_head_ce._row_dots
    assert lm_head_ce._chunk_gradients_fused.__wrapped__ is lm_head_ce._chunk_gradients
    gen = rand.generator("lm_head_chunk_rows")
    torch._dynamo.reset()
    counters.clear()
    for C in (16, 5, 37):
        x, w = rand.randn(gen, C, D, dtype=torch.bfloat16), rand.randn(gen, C, D, dtype=torch.bfloat16)
        ew, a, gs = rand.randn(gen, C, D), rand.randn(gen, C), rand.randn(gen, C)
        torch.testing.assert_close(lm_head_ce._row_dots_fused(x, w), lm_head_ce._row_dots(x, w), rtol=1e-5,
                                   atol=1e-5)
        got, want = lm_head_ce._chunk_gradients_fused(ew, x, a, gs), lm_head_ce._chunk_gradients(ew, x, a, gs)
        for g, t in zip(got, want):
            assert g.dtype == t.dtype and g.shape == t.shape
            tol = 2 ** -7 if t.dtype == torch.bfloat16 else 1e-5
            torch.testing.assert_close(g.float(), t.float(), rtol=tol, atol=tol * t.float().abs().max().item())
    torch._dynamo.reset()
    assert counters["stats"]["unique_graphs"] == 2, dict(counters["stats"])
