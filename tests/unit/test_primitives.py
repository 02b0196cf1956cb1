"""The graph primitives of the ready ops: graphs without a main output, pair_swap, exact angle
turns, segmented row reductions, online log-sum-exp, column indices, comparisons and where,
integer vectors, and casts that compile as any output — builder, interpreter, emitter."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import coda_ext as ce
from coda_ext.codegen.constraints import fit_config


def _acc():
    g = ce.Graph()
    return g, g.accumulator()


def test_cast_to_the_other_16_bit_type_emits_an_fp32_value():
    """Regression: g.output(cast(x, fp16)) in a bf16 op failed in nvcc (Array<float> = Array<bf16>)."""
    g, acc = _acc()
    g.output(ce.cast(acc, "float16"))
    src = ce.emit_source(g, torch.bfloat16)
    assert "Cast<Cfg, cutlass::half_t>" in src
    assert "Compute<Cfg, Identity" not in src


def test_graph_without_main_output_emits_void_d():
    g, acc = _acc()
    g.store("y", ce.swiglu_pairs(acc))
    g.row_reduce("lse", acc, "logsumexp")
    src = ce.emit_source(g, torch.bfloat16)
    assert "coda::kernels::Config<cutlass::bfloat16_t, void," in src
    assert "using Fusion = WithoutD<FusionTree, cutlass::bfloat16_t>;" in src
    assert "ReduceCombine::LogSumExp" in src and "RowLogSumExp<Cfg>" in src


def test_logsumexp_is_a_row_reduction_only():
    g, acc = _acc()
    with pytest.raises(ce.GraphError, match="only supported by row_reduce"):
        g.col_reduce("c", acc, "logsumexp")


def test_interpreter_semantics_of_the_new_nodes():
    M, N, K = 5, 8, 4
    A, W = torch.randn(M, K), torch.randn(N, K)
    g, acc = _acc()
    g.output(ce.pair_swap(acc), name="swapped")
    g.store("seg", ce.segment_reduce(acc, 32, "sumsq") * 0 + ce.where(ce.gt(acc, 0.0), 1.0, -1.0), dtype="float32")
    g.store("idx", g.col_index() + 0.0, dtype="float32")
    g.row_reduce("lse", acc, "logsumexp")
    tgt = g.col_vector("t", torch.int64)
    g.row_reduce("picked", ce.where(ce.eq(g.col_index(), tgt), acc, 0.0), "sum")
    with pytest.raises(ValueError, match=r"N = 8 .* must be a multiple of 32"):  # N = 8 < one 32-column segment
        ce.interpret(g, A, W, t=torch.zeros(M, dtype=torch.int64))
    N = 64
    W = torch.randn(N, K)
    t = torch.randint(0, N, (M,))
    o = ce.interpret(g, A, W, t=t)
    x = A @ W.t()
    assert torch.equal(o.swapped, x.reshape(M, N // 2, 2).flip(-1).reshape(M, N))
    assert torch.equal(o.seg, torch.where(x > 0, 1.0, -1.0))
    assert torch.equal(o.idx, torch.arange(N, dtype=torch.float32).expand(M, N))
    assert torch.allclose(o.lse, torch.logsumexp(x, 1))
    assert torch.equal(o.picked, x.gather(1, t[:, None])[:, 0])


def test_segment_reduce_broadcasts_each_segment():
    g, acc = _acc()
    g.output(ce.segment_reduce(acc, 32, "max"))
    A, W = torch.randn(3, 4), torch.randn(96, 4)
    x = A @ W.t()
    want = x.reshape(3, 3, 32).amax(-1, keepdim=True).expand(3, 3, 32).reshape(3, 96)
    assert torch.equal(ce.interpret(g, A, W).out, want)


def test_turns_keeps_the_fraction_exact_at_long_context():
    """frac(pos · f) at positions ~1e5: exact in the interpreter (fp64), and the fp32 float-pair
    form the kernel evaluates (FMA error recovery) agrees to ~1e-7 turns where pos · f in fp32
    radians would have lost every digit."""
    pos = torch.tensor([131071.0, 99991.0, 3.0])
    f = torch.tensor([0.15915494309189535, 1e-4 / (2 * math.pi), 0.25], dtype=torch.float64)  # turns/position
    hi = f.float()
    lo = (f - hi.double()).float()
    exact = pos.double() * f
    exact = exact - torch.round(exact)
    p = pos * hi
    err = torch.addcmul(-p, pos, hi)  # fp32: like fmaf(pos, hi, -p) (exact product error here)
    kernel = (p - torch.round(p)) + (pos * lo + err)
    assert (kernel.double() - exact).abs().max() < 5e-7
    naive = p - torch.round(p)  # the fraction of the rounded fp32 product
    assert (naive.double() - exact).abs().max() > 1e-4


def test_segment_reduce_fits_the_epilogue_tile():
    g, acc = _acc()
    g.output(ce.segment_reduce(acc, 128, "sumsq"))
    built = g.build()
    assert fit_config(built, ce.KernelConfig((128, 128, 64), schedule="pingpong")).epilogue_tile == (64, 128)
    assert fit_config(built, ce.KernelConfig((128, 256, 64))).epilogue_tile == (128, 128)
    with pytest.raises(ce.UnsupportedError, match="must lie inside one N tile"):
        fit_config(built, ce.KernelConfig((128, 192, 64)))
    with pytest.raises(ce.UnsupportedError, match=r"needs the epilogue tile \(64, 128\)"):
        fit_config(built, ce.KernelConfig((128, 128, 64), schedule="pingpong", epilogue_tile=(64, 32)))
    src = ce.emit_source(g, torch.bfloat16)
    assert "SegmentReduce<Cfg, ReduceSumSq, 128>" in src and "coda::kernels::Pingpong, 64, 128>" in src


def test_integer_vectors_reach_the_kernel_as_int32():
    g, acc = _acc()
    g.output(acc + g.col_vector("a", torch.int64) + g.row_vector("b", "int32"))
    src = ce.emit_source(g, torch.bfloat16)
    assert "ColVector<Cfg, int32_t>" in src and "RowVector<Cfg, int32_t>" in src
    with pytest.raises(ce.GraphError, match="only allowed for row and column vectors"):
        g.tile("c", torch.int32)


def test_new_functions_reject_bad_arguments():
    _g, acc = _acc()
    with pytest.raises(ce.GraphError, match="size must be 32, 64 or 128"):
        ce.segment_reduce(acc, 100)
    with pytest.raises(ce.GraphError, match="op must be one of"):
        ce.segment_reduce(acc, 64, "logsumexp")


def test_rotate_pairs_is_the_rope_rotation_of_each_pair():
    g, acc = _acc()
    t = ce.turns(g.col_vector("pos", "float32"), g.row_vector("hi", "float32"), g.row_vector("lo", "float32"))
    g.output(ce.rotate_pairs(acc, t))
    M, N = 6, 8
    A, W = torch.randn(M, 3), torch.randn(N, 3)
    pos, f = torch.arange(M, dtype=torch.float32) * 1000, torch.rand(N // 2).repeat_interleave(2)
    out = ce.interpret(g, A, W, compute_dtype=torch.float64, pos=pos, hi=f, lo=torch.zeros(N)).out
    x = (A @ W.t()).double()
    theta = pos.double()[:, None] * f.double()[None, 0::2] * 2 * math.pi
    a, b = x[:, 0::2], x[:, 1::2]
    want = torch.stack([a * theta.cos() - b * theta.sin(), b * theta.cos() + a * theta.sin()], -1).reshape(M, N)
    assert torch.allclose(out, want, atol=1e-9)
    assert "Compute<Cfg, RotatePairs>" in ce.emit_source(g, torch.bfloat16)


def test_an_epilogue_that_starves_the_mainloop_is_refused_before_nvcc():
    """Regression (found by the fuzzer): fp32 tiles and stores on a wide epilogue subtile left the
    mainloop fewer than two stages and stopped nvcc at a CUTLASS static_assert."""
    g, acc = _acc()
    g.output(ce.segment_reduce(acc, 128) * g.tile("t", "float32"))
    with pytest.raises(ce.UnsupportedError, match=r"tile 't' 128 KB.*fewer than 2 stages.*use 16-bit tiles"):
        ce.emit_source(g, torch.bfloat16, ce.KernelConfig(tile=(128, 256, 64), schedule="cooperative"))
    g, acc = _acc()
    g.output(ce.segment_reduce(acc, 128) * g.tile("t"))  # a bf16 tile fits
    ce.emit_source(g, torch.bfloat16, ce.KernelConfig(tile=(128, 256, 64), schedule="cooperative"))


def test_row_vectors_count_in_the_epilogue_shared_memory():
    """Regression (found by the GPU fuzz build): CUTLASS's row broadcast keeps a TILE_N slice of each row
    vector in shared memory, after which the next swizzled buffer is 1 KB aligned. A fp16 graph with
    160 KB of tiles and stores on a 64x64 subtile plus two row vectors passed the estimate (two stages
    left) and stopped nvcc at "Specialization requires Stages set to value 2 or more"."""
    def graph(row_vectors: bool):
        g = ce.Graph()
        acc = g.accumulator()
        even, odd = g.pair_tile("pt")
        x = acc + g.tile("t") + even * odd
        if row_vectors:
            x = x + g.row_vector("r1") + g.row_vector("r2", "int32")
        g.output(x)
        g.store("s", x)
        g.store_pairs("ps", x, acc)
        return g

    cfg = ce.KernelConfig(tile=(128, 128, 64), schedule="pingpong", epilogue_tile=(64, 64))
    with pytest.raises(ce.UnsupportedError,
                       match=r"row vector 'r1' 1 KB.*row vector|row vector 'r2' 1 KB.*fewer than 2"):
        ce.emit_source(graph(True), torch.float16, cfg)
    ce.emit_source(graph(False), torch.float16, cfg)   # 161 KB: two stages, compiles


def test_no_graph_the_project_builds_is_refused_for_shared_memory():
    """Every benchmark/test graph and ready op with every candidate config that config="tune" keeps for
    it (tuning.fits: 128x192 only where the epilogue fits it) passes the estimate."""
    from coda_ext import ops, tuning
    from coda_ext.runtime.tuned import TunedOp
    from tests.gpu import cases

    for build, dtypes in cases.CASES.values():
        for d in dtypes:
            for c in TunedOp(build(), d, tune=True).candidates + (ce.DEFAULT_CONFIG,):
                ce.kernel_source(build(), d, c)
    for m in ops.MODULES:
        for build, args, major in m.BUILDS:
            op = TunedOp(build(*args), "bfloat16", tune=True, major=major)
            tall = sum(c.tile[:2] == (128, 192) for c in tuning.CANDIDATES)   # kept where the epilogue fits them
            assert len(op.candidates) >= len(tuning.CANDIDATES) - tall
            for c in op.candidates + (dataclasses.replace(ce.DEFAULT_CONFIG, major=major),):
                ce.kernel_source(build(*args), "bfloat16", c)
