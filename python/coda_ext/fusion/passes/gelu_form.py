"""GELU's tanh approximation written out as element-wise math, recognised in Dynamo's graph and rewritten as
one call, torch.nn.functional.gelu(x, approximate="tanh"), before AOTAutograd traces it.

Hugging Face's GPT-2 ("gelu_new", NewGELUActivation) computes its activation in Python,
0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))): Dynamo records its eight torch-level operations and AOTAutograd
differentiates each alone, so the joint graph's backward is autograd's chain rule through them (eleven
element-wise nodes reading intermediates of x's size that the forward keeps: 0.5·x, the tanh, 1 + tanh). As
one call the forward is aten.gelu and the backward aten.gelu_backward(dy, x, approximate="tanh"), a function
of x alone: one node each, which an epilogue runs as one functor (dy · gelu_grad(x)). The pass runs on
Dynamo's graph (torch functions, operator's functions and tensor methods) in CodaBackend.__call__; the passes
of the pipeline (run) see the joint graph AOTAutograd makes of its result.

A match is a tanh node t, its argument u and the value y that t feeds: u must be a polynomial in one tensor
x, s·x + s·κ·x³ (s = √(2/π), κ = 0.044715), and y one in x and t, ½·x + ½·x·t, each coefficient within a
relative 1e-6, through the nodes between them: products, sums, differences, integer powers and divisions by
a number (torch.mul, operator.mul, Tensor.mul and the like), with Python numbers as constants. So every
arrangement of the formula matches: either operand order, 0.5·x·(1 + t) or 0.5·(x·(1 + t)), x³ as
torch.pow(x, 3.0), x ** 3 or x·x·x, and HF's FastGELU form x·s·(1 + κ·x·x). Each node between x and y has one
user, inside the match: a formula whose intermediate (the tanh, say) is also read elsewhere stays as written,
as does one of an integer x, and one traced with dynamic=True, where Dynamo makes math.pi a graph input and
computes √(2/π) in the graph (a value the pass cannot read). The gelu call takes y's place in the graph and
y's node meta (Dynamo's example_value: a fake tensor of the same shape and dtype).

For a 16-bit x the written-out form rounds each of its results to x's dtype, the call only its output.
gelu_tanh_form(gm) is a pure function: it returns a new module with the attributes Dynamo gives its module
and its placeholders (_param_name_to_source, _dynamo_source: AOTAutograd reads them to tell the parameters
from the other inputs).
"""
from __future__ import annotations

import math
import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

from .. import fx_util

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
KAPPA = 0.044715
#: Relative tolerance of each coefficient.
RTOL = 1e-6
#: The most nodes one polynomial (u, or y from t) may take, the most users above t searched for y, the
#: highest degree of a term and the highest integer power taken.
MAX_NODES = 32
MAX_CLIMB = 8
MAX_DEGREE = 8
MAX_POWER = 8

#: A polynomial in x and t: {(degree of x, degree of t): coefficient}, no zero coefficients.
Poly = dict[tuple[int, int], float]

MUL = {operator.mul, torch.mul, "mul"}
ADD = {operator.add, torch.add, "add"}
SUB = {operator.sub, torch.sub, "sub"}
DIV = {operator.truediv, torch.div, "div"}
POW = {operator.pow, torch.pow, "pow"}
TANH = {torch.tanh, F.tanh, "tanh"}
ARITH = MUL | ADD | SUB | DIV | POW

#: The positional names of each arithmetic target's operands (kwargs may name them).
_OPERANDS = {torch.pow: ("input", "exponent"), "pow": ("self", "exponent")}


def _kind(node: fx.Node) -> Any:
    """The node's target as the sets above hold it (a method by its name), or None."""
    if node.op == "call_method":
        return node.target if isinstance(node.target, str) else None
    return node.target if node.op == "call_function" else None


def _is(node: Any, kinds: set) -> bool:
    if not isinstance(node, fx.Node):
        return False
    k = _kind(node)
    try:
        return k is not None and k in kinds
    except TypeError:   # an unhashable target
        return False


def _number(a: Any) -> bool:
    return isinstance(a, (int, float)) and not isinstance(a, bool)


def _operands(node: fx.Node) -> tuple[Any, Any, float] | None:
    """(a, b, alpha) of a binary arithmetic node (alpha: torch.add / sub's scale of b), or None where it has
    other arguments (out=, rounding_mode=)."""
    names = _OPERANDS.get(_kind(node), ("self", "other") if node.op == "call_method" else ("input", "other"))
    args = list(node.args)
    kwargs = dict(node.kwargs)
    for name in names[len(args):]:
        if name not in kwargs:
            return None
        args.append(kwargs.pop(name))
    alpha = kwargs.pop("alpha", 1)
    if len(args) != 2 or kwargs or not _number(alpha) or (alpha != 1 and not _is(node, ADD | SUB)):
        return None
    return args[0], args[1], float(alpha)


def _add(p: Poly, q: Poly, scale: float = 1.0) -> Poly:
    out = dict(p)
    for k, c in q.items():
        out[k] = out.get(k, 0.0) + scale * c
    return {k: c for k, c in out.items() if c != 0.0}


def _mul(p: Poly, q: Poly) -> Poly | None:
    out: Poly = {}
    for (a, b), c in p.items():
        for (d, e), f in q.items():
            if a + d + b + e > MAX_DEGREE:
                return None
            out[(a + d, b + e)] = out.get((a + d, b + e), 0.0) + c * f
    return {k: c for k, c in out.items() if c != 0.0}


class _Walk:
    """The polynomial a node computes of `variables` (nodes, each with its monomial) through the arithmetic
    nodes of one user between them; `inside` collects those nodes."""

    def __init__(self, variables: dict[fx.Node, tuple[int, int]]) -> None:
        self.variables = variables
        self.inside: list[fx.Node] = []
        self.memo: dict[fx.Node, Poly | None] = {}

    def poly(self, a: Any, root: bool = False) -> Poly | None:
        if _number(a):
            return {(0, 0): float(a)} if a != 0 else {}
        if not isinstance(a, fx.Node):
            return None
        if a in self.variables:
            return {self.variables[a]: 1.0}
        if a in self.memo:      # read twice by one node (v * v)
            return self.memo[a]
        if not _is(a, ARITH) or not (root or len(a.users) == 1) or len(self.inside) >= MAX_NODES:
            return None
        self.inside.append(a)
        self.memo[a] = p = self._node(a)
        return p

    def _node(self, a: fx.Node) -> Poly | None:
        ops = _operands(a)
        if ops is None:
            return None
        lhs, rhs, alpha = ops
        if _is(a, POW):
            n = round(rhs) if _number(rhs) else -1
            base = self.poly(lhs)
            if base is None or not 0 <= n <= MAX_POWER or abs(rhs - n) > RTOL * max(n, 1):
                return None
            out: Poly | None = {(0, 0): 1.0}
            for _ in range(n):
                out = _mul(out, base) if out is not None else None
            return out
        if _is(a, DIV):
            p = self.poly(lhs)
            return None if p is None or not _number(rhs) or rhs == 0 else {k: c / rhs for k, c in p.items()}
        p, q = self.poly(lhs), self.poly(rhs)
        if p is None or q is None:
            return None
        if _is(a, MUL):
            return _mul(p, q)
        return _add(p, q, alpha if _is(a, ADD) else -alpha)


def _leaves(u: fx.Node) -> set[fx.Node] | None:
    """The nodes u's arithmetic of one user reads (u itself any user count), or None past MAX_NODES."""
    found = fx_util.closure(u, lambda n: _is(n, ARITH) and len(n.users) == 1, MAX_NODES)
    return None if found is None else found[1]


def _close(p: Poly | None, want: Poly) -> bool:
    return p is not None and p.keys() == want.keys() and \
        all(abs(p[k] - c) <= RTOL * abs(c) for k, c in want.items())


INNER: Poly = {(1, 0): SQRT_2_OVER_PI, (3, 0): SQRT_2_OVER_PI * KAPPA}
OUTER: Poly = {(1, 0): 0.5, (1, 1): 0.5}


def _floating(node: fx.Node) -> bool:
    """x is a floating tensor, or of no known value (a graph traced without fake values)."""
    v = node.meta.get("example_value", node.meta.get("val"))
    return v is None or (isinstance(v, torch.Tensor) and v.is_floating_point())


def _match(t: fx.Node) -> tuple[fx.Node, fx.Node, list[fx.Node]] | None:
    """(x, y, the nodes y is computed by from x, y and t included) of the GELU whose tanh is t, or None."""
    if len(t.args) != 1 or t.kwargs or not isinstance(t.args[0], fx.Node) or len(t.users) != 1:
        return None
    u = t.args[0]
    if not _is(u, ARITH) or len(u.users) != 1:
        return None
    leaves = _leaves(u)
    if leaves is None or len(leaves) != 1:
        return None
    (x,) = leaves
    if not _floating(x):
        return None
    inner = _Walk({x: (1, 0)})
    if not _close(inner.poly(u, root=True), INNER):
        return None
    y = next(iter(t.users))
    for _ in range(MAX_CLIMB):
        if not _is(y, ARITH):
            return None
        outer = _Walk({x: (1, 0), t: (0, 1)})
        if _close(outer.poly(y, root=True), OUTER):
            return x, y, outer.inside + [t] + inner.inside
        if len(y.users) != 1:
            return None
        y = next(iter(y.users))
    return None


def _copy(gm: fx.GraphModule) -> fx.GraphModule:
    """fx_util.clone with the attributes Dynamo gives its module (those of the copy's that clone does not set)
    and its placeholders' _dynamo_source."""
    out = fx_util.clone(gm)
    mine = vars(out)
    for k, v in vars(gm).items():
        if k not in mine:
            setattr(out, k, v)
    for a, b in zip(gm.graph.nodes, out.graph.nodes, strict=True):
        if a.op == "placeholder" and hasattr(a, "_dynamo_source"):
            b._dynamo_source = a._dynamo_source
    return out


def gelu_tanh_form(gm: fx.GraphModule) -> fx.GraphModule:
    gm = _copy(gm)
    graph = gm.graph
    erased: set[fx.Node] = set()
    for t in list(graph.nodes):
        if t in erased or not _is(t, TANH):
            continue
        m = _match(t)
        if m is None:
            continue
        x, y, nodes = m
        with graph.inserting_before(y):
            g = graph.call_function(F.gelu, (x,), {"approximate": "tanh"})
        g.meta = dict(y.meta)
        if g.meta.get("source_fn_stack"):
            g.meta["source_fn_stack"] = [*g.meta["source_fn_stack"][:-1], (g.name, F.gelu)]
        y.replace_all_uses_with(g)
        order = {n: i for i, n in enumerate(graph.nodes)}
        for n in sorted(nodes, key=order.__getitem__, reverse=True):
            graph.erase_node(n)
        erased.update(nodes)
    graph.lint()
    gm.recompile()
    return gm
