"""The partitioner on hand-made graphs: every rule it keeps (one epilogue per node, connection, loads,
reductions end an epilogue, forward/backward, kernel limits, acyclicity), each checked against
violations() and against the partition the ILP and the greedy fallback return."""
from __future__ import annotations

import re

import pytest

from coda_ext.fusion.cost import CostModel
from coda_ext.fusion.partition import (
    Limits,
    candidates,
    cycles,
    gain,
    io,
    is_acyclic,
    outside,
    partition,
    recomputed,
    violations,
)
from coda_ext.fusion.pgraph import Operand, PGraph, PNode

F = (64, 128)       # the frame of every GEMM below: 64 rows x 128 columns
B = 64 * 128 * 2    # bytes of one bf16 value in it


class G:
    """A tiny graph builder: g.input(), g.gemm(a, w), g.math(*srcs), g.reduce(src), g.other(*srcs)."""

    def __init__(self) -> None:
        self.nodes: list[PNode] = []

    def _add(self, op: str, operands: tuple[Operand, ...], **kw) -> int:
        i = len(self.nodes)
        kw.setdefault("nbytes", B)
        self.nodes.append(PNode(id=i, name=kw.pop("name", f"n{i}"), op=op, target=kw.pop("target", op),
                                operands=operands, **kw))
        return i

    def input(self, **kw) -> int:
        return self._add("input", (), **kw)

    def gemm(self, a: int, w: int, **kw) -> int:
        return self._add("gemm", (Operand(a, None), Operand(w, None)), frame=F, **kw)

    def math(self, *srcs, roles=None, frame=F, **kw) -> int:
        roles = roles or ["tile"] * len(srcs)
        return self._add("math", tuple(Operand(s, r) for s, r in zip(srcs, roles)), frame=frame, **kw)

    def reduce(self, src: int, axis: str = "row", **kw) -> int:
        return self._add("reduce", (Operand(src, "tile"),), frame=F, axis=axis, reduce_op="sum", nbytes=256, **kw)

    def other(self, *srcs, **kw) -> int:
        return self._add("other", tuple(Operand(s, None) for s in srcs), **kw)

    def graph(self) -> PGraph:
        return PGraph(tuple(self.nodes))


def groups_of(part) -> dict[int, list[int]]:
    return {g.anchor: list(g.members) for g in part.groups}


def needs_scipy():
    pytest.importorskip("scipy", reason="the ILP needs scipy (pip install 'coda_ext[fusion]')")


@pytest.fixture(params=["ilp", "greedy"])
def method(request):
    if request.param == "ilp":
        needs_scipy()
    return request.param


def test_a_gemm_takes_its_bias_activation_chain(method):
    g = G()
    x, w, b = g.input(), g.input(), g.input(nbytes=256)
    mm = g.gemm(x, w)
    add = g.math(mm, b, roles=["tile", "row"])
    act = g.math(add)
    g.other(act, name="consumer")
    pg = g.graph()
    part = partition(pg, method=method)
    assert groups_of(part) == {mm: [add, act]}
    assert violations(pg, groups_of(part)) == []
    loads, stores, reductions = io(pg, mm, [add, act])
    assert loads == [(b, "row")] and stores == [act] and reductions == []
    # kept on chip: mm's and add's writes and their reads by add and act
    assert gain(pg, CostModel(member_cost=0.0), mm, [add, act]) == 4 * B


def test_a_crossing_pair_that_naive_fusion_makes_cyclic_comes_out_acyclic(method):
    """a = g1 + g2 and b = g2 * g1: fusing each into the epilogue of the GEMM of its first operand (naive
    greedy) makes g1's kernel wait for g2's and g2's for g1's."""
    g = G()
    x, w1, y, w2 = g.input(), g.input(), g.input(), g.input()
    g1, g2 = g.gemm(x, w1), g.gemm(y, w2)
    a = g.math(g1, g2)
    b = g.math(g2, g1)
    g.other(a), g.other(b)
    pg = g.graph()
    naive = {g1: [a], g2: [b]}
    assert not is_acyclic(pg, naive)
    assert "the fused kernels form a cycle" in violations(pg, naive)
    assert len(cycles(pg, naive)) == 1
    part = partition(pg, method=method)
    got = groups_of(part)
    assert is_acyclic(pg, got) and violations(pg, got) == []
    assert sorted(v for vs in got.values() for v in vs) == [a, b]   # both still fused, in one epilogue
    assert len(got) == 1


def test_the_ilp_cuts_the_cycle_its_first_solution_has():
    """The same crossing with a chain behind each of a and b, and kernels of 3 slots (one load, two
    stores): no epilogue holds both chains, so the best assignment ignoring acyclicity puts a's chain
    with g1 and b's with g2 — a cycle. The program is cut and solved again: one chain is fused."""
    needs_scipy()
    g = G()
    x, w1, y, w2 = g.input(), g.input(), g.input(), g.input()
    g1, g2 = g.gemm(x, w1, output=True), g.gemm(y, w2, output=True)
    a, b = g.math(g1, g2), g.math(g2, g1)
    a3, b3 = g.math(g.math(a)), g.math(g.math(b))
    g.other(a3), g.other(b3)
    pg = g.graph()
    limits = Limits(slots=3)
    part = partition(pg, limits=limits)
    cuts = int(re.search(r"(\d+) cycle cut", part.status).group(1))
    assert part.method == "ilp" and cuts >= 1
    got = groups_of(part)
    assert violations(pg, got, limits) == [] and sum(len(vs) for vs in got.values()) == 3


def test_a_path_out_of_the_epilogue_and_back_keeps_the_node_out():
    """g1 -> u -> g2 (u feeds the next GEMM) and v = g1 + g2: v in g1's epilogue would feed g2 and wait for
    it. v can only join g2's epilogue."""
    g = G()
    x, w1, w2 = g.input(), g.input(), g.input()
    g1 = g.gemm(x, w1)
    u = g.math(g1)
    g2 = g.gemm(u, w2)
    v = g.math(g1, g2)
    g.other(v)
    pg = g.graph()
    cands = candidates(pg)
    assert v not in cands[g1] and v in cands[g2]
    assert not is_acyclic(pg, {g1: [u, v]})
    needs_scipy()
    for m in ("ilp", "greedy"):
        got = groups_of(partition(pg, method=m))
        assert got == {g1: [u], g2: [v]} and violations(pg, got) == []


def test_a_reduction_ends_the_epilogue(method):
    """r = rowsum(h) and c = h * r: c reads the reduction, so it is not in the epilogue that computes r
    (it runs after the kernel that finishes the reduction)."""
    g = G()
    x, w, res = g.input(), g.input(), g.input()
    mm = g.gemm(x, w)
    h = g.math(mm, res)
    r = g.reduce(h)
    c = g.math(h, r, roles=["tile", "col"])
    g.other(c)
    pg = g.graph()
    assert "reads a reduction of its own epilogue" in " ".join(violations(pg, {mm: [h, r, c]}))
    got = groups_of(partition(pg, method=method))
    assert got == {mm: [h, r]} and violations(pg, got) == []


def test_a_forward_gemm_never_takes_a_backward_node(method):
    g = G()
    x, w, dy = g.input(), g.input(), g.input(backward=True)
    mm = g.gemm(x, w)
    fwd = g.math(mm)
    bwd = g.math(mm, dy, backward=True)        # depends on a tangent: backward
    g.other(fwd), g.other(bwd, backward=True)
    pg = g.graph()
    assert candidates(pg)[mm] == (fwd,)
    assert groups_of(partition(pg, method=method)) == {mm: [fwd]}


def test_an_operand_that_cannot_be_loaded_must_be_a_member(method):
    """where(eq(col, target), h, 0): the bool eq cannot be loaded as a tile, so it runs in the epilogue; it
    is also read outside (say, by the backward), where it is recomputed rather than stored."""
    g = G()
    x, w, target = g.input(), g.input(), g.input(nbytes=64 * 8)
    mm = g.gemm(x, w)
    eq = g.math(target, roles=["col"], storable=False, nbytes=64 * 128)
    pick = g.math(eq, mm, roles=[None, "tile"])
    r = g.reduce(pick)
    g.other(r), g.other(eq, name="backward reader")
    pg = g.graph()
    got = groups_of(partition(pg, method=method))
    assert got == {mm: [eq, pick, r]} and violations(pg, got) == []
    assert recomputed(pg, mm, got[mm]) == [eq]
    loads, stores, _ = io(pg, mm, got[mm])
    assert loads == [(target, "col")] and eq not in stores


def test_an_unstorable_value_that_reads_the_epilogue_stays_inside_or_out(method):
    g = G()
    x, w = g.input(), g.input()
    mm = g.gemm(x, w)
    mask = g.math(mm, storable=False)           # a comparison of the accumulator
    g.other(mask)                               # read outside: it would have to be stored
    g.other(g.math(mask, mm, roles=[None, "tile"]))
    pg = g.graph()
    assert mask not in candidates(pg)[mm]
    got = groups_of(partition(pg, method=method))
    assert all(mask not in vs for vs in got.values()) and violations(pg, got) == []


def test_the_kernel_limits_are_kept(method):
    g = G()
    x, w = g.input(), g.input()
    mm = g.gemm(x, w)
    h = mm
    chain = []
    for _ in range(4):
        h = g.math(h, g.input(), roles=["tile", "tile"])   # each member loads one more tile
        chain.append(h)
    reds = [g.reduce(h) for _ in range(3)]
    g.other(h), [g.other(r) for r in reds]
    pg = g.graph()
    limits = Limits(slots=4, reductions=1)
    got = groups_of(partition(pg, method=method, limits=limits))
    assert violations(pg, got, limits) == []
    members = got[mm]
    loads, stores, reductions = io(pg, mm, members)
    assert len(loads) + len(stores) + len(reductions) <= 4 and len(reductions) <= 1
    assert violations(pg, {mm: chain + reds}, limits) != []


def test_the_epilogue_buffers_stay_within_the_kernels_shared_memory(method):
    """Regression: a chain of tile loads fitted the slot limit but not the GPU kernel's shared memory
    (the greedy partition of BERT-large made an epilogue of 626 KB); the "cuda" limits keep the
    buffers within the budget of every config config="auto" may launch."""
    from coda_ext.fusion.partition import smem
    from coda_ext.fusion.rules import SharedMemory, shared_memory

    g = G()
    x, w = g.input(), g.input()
    mm = g.gemm(x, w)
    h = mm
    for _ in range(12):
        h = g.math(h, g.input(), roles=["tile", "tile"])   # each member loads one more bf16 tile
    g.other(h)
    pg = g.graph()
    budget = SharedMemory(budget=5 * 8192 * 2, tile=8192, store=4096, row=1024)   # five bf16 tiles' worth
    limits = Limits(smem=budget)
    got = groups_of(partition(pg, method=method, limits=limits))
    assert violations(pg, got, limits) == []
    # four members: four tiles (64 KB) and the stored result (8 KB); a fifth tile would need 88 KB
    assert smem(pg, mm, got[mm], budget) == 4 * 16384 + 8192 and len(got[mm]) == 4
    assert len(groups_of(partition(pg, method=method))[mm]) == 12        # no budget: all twelve join
    cuda = Limits.of("cuda").smem
    assert cuda == shared_memory() and Limits.of("interpret").smem is None
    # the GPU's: two bf16 tiles of a ping-pong 64x32 subtile's four stages cost 32 KB; a 64x256 tile
    # with two mainloop stages leaves the epilogue about 138 KB
    assert cuda.cost("tile", 2) == 16384 and cuda.cost("store", 4) == 16384 and 120_000 < cuda.budget < 150_000


def test_different_frames_do_not_fuse():
    g = G()
    x, w = g.input(), g.input()
    mm = g.gemm(x, w)
    g.other(g.math(mm, frame=(128, 64)))
    assert candidates(g.graph())[mm] == ()
    part = partition(g.graph())
    assert part.groups == () and part.method == "none"


def test_the_ilp_is_at_least_as_good_as_greedy_and_both_are_valid():
    """Two layers' worth of GEMM epilogues with a residual stream and shared inputs."""
    needs_scipy()
    g = G()
    x, res = g.input(), g.input()
    for _ in range(2):
        w1, w2, b = g.input(), g.input(), g.input(nbytes=256)
        h1 = g.gemm(x, w1)
        a = g.math(g.math(h1, b, roles=["tile", "row"]))
        h2 = g.gemm(a, w2)
        res = g.math(h2, res)
        r = g.reduce(res)
        x = g.math(res, r, roles=["tile", "col"])
    g.other(x)
    pg = g.graph()
    cost = CostModel()
    ilp, greedy = partition(pg, cost, method="ilp"), partition(pg, cost, method="greedy")
    assert ilp.method == "ilp" and greedy.method == "greedy"
    for p in (ilp, greedy):
        assert violations(pg, groups_of(p)) == []
    assert ilp.objective >= greedy.objective > 0


# --- layer norm between GEMMs: what the folded and recomputed normalisation needs -------------------

def test_math_only_the_epilogue_reads_joins_from_its_loads(method):
    """A folded layer norm's μ ⊗ s: an (M, N) product of a column and a row vector that only the
    epilogue reads joins it (loading the two vectors), so no one writes the outer product; the same
    product read elsewhere too is no candidate of a forward GEMM (the epilogue would store it)."""
    g = G()
    x, w, mean, s = g.input(), g.input(), g.input(nbytes=256), g.input(nbytes=512)
    mm = g.gemm(x, w)
    outer = g.math(mean, s, roles=["col", "row"])
    centred = g.math(mm, outer)
    g.other(centred)
    pg = g.graph()
    assert candidates(pg)[mm] == (outer, centred)
    assert groups_of(partition(pg, method=method)) == {mm: [outer, centred]}
    assert io(pg, mm, [outer, centred])[0] == [(mean, "col"), (s, "row")]
    g.other(outer, name="elsewhere")
    assert candidates(g.graph())[mm] == (centred,)


def test_a_backward_gemm_recomputes_and_stores_what_only_the_backward_reads():
    """The dX GEMM of a folded layer norm: x̂ = (x − μ)·rstd, which no forward node reads any more, joins
    the epilogue that reduces dy·x̂ (as before the fold), and so does y = x̂·γ + β, computed from x̂ for
    the weight gradient dzᵀ @ y: the epilogue stores it, nothing writes x̂."""
    needs_scipy()
    g = G()
    x, mean, rstd, w, gamma, beta = (g.input(nbytes=n) for n in (B, 256, 256, B, 256, 256))
    xc = g.math(x, mean, roles=["tile", "col"], forward=False)
    xhat = g.math(xc, rstd, roles=["tile", "col"], forward=False)
    y = g.math(g.math(xhat, gamma, roles=["tile", "row"], forward=False), beta, roles=["tile", "row"],
               forward=False)
    dz = g.input(backward=True, forward=False)
    dy = g.gemm(dz, w, backward=True, forward=False)
    r = g.reduce(g.math(dy, xhat, backward=True, forward=False), backward=True, forward=False)
    g.other(r)
    g.gemm(dz, y, backward=True, forward=False, name="dW")
    pg = g.graph()
    cands = candidates(pg)[dy]
    assert {xc, xhat, y} <= set(cands)
    got = groups_of(partition(pg))
    assert {xc, xhat, y} <= set(got[dy]) and violations(pg, got) == []
    _, stores, _ = io(pg, dy, got[dy])
    assert y in stores and xhat not in stores


def test_the_fallback_computes_again_what_it_reads_wider_than_the_loads_it_comes_from():
    """A layer-norm backward's epilogue: x̂ = (x − μ)·rstd (fp32, from the bf16 x it loads) feeds the epilogue's
    reduction and the fallback's element-wise dx: the fallback computes x̂ again from x (reading 2 bytes an
    element, not 4, and the kernel writes none), and with it x − μ; dy·γ (an op not among AGAIN_FROM_ROUNDED) reads
    the accumulator the kernel holds unrounded and stays stored. Read by a GEMM or another op that is not
    element-wise math, or by another epilogue, x̂ is stored; no wider than x, it is computed again all the same
    (the fallback reads as many bytes, the kernel writes none)."""
    def build(reader: str = "fallback", wide: bool = True):
        g = G()
        x, mean, rstd, w, gamma = (g.input(nbytes=n) for n in (B, 256, 256, B, 256))
        xc = g.math(x, mean, roles=["tile", "col"], nbytes=2 * B if wide else B)
        xhat = g.math(xc, rstd, roles=["tile", "col"], nbytes=2 * B if wide else B)
        dz = g.input()
        dy = g.gemm(dz, w)
        dyg = g.math(dy, gamma, roles=["tile", "row"], nbytes=2 * B)
        r = g.reduce(g.math(dyg, xhat, nbytes=2 * B))
        if reader == "gemm":
            g.gemm(dz, xhat, name="dW")
        dx = g.math(dyg, xhat if reader != "gemm" else dyg, r, roles=["tile", "tile", "col"], nbytes=2 * B)
        g.other(dx, *([xhat] if reader == "other" else []))
        return g.graph(), dy, [xc, xhat, dyg, r - 1, r], dx

    pg, dy, members, dx = build()
    xc, xhat, dyg = members[:3]
    again = outside(pg, dy, members, {dy, *members})
    assert again == (xc, xhat)
    _, stores, _ = io(pg, dy, members, outside=again)
    assert stores == [dyg]
    assert set(recomputed(pg, dy, members, outside=again)) == {xc, xhat}
    assert outside(pg, dy, members, {dy, *members, dx}) == ()     # another epilogue reads x̂: stored
    for reader in ("gemm", "other"):
        pg, dy, members, _ = build(reader)
        assert outside(pg, dy, members, {dy, *members}) == (), reader
    pg, dy, members, _ = build(wide=False)
    assert outside(pg, dy, members, {dy, *members}) == (xc, xhat)


def test_the_fallback_computes_a_wide_value_again_from_a_16_bit_one_the_kernel_stores_instead():
    """A layer-norm backward's g = γ · f32(dy) where dy = acc + t1 + t2 (the GEMM's output and two gradients it
    loads, each 16-bit): the kernel stores the 16-bit dy in place of the fp32 g (2 bytes an element written and
    read instead of 4 each way) and the fallback computes f32(dy) and g again from it; g's reduction stays in the
    kernel. The same value straight from the accumulator: the GEMM's output D is stored in its place. Not through a
    transcendental op (exp of the rounded value), nor where the 16-bit value is no narrower."""
    def build(op: str = "aten.mul.Tensor", sums: bool = True, g_bytes: int = 2 * B):
        g = G()
        w, gamma, t1, t2, dz = g.input(), g.input(nbytes=256), g.input(), g.input(), g.input()
        dy = g.gemm(dz, w)
        s = g.math(g.math(dy, t1, target="aten.add.Tensor"), t2, target="aten.add.Tensor") if sums else dy
        f = g.math(s, target="prims.convert_element_type.default", nbytes=g_bytes)
        gg = g.math(f, gamma, roles=["tile", "row"], target=op, nbytes=g_bytes)
        r = g.reduce(gg)
        dx = g.math(gg, r, roles=["tile", "col"], target="aten.mul.Tensor", nbytes=2 * B)
        g.other(dx)
        members = list(range(dy + 1, r + 1))
        return g.graph(), dy, members, s, f, gg

    pg, dy, members, s, f, gg = build()
    again = outside(pg, dy, members, {dy, *members})
    assert again == (f, gg)
    _, stores, _ = io(pg, dy, members, outside=again)
    assert stores == [s]
    assert set(recomputed(pg, dy, members, outside=again)) == {f, gg}
    pg, dy, members, s, f, gg = build(sums=False)
    again = outside(pg, dy, members, {dy, *members})
    assert again == (f, gg) and io(pg, dy, members, outside=again)[1] == [dy]
    pg, dy, members, *_ = build(op="aten.exp.default")
    assert outside(pg, dy, members, {dy, *members}) == ()
    pg, dy, members, *_ = build(g_bytes=B)     # g in 16 bits: storing it moves no more than storing dy
    assert outside(pg, dy, members, {dy, *members}) == ()
    pg, dy, members, s, f, gg = build()        # through the partition, and without narrow stores (an A/B)
    for method in ("ilp", "greedy"):
        (grp,) = partition(pg, method=method).groups
        assert set(grp.members) == set(members) and grp.outside == (f, gg), method
        (grp,) = partition(pg, method=method, narrow_stores=False).groups
        assert grp.outside == () and gg in io(pg, dy, grp.members, outside=grp.outside)[1], method


def test_what_the_fallback_computes_again_leaves_no_epilogue_empty_or_apart_from_its_gemm():
    """Regressions: v = acc · s (fp32) read only by a select the fallback runs is cheaper computed there from the
    stored 16-bit acc, but it is the epilogue's only member: the GEMM keeps it (an epilogue without members would be
    an identity kernel where aten.mm runs). m = f(a) from a load and v = acc · m read by that select: v computed
    again would leave m alone in the kernel, joined to nothing of its GEMM; it stays."""
    g = G()
    x, w, s, q = g.input(), g.input(), g.input(nbytes=256), g.input()
    mm = g.gemm(x, w)
    v = g.math(mm, s, roles=["tile", "row"], target="aten.mul.Tensor", nbytes=2 * B)
    g.other(g.math(q, v, roles=[None, "tile"], target="aten.where.self", nbytes=2 * B))
    pg = g.graph()
    for method in ("ilp", "greedy"):
        (grp,) = partition(pg, method=method).groups
        assert grp.members == (v,) and grp.outside == (), method

    g = G()
    x, w, a, q = g.input(), g.input(), g.input(nbytes=2 * B), g.input()
    mm = g.gemm(x, w, output=True)
    m = g.math(a, target="aten.mul.Tensor")
    v = g.math(mm, m, target="aten.mul.Tensor", nbytes=2 * B)
    g.other(g.math(q, v, roles=[None, "tile"], target="aten.where.self", nbytes=2 * B))
    pg = g.graph()
    for method in ("ilp", "greedy"):
        groups = partition(pg, method=method).groups
        assert [(grp.members, grp.outside) for grp in groups] == [((m, v), ())], (method, groups)


def test_what_reads_a_reduction_of_the_gemms_values_is_no_candidate():
    """r = Σ acc, then v = acc − r: r in the epilogue ends it, r outside waits for it; v can never join
    (and the candidate sets of a long backward chain stay per layer, the program in small parts)."""
    g = G()
    x, w = g.input(), g.input()
    mm = g.gemm(x, w)
    r = g.reduce(mm)
    v = g.math(mm, r, roles=["tile", "col"])
    after = g.math(v)
    g.other(after)
    assert candidates(g.graph())[mm] == (r,)


def test_the_ilp_keeps_a_small_epilogue_beside_a_large_one():
    """The program is solved exactly (relative gap 0), part by part: HiGHS's default gap, 1e-4 of the
    objective, dropped a tiny ViT's classifier-head log-sum-exp (test_fusion_models); here the small
    epilogue shares its part with one a million times larger."""
    needs_scipy()
    g = G()
    x, w = g.input(), g.input()
    big = g.gemm(x, w, nbytes=10**9)
    g.other(g.math(g.math(big, nbytes=10**9), nbytes=10**9))
    small = g.gemm(g.input(), g.input(), nbytes=256)
    r = g.reduce(small)
    g.other(r)
    g.other(g.math(big, small, nbytes=256))          # a candidate of both: one program part
    got = groups_of(partition(g.graph()))
    assert r in got.get(small, []) and len(got[big]) >= 2
