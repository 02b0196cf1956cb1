"""Test selection by what a test needs: `gpu` tests need an SM90 GPU, `nvcc` tests need nvcc
and the CUTLASS headers. Both are skipped, with the reason, where that is missing."""
from __future__ import annotations

import functools
import shutil

import pytest


@functools.lru_cache(maxsize=None)
def sm90_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU on this machine (coda_ext kernels need an SM90 GPU: H100/H200)"
    cap = torch.cuda.get_device_capability()
    if cap != (9, 0):
        return f"{torch.cuda.get_device_name()} is compute capability {cap[0]}.{cap[1]}, not SM90"
    return None


@functools.lru_cache(maxsize=None)
def nvcc_reason() -> str | None:
    import os

    if not (os.environ.get("CODA_EXT_NVCC") or shutil.which("nvcc") or os.environ.get("CUDA_HOME")):
        return "nvcc is not on PATH"
    try:
        from coda_ext.jit.paths import cutlass_include_dirs

        cutlass_include_dirs()
    except Exception as e:  # CompileError: headers missing
        return f"CUTLASS headers unavailable: {e}"
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "gpu" in item.keywords and sm90_reason():
            item.add_marker(pytest.mark.skip(reason=sm90_reason()))
        elif "nvcc" in item.keywords and nvcc_reason():
            item.add_marker(pytest.mark.skip(reason=nvcc_reason()))
