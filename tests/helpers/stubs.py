"""Stand-ins for running a compiled op's checks on the CPU, up to the launch: a kernel library that does
nothing, and CPU tensors that pass for an SM90 GPU's. Pytest fixtures (tests/unit/conftest.py offers them)."""
from __future__ import annotations

import shutil
import subprocess

import pytest
import torch

from coda_ext.runtime import checks


class Launched(Exception):
    """Every check passed: the op would launch now (args: the outputs it would write)."""


@pytest.fixture(scope="session")
def stub_library(tmp_path_factory) -> str:
    """A shared library with coda_run and coda_workspace_size that do nothing: a kernel to load."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler for the stub library")
    d = tmp_path_factory.mktemp("stub")
    (d / "stub.c").write_text("int coda_run(void) { return 1; }\nlong coda_workspace_size(void) { return 0; }\n")
    subprocess.run([cc, "-shared", "-fPIC", str(d / "stub.c"), "-o", str(d / "stub.so")], check=True)
    return str(d / "stub.so")


@pytest.fixture
def cpu_as_gpu(monkeypatch) -> type[Launched]:
    """CPU tensors pass for an SM90 GPU's, and the last check before the launch raises Launched with
    the outputs (returned: the exception class to expect)."""
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: self.device.type == "cpu"))
    monkeypatch.setattr(checks, "require_sm90", lambda device: None)
    real = checks.check_no_overlap

    def last_check(outputs, inputs, given=None, aliases=None):
        real(outputs, inputs, given, aliases)
        raise Launched(outputs)

    monkeypatch.setattr(checks, "check_no_overlap", last_check)
    return Launched
