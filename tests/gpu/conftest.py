"""GPU suite set-up: every kernel the suite needs is built once, in parallel, before the tests
(never one at a time inside a test), and the torch binding is built alongside."""
from __future__ import annotations

import concurrent.futures
import gc
import os
import pathlib

import pytest


def pytest_collection_modifyitems(config, items):
    here = pathlib.Path(__file__).parent
    for item in items:
        if here in pathlib.Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.gpu)


@pytest.fixture(scope="session")
def compiled_ops():
    """{(case, dtype): CompiledOp} for every case of cases.py and {(case, dtype, config tag): CompiledOp}
    for cases.config_cases(), built in parallel."""
    import coda_ext as ce
    from coda_ext.jit.binding import load_binding
    from tests.gpu import cases

    keys = [(name, dtype) for name, (_, dtypes) in cases.CASES.items() for dtype in dtypes]
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        binding = pool.submit(load_binding)
        ce.prebuild(cases.build_items(), jobs=os.cpu_count())
        binding.result()
    ops = {(name, dtype): ce.compile(cases.CASES[name][0](), dtype) for name, dtype in keys}
    ops.update({(name, dtype, cfg.tag): ce.compile(cases.CASES[name][0](), dtype, cfg)
                for name, dtype, cfg in cases.config_cases()})
    return ops


@pytest.fixture
def report(capsys):
    """report(line): prints a line past pytest's capture (the measured errors go to the log)."""
    def emit(line: str) -> None:
        with capsys.disabled():
            print(line)
    return emit


#: A test whose end leaves more GPU memory allocated than its start, by more than this, is reported.
LEAK_REPORT_BYTES = 256 << 20


@pytest.fixture(autouse=True)
def gpu_memory_is_given_back(request, capsys):
    """After each test: collect garbage, and report a test that leaves GPU memory allocated (an op or a
    cache that keeps a test's tensors alive would otherwise show up only as a later test's OOM)."""
    import torch

    if not torch.cuda.is_available():
        yield
        return
    gc.collect()
    before = torch.cuda.memory_allocated()
    yield
    gc.collect()
    grown = torch.cuda.memory_allocated() - before
    if grown > LEAK_REPORT_BYTES:
        with capsys.disabled():
            print(f"\nGPU memory kept by {request.node.nodeid}: {grown / 2**20:.0f} MiB "
                  f"(allocated now {torch.cuda.memory_allocated() / 2**30:.2f} GiB)")
