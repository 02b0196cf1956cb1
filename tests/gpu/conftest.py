"""GPU suite set-up: every kernel the suite needs is built once, in parallel, before the tests
(never one at a time inside a test), and the torch binding is built alongside."""
from __future__ import annotations

import concurrent.futures
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
