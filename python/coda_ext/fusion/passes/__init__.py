"""Graph passes of the fusion compiler, each a pure function GraphModule -> GraphModule, and the
pipeline that runs them in order (run) on AOTAutograd's joint graph. gelu_tanh_form runs before, on Dynamo's
graph (frontend.CodaBackend); merge_gemms after a first partition, on the GEMMs it left plain (frontend.fuse_graph)."""
from __future__ import annotations

from collections.abc import Collection
from typing import Any

from torch import fx

from .cse import cse
from .decompose import decompose
from .fold import fold
from .gelu_form import gelu_tanh_form
from .gelu_save import gelu_grad_forward
from .hmerge import merge_gemms
from .layout import GEMM, layout
from .norm_fold import norm_fold
from .norm_stats import norm_stats
from .remat import remat

PIPELINE = (decompose, norm_stats, fold, cse, gelu_grad_forward, layout, norm_fold, remat)


def run(gm: fx.GraphModule, target: str = "interpret", unfolded: Collection[str] = (), cost: Any = None
        ) -> fx.GraphModule:
    """decompose (for `target`'s kernel) -> norm_stats -> fold -> cse -> gelu_grad_forward -> layout -> norm_fold
    (for `target`'s kernel and the cost model `cost`, leaving the layer norms named in `unfolded` as they are)
    -> remat."""
    for p in PIPELINE:
        if p is norm_fold:
            gm = norm_fold(gm, target, unfolded, cost)
        else:
            gm = decompose(gm, target) if p is decompose else p(gm)
    return gm


__all__ = ["GEMM", "PIPELINE", "cse", "decompose", "fold", "gelu_grad_forward", "gelu_tanh_form", "layout",
           "merge_gemms", "norm_fold", "norm_stats", "remat", "run"]
