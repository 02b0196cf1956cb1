"""The epilogue-graph IR, its builder, verifier and reference interpreter."""
from .builder import Graph, Value
from .interpret import Outputs, interpret
from .verify import verify

__all__ = ["Graph", "Outputs", "Value", "interpret", "verify"]
