"""Which ATen ops an epilogue can run, and how each becomes graph-builder math: the one table the
analysis (is this node fusible?) and the lowering (build its coda_ext graph) both read.

Epilogue math is fp32 (graph/kinds.py): a float conversion inside an epilogue is the identity (the
value is rounded once, when it is stored, to the dtype of the FX node it replaces); a comparison gives
1.0 / 0.0, which is what a bool tensor is to the ops that read it (where, mul).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from ..graph import math as cm
from . import fx_util

aten = torch.ops.aten
prims = torch.ops.prims

#: Arg is a function (fx arg) -> a coda_ext Value or a Python number.
Arg = Callable[[Any], Any]

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
#: Exponents of pow(x, p) an epilogue computes exactly with its primitives.
POWERS = (-2.0, -1.0, -0.5, 0.5, 1.0, 2.0, 3.0)


@dataclasses.dataclass(frozen=True)
class MathRule:
    """emit(node, arg) -> Value builds the node's math from its arguments; check(node) -> a reason it
    cannot be fused here, or None."""

    emit: Callable[[fx.Node, Arg], Any]
    check: Callable[[fx.Node], str | None] = lambda node: None


def _unary(fn: Callable) -> MathRule:
    return MathRule(lambda n, a: fn(a(n.args[0])))


def _alpha(n: fx.Node) -> Any:
    return n.kwargs.get("alpha", n.args[2] if len(n.args) > 2 else 1)


def _binary(fn: Callable) -> MathRule:
    """fn(x, y), with add/sub's alpha scaling y."""
    def emit(n: fx.Node, a: Arg) -> Any:
        x, y = a(n.args[0]), a(n.args[1])
        return fn(x, y if _alpha(n) == 1 else y * _alpha(n))

    return MathRule(emit)


def _rsub(n: fx.Node, a: Arg) -> Any:
    """rsub(x, other, alpha) = other - alpha * x."""
    x = a(n.args[0])
    return cm.sub(a(n.args[1]), x if _alpha(n) == 1 else x * _alpha(n))


def _pow(n: fx.Node, a: Arg) -> Any:
    x, p = a(n.args[0]), float(n.args[1])
    return {-2.0: lambda: 1.0 / cm.square(x), -1.0: lambda: 1.0 / x, -0.5: lambda: cm.rsqrt(x),
            0.5: lambda: cm.sqrt(x), 1.0: lambda: x, 2.0: lambda: cm.square(x),
            3.0: lambda: x * cm.square(x)}[p]()


def _pow_check(n: fx.Node) -> str | None:
    p = n.args[1]
    if isinstance(p, (int, float)) and float(p) in POWERS:
        return None
    return f"pow with exponent {p!r} (epilogues compute exponents {POWERS})"


def _convert_check(n: fx.Node) -> str | None:
    extra = {k for k in n.kwargs if k not in ("dtype", "layout", "device")}
    if extra:
        return f"{n.target} with {sorted(extra)}"
    out = n.meta["val"].dtype
    if out not in FLOAT_DTYPES:
        return f"conversion to {out} (epilogue math is fp32; integer results are not stored)"
    return None


def _gelu(n: fx.Node, a: Arg) -> Any:
    return cm.gelu(a(n.args[0]), approximate=n.kwargs.get("approximate", "none"))


def _approximate(n: fx.Node) -> str:
    return n.args[2] if len(n.args) > 2 else n.kwargs.get("approximate", "none")


def _gelu_backward(n: fx.Node, a: Arg) -> Any:
    dy, grad = a(n.args[0]), cm.gelu_grad(a(n.args[1]), approximate=_approximate(n))
    return grad if isinstance(dy, float) and dy == 1.0 else dy * grad   # gelu_backward(1, x): the derivative


def _to_copy(n: fx.Node, a: Arg) -> Any:
    """The identity (a value is rounded when stored), but a conversion marked fx_util.ROUNDED: a rounding."""
    return cm.cast(a(n.args[0]), n.meta["val"].dtype) if n.meta.get(fx_util.ROUNDED) else a(n.args[0])


def _clamp(n: fx.Node, a: Arg) -> Any:
    x = a(n.args[0])
    lo = n.args[1] if len(n.args) > 1 else n.kwargs.get("min")
    hi = n.args[2] if len(n.args) > 2 else n.kwargs.get("max")
    if lo is not None:
        x = cm.maximum(x, a(lo))
    if hi is not None:
        x = cm.minimum(x, a(hi))
    return x


def _no_rounding_mode(n: fx.Node) -> str | None:
    mode = n.kwargs.get("rounding_mode")
    return None if mode is None else f"division with rounding_mode={mode!r}"


MATH: dict[Any, MathRule] = {
    aten.add.Tensor: _binary(cm.add), aten.add.Scalar: _binary(cm.add),
    aten.sub.Tensor: _binary(cm.sub), aten.sub.Scalar: _binary(cm.sub),
    aten.rsub.Tensor: MathRule(_rsub), aten.rsub.Scalar: MathRule(_rsub),
    aten.mul.Tensor: _binary(cm.mul), aten.mul.Scalar: _binary(cm.mul),
    aten.div.Tensor: _binary(cm.div), aten.div.Scalar: _binary(cm.div),
    aten.div.Tensor_mode: MathRule(lambda n, a: cm.div(a(n.args[0]), a(n.args[1])), _no_rounding_mode),
    aten.maximum.default: _binary(cm.maximum), aten.minimum.default: _binary(cm.minimum),
    aten.neg.default: _unary(cm.neg), aten.abs.default: _unary(cm.abs), aten.exp.default: _unary(cm.exp),
    aten.log.default: _unary(cm.log), aten.sqrt.default: _unary(cm.sqrt), aten.rsqrt.default: _unary(cm.rsqrt),
    aten.tanh.default: _unary(cm.tanh), aten.sigmoid.default: _unary(cm.sigmoid),
    aten.relu.default: _unary(cm.relu), aten.silu.default: _unary(cm.silu),
    aten.reciprocal.default: MathRule(lambda n, a: 1.0 / a(n.args[0])),
    aten.gelu.default: MathRule(_gelu),
    aten.gelu_backward.default: MathRule(_gelu_backward),   # dy · gelu_grad(x): one node, either form
    aten.pow.Tensor_Scalar: MathRule(_pow, _pow_check),
    aten.clamp_min.default: MathRule(lambda n, a: cm.maximum(a(n.args[0]), a(n.args[1]))),
    aten.clamp_max.default: MathRule(lambda n, a: cm.minimum(a(n.args[0]), a(n.args[1]))),
    aten.clamp.default: MathRule(_clamp),
    aten.eq.Tensor: _binary(cm.eq), aten.eq.Scalar: _binary(cm.eq),
    aten.ne.Tensor: _binary(cm.ne), aten.ne.Scalar: _binary(cm.ne),
    aten.lt.Tensor: _binary(cm.lt), aten.lt.Scalar: _binary(cm.lt),
    aten.le.Tensor: _binary(cm.le), aten.le.Scalar: _binary(cm.le),
    aten.gt.Tensor: _binary(cm.gt), aten.gt.Scalar: _binary(cm.gt),
    aten.ge.Tensor: _binary(cm.ge), aten.ge.Scalar: _binary(cm.ge),
    aten.logical_not.default: MathRule(lambda n, a: cm.eq(a(n.args[0]), 0.0)),
    aten.where.self: MathRule(lambda n, a: cm.where(a(n.args[0]), a(n.args[1]), a(n.args[2]))),
    aten.where.ScalarOther: MathRule(lambda n, a: cm.where(a(n.args[0]), a(n.args[1]), a(n.args[2]))),
    aten.where.ScalarSelf: MathRule(lambda n, a: cm.where(a(n.args[0]), a(n.args[1]), a(n.args[2]))),
    aten._to_copy.default: MathRule(_to_copy, _convert_check),
    prims.convert_element_type.default: MathRule(lambda n, a: a(n.args[0]), _convert_check),
}

#: Ops that only re-view their input (or copy it unchanged): an alias as far as values go.
VIEWS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.clone.default,
         aten.detach.default, aten.alias.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default,
         aten.unsqueeze.default, aten.expand.default}

#: Float conversions (prims' and ATen's).
CONVERTS = {prims.convert_element_type.default, aten._to_copy.default}


def is_widening(node: Any) -> bool:
    """A conversion of a 16-bit float value to fp32: exact, so an epilogue reads the 16-bit value and
    widens it (its math is fp32) rather than load an fp32 copy someone would have to write."""
    if not (isinstance(node, fx.Node) and node.op == "call_function" and node.target in CONVERTS):
        return False
    src = node.args[0]
    if not isinstance(src, fx.Node) or set(node.kwargs) - {"dtype", "layout", "device"}:
        return False
    v, s = node.meta.get("val"), src.meta.get("val")
    return isinstance(v, torch.Tensor) and isinstance(s, torch.Tensor) and v.dtype == torch.float32 \
        and s.dtype in (torch.bfloat16, torch.float16) and v.shape == s.shape and v.device == s.device


def is_alias(node: Any) -> bool:
    """A view (or copy) that keeps the value's rows and columns, or a widening conversion (is_widening):
    as far as an epilogue reads it, it is its source."""
    if is_widening(node):
        return True
    if not (isinstance(node, fx.Node) and node.op == "call_function" and node.target in VIEWS):
        return False
    if node.target is aten.expand.default:
        return False
    src = node.args[0]
    if not isinstance(src, fx.Node):
        return False
    s, d = _shape(src), _shape(node)
    return bool(s) and bool(d) and s[-1] == d[-1] and math.prod(s) == math.prod(d)


def alias_chain(node: fx.Node) -> list[fx.Node]:
    """node and the values it aliases (is_alias), down to the stored one."""
    chain = [node]
    while is_alias(chain[-1]):
        chain.append(chain[-1].args[0])
    return chain


def alias_root(node: fx.Node) -> fx.Node:
    return alias_chain(node)[-1]


def _shape(node: fx.Node) -> tuple[int, ...]:
    v = node.meta.get("val")
    return tuple(v.shape) if isinstance(v, torch.Tensor) else ()


#: Reductions an epilogue runs (over the last dim: a row reduction; over every other dim: a column one).
REDUCTIONS = {aten.sum.dim_IntList: "sum", aten.amax.default: "max", aten.logsumexp.default: "logsumexp"}

#: Factories whose value is one number everywhere (epilogue constants).
CONSTANTS = {aten.full.default: 1, aten.scalar_tensor.default: 0}

ARANGES = {aten.arange.default, aten.arange.start, aten.arange.start_step}

#: Ops left to the fallback on purpose, and why.
REFUSED = {
    aten.native_dropout.default: "dropout with p > 0 is random: an epilogue has no seeded RNG (p = 0 and eval "
                                 "mode are the identity and fuse)",
}


def math_problem(node: fx.Node) -> str | None:
    """Why `node` is not element-wise math an epilogue runs (None: it is)."""
    rule = MATH.get(node.target)
    if rule is None:
        return f"{node.target} has no epilogue math"
    out = node.meta.get("val")
    if not isinstance(out, torch.Tensor):
        return f"{node.target} does not produce one tensor"
    if out.dtype not in FLOAT_DTYPES + (torch.bool,):
        return f"{node.target} computes in {out.dtype} (epilogue math is fp32)"
    return rule.check(node)


def reduction(node: fx.Node) -> tuple[str, tuple[int, ...], bool] | None:
    """(op, normalized dims, keepdim) of a supported reduction node, else None."""
    op = REDUCTIONS.get(node.target)
    if op is None:
        return None
    x = node.args[0].meta["val"]
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return None
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    keep = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    return op, tuple(sorted(d % x.dim() for d in dims)), bool(keep)


def constant_value(node: Any) -> float | None:
    """The number a constant-factory node (full, scalar_tensor) holds everywhere, else None."""
    if isinstance(node, fx.Node) and node.op == "call_function" and node.target in CONSTANTS:
        value = node.args[CONSTANTS[node.target]]
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, bool):
            return float(value)
    return None


def arange_length(node: Any) -> int | None:
    """n for a node holding 0, 1, ..., n-1 (arange with start 0 and step 1), else None."""
    if not (isinstance(node, fx.Node) and node.op == "call_function" and node.target in ARANGES):
        return None
    args = list(node.args)
    if node.target is aten.arange.default:
        start, end, step = 0, args[0], 1
    elif node.target is aten.arange.start:
        start, end, step = args[0], args[1], 1
    else:
        start, end, step = args[0], args[1], args[2] if len(args) > 2 else 1
    return end if start == 0 and step == 1 and isinstance(end, int) else None
