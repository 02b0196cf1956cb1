"""coda_ext.graphs is the one home of the project's graphs: every ready op, libcoda kernel and block-analysis
step takes its graph from it (the same digest), and no module, test or benchmark builds a graph of its own
(an ast scan: no `Graph()` / `ce.Graph()` call) except the graph language's own tests and the generators of
graphs (the fuzzer, the fusion compiler): ALLOWED. CPU only."""
from __future__ import annotations

import ast
import pathlib

import pytest

from coda_ext import graphs, ops
from coda_ext.analysis import block
from coda_ext.ops import linear_grad, lm_head_ce, norm_backward, qkv, residual_norm, rms_scale, swiglu, swiglu_backward

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "coda_ext"


def digest(g) -> str:
    return g.build().digest()


# --- (a) the ready ops, libcoda and the block analysis run the library's graphs ---------------------

#: Each ready op module -> the library functions its graph attributes are.
OP_GRAPHS = {
    residual_norm: {"graph": graphs.linear_residual_norm},
    rms_scale: {"graph": graphs.rms_linear},
    swiglu: {"graph": graphs.linear_swiglu},
    qkv: {"graph": graphs.qkv_rope},
    lm_head_ce: {"graph": graphs.lm_head_cross_entropy, "backward_graph": graphs.lm_head_cross_entropy_backward},
    linear_grad: {"graph": graphs.linear},
    norm_backward: {"graph": graphs.rms_norm_backward_linear},
    swiglu_backward: {"graph": graphs.swiglu_backward_linear},
}


def test_every_ready_op_module_is_listed():
    assert set(OP_GRAPHS) == set(ops.MODULES + ops.BACKWARD_MODULES)


@pytest.mark.parametrize("module", list(OP_GRAPHS), ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_every_ready_op_graph_comes_from_the_library(module):
    """The op's graph functions are the library's, and each of its BUILDS variants is the library graph."""
    for attr, library in OP_GRAPHS[module].items():
        assert getattr(module, attr) is library, f"{module.__name__}.{attr} is not coda_ext.graphs.{library.__name__}"
    assert module.BUILDS
    for build, args, _ in module.BUILDS:
        assert build.__module__.startswith("coda_ext.graphs."), f"{module.__name__}: {build} is not the library's"
        assert digest(build(*args)) == digest(getattr(graphs, build.__name__)(*args))


def test_libcoda_kernels_are_the_ready_ops_graphs():
    from coda_ext.tools import libgen

    for k in libgen.KERNELS:
        library = OP_GRAPHS[getattr(ops, k.module)]["graph"]
        assert digest(k.graph()) == digest(library(*k.args)), k.name


def _op_graph_digests() -> set[str]:
    return {digest(build(*args)) for m in OP_GRAPHS for build, args, _ in m.BUILDS}


#: Each graph step of the block analysis -> the op graph (module, arguments) the fused layer runs there
#: (coda_ext.models: the QKV dX GEMM's norm backward has no residual gradient to add; the gate/up one has).
BLOCK_STEPS = {
    "fwd QKV + RoPE (K4)": (qkv, (True, False, "head_dim")),
    "fwd O-proj + residual + norm stats (K1)": (residual_norm, ()),
    "fwd gate/up + SwiGLU (K2)": (swiglu, (True, True)),
    "fwd down + residual + norm stats (K3)": (residual_norm, ()),
    "bwd down dW": (linear_grad, (False,)),
    "bwd gate/up dX + RMSNorm bwd": (norm_backward, (True,)),
    "bwd gate/up dW": (linear_grad, (False,)),
    "bwd O-proj dX": (linear_grad, (False,)),
    "bwd O-proj dW": (linear_grad, (False,)),
    "bwd QKV dX + RMSNorm bwd + dx": (norm_backward, (True,)),
    "bwd QKV dW": (linear_grad, (False,)),
}


@pytest.mark.parametrize("layer", sorted(block.LAYERS))
def test_block_analysis_graphs_are_the_ops_graphs(layer):
    """Regression: the analysis kept its own norm-backward graph (γ named gamma, a precomputed ζ vector,
    dx_in always added), which had drifted from the op's."""
    L = block.LAYERS[layer]
    steps = block.graph_steps(L)
    assert [name for name, *_ in steps] == list(BLOCK_STEPS)
    known = _op_graph_digests()
    for name, _, build, _ in steps:
        module, args = BLOCK_STEPS[name]
        args = tuple(L.head_dim if a == "head_dim" else a for a in args)
        assert digest(build()) == digest(module.graph(*args)), name
        assert digest(build()) in known, f"{name}: not a graph of any ready op's BUILDS"
    graph_steps = [s for s in block.layer_model(layer).steps if s.name in BLOCK_STEPS]
    assert len(graph_steps) == len(BLOCK_STEPS)


# --- (b) nobody else builds a graph ----------------------------------------------------------------

#: The files that may build graphs of their own: each tests the graph language itself (its builder,
#: interpreter, compilers and runtime interface) with graphs made for that test, or generates graphs
#: (random ones, or the fusion compiler's from a program). A test or benchmark that needs one of the
#: library's graphs imports it from coda_ext.graphs.
ALLOWED = {
    "python/coda_ext/fusion/lowering.py": "the fusion compiler: each epilogue it finds in an FX graph becomes a graph",
    "tests/unit/test_builder.py": "the builder",
    "tests/unit/test_canonical.py": "canonicalization",
    "tests/unit/test_interpret.py": "the reference interpreter",
    "tests/unit/test_pairs_layouts.py": "pair tiles and stores: builder, interpreter, code generation",
    "tests/unit/test_primitives.py": "code generation of single node kinds",
    "tests/unit/test_oob.py": "code generation: the reductions' bounds checks",
    "tests/unit/test_golden.py": "code generation: a DAG graph's emitted C++, byte for byte",
    "tests/unit/test_tuning.py": "the config heuristic's reading of graph features, one feature per graph",
    "tests/unit/test_analysis.py": "the IO model's accounting of each node kind",
    "tests/unit/test_cache.py": "the kernel cache, keyed by the emitted source (graphs that differ in a constant)",
    "tests/helpers/bad_inputs.py": "the compiled op's argument checks: graphs with every kind of runtime argument",
    "tests/helpers/fuzz_strategies.py": "the fuzzer: random graphs",
    "tests/unit/test_fuzz_graphs.py": "the fuzzer, and the builder errors it found",
    "tests/unit/test_nvcc_fuzz_sample.py": "code generation regressions the fuzzer found, compiled by nvcc",
    "tests/gpu/test_fuzz_regressions_gpu.py": "kernel regressions the fuzzer found",
    "benchmarks/numerics_table.py": "the numerics of every node kind (with the fuzzer's graphs)",
}


#: The modules whose attribute Graph is the builder: coda_ext, coda_ext.graph and coda_ext.graph.builder.
_BUILDER_MODULES = ("coda_ext", "coda_ext.graph", "coda_ext.graph.builder")


def _imported_from(node: ast.ImportFrom, path: pathlib.Path) -> str:
    """The absolute module of a `from X import ...` in `path` (relative imports resolved in the package)."""
    if not node.level:
        return node.module or ""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts) if path.is_relative_to(PACKAGE) else []
    base = parts[: len(parts) - node.level]
    return ".".join(base + ([node.module] if node.module else []))


def graph_constructions(path: pathlib.Path, text: str | None = None) -> list[int]:
    """Lines of `path` (or of `text`, read as if it were `path`) that construct a builder Graph: a call of
    a name the builder's Graph was imported as (`Graph()`), or of `<m>.Graph` where m names coda_ext,
    coda_ext.graph or coda_ext.graph.builder (`ce.Graph()`, `coda_ext.Graph()`, `builder.Graph()`).
    Other Graphs (torch.fx.Graph) do not count."""
    tree = ast.parse(path.read_text() if text is None else text, str(path))
    classes: set[str] = set()      # names bound to the builder's Graph
    modules: set[str] = set()      # names bound to a module whose Graph is the builder's
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in _BUILDER_MODULES:
                    modules.add(a.asname or a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            source = _imported_from(node, path)
            for a in node.names:
                if a.name == "Graph" and source in _BUILDER_MODULES:
                    classes.add(a.asname or a.name)
                elif f"{source}.{a.name}" in _BUILDER_MODULES:
                    modules.add(a.asname or a.name)

    def root(e: ast.expr) -> str | None:
        while isinstance(e, ast.Attribute):
            e = e.value
        return e.id if isinstance(e, ast.Name) else None

    return sorted(n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and (
        (isinstance(n.func, ast.Name) and n.func.id in classes)
        or (isinstance(n.func, ast.Attribute) and n.func.attr == "Graph" and root(n.func.value) in modules)))


def scanned_files() -> list[pathlib.Path]:
    """Every module of python/coda_ext outside graph/ and graphs/, every file of tests/ and benchmarks/."""
    package = [p for p in PACKAGE.rglob("*.py") if p.relative_to(PACKAGE).parts[0] not in ("graph", "graphs")]
    return sorted(package + list((ROOT / "tests").rglob("*.py")) + list((ROOT / "benchmarks").rglob("*.py")))


def test_the_scan_sees_every_spelling(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import coda_ext as ce\nimport coda_ext.graph\nimport torch.fx as fx\n"
                     "from coda_ext.graph import Graph as G\nfrom coda_ext.graph import builder\n"
                     "a = ce.Graph()\nb = G()\nc = coda_ext.graph.Graph()\nd = builder.Graph()\n"
                     "e = fx.Graph()\nf = torch.cuda.CUDAGraph()\ng = 'ce.Graph()'\n")
    assert graph_constructions(probe) == [6, 7, 8, 9]
    inside = PACKAGE / "fusion" / "probe.py"    # relative imports, as a module of the package would write them
    text = ("from ..graph import Graph\nfrom .. import graph\nfrom ..graph import builder as b\n"
            "g = Graph()\nh = graph.Graph()\ni = b.Graph()\n")
    assert graph_constructions(inside, text) == [4, 5, 6]


def test_only_the_graph_language_tests_build_graphs():
    found = {str(p.relative_to(ROOT)): lines for p in scanned_files() if (lines := graph_constructions(p))}
    outside = {f: lines for f, lines in found.items() if f not in ALLOWED}
    assert not outside, ("graphs built outside coda_ext.graphs (add the graph to the library and import it): "
                         + "; ".join(f"{f} line {', '.join(map(str, lines))}" for f, lines in sorted(outside.items())))
    stale = sorted(set(ALLOWED) - set(found))
    assert not stale, f"allowed files that no longer build a graph (remove them from ALLOWED): {stale}"


def test_the_library_stands_on_its_floor():
    """coda_ext.graphs imports only errors, config and graph (the builder and its math): stricter than its
    floor in test_layers, which would also let it import passes."""
    bad = []
    for path in (PACKAGE / "graphs").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 2:
                targets = [node.module.split(".")[0]] if node.module else [a.name for a in node.names]
                bad += [f"{path.name}: coda_ext.{t}" for t in targets if t not in ("errors", "config", "graph")]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("coda_ext"):
                bad.append(f"{path.name}: {node.module}")
            elif isinstance(node, ast.Import):
                bad += [f"{path.name}: {a.name}" for a in node.names if a.name.startswith("coda_ext")]
    assert not bad, f"coda_ext.graphs imports above its floor: {bad}"
