"""Every file the repository's text names is in the repository, and nothing cites a file outside it.

Scanned: README.md, docs/, python/, csrc/, tests/, benchmarks/, cmake/ and CMakeLists.txt (the raw
tool output under benchmarks/results/ only for citations outside the repository). A reference is
- a markdown link `[text](target)` of a .md file, resolved from that file's folder (and its
  `#anchor` against the target's headings);
- a path from the repository root (`docs/x.md`, `benchmarks/results/y.json`, `csrc/.../z.h`), in
  prose, backticks, comments or strings; globs (`sweep_*_h100.json`) and braces (`{a,b}`) expand;
- a relative source path (`codegen/oob.py`, `kernels/ops/fusions.cuh`, `coda/abi.h`), resolved from
  the file's folder, its parents, python/, python/coda_ext/, csrc/, csrc/include/, benchmarks/ or
  benchmarks/results/;
- a bare name of a results file (`graphs_h100.json`), of a .md or a .py file: found somewhere in
  the repository;
- `<commit>:<path>`: a file in git history (`git show` names it so), checked where git is at hand.
What is clearly not this repository's is left alone: CUTLASS, CUDA and torch include paths, paths
under $VARIABLES, ~ or a temporary folder, format placeholders (`{entry}/kernel.so`, `path/to/`),
example names (`a.json`, `my_graphs.py`), and in Python a relative path or bare name that is a whole
string literal (`"probe.py"`, `"kernels/*.h"`: data the code reads or writes, not a citation).
"""
from __future__ import annotations

import functools
import glob
import pathlib
import re
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCANNED = ("README.md", "docs", "python", "csrc", "tests", "benchmarks", "cmake", "CMakeLists.txt")
TEXT_SUFFIXES = {".md", ".py", ".h", ".hpp", ".cuh", ".cu", ".cpp", ".c", ".cmake", ".in", ".sh", ".tmpl", ".toml"}
#: Raw tool output kept as measured (checked only for citations outside the repository).
RAW_RESULTS = {".json", ".txt", ".log"}
SKIP_DIRS = {"__pycache__", ".pytest_cache", ".hypothesis", ".ruff_cache"}

#: Top-level entries a rooted path starts with.
ROOTED = r"(?:docs|python|csrc|tests|benchmarks|cmake|\.ci)/|(?:README\.md|CMakeLists\.txt|setup\.py|pyproject\.toml)\b"
#: Extensions of the files a relative path or a bare name may name.
FILE_EXT = r"(?:md|py|json|png|svg|log|txt|h|hpp|cuh|cu|cpp|c|cmake|tmpl|sh|in)"
#: A character that may not come right before a path (it would make it part of something longer:
#: ~/x, $DIR/x, /tmp/x, a.b/x, {base}/x, foo-x).
NOT_BEFORE = r"(?<![\w./~$@{}\\-])"
PATH_CHARS = r"[\w.{},*/-]"
COMMIT = r"(?:[0-9a-f]{7,40}:)?"

ROOTED_RE = re.compile(NOT_BEFORE + "(" + COMMIT + "(?:" + ROOTED + ")" + PATH_CHARS + "*)")
RELATIVE_RE = re.compile(NOT_BEFORE + r"((?:[\w.{},*-]+/)+[\w.{},*-]*\." + FILE_EXT + r")(?![\w/])")
BARE_RE = re.compile(NOT_BEFORE + r"([\w-]+(?:\.[\w-]+)*\.(?:md|py)|[\w-]*_h[12]00[\w-]*\.(?:json|png|log|txt|md))"
                     r"(?![\w/-]|\.\w)")
LINK_RE = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
#: Citations of what lies outside the repository.
OUTSIDE_RE = re.compile(r"DESIGN\.md|\bshared/|anchors\.md|coda-patterns\.md|cutlass-evt\.md|reference/style\.md")

#: Relative paths that are other projects' (CUTLASS, CuTe, CUDA, torch, pybind11 include paths and
#: CUTLASS's source tree).
EXTERNAL = ("cutlass/", "cute/", "cutlass_library/", "c10/", "ATen/", "torch/", "pybind11/", "gemm/", "epilogue/",
            "collective/", "include/cutlass/", "tools/util/", "cuda/", "thrust/", "cub/")
#: Bases a relative path may be written from.
BASES = ("python", "python/coda_ext", "csrc", "csrc/include", "benchmarks", "benchmarks/results")


def text_files() -> list[pathlib.Path]:
    files = []
    for entry in SCANNED:
        path = ROOT / entry
        if path.is_file():
            files.append(path)
            continue
        for f in sorted(path.rglob("*")):
            parts = set(f.relative_to(ROOT).parts)
            if parts & SKIP_DIRS or any(p.endswith(".egg-info") for p in parts) or not f.is_file():
                continue
            if f.suffix in TEXT_SUFFIXES or f.name == "CMakeLists.txt" or _raw_result(f):
                files.append(f)
    return files


def _raw_result(f: pathlib.Path) -> bool:
    return f.suffix in RAW_RESULTS and f.relative_to(ROOT).parts[:2] == ("benchmarks", "results")


def expand(token: str) -> list[str]:
    """`a/{b,c}.json` -> [a/b.json, a/c.json]; `x.json/.log` -> [x.json, x.log]."""
    m = re.search(r"\{([^{}]*)\}", token)
    if m:
        return [e for alt in m.group(1).split(",") for e in expand(token[:m.start()] + alt + token[m.end():])]
    m = re.fullmatch(r"(.*?)(\.\w+)/(\.\w+)", token)
    if m:
        return [m.group(1) + m.group(2), m.group(1) + m.group(3)]
    return [token]


def clean(token: str) -> str:
    """Drops trailing punctuation, and a leading `.*` (the path inside a regular expression)."""
    return token.removeprefix(".*").rstrip(".,;:*")


def placeholder(token: str) -> bool:
    """A format placeholder ({entry}, {M}x{N}, path/to/x) rather than a path or a brace list ({a,b}),
    a one-letter example name (a.json) or the reader's own file (my_graphs.py)."""
    groups = re.findall(r"\{([^{}]*)\}", token)
    return (token.count("{") != token.count("}") or any("," not in g for g in groups)
            or token.startswith("path/to/") or len(pathlib.PurePosixPath(token).stem) == 1
            or pathlib.PurePosixPath(token).name.startswith("my_"))


def whole_string(line: str, m: re.Match) -> bool:
    """The match is a whole quoted string literal."""
    before, after = line[m.start(1) - 1:m.start(1)], line[m.end(1):m.end(1) + 1]
    return before in ("'", '"') and before == after


def exists(path: pathlib.Path) -> bool:
    text = str(path)
    if any(c in text for c in "*?["):
        return bool(glob.glob(text))
    return path.exists()


@functools.cache
def git_available() -> bool:
    return shutil.which("git") is not None and (ROOT / ".git").exists()


@functools.cache
def in_history(ref: str) -> bool:
    return subprocess.run(["git", "cat-file", "-e", ref], cwd=ROOT, capture_output=True, check=False).returncode == 0


@functools.cache
def basenames() -> frozenset[str]:
    names = set()
    for entry in SCANNED + (".ci", "setup.py", "pyproject.toml"):
        path = ROOT / entry
        names.update([path.name] if path.is_file() else
                     (f.name for f in path.rglob("*") if not set(f.parts) & SKIP_DIRS))
    return frozenset(names)


def check_rooted(token: str) -> str | None:
    """None if the rooted path (or its history reference) resolves, else why not."""
    commit, sep, path = token.partition(":")   # a rooted path has no ":" of its own
    if sep:   # checked where the commit is at hand (not in a copy without .git, nor a shallow clone)
        if not git_available() or not in_history(f"{commit}^{{commit}}"):
            return None
        return None if in_history(f"{commit}:{path}") else f"not in git history at {commit}"
    return None if exists(ROOT / token) else "no such file or folder"


def check_relative(token: str, source: pathlib.Path) -> str | None:
    """None if the relative path resolves from one of its bases (or is another project's), else why not.
    `coda/...` is how csrc/'s files name themselves (the installed include prefix)."""
    if token.startswith(EXTERNAL):
        return None
    bases = [b for b in (source.parent, *source.parent.parents) if ROOT in (b, *b.parents)]
    bases += [ROOT / b for b in BASES]
    candidates = [token] + ([token[len("coda/"):]] if token.startswith("coda/") else [])
    if any(exists(base / c) for base in bases for c in candidates):
        return None
    return "no such file from this file's folder, its parents or " + ", ".join(BASES)


def taken(m: re.Match, spans: list[tuple[int, int]]) -> bool:
    return any(a <= m.start(1) < b for a, b in spans)


def references(path: pathlib.Path, text: str | None = None) -> list[tuple[int, str, str | None]]:
    """(line, reference, problem or None) of every reference in one file (or in `text`, read as if it
    were that file)."""
    found = []
    text = path.read_text(errors="replace") if text is None else text
    for lineno, line in enumerate(text.splitlines(), 1):
        spans: list[tuple[int, int]] = []   # what an earlier pattern already took on this line
        if path.suffix == ".md":
            for m in LINK_RE.finditer(line):
                spans.append(m.span())
                found.append((lineno, m.group(1), check_link(m.group(1), path)))
        for m in ROOTED_RE.finditer(line):
            if taken(m, spans):
                continue
            spans.append(m.span(1))
            token = clean(m.group(1))
            if placeholder(token):
                continue
            found.extend((lineno, t, check_rooted(t)) for t in expand(token))
        for m in RELATIVE_RE.finditer(line):
            if taken(m, spans) or (path.suffix == ".py" and whole_string(line, m)):
                continue
            spans.append(m.span(1))
            token = clean(m.group(1))
            if placeholder(token):
                continue
            found.extend((lineno, t, check_relative(t, path)) for t in expand(token))
        for m in BARE_RE.finditer(line):
            if taken(m, spans) or placeholder(m.group(1)) or (path.suffix == ".py" and whole_string(line, m)):
                continue
            found.append((lineno, m.group(1), None if m.group(1) in basenames() else "no file of that name"))
    return found


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = re.sub(r"[`*_\[\]]|\]\([^)]*\)", "", heading.strip().lower())
    return "".join(c for c in text if c.isalnum() or c in " -").replace(" ", "-")


def check_link(target: str, source: pathlib.Path) -> str | None:
    if re.match(r"[a-z]+:", target):   # http:, https:, mailto:
        return None
    file, _, anchor = target.partition("#")
    dest = (source.parent / file).resolve() if file else source
    if not dest.exists():
        return "no such file"
    if anchor and dest.suffix == ".md":
        anchors = {slug(h) for h in re.findall(r"^#+ (.*)$", dest.read_text(), re.MULTILINE)}
        if anchor not in anchors:
            return f"no heading with anchor #{anchor}"
    return None


def test_every_referenced_file_exists():
    stale = [f"{path.relative_to(ROOT)}:{line}: {ref} ({why})"
             for path in text_files() if not _raw_result(path) and path != pathlib.Path(__file__).resolve()
             for line, ref, why in references(path) if why]
    assert not stale, "references to files the repository does not have:\n" + "\n".join(stale)


def test_nothing_cites_files_outside_the_repository():
    """DESIGN.md and the shared/ folder live outside the repository: docs/design.md, docs/patterns.md
    and docs/architecture.md hold what the project needs from them."""
    cited = [f"{path.relative_to(ROOT)}:{n}: {line.strip()[:120]}"
             for path in text_files() if path != pathlib.Path(__file__).resolve()
             for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1) if OUTSIDE_RE.search(line)]
    assert not cited, "citations of files outside the repository:\n" + "\n".join(cited)


PROBE = ROOT / "docs" / "probe.md"   # the checker reads the texts below as if they were this file


@pytest.mark.parametrize("text, stale", [
    ("see `docs/no_such_file.md`", "docs/no_such_file.md"),
    ("(benchmarks/results/graphs_h100_run9.json)", "benchmarks/results/graphs_h100_run9.json"),
    ("// csrc/kernels/ops/missing.h — a header", "csrc/kernels/ops/missing.h"),
    ("# see codegen/no_such_pass.py", "codegen/no_such_pass.py"),
    ("the file `graphs_h100_run9.json`", "graphs_h100_run9.json"),
    ("[the docs](no_such_file.md)", "no_such_file.md"),
    ("[design](design.md#no-such-heading)", "design.md#no-such-heading"),
    ("`benchmarks/results/{ops,nope}_h100.json`", "benchmarks/results/nope_h100.json"),
])
def test_the_checker_finds_a_stale_reference(text, stale):
    found = {ref: why for _, ref, why in references(PROBE, text)}
    assert found.get(stale), f"{stale!r} not reported in {found}"


@pytest.mark.parametrize("text", [
    "cache under `~/.cache/coda_ext` or $CODA_EXT_CACHE_DIR/kernels/x.json",
    '#include "cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp"',
    "writes $OUT/graphs.json and /tmp/x/docs/a.md; entry {entry}/kernel.so",
    "[design](design.md#how-speed-is-judged), `benchmarks/results/sweep_*_h100.json`",
    "${PROJECT_SOURCE_DIR}/csrc/kernels/ops/finish.cu, `benchmarks/results/{ops,graphs}_h100.json`",
    "x.shape, self.hidden_size, torch.cuda.is_available()",
])
def test_the_checker_leaves_other_paths_alone(text):
    problems = {ref: why for _, ref, why in references(PROBE, text) if why}
    assert not problems, problems


def test_history_references_resolve_where_git_is_at_hand():
    if not git_available() or not in_history("5c5a523^{commit}"):
        pytest.skip("no git history here: `<commit>:<path>` references are checked where there is one")
    assert check_rooted("5c5a523:benchmarks/results/earlier/raster_h100.json") is None
    assert check_rooted("5c5a523:benchmarks/results/earlier/no_such_file.json")


def test_the_contract_header_states_its_own_config():
    """csrc/kernels/ops/contract.h said its gemm_* config was the JIT's default KernelConfig, which it
    is not: its comment must state the constants it holds, and call them DEFAULT_CONFIG only if they are."""
    from coda_ext.config import DEFAULT_CONFIG

    text = (ROOT / "csrc" / "kernels" / "ops" / "contract.h").read_text()
    const = dict(re.findall(r"inline constexpr (?:int|bool) (k\w+) = (\w+);", text))
    tile = (int(const["kTileM"]), int(const["kTileN"]), int(const["kTileK"]))
    schedule = "cooperative" if const["kCooperative"] == "true" else "pingpong"
    comment = " ".join(line.lstrip("/ ") for line in text.splitlines() if line.startswith("//"))
    assert "{} x {} x {}".format(*tile) in comment
    assert ("cooperative" if schedule == "cooperative" else "ping-pong") in comment
    is_default = tile == DEFAULT_CONFIG.tile and schedule == DEFAULT_CONFIG.schedule
    assert is_default or "not the coda_ext JIT's DEFAULT_CONFIG" in comment
