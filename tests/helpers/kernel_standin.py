"""The fused impl of coda_ext.models and coda_ext.hf on the CPU, with a stand-in for every kernel
launch: each launch of an "auto" op (runtime.TunedOp) records the kernel it would run -- the
config it picks for the shape as on a GPU, and that kernel's source -- and computes its outputs
with the graph's reference interpreter. So a test learns which kernels a training step launches
without a GPU, from the ops' own dispatch. Pytest fixture (tests/unit/conftest.py offers it)."""
from __future__ import annotations

import collections
import dataclasses
import importlib

import pytest
import torch

from coda_ext.graph.interpret import Outputs, interpret
from coda_ext.jit import kernel_source
from coda_ext.runtime import checks
from coda_ext.runtime.tuned import TunedOp

#: Modules that import coda_ext.models.functions.resolve_impl by name (the fused impl is refused
#: for CPU tensors there; the stand-in runs it).
IMPL_USERS = ("coda_ext.models.llama", "coda_ext.hf.llama")


@dataclasses.dataclass
class Launches:
    labels: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # kernel label -> launches
    sources: set = dataclasses.field(default_factory=set)   # their kernel sources (one cache entry each)

    def clear(self) -> None:
        self.labels.clear()
        self.sources.clear()


@pytest.fixture
def kernel_standin(monkeypatch) -> Launches:
    """CPU tensors run the fused impl; every kernel launch is recorded (returned) and interpreted."""
    launches = Launches()

    def launch(self, A, W, inputs, out, M, N, aliases=None):
        tensors = {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}
        checks.check_no_overlap(out, {"A": A, "W": W, **tensors}, aliases=aliases)   # as the launch checks
        config = self.choose(A, W, inputs, "stand-in")   # the tuning memory, else the heuristic: as on a GPU
        ks = kernel_source(self.graph, self.dtype_name, config)
        launches.labels[ks.label] += 1
        launches.sources.add(ks.source)
        got = interpret(self.graph, A, W, **inputs)
        result = Outputs()
        for name in self.output_names:
            shape, dtype = self.output_spec(name, M, N)
            t = out[name] if name in out else torch.empty(shape, dtype=dtype, device=A.device)
            result[name] = t.copy_(got[name].reshape(shape))
        return result

    def fused(impl: str, x: torch.Tensor) -> str:
        return "fused" if impl in ("auto", "fused") else impl

    monkeypatch.setattr(TunedOp, "launch", launch)
    for name in IMPL_USERS:
        try:
            module = importlib.import_module(name)
        except ImportError:   # coda_ext.hf without transformers
            continue
        monkeypatch.setattr(module, "resolve_impl", fused)
    return launches
