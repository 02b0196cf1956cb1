"""The kernels a veto round may need, built beside the first round's (fusion/frontend.py `_with_spares`): a veto of
a GEMM that took a folded layer norm undoes the fold, and the partition with every fold undone holds the kernels the
next round then launches, so they join the first round's parallel build where they fit in it. CPU only (the plans
trace BERT-base at its benchmark batch on uninitialised weights; nothing compiles or runs)."""
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

    got = fe._with_spares([("a", "bfloat16", None), ("b", "bfloat16", None)], spare, 132, jobs=jobs)
    assert [g for g, _, _ in got] == want
    assert planned == ([] if built >= {"a", "b"} else [1])   # a warm cache never plans the spares


def test_spares_that_fail_to_plan_leave_the_round_as_it_was(monkeypatch):
    _fake_jit(monkeypatch, set())

    def spare():
        raise RuntimeError("a plan that failed")

    with pytest.warns(UserWarning, match="a plan that failed"):
        got = fe._with_spares([("a", "bfloat16", None)], spare, 132, jobs=16)
    assert got == [("a", "bfloat16", None)]


def _bert_base(timer=None):
    """BERT-base's planned training step (bench_autofusion.plan_backend, its benchmark batch), its one graph's
    report."""
    pytest.importorskip("transformers")
    pytest.importorskip("scipy", reason="the ILP needs scipy (pip install 'coda_ext[fusion]')")
    from benchmarks import bench_autofusion as ba

    return ba.plan_backend("bert-base", ba.parse(["--models", "bert-base", "--plan"]), timer=timer)[0].report.graphs[0]


@pytest.mark.slow
def test_a_folded_gemms_veto_needs_only_kernels_of_the_unfolded_partition(monkeypatch):
    """BERT-base: the last layer's folded layer norm vetoed (as its 65.0 µs kernel was on an H200) undoes the fold,
    and the kernels that round launches beyond the first round's are among the spares."""
    first = _bert_base()
    names = {n.strip() for f in first.folded for n in f.split(" into ")[1].split(",")}
    folded = {k.kernel: k.anchor for k in first.kernels if k.anchor in names}
    one = next(k for k, a in folded.items() if sum(x.kernel == k for x in first.kernels) == 1)
    spares: list[set[str]] = []
    real = fe._measure

    def measure(an, lowered, options, timer, timed, veto_round, spare=None):
        if spare is not None:
            spares.append({low.site.graph.digest() for low in spare() if low.site is not None})
        return real(an, lowered, options, timer, timed, veto_round, spare)

    monkeypatch.setattr(fe, "_measure", measure)
    after = _bert_base(timer=lambda site, mnk: (1.0, 1e-6) if site.graph.digest() == one else (1e-6, 1e-6))
    assert [v.action.startswith("the fold of layer norm") for v in after.vetoed] == [True]
    undone = after.vetoed[0].action.split("layer norm ")[1].split()[0]
    # the spare plan left the real one as it was: only the vetoed fold is undone
    assert set(after.folded) == {f for f in first.folded if not f.startswith(undone + " ")}
    new = {k.kernel for k in after.kernels if k.kernel} - {k.kernel for k in first.kernels if k.kernel}
    assert new and len(spares) == 1 and new <= spares[0]
