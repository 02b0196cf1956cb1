"""benchmarks/common.py: results files are named by the GPU they were measured on (h100, h200, …), so an
H200's numbers never land in a committed *_h100 file (no GPU needed)."""
from __future__ import annotations

import pytest

from benchmarks import common, goals


def test_gpu_tag_is_the_gpu_model():
    assert common.gpu_tag("NVIDIA H200") == "h200"
    assert common.gpu_tag("NVIDIA H100 80GB HBM3") == "h100"
    assert common.gpu_tag(None) == "cpu"
    assert common.gpu_tag("h200") == "h200"   # a tag is its own tag (goals --gpu)
    assert common.gpu_tag("NVIDIA H100 PCIe") == "h100_pcie" and common.gpu_tag("NVIDIA H100 NVL") == "h100_nvl"
    assert common.gpu_tag("NVIDIA GH200 480GB") == "gh200"


def test_results_path_is_named_by_the_gpu():
    assert common.results_path("ops", gpu="NVIDIA H200").name == "ops_h200.json"
    assert common.results_path("sanitizer", ".log", gpu="NVIDIA H100 80GB HBM3") == \
        common.RESULTS / "sanitizer_h100.log"


def test_results_path_defaults_to_the_current_device(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    assert common.results_path("graphs").name == "graphs_h200.json"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert common.results_path("graphs").name == "graphs_cpu.json"


def test_goals_reads_the_files_of_its_gpu_tag(capsys):
    with pytest.raises(SystemExit):   # no results of this made-up GPU: both files reported missing
        goals.main(["--gpu", "zz9"])
    err = capsys.readouterr().err
    assert "graphs_zz9.json not found" in err and "ops_zz9.json not found" in err


def test_gpu_spec_reads_device_names():
    """The IO model's GPU from the name a device reports (regression: 'NVIDIA H200' was unknown, so the
    fusion cost priced bytes at an H100's bandwidth on an H200)."""
    from coda_ext.analysis.roofline import current_gpu, gpu_spec

    assert gpu_spec("NVIDIA H200").name == "H200"
    assert gpu_spec("NVIDIA H100 80GB HBM3").name == "H100 SXM"
    assert gpu_spec("h100 sxm").name == "H100 SXM"
    assert current_gpu() == "H100 SXM"   # no GPU here: the default
    with pytest.raises(ValueError, match="unknown GPU"):
        gpu_spec("NVIDIA A100-SXM4-80GB")


def test_results_name_the_commit_and_whether_the_tree_differs_from_it(tmp_path, monkeypatch):
    """A results file records `git rev-parse HEAD`; where the tracked files differ from that commit (uncommitted
    changes, or a tree copied to a machine with stale git metadata) it says so ("+modified"): such numbers are
    not that commit's. $CODA_COMMIT overrides both."""
    import subprocess

    from benchmarks import common

    def git(*args):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path,
                              capture_output=True, text=True, check=True).stdout.strip()

    git("init", "-q")
    (tmp_path / "a.txt").write_text("one\n")
    git("add", "a.txt")
    git("commit", "-q", "-m", "first")
    sha = git("rev-parse", "HEAD")
    monkeypatch.delenv("CODA_COMMIT", raising=False)
    monkeypatch.delenv("CODA_BENCH_COMMIT", raising=False)
    monkeypatch.setattr(common, "HERE", tmp_path)
    assert common.commit() == sha
    (tmp_path / "untracked.txt").write_text("results\n")   # untracked files do not count
    assert common.commit() == sha
    (tmp_path / "a.txt").write_text("two\n")
    assert common.commit() == sha + "+modified"
    monkeypatch.setenv("CODA_COMMIT", "abc1234")
    assert common.commit() == "abc1234"
