"""The IO/roofline model (coda_ext.analysis): bytes and FLOPs against hand-computed cases, the
compile-style and unfused sequences, timing, explain/diagram on every test and benchmark graph,
the Llama block view and its CLI. CPU only."""
from __future__ import annotations

import ast
import dataclasses
import json
import math
import pathlib
import sys
import xml.etree.ElementTree as ET

import pytest

import coda_ext as ce
from benchmarks import graphs as bench_graphs
from benchmarks import validate_io
from coda_ext import tuning
from coda_ext.analysis import block, costs, explain, io_model
from coda_ext.analysis.__main__ import main as analysis_main
from coda_ext.analysis.roofline import GPUS, Access, GemmWork, Kernel, gpu_spec
from coda_ext.graph import ir
from coda_ext.graph.kinds import KINDS
from tests.gpu import cases as gpu_cases

ROOT = pathlib.Path(__file__).resolve().parents[2]

B = 2  # bytes of bf16


def _graph(build):
    g = ce.Graph()
    build(g)
    return g


def _bytes(model, variant):
    return model.variants[variant].bytes


# --- hand-computed cases ------------------------------------------------------------------------

def test_plain_gemm_reads_operands_once_when_they_fit_in_l2():
    M = N = K = 1024
    m = io_model(bench_graphs.identity(), "bfloat16", (M, N, K))
    assert m.config == ce.DEFAULT_CONFIG and m.schedule.a_reads == m.schedule.w_reads == 1
    for v in ("fused", "compile", "unfused"):
        assert _bytes(m, v) == (M * K + N * K + M * N) * B
        assert m.variants[v].flops == 2 * M * N * K
        assert len(m.variants[v].kernels) == 1


def test_swept_operand_is_reread_once_per_band():
    # 128x128 tiles, swizzle 4: 128 x 48 tiles, raster along N (fewer N tiles), bands of 4 tile-rows;
    # W (50 MB) does not fit in half of L2, so it is read once per band; A once.
    M, N, K = 16384, 6144, 4096
    s = io_model(bench_graphs.identity(), "bfloat16", (M, N, K)).schedule
    assert (s.tiles_m, s.tiles_n, s.raster, s.band, s.bands) == (128, 48, "along_n", 4, 32)
    assert (s.a_reads, s.w_reads) == (1, 32)
    # More N tiles than M tiles: raster along M, A swept: 64 x 1002 tiles, bands of 4 N-tiles, A is 67 MB.
    s = io_model(bench_graphs.identity(), "bfloat16", (8192, 128256, 4096)).schedule
    assert (s.raster, s.bands, s.a_reads, s.w_reads) == ("along_m", 251, 251, 1)
    # Clusters widen the band (swizzle x cluster rows); a small operand stays in L2.
    s = io_model(bench_graphs.identity(), "bfloat16", (16384, 6144, 4096), config=tuning.LARGE).schedule
    assert (s.band, s.bands, s.w_reads) == (8, 16, 16)
    s = io_model(bench_graphs.identity(), "bfloat16", (16384, 6144, 4096), config=tuning.LARGE_TALL).schedule
    assert (s.band, s.bands, s.w_reads) == (16, 8, 8)
    s = io_model(bench_graphs.identity(), "bfloat16", (128, 28672, 4096), config="auto").schedule
    assert (s.raster, s.a_reads, s.w_reads) == ("along_m", 1, 1)


def test_residual_graph():
    M = N = K = 1024
    m = io_model(bench_graphs.residual(), "bfloat16", (M, N, K))
    mn = M * N * B
    operands = (M * K + N * K) * B
    assert _bytes(m, "fused") == operands + 2 * mn                       # residual read, D written
    assert _bytes(m, "compile") == operands + 4 * mn                     # + the GEMM result written and read
    assert _bytes(m, "unfused") == operands + 4 * mn
    assert [len(m.variants[v].kernels) for v in ("fused", "compile", "unfused")] == [1, 2, 2]
    assert m.variants["fused"].flops == 2 * M * N * K + M * N            # one add per element


def test_swiglu_pair_store_is_half_width():
    M, N, K = 256, 1024, 512
    m = io_model(bench_graphs.swiglu(), "bfloat16", (M, N, K))
    assert m.tensors["y"].shape == (M, N // 2) and m.tensors["y"].role == "pair store"
    fused = m.variants["fused"].kernels[0]
    assert fused.written == M * N * B + M * (N // 2) * B
    assert fused.vector_flops == M * (N // 2) * (costs.KIND_COSTS["silu"].flops + 1)
    # compile-style: the GEMM writes z (the output itself), one kernel reads it back and writes y.
    assert _bytes(m, "compile") - _bytes(m, "fused") == M * N * B
    assert [k.name for k in m.variants["unfused"].kernels] == ["cuBLAS GEMM", "pair_gate -> y"]


def test_row_and_col_reduction_partials_and_finalize():
    M, N, K = 1000, 1000, 256          # 128x128 tiles: 8 x 8, partial tiles included
    g = _graph(lambda g: (g.output(g.accumulator()), g.row_reduce("ss", g.accumulator(), "sumsq"),
                          g.col_reduce("cs", g.accumulator(), "sum")))
    m = io_model(g, "bfloat16", (M, N, K))
    gemm, finalize = m.variants["fused"].kernels
    row_partials, col_partials = M * 8 * 4, 8 * N * 4
    assert m.tensors["ss:partials"].shape == (M, 8) and m.tensors["cs:partials"].shape == (8, N)
    assert gemm.written == M * N * B + row_partials + col_partials
    assert finalize.read == row_partials + col_partials and finalize.written == (M + N) * 4
    # compile-style: D from the GEMM, one kernel reads it and writes both vectors.
    _, pointwise = m.variants["compile"].kernels
    assert pointwise.read == M * N * B and pointwise.written == (M + N) * 4
    assert [k.name for k in m.variants["unfused"].kernels] == ["cuBLAS GEMM", "sumsq -> ss", "sum -> cs"]
    assert m.variants["unfused"].kernels[1].vector_flops == 2 * M * N


def test_graph_without_output_writes_no_d_and_narrows_int64():
    M, N, K = 512, 4096, 1024

    def build(g):
        logits = g.accumulator() * g.col_vector("rstd", "float32")
        g.row_reduce("lse", logits, "logsumexp")
        picked = ce.where(ce.eq(g.col_index(), g.col_vector("target", "int64")), logits, 0.0)
        g.row_reduce("tl", picked, "sum")

    m = io_model(_graph(build), "bfloat16", (M, N, K))
    narrow, gemm, finalize = m.variants["fused"].kernels
    tiles_n = math.ceil(N / 128)
    assert narrow.read == M * 8 and narrow.written == M * 4
    assert gemm.read == (M * K + N * K) * B + M * 4 + M * 4          # operands, rstd, the int32 target copy
    assert gemm.written == 2 * M * tiles_n * 4                        # partials only: no M x N tensor
    assert finalize.written == 2 * M * 4
    assert gemm.vector_flops == M * N * (1 + 1 + 1 + costs.REDUCE_FLOPS["logsumexp"] + 1)
    gemm_c, pointwise = m.variants["compile"].kernels
    assert gemm_c.written == M * N * B and pointwise.read == M * N * B + M * 4 + M * 8
    assert pointwise.written == 2 * M * 4
    names = [k.name for k in m.variants["unfused"].kernels]
    assert names[0] == "cuBLAS GEMM" and len(names) == 6 and names[-2:] == ["logsumexp -> lse", "sum -> tl"]
    assert sum(1 for t in m.tensors.values() if t.role == "output D") == 0


def test_unfused_materialises_every_intermediate():
    M = N = K = 1024
    m = io_model(bench_graphs.bias_silu(), "bfloat16", (M, N, K))
    unfused = m.variants["unfused"]
    assert [k.name for k in unfused.kernels] == ["cuBLAS GEMM", "add -> %2 add", "silu -> out"]
    mn = M * N * B
    assert unfused.bytes == (M * K + N * K) * B + mn + (mn + N * B + mn) + (mn + mn)


# --- timing -------------------------------------------------------------------------------------

def test_wave_quantization_and_stream_k():
    gpu = GPUS["H100 SXM"]
    tile_s = 2 * 128 * 128 * 4096 / (gpu.tflops * 1e12)
    full = GemmWork(128 * 132, 128, 4096, 128, 128)                 # 132 tiles: one wave
    tail = GemmWork(128 * 133, 128, 4096, 128, 128)                 # 133 tiles: two waves
    assert full.seconds(gpu) == pytest.approx(132 * tile_s) and tail.seconds(gpu) == pytest.approx(2 * 132 * tile_s)
    assert GemmWork(128 * 133, 128, 4096, 128, 128, streamk=True).seconds(gpu) == pytest.approx(133 * tile_s)
    k = Kernel("k", (Access("x", read=3_000_000_000),), full)
    t = k.timing(gpu)
    assert t.bound == "memory" and t.seconds == pytest.approx(1e-3 + gpu.launch_us * 1e-6)


def test_gpu_table_and_config_choice():
    assert gpu_spec("h200").tbps > gpu_spec("H100 SXM").tbps
    with pytest.raises(ValueError, match="unknown GPU"):
        gpu_spec("A100")
    m = io_model(bench_graphs.bias_silu(), "bfloat16", (16384, 28672, 4096), config="auto")
    assert m.config == tuning.heuristic(16384, 28672, 4096, 132, tuning.Epilogue()) == tuning.TALL_192_ALONG_N
    with pytest.raises(ValueError, match="config"):
        io_model(bench_graphs.bias_silu(), "bfloat16", (128, 128, 128), config="tune")
    with pytest.raises(ValueError, match="shape"):
        io_model(bench_graphs.bias_silu(), "bfloat16", (128, 128))
    with pytest.raises(ce.UnsupportedError):
        io_model(bench_graphs.bias_silu(), "float32", (128, 128, 128))


# --- explain and diagram over every graph the project tests and benchmarks --------------------

ALL_GRAPHS = {f"cases.{n}": fn for n, (fn, _) in gpu_cases.CASES.items()}
ALL_GRAPHS.update({f"bench.{n}": fn for n, (fn, _) in bench_graphs.CASES.items()})


@pytest.mark.parametrize("name", sorted(ALL_GRAPHS))
def test_explain_and_diagram_every_graph(name, tmp_path):
    for shape in ((16384, 6144, 4096), (128, 28672, 4096)):
        e = ce.explain(ALL_GRAPHS[name](), "bfloat16", shape, config="auto")
        v = e.variants
        assert v["fused"].bytes <= v["compile"].bytes <= v["unfused"].bytes
        assert e.seconds("fused") <= e.seconds("compile") * 1.0001
        text = str(e)
        assert "time lower bound" in text and "A " in text and "total" in text
        d = e.to_dict()
        json.dumps(d)
        assert set(d["variants"]) == {"fused", "compile", "unfused"} and d["savings"]["compile"]["bytes"] >= 0
    root = ET.parse(ce.diagram(ALL_GRAPHS[name](), "bfloat16", (16384, 6144, 4096), tmp_path / "g.svg")).getroot()
    assert root.tag.endswith("svg")
    edges = root.findall("{http://www.w3.org/2000/svg}polyline")
    labels = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text") if t.text and
              (t.text == "on-chip" or t.text.startswith("HBM "))]
    assert edges and len(labels) == len(edges)


def test_diagram_labels_hbm_bytes(tmp_path):
    M, N, K = 1024, 1024, 1024
    path = ce.diagram(bench_graphs.residual(), "bfloat16", (M, N, K), tmp_path / "r.svg")
    texts = [t.text for t in ET.parse(path).getroot().iter("{http://www.w3.org/2000/svg}text")]
    assert "HBM read 2.1 MB" in texts and "HBM write 2.1 MB" in texts and "on-chip" in texts


def test_diagram_png_needs_matplotlib(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=r"\.svg or \.png"):
        ce.diagram(bench_graphs.residual(), "bfloat16", (128, 128, 128), tmp_path / "r.pdf")
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # as if not installed
    with pytest.raises(ImportError, match="matplotlib"):
        ce.diagram(bench_graphs.residual(), "bfloat16", (128, 128, 128), tmp_path / "r.png")


# --- unknown kinds, exports, import direction ---------------------------------------------------

def test_every_ir_kind_has_a_cost_and_unknown_kinds_raise(monkeypatch):
    assert set(ir.ARITY) | {"keep_first"} <= set(costs.KIND_COSTS)
    with pytest.raises(ce.UnsupportedError, match="KIND_COSTS"):
        costs.kind_cost("frobnicate")
    # A kind added to the registry (graph/kinds.py) is costed from its entry.
    monkeypatch.setitem(KINDS, "frobnicate", dataclasses.replace(KINDS["neg"], name="frobnicate", flops=3.0))
    g = ir.GraphIR((ir.Node("accumulator"), ir.Node("frobnicate", (0,)),
                  ir.Node("output", (1,), ir.make_attrs(name="out"))))
    assert io_model(g, "bfloat16", (128, 128, 128)).variants["fused"].flops == 2 * 128 ** 3 + 128 * 128 * 3.0


def test_lazy_exports_and_one_way_imports():
    import coda_ext.analysis as analysis

    assert {"explain", "diagram"} <= set(ce.__all__)
    assert ce.explain is analysis.explain and ce.diagram is analysis.diagram
    pkg = ROOT / "python" / "coda_ext"
    top = ast.parse((pkg / "__init__.py").read_text())
    assert not any("analysis" in ast.dump(node) for node in top.body if isinstance(node, (ast.Import, ast.ImportFrom)))
    for path in pkg.rglob("*.py"):
        if {"analysis", "fusion"} & set(path.relative_to(pkg).parts):   # fusion's cost is the IO model
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and "analysis" in node.module.split("."):
                pytest.fail(f"{path} imports coda_ext.analysis; only the lazy export in __init__ may")


# --- the Llama block ----------------------------------------------------------------------------

def test_llama_block_model():
    m = block.layer_model("8b")
    names = [s.name for s in m.steps]
    assert names[0].startswith("fwd QKV") and names[-1] == "bwd QKV dW" and len(names) == 13
    assert m.floor_s <= m.total_s("fused") < m.total_s("compile") < m.total_s("unfused")
    assert m.total_bytes("fused") < m.total_bytes("compile") < m.total_bytes("unfused")
    for s in m.steps:
        if s.name.endswith("dW"):   # plain GEMMs: the same in every variant
            assert len({s.variants[v].bytes for v in ("fused", "compile", "unfused")}) == 1
    dswiglu = next(s for s in m.steps if "dSwiGLU" in s.name)
    T, F = m.layer.tokens, m.layer.F
    gemm = dswiglu.variants["fused"].kernels[0]
    tensors = {a.tensor: (a.read, a.write) for a in gemm.accesses}
    assert tensors["z1"] == (T * 2 * F * B, 0) and tensors["dz1"] == (0, T * 2 * F * B)
    assert tensors["y1"] == (0, T * F * B)
    # the hand-listed fused step is what explain() gives for the op's own pair-tile graph
    from coda_ext.ops import swiglu_backward

    op = io_model(swiglu_backward.graph(), "bfloat16", (T, F, m.layer.d), config="auto").variants["fused"]
    assert dswiglu.variants["fused"].bytes == op.bytes
    assert dswiglu.variants["fused"].seconds(m.gpu) == pytest.approx(op.seconds(m.gpu))
    assert "Llama-3-8B" in m.table() and "time / GEMM floor" in m.table()


def test_block_cli_writes_json(tmp_path, capsys, monkeypatch):
    out = tmp_path / "layer.json"
    assert analysis_main(["--layers", "1b", "--tokens", "4096", "--json", str(out)]) == 0
    assert "Llama-1B-like" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data[0]["layer"]["tokens"] == 4096 and set(data[0]["totals"]) == {"fused", "compile", "unfused"}
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert analysis_main(["--layers", "8b", "--chart", str(tmp_path / "c.png")]) == 2
    assert "matplotlib" in capsys.readouterr().err


def test_validate_io_parses_ncu_csv_and_lists_its_kernels():
    head = '"ID","Process ID","Kernel Name","Section Name","Metric Name","Metric Unit","Metric Value"'
    gemm, fin = '"0","7","device_kernel<A, B>(Params)","metrics"', '"1","7","finalize_partials_kernel","metrics"'
    rows = [f'{gemm},"dram__bytes_read.sum","byte","1,800"', f'{gemm},"gpu__time_duration.sum","usecond","2.5"',
            f'{fin},"dram__bytes_write.sum","Kbyte","4"']
    kernels = validate_io.parse_ncu_csv("\n".join(["==PROF== Connected", head] + rows))
    assert kernels == [{"name": "device_kernel<A, B>(Params)", "read_bytes": 1800.0, "time_s": pytest.approx(2.5e-6)},
                       {"name": "finalize_partials_kernel", "write_bytes": 4000.0}]
    assert validate_io.parse_ncu_csv("==ERROR== no kernels") == []
    # the H100's ncu reports time in "ns" under --print-units base (regression: it was taken as seconds)
    ns = validate_io.parse_ncu_csv("\n".join([head, f'{gemm},"gpu__time_duration.sum","ns","4952032"',
                                               f'{gemm},"lts__t_sector_op_read_hit_rate.pct","%","64.5"']))
    assert ns == [{"name": "device_kernel<A, B>(Params)", "time_s": pytest.approx(4.952032e-3),
                   "l2_read_hit_pct": 64.5}]
    with pytest.raises(ValueError, match="'furlong'"):
        validate_io.parse_ncu_csv("\n".join([head, f'{gemm},"gpu__time_duration.sum","furlong","1"']))
    shapes = validate_io.default_shapes()
    assert {s[0] for s in shapes} == {128, 16384} and len(shapes) == 8
    assert all(cfg in tuning.HEURISTIC_CONFIGS for _, _, cfg in validate_io.build_items())


def test_validate_io_merges_parts(tmp_path, capsys):
    def row(case, M, read, time_s):
        model = {"read_bytes": 100.0, "write_bytes": 10.0, "time_s": 1e-3, "kernels": []}
        measured = {"read_bytes": read, "write_bytes": 10.0, "time_s": time_s, "kernels": []}
        ratios = {k: measured[k] / model[k] for k in ("read_bytes", "write_bytes", "time_s")}
        return {"case": case, "shape": [M, 64, 64], "config": "c", "model": model, "measured": measured,
                "ratio_measured_to_model": ratios}

    parts = []
    for i, rows in enumerate([[row("a", 1, 100.0, 1.0e-3), row("b", 1, 120.0, 1.2e-3)],
                              [row("b", 1, 110.0, 1.1e-3), row("a", 2, 90.0, 0.9e-3)]]):
        path = tmp_path / f"part{i}.json"
        env = {"commit": f"c{i}", "date": "d", "gpu": "NVIDIA H100 80GB HBM3"}
        path.write_text(json.dumps(validate_io.result({"name": "H100 SXM"}, env, rows)))
        parts.append(str(path))
    out = tmp_path / "all.json"
    assert validate_io.main(["--merge", *parts, "--out", str(out)]) == 0
    merged = json.loads(out.read_text())
    assert [(r["case"], r["shape"][0]) for r in merged["rows"]] == [("a", 1), ("b", 1), ("a", 2)]
    assert merged["rows"][1]["measured"]["read_bytes"] == 110.0          # the later part's row
    assert [p["commit"] for p in merged["environment"]["parts"]] == ["c0", "c1"]
    assert merged["read_bytes_ratio_range"] == [0.9, 1.1]
    assert merged["time_median_abs_deviation"] == pytest.approx(0.1)
    assert "3 rows from 2 parts" in capsys.readouterr().out


# --- what the pictures and the summary line say ------------------------------------------------


def _readme_graph():
    from coda_ext.graphs import example

    return example()


def test_explain_counts_launches_in_words():
    """Regression: explain said "2 launches instead of 2" where fused and compile-style both launch 2."""
    from coda_ext.analysis.explain import launches

    assert launches(2, 2) == "the same 2 launches" and launches(1, 1) == "the same 1 launch"
    assert launches(1, 2) == "1 launch instead of 2" and launches(2, 6) == "2 launches instead of 6"
    text = str(explain(_readme_graph(), "bfloat16", (16384, 6144, 4096), config=ce.DEFAULT_CONFIG))
    lines = {line.split(":")[0].strip(): line for line in text.splitlines() if "fused vs" in line}
    assert lines["fused vs compile"].endswith("the same 2 launches")   # GEMM + finalize / GEMM + one kernel
    assert lines["fused vs unfused"].endswith("2 launches instead of 6")
    assert "less HBM traffic" in lines["fused vs compile"] and "lower time bound" in lines["fused vs compile"]
    from coda_ext.graphs import identity

    plain = str(explain(identity(), "bfloat16", (128, 4096, 4096)))
    assert "fused vs compile: 0.0 MB less HBM traffic (0%)" in plain and "the same 1 launch" in plain


def _all_text(fig) -> str:
    texts = [t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text"))]
    return "\n".join(texts)


def test_layer_chart_labels_modelled_and_measured():
    """Regression: the layer chart put modelled bounds beside measured times without saying which is
    which. Every time panel says modelled; measured times are their own labelled markers."""
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = [block.layer_model("8b")]
    measured = {models[0].layer.name: {"fused": 15.37, "compile": 14.33}}
    fig = block.figure(models, measured, "measured on an H100, non-attention part")
    try:
        titles = [ax.get_title() for ax in fig.axes]
        assert all("modelled" in t for t in titles), titles
        assert "not measured" in fig._suptitle.get_text()
        text = _all_text(fig)
        assert "15.4 ms measured" in text and "14.3 ms measured" in text
        legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
        assert legend == ["GEMM floor (modelled)", "measured on an H100, non-attention part"]
        top = fig.axes[0].get_ylim()[1]
        assert top > max(15.37, models[0].total_s("unfused") * 1e3)
    finally:
        plt.close(fig)


def test_measured_times_from_a_training_benchmark_file():
    from coda_ext.analysis.__main__ import measured_times

    models = [block.layer_model("8b"), block.layer_model("1b", tokens=1024)]
    data = {"env": {"gpu": "NVIDIA H100"},
            "rows": [{"case": "layer-8b", "tokens": 8192,
                      "variants": {"coda": {"non_attention_ms": 15.4}, "liger": {"non_attention_ms": 15.1},
                                   "eager": {"non_attention_ms": 19.2}}},
                     {"case": "layer-1b", "tokens": 32768, "variants": {"coda": {"non_attention_ms": 17.7}}}]}
    got, label = measured_times(data, models)
    assert got == {models[0].layer.name: {"fused": 15.4, "unfused": 19.2}}   # 1b: other token count
    assert label == "measured on NVIDIA H100, non-attention part"


def test_diagram_png_title_fits():
    """Regression: the PNG diagram's title ran past the image's right edge."""
    pytest.importorskip("matplotlib")
    import importlib

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = importlib.import_module("coda_ext.analysis.diagram")   # the module (the package exports the function)

    model = io_model(_readme_graph(), "bfloat16", (16384, 6144, 4096), "auto")
    boxes, edges = d._build(model)
    title = d._title(model)
    assert "modelled time >=" in title
    routes, width, height = d._layout(boxes, edges, d._png_title_width(title))
    fig, heading = d._png_figure(title, boxes, routes, width, height)
    try:
        extent = heading.get_window_extent(fig.canvas.get_renderer())
        assert extent.x0 >= 0 and extent.x1 <= fig.bbox.x1 and extent.y1 <= fig.bbox.y1, (extent, fig.bbox)
    finally:
        plt.close(fig)
