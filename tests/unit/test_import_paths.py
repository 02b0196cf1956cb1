"""No Python file of the package, the tests or the benchmarks edits sys.path: tests and benchmarks import
each other as packages from the repository root (pyproject.toml's pytest `pythonpath`, and
`python -m benchmarks.<name>`). The one exception is the prebuild tool loading a user's file the way
`python FILE` runs it, its folder first on sys.path (coda_ext.tools.prebuild.load_items).

And what tests and benchmarks share runs one way: tests/helpers imports neither a benchmark nor a test
module (benchmarks import tests.helpers).

Read with the standard library's `ast`: nothing is imported or run."""
from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
FOLDERS = ("python", "tests", "benchmarks")
#: (file, function) allowed to put a folder on sys.path, and why
ALLOWED = {("python/coda_ext/tools/prebuild.py", "load_items"): "a user's file imports its siblings, as `python FILE`"}
#: list methods that change sys.path in place
MUTATORS = {"insert", "append", "extend", "remove", "pop", "clear", "reverse", "sort", "__setitem__", "__iadd__"}


def sys_path_edits(source: str, filename: str = "<string>") -> list[tuple[int, str | None, str]]:
    """(line, enclosing function or None, what) of every edit of sys.path in `source`: a call of a list
    method on it, an assignment to it or to an item or slice of it (plain, augmented, annotated), a
    deletion of an item, `from sys import path`, and site.addsitedir()."""
    tree = ast.parse(source, filename)
    sys_names = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.Import)
                 for a in n.names if a.name == "sys"}
    site_names = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.Import)
                  for a in n.names if a.name == "site"}

    def is_sys_path(node: ast.AST) -> bool:
        if isinstance(node, ast.Subscript):
            node = node.value
        return (isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
                and node.value.id in sys_names)

    found: list[tuple[int, str | None, str]] = []

    def visit(node: ast.AST, function: str | None) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name
        what = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in MUTATORS and is_sys_path(node.func.value):
                what = f"sys.path.{node.func.attr}()"
            elif node.func.attr == "addsitedir" and isinstance(node.func.value, ast.Name) \
                    and node.func.value.id in site_names:
                what = "site.addsitedir()"
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            if any(is_sys_path(t) for t in targets):
                what = f"{type(node).__name__.lower()} of sys.path"
        elif isinstance(node, ast.ImportFrom) and node.module == "sys" and any(a.name == "path" for a in node.names):
            what = "from sys import path"
        if what:
            found.append((node.lineno, function, what))
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, None)
    return found


def python_files() -> list[pathlib.Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


def test_the_scan_finds_every_way_of_editing_sys_path():
    source = """
import sys
import sys as system
import site
from sys import path

sys.path.insert(0, "a")
system.path.append("b")

def f():
    sys.path.extend(["c"])
    sys.path[:0] = ["d"]
    sys.path += ["e"]
    sys.path = ["f"]
    del sys.path[0]
    site.addsitedir("g")

print(sys.path, sys.path[0], "sys.path.insert(0, 'x')")
"""
    assert sys_path_edits(source) == [
        (5, None, "from sys import path"), (7, None, "sys.path.insert()"), (8, None, "sys.path.append()"),
        (11, "f", "sys.path.extend()"), (12, "f", "assign of sys.path"), (13, "f", "augassign of sys.path"),
        (14, "f", "assign of sys.path"), (15, "f", "delete of sys.path"), (16, "f", "site.addsitedir()")]


def test_no_file_edits_sys_path_but_the_prebuild_tools_user_file_loading():
    files = python_files()
    assert len(files) > 50 and {f.relative_to(ROOT).parts[0] for f in files} == set(FOLDERS)
    edits = {(str(f.relative_to(ROOT)), function, line, what)
             for f in files for line, function, what in sys_path_edits(f.read_text(), str(f))}
    unexpected = sorted(e for e in edits if e[:2] not in ALLOWED)
    assert not unexpected, ("sys.path edits (import the tests and benchmarks as packages from the repository "
                            "root instead: `from tests.helpers import rand`, `python -m benchmarks.<name>`):\n"
                            + "\n".join(f"  {path}:{line} ({function}): {what}" for path, function, line, what
                                        in unexpected))
    assert {e[:2] for e in edits} == set(ALLOWED), "an exception in ALLOWED no longer edits sys.path: drop it"


def test_tests_helpers_import_neither_benchmarks_nor_test_modules():
    """One direction: benchmarks may import tests.helpers; tests/helpers never imports back."""
    bad = []
    for f in sorted((ROOT / "tests" / "helpers").glob("*.py")):
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            bad += [f"{f.name}: {n}" for n in names if n.split(".")[0] == "benchmarks"
                    or (n.startswith("tests.") and not n.startswith("tests.helpers"))]
    assert not bad
