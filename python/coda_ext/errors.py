"""The exceptions coda_ext raises. Each message names the node or argument and the fix."""
from __future__ import annotations


class CodaError(Exception):
    """Base class of every coda_ext error."""


class GraphError(CodaError, ValueError):
    """The epilogue graph is malformed (wrong kinds, unused inputs, cycles, ...)."""


class UnsupportedError(GraphError):
    """The graph is well formed but asks for something coda_ext cannot emit."""


class CompileError(CodaError, RuntimeError):
    """nvcc (or the torch binding build) failed. Carries the source and log paths."""

    def __init__(self, message: str, source_path: str | None = None, log_path: str | None = None,
                 log_tail: str = ""):
        self.source_path = source_path
        self.log_path = log_path
        self.log_tail = log_tail
        parts = [message]
        if source_path:
            parts.append(f"source: {source_path}")
        if log_path:
            parts.append(f"log: {log_path}")
        if log_tail:
            parts.append("last lines of the log:\n" + log_tail)
        super().__init__("\n".join(parts))


class LaunchError(CodaError, RuntimeError):
    """The kernel refused the problem (CUTLASS can_implement) or a CUDA launch failed."""
