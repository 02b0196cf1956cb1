"""oob: which values are provably 0 outside the problem, so a sum reduction may skip bounds tests.

Beyond the problem (rows m >= M or columns n >= N of the last tiles) the epilogue still computes:
TMA zero-fills A, W and tile loads there, so the accumulator and tiles are 0; vector broadcasts
are 0 beyond their own length (CUTLASS fills them with the null default, 0). A row reduction
(over N) sees columns n >= N; a column reduction (over M) sees rows m >= M. If the reduced value
is exactly 0 there and the reduction's identity is 0 (sum, sum of squares), the per-element
bounds test can go. Everything not proven 0 keeps the test.
"""
from __future__ import annotations

from ..graph import ir

#: f(0) == 0 exactly (and f is finite at 0).
_ZERO_PRESERVING = ("neg", "abs", "sqrt", "square", "tanh", "silu", "relu", "gelu_tanh", "gelu_erf", "cast")
#: Leaves that are finite everywhere in the padded tile (so 0 * leaf == 0).
_FINITE_LEAVES = ("accumulator", "tile", "row_vector", "col_vector")
#: Bounded element-wise kinds: finite where their input is (a GELU derivative of a tile that is 0 outside is
#: 0.5 there, so dy · gelu_grad(x) is 0 outside with dy).
_BOUNDED = ("tanh", "sigmoid", "gelu_erf_grad", "gelu_tanh_grad", "cos_turns", "sin_turns")


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
    return zero_outside(graph, node, axis)


def reduction_needs_bounds_check(graph: ir.GraphIR, node: int) -> bool:
    """A row/col reduction needs its per-element bounds test unless its input is 0 beyond the
    problem and its identity is 0."""
    n = graph[node]
    if n.attr("op") not in ("sum", "sumsq"):
        return True
    axis = "cols" if n.kind == "row_reduce" else "rows"
    return not zero_outside(graph, n.inputs[0], axis)
