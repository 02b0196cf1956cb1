"""Measured vetoes (coda_ext.fusion.timing): a fused kernel timed slower than its bare GEMM plus the fallback's
kernel for the same work is left to the fallback, and the graph is partitioned again without that epilogue.
On CPU the timer is a stand-in that says which kernel is slow; the kernels run in the interpreter, so the
model's loss and gradients are checked against eager's as everywhere else."""
from __future__ import annotations

import copy

import pytest
import torch

import coda_ext.fusion as cf
from coda_ext.fusion import timing
from coda_ext.fusion.cost import CostModel
from coda_ext.fusion.partition import partition
from tests.helpers.checks import floor, max_err, within_rule
from tests.unit.test_fusion_backend import MLP, mlp_inputs, step
from tests.unit.test_fusion_partition import G, groups_of

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


@pytest.mark.parametrize("method", ["ilp", "greedy"])
def test_an_excluded_gemm_takes_no_epilogue(method):
    if method == "ilp":
        pytest.importorskip("scipy", reason="the ILP needs scipy (pip install 'coda_ext[fusion]')")
    g = G()
    x, w, b = g.input(), g.input(), g.input(nbytes=256)
    mm = g.gemm(x, w)
    act = g.math(g.math(mm, b, roles=["tile", "row"]))
    mm2 = g.gemm(act, w)
    act2 = g.math(mm2)
    g.other(act2, name="consumer")
    pg = g.graph()
    assert set(groups_of(partition(pg, method=method))) == {mm, mm2}
    part = partition(pg, method=method, exclude=[mm])
    assert groups_of(part) == {mm2: [act2]}
    assert part.candidates[mm] == ()


def test_the_veto_rule():
    cost = CostModel(fallback_efficiency=0.5, veto_margin=0.1)
    # the alternative: 10 us of GEMM + 5 us of fallback bound at half efficiency = 20 us, and 10 % of margin
    assert not cost.slower(22e-6, 10e-6, 5e-6)
    assert cost.slower(22.1e-6, 10e-6, 5e-6)


def test_the_io_model_prices_the_fallbacks_kernel_alone():
    from coda_ext import graphs
    from coda_ext.analysis.model import io_model

    k = CostModel(gpu="H100 SXM").kernel(graphs.bias_gelu(), "bfloat16", (4096, 4096, 512))
    m = io_model(graphs.bias_gelu(), "bfloat16", (4096, 4096, 512), config="auto", gpu="H100 SXM")
    gemm = m.variants["compile"].kernels[0]
    assert gemm.gemm is not None and 0 < k.fallback_s < k.compile_s
    assert k.fallback_s == pytest.approx(k.compile_s - gemm.timing(m.gpu).seconds)   # the element-wise kernel alone


def test_the_io_model_prices_the_kernel_the_launch_picks_for_the_operands_layout():
    """Regression: the report and the vetoes priced every kernel in the config "auto" picks for K-major operands,
    while a backward GEMM reading W N-major ("kn") launches another (BERT's GELU derivative with the bias
    gradient: cooperative 128 x 256 launched, ping-pong with overlapping epilogues priced)."""
    from coda_ext import graphs
    from coda_ext.runtime.tuned import TunedOp

    graph, mnk = graphs.gelu_backward_dbias(), (16384, 3072, 768)
    for major in ("kk", "kn"):
        launched = TunedOp(graph, "bfloat16", tune=False, major=major).config_for(*mnk, 132)
        priced = CostModel(gpu="H100 SXM").kernel(graph, "bfloat16", mnk, major=major)
        assert priced.config == launched.tag, major


class SlowGelu:
    """A stand-in timer: the kernels whose graph computes a GELU take 10x their GEMM; every other kernel as long
    as its GEMM. Counts its calls per (kernel, shape)."""

    def __init__(self) -> None:
        self.calls: dict = {}

    def __call__(self, site, mnk):
        key = (site.kernel_key, mnk)
        self.calls[key] = self.calls.get(key, 0) + 1
        gelu = any(n.kind.startswith("gelu") for n in site.graph.nodes)
        return (10e-6 if gelu else 1e-6), 1e-6


def test_a_kernel_measured_slow_is_left_to_the_fallback():
    torch.manual_seed(0)
    model = MLP().to(torch.bfloat16)
    eager, ref = copy.deepcopy(model), copy.deepcopy(model).double()
    timer = SlowGelu()
    fused = cf.fuse(model, fallback="eager", timer=timer)
    x, t = mlp_inputs()
    loss, grads = step(fused, x.to(torch.bfloat16), t)
    loss_e, grads_e = step(eager, x.to(torch.bfloat16), t)
    loss_r, grads_r = step(ref, x.double(), t)
    for got, base, want in zip([loss] + grads, [loss_e] + grads_e, [loss_r] + grads_r, strict=True):
        err, err_eager, top = max_err(got, want), max_err(base, want), want.abs().max().item()
        assert within_rule(err, err_eager, top), f"max error {err:.3e} > 2 x {err_eager:.3e} + {floor(top):.1e}"
    (rep,) = cf.report_of(fused).graphs
    assert rep.vetoed and all(v.slow and v.action == "no epilogue" for v in rep.vetoed)
    kept = [k for k in rep.kernels if k.kernel]
    assert kept and not any("gelu" in m for k in kept for m in k.members)  # the GELU's math runs in the fallback
    assert {v.anchor for v in rep.measured} == {k.anchor for k in kept}
    assert not any(v.slow for v in rep.measured)
    assert max(timer.calls.values()) == 1                         # each kernel and shape timed once
    assert "round 0: " in str(rep) and ": no epilogue" in str(rep)
    d = rep.vetoed[0].to_dict()
    assert d["action"] == "no epilogue" and d["round"] == 0 and d["fused_us"] == pytest.approx(10.0)
    from benchmarks.bench_autofusion import coda_stats

    stats = coda_stats(fused.coda_backend)
    assert len(stats["vetoes"]) == len(rep.vetoed) and stats["kernels_timed"]
    assert sum(k["gemms"] for k in stats["kernels_timed"]) == len(rep.measured)
    assert len({(k["kernel"], tuple(k["mnk"])) for k in stats["kernels_timed"]}) == len(stats["kernels_timed"])


def test_no_timer_no_veto():
    torch.manual_seed(0)
    model = MLP().to(torch.bfloat16)
    timer = SlowGelu()
    fused = cf.fuse(model, fallback="eager", timer=timer, measure=False)
    x, t = mlp_inputs()
    step(fused, x.to(torch.bfloat16), t)
    (rep,) = cf.report_of(fused).graphs
    assert not timer.calls and not rep.vetoed and not rep.measured
    assert any("gelu" in m for k in rep.kernels if k.kernel for m in k.members)


def test_measure_options_are_checked():
    with pytest.raises(ValueError, match="measure must be"):
        cf.Options(measure="yes")
    opts = cf.Options(measure=True)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="needs CUDA"):
            opts.timer_for("cuda")
    assert cf.Options().timer_for("interpret") is None          # "auto": only where kernels run on a GPU
    assert cf.Options(execute="interpret").timer_for("cuda") is None


def test_fp32_kernels_are_kept_unmeasured():
    from coda_ext import graphs
    from coda_ext.fusion.op import Site

    site = Site(graphs.bias_gelu().build(), "float32", "kk", (), ())
    called = []
    out = timing.verdicts([("mm", "mm", site, (64, 64, 64))], CostModel(),
                          lambda s, m: called.append(m) or (1.0, 0.0))
    assert out == [] and called == []


def test_a_timer_that_fails_keeps_the_kernel_with_a_warning():
    from coda_ext import graphs
    from coda_ext.fusion.op import Site

    site = Site(graphs.bias_gelu().build(), "bfloat16", "kk", (), ())

    def broken(s, m):
        raise MemoryError("its tensors need 9 GB")

    with pytest.warns(UserWarning, match="was not timed, it stays fused .MemoryError: its tensors need 9 GB"):
        assert timing.verdicts([("mm", "mm", site, (64, 64, 64))], CostModel(), broken) == []


# --- layer norms folded into their GEMMs (fusion/passes/norm_fold.py): a veto undoes the fold first -----------

def _four_folded_norms():
    """Four layer norms, each folded into the one GEMM that reads it; the first GEMM's epilogue also has a GELU."""
    import torch.nn.functional as F

    from tests.unit.test_fusion_norm import ln, randn, trace

    def f(x1, x2, x3, x4, g, b, w, c):
        return [F.gelu(F.linear(ln(x1, g, b), w, c)), torch.relu(F.linear(ln(x2, g, b), w, c)),
                torch.relu(F.linear(ln(x3, g, b), w, c)), torch.relu(F.linear(ln(x4, g, b), w, c))]

    args = [randn(i, 2, 6, 16, scale=2.0, shift=3.0) for i in range(1, 5)]
    args += [randn(5, 16, shift=1.0), randn(6, 16), randn(7, 12, 16), randn(8, 12)]
    return trace(f, *[a.to(torch.bfloat16) for a in args])


def _gelu(site) -> bool:
    return any(n.kind.startswith("gelu") for n in site.graph.nodes)


def _folded(site) -> bool:   # the fold's math: acc - mean * s, then * rstd
    return any(n.kind == "sub" for n in site.graph.nodes)


def test_a_slow_folded_gemm_loses_its_fold_and_the_other_folds_stay():
    from coda_ext.fusion import frontend
    from tests.unit.test_fusion_norm import FOLD

    gm = _four_folded_norms()
    plain = frontend.fuse_graph(gm, frontend.Options(cost=FOLD, measure=False), "interpret", "t")[1]
    assert len(plain.folded) == 4

    def timer(site, mnk):   # the first layer norm's folded GEMM (GELU and the fold) only
        return (10e-6 if _gelu(site) and _folded(site) else 1e-6), 1e-6

    _, rep, _ = frontend.fuse_graph(gm, frontend.Options(cost=FOLD, timer=timer), "interpret", "t")
    (veto,) = rep.vetoed
    assert veto.action.startswith("the fold of layer norm") and veto.round == 0
    assert len(rep.folded) == 3                                   # the other three stay folded
    assert not any(v.slow for v in rep.measured)
    assert "measured slower (a veto)" in rep.note and "did not take the fold's math" not in rep.note
    gelu = [k for k in rep.kernels if k.kernel and any("gelu" in m for m in k.members)]
    assert gelu                                                   # its GEMM keeps an epilogue of its own (timed: fast)


def test_a_slow_gemm_stays_excluded_whatever_the_later_folds_rename():
    from coda_ext.fusion import frontend
    from tests.unit.test_fusion_norm import FOLD

    gm = _four_folded_norms()

    def timer(site, mnk):   # the first GEMM's epilogue, folded or not, is slow: its fold goes, then its epilogue
        return (10e-6 if _gelu(site) else 1e-6), 1e-6

    _, rep, _ = frontend.fuse_graph(gm, frontend.Options(cost=FOLD, timer=timer), "interpret", "t")
    assert [v.action.split(" ")[0] for v in rep.vetoed] == ["the", "no"]    # fold undone, then no epilogue
    assert [v.round for v in rep.vetoed] == [0, 1]
    assert len(rep.folded) == 3
    assert not any(any("gelu" in m for m in k.members) for k in rep.kernels if k.kernel)
    assert sum(1 for k in rep.kernels if k.kernel) == 3           # the three other GEMMs keep theirs


def test_slow_kernels_past_the_last_round_stay_fused_and_the_report_says_so(monkeypatch):
    from coda_ext.fusion import frontend
    from tests.unit.test_fusion_norm import FOLD

    monkeypatch.setattr(timing, "MAX_ROUNDS", 0)
    gm = _four_folded_norms()
    _, rep, _ = frontend.fuse_graph(gm, frontend.Options(cost=FOLD, timer=lambda s, m: (10e-6, 1e-6)),
                                    "interpret", "t")
    assert not rep.vetoed and rep.measured and all(v.slow for v in rep.measured)
    assert len(rep.folded) == 4
    assert "slower, kept: the veto's partitions ran out" in str(rep)


def test_a_vetoed_epilogue_that_moves_to_another_gemm_is_followed_without_a_timed_round(monkeypatch):
    """Two GEMMs of one input summed, then a ReLU: either can anchor the sum and the ReLU (loading the other's
    output), and both make the same kernel. Slow: with one partition after the first allowed to time new kernels,
    the veto follows the epilogue to the second GEMM on the time it knows (no timed round), and neither is left
    fused."""
    from coda_ext.fusion import frontend
    from tests.unit.test_fusion_norm import randn, trace

    def f(a, w1, w2):
        return torch.relu(a @ w1.t() + a @ w2.t())

    args = [randn(1, 32, 16), randn(2, 24, 16), randn(3, 24, 16)]
    gm = trace(f, *[x.to(torch.bfloat16) for x in args])
    monkeypatch.setattr(timing, "MAX_ROUNDS", 1)
    calls = []

    def timer(site, mnk):
        calls.append(site.graph.digest())
        return (10e-6 if any(n.kind == "relu" for n in site.graph.nodes) else 1e-6), 1e-6

    plain = frontend.fuse_graph(gm, frontend.Options(measure=False, merge=False), "interpret", "t")[1]
    assert any(k.kernel and any("relu" in m for m in k.members) for k in plain.kernels)
    _, rep, _ = frontend.fuse_graph(gm, frontend.Options(timer=timer, merge=False), "interpret", "t")
    assert not any(k.kernel for k in rep.kernels) and not rep.measured
    assert [v.round for v in rep.vetoed] == [0, 1] and len({v.kernel for v in rep.vetoed}) == 1
    assert len(calls) == 1                                   # the one kernel, timed once


class _HostClock:
    """Stands in for torch.cuda's events and GPU wait: the host takes `host_us` to queue each call, the GPU `gpu_us`
    to run it, and the wait lasts `cycles` / 2000 µs; the GPU waits on the host where the wait ends first."""

    def __init__(self, host_us: float, gpu_us: float):
        self.host_us, self.gpu_us, self.waits = host_us, gpu_us, []
        self.queued_us = 0.0

    def sleep(self, cycles: int) -> None:
        self.waits.append(cycles)
        self.queued_us = 0.0

    def call(self) -> None:
        self.queued_us += self.host_us

    def event(self, enable_timing: bool = False):
        clock = self

        class Event:
            def record(self) -> None:
                self.at_wait = clock.waits[-1] / 2000

            def query(self) -> bool:
                return clock.queued_us > self.at_wait

            def synchronize(self) -> None:
                pass

            def elapsed_time(self, end) -> float:   # ms
                host_bound = clock.queued_us > self.at_wait
                per_call = clock.host_us if host_bound and clock.host_us > clock.gpu_us else clock.gpu_us
                return per_call * timing.CALLS / 1000
        return Event()


@pytest.mark.parametrize("host_us,gpu_us,waits", [(100, 30, 1), (400, 30, 2), (1e5, 30, None)])
def test_the_gpu_timer_waits_longer_when_the_host_queues_slower_than_the_wait(monkeypatch, host_us, gpu_us, waits):
    """Behind a wait of about 1 ms, a host that takes more than 250 µs to queue each of the four calls would be
    measured, not the kernel (timing._gpu_ms): the wait grows until it outlasts the host's queueing; past
    MAX_WAIT_CYCLES the host-bound time is returned with a warning."""
    clock = _HostClock(host_us, gpu_us)
    monkeypatch.setattr(torch.cuda, "Event", clock.event)
    monkeypatch.setattr(torch.cuda, "_sleep", clock.sleep)
    fns = [clock.call, clock.call]
    if waits is None:
        with pytest.warns(UserWarning, match="longer to queue than a GPU wait"):
            got = timing._gpu_ms(fns)
        assert got == pytest.approx(host_us / 1000) and clock.waits[-1] >= timing.MAX_WAIT_CYCLES
        return
    assert timing._gpu_ms(fns) == pytest.approx(gpu_us / 1000)
    assert clock.waits == [timing.WAIT_CYCLES * timing.WAIT_GROWTH ** i for i in range(waits)]
