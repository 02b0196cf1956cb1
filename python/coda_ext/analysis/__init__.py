"""The IO/roofline model of epilogue graphs and of a Transformer block.

For a graph at a shape (M, N, K): the HBM bytes per tensor, FLOPs, launches and a time lower bound
of the fused coda_ext kernel, of torch.compile's GEMM + one fused kernel, and of eager PyTorch.

    print(coda_ext.explain(g, torch.bfloat16, shape=(16384, 6144, 4096), config="auto"))
    coda_ext.diagram(g, torch.bfloat16, (16384, 6144, 4096), "graph.svg")
    python -m coda_ext.analysis                      # a Llama layer, forward + backward (block.py)

Layers: costs (per node kind) -> roofline (GPUs, kernels, time) and schedule (operand re-reads)
-> model (the three kernel sequences of a graph) -> explain, diagram, block; fusion_chart draws the
report of automatic fusion (coda_ext.fuse).
"""
from .costs import KIND_COSTS, KindCost
from .diagram import diagram
from .explain import Explanation, explain
from .fusion_chart import fusion_chart
from .model import Model, io_model
from .roofline import GPU, GPUS

__all__ = ["GPU", "GPUS", "KIND_COSTS", "Explanation", "KindCost", "Model", "diagram", "explain", "fusion_chart",
           "io_model"]
