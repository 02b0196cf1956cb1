"""coda_ext: GEMM epilogue fusion for NVIDIA Hopper (SM90).

Build an epilogue graph, compile it onto a fixed SM90 warp-specialized GEMM, call it on
torch tensors; or evaluate the same graph with the PyTorch reference interpreter.
"""
from .config import DEFAULT_CONFIG, KernelConfig
from .errors import CodaError, CompileError, GraphError, LaunchError, UnsupportedError
from .graph import Graph, Outputs, Value, interpret
from .graph.math import (
    abs,  # noqa: A004  (coda_ext.abs mirrors torch.abs)
    add,
    cast,
    cos_turns,
    div,
    eq,
    exp,
    fma,
    ge,
    gelu,
    gelu_grad,
    gt,
    hi16,
    join24,
    le,
    lo8,
    log,
    lt,
    maximum,
    minimum,
    mul,
    ne,
    neg,
    pair_gate,
    pair_swap,
    relu,
    rotate_pairs,
    rsqrt,
    segment_reduce,
    sigmoid,
    silu,
    sin_turns,
    sqrt,
    square,
    sub,
    swiglu_pairs,
    tanh,
    turns,
    where,
)
from .jit import emit_source, kernel_source
from .runtime import compile, prebuild  # noqa: A004  (the public name, as torch.compile)

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_CONFIG", "CodaError", "CompileError", "Graph", "GraphError", "KernelConfig", "LaunchError", "Outputs",
    "UnsupportedError", "Value", "abs", "add", "cast", "compile", "cos_turns", "diagram", "div", "emit_source",
    "eq", "exp", "explain", "fma", "fuse", "ge", "gelu", "gelu_grad", "gt", "hi16", "interpret", "join24",
    "kernel_source", "le", "lo8", "log", "lt", "maximum", "minimum", "mul", "ne", "neg", "pair_gate", "pair_swap",
    "prebuild", "relu", "rotate_pairs", "rsqrt", "segment_reduce", "sigmoid", "silu", "sin_turns", "sqrt", "square",
    "sub", "swiglu_pairs", "tanh", "turns", "where",
]

from . import ops  # noqa: F401  (the ready ops register their torch custom ops; imported last)


def __getattr__(name: str):
    """explain and diagram (coda_ext.analysis) and fuse (coda_ext.fusion, the automatic-fusion compiler)
    load on first use: importing coda_ext stays light."""
    if name in ("explain", "diagram"):
        from . import analysis

        return getattr(analysis, name)
    if name == "fuse":
        from .fusion import fuse

        return fuse
    raise AttributeError(f"module 'coda_ext' has no attribute {name!r}")
