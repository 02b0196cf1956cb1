"""Triton kernels of coda_ext.ops on the CPU: whether triton imports here, and a script run under Triton's
interpreter (TRITON_INTERPRET=1 is read once, when triton is imported: hence a fresh process)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def triton_importable() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


#: Marks a test that needs triton (CI's CPU torch has none; the GPU suite runs the kernels on the device).
needs_triton = pytest.mark.skipif(not triton_importable(), reason="triton is not installed (CUDA builds of torch "
                                                                  "bring it)")


def run_interpreted(script: str) -> None:
    """Runs `script` (Python; the repository and its python/ folder on sys.path) under Triton's interpreter and
    asserts it ends by printing "ok"."""
    head = f"import sys\nsys.path[:0] = {[ROOT, os.path.join(ROOT, 'python')]!r}\n"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", head + script], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def assert_available_is_a_dynamo_constant(module, monkeypatch) -> None:
    """module.available() (a Triton kernel module of coda_ext.ops) inside a fullgraph trace: Dynamo runs it (its
    kernel import, here of json, would break the graph if traced) and keeps the result as a constant."""
    import importlib

    import torch

    monkeypatch.setattr(module, "_op", object())
    monkeypatch.setattr(module, "_kernel", lambda: importlib.import_module("json"))

    @torch.compile(backend="eager", fullgraph=True)
    def f(x):
        return x + 1 if module.available() else x - 1

    assert torch.equal(f(torch.ones(3)), torch.full((3,), 2.0))
