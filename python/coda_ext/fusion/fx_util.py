"""Small helpers on FX graphs shared by the fusion compiler: copy a module, add a node with its fake
value, read a node's shape and dtype, keep a graph tidy.

Every node the compiler adds gets `meta["val"]` (a FakeTensor, or a list of them) computed by running
its op on the fake values of its arguments, as AOTAutograd's own nodes have: the partitioner, the
fallback compilers and our own analysis read shapes and dtypes from there.
"""
from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import fx
from torch._guards import detect_fake_mode

aten = torch.ops.aten


def clone(gm: fx.GraphModule) -> fx.GraphModule:
    """A new GraphModule with a copy of gm's graph (nodes, names and meta), sharing its attributes:
    passes edit the copy, so each is a pure function of its input module."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in gm.graph.nodes:
        env[node] = graph.node_copy(node, lambda n: env[n])
    out = fx.GraphModule(gm, graph)
    out.meta.update(getattr(gm, "meta", {}))
    return out


def finish(gm: fx.GraphModule) -> fx.GraphModule:
    """Drops dead pure nodes, checks and regenerates the module's code."""
    gm.graph.eliminate_dead_code()
    gm.graph.lint()
    gm.recompile()
    return gm


def val(node: Any) -> Any:
    """The fake value of a node (a tensor, a list of them, a number), or the argument itself."""
    return node.meta.get("val") if isinstance(node, fx.Node) else node


def shape(node: Any) -> tuple[int, ...]:
    v = val(node)
    return tuple(v.shape) if isinstance(v, torch.Tensor) else ()


def dtype(node: Any) -> torch.dtype | None:
    v = val(node)
    return v.dtype if isinstance(v, torch.Tensor) else None


def numel(node: Any) -> int:
    return math.prod(shape(node))


def nbytes(node: Any) -> int:
    v = val(node)
    return v.numel() * v.element_size() if isinstance(v, torch.Tensor) else 0


def is_static(node: fx.Node) -> bool:
    """The node's value has concrete (non-symbolic) sizes."""
    v = val(node)
    values = v if isinstance(v, (list, tuple)) else [v]
    return all(not isinstance(t, torch.Tensor) or all(isinstance(s, int) for s in t.shape) for t in values)


def is_contiguous(node: fx.Node) -> bool:
    v = val(node)
    return isinstance(v, torch.Tensor) and v.is_contiguous()


def _fake_mode(values: Iterable[Any]):
    flat = []
    for v in values:
        flat.extend(v if isinstance(v, (list, tuple)) else [v])
    return detect_fake_mode([v for v in flat if isinstance(v, torch.Tensor)])


def _unwrap(x: Any) -> Any:
    if isinstance(x, fx.Node):
        return x.meta["val"]
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap(y) for y in x)
    return x


def graph_fake_mode(graph: fx.Graph):
    """The FakeTensorMode of the fake values in a graph's meta (None if it has none)."""
    for node in graph.nodes:
        mode = _fake_mode([node.meta.get("val")])
        if mode is not None:
            return mode
    return None


def call(graph: fx.Graph, target: Callable, *args: Any, **kwargs: Any) -> fx.Node:
    """Adds `target(*args, **kwargs)` at the graph's insertion point, with its fake value in meta."""
    values = [_unwrap(a) for a in args] + [_unwrap(v) for v in kwargs.values()]
    mode = _fake_mode(values) or graph_fake_mode(graph)
    node = graph.call_function(target, args, kwargs)
    if target is operator.getitem:
        node.meta["val"] = values[0][values[1]]
        return node
    if mode is None:
        raise ValueError(f"fusion: cannot add {target}: the graph carries no fake tensors in meta['val'] (trace it "
                         "with AOTAutograd or make_fx)")
    with mode:
        node.meta["val"] = target(*[_unwrap(a) for a in args], **{k: _unwrap(v) for k, v in kwargs.items()})
    return node


def replace(node: fx.Node, new: fx.Node) -> None:
    """Points every user of `node` at `new` and keeps the readable origin of the node."""
    for key in ("stack_trace", "nn_module_stack", "source_fn_stack"):
        if key in node.meta and key not in new.meta:
            new.meta[key] = node.meta[key]
    node.replace_all_uses_with(new)


def replace_outputs(node: fx.Node, values: list[fx.Node | None]) -> None:
    """Replaces the getitem users of a multi-output node by `values` (None: that output is unused)."""
    for user in list(node.users):
        if user.target is operator.getitem and values[user.args[1]] is not None:
            replace(user, values[user.args[1]])


#: The meta key AOTAutograd's default partition reads: "is_forward" on nodes the forward traced, the
#: forward being every node up to the last so tagged (the rest runs in the backward).
PARTITIONER_TAG = "partitioner_tag"
#: Meta key of a forward value's copy that the backward recomputes (passes/remat.py): a backward node to the
#: analysis, though it depends on no tangent.
RECOMPUTED = "coda_recomputed"
#: Meta key of a value the forward computes for the backward alone (passes/gelu_save.py: GELU's derivative): a
#: forward node to the analysis, so no backward GEMM's epilogue computes it again in the backward.
SAVED = "coda_saved"
#: Meta key of a same-dtype conversion that an epilogue runs as a rounding (a cast): what passes/remat.py puts
#: between a 16-bit leaf and the forward math the backward recomputes from it.
ROUNDED = "coda_rounded"


def closure(root: fx.Node, through: Callable[[fx.Node], bool], limit: int) -> tuple[set[fx.Node], set[fx.Node]] | None:
    """(the nodes root is computed by through nodes `through` accepts, root included; the nodes they read that it
    does not accept) or None where more than `limit` nodes would be inside."""
    inside: set[fx.Node] = set()
    leaves: set[fx.Node] = set()
    todo = [root]
    while todo:
        n = todo.pop()
        if n in inside or n in leaves:
            continue
        if n is not root and not through(n):
            leaves.add(n)
            continue
        inside.add(n)
        if len(inside) > limit:
            return None
        todo.extend(n.all_input_nodes)
    return inside, leaves


#: node.meta key of a GEMM's identity across the passes' runs: the name passes.layout gave it (the passes before
#: it are pure functions of the same graph, so the same each run), kept by the GEMMs that replace it (a folded
#: layer norm's, passes.norm_fold) and joined by a merged one (passes.hmerge); the names those passes give vary
#: with which layer norms are folded and which GEMMs merge.
GEMM_ID = "coda_gemm_id"


def gemm_id(node: fx.Node) -> str:
    """A GEMM's identity across runs of the passes (GEMM_ID), its name where it has none."""
    return node.meta.get(GEMM_ID, node.name)


def pass_tag(node: fx.Node) -> dict[str, Any]:
    """The partitioner tag of a node, as meta for the nodes that replace it."""
    return {PARTITIONER_TAG: node.meta[PARTITIONER_TAG]} if PARTITIONER_TAG in node.meta else {}


def retag_backward(gm: fx.GraphModule) -> None:
    """Drops the forward tag of nodes that now depend on a tangent (a backward kernel computes what they
    read): a forward-tagged node after the backward's first nodes would make the default partition
    count those as forward."""
    for node in tangent_dependent(gm):
        if node.meta.get(PARTITIONER_TAG) == "is_forward":
            del node.meta[PARTITIONER_TAG]


def output_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    """The nodes the graph returns, in order (its output's arguments flattened; constants and None left out)."""
    out = next(n for n in gm.graph.nodes if n.op == "output")
    found: list[fx.Node] = []
    fx.node.map_arg(out.args, found.append)
    return found


def backward_part(gm: fx.GraphModule) -> set[fx.Node]:
    """The nodes of an AOTAutograd joint graph that its default partition runs in the backward: by placement, as
    it decides, every node after the last one tagged forward (PARTITIONER_TAG), and every node that depends on a
    tangent; a graph without forward tags (hand-made ones): the tangent-dependent nodes. Empty without tangents.
    (analyze still reads the tangent-dependent ones as the backward.)"""
    tangents = tangent_dependent(gm)
    if not tangents:
        return set()
    nodes = list(gm.graph.nodes)
    last = max((i for i, n in enumerate(nodes) if n.meta.get(PARTITIONER_TAG) == "is_forward"), default=None)
    if last is None:
        return tangents
    return tangents | {n for n in nodes[last + 1:] if n.op == "call_function"}


def tangent_dependent(gm: fx.GraphModule) -> set[fx.Node]:
    """Nodes that depend on a tangent input of an AOTAutograd joint graph: the backward part."""
    out: set[fx.Node] = set()
    for node in gm.graph.nodes:
        if (node.op == "placeholder" and "tangents" in str(node.target)) or any(a in out for a in node.all_input_nodes):
            out.add(node)
    return out


def is_pure(node: fx.Node) -> bool:
    """A call that computes a value from its arguments alone (no mutation, no randomness)."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return True
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return False
    if schema.is_mutable or any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
        return False
    tags = getattr(node.target, "tags", ())
    return torch.Tag.nondeterministic_seeded not in tags
