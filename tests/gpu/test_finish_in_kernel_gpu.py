"""KernelConfig(finalize="kernel") on an SM90 GPU: the graph's reductions finished inside the GEMM by the last tile of
each row (column) of tiles (csrc/epilogues/last_tile.hpp) instead of by a finalize launch after it.

The M x N outputs equal the finalize launch's bit for bit; the reduced vectors agree with its within a few fp32 ulp
(the two fold the same partials in different fixed orders; the max is exact either way) and are within the numerics
rule against the fp64 interpreter; at shapes that are no tile multiple, with a few persistent CTAs (each counts many
tiles in) and with the whole GPU, and in 2 x 1 clusters, whose padded CTAs write no partials and must not count. The
tile counters live in the launch's workspace, which is not cleared: launches right after a block of random bits was
freed where the workspace goes, 20 launches in a row, launches on two streams at once and the replays of a captured
CUDA graph (one workspace, one epoch) all give the same bits as the first launch.
Graphs: row sums (store_rowsum), the RMSNorm statistic beside stores (linear_residual_norm), rows and columns at
once (coverage.reductions), a row log-sum-exp (the LM head), column sums without a main output (the RMSNorm backward)
and the dSwiGLU's row sum without a main output; schedules ping-pong, cooperative, stream-K, overlap and handoff.

    python -m coda_ext prebuild tests/gpu/test_finish_in_kernel_gpu.py
    python -m pytest -x -q tests/gpu/test_finish_in_kernel_gpu.py
"""
from __future__ import annotations

import dataclasses
import os

import pytest
import torch

import coda_ext as ce
from coda_ext.graphs import backward, coverage, epilogues, forward
from tests.gpu.test_numerics import check_against_reference
from tests.gpu.test_overlap_gpu import assert_same_bits, run
from tests.helpers import checks, rand

GRAPHS = {"rowsum": epilogues.store_rowsum, "residual_norm": forward.linear_residual_norm,
          "rows_cols": coverage.reductions, "lse": lambda: forward.lm_head_cross_entropy(False),
          "rms_bwd": lambda: backward.rms_norm_backward_linear(False), "dswiglu": backward.swiglu_backward_linear}
CONFIGS = {"ping": ce.KernelConfig((128, 128, 64), (1, 1), "pingpong", swizzle=4),
           "ping64": ce.KernelConfig((64, 128, 64), (1, 1), "pingpong"),
           "ping_2x1": ce.KernelConfig((128, 192, 64), (2, 1), "pingpong", swizzle=8),
           "coop": ce.KernelConfig((128, 256, 64), (2, 1), "cooperative", swizzle=4),
           "streamk": ce.KernelConfig((128, 128, 64), (1, 1), "streamk"),
           "overlap": ce.KernelConfig((128, 128, 64), (1, 1), "overlap", swizzle=4),
           "handoff": ce.KernelConfig((128, 128, 64), (2, 1), "handoff", swizzle=8)}
#: (M, N, K, persistent CTAs): none a tile multiple; 128 rows and 1 tile of rows among them
SHAPES = [(128, 1032, 72, 0), (77, 4104, 264, 3), (1000, 2072, 136, 5), (2333, 1544, 520, 0), (4133, 3080, 264, 7)]


def cases() -> list:
    """(graph, config): every graph in ping-pong, the row sums and the dSwiGLU in every config."""
    return ([(g, "ping") for g in GRAPHS] + [("rowsum", c) for c in CONFIGS if c != "ping"] +
            [("dswiglu", c) for c in ("ping64", "coop", "overlap", "handoff")] + [("rows_cols", "coop")])


def config(cfg: str, where: str) -> ce.KernelConfig:
    return dataclasses.replace(CONFIGS[cfg], finalize=where)


def build_items() -> list:
    """(graph, dtype, config) of every kernel these tests launch, for `python -m coda_ext prebuild`."""
    return [(GRAPHS[g](), "bfloat16", config(c, w)) for g, c in cases() for w in ("launch", "kernel")]


@pytest.fixture(scope="module")
def ops():
    from coda_ext.runtime import prebuild

    prebuild(build_items(), jobs=os.cpu_count())
    return {(g, c, w): ce.compile(GRAPHS[g](), "bfloat16", config(c, w)) for g, c in cases()
            for w in ("launch", "kernel")}


def inputs_for(op, M, N, K, *key):
    return rand.op_inputs(op, M, N, K, rand.generator("finish", *key, M, N, K, device="cuda"))


@pytest.mark.parametrize("M,N,K,sms", SHAPES, ids=[f"{m}x{n}x{k}_sm{s}" for m, n, k, s in SHAPES])
@pytest.mark.parametrize("name,cfg", cases(), ids=[f"{g}-{c}" for g, c in cases()])
def test_finished_in_the_kernel_is_bit_identical_to_the_launch_and_within_the_rule(ops, name, cfg, M, N, K, sms):
    base = ops[(name, cfg, "launch")]
    A, W, inputs = inputs_for(base, M, N, K, name)
    want = run(base, A, W, inputs, M, N, sms)
    label = f"{name}/{cfg}/{M}x{N}x{K}/sm{sms}"
    got = run(ops[(name, cfg, "kernel")], A, W, inputs, M, N, sms)
    vectors = {k for k, v in got.items() if v.dim() == 1}
    assert_same_bits({k: v for k, v in got.items() if k not in vectors},
                     {k: v for k, v in want.items() if k not in vectors}, label)
    for k in vectors:   # an element left unwritten (NaN-poisoned) fails here too
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-5 * want[k].abs().max().item(),
                                   msg=lambda m, k=k: f"{label}/{k}: {m}")
    check_against_reference(base, GRAPHS[name](), A, W, inputs, got, label)


def test_counters_survive_garbage_relaunches_and_streams(ops):
    """Launches after freed random bits, 20 in a row, and two streams at once with their own workspaces."""
    M, N, K = 1000, 4104, 136
    for name, cfg in (("rowsum", "ping"), ("rows_cols", "coop"), ("rms_bwd", "ping")):
        op = ops[(name, cfg, "kernel")]
        A, W, inputs = inputs_for(op, M, N, K, name, "relaunch")
        want = run(op, A, W, inputs, M, N, 0)
        size = op.workspace_size(M, N, K)
        for i in range(20):
            if i % 2 == 0:   # a block of the workspace's size, freed: the caching allocator hands it to the launch
                junk = torch.randint(0, 256, (size,), dtype=torch.uint8, device="cuda")
                del junk
            assert_same_bits(run(op, A, W, inputs, M, N, 0), want, f"{name}/{cfg}/launch {i}")
        streams = [torch.cuda.Stream() for _ in range(2)]
        outs = [checks.nan_outputs(op, M, N) for _ in streams]
        for _ in range(5):
            for s, out in zip(streams, outs):
                with torch.cuda.stream(s):
                    op(A, W, out=out, **inputs)
        torch.cuda.synchronize()
        for k, out in enumerate(outs):
            assert_same_bits(out, want, f"{name}/{cfg}/stream {k}")


def test_counters_in_a_captured_cuda_graph(ops):
    """One workspace and one epoch for every replay: each replay's last tiles put the counters back to 0."""
    M, N, K = 128, 4104, 264
    for name, cfg in (("rowsum", "ping64"), ("dswiglu", "ping64")):
        op = ops[(name, cfg, "kernel")]
        A, W, inputs = inputs_for(op, M, N, K, name, "graph")
        out = checks.nan_outputs(op, M, N)
        op(A, W, out=out, **inputs)   # warm-up outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            op(A, W, out=out, **inputs)
        for i in range(5):
            gen = rand.generator("finish-graph", name, i, device="cuda")
            A.copy_(rand.op_inputs(op, M, N, K, gen)[0])
            for v in out.values():
                v.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            want = run(op, A, W, inputs, M, N, 0)
            assert_same_bits({k: out[k] for k in want}, want, f"{name}/{cfg}/replay {i}")
