"""Ops on compiled kernels: input checks, output allocation, launch, per-shape config dispatch,
the torch custom op, and the public compile/prebuild entry points."""
from .api import compile, expand_items, prebuild  # noqa: A004  (the public name, as torch.compile)
from .op import CompiledOp, kernel_symbols
from .tuned import TunedOp, auto_items

__all__ = ["CompiledOp", "TunedOp", "auto_items", "compile", "expand_items", "kernel_symbols", "prebuild"]
