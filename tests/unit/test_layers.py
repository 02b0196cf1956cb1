"""The package's floors run one way: every module of python/coda_ext imports only from its own floor
or the floors below it, and the import graph has no circle (module-level and lazy imports alike).

The imports are read with the standard library's `ast`, so the check needs neither torch nor an
import of the package. docs/architecture.md describes the floors."""
from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "python" / "coda_ext"

#: Floors, bottom first: a module may import its own floor and any floor below it, never above.
#: Each entry is a top-level module or subpackage of coda_ext ("" is the package's __init__).
FLOORS: tuple[tuple[str, ...], ...] = (
    ("errors",),
    ("config",),
    ("graph",),
    ("graphs", "passes"),
    ("codegen",),
    ("jit",),
    ("tuning",),
    ("runtime",),
    ("analysis",),
    ("ops",),
    ("models",),
    ("hf",),
    ("fusion",),
    ("",),
    ("tools", "__main__"),
)
FLOOR = {room: level for level, rooms in enumerate(FLOORS) for room in rooms}


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: pathlib.Path) -> set[str]:
    """Every coda_ext module `path` imports, at any depth of its body (lazy imports count)."""
    name = module_name(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("coda_ext"):
                continue
            for alias in node.names:   # `from . import ops` imports the submodule coda_ext.ops
                sub = f"{target}.{alias.name}"
                found.add(sub if _exists(sub) else target)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "coda_ext")
    found.discard(name)
    return found


def _exists(module: str) -> bool:
    rel = pathlib.Path(*module.split(".")[1:])
    return (PACKAGE / rel).with_suffix(".py").exists() or (PACKAGE / rel / "__init__.py").exists()


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def import_graph() -> dict[str, set[str]]:
    return {module_name(p): imports_of(p) for p in sorted(PACKAGE.rglob("*.py"))}


def test_every_room_has_a_floor():
    rooms = {room(m) for m in import_graph()}
    assert rooms <= set(FLOOR), f"rooms without a floor in FLOORS: {sorted(rooms - set(FLOOR))}"


def test_no_import_runs_up_a_floor():
    upward = [f"{m} (floor {FLOOR[room(m)]}) imports {d} (floor {FLOOR[room(d)]})"
              for m, deps in import_graph().items() for d in sorted(deps)
              if FLOOR[room(d)] > FLOOR[room(m)]]
    assert not upward, "imports that run up a floor:\n" + "\n".join(upward)


def test_no_library_module_imports_the_package_root():
    """Only the tools (and the root itself) may use `import coda_ext`: the library imports its floors."""
    rooted = [f"{m} imports the package root" for m, deps in import_graph().items()
              if "coda_ext" in deps and room(m) not in ("tools", "__main__")]
    assert not rooted, "\n".join(rooted)


def test_the_import_graph_has_no_circle():
    graph = import_graph()
    edges = {m: {d for d in deps if d in graph} for m, deps in graph.items()}
    state: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(edges[m]):
            if state.get(d) == 1:
                circles.append(stack[stack.index(d):] + [d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m)
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(c) for c in circles)


def test_the_checker_sees_lazy_and_relative_imports(tmp_path):
    """The reader itself: a function-level relative import is found."""
    probe = PACKAGE / "runtime" / "tuned.py"
    assert "coda_ext.tuning" in imports_of(probe)
    assert "coda_ext.jit" in imports_of(PACKAGE / "runtime" / "op.py")   # imported inside a function
