"""Writing ATen math into an FX graph, for the rewrite passes: `b.mul(x, 2.0)`, `b.sum(x, [-1], True)`.

Every node added carries its fake value (fx_util.call). Numbers stay numbers (the `.Scalar` overload of
an op where it has one), so an epilogue sees them as constants.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import fx

from .. import fx_util

aten = torch.ops.aten
prims = torch.ops.prims


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


class Emit:
    """Adds nodes at the graph's current insertion point."""

    def __init__(self, graph: fx.Graph, meta: dict[str, Any] | None = None):
        self.graph = graph
        self.meta = meta or {}      # given to every node added (the partitioner tag of the node replaced)

    def __call__(self, target: Any, *args: Any, **kwargs: Any) -> fx.Node:
        node = fx_util.call(self.graph, target, *args, **kwargs)
        node.meta.update(self.meta)
        return node

    def _binary(self, name: str, x: Any, y: Any) -> fx.Node:
        op = getattr(aten, name)
        if _number(y):
            return self(op.Scalar, x, y)
        return self(op.Tensor, x, y)

    def add(self, x: Any, y: Any) -> fx.Node:
        return self._binary("add", x, y)

    def sub(self, x: Any, y: Any) -> fx.Node:
        if _number(x):
            return self(aten.rsub.Scalar, y, x)
        return self._binary("sub", x, y)

    def mul(self, x: Any, y: Any) -> fx.Node:
        return self._binary("mul", x, y)

    def div(self, x: Any, y: Any) -> fx.Node:
        return self._binary("div", x, y)

    def unary(self, op: Any, x: Any) -> fx.Node:
        return self(op.default, x)

    def sum(self, x: Any, dims: list[int], keepdim: bool = False, dtype: torch.dtype | None = None) -> fx.Node:
        if dtype is None:
            return self(aten.sum.dim_IntList, x, list(dims), keepdim)
        return self(aten.sum.dim_IntList, x, list(dims), keepdim, dtype=dtype)

    def to(self, x: Any, dtype: torch.dtype | None) -> Any:
        if dtype is None or fx_util.dtype(x) == dtype:
            return x
        return self(prims.convert_element_type.default, x, dtype)

    def wide(self, x: Any) -> Any:
        """x in fp32 if it is 16-bit (statistics run in fp32, as PyTorch's kernels do), else x."""
        return self.to(x, torch.float32) if fx_util.dtype(x) in (torch.bfloat16, torch.float16) else x

    def const(self, value: float, like: fx.Node, dtype: torch.dtype | None = None) -> fx.Node:
        """A 0-dim tensor holding `value` on like's device (an epilogue constant)."""
        v = fx_util.val(like)
        return self(aten.scalar_tensor.default, value, dtype=dtype or v.dtype, device=v.device)

    def where(self, cond: Any, x: Any, y: Any) -> fx.Node:
        return self(aten.where.self, cond, x, y)
