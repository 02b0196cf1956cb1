"""Compiled ops: input checks, output allocation, launch."""
from .op import CompiledOp

__all__ = ["CompiledOp"]
