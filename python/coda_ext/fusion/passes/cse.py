"""Common subexpressions: a pure call with the same target and arguments as an earlier one is replaced
by it (AOTAutograd's joint graphs repeat transposes, views and conversions). Random ops and ops that
mutate are never merged. cse(gm) is a pure function."""
from __future__ import annotations

from typing import Any

from torch import fx

from .. import fx_util


def _key(x: Any) -> Any:
    """A hashable form of an argument (lists become tuples, nodes stay nodes)."""
    if isinstance(x, (list, tuple)):
        return (type(x).__name__,) + tuple(_key(y) for y in x)
    if isinstance(x, dict):
        return tuple(sorted((k, _key(v)) for k, v in x.items()))
    if isinstance(x, bool):
        return ("bool", x)        # True == 1 in Python, not in a schema
    if isinstance(x, float):
        return ("float", repr(x))   # 0.0 and -0.0 differ
    return x


def cse(gm: fx.GraphModule) -> fx.GraphModule:
    gm = fx_util.clone(gm)
    seen: dict[Any, fx.Node] = {}
    for node in list(gm.graph.nodes):
        if not fx_util.is_pure(node):
            continue
        try:
            key = (node.target, _key(node.args), _key(node.kwargs))
            hash(key)
        except TypeError:
            continue
        first = seen.setdefault(key, node)
        if first is not node:
            fx_util.replace(node, first)
            gm.graph.erase_node(node)
    return fx_util.finish(gm)
