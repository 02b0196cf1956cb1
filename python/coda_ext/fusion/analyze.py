"""From an FX graph (after the passes) to the partitioner's graph (pgraph.PGraph).

analyze(gm, target) classifies every node — GEMM anchor (coda_ext::fusion_gemm that the target's kernel
accepts), epilogue math, reduction, input or other (with the reason) — finds each node's frame and how
each of its operands would be read by an epilogue (tile, row or column vector, scalar, constant,
column index), follows views that keep rows and columns (and conversions of 16-bit values to fp32,
which an epilogue does as it loads) to the value they show, and marks the
backward part of a joint graph (what depends on a tangent), what the forward pass needs (what feeds a
forward output: it cannot wait for a backward kernel) and the graph's outputs.
"""
from __future__ import annotations

import dataclasses
import math
import operator
from typing import Any

import torch
from torch import fx

from ..analysis.costs import DTYPE_BYTES
from . import aten_ir, fx_util, rules
from .aten_ir import alias_root, is_alias
from .passes import GEMM
from .pgraph import Operand, PGraph, PNode


@dataclasses.dataclass(frozen=True)
class Analysis:
    """The PGraph of an FX graph and the way back: the FX node of each PNode, and for each epilogue
    node the FX node behind each of its arguments (what a kernel would load)."""

    pgraph: PGraph
    fx_nodes: tuple[fx.Node, ...]                       # PNode id -> FX node
    id_of: dict[fx.Node, int]                           # FX node -> PNode id (a view: its source's)
    args: dict[int, dict[fx.Node, tuple[Operand, Any]]]  # PNode id -> {FX arg: (operand, node to load)}

    def gemm_mnk(self, pid: int) -> tuple[int, int, int]:
        node = self.fx_nodes[pid]
        a, _, major = node.args
        M, N = fx_util.shape(node)
        K = fx_util.shape(a)[1] if major[0] == "k" else fx_util.shape(a)[0]
        return M, N, K


def _nbytes(node: fx.Node) -> int:
    """Bytes of the node's value (of every tensor of a multi-output op)."""
    v = fx_util.val(node)
    values = v if isinstance(v, (list, tuple)) else [v]
    total = 0
    for t in values:
        if isinstance(t, torch.Tensor) and all(isinstance(s, int) for s in t.shape):
            total += t.numel() * DTYPE_BYTES.get(str(t.dtype).replace("torch.", ""), t.element_size())
    return total


def frame_of(shape: tuple[int, ...]) -> tuple[int, int] | None:
    """(rows, columns): every leading dim is a row."""
    return (math.prod(shape[:-1]), shape[-1]) if len(shape) >= 1 else None


def shape_role(shape: tuple[int, ...], out: tuple[int, ...]) -> str | None:
    """How a tensor of `shape` broadcasts into a value of shape `out`: tile, row, col, scalar or None."""
    if math.prod(shape) == 1 and len(shape) <= len(out):
        return "scalar"
    if len(shape) > len(out) or not out:
        return None
    padded = (1,) * (len(out) - len(shape)) + tuple(shape)
    if padded == tuple(out):
        return "tile"
    if all(d == 1 for d in padded[:-1]) and padded[-1] == out[-1]:
        return "row"
    if padded[-1] == 1 and padded[:-1] == tuple(out[:-1]):
        return "col"
    return None


def _load(x: fx.Node, out: tuple[int, ...]) -> tuple[str | None, fx.Node]:
    """The role x plays in a value of shape `out` and the node to load for it: a vector broadcast by a
    view or expand is loaded as the vector it came from, a tile as the value its aliases show, and a
    16-bit value widened to fp32 as stored (the epilogue widens it)."""
    role = shape_role(fx_util.shape(x), out)
    x = alias_root(x) if role == "tile" else x
    while aten_ir.is_widening(x):
        x = x.args[0]
    while isinstance(x, fx.Node) and x.op == "call_function" and x.target in aten_ir.VIEWS:
        src = x.args[0]
        if not isinstance(src, fx.Node):
            break
        inner = shape_role(fx_util.shape(src), out)
        expands = x.target is torch.ops.aten.expand.default and role == "tile"
        if inner in ("row", "col", "scalar") and (inner == role or expands):
            x, role = src, inner
        else:
            break
        while aten_ir.is_widening(x):
            x = x.args[0]
    dtype = fx_util.dtype(x)
    if role is None or dtype is None or not rules.loadable(role, dtype):
        return None, x
    return role, x


def _feeding(gm: fx.GraphModule, count: int | None) -> set[fx.Node] | None:
    """The nodes the first `count` outputs depend on (None: every node that does not depend on a tangent)."""
    if count is None:
        return None
    output = next(n for n in gm.graph.nodes if n.op == "output")
    todo = [x for x in _flatten(output.args)[:count] if isinstance(x, fx.Node)]
    seen: set[fx.Node] = set(todo)
    while todo:
        for x in todo.pop().all_input_nodes:
            if x not in seen:
                seen.add(x)
                todo.append(x)
    return seen


def analyze(gm: fx.GraphModule, target: str = "interpret", forward_outputs: int | None = None) -> Analysis:
    """forward_outputs: how many of a joint graph's outputs are the forward's (AOTAutograd's
    num_fwd_outputs); without it every node that does not depend on a tangent counts as forward."""
    backward = fx_util.tangent_dependent(gm)
    forward = _feeding(gm, forward_outputs)
    outputs: set[fx.Node] = set()
    id_of: dict[fx.Node, int] = {}
    nodes: list[PNode] = []
    fx_nodes: list[fx.Node] = []
    arg_map: dict[int, dict[fx.Node, tuple[Operand, Any]]] = {}

    def pid(x: fx.Node) -> int:
        return id_of[alias_root(x)]

    def operand(x: fx.Node, out: tuple[int, ...]) -> tuple[Operand, Any]:
        if aten_ir.constant_value(x) is not None:
            return Operand(None, "const"), x
        n = aten_ir.arange_length(x)
        if n is not None and out and n == out[-1] and fx_util.shape(x) == (n,):
            return Operand(None, "col_index"), x
        role, load = _load(x, out)
        return Operand(pid(load), role), load

    for node in gm.graph.nodes:
        if node.op == "output":
            for x in _flatten(node.args):
                if isinstance(x, fx.Node):
                    outputs.add(alias_root(x))
            continue
        if is_alias(node):
            id_of[node] = id_of[alias_root(node)]
            continue
        i = len(nodes)
        id_of[node] = i
        fx_nodes.append(node)
        recomputed = bool(node.meta.get(fx_util.RECOMPUTED, False))   # passes/remat.py's copies: backward
        saved = bool(node.meta.get(fx_util.SAVED, False))             # passes/gelu_save.py's: forward
        common = {"id": i, "name": node.name, "target": str(node.target), "nbytes": _nbytes(node),
                  "backward": node in backward or recomputed,
                  "forward": not (node in backward or recomputed) if forward is None else node in forward or saved}
        v = fx_util.val(node)
        out = fx_util.shape(node)
        if node.op != "call_function":
            nodes.append(PNode(op="input", operands=(), **common))
            continue
        srcs = tuple(Operand(pid(x), None) for x in dict.fromkeys(node.all_input_nodes))
        if node.target in aten_ir.REFUSED:
            nodes.append(PNode(op="other", operands=srcs, reason=aten_ir.REFUSED[node.target], **common))
            continue
        if not isinstance(v, torch.Tensor) or not fx_util.is_static(node):
            nodes.append(PNode(op="other", operands=srcs, reason="not one tensor of static shape", **common))
            continue
        storable = v.dtype in rules.FLOAT
        if node.target is GEMM:
            a, w, major = node.args
            problem = rules.anchor_problem(fx_util.val(a), fx_util.val(w), major, target)
            nodes.append(PNode(op="gemm" if problem is None else "other", operands=srcs, frame=frame_of(out),
                               storable=storable, reason=problem, **common))
            continue
        red = aten_ir.reduction(node) if node.target is not operator.getitem else None
        if red is not None:
            op, dims, _ = red
            x = node.args[0]
            s = fx_util.shape(x)
            axis = "row" if dims == (len(s) - 1,) else "col" if len(s) >= 2 and dims == tuple(range(len(s) - 1)) \
                else None
            reason = None
            if axis is None:
                reason = f"reduction over dims {dims} of a {len(s)}-D value (epilogues reduce a row or every row)"
            elif axis == "col" and op == "logsumexp":
                reason = "logsumexp over rows (epilogues take it per row only)"
            elif not storable:
                reason = f"reduction to {v.dtype}"
            if reason is None:
                o, load = operand(x, s)
                arg_map[i] = {x: (o, load)}
                nodes.append(PNode(op="reduce", operands=(o,), frame=frame_of(s), axis=axis, reduce_op=op,
                                   **common))
            else:
                nodes.append(PNode(op="other", operands=srcs, reason=reason, **common))
            continue
        problem = aten_ir.math_problem(node) if node.target is not operator.getitem else "a multi-output op"
        if problem is None and not out:
            problem = "math on 0-dim values (a scalar computation, not a tile)"
        if problem is not None:
            nodes.append(PNode(op="other", operands=srcs, reason=problem, **common))
            continue
        args = {x: operand(x, out) for x in dict.fromkeys(node.all_input_nodes)}
        arg_map[i] = args
        nodes.append(PNode(op="math", operands=tuple(o for o, _ in args.values()), frame=frame_of(out),
                           storable=storable, **common))

    nodes = [dataclasses.replace(n, output=True) if fx_nodes[n.id] in outputs else n for n in nodes]
    return Analysis(PGraph(tuple(nodes)), tuple(fx_nodes), id_of, arg_map)


def _flatten(args: Any) -> list[Any]:
    if isinstance(args, (list, tuple)):
        return [y for x in args for y in _flatten(x)]
    if isinstance(args, dict):
        return [y for x in args.values() for y in _flatten(x)]
    return [args]
