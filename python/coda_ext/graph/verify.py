"""Whole-graph checks, run before any pass or emission. Errors name the node and the fix."""
from __future__ import annotations

from ..errors import GraphError
from . import ir
from .kinds import DTYPE_RULES, KINDS

MAX_SLOTS = 32        # CODA_MAX_SLOTS in csrc/include/coda/abi.h
MAX_REDUCTIONS = 8    # kMaxReductions in csrc/kernels/epilogue_gemm.cuh


def verify(graph: ir.GraphIR) -> ir.GraphIR:
    """Returns `graph` unchanged if it is a valid epilogue graph; raises GraphError otherwise."""
    nodes = graph.nodes
    names: dict[str, int] = {}
    for i, n in enumerate(nodes):
        where = n.describe(i)
        kind = KINDS.get(n.kind)
        if kind is None:
            raise GraphError(f"{where}: unknown node kind {n.kind!r}")
        if kind.arity is not None and len(n.inputs) != kind.arity:
            raise GraphError(f"{where}: takes {kind.arity} inputs, got {len(n.inputs)}")
        for j in n.inputs:
            if not isinstance(j, int) or j < 0 or j >= len(nodes):
                raise GraphError(f"{where}: input {j!r} is not a node of this graph")
            if j >= i:
                raise GraphError(f"{where}: reads node {j}, which does not come before it — the graph has a "
                                 "cycle or is not in topological order; build it with coda_ext.Graph")
            if nodes[j].is_sink:
                raise GraphError(f"{where}: reads {nodes[j].describe(j)}, a sink that produces no value; "
                                 "use the value that was stored or reduced instead")
        _check_attrs(n, where)
        if n.name is not None and (n.kind in ir.INPUT_KINDS or n.kind == "scalar" or n.is_sink):
            if n.name in names:
                other = names[n.name]
                raise GraphError(f"{where}: name {n.name!r} is also used by {nodes[other].describe(other)}")
            names[n.name] = i

    outputs = graph.find("output")
    if len(outputs) > 1:
        raise GraphError(f"the graph has {len(outputs)} main outputs; call g.output(value) at most once and add "
                         "other results with g.store(name, value)")
    if not any(n.is_sink for n in nodes):
        raise GraphError("the graph produces nothing: add g.output(value), g.store(name, value) or a reduction")

    live = graph.live()
    accs = graph.find("accumulator")
    if not any(live[i] for i in accs):
        raise GraphError("the GEMM accumulator is never used by an output: start from g.accumulator()")
    for i, n in enumerate(nodes):
        is_input = n.kind in ir.INPUT_KINDS or (n.kind == "scalar" and n.attr("mode") != "constant")
        if is_input and not live[i]:
            raise GraphError(f"{n.describe(i)}: input {n.name!r} is never used by any output; remove it or use it")

    consumers = graph.consumers()
    for i, n in enumerate(nodes):
        if n.kind in ir.PAIR_KINDS:
            for j in consumers[i]:
                if nodes[j].kind != "store":
                    raise GraphError(
                        f"{nodes[j].describe(j)} reads the half-width result of {n.describe(i)}: a pair op's "
                        "result can only be stored with g.store(name, value)")

    _check_packed(graph, consumers)

    n_slots = len(graph.slots())
    if n_slots > MAX_SLOTS:
        raise GraphError(f"the graph has {n_slots} runtime inputs and outputs; at most {MAX_SLOTS} are supported")
    n_red = len(graph.find("row_reduce")) + len(graph.find("col_reduce"))
    if n_red > MAX_REDUCTIONS:
        raise GraphError(f"the graph has {n_red} reductions; at most {MAX_REDUCTIONS} are supported")
    return graph


def _check_attrs(n: ir.Node, where: str) -> None:
    if n.kind == "scalar":
        mode = n.attr("mode")
        if mode not in ir.SCALAR_MODES:
            raise GraphError(f"{where}: scalar mode must be one of {ir.SCALAR_MODES}, got {mode!r}")
        if mode == "constant" and not isinstance(n.attr("value"), float):
            raise GraphError(f"{where}: a constant scalar needs a float value")
        if mode != "constant" and not n.name:
            raise GraphError(f"{where}: a runtime scalar needs a name")
    _check_dtype(n, where)
    if n.kind in ir.INPUT_KINDS + ir.SINK_KINDS and not n.name:
        raise GraphError(f"{where}: needs a name")
    if n.kind in ("row_reduce", "col_reduce") and n.attr("op") not in ir.REDUCE_OPS:
        raise GraphError(f"{where}: reduction op {n.attr('op')!r} is not supported; use one of {ir.REDUCE_OPS}")
    if n.kind == "col_reduce" and n.attr("op") in ir.ROW_ONLY_REDUCE_OPS:
        raise GraphError(f"{where}: op {n.attr('op')!r} is only supported by row_reduce")
    if n.kind == "segment_reduce" and (n.attr("op") not in ("sum", "max", "sumsq")
                                       or n.attr("size") not in (32, 64, 128)):
        raise GraphError(f"{where}: needs op in ('sum', 'max', 'sumsq') and size 32, 64 or 128, got "
                         f"op={n.attr('op')!r}, size={n.attr('size')!r}")
    if n.kind == "unpack" and n.attr("half") not in (0, 1):
        raise GraphError(f"{where}: unpack takes half 0 (even column) or 1 (odd column), got {n.attr('half')!r}")
    if n.kind in ir.PAIR_KINDS and n.attr("act") not in ir.PAIR_ACTIVATIONS:
        raise GraphError(f"{where}: activation {n.attr('act')!r} is not one of {ir.PAIR_ACTIVATIONS}")


def _check_dtype(n: ir.Node, where: str) -> None:
    """The node's dtype attribute against its kind's dtype rule (kinds.DTYPE_RULES)."""
    rule, dtype = KINDS[n.kind].dtype, n.attr("dtype")
    allowed = DTYPE_RULES[rule]
    if rule == "cast" and dtype not in allowed:
        raise GraphError(f"{where}: cast needs a dtype in {allowed}")
    if rule == "pair16" and dtype not in (None,) + allowed:
        raise GraphError(f"{where}: pairs are 16-bit elements; dtype must be bfloat16 or float16, got {dtype!r}")
    if rule in ("float", "tensor", "float_or_int") and dtype not in (None,) + allowed:
        raise GraphError(f"{where}: dtype {dtype!r} is not one of {allowed}")


def _check_packed(graph: ir.GraphIR, consumers: list[list[int]]) -> None:
    """Packed pair values are containers, not numbers: a pair_tile feeds only unpack, a pack only
    pair_store; unpack reads a pair_tile, pair_store a pack. (A pack of a half-width or packed value is
    refused by the consumer rules of those values.)"""
    nodes = graph.nodes
    allowed = {"pair_tile": "unpack", "pack": "pair_store"}
    for i, n in enumerate(nodes):
        if n.kind in allowed:
            for j in consumers[i]:
                if nodes[j].kind != allowed[n.kind]:
                    raise GraphError(f"{nodes[j].describe(j)} reads the packed pairs of {n.describe(i)}; use the two "
                                     "values Graph.pair_tile returns, and Graph.store_pairs to write pairs")
        want = {"unpack": "pair_tile", "pair_store": "pack"}.get(n.kind)
        if want and nodes[n.inputs[0]].kind != want:
            raise GraphError(f"{n.describe(i)} must read a {want}, not {nodes[n.inputs[0]].describe(n.inputs[0])}")

