"""`python -m coda_ext demo` without an SM90 GPU: it interprets the graph and compiles only when
asked (--compile), saying so; with an SM90 GPU it compiles by default."""
from __future__ import annotations

import contextlib

import pytest

import coda_ext as ce
from coda_ext.tools import demo


class Compiled(Exception):
    """ce.compile was called (stands in for a minute of nvcc)."""


@pytest.fixture
def compile_calls(monkeypatch) -> list:
    calls: list = []

    def fake_compile(graph, dtype, *args, **kwargs):
        calls.append(dtype)
        raise ce.CompileError("nvcc stand-in: not built")

    monkeypatch.setattr(ce, "compile", fake_compile)
    return calls


def test_without_gpu_nothing_is_compiled_unless_asked(monkeypatch, capsys, compile_calls):
    """Regression: the demo spent minutes in nvcc building a kernel it then could not run."""
    monkeypatch.setattr(demo, "sm90_problem", lambda: "there is no CUDA GPU here")
    assert demo.main(["--M", "64", "--N", "64", "--K", "64"]) == 0
    out = capsys.readouterr().out
    assert compile_calls == []
    assert "the kernel was not compiled" in out and "python -m coda_ext demo --compile" in out
    assert "sqsum  shape (64,)" in out   # the reference interpreter still ran


def test_compile_flag_compiles_without_gpu(monkeypatch, capsys, compile_calls):
    monkeypatch.setattr(demo, "sm90_problem", lambda: "there is no CUDA GPU here")
    assert demo.main(["--M", "64", "--N", "64", "--K", "64", "--compile"]) == 0
    assert len(compile_calls) == 1
    assert "could not be compiled: nvcc stand-in" in capsys.readouterr().out


def run_as_on_gpu(argv: list[str]) -> None:
    """demo.main as on an SM90 GPU; where there is none, it stops when its inputs go to "cuda"."""
    with contextlib.suppress(RuntimeError, AssertionError):
        demo.main(argv)


def test_gpu_compiles_by_default_and_no_compile_skips(monkeypatch, capsys, compile_calls):
    monkeypatch.setattr(demo, "sm90_problem", lambda: None)
    run_as_on_gpu(["--M", "64", "--N", "64", "--K", "64"])
    assert len(compile_calls) == 1
    run_as_on_gpu(["--M", "64", "--N", "64", "--K", "64", "--no-compile"])
    assert len(compile_calls) == 1
    with pytest.raises(SystemExit):   # the two flags exclude each other
        demo.main(["--compile", "--no-compile"])
