"""README.md as a new user meets it: the first example runs as pasted (the CPU block here; the GPU
block continues it and names only what is defined), .ci/run runs the README's test command, and
the test session keeps its kernels in a temporary cache and ends with its skip reasons."""
from __future__ import annotations

import ast
import builtins
import importlib.util
import os
import pathlib
import re
import types

import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
CPU_MARK = "# runs anywhere: CPU, no GPU, no nvcc"
GPU_MARK = "# on an SM90 GPU (H100/H200), nvcc on the PATH"


def section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end if end >= 0 else None]


def code_blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.DOTALL)


def first_example(mark: str) -> str:
    blocks = [b for b in code_blocks(section("First example"), "python") if b.startswith(mark)]
    assert len(blocks) == 1, f"README's first example has {len(blocks)} blocks starting {mark!r}"
    return blocks[0]


def test_cpu_example_runs_as_pasted(capsys):
    namespace: dict = {}
    exec(compile(first_example(CPU_MARK), "README.md (first example, CPU)", "exec"), namespace)
    ref, M, N = namespace["ref"], namespace["M"], namespace["N"]
    assert set(ref) == {"out", "pre", "sqsum"}
    assert ref.out.shape == (M, N) and ref.pre.shape == (M, N) and ref.sqsum.shape == (M,)
    A, W, b, r = (namespace[k].float() for k in ("A", "W", "b", "r"))
    pre = A @ W.T + b
    y = torch.nn.functional.silu(pre) * r
    torch.testing.assert_close(ref.pre, pre, rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(ref.sqsum, (y * y).sum(1), rtol=1e-4, atol=1e-2)
    assert "torch.Size([256, 384])" in capsys.readouterr().out


def loaded_names(tree: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def stored_names(tree: ast.AST) -> set[str]:
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def test_gpu_example_continues_the_cpu_one():
    """The GPU block parses and every name it reads is defined by the CPU block, by itself or builtins;
    its inputs go to "cuda" before the op runs."""
    cpu, gpu = ast.parse(first_example(CPU_MARK)), ast.parse(first_example(GPU_MARK))
    undefined = loaded_names(gpu) - stored_names(cpu) - stored_names(gpu) - set(dir(builtins))
    assert not undefined, f"the README's GPU example reads undefined names {sorted(undefined)}"
    text = first_example(GPU_MARK)
    assert text.index('"cuda"') < text.index("op(A, W")
    assert "ce.compile(g" in text and "ce.interpret(g" in text


def readme_test_command() -> str:
    commands = [line.split("#")[0].strip() for block in code_blocks(section("The two commands"), "bash")
                for line in block.splitlines() if "pytest" in line]
    assert len(commands) == 1, commands
    return commands[0]


def test_ci_runs_the_readme_test_command():
    command = readme_test_command()
    assert command == "python -m pytest tests -q"
    ci = (ROOT / ".ci" / "run").read_text()
    assert command in [line.strip() for line in ci.splitlines()]
    assert re.search(r'-e "\.\[test[,\]]', ci)   # pytest and hypothesis come with the test extra, not the package


def test_test_tools_are_an_extra_not_dependencies():
    text = (ROOT / "pyproject.toml").read_text()
    deps = text[text.index("dependencies = ["):text.index("]", text.index("dependencies = ["))]
    assert "pytest" not in deps and "hypothesis" not in deps
    test_extra = re.search(r"^test = \[(.*)\]$", text, re.MULTILINE)
    assert test_extra and "pytest" in test_extra.group(1) and "hypothesis" in test_extra.group(1)


def load_tests_conftest() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("coda_tests_conftest", ROOT / "tests" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_session_cache_is_temporary_unless_set():
    """Regression: the test command wrote its kernels into the user's ~/.cache/coda_ext."""
    cache = pathlib.Path(os.environ["CODA_EXT_CACHE_DIR"])
    default = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache") / "coda_ext"
    assert cache.resolve() != default.resolve()


def test_skip_reasons_are_counted():
    """Regression: the test command printed no skip reasons."""
    report = types.SimpleNamespace
    reports = [report(longrepr=("a.py", 3, "Skipped: no CUDA GPU")) for _ in range(3)]
    reports.append(report(longrepr=("b.py", 9, "nvcc is not on PATH")))
    assert load_tests_conftest().skip_reasons(reports) == [(3, "no CUDA GPU"), (1, "nvcc is not on PATH")]
