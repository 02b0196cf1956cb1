"""The partitioner: which memory-bound nodes join the epilogue of which GEMM.

partition(pgraph, cost) is a pure function. Its integer linear program (scipy.optimize.milp, HiGHS):

variables   x[v, g] = 1 when node v joins the epilogue of GEMM g (v a candidate of g, below);
            load[t, g], w[u, g] in [0, 1]: the kernel loads t; the write of u stays on chip;
            stores: what the kernel writes (with the loads, its slots).
objective   maximise the HBM bytes kept on chip against running every node alone (cost.gain): each
            member's reads of its operands, less one load per operand the kernel reads from memory,
            plus Σ bytes(u)·w[u, g] for values no one outside reads; less cost.member_cost per node
            fused (prefer the smaller kernel on a tie).
constraints each node in at most one epilogue; one GEMM anchors each epilogue (GEMMs are never members);
            a member is connected to its epilogue (it reads the GEMM or a member, or a member reads it);
            an operand an epilogue cannot load (a bool tile, say) must be a member; a reduction ends an
            epilogue (no member reads a member reduction); a value that cannot be stored (bool) is read
            only inside its epilogue, or reads nothing from it (then what reads it outside recomputes
            it); at most MAX_SLOTS inputs + outputs and MAX_REDUCTIONS reductions per kernel; its tile
            and row-vector loads and its stores within the kernel's shared memory (Limits.smem: the
            "cuda" target's, rules.shared_memory); and the fused kernels form an acyclic graph across
            forward and backward.
solving     part by part: the variables no row joins (different layers' epilogues, mostly) are separate
            programs, each solved exactly (relative gap MIP_GAP = 0).

Acyclicity. A candidate v of g is dropped up front when a node that cannot join g lies on a path from
g to v (g's kernel would feed it and wait for it), or a reduction of g's values does (it ends the
epilogue, or waits for it). The remaining cycles (through candidates left out,
or between epilogues) are cut lazily: the program is solved, every cycle of the contracted graph
(epilogues as nodes) gets a cut — not all of the memberships that close it, unless a node outside
the epilogues on it joins one — and it is solved again, until the solution is acyclic.

Candidates of g: element-wise math and reductions in g's frame (rows x columns) that g's pass can run —
a forward GEMM never takes a node that depends on a tangent, a backward GEMM never one the forward
needs — reached from g through such math, plus the math producers of operands that cannot be loaded
(comparisons feeding where), math that only candidates read (computed from what the epilogue loads:
the outer product μ·s of a folded layer norm, a layer norm's output recomputed where a residual add
reads it) and, for a backward GEMM, the math that only the backward reads (an activation's derivative,
a layer norm's normalised input: computed where it is used rather than saved by the forward) and the
math that only the backward reads of that (a folded layer norm's output, stored there for the weight
gradient).

method="greedy" (or a program not solved within `time_limit` seconds) takes the GEMMs in order and adds
each candidate whose addition keeps every rule, acyclicity included.

exclude: GEMMs that take no epilogue (a measured veto, timing.py: their fused kernel was slower than the GEMM
and the fallback's kernel for the same work); their candidates go to other GEMMs or to the fallback.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable

import numpy as np

from .cost import CostModel
from .pgraph import PGraph
from .rules import MAX_REDUCTIONS, MAX_SLOTS, SharedMemory, shared_memory

METHODS = ("ilp", "greedy")
LOADED = ("tile", "row", "col", "scalar")
#: Solves of the lazy cycle-cut loop before the greedy fallback takes over.
MAX_SOLVES = 50
#: HiGHS's relative MIP gap: 0, an optimal solution (its default, 1e-4, of an objective of gigabytes
#: would leave out any epilogue keeping less than 0.01 % of the total on chip).
MIP_GAP = 0.0


@dataclasses.dataclass(frozen=True)
class Group:
    anchor: int
    members: tuple[int, ...]   # in topological order
    # members the fallback computes again instead of reading a store (outside())
    outside: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class Partition:
    groups: tuple[Group, ...]                   # epilogues with at least one member
    candidates: dict[int, tuple[int, ...]]      # every GEMM anchor -> its candidates
    method: str                                 # "ilp", "greedy" or "none" (no candidates)
    status: str
    solve_s: float
    objective: float

    def group_of(self) -> dict[int, int]:
        """member or anchor -> anchor."""
        out = {}
        for g in self.groups:
            out[g.anchor] = g.anchor
            out.update(dict.fromkeys(g.members, g.anchor))
        return out


@dataclasses.dataclass(frozen=True)
class Limits:
    slots: int = MAX_SLOTS
    reductions: int = MAX_REDUCTIONS
    smem: SharedMemory | None = None     # the epilogue buffers' shared-memory budget (None: none)

    @classmethod
    def of(cls, target: str) -> Limits:
        """The limits of `target`'s kernel: the GPU kernel's shared memory on "cuda"."""
        return cls(smem=shared_memory() if target == "cuda" else None)


# --- candidates ----------------------------------------------------------------------------------

def descendants(pg: PGraph) -> list[int]:
    """descendants(pg)[v]: the nodes reachable from v (v excluded), as a bit set."""
    cons = pg.consumers()
    desc = [0] * len(pg)
    for v in range(len(pg) - 1, -1, -1):
        bits = 0
        for c in cons[v]:
            bits |= (1 << c) | desc[c]
        desc[v] = bits
    return desc


def _reads_inside(pg: PGraph, v: int, inside: set[int]) -> bool:
    return any(u in inside for u in pg.sources(v))


def _read_outside(pg: PGraph, v: int, members: set[int], cons: list[list[int]]) -> bool:
    return pg[v].output or any(c not in members for c in cons[v])


def candidates(pg: PGraph) -> dict[int, tuple[int, ...]]:
    """Every GEMM anchor -> the nodes that may join its epilogue, in topological order."""
    cons = pg.consumers()
    desc = descendants(pg)
    out: dict[int, tuple[int, ...]] = {}
    for g in pg.anchors():

        def fits(v: int, a=pg[g]) -> bool:
            n = pg[v]
            phase = not n.forward if a.backward else not n.backward
            return n.op in ("math", "reduce") and n.frame == a.frame and phase

        cand: set[int] = set()

        def only_backward(v: int) -> bool:     # the backward reads it; it depends on no tangent
            return not pg[v].forward and not pg[v].backward

        def grow(todo: list[int], cand=cand, fits=fits, only=lambda v: True) -> None:
            while todo:                   # forward: math fed by the GEMM or by candidates
                u = todo.pop()
                for c in cons[u]:
                    if c not in cand and fits(c) and only(c):
                        cand.add(c)
                        if pg[c].op == "math":
                            todo.append(c)

        grow([g])
        added = True
        while added:                      # backward: producers of operands that cannot be loaded, math
            added = []                    # only candidates read, and for a backward GEMM what only the
            for v in sorted(cand):        # backward reads (and then what only the backward reads of it)
                for o in pg[v].operands:
                    u = o.src
                    if u is None or u == g or u in cand or not fits(u) or pg[u].op != "math":
                        continue
                    if o.role is None or (pg[g].backward and only_backward(u)) or all(c in cand for c in cons[u]):
                        cand.add(u)
                        added.append(u)
            if pg[g].backward:
                grow([u for u in added if only_backward(u)], only=only_backward)
        changed = True
        while changed:
            changed = False
            mask = sum(1 << v for v in cand)
            # a node that cannot join, between g and a candidate: that candidate can never join
            between = desc[g] & ~mask
            blocked = 0
            w = between
            while w:
                low = w & -w
                blocked |= desc[low.bit_length() - 1]
                w ^= low
            for r in cand:                # what follows a reduction of g's values: that reduction is a
                if pg[r].op == "reduce" and (desc[g] >> r) & 1:   # member (and ends the epilogue) or
                    blocked |= desc[r]    # outside (and waits for the kernel)
            for v in sorted(cand):
                n = pg[v]
                drop = (blocked >> v) & 1
                for o in n.operands:      # operands it cannot load must be able to join
                    if o.role is None and o.src is not None and o.src != g and \
                            (o.src not in cand or pg[o.src].op == "reduce"):
                        drop = True
                if not n.storable and g in pg.sources(v) and _read_outside(pg, v, cand, cons):
                    drop = True
                if drop:
                    cand.discard(v)
                    changed = True
            reached, todo = {g}, [g]      # connected to g through candidates (a producer whose readers
            while todo:                   # were dropped is not)
                u = todo.pop()
                for w in cons[u] + pg.sources(u):
                    if w in cand and w not in reached:
                        reached.add(w)
                        todo.append(w)
            if cand - reached:
                cand &= reached
                changed = True
        out[g] = tuple(sorted(cand))
    return out


# --- what a group keeps on chip, what it needs ---------------------------------------------------------

def gain(pg: PGraph, cost: CostModel, anchor: int, members: Iterable[int],
         cons: list[list[int]] | None = None) -> float:
    """The objective of one epilogue: the HBM bytes kept on chip against every node run alone (each
    member's reads of its operands, less the kernel's loads; the writes no one outside reads), less the
    member cost."""
    cons = cons or pg.consumers()
    members = set(members)
    inside = members | {anchor}
    total = 0.0
    for v in members:
        for u in pg.sources(v):
            total += cost.gain(pg[u].nbytes)
    for t, _ in io(pg, anchor, members, cons)[0]:
        total -= cost.gain(pg[t].nbytes)
    for u in inside:
        n = pg[u]
        if n.op != "reduce" and not n.output and cons[u] and all(c in members for c in cons[u]):
            total += cost.gain(n.nbytes)
    return total - cost.member_cost * len(members)


def io(pg: PGraph, anchor: int, members: Iterable[int], cons: list[list[int]] | None = None,
       outside: Iterable[int] = ()) -> tuple[list[tuple[int, str]], list[int], list[int]]:
    """(loads as (node, role), stored values, reductions) of one epilogue. A value that cannot be stored
    but is read outside is recomputed there, not stored; so are the members `outside` (Group.outside), and what
    they read of the kernel's values is stored."""
    cons = cons or pg.consumers()
    members = set(members)
    inside = members | {anchor}
    again = set(outside)
    loads = list(dict.fromkeys((o.src, o.role) for v in sorted(members) for o in pg[v].operands
                               if o.src is not None and o.src not in inside and o.role in LOADED))
    stores = [u for u in sorted(inside) if pg[u].op != "reduce" and pg[u].storable and u not in again
              and (_read_outside(pg, u, members, cons) or any(c in again for c in cons[u]))]
    reductions = [v for v in sorted(members) if pg[v].op == "reduce"]
    return loads, stores, reductions


def recomputed(pg: PGraph, anchor: int, members: Iterable[int], cons: list[list[int]] | None = None,
               outside: Iterable[int] = ()) -> list[int]:
    """Members that run in the epilogue and outside it: those that cannot be stored but are read outside, and
    the members `outside` (Group.outside)."""
    cons = cons or pg.consumers()
    members = set(members)
    again = set(outside)
    return [v for v in sorted(members) if v in again or (not pg[v].storable and _read_outside(pg, v, members, cons))]


def _settled(pg: PGraph, anchor: int, members: Iterable[int], fused: set[int], cons: list[list[int]],
             narrow_stores: bool = True) -> Group:
    """The epilogue with its members the fallback computes again (outside()); those no member left in the kernel
    reads leave it, so no load is left unused. Where that would leave the kernel no member, or members no longer
    connected to its GEMM (the values outside() takes from the accumulator were all that joined them), only what
    the fallback computes from the loads alone goes outside (the rest stays connected), else nothing; only that
    without narrow_stores."""
    for accumulator in (True, False) if narrow_stores else (False,):
        keep = set(members)
        again = set(outside(pg, anchor, keep, fused, cons, accumulator=accumulator))
        while True:
            unread = {v for v in again & keep if not any(c in keep for c in cons[v])}
            if not unread:
                break
            keep -= unread
        if keep and _connected(pg, anchor, keep, cons):
            return Group(anchor, tuple(sorted(keep)), tuple(sorted(again & keep)))
    return Group(anchor, tuple(sorted(members)))


def _connected(pg: PGraph, anchor: int, keep: set[int], cons: list[list[int]]) -> bool:
    """Whether every member in keep is joined to the anchor through edges among them (either way)."""
    inside = keep | {anchor}
    seen, todo = {anchor}, [anchor]
    while todo:
        u = todo.pop()
        for v in [*pg.sources(u), *cons[u]]:
            if v in inside and v not in seen:
                seen.add(v)
                todo.append(v)
    return seen == inside


#: Element-wise ops the fallback computes again from a value the kernel stores rounded to its 16-bit dtype while its
#: own members read it unrounded (the accumulator, a 16-bit member): sums, differences, products and casts move
#: such a value by its rounding and no more, as eager PyTorch, which rounds it there, computes them. Transcendental
#: ops are not among them (GELU's derivative evaluated at a rounded x in one kernel and an unrounded x in the other
#: lost a GPT-2's gradients the numerics rule: passes/remat.py).
AGAIN_FROM_ROUNDED = frozenset({"aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor", "aten.neg.default",
                                "prims.convert_element_type.default", "aten._to_copy.default", "aten.add.Scalar",
                                "aten.sub.Scalar",
                                "aten.mul.Scalar", "aten.div.Scalar"})


def outside(pg: PGraph, anchor: int, members: Iterable[int], fused: set[int],
            cons: list[list[int]] | None = None, accumulator: bool = True) -> tuple[int, ...]:
    """Members the fallback is better off computing again than reading from a store: element-wise values read
    outside only by element-wise math that no epilogue runs (`fused`: every epilogue's nodes), which the fallback
    computes from values it reads anyway for fewer bytes than the kernel's store of them and the fallback's read
    would move, with the members they are computed from. A member's sources are read from memory (the epilogue's
    loads, the GEMM's output or a member the kernel stores: written once and read) or computed again in turn,
    whichever moves fewer bytes; a source the kernel would not store otherwise becomes a store in place of the
    value (io(): a member computed again reads it). Two cases of the layer-norm backward: the fp32 x̂ = (x - mean)
    · rstd from the bf16 x it loads (the kernel writes no 4 bytes an element and the fallback reads 2 instead of
    4), and the fp32 g = γ · dy from the 16-bit sum dy of the GEMM's output and the gradients it loads (stored in
    16 bits: 4 bytes an element written and read instead of 8; AGAIN_FROM_ROUNDED: the ops that may read a value
    the kernel holds unrounded). A value another epilogue, a GEMM or the graph's outputs read stays stored; the
    kernel stores no more values than before, none wider than the one it no longer stores. accumulator=False: from
    the epilogue's loads alone (no value of the kernel read from a store)."""
    cons = cons or pg.consumers()
    members = set(members)
    inside = members | {anchor}
    big = float("inf")

    def fallback_math(c: int) -> bool:
        return c in members or (pg[c].op == "math" and c not in fused)

    def movable(u: int) -> bool:
        n = pg[u]
        return u in members and n.op == "math" and not n.output and all(fallback_math(r) for r in cons[u])

    def stored_anyway(u: int) -> bool:
        return _read_outside(pg, u, members, cons)

    memo: dict[int, tuple[float, frozenset[int], frozenset[int], bool]] = {}

    def best(u: int) -> tuple[float, frozenset[int], frozenset[int], bool]:
        """(bytes the fallback moves to have u, members computed again, members newly stored, whether it reads a
        value the kernel holds unrounded) of the cheaper way."""
        if u not in inside:
            return float(pg[u].nbytes), frozenset(), frozenset(), False
        if u not in memo:
            n = pg[u]
            if not n.storable or n.op == "reduce" or not accumulator:
                store = (big, frozenset(), frozenset(), False)
            elif stored_anyway(u):
                store = (float(n.nbytes), frozenset(), frozenset(), True)
            else:
                store = (2.0 * n.nbytes, frozenset(), frozenset({u}), True)
            memo[u] = store
            again = recompute(u)
            if again[0] < store[0]:
                memo[u] = again
        return memo[u]

    def recompute(u: int) -> tuple[float, frozenset[int], frozenset[int], bool]:
        if not movable(u):
            return big, frozenset(), frozenset(), False
        total, again, new, rounded = 0.0, {u}, set(), False
        for s in pg.sources(u):
            c, a, w, r = best(s)
            total, rounded = total + c, rounded or r
            again |= a
            new |= w
        if rounded and pg[u].target not in AGAIN_FROM_ROUNDED:
            return big, frozenset(), frozenset(), False
        return total, frozenset(again), frozenset(new), rounded

    out: set[int] = set()
    for v in sorted(members):
        n = pg[v]
        if not (movable(v) and n.storable and stored_anyway(v)):
            continue
        cost, again, new, _ = recompute(v)
        if len(new) > 1 or any(pg[w].nbytes > n.nbytes for w in new):
            continue
        if cost < 2.0 * n.nbytes:
            out |= again
    return tuple(sorted(out))


def slots(pg: PGraph, anchor: int, members: Iterable[int], cons: list[list[int]] | None = None) -> int:
    loads, stores, reductions = io(pg, anchor, members, cons)
    return len(loads) + len(stores) + len(reductions)


def itemsize(pg: PGraph, u: int, anchor: int) -> int:
    """Bytes per element of node u, a value of the anchor's frame."""
    M, N = pg[anchor].frame
    return max(1, pg[u].nbytes // max(1, M * N))


def smem(pg: PGraph, anchor: int, members: Iterable[int], budget: SharedMemory,
         cons: list[list[int]] | None = None) -> int:
    """Shared memory of the epilogue's buffers: its tile and row-vector loads and its stores (the GEMM's own
    output is the main output D, whose staging the budget leaves out)."""
    loads, stores, _ = io(pg, anchor, members, cons)
    total = sum(budget.cost(role, itemsize(pg, t, anchor)) for t, role in loads)
    return total + sum(budget.cost("store", itemsize(pg, u, anchor)) for u in stores if u != anchor)


def _units(pg: PGraph, groups: dict[int, Iterable[int]]) -> list[int]:
    unit = list(range(len(pg)))
    for g, members in groups.items():
        for m in members:
            unit[m] = g
    return unit


def cycles(pg: PGraph, groups: dict[int, Iterable[int]]) -> list[list[tuple[int, int, int]]]:
    """One cycle per strongly connected part of the graph with every epilogue contracted to one node (its
    kernel), each as [(unit, entered at, left from), ...]: empty when the kernels are acyclic."""
    unit = _units(pg, groups)
    succ: dict[int, dict[int, tuple[int, int]]] = {}
    for v in range(len(pg)):
        for u in pg.sources(v):
            a, b = unit[u], unit[v]
            if a != b:
                succ.setdefault(a, {}).setdefault(b, (u, v))
    out = []
    for comp in _sccs(sorted(set(unit)), succ):
        if len(comp) < 2:
            continue
        start = next((u for u in comp if u in groups), comp[0])
        inside = set(comp)
        parent: dict[int, int] = {}
        queue, found = [start], None
        while queue and found is None:
            nxt = []
            for a in queue:
                for b in succ.get(a, {}):
                    if b == start:
                        found = a
                        break
                    if b in inside and b not in parent:
                        parent[b] = a
                        nxt.append(b)
                if found is not None:
                    break
            queue = nxt
        path = [found]
        while path[-1] != start:
            path.append(parent[path[-1]])
        path.reverse()                                 # start -> ... -> found (-> start)
        k = len(path)
        out.append([(path[i], succ[path[i - 1]][path[i]][1], succ[path[i]][path[(i + 1) % k]][0])
                    for i in range(k)])
    return out


def _sccs(nodes: list[int], succ: dict[int, dict[int, tuple[int, int]]]) -> list[list[int]]:
    """Strongly connected components (Tarjan's, iterative)."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    stack: list[int] = []
    on: set[int] = set()
    comps: list[list[int]] = []
    counter = 0
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(succ.get(root, {})))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(succ.get(w, {}))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    comps.append(comp)
    return comps


def is_acyclic(pg: PGraph, groups: dict[int, Iterable[int]]) -> bool:
    """Whether the graph with every epilogue contracted to one node (its kernel) has no cycle."""
    return not cycles(pg, groups)


def violations(pg: PGraph, groups: dict[int, Iterable[int]], limits: Limits = Limits()) -> list[str]:
    """Every rule a set of epilogues breaks (empty: a valid partition)."""
    cons = pg.consumers()
    cands = candidates(pg)
    out: list[str] = []
    owner: dict[int, int] = {}
    for g, members in groups.items():
        members = set(members)
        inside = members | {g}
        if pg[g].op != "gemm":
            out.append(f"{pg[g].name} anchors an epilogue but is not a GEMM the kernel takes")
            continue
        for v in sorted(members):
            n = pg[v]
            if v in owner:
                out.append(f"{n.name} is in the epilogues of {pg[owner[v]].name} and {pg[g].name}")
            owner[v] = g
            if v not in cands.get(g, ()):
                out.append(f"{n.name} cannot join the epilogue of {pg[g].name} (op, frame, pass or a path "
                           "through a node that cannot join)")
            srcs = [u for u in pg.sources(v) if u in inside]
            if any(pg[u].op == "reduce" for u in srcs):
                out.append(f"{n.name} reads a reduction of its own epilogue")
            if not any(pg[u].op != "reduce" for u in srcs) and not any(c in members for c in cons[v]):
                out.append(f"{n.name} is not connected to the epilogue of {pg[g].name}")
            out += [f"{n.name} reads {pg[o.src].name}, which an epilogue cannot load, from outside"
                    for o in n.operands if o.role is None and o.src is not None and o.src not in inside]
            if not n.storable and _read_outside(pg, v, members, cons) and srcs:
                out.append(f"{n.name} cannot be stored, is read outside and reads its epilogue")
        if slots(pg, g, members, cons) > limits.slots:
            out.append(f"the epilogue of {pg[g].name} needs {slots(pg, g, members, cons)} slots (> {limits.slots})")
        if limits.smem and smem(pg, g, members, limits.smem, cons) > limits.smem.budget:
            out.append(f"the epilogue of {pg[g].name} needs {smem(pg, g, members, limits.smem, cons)} bytes of "
                       f"shared memory (> {limits.smem.budget})")
        nred = sum(pg[v].op == "reduce" for v in members)
        if nred > limits.reductions:
            out.append(f"the epilogue of {pg[g].name} has {nred} reductions (> {limits.reductions})")
    if not is_acyclic(pg, groups):
        out.append("the fused kernels form a cycle")
    return out


# --- the ILP ---------------------------------------------------------------------------------------

class _Model:
    def __init__(self) -> None:
        self.lb: list[float] = []
        self.ub: list[float] = []
        self.integer: list[int] = []
        self.c: list[float] = []
        self.rows: list[tuple[dict[int, float], float, float]] = []

    def var(self, lo: float, hi: float, integer: bool = False, cost: float = 0.0) -> int:
        self.lb.append(lo)
        self.ub.append(hi)
        self.integer.append(int(integer))
        self.c.append(cost)
        return len(self.c) - 1

    def row(self, coefs: dict[int, float], lo: float, hi: float) -> None:
        self.rows.append((coefs, lo, hi))

    def components(self) -> list[tuple[list[int], list[int]]]:
        """(variables, rows) of each independent part of the program (no row joins two parts): the
        epilogues of different layers, forward and backward, mostly are."""
        parent = list(range(len(self.c)))

        def root(j: int) -> int:
            while parent[j] != j:
                parent[j] = parent[parent[j]]
                j = parent[j]
            return j

        for coefs, _, _ in self.rows:
            js = list(coefs)
            for j in js[1:]:
                a, b = root(js[0]), root(j)
                if a != b:
                    parent[b] = a
        parts: dict[int, tuple[list[int], list[int]]] = {}
        for j in range(len(self.c)):
            parts.setdefault(root(j), ([], []))[0].append(j)
        for i, (coefs, _, _) in enumerate(self.rows):
            if coefs:
                parts[root(next(iter(coefs)))][1].append(i)
        return list(parts.values())

    def solve_part(self, cols: list[int], rows: list[int], time_limit: float):
        """milp on the variables `cols` and the rows `rows` (which read no other variable)."""
        from scipy.optimize import Bounds, LinearConstraint, milp
        from scipy.sparse import coo_matrix

        index = {j: k for k, j in enumerate(cols)}
        r, c, v = [], [], []
        for k, i in enumerate(rows):
            for j, a in self.rows[i][0].items():
                r.append(k)
                c.append(index[j])
                v.append(a)
        A = coo_matrix((v, (r, c)), shape=(len(rows), len(cols))).tocsr()
        cons = [LinearConstraint(A, [self.rows[i][1] for i in rows], [self.rows[i][2] for i in rows])] if rows else []
        return milp(np.array([self.c[j] for j in cols]), integrality=np.array([self.integer[j] for j in cols]),
                    bounds=Bounds([self.lb[j] for j in cols], [self.ub[j] for j in cols]), constraints=cons,
                    options={"time_limit": max(time_limit, 0.01), "disp": False, "mip_rel_gap": MIP_GAP})

    def solve(self, time_limit: float, known: dict[frozenset[int], np.ndarray] | None = None
              ) -> tuple[np.ndarray | None, str]:
        """(the values of every variable, "") of an optimal solution, each independent part solved alone
        (exactly: HiGHS's relative gap is 0); (None, why) if a part has none in time. `known`: solutions of
        parts already solved (by their variables), reused and updated."""
        known = {} if known is None else known
        deadline = time.perf_counter() + time_limit
        out = np.zeros(len(self.c))
        for cols, rows in self.components():
            key = frozenset(cols)
            if key not in known:
                if not rows:                                  # free variables: each at its better bound
                    known[key] = np.array([self.ub[j] if self.c[j] < 0 else self.lb[j] for j in cols])
                else:
                    res = self.solve_part(cols, rows, deadline - time.perf_counter())
                    if res.x is None or res.status != 0:
                        return None, f"HiGHS: {res.message}"
                    known[key] = res.x
            out[cols] = known[key]
        return out, ""


def _program(pg: PGraph, cost: CostModel, cands: dict[int, tuple[int, ...]], limits: Limits
             ) -> tuple[_Model, dict[tuple[int, int], int]]:
    cons = pg.consumers()
    m = _Model()
    x: dict[tuple[int, int], int] = {}
    for g, cs in cands.items():
        for v in cs:
            x[v, g] = m.var(0, 1, integer=True, cost=cost.member_cost)
    by_node: dict[int, list[int]] = {}
    for (v, _), i in x.items():
        by_node.setdefault(v, []).append(i)
    for idx in by_node.values():                                   # at most one epilogue each
        if len(idx) > 1:
            m.row(dict.fromkeys(idx, 1.0), -np.inf, 1)

    for g, cs in cands.items():
        inside = set(cs) | {g}
        slot_row: dict[int, float] = {}
        smem_row: dict[int, float] = {}
        for v in cs:
            n = pg[v]
            feeders = [u for u in pg.sources(v) if u in inside and pg[u].op != "reduce"]
            readers = [c for c in cons[v] if c in cs]
            if g not in feeders:                                   # connected to the epilogue
                row = {x[v, g]: 1.0}
                for u in feeders + readers:
                    row[x[u, g]] = row.get(x[u, g], 0.0) - 1.0
                m.row(row, -np.inf, 0)
            for o in n.operands:                                   # unloadable operands are members
                if o.role is None and o.src is not None and o.src != g:
                    m.row({x[v, g]: 1.0, x[o.src, g]: -1.0}, -np.inf, 0)
            if n.op == "reduce":                                   # a reduction ends the epilogue
                for c in readers:
                    m.row({x[v, g]: 1.0, x[c, g]: 1.0}, -np.inf, 1)
            if not n.storable:                                     # read outside: reads nothing inside
                srcs = [u for u in pg.sources(v) if u in cs]
                if _read_outside(pg, v, set(cs), cons):
                    for u in srcs:
                        m.row({x[v, g]: 1.0, x[u, g]: 1.0}, -np.inf, 1)
                for c in readers:
                    for u in srcs:
                        m.row({x[v, g]: 1.0, x[c, g]: -1.0, x[u, g]: 1.0}, -np.inf, 1)
            for u in pg.sources(v):                                # its reads (loads cost below)
                m.c[x[v, g]] -= cost.gain(pg[u].nbytes)
        for u in sorted(inside):                                   # writes kept on chip; stores
            n = pg[u]
            if n.op == "reduce":
                slot_row[x[u, g]] = slot_row.get(x[u, g], 0.0) + 1.0
                continue
            outside = _read_outside(pg, u, set(cs), cons)
            if not outside and cons[u]:
                w = m.var(0, 1, cost=-cost.gain(n.nbytes))
                for c in cons[u]:
                    m.row({w: 1.0, x[c, g]: -1.0}, -np.inf, 0)
                if u != g:
                    m.row({w: 1.0, x[u, g]: -1.0}, -np.inf, 0)
            if not n.storable:
                continue
            need = m.var(0, 1)                                     # u is stored
            base, lo = ({need: 1.0}, 1.0) if u == g else ({need: 1.0, x[u, g]: -1.0}, 0.0)
            if outside:
                m.row(dict(base), lo, np.inf)
            for c in cons[u]:
                if c in cs:
                    m.row({**base, x[c, g]: 1.0}, lo, np.inf)
            slot_row[need] = 1.0
            if limits.smem and u != g:
                smem_row[need] = limits.smem.cost("store", itemsize(pg, u, g))
        loads: dict[tuple[int, str], int] = {}
        for v in cs:                                               # loads
            for o in pg[v].operands:
                if o.src is None or o.src == g or o.role not in LOADED:
                    continue
                key = (o.src, o.role)
                if key not in loads:
                    loads[key] = m.var(0, 1, cost=cost.gain(pg[o.src].nbytes))
                    slot_row[loads[key]] = 1.0
                    if limits.smem and limits.smem.cost(o.role, itemsize(pg, o.src, g)):
                        smem_row[loads[key]] = limits.smem.cost(o.role, itemsize(pg, o.src, g))
                row = {loads[key]: 1.0, x[v, g]: -1.0}
                if o.src in cs:
                    row[x[o.src, g]] = 1.0
                m.row(row, 0, np.inf)
        m.row(slot_row, -np.inf, limits.slots)
        if smem_row:
            m.row(smem_row, -np.inf, limits.smem.budget)
        reds = [x[v, g] for v in cs if pg[v].op == "reduce"]
        if len(reds) > limits.reductions:
            m.row(dict.fromkeys(reds, 1.0), -np.inf, limits.reductions)
    return m, x


def _cut(cycle: list[tuple[int, int, int]], groups: dict[int, list[int]], cands: dict[int, tuple[int, ...]],
         x: dict[tuple[int, int], int]) -> tuple[dict[int, float], float]:
    """A row that forbids this cycle's memberships unless a node outside the epilogues on it joins one."""
    row: dict[int, float] = {}
    closing = 0
    for unit, entry, exit_ in cycle:
        if unit in groups:
            for v in dict.fromkeys((entry, exit_)):
                if v != unit:
                    row[x[v, unit]] = 1.0
                    closing += 1
        else:
            for g, cs in cands.items():
                if unit in cs:
                    row[x[unit, g]] = row.get(x[unit, g], 0.0) - 1.0
    return row, closing - 1


def _ilp(pg: PGraph, cost: CostModel, cands: dict[int, tuple[int, ...]], limits: Limits, time_limit: float
         ) -> tuple[dict[int, list[int]] | None, str]:
    m, x = _program(pg, cost, cands, limits)
    deadline = time.perf_counter() + time_limit
    ncuts = 0
    known: dict[frozenset[int], np.ndarray] = {}       # parts solved (a cut re-solves only the parts it joins)
    for solve in range(1, MAX_SOLVES + 1):
        values, why = m.solve(deadline - time.perf_counter(), known)
        if values is None:
            return None, f"{why} (solve {solve}, {ncuts} cycle cuts)"
        groups = {g: [v for v in cs if values[x[v, g]] > 0.5] for g, cs in cands.items()}
        groups = {g: vs for g, vs in groups.items() if vs}
        found = cycles(pg, groups)
        if not found:
            return groups, f"optimal after {solve} solve(s), {ncuts} cycle cut(s)"
        for cyc in found:
            row, most = _cut(cyc, groups, cands, x)
            m.row(row, -np.inf, most)
            ncuts += 1
            for key in [k for k in known if not k.isdisjoint(row)]:
                del known[key]
        if time.perf_counter() >= deadline:
            break
    return None, f"no acyclic solution after {solve} solves and {ncuts} cycle cuts"


# --- the greedy fallback ------------------------------------------------------------------------------

def _prune(pg: PGraph, g: int, members: list[int], cons: list[list[int]]) -> list[int]:
    """Drops members that break a rule once the epilogue is complete (unconnected; unstorable, read outside
    and reading the epilogue), with every member that reads them."""
    keep = list(members)
    while True:
        s = set(keep)
        inside = s | {g}
        bad = None
        for v in keep:
            n = pg[v]
            fed = any(u in inside and pg[u].op != "reduce" for u in pg.sources(v))
            read = any(c in s for c in cons[v])
            recomputed_but_reads_inside = not n.storable and _read_outside(pg, v, s, cons) \
                and _reads_inside(pg, v, inside)
            if not (fed or read) or recomputed_but_reads_inside \
                    or any(o.role is None and o.src is not None and o.src not in inside for o in n.operands):
                bad = v
                break
        if bad is None:
            return keep
        drop = {bad}
        for v in keep:
            if any(u in drop for u in pg.sources(v)):
                drop.add(v)
        keep = [v for v in keep if v not in drop]


def _closes_cycle(cons: list[list[int]], unit: list[int], nodes_of: dict[int, list[int]], merged: list[int]) -> bool:
    """Whether the kernels form a cycle once the nodes `merged` are one kernel: a path leaves it and comes
    back (through other kernels as wholes). A kernel whose first node comes after merged's last cannot
    lead back: the search stops there."""
    inside = set(merged)
    last = max(merged)
    seen: set[int] = set()
    stack = [c for n in merged for c in cons[n] if c not in inside]
    while stack:
        c = stack.pop()
        if c in inside:
            return True
        u = unit[c]
        if u in seen:
            continue
        seen.add(u)
        nodes = nodes_of.get(u, [c])
        if min(nodes) > last:
            continue
        stack.extend(d for n in nodes for d in cons[n] if d in inside or unit[d] not in seen)
    return False


def _greedy(pg: PGraph, cands: dict[int, tuple[int, ...]], limits: Limits) -> dict[int, list[int]]:
    cons = pg.consumers()
    groups: dict[int, list[int]] = {}
    taken: set[int] = set()
    unit = list(range(len(pg)))
    nodes_of: dict[int, list[int]] = {}
    for g in sorted(cands):
        members: list[int] = []
        nodes_of[g] = [g]
        for v in cands[g]:
            if v in taken:
                continue
            inside = set(members) | {g}
            n = pg[v]
            if any(u in inside and pg[u].op == "reduce" for u in pg.sources(v)):
                continue
            if any(o.role is None and o.src is not None and o.src not in inside for o in n.operands):
                continue
            trial = members + [v]
            if slots(pg, g, trial, cons) > limits.slots or \
                    sum(pg[u].op == "reduce" for u in trial) > limits.reductions or \
                    (limits.smem and smem(pg, g, trial, limits.smem, cons) > limits.smem.budget):
                continue
            if not _closes_cycle(cons, unit, nodes_of, nodes_of[g] + [v]):
                members = trial
                unit[v] = g
                nodes_of[g] = nodes_of[g] + [v]
        kept = _prune(pg, g, members, cons)
        for v in set(members) - set(kept):
            unit[v] = v
        members = kept
        nodes_of[g] = [g] + members
        if members:
            groups[g] = members
            taken.update(members)
    return groups


def partition(pg: PGraph, cost: CostModel | None = None, *, method: str = "ilp", time_limit: float = 10.0,
              limits: Limits = Limits(), exclude: Iterable[int] = (), narrow_stores: bool = True) -> Partition:
    """The epilogues of `pg` (see the module docstring); the GEMMs in `exclude` take none. narrow_stores: the
    fallback may compute a value again from a narrower one the kernel stores in its place (outside()); False: only
    from the epilogue's loads."""
    if method not in METHODS:
        raise ValueError(f"partition method must be one of {METHODS}, got {method!r}")
    cost = cost or CostModel()
    start = time.perf_counter()
    cands = candidates(pg)
    for g in exclude:
        if g in cands:
            cands[g] = ()
    if not any(cands.values()):
        return Partition((), cands, "none", "no GEMM has an epilogue candidate", time.perf_counter() - start, 0.0)
    groups, status, used = None, "", method
    if method == "ilp":
        try:
            groups, status = _ilp(pg, cost, {g: cs for g, cs in cands.items() if cs}, limits, time_limit)
        except ImportError as e:
            status = f"scipy is not installed ({e}); pip install 'coda_ext[fusion]'"
        if groups is not None and violations(pg, groups, limits):
            status, groups = f"ILP solution rejected: {violations(pg, groups, limits)[0]}", None
        if groups is None:
            used = "greedy"
    if groups is None:
        groups = _greedy(pg, cands, limits)
        status = f"{status}; greedy" if status else "greedy"
    cons = pg.consumers()
    fused = {v for g, vs in groups.items() for v in (g, *vs)}
    out = tuple(_settled(pg, g, vs, fused, cons, narrow_stores) for g, vs in sorted(groups.items()))
    objective = sum(gain(pg, cost, grp.anchor, grp.members, cons) for grp in out)
    return Partition(out, cands, used, status, time.perf_counter() - start, objective)
