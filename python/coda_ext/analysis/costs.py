"""What each epilogue node costs: nominal fp32 flops per element and the HBM traffic it causes.

One table keyed by node kind (KIND_COSTS). A kind missing from it raises UnsupportedError, so a
new node kind cannot be analysed with a silent zero cost: add its row here.

Flop counts are nominal (1 per add, mul, compare or select, 2 per fma, 4 per transcendental,
composites as the sum of their parts). They are a fraction of a percent of the GEMM's 2K flops per
element at any real K; they matter only for the arithmetic intensity of standalone element-wise
kernels, which stay memory-bound anyway.
"""
from __future__ import annotations

import dataclasses

from ..errors import UnsupportedError
from ..graph import ir

#: Bytes per element of every dtype a tensor of a graph may have.
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "int32": 4, "int64": 8}
#: exp, log, sqrt, rsqrt, tanh, sin, cos: one special-function op plus range reduction.
TRANSCENDENTAL = 4.0
#: Per element reduced, by reduction op (logsumexp online: max, subtract, exp, add).
REDUCE_FLOPS = {"sum": 1.0, "max": 1.0, "sumsq": 2.0, "logsumexp": 7.0}


@dataclasses.dataclass(frozen=True)
class KindCost:
    """flops: per element of the node's result (reductions: per element reduced, by op; pair ops:
    per half-width result element, its activation's flops plus the product).
    hbm: the traffic of the node in the fused kernel — "none" (on chip), "read" (an input the kernel
    loads), "write" (a tensor the kernel stores), "partials" (fp32 partials per tile, finished by the
    finalize kernel). half: the result is M x N/2 (a pair op)."""

    flops: float = 0.0
    hbm: str = "none"
    half: bool = False


_ONE = ("neg", "abs", "relu", "square", "cast", "add", "sub", "mul", "div", "max", "min", "where") + ir.COMPARE_KINDS

KIND_COSTS: dict[str, KindCost] = {
    # leaves: the accumulator and computed leaves are on chip (the operands are counted apart)
    "accumulator": KindCost(), "scalar": KindCost(), "col_index": KindCost(),
    "row_vector": KindCost(hbm="read"), "col_vector": KindCost(hbm="read"), "tile": KindCost(hbm="read"),
    "pair_tile": KindCost(hbm="read"),                # (M, 2N) 16-bit, read as N 32-bit pairs
    # element-wise math
    **{k: KindCost(1.0) for k in _ONE},
    "fma": KindCost(2.0),
    **{k: KindCost(TRANSCENDENTAL) for k in ("exp", "log", "sqrt", "rsqrt", "tanh")},
    "sigmoid": KindCost(TRANSCENDENTAL + 2),          # 1 / (1 + exp(-x))
    "silu": KindCost(TRANSCENDENTAL + 3),             # x * sigmoid(x)
    "gelu_tanh": KindCost(TRANSCENDENTAL + 7),        # 0.5 x (1 + tanh(c (x + 0.044715 x^3)))
    "gelu_erf": KindCost(TRANSCENDENTAL + 5),         # 0.5 x (1 + erf(x / sqrt 2))
    "pair_swap": KindCost(0.0),                       # a register shuffle
    "unpack": KindCost(1.0),                          # a shift or mask, and a widening
    "pack": KindCost(2.0),                            # two roundings and a shift-or
    "rotate_pairs": KindCost(TRANSCENDENTAL + 3),     # a cos and a sin per pair; two products and a sum
    "turns": KindCost(5.0),                           # product, FMA error recovery, fractional part
    "cos_turns": KindCost(TRANSCENDENTAL + 1), "sin_turns": KindCost(TRANSCENDENTAL + 1),
    # on-chip reductions and pair ops (flops by op / activation: node_flops)
    "segment_reduce": KindCost(),
    "pair_gate": KindCost(half=True),
    # sinks
    "output": KindCost(hbm="write"), "store": KindCost(hbm="write"),
    "pair_gated_store": KindCost(hbm="write", half=True),
    "pair_store": KindCost(hbm="write"),              # (M, 2N): two values per column
    "row_reduce": KindCost(hbm="partials"), "col_reduce": KindCost(hbm="partials"),
    "keep_first": KindCost(),
}


def kind_cost(kind: str) -> KindCost:
    """The cost row of `kind`; raises UnsupportedError naming the fix for a kind without one."""
    try:
        return KIND_COSTS[kind]
    except KeyError:
        raise UnsupportedError(
            f"analysis: no cost entry for node kind {kind!r}; add its flops per element and HBM traffic to "
            "KIND_COSTS in coda_ext/analysis/costs.py") from None


def node_flops(node: ir.Node) -> float:
    """Nominal flops per element of `node`'s result (per element reduced for reductions)."""
    cost = kind_cost(node.kind)
    if node.kind in ("row_reduce", "col_reduce", "segment_reduce"):
        return REDUCE_FLOPS[node.attr("op")]
    if node.kind in ("pair_gate", "pair_gated_store"):
        return kind_cost(node.attr("act")).flops + 1.0
    return cost.flops


def dtype_bytes(dtype: str) -> int:
    return DTYPE_BYTES[dtype]
