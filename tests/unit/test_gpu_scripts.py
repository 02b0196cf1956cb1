"""benchmarks/sanitize.py and benchmarks/numerics_table.py without a GPU: their kernels are valid (emitted
and checked, no nvcc), their families cover every node kind, schedule and operand layout, and their
parsing and formatting work on canned compute-sanitizer output and canned results."""
from __future__ import annotations

import math
import pathlib
import sys

import pytest
import torch

import coda_ext as ce
from benchmarks import numerics_table as nt
from benchmarks import sanitize
from coda_ext.config import SCHEDULES
from coda_ext.graph import ir
from coda_ext.runtime.interface import GraphOp
from tests.helpers import checks, rand
from tests.helpers import fuzz_strategies as fz

ROOT = pathlib.Path(__file__).resolve().parents[2]

# --- build_items --------------------------------------------------------------------------------------


def test_sanitize_build_items_are_valid_kernels():
    items = sanitize.build_items()
    assert len(items) == len(sanitize.FAMILIES) <= 13   # one kernel per schedule and kind family, built in one batch
    sources = {ce.kernel_source(*item).source for item in items}
    assert len(sources) == len(items), "two families compile to the same kernel"


def test_overlap_bench_build_items_are_the_gpu_tests_kernels():
    """benchmarks/bench_overlap.py times ping-pong, overlap_ordered and overlap of each graph: valid kernels,
    each a kernel tests/gpu/test_overlap_gpu.py builds too (one prebuild serves both)."""
    from benchmarks import bench_overlap

    items = bench_overlap.build_items()
    assert len(items) == len(bench_overlap.GRAPHS) * len(bench_overlap.SCHEDULES)
    assert {c.schedule for _, _, c in items} == set(bench_overlap.SCHEDULES)
    sources = {ce.kernel_source(*item).source for item in items}
    assert len(sources) == len(items)
    from tests.gpu import test_overlap_gpu

    assert sources <= {ce.kernel_source(*item).source for item in test_overlap_gpu.build_items()}


def test_overlap_bench_llama_rows_time_auto_pingpong_and_overlap_with_plain_twins():
    """bench_overlap --llama: every row times "auto" (the heuristic's config, its operand layout) and
    ping-pong and overlap in each of LLAMA_TILES, every one a valid kernel; llama_items lists each kernel once,
    the plain GEMM of every config but overlap among them."""
    import dataclasses

    from benchmarks import bench_overlap
    from coda_ext import graphs, tuning

    items = bench_overlap.llama_items()
    keys = {(g.build().digest(), c.kernel.tag) for g, _, c in items}
    assert len(keys) == len(items)
    plain = graphs.identity().build().digest()
    for g, args, major, shapes in bench_overlap.LLAMA.values():
        graph = getattr(graphs, g)(*args)
        epilogue = ce.compile(graph, "bfloat16", "auto", major=major).epilogue
        for M, N, K in shapes.values():
            configs = bench_overlap.llama_configs(graph, major, M, N, K)
            assert configs["auto"] == dataclasses.replace(tuning.heuristic(M, N, K, 132, epilogue, major), major=major)
            assert {c.major for c in configs.values()} == {major}
            overlap = [c for c in configs.values() if c.schedule == "overlap"]
            assert {(c.tile, c.cluster) for c in overlap} == set(bench_overlap.LLAMA_TILES)
            for c in configs.values():
                assert (graph.build().digest(), c.kernel.tag) in keys
                assert (c.schedule == "overlap") != ((plain, c.kernel.tag) in keys)


def test_sanitize_families_cover_kinds_schedules_layouts_and_ragged_shapes():
    kinds, schedules, majors, modes, reduce_ops, acts, dtypes = set(), set(), set(), set(), set(), set(), set()
    for f in sanitize.FAMILIES:
        ks = ce.kernel_source(f.build(), f.dtype, f.config)
        schedules.add(ks.config.schedule)
        majors.add(ks.config.major)
        dtypes.add(f.dtype)
        for n in ks.graph.nodes + ks.lowered.nodes:
            kinds.add(n.kind)
            if n.kind == "scalar":
                modes.add(n.attr("mode"))
            if n.kind in ("row_reduce", "col_reduce", "segment_reduce"):
                reduce_ops.add((n.kind, n.attr("op")))
            if n.kind == "pair_gate":
                acts.add(n.attr("act"))
        for M, N, K in f.shapes:
            tm, tn, tk = ks.config.tile
            assert M % tm and N % tn and K % tk, f"{f.name}: {M}x{N}x{K} is a multiple of a tile side"
    everything = set(ir.ARITY) | set(ir.SINK_KINDS) | {"pair_gated_store"}
    assert everything - kinds == set(), f"node kinds no family runs: {sorted(everything - kinds)}"
    assert schedules == set(SCHEDULES)
    assert {"kk", "kn", "mn"} <= majors
    assert set(ir.SCALAR_MODES) <= modes
    assert {("row_reduce", op) for op in ir.REDUCE_OPS} <= reduce_ops
    assert {("col_reduce", op) for op in ("sum", "max", "sumsq")} <= reduce_ops
    assert set(ir.PAIR_ACTIVATIONS) <= acts
    assert dtypes == {"bfloat16", "float16"}
    assert any(ks_tile[0] == 64 for ks_tile in (f.config.tile for f in sanitize.FAMILIES))
    assert any(f.config.cluster != (1, 1) for f in sanitize.FAMILIES)


class _Interface(GraphOp):
    """The names and shapes of an op, without a kernel library (what the sanitize child reads of an op)."""

    def __init__(self, ks):
        self.major = ks.config.major   # its operand layout, as a compiled op has it
        self._init_interface(ks.lowered, ks.dtype, f"test-gpu-scripts|{ks.graph.digest()}|{ks.dtype}|{ks.config.tag}")


@pytest.mark.parametrize("family", sanitize.FAMILIES, ids=lambda f: f.name)
def test_sanitize_child_inputs_fit_each_family(family):
    """The child's operands (in the family's layout: rand.op_inputs) and inputs run the family's graph in the
    interpreter, and the outputs have the shapes the op allocates."""
    ks = ce.kernel_source(family.build(), family.dtype, family.config)
    op = _Interface(ks)
    for M, N, K in family.shapes:
        gen = torch.Generator().manual_seed(0)
        A, W, inputs = rand.op_inputs(op, M, N, K, gen)
        assert A.shape == (M, K) and W.shape == (N, K)
        assert (A.stride(0) == 1) == (ks.config.major[0] == "m") and (W.stride(0) == 1) == (ks.config.major[1] == "n")
        if ks.config.major[0] == "m":
            assert M % 8 == 0, "a transposed A needs M a multiple of 8"
        assert set(inputs) == set(op.input_names)
        out = ce.interpret(family.build(), A, W, **inputs)
        assert set(out) == set(op.output_names)
        for name, v in out.items():
            assert tuple(v.shape) == op.output_spec(name, M, N)[0], name
            assert sanitize.WRITERS.get(next((s.kind for s in op.slots if s.name == name), "output"))


def test_numerics_build_items_are_valid_kernels(monkeypatch):
    monkeypatch.delenv("CODA_NUMERICS_OPS", raising=False)
    items = nt.build_items()
    sources = {ce.kernel_source(*item).source for item in items}
    assert len(sources) == len(items)
    # each node-kind graph in each dtype, each ready op in each dtype: one kernel for both of its shapes
    assert len(items) == len(nt.DTYPES) * (len(nt.KIND_GRAPHS) + len(nt.READY_OPS))
    for op in nt.READY_OPS.values():
        for dtype in nt.DTYPES:
            tags = {nt.op_config(op, dtype, M).tag for M in nt.OP_SHAPES.values()}
            srcs = {ce.kernel_source(op.graph(), dtype, nt.op_config(op, dtype, M)).source
                    for M in nt.OP_SHAPES.values()}
            assert len(srcs) == 1, f"{op.name}: M = 4096 and 4000 pick different kernels {tags}"
    monkeypatch.setenv("CODA_NUMERICS_OPS", "none")
    assert len(nt.build_items()) == len(nt.DTYPES) * len(nt.KIND_GRAPHS)
    monkeypatch.setenv("CODA_NUMERICS_OPS", "rms_linear,weight_grad")
    assert [o.name for o in nt.selected_ops()] == ["rms_linear", "weight_grad"]
    with pytest.raises(SystemExit):
        nt.selected_ops(["nope"])


def test_numerics_node_kind_graphs_cover_every_kind():
    kinds = set()
    for name in nt.KIND_GRAPHS:
        g = nt.kind_graph(name, "bfloat16").build()
        kinds |= {n.kind for n in g.nodes}
        for n in g.nodes:
            if n.name and n.kind in ir.SINK_KINDS:
                assert f"{name}/{n.name}" in nt.LABELS, f"no table label for {name}/{n.name}"
    assert set(ir.ARITY) - {"pair_gated_store"} - kinds == set()


def test_sanitize_shares_the_node_kind_kernels_with_the_numerics_table(monkeypatch):
    monkeypatch.setenv("CODA_NUMERICS_OPS", "none")
    numerics = {ce.kernel_source(*i).source for i in nt.build_items()}
    shared = [f.name for f in sanitize.FAMILIES if ce.kernel_source(f.build(), f.dtype, f.config).source in numerics]
    assert set(shared) == {"unary", "select", "binary", "segments_pairs", "reductions"}


# --- the numerics measurement, on the CPU (the interpreter stands in for the kernel) ------------------


@pytest.mark.parametrize("name", list(nt.KIND_GRAPHS))
def test_kind_rows_on_the_interpreter(name):
    dtype = "bfloat16"
    make, extra = nt.KIND_GRAPHS[name]
    case, g = make(dtype), nt.kind_graph(name, dtype)
    M, N, K = 37, 96, 40
    A, W, inputs = fz.make_inputs(case, M, N, K, seed=3)
    z = torch.randn(M, 2 * N).to(torch.bfloat16) if extra else None
    ran = ce.interpret(g, A, W, **inputs, **({"z": z} if z is not None else {}))
    got = {k: v.to(fz.TORCH[case.outputs()[k][1]]) for k, v in ran.items() if k in case.outputs()}
    if extra:
        got["pairs"] = ran["pairs"].to(torch.bfloat16)
    rows, check = nt.kind_rows(name, dtype, (M, N, K), A, W, inputs, z, got)
    assert check == "ok"
    assert {r["output"] for r in rows} == set(got)
    for r in rows:
        assert r["rule"] == "ok", r
        assert r["checked"] > 0 and r["max_err"] >= 0 and r["torch_err"] >= 0


def test_unwritten_elements_break_the_rule():
    row = {"max_err": math.inf, "torch_err": 1e-2, "max_ref": 0.0, "checked": 10}
    assert nt.rule_verdict(row) != "ok"
    assert nt.rule_verdict(dict(row, max_err=1e-2)) == "ok"
    assert nt.rule_verdict(dict(row, max_err=3e-2)) == "over 2x PyTorch's error"


def test_ready_op_references_on_the_cpu(monkeypatch):
    for k, v in dict(D_MODEL=64, FFN=96, N_HEADS=4, N_KV_HEADS=2, HEAD_DIM=16, VOCAB=200).items():
        monkeypatch.setattr(nt, k, v)
    for op in nt.READY_OPS.values():
        _, ref, base = nt.ready_op_case(op.name, "bfloat16", 12, device="cpu")
        assert len(ref) == len(base) == len(op.outputs), op.name
        for o, r, b in zip(op.outputs, ref, base):
            assert r.shape == b.shape, (op.name, o)
            assert checks.max_err(b, r, r.isfinite()) < 1.0, (op.name, o)


def test_same_bits_and_determinism_summary():
    a = torch.tensor([1.0, -0.0])
    assert nt.same_bits(a, a.clone()) and not nt.same_bits(a, torch.tensor([1.0, 0.0]))
    det = nt.summarize_determinism({("unary", "bfloat16"): [
        {"repeat": True, "orders": {"swizzle=1,heuristic": True}, "check_device": "ok"},
        {"repeat": True, "orders": {"swizzle=1,heuristic": False}, "check_device": "exp: too far"}]})
    assert det == [{"kernel": "unary bfloat16", "repeat": True, "orders": {"swizzle=1,heuristic": False},
                    "identical": False, "check_device": ["exp: too far"]}]


def _row(graph, output, dtype, shape, err, terr, rule="ok"):
    return {"graph": graph, "output": output, "label": nt.LABELS.get(f"{graph}/{output}", output), "dtype": dtype,
            "shape": shape, "max_err": err, "torch_err": terr, "rule": rule}


def test_format_tables():
    result = {
        "kinds": [_row("unary", "exp", d, s, 1.5e-2, 3e-2) for d in nt.DTYPES for s in nt.KIND_SHAPES]
        + [_row("unary", "log", "bfloat16", "4096^3", 0.0, math.nan, rule="over 2x PyTorch's error")],
        "ops": [_row("rms_linear", "out", "bfloat16", "M=4096", 1.6e-2, 4.7e-2)],
        "determinism": [{"kernel": "unary bfloat16", "identical": True},
                        {"kernel": "unary float16", "identical": False},
                        {"kernel": "rms_linear bfloat16", "identical": True}]}
    text = nt.format_tables(result)
    lines = text.splitlines()
    header = next(x for x in lines if x.startswith("| node kind"))
    assert header.count("|") == 2 + len(nt.DTYPES) * len(nt.KIND_SHAPES) + 1
    exp = next(x for x in lines if x.startswith("| exp"))
    assert exp.count("1.5e-02 / 3.0e-02") == 4 and exp.endswith("| yes / NO |")
    log = next(x for x in lines if x.startswith("| log"))
    assert "0 / - (!)" in log and log.count("| - ") >= 3
    assert any(x.startswith("| rms_linear out | 1.6e-02 / 4.7e-02 | yes |") for x in lines)
    assert nt._jsonable({"a": math.nan, "b": [math.inf]}) == {"a": None, "b": ["inf"]}


# --- compute-sanitizer output -------------------------------------------------------------------------

CLEAN = """\
========= COMPUTE-SANITIZER
========= ERROR SUMMARY: 0 errors
"""

MEMCHECK_OOB = """\
========= COMPUTE-SANITIZER
========= Invalid __global__ write of size 4 bytes
=========     at void coda::kernels::finalize_partials_kernel(coda::kernels::FinalizeBatch)+0x1f0
=========     by thread (5,0,0) in block (0,0,0)
=========     Address 0x7f0000001538 is out of bounds
=========     and is 4 bytes after the nearest allocation at 0x7f0000001000 of size 1332 bytes
=========     Device Frame: finalize_partials_kernel
=========
========= Program hit cudaErrorLaunchFailure (error 719) due to "unspecified launch failure" on CUDA API call to cudaStreamSynchronize.
=========
========= Target application returned an error
========= ERROR SUMMARY: 2 errors
"""  # noqa: E501  (compute-sanitizer's lines as it prints them)

RACECHECK = """\
========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<X>>(T1::Params)+0x1a30
=========     and Read access at void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<X>>(T1::Params)+0x1c40 [1024 hazards]
=========
========= Warning: Race reported between Write access at 0x50 in kernel(float *) and Write access at 0x60 in kernel(float *)
========= RACECHECK SUMMARY: 2 hazards displayed (1 error, 1 warning)
"""  # noqa: E501  (compute-sanitizer's lines as it prints them)

RACECHECK_CLEAN = """\
========= COMPUTE-SANITIZER
========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)
"""

# initcheck over the families: two TMA-stored outputs (D of plain, a store of unary) read back by cudaMemcpy
INITCHECK_TMA = """\
========= COMPUTE-SANITIZER
[sanitize] initcheck plain: 1 launch(es)
========= Host API uninitialized memory access
=========     Uninitialized access to 0x7f0000200010 on access by cudaMemcpy source.
=========
========= Uninitialized access to 0x7f0000300000 on access by cudaMemcpy source.
=========
========= ERROR SUMMARY: 2 errors
"""

MANIFEST = {"families": {
    "plain": {"launches": 1, "unwritten": 0, "error": None, "tensors": [
        {"name": "out@333x264x72", "role": "output", "writer": "tma_store", "ptr": 0x7f0000200000, "nbytes": 175824},
        {"name": "A@333x264x72", "role": "operand", "writer": None, "ptr": 0x7f0000100000, "nbytes": 47952}]},
    "unary": {"launches": 1, "unwritten": 0, "error": None, "tensors": [
        {"name": "exp@333x264x72", "role": "output", "writer": "tma_store", "ptr": 0x7f0000300000, "nbytes": 175824}]},
    "reductions": {"launches": 1, "unwritten": 0, "error": None, "tensors": [
        {"name": "row_sum@333x264x72", "role": "output", "writer": "st_global (finalize)", "ptr": 0x7f0000001000,
         "nbytes": 1332}]},
}}

PROBE_STDOUT = """\
probe st_global buffer 0x7f1000000000 bytes 4096 values ok
probe bulk_store buffer 0x7f1000001000 bytes 4096 values ok
probe tma_store buffer 0x7f1000002000 bytes 4096 values ok
probe tma_store_3d buffer 0x7f1000003000 bytes 4096 values ok
probe unwritten buffer 0x7f1000004000 bytes 4096 values n/a
probe tma_load buffer 0x7f1000005000 bytes 4096 values n/a
probe done
"""


def _device_reads(kernel: str, base: int, n: int) -> str:
    return "".join(f"""\
========= Uninitialized __global__ memory read of size 4 bytes
=========     at (anonymous namespace)::{kernel}(const unsigned int *, unsigned int *)+0x70 in initcheck_probe.cu:139
=========     by thread ({i},0,0) in block (0,0,0)
=========     Address {hex(base + 132 * i)}
=========
""" for i in range(n))


PROBE_TMA_BLIND = ("========= COMPUTE-SANITIZER\n" + _device_reads("read_after_tma_store", 0x7f1000002000, 32)
                   + _device_reads("read_after_tma_store_3d", 0x7f1000003000, 32)
                   + _device_reads("read_after_unwritten", 0x7f1000004000, 32)
                   + "========= Host API uninitialized memory access\n"
                     "=========     Uninitialized access to 0x7f1000002000 on access by cudaMemcpy source.\n"
                   + "========= Uninitialized access to 0x7f1000004000 on access by cudaMemcpy source.\n"
                   + "========= Uninitialized access to 0x7f1000005000 on access by cudaMemcpy source.\n"
                   + "========= ERROR SUMMARY: 99 errors\n")


def test_parse_clean_and_memcheck():
    assert sanitize.parse_report(CLEAN)["errors"] == 0
    p = sanitize.parse_report(MEMCHECK_OOB)
    assert p["errors"] == 2 and p["target_error"] and p["banner"]
    assert p["records"][0]["signature"] == "Invalid __global__ write of size N bytes"
    rec = p["records"][0]
    assert rec["kernel"] == "void coda::kernels::finalize_partials_kernel(coda::kernels::FinalizeBatch)"
    assert rec["addresses"] == [0x7f0000001538, 0x7f0000001000]
    assert sanitize.kernel_class(rec["kernel"]) == "coda_finalize"
    att = sanitize.attribute(p, MANIFEST)   # the overrun is matched to the allocation it ran past
    assert att["by_family"] == {"reductions": 1} and att["unattributed_records"] == 1


def test_the_error_count_is_the_summary_not_the_unprinted_rest():
    # past --print-limit compute-sanitizer adds "N errors were not printed" after the summary: that line once
    # replaced the count (initcheck's 8568 read as 6568)
    text = CLEAN.replace("0 errors", "8568 errors") + ("========= ERROR SUMMARY: 6568 errors were not printed. Use "
                                                       "--print-limit option to adjust the number of printed errors\n")
    assert sanitize.parse_report(text)["errors"] == 8568


def test_parse_racecheck():
    p = sanitize.parse_report(RACECHECK)
    assert p["racecheck"] == {"hazards": 2, "errors": 1, "warnings": 1} and p["errors"] is None
    assert sanitize.kernel_class(p["records"][0]["kernel"]) == "coda_gemm"
    assert p["records"][1]["kernel"] == "kernel(float *)"
    assert sanitize.parse_report(RACECHECK_CLEAN)["racecheck"]["hazards"] == 0


def test_summarize_tool_and_result_lines():
    res = {"log": RACECHECK_CLEAN, "manifest": MANIFEST, "rc": 0, "timed_out": False, "seconds": 12.0}
    s = sanitize.summarize_tool("racecheck", res)
    assert s["errors"] == 0 and s["families_failed"] == [] and set(s["families"]) == set(MANIFEST["families"])
    assert "tensors" not in s["families"]["plain"]
    s2 = sanitize.summarize_tool("racecheck", dict(res, log=RACECHECK))
    assert s2["errors"] == 2
    summary = {"tools": {"racecheck": dict(s, families_missing=[])}}
    (line,) = sanitize._result_lines(summary)
    assert line.startswith("racecheck: 0 error(s) over 3 families (3 launches)")


def test_initcheck_attribution_and_probe_verdicts():
    p = sanitize.parse_report(INITCHECK_TMA)
    assert p["errors"] == 2 and len(p["records"]) == 2
    att = sanitize.attribute(p, MANIFEST)
    assert att["by_writer"] == {"tma_store": 2} and att["unattributed_records"] == 0
    assert att["outputs_flagged"]["tma_store"] == ["plain/out@333x264x72", "unary/exp@333x264x72"]
    assert att["outputs_total"] == {"tma_store": 2, "st_global (finalize)": 1}

    probe_out = sanitize.parse_probe_stdout(PROBE_STDOUT)
    assert probe_out["done"] and probe_out["buffers"]["tma_store"] == {"address": 0x7f1000002000, "bytes": 4096,
                                                                        "values": "ok"}
    counts = sanitize.probe_counts(sanitize.parse_report(PROBE_TMA_BLIND), probe_out)
    assert counts["tma_store"] == {"device": 32, "host": 1}
    assert counts["tma_store_3d"] == {"device": 32, "host": 0}
    assert counts["unwritten"] == {"device": 32, "host": 1}
    assert counts["st_global"] == counts["bulk_store"] == {"device": 0, "host": 0}
    assert counts["tma_load"] == {"device": 0, "host": 1}
    values = {m: b["values"] for m, b in probe_out["buffers"].items()}
    probe = sanitize.probe_verdict(counts, values)
    assert probe["conclusive"] and not probe["tma_store_seen"] and probe["bulk_store_seen"]
    assert "tma_store: NOT seen (33 reports)" in probe["line"] and "bulk_store: seen" in probe["line"]
    assert not probe["tma_load_checked"] and "TMA load of unwritten memory is not reported" in probe["line"]

    v = sanitize.initcheck_verdict(probe, att, 2, [])
    assert v["verdict"] == "tool_limitation" and "TMA-stored 2 of 2" in v["line"]
    # the same reports, but the probe saw TMA stores: not settled
    seen = sanitize.probe_verdict({m: {"device": 32 * (m == "unwritten"), "host": 0} for m in sanitize.PROBE_MODES},
                                  values)
    assert seen["tma_store_seen"]
    assert sanitize.initcheck_verdict(seen, att, 2, [])["verdict"] == "unsettled"
    # an st.global-written output reported: a real gap
    gap = sanitize.parse_report(INITCHECK_TMA.replace("0x7f0000300000", "0x7f0000001010"))
    assert sanitize.initcheck_verdict(probe, sanitize.attribute(gap, MANIFEST), 2, [])["verdict"] == "real_gap"
    # a coda_ext kernel reading uninitialized memory (its workspace, say): a real gap, wherever it points
    read = sanitize.parse_report(INITCHECK_TMA.replace(
        "========= ERROR SUMMARY: 2 errors",
        "========= Uninitialized __global__ memory read of size 4 bytes\n"
        "=========     at void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<X>>(T1::Params)+0x70\n"
        "=========     Address 0x7e0000000000\n========= ERROR SUMMARY: 3 errors"))
    v_read = sanitize.initcheck_verdict(probe, sanitize.attribute(read, MANIFEST), 3, [])
    assert v_read["verdict"] == "real_gap" and v_read["coda_kernel_reads"] == 1
    # a report in PyTorch's own memory (no coda_ext tensor, a torch kernel) does not make a gap
    torch_read = sanitize.parse_report(INITCHECK_TMA.replace(
        "========= ERROR SUMMARY: 2 errors",
        "========= Uninitialized __global__ memory read of size 4 bytes\n"
        "=========     at void at::native::vectorized_elementwise_kernel<4>(int)+0x70\n"
        "=========     Address 0x7e0000000000\n========= ERROR SUMMARY: 3 errors"))
    v_torch = sanitize.initcheck_verdict(probe, sanitize.attribute(torch_read, MANIFEST), 3, [])
    assert v_torch["verdict"] == "tool_limitation" and v_torch["outside"] == 1
    assert sanitize.initcheck_verdict(probe, sanitize.attribute(sanitize.parse_report(CLEAN), MANIFEST), 0,
                                      [])["verdict"] == "clean"
    assert sanitize.initcheck_verdict(probe, att, None, ["plain"])["verdict"] == "incomplete"
    # controls that fail make the probe inconclusive
    assert not sanitize.probe_verdict({m: {"device": 0, "host": 0} for m in sanitize.PROBE_MODES}, values)["conclusive"]
    assert not sanitize.probe_verdict(None, None, "nvcc failed")["conclusive"]


def test_trim_log_keeps_summaries_and_counts_what_it_drops():
    text = PROBE_TMA_BLIND + "application line\n"
    trimmed = sanitize.trim_log(text, per_signature=2, record_lines=2)
    assert "ERROR SUMMARY: 99 errors" in trimmed and "application line" in trimmed
    assert sum(x.startswith("========= Uninitialized __global__") for x in trimmed.splitlines()) == 2
    assert "[trimmed: 94 more record(s) like: Uninitialized __global__ memory read of size N bytes]" in trimmed
    assert len(sanitize.trim_log("\n".join(f"line {i}" for i in range(100)), max_lines=10).splitlines()) == 11


def test_sanitizer_command_and_lookup(tmp_path, monkeypatch):
    cmd = sanitize.sanitizer_cmd("/x/compute-sanitizer", "memcheck", "/tmp/m.log", 49152)
    assert cmd[:3] == ["/x/compute-sanitizer", "--tool", "memcheck"]
    assert "application-only" in cmd and "--log-file" in cmd and "--padding" in cmd
    assert "--padding" not in sanitize.sanitizer_cmd("cs", "racecheck", "r.log", 1)
    fake = tmp_path / "compute-sanitizer"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    assert sanitize.find_sanitizer(str(fake)) == str(fake)
    monkeypatch.setattr(sanitize, "find_sanitizer", lambda explicit=None: None)
    assert sanitize.main(["--tools", "memcheck"]) == 2


def test_probe_source_is_there_and_names_its_readers():
    src = sanitize.PROBE_SOURCE.read_text()
    for mode, reader in sanitize.PROBE_READERS.items():
        assert reader in src, reader
        assert f'"{mode}"' in src, mode
    assert "cp.async.bulk.tensor.3d.global.shared::cta.bulk_group" in src and "wait_group.read 0" in src


def test_numerics_main_writes_json_and_prints_tables(tmp_path, monkeypatch, capsys):
    canned = {"environment": {}, "kinds": [_row("unary", "exp", "bfloat16", "333x4000x4040", 1e-2, 2e-2)],
              "ops": [], "determinism": [{"kernel": "unary bfloat16", "identical": True, "check_device": "ok"}],
              "failures": [], "seconds": 1.0}
    monkeypatch.setattr(nt, "run", lambda args: canned)
    out = tmp_path / "numerics.json"
    assert nt.main(["--quick", "--out", str(out)]) == 0
    import json

    assert json.loads(out.read_text())["kinds"][0]["output"] == "exp"
    text = capsys.readouterr().out
    assert "| exp (of min(acc, 8)) | 1.0e-02 / 2.0e-02 | yes |" in text and "not bit-identical: none" in text
    monkeypatch.setattr(nt, "run", lambda args: dict(canned, failures=["unary bfloat16: boom"]))
    assert nt.main(["--out", str(out)]) == 1


def test_prebuild_cli_loads_both_scripts():
    """`python -m coda_ext prebuild benchmarks/sanitize.py benchmarks/numerics_table.py` imports them outside
    sys.modules (dataclasses with string annotations would fail there)."""
    from coda_ext.tools.prebuild import load_items

    for name, want in (("sanitize.py", len(sanitize.FAMILIES)), ("numerics_table.py", len(nt.build_items()))):
        items = load_items(str(ROOT / "benchmarks" / name))
        assert len(items) == want and all(isinstance(cfg, ce.KernelConfig) for _, _, cfg in items)


def test_prebuild_cli_imports_a_files_siblings(tmp_path):
    """Regression: `python -m coda_ext prebuild benchmarks/bench_llama_training.py` failed in a fresh
    process (a sibling import: the file's folder was not on sys.path as it is for `python FILE`). A user's
    file imports its siblings; a benchmark imports its package (`from benchmarks import common`) and
    tests.helpers, from any working directory."""
    import subprocess

    (tmp_path / "helper_sibling.py").write_text("N = 3\n")
    (tmp_path / "items.py").write_text(
        "from __future__ import annotations\nimport dataclasses\nimport helper_sibling\n\n\n"
        "@dataclasses.dataclass(frozen=True)\nclass Shape:\n    n: int\n\n\n"
        "def build_items():\n    return [Shape(helper_sibling.N)]\n")
    code = ("import sys; from coda_ext.tools.prebuild import load_items; "
            "print(len(load_items(sys.argv[1])), len(load_items(sys.argv[2])))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "items.py"),
                          str(ROOT / "benchmarks" / "bench_llama_training.py")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[0] == "1" and int(out.stdout.split()[1]) > 0


def test_sanitizer_log_shows_no_machine_paths():
    """The committed log names the checkout, the Python and the scratch folder, not this machine's paths."""
    import sys as _sys

    cmd = ["compute-sanitizer", "--log-file", "/tmp/coda_sanitize_ab12_x/memcheck.log", _sys.executable,
           "-m", "benchmarks.sanitize", "--child", "memcheck"]
    assert sanitize.shown(cmd) == ("compute-sanitizer --log-file $TMP/memcheck.log python -m benchmarks.sanitize "
                                   "--child memcheck")
    probe = ["nvcc", "-o", "/tmp/coda_sanitize_ab12_x/initcheck_probe", str(sanitize.PROBE_SOURCE)]
    assert sanitize.shown(probe) == "nvcc -o $TMP/initcheck_probe benchmarks/initcheck_probe.cu"


def test_every_gpu_test_file_that_builds_kernels_lists_them():
    """A GPU test file whose fixtures build kernels defines build_items(), so `python -m coda_ext prebuild` (and
    benchmarks/gpu_session.sh, which prebuilds every such file) builds the whole suite ahead, on any machine."""
    import pathlib

    gpu = pathlib.Path(__file__).resolve().parents[1] / "gpu"
    shared = ("cases.build_items()", "ops_cases.build_items()")   # files gpu_session.sh prebuilds by name
    missing = [f.name for f in sorted(gpu.glob("test_*.py"))
               if "prebuild(" in f.read_text() and "\ndef build_items(" not in f.read_text()
               and not any(s in f.read_text() for s in shared)]
    assert not missing, missing
    session = (pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_session.sh").read_text()
    assert 'grep -l "^def build_items" tests/gpu/test_*.py' in session
