"""The benchmark entry point's plan (--dry-run needs no GPU): cases, shape presets, configs."""
from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_graphs  # noqa: E402


def test_dry_run_lists_every_case_shape_and_variant(capsys):
    assert bench_graphs.main(["--dry-run", "--cases", "design,swiglu", "--shapes", "256,512,128", "llama",
                              "--configs", "candidates"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 * (1 + len(bench_graphs.SHAPES["llama"]))
    assert lines[0].startswith("design [") and "256x512x128" in lines[0]
    for line in lines:
        assert line.count("coda_") == len(bench_graphs.tuning.CANDIDATES)
        assert "cublas_gemm" in line and "torch_compile" in line and "eager" in line


def test_auto_is_the_default_variant(capsys):
    assert bench_graphs.main(["--dry-run", "--cases", "identity", "--shapes", "256,512,128"]) == 0
    assert "coda_auto" in capsys.readouterr().out


def test_unknown_case_is_an_error():
    with pytest.raises(SystemExit):
        bench_graphs.main(["--dry-run", "--cases", "nope"])


def test_prebuild_items_cover_the_default_cases():
    items = bench_graphs.build_items()
    assert len(items) == len(bench_graphs.DEFAULT_CASES) == len(bench_graphs.graphs.CASES)
    assert all(cfg == "auto" for _, _, cfg in items)


def test_every_case_has_a_goal_and_builds():
    for name, (build, goal) in bench_graphs.graphs.CASES.items():
        assert 1.0 < goal <= 1.04, name
        bench_graphs.ce.emit_source(build(), "bfloat16", bench_graphs.tuning.LARGE)
