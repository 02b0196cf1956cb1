"""The kernels a veto round may need, built beside those of a round that builds anyway
(python/coda_ext/fusion/frontend.py `veto_plans`, `_with_spares`): a veto of a GEMM that took a folded layer norm
undoes the fold, and the partition with every fold undone holds the kernels the next round then launches; a veto of
another kernel leaves its GEMMs without an epilogue, and the partition with that kernel's GEMMs excluded holds them:
they join the round's parallel build where they fit in it. CPU only (the plans trace BERT-base at its benchmark
batch on uninitialised weights; nothing compiles or runs)."""
from __future__ import annotations

import pytest

import coda_ext.fusion.frontend as fe

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


class _Source:
    def __init__(self, item):
        self.source = item[0]


def _fake_jit(monkeypatch, built: set[str]):
    import coda_ext.jit as jit

    monkeypatch.setattr(jit, "kernel_source", lambda g, d, c: _Source((g, d, c)))
    monkeypatch.setattr(jit, "cached", lambda ks: ks.source in built)
    monkeypatch.setattr(fe, "kernel_items", lambda lowered, sms=None: [(x, "bfloat16", None) for x in lowered])


@pytest.mark.parametrize("built,jobs,want", [
    (set(), 16, ["a", "b", "c", "d"]),           # a cold cache: the spares not built yet join the batch
    ({"c"}, 16, ["a", "b", "d"]),                # one spare already built
    (set(), 4, ["a", "b", "c", "d"]),            # 2 + 2 builds fill 4 jobs
    (set(), 3, ["a", "b"]),                      # 2 + 2 builds would not fit in 3 jobs: none
    ({"a", "b"}, 16, ["a", "b"]),                # nothing of the round to build: no spares planned
])
def test_spares_join_a_build_that_runs_anyway_where_they_fit(monkeypatch, built, jobs, want):
    _fake_jit(monkeypatch, built)
    planned = []

    def spare():
        planned.append(1)
        return ("b", "c", "d", "c")   # a kernel twice among the spares: once

    got = fe._with_spares([("a", "bfloat16", None), ("b", "bfloat16", None)], [spare], 132, jobs=jobs)
    assert [g for g, _, _ in got] == want
    assert planned == ([] if built >= {"a", "b"} else [1])   # a warm cache never plans the spares


def test_plans_join_in_order_each_whole_or_not_and_stop_once_the_batch_is_full(monkeypatch):
    _fake_jit(monkeypatch, set())
    called = []

    def plan(*kernels):
        def fn():
            called.append(kernels)
            return kernels
        return fn

    plans = [plan("c", "d"), plan("e", "f", "g"), plan("e"), plan("h"), plan("i")]
    got = fe._with_spares([("a", "bfloat16", None), ("b", "bfloat16", None)], plans, 132, jobs=6)
    # room for 4 beside a and b: c, d; e, f, g would not fit (skipped whole); e, then h fill it: i's plan never runs
    assert [g for g, _, _ in got] == ["a", "b", "c", "d", "e", "h"]
    assert called == [("c", "d"), ("e", "f", "g"), ("e",), ("h",)]


def test_no_plan_starts_once_the_planning_time_is_spent(monkeypatch):
    _fake_jit(monkeypatch, set())
    clock = iter([0.0, 10.0, fe.SPARE_PLANNING_S + 1.0, 99.0, 99.0])
    monkeypatch.setattr(fe.time, "perf_counter", lambda: next(clock))
    called = []

    def plan(kernel):
        def fn():
            called.append(kernel)
            return (kernel,)
        return fn

    got = fe._with_spares([("a", "bfloat16", None)], [plan("b"), plan("c"), plan("d")], 132, jobs=16)
    assert [g for g, _, _ in got] == ["a", "b"] and called == ["b"]


def test_kernel_items_lists_spares_only_of_a_backend_that_planned_them():
    with pytest.raises(ValueError, match="lists what plan"):
        fe.kernel_items([], spares=True)
    with pytest.raises(ValueError, match="give the backend"):
        fe.kernel_items(fe.CodaBackend(), spares=True)


def test_spares_that_fail_to_plan_leave_the_round_as_it_was(monkeypatch):
    _fake_jit(monkeypatch, set())

    def spare():
        raise RuntimeError("a plan that failed")

    with pytest.warns(UserWarning, match="a plan that failed"):
        got = fe._with_spares([("a", "bfloat16", None)], [spare, lambda: ("b",)], 132, jobs=16)
    assert got == [("a", "bfloat16", None), ("b", "bfloat16", None)]   # the plans after it still count


def _bert_base(timer=None):
    """BERT-base's planned training step (bench_autofusion.plan_backend, its benchmark batch), its one graph's
    report."""
    pytest.importorskip("transformers")
    pytest.importorskip("scipy", reason="the ILP needs scipy (pip install 'coda_ext[fusion]')")
    from benchmarks import bench_autofusion as ba

    return ba.plan_backend("bert-base", ba.parse(["--models", "bert-base", "--plan"]), timer=timer)[0].report.graphs[0]


def _round_zero_plans(monkeypatch) -> list[set[str]]:
    """Records, in the first round of each fused graph, the kernels its first veto plan (every fold undone, where a
    folded GEMM's kernel may be vetoed) launches."""
    plans: list[set[str]] = []
    real = fe._measure

    def measure(an, lowered, options, timer, timed, veto_round, veto_plans=()):
        veto_plans = list(veto_plans)
        if veto_round == 0 and veto_plans:
            plans.append({low.site.graph.digest() for low in veto_plans[0]() if low.site is not None})
        return real(an, lowered, options, timer, timed, veto_round, veto_plans)

    monkeypatch.setattr(fe, "_measure", measure)
    return plans


@pytest.mark.slow
def test_a_folded_gemms_veto_needs_only_kernels_of_the_unfolded_partition(monkeypatch):
    """BERT-base: the last layer's folded layer norm vetoed (as its 65.0 µs kernel was on an H200) undoes the fold,
    and the kernels that round launches beyond the first round's are among the first plan's (every fold undone)."""
    first = _bert_base()
    names = {n.strip() for f in first.folded for n in f.split(" into ")[1].split(",")}
    folded = {k.kernel: k.anchor for k in first.kernels if k.anchor in names}
    one = next(k for k, a in folded.items() if sum(x.kernel == k for x in first.kernels) == 1)
    plans = _round_zero_plans(monkeypatch)
    after = _bert_base(timer=lambda site, mnk: (1.0, 1e-6) if site.graph.digest() == one else (1e-6, 1e-6))
    assert [v.action.startswith("the fold of layer norm") for v in after.vetoed] == [True]
    undone = after.vetoed[0].action.split("layer norm ")[1].split()[0]
    # the spare plans left the real one as it was: only the vetoed fold is undone
    assert set(after.folded) == {f for f in first.folded if not f.startswith(undone + " ")}
    new = {k.kernel for k in after.kernels if k.kernel} - {k.kernel for k in first.kernels if k.kernel}
    assert new and new <= plans[0]


@pytest.mark.slow
def test_a_kernels_veto_needs_only_kernels_plan_lists_as_spares():
    """BERT-base: a kernel of GEMMs that took no fold, vetoed (each of its GEMMs left without an epilogue), makes the
    next round launch kernels the first round had not; plan(spares=True) lists them (the plans a cold first round
    also builds in its batch: veto_plans), beside every kernel of the first round."""
    pytest.importorskip("transformers")
    pytest.importorskip("scipy", reason="the ILP needs scipy (pip install 'coda_ext[fusion]')")
    import coda_ext.fusion as cf
    from benchmarks import bench_autofusion as ba

    backend = ba.plan_backend("bert-base", ba.parse(["--models", "bert-base", "--plan"]), spares=True)[0]
    first = backend.report.graphs[0]
    listed = {g.digest() for g, _, _ in cf.kernel_items(backend, sms=132, spares=True)}
    assert {g.digest() for g, _, _ in cf.kernel_items(backend, sms=132)} < listed
    names = {n.strip() for f in first.folded for n in f.split(" into ")[1].split(",")}
    plain = [k.kernel for k in first.kernels if k.kernel and k.anchor not in names]
    for victim in reversed(list(dict.fromkeys(plain))):   # the backward's first: their vetoes make new kernels
        after = _bert_base(timer=lambda site, mnk, v=victim: (1.0, 1e-6) if site.graph.digest() == v else (1e-6, 1e-6))
        assert after.vetoed and all(v.action == "no epilogue" for v in after.vetoed)
        new = {k.kernel for k in after.kernels if k.kernel} - {k.kernel for k in first.kernels if k.kernel}
        if new:
            assert new <= listed, (victim[:8], new)
            return
    pytest.fail("no veto of BERT-base's unfolded kernels made new kernels: the test checks nothing")
