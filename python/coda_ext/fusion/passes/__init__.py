"""Graph passes of the fusion compiler, each a pure function GraphModule -> GraphModule, and the
pipeline that runs them in order (run)."""
from __future__ import annotations

from torch import fx

from .cse import cse
from .decompose import decompose
from .fold import fold
from .layout import GEMM, layout

PIPELINE = (decompose, fold, cse, layout)


def run(gm: fx.GraphModule) -> fx.GraphModule:
    """decompose -> fold -> cse -> layout."""
    for p in PIPELINE:
        gm = p(gm)
    return gm


__all__ = ["GEMM", "PIPELINE", "cse", "decompose", "fold", "layout", "run"]
