"""Graph -> Graph passes, one pure function per file, and the pipeline that orders them."""
from __future__ import annotations

from ..graph import ir
from ..graph.canonical import canonicalize
from .fold_square_reduce import fold_square_reduce
from .lower_pair_stores import lower_pair_stores
from .prune import prune
from .resolve_dtypes import resolve_dtypes
from .tanh_sigmoid import tanh_sigmoid


def lower(graph: ir.GraphIR, dtype: str) -> ir.GraphIR:
    """The pipeline from a verified, canonical graph to the graph the emitter takes."""
    graph = resolve_dtypes(graph, dtype)   # every input/store gets a concrete dtype
    graph = tanh_sigmoid(graph)            # 1 + tanh, 1 - tanh² in the sigmoid's fewer instructions
    graph = fold_square_reduce(graph)      # before lowering: sees reduce(sum, x*x)
    graph = lower_pair_stores(graph)       # store(pair_gate(x)) -> one project node
    return canonicalize(graph)             # rewrites may create new duplicates; renumber


__all__ = ["canonicalize", "fold_square_reduce", "lower", "lower_pair_stores", "prune", "resolve_dtypes",
           "tanh_sigmoid"]
