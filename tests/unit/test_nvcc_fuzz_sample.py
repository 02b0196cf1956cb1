"""nvcc-compiles a small fixed sample of fuzz graphs for sm_90a (no GPU needed): three translation
units (three, so that each epilogue's TMA buffers -- tiles, pair tiles, stores -- leave the default
config's mainloop its stages), built in parallel, that together use every node kind the builder
offers (packed pairs included: pair tiles and pair stores of both 16-bit dtypes) and every dtype,
reduction op and cast the emitted C++ tells apart (tests/helpers/fuzz_strategies.py: coverage_cases). The
second and third units read their operands transposed (KernelConfig.major "mn" and "kn"), so the
other mainloop layouts compile too. About five minutes of nvcc on two cores; a warm cache makes it
instant.
"""
from __future__ import annotations

import ctypes
import dataclasses
import os
import pathlib
import shutil

import pytest

import coda_ext as ce
from coda_ext.jit import cache, paths
from tests.helpers import fuzz_strategies as fz


def _missing() -> str | None:
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    if shutil.which("nvcc") is None and not any(h and (pathlib.Path(h) / "bin" / "nvcc").is_file() for h in homes):
        return "nvcc is not on PATH (nor under CUDA_HOME/CUDA_PATH)"
    try:
        paths.cutlass_include_dirs()
    except ce.CompileError as e:
        return f"CUTLASS headers missing: {e}"
    return None


pytestmark = [pytest.mark.nvcc, pytest.mark.skipif(_missing() is not None, reason=str(_missing()))]


@pytest.fixture
def real_nvcc(monkeypatch):
    monkeypatch.delenv("CODA_EXT_NVCC", raising=False)
    monkeypatch.delenv("CODA_EXT_CSRC", raising=False)
    cache.headers_digest.cache_clear()
    paths.nvcc_version.cache_clear()


def test_every_node_kind_compiles(real_nvcc, capsys):
    from coda_ext.runtime import prebuild  # the function (ce.prebuild is rebound by importing its CLI module)

    cases = fz.coverage_cases(3, compact=True, mode="any")
    used = set().union(*(c.features() for c in cases))
    kinds = {k for t in fz.TABLES for i in fz.rows(t) for k in (fz.TABLES[t][i].kind,) + fz.TABLES[t][i].adds}
    assert kinds <= used, f"the sample misses {sorted(kinds - used)}"
    if fz.no_output_graphs():
        assert "no output" in used
    configs = [None] + [dataclasses.replace(ce.DEFAULT_CONFIG, major=m) for m in ("mn", "kn")]
    libs = prebuild([(c.build(), c.dtype, config) for c, config in zip(cases, configs)], jobs=2)
    for lib in libs:
        handle = ctypes.CDLL(lib)
        assert hasattr(handle, "coda_run") and hasattr(handle, "coda_workspace_size")
    with capsys.disabled():
        print(f"\nnvcc sample: {len(cases)} graphs, {sum(len(c.steps) for c in cases)} nodes, operand layouts "
              f"kk, mn and kn, kinds: {', '.join(sorted(kinds))}")


def _wide_epilogue_cooperative():
    """segment_reduce(size=128) makes the epilogue tile (128, 128) on a cooperative 128x256 tile."""
    g = ce.Graph()
    g.output(ce.segment_reduce(g.accumulator(), 128) * g.tile("t", "float32"))
    return g, ce.KernelConfig(tile=(128, 256, 64), schedule="cooperative")


def _wide_epilogue_default_config():
    """On the default config: epilogue tile (64, 128), two fp32 tile loads and an fp32 store."""
    g = ce.Graph()
    acc = g.accumulator()
    g.output(ce.segment_reduce(acc, 128) + g.tile("t1", "float32") + g.tile("t2", "float32"))
    g.store("s", acc, dtype="float32")
    return g, None


def test_regression_epilogue_smem_compiles_or_is_refused(real_nvcc):
    """Each graph either compiles or is refused before nvcc with an UnsupportedError."""
    from coda_ext.runtime import prebuild

    items = []
    for make in (_wide_epilogue_cooperative, _wide_epilogue_default_config):
        g, config = make()
        try:
            ce.kernel_source(g, "bfloat16", config)
        except ce.UnsupportedError:
            continue  # refused with a message: fine
        items.append((g, "bfloat16", config))
    prebuild(items, jobs=2)
