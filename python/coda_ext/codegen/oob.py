"""oob: which values are provably 0 outside the problem, so a sum reduction may skip bounds tests.

Beyond the problem (rows m >= M or columns n >= N of the last tiles) the epilogue still computes:
TMA zero-fills A, W and tile loads there, so the accumulator and tiles are 0; vector broadcasts
are 0 beyond their own length (CUTLASS fills them with the null default, 0). A row reduction
(over N) sees columns n >= N; a column reduction (over M) sees rows m >= M. If the reduced value
is exactly 0 there and the reduction's identity is 0 (sum, sum of squares), the per-element
bounds test can go. Everything not proven 0 keeps the test.

A product is 0 there when one factor is 0 and the other finite. Finite: a finite leaf, a bounded function of a
finite value, or a value the padding determines — an element-wise function of leaves that are 0 there and of
constants, evaluated at those values in fp32 (the dSwiGLU's 1 + g(1 - sigmoid(g)) is 1 where g is 0). Such a value
counts as finite only with every intermediate finite, far from overflow (|v| < 2**64) and 0 or far from underflow
(|v| >= 2**-64: the GPU's exp and reciprocal flush subnormals to 0), and without the kinds that are singular at 0
(div, log, rsqrt, sqrt: the GPU's approximate value beside a 0 may be 0 or below it where fp32's is not), so the
GPU's approximate functions cannot make it infinite or NaN.
"""
from __future__ import annotations

import math

import torch

from ..graph import ir
from ..graph.kinds import KINDS

#: f(0) == 0 exactly (and f is finite at 0).
_ZERO_PRESERVING = ("neg", "abs", "sqrt", "square", "tanh", "silu", "relu", "gelu_tanh", "gelu_erf", "cast")
#: Leaves that are finite everywhere in the padded tile (so 0 * leaf == 0).
_FINITE_LEAVES = ("accumulator", "tile", "row_vector", "col_vector")
#: Bounded element-wise kinds: finite where their input is (a GELU derivative of a tile that is 0 outside is
#: 0.5 there, so dy · gelu_grad(x) is 0 outside with dy).
_BOUNDED = ("tanh", "sigmoid", "gelu_erf_grad", "gelu_tanh_grad", "cos_turns", "sin_turns")
#: Element-wise kinds whose value at an element depends on that element's inputs alone (not pair_swap,
#: rotate_pairs or segment_reduce, which read the partner column or the segment: real data beside the padding),
#: evaluated at the padding by their reference semantics.
_EVALUATED = tuple(k for k in KINDS if "compute" in KINDS[k].flags and k not in
                   ("pair_swap", "rotate_pairs", "segment_reduce", "keep_first", "turns",
                    "div", "log", "rsqrt", "sqrt"))
#: The magnitude below which an evaluated value counts as finite on the GPU too.
_FINITE_BOUND = 2.0 ** 64
#: The magnitude of a nonzero evaluated value below which it counts as unknown (flushed to 0 on the GPU).
_TINY_BOUND = 2.0 ** -64


def zero_outside(graph: ir.GraphIR, node: int, axis: str) -> bool:
    """True if `node` is exactly 0 beyond the problem along `axis` ('cols': n >= N, 'rows': m >= M)."""
    n = graph[node]
    k = n.kind
    if k in ("accumulator", "tile", "unpack"):  # TMA fills a (pair) tile with 0 beyond the problem
        return True
    if k == "row_vector":
        return axis == "cols"
    if k == "col_vector":
        return axis == "rows"
    if k == "scalar":
        return n.attr("mode") == "constant" and n.attr("value") == 0.0
    if k in _ZERO_PRESERVING:
        return zero_outside(graph, n.inputs[0], axis)
    if k in ("add", "sub", "max", "min"):
        return all(zero_outside(graph, i, axis) for i in n.inputs)
    if k == "mul":
        a, b = n.inputs
        return (zero_outside(graph, a, axis) and _finite(graph, b, axis)) or \
               (zero_outside(graph, b, axis) and _finite(graph, a, axis))
    if k == "fma":
        a, b, c = n.inputs
        product = (zero_outside(graph, a, axis) and _finite(graph, b, axis)) or \
                  (zero_outside(graph, b, axis) and _finite(graph, a, axis))
        return product and zero_outside(graph, c, axis)
    if n.is_sink:  # pass-through
        return zero_outside(graph, n.inputs[0], axis)
    return False


def _finite(graph: ir.GraphIR, node: int, axis: str) -> bool:
    """Finite beyond the problem: a finite leaf, a constant, a bounded function of a finite value, or a value
    that is 0 there."""
    n = graph[node]
    if n.kind in _FINITE_LEAVES or (n.kind == "scalar" and n.attr("mode") == "constant"):
        return True
    if n.kind in _BOUNDED:
        return _finite(graph, n.inputs[0], axis)
    return zero_outside(graph, node, axis) or padding_value(graph, node, axis) is not None


def padding_value(graph: ir.GraphIR, node: int, axis: str) -> float | None:
    """The value of `node` beyond the problem along `axis` when the padding determines it (its leaves are 0 there
    or constants), evaluated in fp32; None where it does not, or where a value on the way is not finite or not
    below _FINITE_BOUND in magnitude."""
    return _padding_value(graph, node, axis, {})


def _padding_value(graph: ir.GraphIR, node: int, axis: str, memo: dict) -> float | None:
    if node in memo:
        return memo[node]
    n = graph[node]
    k = n.kind
    if k in ("accumulator", "tile", "unpack") or (k == "row_vector" and axis == "cols") or \
            (k == "col_vector" and axis == "rows"):
        value = 0.0
    elif k == "scalar" and n.attr("mode") == "constant":
        value = float(n.attr("value"))
    elif k in _EVALUATED or k == "cast":
        inputs = [_padding_value(graph, i, axis, memo) for i in n.inputs]
        if any(v is None for v in inputs):
            memo[node] = None
            return None
        x = [torch.tensor(v, dtype=torch.float32) for v in inputs]
        value = float(KINDS[k].interpret(None, n, *x).float()) if k != "cast" else \
            float(x[0].to(getattr(torch, n.attr("dtype"))).float())
    else:
        value = math.nan
    ok = math.isfinite(value) and abs(value) < _FINITE_BOUND and (value == 0.0 or abs(value) >= _TINY_BOUND)
    memo[node] = value if ok else None
    return memo[node]


def reduction_needs_bounds_check(graph: ir.GraphIR, node: int) -> bool:
    """A row/col reduction needs its per-element bounds test unless its input is 0 beyond the
    problem and its identity is 0."""
    n = graph[node]
    if n.attr("op") not in ("sum", "sumsq"):
        return True
    axis = "cols" if n.kind == "row_reduce" else "rows"
    return not zero_outside(graph, n.inputs[0], axis)
