"""Constant folding and identities.

- Factories of one value everywhere (zeros, ones, *_like, new_*) become `full`, which an epilogue reads
  as a constant; element-wise math whose every tensor input is such a constant is evaluated now and
  becomes one too.
- Identities vanish: detach and alias, a conversion to the dtype a value already has, a view or
  expand to the shape it already has, pow(x, 1), x * 1, x / 1, x + 0, x - 0 (where the result has
  x's shape and dtype).

fold(gm) is a pure function.
"""
from __future__ import annotations

import operator
from typing import Any

import torch
from torch import fx

from .. import aten_ir, fx_util
from .emit import Emit

aten = torch.ops.aten
prims = torch.ops.prims

_ALIASES = {aten.detach.default, aten.alias.default}
_SAME_SHAPE = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.expand.default}
_CONVERTS = {prims.convert_element_type.default, aten._to_copy.default}
_FACTORIES = {aten.zeros.default: 0.0, aten.ones.default: 1.0, aten.zeros_like.default: 0.0,
              aten.ones_like.default: 1.0, aten.new_zeros.default: 0.0, aten.new_ones.default: 1.0}
#: x op c == x for these numbers c (as the second operand).
_NEUTRAL = {aten.mul.Tensor: 1, aten.mul.Scalar: 1, aten.div.Tensor: 1, aten.div.Scalar: 1,
            aten.add.Tensor: 0, aten.add.Scalar: 0, aten.sub.Tensor: 0, aten.sub.Scalar: 0,
            aten.pow.Tensor_Scalar: 1}


def _same_value_type(node: fx.Node, x: Any) -> bool:
    return isinstance(x, fx.Node) and fx_util.shape(x) == fx_util.shape(node) \
        and fx_util.dtype(x) == fx_util.dtype(node)


def _identity_of(node: fx.Node) -> fx.Node | None:
    """The node this one equals, if it is an identity."""
    t, args = node.target, node.args
    if t in _ALIASES:
        return args[0]
    if t in _SAME_SHAPE and _same_value_type(node, args[0]):
        return args[0]
    if t in _CONVERTS and _same_value_type(node, args[0]) and set(node.kwargs) <= {"dtype", "layout", "device"}:
        return args[0]
    if t in _NEUTRAL and len(args) > 1 and not isinstance(args[1], fx.Node) and args[1] == _NEUTRAL[t] \
            and node.kwargs.get("alpha", 1) == 1 and _same_value_type(node, args[0]):
        return args[0]
    return None


def _evaluate(node: fx.Node, consts: dict[fx.Node, float]) -> float | None:
    """The value of element-wise math over constants, computed per element as eager would (each input a
    one-element tensor of its dtype and rank, so type promotion is unchanged)."""
    rule = aten_ir.MATH.get(node.target)
    if rule is None or rule.check(node) is not None:
        return None
    ins = node.all_input_nodes
    if not ins or any(i not in consts for i in ins):
        return None

    def one(x: Any) -> Any:
        if isinstance(x, fx.Node):
            v = fx_util.val(x)
            return torch.full((1,) * v.dim(), consts[x], dtype=v.dtype)
        return x

    out = node.target(*[one(a) for a in node.args], **{k: one(v) for k, v in node.kwargs.items()
                                                       if k not in ("device", "layout", "pin_memory")})
    return float(out.reshape(-1)[0].item())


def _full(b: Emit, node: fx.Node, value: float) -> fx.Node:
    v = fx_util.val(node)
    if v.dim() == 0:
        return b(aten.scalar_tensor.default, value, dtype=v.dtype, device=v.device)
    return b(aten.full.default, list(v.shape), value, dtype=v.dtype, device=v.device)


def fold(gm: fx.GraphModule) -> fx.GraphModule:
    """gm with identities removed and constant math folded into constants."""
    gm = fx_util.clone(gm)
    graph = gm.graph
    consts: dict[fx.Node, float] = {}
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is operator.getitem or not fx_util.is_static(node):
            continue
        same = _identity_of(node)
        if same is not None:
            fx_util.replace(node, same)
            graph.erase_node(node)
            continue
        value = aten_ir.constant_value(node)
        if value is not None:
            consts[node] = value
            continue
        if node.target in _FACTORIES:
            value = _FACTORIES[node.target]
        elif node.target in (aten.full_like.default, aten.new_full.default):
            value = node.args[1] if node.target is aten.full_like.default else node.args[2]
        else:
            value = _evaluate(node, consts)
        if value is None or not isinstance(value, (int, float)):
            continue
        with graph.inserting_before(node):
            new = _full(Emit(graph, fx_util.pass_tag(node)), node, float(value))
        fx_util.replace(node, new)
        graph.erase_node(node)
        consts[new] = float(value)
    return fx_util.finish(gm)
