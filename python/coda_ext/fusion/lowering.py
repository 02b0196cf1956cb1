"""Lowering: each epilogue of the partition becomes a coda_ext graph, built with the public builder
(coda_ext.graph.Graph and coda_ext.graph.math), and one coda_ext::fusion_kernel call in the FX graph
in place of its GEMM and members; GEMMs left without an epilogue go back to aten.mm (with their
transposes) for the fallback compiler.

Inside an epilogue the graph's names are given by position (inputs x0, x1, ... in order of first use,
outputs y0, y1, ... in node order), so the same subgraph in every layer is the same canonical graph:
one kernel (Site.kernel_key) serves them all. The first stored value in the GEMM's dtype is the main
output D; other values are stores in their FX dtype; reductions are row or column reductions.
"""
from __future__ import annotations

import dataclasses
import heapq
import operator
from typing import Any

import torch
from torch import fx

from ..errors import CodaError
from ..graph import Graph
from ..graph import math as cm
from ..graph.builder import Value
from . import aten_ir, fx_util, rules
from .analyze import Analysis
from .op import Output, Site
from .partition import Group, Partition, io, recomputed
from .passes import GEMM
from .passes.norm_fold import META as NORM_FOLDS

aten = torch.ops.aten
KERNEL = torch.ops.coda_ext.fusion_kernel.default


@dataclasses.dataclass(frozen=True)
class Lowered:
    """One epilogue as lowered: its site (None if the graph builder refused it, with the error)."""

    group: Group
    site: Site | None
    loads: tuple[fx.Node, ...] = ()
    outputs: tuple[fx.Node, ...] = ()     # the FX nodes the kernel's results replace, in order
    error: str | None = None
    mnk: tuple[int, int, int] | None = None   # the GEMM's (M, N, K) as launched


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def build_site(an: Analysis, group: Group, execute: str = "auto", cons: list[list[int]] | None = None,
               target: str = "interpret") -> Lowered:
    """The coda_ext graph and call site of one epilogue; on the "cuda" target, only if the kernel
    config="auto" launches at its GEMM shape can be built (rules.kernel_problem)."""
    pg = an.pgraph
    cons = cons or pg.consumers()
    anchor = an.fx_nodes[group.anchor]
    a, _, major = anchor.args
    dtype = _dtype_name(fx_util.dtype(a))
    inside = set(group.members) | {group.anchor}
    _, stored, _ = io(pg, group.anchor, group.members, cons, group.outside)
    # what the fallback's copies of Group.outside read as stored, in 16 bits: the kernel's own members read it
    # rounded the same way, so both sides compute from one value (as eager PyTorch, which rounds it there)
    again = set(group.outside)
    frontier = {u for u in stored if any(c in again for c in cons[u])}

    def rounded(pid: int, value: Any) -> Any:
        t = fx_util.dtype(an.fx_nodes[pid])
        return cm.cast(value, t) if pid in frontier and t in (torch.bfloat16, torch.float16) else value

    g = Graph()
    env: dict[int, Any] = {group.anchor: rounded(group.anchor, g.accumulator())}
    leaves: dict[tuple[fx.Node, str], Value] = {}
    roles: list[tuple[str, str]] = []
    loads: list[fx.Node] = []

    def leaf(load: fx.Node, role: str) -> Value:
        if (load, role) not in leaves:
            name = f"x{len(leaves)}"
            t = fx_util.dtype(load)
            if role == "tile":
                value = g.tile(name, dtype=t)
            elif role == "scalar":
                value = g.scalar(name, pointer=True)
            else:
                vector = g.row_vector if role == "row" else g.col_vector
                value = vector(name, dtype=torch.float32 if t == torch.bool else t)
            leaves[load, role] = value
            roles.append((name, role))
            loads.append(load)
        return leaves[load, role]

    def arg_of(pid: int):
        table = an.args[pid]

        def arg(x: Any) -> Any:
            if not isinstance(x, fx.Node):
                return float(x) if isinstance(x, bool) else x
            o, load = table[x]
            if o.role == "const":
                return aten_ir.constant_value(x)
            if o.role == "col_index":
                return g.col_index()
            if o.src in inside:
                return env[o.src]
            return leaf(load, o.role)

        return arg

    names: list[str] = []
    outputs: list[Output] = []
    out_nodes: list[fx.Node] = []
    main_taken = False
    try:
        for pid in group.members:
            node, n = an.fx_nodes[pid], pg[pid]
            arg = arg_of(pid)
            if n.op == "math":
                value = aten_ir.MATH[node.target].emit(node, arg)
                env[pid] = rounded(pid, value) if isinstance(value, Value) else g.scalar(value=float(value))
            else:
                name = f"y{len(names)}"
                reduce = g.row_reduce if n.axis == "row" else g.col_reduce
                reduce(name, arg(node.args[0]), n.reduce_op)
                names.append(name)
                outputs.append(Output(name, fx_util.shape(node), fx_util.dtype(node)))
                out_nodes.append(node)
        for pid in sorted(stored):
            node = an.fx_nodes[pid]
            name = f"y{len(names)}"
            t = fx_util.dtype(node)
            if not main_taken and _dtype_name(t) == dtype:
                g.output(env[pid], name)
                main_taken = True
            else:
                g.store(name, env[pid], dtype=t)
            names.append(name)
            outputs.append(Output(name, fx_util.shape(node), t))
            out_nodes.append(node)
        graph = g.build()
    except CodaError as e:
        return Lowered(group, None, error=f"{type(e).__name__}: {e}", mnk=an.gemm_mnk(group.anchor))
    mnk = an.gemm_mnk(group.anchor)
    problem = rules.kernel_problem(graph, dtype, major, mnk) if target == "cuda" else None
    if problem:
        return Lowered(group, None, error=problem, mnk=mnk)
    site = Site(graph, dtype, major, tuple(roles), tuple(outputs), execute)
    return Lowered(group, site, tuple(loads), tuple(out_nodes), mnk=mnk)


def lower(gm: fx.GraphModule, an: Analysis, part: Partition, execute: str = "auto", target: str = "interpret"
          ) -> tuple[fx.GraphModule, tuple[Lowered, ...]]:
    """A new module with every epilogue a fusion_kernel call and the other GEMMs aten.mm again."""
    cons = an.pgraph.consumers()
    lowered = tuple(build_site(an, grp, execute, cons, target) for grp in part.groups)
    unit_of: dict[fx.Node, int] = {}            # member FX node -> index of its lowered epilogue
    for k, low in enumerate(lowered):
        if low.site is not None:
            again = set(recomputed(an.pgraph, low.group.anchor, low.group.members, cons, low.group.outside))
            for pid in (low.group.anchor,) + low.group.members:
                if pid not in again:            # a value read outside but not stored stays there too
                    unit_of[an.fx_nodes[pid]] = k

    order = {n: i for i, n in enumerate(gm.graph.nodes)}

    def unit(x: fx.Node) -> Any:
        return ("k", unit_of[x]) if x in unit_of else x

    def deps(u: Any) -> list[Any]:
        if isinstance(u, tuple):
            low = lowered[u[1]]
            a, w, _ = an.fx_nodes[low.group.anchor].args
            nodes = [a, w, *low.loads]
        else:
            nodes = u.all_input_nodes
        return list(dict.fromkeys(unit(x) for x in nodes))

    def position(u: Any) -> int:
        return order[an.fx_nodes[lowered[u[1]].group.anchor]] if isinstance(u, tuple) else order[u]

    output = next(n for n in gm.graph.nodes if n.op == "output")
    needed: set[Any] = {n for n in gm.graph.nodes if n.op == "placeholder"}
    todo = [output]
    while todo:                                  # what the outputs still need once epilogues are fused
        u = todo.pop()
        for d in deps(u):
            if d not in needed:
                needed.add(d)
                todo.append(d)
    needed.add(output)
    waiting = {u: len(deps(u)) for u in needed}
    users: dict[Any, list[Any]] = {}
    for u in needed:
        for d in deps(u):
            users.setdefault(d, []).append(u)
    ready = [(position(u), k, u) for k, u in enumerate(needed) if waiting[u] == 0]
    heapq.heapify(ready)
    tiebreak = len(needed)

    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    emitted = 0
    while ready:
        _, _, u = heapq.heappop(ready)
        emitted += 1
        if isinstance(u, tuple):
            _emit_kernel(graph, env, an, lowered[u[1]])
        elif u.op == "call_function" and u.target is GEMM:
            env[u] = _emit_mm(graph, env, u)
        else:
            env[u] = graph.node_copy(u, lambda x: env[x])
        for v in users.get(u, ()):
            waiting[v] -= 1
            if waiting[v] == 0:
                tiebreak += 1
                heapq.heappush(ready, (position(v), tiebreak, v))
    if emitted != len(needed):
        raise RuntimeError("fusion lowering: the fused graph has a cycle (a partition bug: please report it)")
    out = fx.GraphModule(gm, graph)
    fx_util.retag_backward(out)
    return fx_util.finish(out), lowered


def missed_folds(gm: fx.GraphModule, an: Analysis, lowered: tuple[Lowered, ...]) -> set[str]:
    """The layer norms passes.norm_fold folded (gm.meta) whose folded GEMM is not a lowered kernel with
    all of the fold's math in its epilogue (then the fallback would subtract μ ⊗ s from a rounded
    product): the frontend folds again without them."""
    pid = {node.name: i for i, node in enumerate(an.fx_nodes)}
    owner: dict[int, int] = {}
    for low in lowered:
        if low.site is not None:
            owner.update(dict.fromkeys((low.group.anchor,) + low.group.members, low.group.anchor))
    missed = set()
    for fold in gm.meta.get(NORM_FOLDS, ()):
        for gemm, math in fold.gemms:
            g = pid.get(gemm)
            if g is None or owner.get(g) != g or any(owner.get(pid.get(m, -1)) != g for m in math):
                missed.add(fold.norm)
    return missed


def _emit_kernel(graph: fx.Graph, env: dict[fx.Node, fx.Node], an: Analysis, low: Lowered) -> None:
    anchor = an.fx_nodes[low.group.anchor]
    a, w, _ = anchor.args
    call = fx_util.call(graph, KERNEL, low.site.spec(), [env[a], env[w], *[env[x] for x in low.loads]])
    call.meta.update(fx_util.pass_tag(anchor))
    for k, node in enumerate(low.outputs):
        env[node] = fx_util.call(graph, operator.getitem, call, k)
        env[node].meta.update({key: node.meta[key] for key in ("stack_trace", "nn_module_stack") if key in node.meta})
        env[node].meta.update(fx_util.pass_tag(anchor))


def _emit_mm(graph: fx.Graph, env: dict[fx.Node, fx.Node], node: fx.Node) -> fx.Node:
    """A GEMM without an epilogue, back to aten.mm(A, Wᵀ) for the fallback."""
    a, w, major = node.args
    A = env[a] if major[0] == "k" else fx_util.call(graph, aten.t.default, env[a])
    B = fx_util.call(graph, aten.t.default, env[w]) if major[1] == "k" else env[w]
    out = fx_util.call(graph, aten.mm.default, A, B)
    out.meta.update({key: node.meta[key] for key in ("stack_trace", "nn_module_stack") if key in node.meta})
    out.meta.update(fx_util.pass_tag(node))
    return out
