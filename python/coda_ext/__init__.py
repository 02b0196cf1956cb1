"""coda_ext: GEMM epilogue fusion for NVIDIA Hopper (SM90).

Build an epilogue graph, compile it onto a fixed SM90 warp-specialized GEMM, call it on
torch tensors; or evaluate the same graph with the PyTorch reference interpreter.
"""
from .compile import compile, emit_source, kernel_source, prebuild  # noqa: A004
from .config import DEFAULT_CONFIG, KernelConfig
from .errors import CodaError, CompileError, GraphError, LaunchError, UnsupportedError
from .graph import Graph, Outputs, Value, interpret
from .graph.math import (
    abs, add, cast, div, exp, fma, gelu, log, maximum, minimum, mul, neg, pair_gate, relu, rsqrt, sigmoid,
    silu, sqrt, square, sub, swiglu_pairs, tanh,
)

__version__ = "0.1.0"

__all__ = [
    "CodaError", "CompileError", "DEFAULT_CONFIG", "Graph", "GraphError", "KernelConfig", "LaunchError",
    "Outputs", "UnsupportedError", "Value", "abs", "add", "cast", "compile", "div", "emit_source", "exp",
    "fma", "gelu", "interpret", "kernel_source", "log", "maximum", "minimum", "mul", "neg", "pair_gate",
    "prebuild", "relu", "rsqrt", "sigmoid", "silu", "sqrt", "square", "sub", "swiglu_pairs", "tanh",
]
