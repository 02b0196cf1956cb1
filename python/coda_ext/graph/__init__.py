"""The epilogue-graph IR, its builder, verifier and reference interpreter."""
from .builder import Graph, Value
from .canonical import as_ir, canonicalize
from .interpret import Outputs, interpret
from .verify import verify

__all__ = ["Graph", "Outputs", "Value", "as_ir", "canonicalize", "interpret", "verify"]
