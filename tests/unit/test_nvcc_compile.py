"""Compiles ONE emitted kernel translation unit with plain nvcc for sm_90a (no GPU needed):
the swiglu pair-store graph, bf16. About 70-90 s of nvcc on one core."""
from __future__ import annotations

import ctypes
import json
import os
import pathlib
import re
import shutil
import subprocess
import time

import pytest

import coda_ext as ce
from coda_ext.jit import cache, nvcc, paths


def _cutlass_missing() -> str | None:
    try:
        paths.cutlass_include_dirs()
    except ce.CompileError as e:
        return str(e)
    return None


def _nvcc_missing() -> bool:
    """The test runs the real nvcc (CODA_EXT_NVCC is cleared): CUDA_HOME, CUDA_PATH or PATH."""
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    return shutil.which("nvcc") is None and not any(h and (pathlib.Path(h) / "bin" / "nvcc").is_file() for h in homes)


_NO_NVCC = _nvcc_missing()
_NO_CUTLASS = _cutlass_missing()
_NO_NM = shutil.which("nm") is None

pytestmark = [
    pytest.mark.nvcc,
    pytest.mark.skipif(_NO_NVCC, reason="nvcc is not on PATH (nor under CUDA_HOME/CUDA_PATH)"),
    pytest.mark.skipif(_NO_CUTLASS is not None, reason=f"CUTLASS headers missing: {_NO_CUTLASS}"),
    pytest.mark.skipif(_NO_NM, reason="binutils' nm is not installed"),
]


def _swiglu() -> ce.Graph:
    from coda_ext.graphs import swiglu

    return swiglu()


def _symbols(lib: str, *flags: str) -> list[str]:
    out = subprocess.run(["nm", "-D", *flags, lib], capture_output=True, text=True, check=True).stdout
    return [line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()]


def test_compile_swiglu_kernel_sm90a(tmp_path, monkeypatch):
    monkeypatch.setenv("CODA_EXT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CODA_EXT_NVCC", raising=False)
    monkeypatch.delenv("CODA_EXT_CSRC", raising=False)
    cache.headers_digest.cache_clear()
    paths.nvcc_version.cache_clear()

    source = ce.emit_source(_swiglu(), "bfloat16")
    assert "PairGatedStoreTma<Cfg, cutlass::bfloat16_t, scalar::Silu>" in source   # gated_store="tma", the default

    lib = nvcc.build(source, "swiglu bf16 (unit test)", quiet=True)
    entry = cache.entry_dir(cache.cache_key(source))
    assert lib == str(entry / "kernel.so")
    assert pathlib.Path(lib).is_file() and pathlib.Path(lib).stat().st_size > 0
    assert str(tmp_path / "cache") in lib
    meta = json.loads((entry / "meta.json").read_text())
    assert meta["key"]["arch"] == "sm_90a" and meta["compile_seconds"] > 0

    # the plain C entry points are exported ...
    defined = _symbols(lib, "--defined-only")
    assert "coda_run" in defined and "coda_workspace_size" in defined
    handle = ctypes.CDLL(lib)
    assert hasattr(handle, "coda_run") and hasattr(handle, "coda_workspace_size")

    # ... and the library needs neither the CUDA driver at link time nor torch
    undefined = _symbols(lib, "--undefined-only")
    driver = [s for s in undefined if re.match(r"cu[A-Z]", s)]
    assert driver == [], f"undefined CUDA driver symbols: {driver}"
    torchy = [s for s in undefined if re.search(r"c10|at::|torch|pybind|Py[A-Z_]", s)]
    assert torchy == [], f"undefined torch/Python symbols: {torchy}"

    # a second build is a cache hit
    start = time.monotonic()
    again = nvcc.build(source, "swiglu bf16 (unit test)", quiet=True)
    assert again == lib
    assert time.monotonic() - start < 2.0

    # Warm load of the cached op (emit, cache key, dlopen): well under 50 ms.
    start = time.perf_counter()
    op = ce.compile(_swiglu(), "bfloat16")
    warm = time.perf_counter() - start
    assert op.library_path == lib
    assert warm < 0.05, f"warm load took {warm * 1000:.1f} ms"
