"""Lowering: epilogues become coda_ext graphs and coda_ext::fusion_kernel calls (run here by the reference
interpreter), identical subgraphs share one kernel, the two custom ops compute what they claim."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from coda_ext.config import KernelConfig
from coda_ext.fusion import kernel_items, passes
from coda_ext.fusion.analyze import analyze
from coda_ext.fusion.lowering import KERNEL, build_site, lower
from coda_ext.fusion.op import fusion_gemm, load_site, run_site
from coda_ext.fusion.partition import Group, Partition, partition

aten = torch.ops.aten


def _randn(seed: int, *shape, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def two_layers(x, w1, b1, w2, b2, res):
    """Two identical linear + bias + GELU + residual layers, then a plain GEMM."""
    h = res + F.gelu(F.linear(x, w1, b1))
    h = h + F.gelu(F.linear(h, w2, b2))
    return h @ w1.t()


def _inputs(dtype=torch.float32):
    return (_randn(1, 2, 4, 16, dtype=dtype), _randn(2, 16, 16, dtype=dtype) / 4, _randn(3, 16, dtype=dtype),
            _randn(4, 16, 16, dtype=dtype) / 4, _randn(5, 16, dtype=dtype), _randn(6, 2, 4, 16, dtype=dtype))


def _lowered(fn, args, target="interpret"):
    gm = passes.run(make_fx(fn, tracing_mode="fake")(*args))
    an = analyze(gm, target)
    part = partition(an.pgraph)
    out, lowered = lower(gm, an, part)
    return gm, an, part, out, lowered


def test_fusion_gemm_reads_each_layout_in_place():
    a, w = _randn(1, 6, 4), _randn(2, 5, 4)
    want = a @ w.t()
    for major, (sa, sw) in {"kk": (a, w), "kn": (a, w.t().contiguous()), "mk": (a.t().contiguous(), w),
                            "mn": (a.t().contiguous(), w.t().contiguous())}.items():
        torch.testing.assert_close(fusion_gemm(sa, sw, major), want)
        with FakeTensorMode() as mode:
            fake = fusion_gemm(mode.from_tensor(sa), mode.from_tensor(sw), major)
        assert tuple(fake.shape) == (6, 5)


def test_two_identical_layers_share_one_kernel_and_match_the_original():
    args = _inputs()
    gm, _, _, out, lowered = _lowered(two_layers, args)
    assert len(lowered) == 2 and all(low.site is not None for low in lowered)
    assert lowered[0].site.kernel_key == lowered[1].site.kernel_key     # one kernel for both layers
    calls = [n for n in out.graph.nodes if n.target is KERNEL]
    assert len(calls) == 2
    assert [n for n in out.graph.nodes if n.target is aten.mm.default]  # the last GEMM: plain, no epilogue
    assert not [n for n in out.graph.nodes if n.target is passes.GEMM]
    torch.testing.assert_close(out(*args), gm(*args), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out(*args), two_layers(*args), rtol=1e-5, atol=1e-5)


def test_a_site_spec_round_trips_and_runs_the_interpreter():
    args = _inputs()
    _, _, _, _, lowered = _lowered(two_layers, args)
    site = lowered[0].site
    assert load_site(site.spec()) == site
    roles = [r for _, r in site.inputs]
    assert roles == ["row", "tile"]                       # the bias and the residual
    x, w1, b1, _, _, res = args
    outs = run_site(site, [x.reshape(8, 16), w1, b1, res])
    want = res + F.gelu(F.linear(x, w1, b1))
    torch.testing.assert_close(outs[-1], want, rtol=1e-5, atol=1e-5)
    assert all(o.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()
               for o in outs for t in (x, w1, b1, res))


def test_the_kernel_call_has_a_fake_implementation():
    args = _inputs()
    _, _, _, out, _ = _lowered(two_layers, args)
    call = next(n for n in out.graph.nodes if n.target is KERNEL)
    fakes = call.meta["val"]
    assert [tuple(t.shape) for t in fakes] == [tuple(o.shape) for o in load_site(call.args[0]).outputs]


def test_a_graph_the_builder_refuses_stays_unfused():
    """A hand-made partition whose epilogue needs more slots than a kernel has: build_site reports the
    builder's error and lowering leaves those nodes to the fallback."""
    def many(x, w, *tiles):
        h = x @ w.t()
        for t in tiles:
            h = h + t
        return h

    x, w = _randn(1, 8, 16), _randn(2, 16, 16)
    tiles = [_randn(10 + i, 8, 16) for i in range(40)]
    gm = passes.run(make_fx(many, tracing_mode="fake")(x, w, *tiles))
    an = analyze(gm)
    gemm = an.pgraph.anchors()[0]
    members = tuple(n.id for n in an.pgraph.nodes if n.op == "math")
    low = build_site(an, Group(gemm, members))
    assert low.site is None and "GraphError" in low.error and "32" in low.error
    out, _ = lower(gm, an, Partition((Group(gemm, members),), {}, "ilp", "", 0.0, 0.0))
    assert not [n for n in out.graph.nodes if n.target is KERNEL]
    torch.testing.assert_close(out(x, w, *tiles), many(x, w, *tiles))
    assert len(partition(an.pgraph).groups[0].members) < len(members)   # the partitioner keeps the limit


def test_on_cuda_an_epilogue_the_launched_config_cannot_hold_stays_unfused():
    """Twelve bf16 tile loads fit the slots but not the shared memory of the config "auto" launches:
    on the "cuda" target build_site says so and the GEMM stays plain; the partitioner keeps within
    the shared memory itself (fewer members)."""
    def many(x, w, *tiles):
        h = x @ w.t()
        for t in tiles:
            h = h + t
        return h

    args = (_randn(1, 8, 16, dtype=torch.bfloat16), _randn(2, 16, 16, dtype=torch.bfloat16),
            *[_randn(10 + i, 8, 16, dtype=torch.bfloat16) for i in range(12)])
    gm = passes.run(make_fx(many, tracing_mode="fake")(*args))
    an = analyze(gm, "cuda")
    gemm = an.pgraph.anchors()[0]
    members = tuple(n.id for n in an.pgraph.nodes if n.op == "math")
    assert build_site(an, Group(gemm, members)).site is not None            # the interpreter takes it
    low = build_site(an, Group(gemm, members), target="cuda")
    assert low.site is None and "shared memory" in low.error
    from coda_ext.fusion.partition import Limits

    part = partition(an.pgraph, limits=Limits.of("cuda"))
    _, lowered = lower(gm, an, part, target="cuda")
    assert 0 < len(part.groups[0].members) < len(members) and lowered[0].site is not None


def test_kernel_items_list_each_distinct_kernel_for_prebuild():
    args = _inputs(torch.bfloat16)
    _, _, _, _, lowered = _lowered(two_layers, args, target="cuda")
    items = kernel_items(lowered)
    assert items and all(isinstance(c, KernelConfig) and d == "bfloat16" for _, d, c in items)
    assert len({g.digest() for g, _, _ in items}) == 1          # both layers: one graph
    assert {c.major for _, _, c in items} == {"kk"}
    assert kernel_items(_lowered(two_layers, _inputs())[4]) == []   # fp32 runs in the interpreter only


def test_kernel_items_take_the_config_auto_launches_at_each_gemm_shape():
    from coda_ext.runtime.tuned import TunedOp

    args = _inputs(torch.bfloat16)
    _, an, _, _, lowered = _lowered(two_layers, args, target="cuda")
    low = lowered[0]
    assert low.mnk == an.gemm_mnk(low.group.anchor) == (8, 16, 16)
    op = TunedOp(low.site.graph, "bfloat16", tune=False, major=low.site.major)
    (item,) = kernel_items(lowered, sms=132)                       # two layers, one shape: one kernel
    assert item[2] == op.config_for(8, 16, 16, 132)
    every = kernel_items(lowered, every_config=True)                # what "auto" may launch at any shape
    assert item[2].tag in {c.tag for _, _, c in every} and len(every) > 1


def test_the_cuda_rules_refuse_gemms_the_kernel_cannot_read():
    from coda_ext.fusion.rules import anchor_problem

    def t(*shape, dtype=torch.bfloat16):
        return torch.empty(shape, dtype=dtype, device="meta")

    assert anchor_problem(t(64, 32), t(48, 32), "kk", "cuda") is None
    assert "K = 30" in anchor_problem(t(64, 30), t(48, 30), "kk", "cuda")
    # the kernel takes any N read K-major, but the fusion compiler leaves an odd N (a vocabulary) plain: its
    # fused LM head measured slower than cuBLAS and Inductor's cross-entropy
    assert "N = 50" in anchor_problem(t(64, 32), t(50, 32), "kk", "cuda")
    assert "N = 50" in anchor_problem(t(64, 32), t(32, 50), "kn", "cuda")
    assert "float32" in anchor_problem(t(64, 32, dtype=torch.float32), t(48, 32, dtype=torch.float32), "kk", "cuda")
    assert anchor_problem(t(64, 32, dtype=torch.float32), t(48, 32, dtype=torch.float32), "kk", "interpret") is None
    # regression: a weight gradient dzᵀ @ x reads A = dz M-major, so M (an odd vocabulary: a tied LM
    # head's 30522 or 50257 rows) must be a multiple of 8 too; it was anchored and failed at launch
    dz, x = t(128, 50), t(128, 32)                                  # tokens x (M = 50), tokens x (N = 32)
    assert "M = 50" in anchor_problem(dz, x, "mn", "cuda")
    assert anchor_problem(t(128, 56), x, "mn", "cuda") is None
    assert anchor_problem(dz, x, "mn", "interpret") is None


def test_a_fused_launch_calls_its_op_directly_and_names_itself_in_a_profile(monkeypatch):
    """The fused kernel's op runs without a second custom-op dispatch (op.run), and under torch.profiler
    inside a range named after its site and GEMM shape (bench_autofusion --profile groups by it)."""
    import coda_ext.fusion.op as fo
    from coda_ext import graphs
    from coda_ext.graph.canonical import as_ir

    calls = []

    class Op:
        def run(self, A, W, inputs, out):
            calls.append((A.shape, W.shape, dict(inputs), out))
            return {"out": A @ W.t()}

    site = fo.Site(as_ir(graphs.identity()), "bfloat16", "kk", (), (fo.Output("out", (4, 8), torch.float32),))
    monkeypatch.setattr(fo, "_compiled", lambda s: Op())
    A, W = torch.randn(4, 16), torch.randn(8, 16)
    assert torch.equal(fo.launch(site, A, W, {})["out"], A @ W.t())
    with torch.profiler.profile() as prof:
        fo.launch(site, A, W, {})
    names = [e.name for e in prof.events() if e.name.startswith(fo.PROFILE_PREFIX)]
    assert names == [f"{fo.PROFILE_PREFIX}{site.graph.digest()[:8]} 4x8x16"]
    assert len(calls) == 2 and calls[0][3] == {}


def test_a_member_the_fallback_computes_again_and_no_member_reads_leaves_the_epilogue():
    """Regression: x̂ = (x − μ)·rstd read only outside (by a select the fallback runs) while x − μ feeds the
    epilogue's reduction: x̂ is computed again outside (partition.outside), so it leaves the epilogue; kept
    in, it had no reader in the kernel, rstd became an input nothing used, the graph builder refused the site
    and the GEMM ran unfused."""
    from coda_ext.fusion import passes
    from coda_ext.fusion.analyze import analyze
    from coda_ext.fusion.lowering import KERNEL, lower
    from coda_ext.fusion.partition import partition

    def f(x, mean, rstd, q, w, tangents):
        dy = tangents @ w.t()
        xc = x.float() - mean
        xhat = xc * rstd
        return mean * 2.0, (dy.float() * xc).sum(-1), torch.where(q, xhat, 0.0)

    g = torch.Generator().manual_seed(0)
    M, K, N = 32, 16, 64
    args = (torch.randn(M, N, generator=g).bfloat16(), torch.randn(M, 1, generator=g),
            torch.rand(M, 1, generator=g) + 0.5, torch.rand(M, N, generator=g) > 0.5,
            torch.randn(N, K, generator=g).bfloat16(), torch.randn(M, K, generator=g).bfloat16())
    gm = passes.run(make_fx(f, tracing_mode="fake")(*args))
    an = analyze(gm, "interpret", 1)
    part = partition(an.pgraph)
    (grp,) = part.groups
    assert all(any(c in grp.members for c in an.pgraph.consumers()[v]) for v in grp.outside)
    out, lowered = lower(gm, an, part)
    assert all(low.site is not None for low in lowered)
    assert sum(n.target is KERNEL for n in out.graph.nodes) == 1
    for a, b in zip(f(*args), out(*args)):
        assert torch.allclose(a.float(), b.float(), rtol=1e-2, atol=1e-2)


def test_the_kernel_reads_the_16_bit_value_the_fallback_computes_again_from_rounded_as_stored():
    """A layer-norm backward's g = γ · f32(dy), dy = acc + t the bf16 sum of the GEMM's output and a loaded
    gradient: g feeds the epilogue's row sum and the fallback's math, so the kernel stores dy in 16 bits and the
    fallback computes g again from it (partition.outside). The kernel's row sum then reads dy rounded to bf16 as
    stored (a cast node), so both sides compute from one dy, as eager does; the result matches the original."""
    from coda_ext.graph.canonical import as_ir
    from tests.helpers.checks import max_err, within_rule

    def f(tangents, w, t, gamma, q):
        dy = tangents @ w.t() + t
        g = dy.float() * gamma
        return gamma * 2.0, g.sum(-1, keepdim=True), torch.where(q, g, 0.0)

    gen = torch.Generator().manual_seed(0)
    M, K, N = 32, 16, 64
    args = (torch.randn(M, K, generator=gen).bfloat16(), torch.randn(N, K, generator=gen).bfloat16(),
            torch.randn(M, N, generator=gen).bfloat16(), torch.randn(N, generator=gen),
            torch.rand(M, N, generator=gen) > 0.5)
    gm = passes.run(make_fx(f, tracing_mode="fake")(*args))
    an = analyze(gm, "interpret", 1)
    part = partition(an.pgraph)
    (grp,) = part.groups
    assert grp.outside, "g is computed again by the fallback"
    out, lowered = lower(gm, an, part)
    (low,) = lowered
    ir = as_ir(low.site.graph)
    assert any(n.kind == "cast" and n.attr("dtype") == "bfloat16" for n in ir.nodes)
    assert [o.dtype for o in low.site.outputs if tuple(o.shape) == (M, N)] == [torch.bfloat16]   # dy, not g
    want = f(*(a.double() if a.is_floating_point() else a for a in args))
    for got, base, ref in zip(out(*args), f(*args), want):
        err, err_eager, top = max_err(got, ref), max_err(base, ref), ref.abs().max().item()
        assert within_rule(err, err_eager, top), (err, err_eager, top)


def test_the_fused_kernels_fake_gives_the_kernels_padded_rows():
    """A fused kernel's results as the real op gives them: on CUDA its (M, N) outputs have rows padded to 16
    bytes where N is no multiple of 8 (an LM head over 50257 classes), its reductions are plain vectors; in the
    interpreter (CPU, or execute="interpret") everything is contiguous."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from coda_ext import graphs
    from coda_ext.fusion.op import Output, Site, _fusion_kernel_fake

    g = graphs.reductions().build()                       # D = acc, row and column reductions
    names = {n.kind: n.name for n in g.nodes if n.name}
    outs = (Output(names["output"], (2, 4, 50), torch.bfloat16), Output(g[g.find("row_reduce")[0]].name, (8,),
                                                                        torch.float32))
    for device, execute, padded in (("cuda", "auto", True), ("cuda", "interpret", False), ("cpu", "auto", False)):
        site = Site(g, "bfloat16", "kk", (), outs, execute)
        with FakeTensorMode(allow_non_fake_inputs=True):
            a = torch.empty(8, 64, dtype=torch.bfloat16, device=device)
            w = torch.empty(50, 64, dtype=torch.bfloat16, device=device)
            d, r = _fusion_kernel_fake(site.spec(), [a, w])
        assert d.shape == (2, 4, 50) and d.stride() == ((4 * 56, 56, 1) if padded else (200, 50, 1)), device
        assert r.shape == (8,) and r.stride() == (1,)
