"""Rematerialisation: element-wise values of a joint graph's forward that its backward reads, recomputed in the
backward from the tensors they derive from, where that leaves fewer tensors of their size to keep between the
two passes.

An activation written as element-wise math (GPT-2's GELU, 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))),
differentiated by autograd) hands the backward four intermediates of the MLP's width, each stored by the forward
and read back; each is a few operations of one tensor x. A candidate is a forward value the backward reads,
made by element-wise math (aten_ir.MATH) out of the values its closure stops at (its leaves: GEMM outputs,
views, inputs, reductions; a view of a widened 16-bit value is recomputed with the widening); the candidates with
the same full-size leaves (those of the candidate's size or larger; smaller ones — row statistics, vectors,
scalars — cost little to keep) are recomputed together when they are more than the leaves the forward does not
keep or return already (GPT-2's log-probabilities, x - lse of an fp32 copy of the bf16 logits the model returns:
the backward computes them again from those logits and one value a row). The backward is what the default
partition runs there (fx_util.backward_part: by placement, as it decides). Each member's copies go before its
first backward reader, marked fx_util.RECOMPUTED, so the analysis counts them as backward nodes (a backward
GEMM's epilogue recomputes them from its tile loads; the forward stores the leaves instead of the candidates).
Runs after cse, which would merge the copies back. remat(gm) is a pure function.

The backward recomputes from its leaves as stored (16-bit), so the forward's closure reads each 16-bit leaf
computed in the step (an epilogue may hold it in fp32; an input is exact already) rounded the same way (a
conversion marked fx_util.ROUNDED, an epilogue's cast): forward and backward evaluate at one x, as eager
PyTorch's ops do (evaluated at x in fp32 in the forward and at x in bf16 in the backward, a GPT-2's gradients
lost the numerics rule). exp and log are not recomputed (ILL_CONDITIONED), nor values a backward GEMM reads as
an operand (that would be a pass of its own).
"""
from __future__ import annotations

import torch
from torch import fx

from .. import aten_ir, fx_util

aten = torch.ops.aten

#: The most nodes a candidate's recomputation may take.
MAX_CLOSURE = 32


#: Ops a recomputation does not repeat: exp(x − lse) from x as stored amplifies x's rounding by |x| (softmax's
#: probabilities of 16-bit logits).
ILL_CONDITIONED = (aten.exp.default, aten.log.default)
#: 16-bit dtypes: a leaf stored in one is read rounded by the forward's closure too.
HALF = (torch.bfloat16, torch.float16)


def _math(node: fx.Node, backward: set[fx.Node]) -> bool:
    rule = aten_ir.MATH.get(node.target) if node.op == "call_function" else None
    return node not in backward and rule is not None and node.target not in ILL_CONDITIONED and \
        rule.check(node) is None and aten_ir.math_problem(node) is None and fx_util.is_static(node)


def _closure(v: fx.Node, backward: set[fx.Node]) -> tuple[list[fx.Node], set[fx.Node]] | None:
    """(the element-wise nodes v is computed by, in graph order; the nodes they read that are not) or None
    where that takes more than MAX_CLOSURE nodes."""
    found = fx_util.closure(v, lambda n: _math(n, backward) or _free_view(n, backward), MAX_CLOSURE)
    if found is None:
        return None
    inside, leaves = found
    order = {n: i for i, n in enumerate(v.graph.nodes)}
    return sorted(inside, key=order.__getitem__), leaves


def _free_view(node: fx.Node, backward: set[fx.Node]) -> bool:
    """A view (aten_ir.VIEWS keeping the element count, but expand) of a widened 16-bit value the closure
    recomputes: free to recompute with it (the fp32 copy of a model's 16-bit logits, reshaped for its loss)."""
    return (node not in backward and node.op == "call_function" and node.target in aten_ir.VIEWS
            and node.target is not aten.expand.default and isinstance(node.args[0], fx.Node)
            and fx_util.numel(node.args[0]) == fx_util.numel(node) and aten_ir.is_widening(node.args[0])
            and _math(node.args[0], backward))


def remat(gm: fx.GraphModule) -> fx.GraphModule:
    """gm (a joint forward + backward graph; anything else is returned as it is) with the element-wise values its
    backward reads recomputed in the backward where that keeps fewer full-size tensors (see above)."""
    gm = fx_util.clone(gm)
    graph = gm.graph
    backward = fx_util.backward_part(gm)
    if not backward:
        return gm
    kept = {n for n in graph.nodes if n.op != "output" and n not in backward and any(u in backward for u in n.users)}
    # what the forward returns it stores anyway (a model's logits): as a leaf it costs nothing more to keep
    stored = kept | {a for out in fx_util.output_nodes(gm) if out not in backward for a in aten_ir.alias_chain(out)}
    groups: dict[frozenset[fx.Node], list[tuple[fx.Node, list[fx.Node]]]] = {}
    for v in graph.nodes:
        if v not in kept or not _math(v, backward) or fx_util.numel(v) < 2:
            continue
        if not all(u.target in aten_ir.MATH or aten_ir.reduction(u) is not None for u in v.users if u in backward):
            continue   # a GEMM operand: its recomputation would be a pass of its own
        found = _closure(v, backward)
        if found is None:
            continue
        inside, leaves = found
        large = frozenset(x for x in leaves if fx_util.numel(x) >= fx_util.numel(v))
        groups.setdefault(large, []).append((v, inside))
    order = {n: i for i, n in enumerate(graph.nodes)}
    accepted = []
    for large, members in groups.items():
        full = [v for v, _ in members if fx_util.numel(v) >= max((fx_util.numel(x) for x in large), default=0)]
        if len(full) > len(large - stored):
            accepted.append((sorted(large, key=order.__getitem__), members))
    for _, members in accepted:   # every copy first: the rounding below rewires forward nodes only
        _recompute(graph, members, backward, order)
    for large, members in accepted:
        inside = sorted({n for _, nodes in members for n in nodes}, key=order.__getitem__)
        for leaf in large:
            if fx_util.dtype(leaf) in HALF and _computed(leaf):
                _read_rounded(graph, leaf, inside)
    return fx_util.finish(gm) if accepted else gm


def _recompute(graph: fx.Graph, members: list[tuple[fx.Node, list[fx.Node]]], backward: set[fx.Node],
               order: dict[fx.Node, int]) -> None:
    """Copies of the members' closures for the backward, each inserted before the first backward node that
    reads its member (members in the order of those readers, so a copy made for an earlier one serves the
    later ones; a member's leaves precede the member, which precedes its readers), and the backward's reads
    of the members moved to them."""
    copies: dict[fx.Node, fx.Node] = {}
    firsts = {v: min((u for u in v.users if u in backward), key=order.__getitem__) for v, _ in members}
    for v, nodes in sorted(members, key=lambda m: order[firsts[m[0]]]):
        with graph.inserting_before(firsts[v]):
            for n in nodes:
                if n not in copies:
                    copy = graph.node_copy(n, lambda a: copies.get(a, a))
                    copy.meta[fx_util.RECOMPUTED] = True
                    copy.meta.pop(fx_util.PARTITIONER_TAG, None)   # the default partition's forward tag
                    copies[n] = copy
        for u in [u for u in v.users if u in backward]:
            u.replace_input_with(v, copies[v])


def _computed(node: fx.Node) -> bool:
    """Whether node's value is computed in the step (a GEMM, an epilogue's math, a reduction: an epilogue may hold
    it in fp32 before it is stored), not an input (exact in its dtype already)."""
    return aten_ir.alias_root(node).op != "placeholder"


def _read_rounded(graph: fx.Graph, leaf: fx.Node, inside: list[fx.Node]) -> None:
    """The forward's closure nodes read leaf rounded to its dtype (a conversion marked ROUNDED: an epilogue's
    cast), as the backward reads it stored."""
    with graph.inserting_after(leaf):
        rounded = fx_util.call(graph, aten._to_copy.default, leaf, dtype=fx_util.dtype(leaf))
    rounded.meta[fx_util.ROUNDED] = True
    if fx_util.PARTITIONER_TAG in leaf.meta:
        rounded.meta[fx_util.PARTITIONER_TAG] = leaf.meta[fx_util.PARTITIONER_TAG]
    for n in inside:
        n.replace_input_with(leaf, rounded)
