"""Records the coda_ext custom-op calls a public function makes (shared by the CPU and GPU op tests)."""
from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode


class RecordCustomOps(TorchDispatchMode):
    """Records the coda_ext custom-op calls (op overload, args, kwargs) a public function makes."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "coda_ext":
            self.calls.append((func, args, kwargs or {}))
        return func(*args, **(kwargs or {}))
