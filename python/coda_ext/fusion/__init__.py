"""Automatic fusion: a model's training graph, partitioned into GEMM-epilogue kernels.

    model = coda_ext.fusion.fuse(model)                # or torch.compile(model, backend="coda")
    loss = model(x).loss; loss.backward()              # the first call compiles
    print(coda_ext.fusion.report_of(model))            # what was fused, the bytes kept on chip, the rest
    backend = coda_ext.fusion.plan(model, kwargs=batch) # the same, traced only: nothing compiles or runs

Inside, one way: frontend (torch.compile backend, AOTAutograd joint graph) -> passes (decompositions,
constant folding, CSE, transposes into operand layouts) -> analyze (the partitioner's graph) ->
partition (an ILP over it, the IO model as its cost) -> lowering (coda_ext graphs, one kernel call each)
-> report. docs/fusion.md describes it. Importing this package registers the "coda" backend.
"""
from .cost import CostModel
from .frontend import (
           CodaBackend,
           Options,
           coda_backend,
           fuse,
           fuse_graph,
           kernel_items,
           plan,
           register,
           report_of,
)
from .report import FusionReport, GraphReport

register()

__all__ = ["CodaBackend", "CostModel", "FusionReport", "GraphReport", "Options", "coda_backend", "fuse", "fuse_graph",
           "kernel_items", "plan", "register", "report_of"]
