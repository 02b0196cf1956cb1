"""Test selection by what a test needs: `gpu` tests need an SM90 GPU, `nvcc` tests need nvcc
and the CUTLASS headers. Both are skipped where that is missing; the run ends with the skip
reasons and their counts.

Kernels the tests build go to a temporary cache, removed at the end (CODA_EXT_CACHE_DIR, when
set, is used and kept instead: set it to reuse builds across runs)."""
from __future__ import annotations

import collections
import functools
import os
import shutil
import tempfile

import pytest

_TEMP_CACHE: list[str] = []   # the temporary kernel cache this session made (removed at its end)


def pytest_configure(config):
    if not os.environ.get("CODA_EXT_CACHE_DIR"):
        _TEMP_CACHE.append(tempfile.mkdtemp(prefix="coda_ext_test_cache_"))
        os.environ["CODA_EXT_CACHE_DIR"] = _TEMP_CACHE[0]


def pytest_unconfigure(config):
    while _TEMP_CACHE:
        path = _TEMP_CACHE.pop()
        if os.environ.get("CODA_EXT_CACHE_DIR") == path:
            del os.environ["CODA_EXT_CACHE_DIR"]
        shutil.rmtree(path, ignore_errors=True)


def skip_reasons(reports) -> list[tuple[int, str]]:
    """(count, reason) of skipped test reports, most frequent first."""
    counts: collections.Counter = collections.Counter()
    for r in reports:
        reason = r.longrepr[2] if isinstance(r.longrepr, tuple) else str(r.longrepr)
        counts[reason.removeprefix("Skipped: ")] += 1
    return [(n, reason) for reason, n in counts.most_common()]


def pytest_terminal_summary(terminalreporter):
    reasons = skip_reasons(terminalreporter.stats.get("skipped", []))
    if reasons:
        terminalreporter.section("skipped, by reason")
        for n, reason in reasons:
            terminalreporter.write_line(f"{n:6d}  {reason}")


@functools.cache
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


@functools.cache
def nvcc_reason() -> str | None:
    import os

    if not (os.environ.get("CODA_EXT_NVCC") or shutil.which("nvcc") or os.environ.get("CUDA_HOME")):
        return "nvcc is not on PATH"
    from coda_ext.errors import CodaError

    try:
        from coda_ext.jit.paths import cutlass_include_dirs

        cutlass_include_dirs()
    except (ImportError, OSError, CodaError) as e:  # CompileError: headers missing
        return f"CUTLASS headers unavailable: {e}"
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "gpu" in item.keywords and sm90_reason():
            item.add_marker(pytest.mark.skip(reason=sm90_reason()))
        elif "nvcc" in item.keywords and nvcc_reason():
            item.add_marker(pytest.mark.skip(reason=nvcc_reason()))
