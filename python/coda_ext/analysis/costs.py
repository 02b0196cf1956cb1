"""What each epilogue node costs: nominal fp32 flops per element and the HBM traffic it causes.

One table keyed by node kind (KIND_COSTS), derived from the registry of node kinds
(graph/kinds.py: each kind's flops and flags). A kind missing from it raises UnsupportedError, so a
node kind cannot be analysed with a silent zero cost.

Flop counts are nominal (1 per add, mul, compare or select, 2 per fma, 4 per transcendental,
composites as the sum of their parts). They are a fraction of a percent of the GEMM's 2K flops per
element at any real K; they matter only for the arithmetic intensity of standalone element-wise
kernels, which stay memory-bound anyway.
"""
from __future__ import annotations

import dataclasses

from ..errors import UnsupportedError
from ..graph import ir
from ..graph.kinds import KINDS

#: Bytes per element of every dtype a tensor of a graph may have.
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "uint8": 1, "int32": 4, "int64": 8}
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


def kind_cost(kind: str) -> KindCost:
    """The cost row of `kind`, from its registry entry (flops; traffic and width from its flags);
    raises UnsupportedError naming the fix for a kind the registry does not have."""
    k = KINDS.get(kind)
    if k is None:
        raise UnsupportedError(
            f"analysis: no cost entry (KIND_COSTS) for node kind {kind!r}: costs come from the registry of "
            "node kinds; add the kind, with its flops per element and flags, to coda_ext/graph/kinds.py")
    if "input" in k.flags:
        hbm = "read"
    elif "reduction" in k.flags:
        hbm = "partials"
    else:
        hbm = "write" if "sink" in k.flags else "none"
    return KindCost(k.flops, hbm, half="pair" in k.flags)


#: The cost of every node kind of the registry.
KIND_COSTS: dict[str, KindCost] = {name: kind_cost(name) for name in KINDS}


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
