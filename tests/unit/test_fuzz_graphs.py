"""Property-based tests on random epilogue graphs (tests/helpers/fuzz_strategies.py builds them from the
public builder, one table row per builder call):

- the interpreter matches an independent fp64 reference on every graph;
- the fp32 interpreter passes the rule the GPU fuzz test applies to kernels (tests/gpu/test_fuzz_gpu.py);
- every graph lowers and emits C++ for bf16 and fp16 and several kernel configs;
- a mistake added to a valid graph raises GraphError naming the node;
- every node kind, dtype, reduction op and sink was exercised (with a few fixed coverage graphs for
  whatever the random draws miss; the last test checks, and logs the count).

Deterministic (derandomized) and bounded: about 1000 graphs in well under a minute.
"""
from __future__ import annotations

import collections
import dataclasses
import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import coda_ext as ce
from coda_ext.config import MAJORS
from tests.helpers import fuzz_strategies as fz

SETTINGS = dict(deadline=None, derandomize=True, database=None, print_blob=False,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
CONFIGS = [None, ce.KernelConfig(tile=(128, 256, 64), cluster=(2, 1), schedule="cooperative"),
           ce.KernelConfig(tile=(64, 128, 64), schedule="pingpong")]

GRAPHS: collections.Counter = collections.Counter()   # graphs run, per test
FEATURES: set[str] = set()                             # what they exercised


def _dims(data, case: fz.Case, gpu_like: bool = False) -> tuple[int, int, int]:
    """M, N, K for `case`: M and N not multiples of anything, N a multiple of what the graph needs."""
    step = case.n_multiple if not gpu_like else max(8, case.n_multiple)
    M = data.draw(st.integers(1, 40), label="M")
    N = step * data.draw(st.integers(1, max(1, 96 // step)), label="N / multiple")
    K = data.draw(st.integers(1, 24), label="K")
    return M, N, K


def _seen(test: str, case: fz.Case) -> None:
    GRAPHS[test] += 1
    FEATURES.update(case.features())


def _assert_same(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Equal shapes, the same inf/NaN pattern, numbers equal to fp64 rounding."""
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert torch.equal(got.isnan(), want.isnan()), f"{what}: NaN pattern differs"
    inf = want.isinf()
    assert torch.equal(got.isinf(), inf) and torch.equal(got[inf], want[inf]), f"{what}: inf pattern differs"
    num = want.isfinite()
    torch.testing.assert_close(got[num], want[num], rtol=1e-9, atol=1e-12, msg=lambda m: f"{what}: {m}")


# --- the interpreter against the reference -----------------------------------------------------------


@settings(max_examples=350, **SETTINGS)
@given(data=st.data())
def test_interpreter_matches_reference(data):
    case = data.draw(fz.hypothesis_cases("any"), label="case")
    M, N, K = _dims(data, case)
    A, W, inputs = fz.make_inputs(case, M, N, K, seed=M * N + K)
    want = fz.evaluate(case, A, W, inputs)
    got = ce.interpret(case.build(), A, W, compute_dtype=torch.float64, **inputs)
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name].dtype == torch.float64
        _assert_same(got[name], want[name], name)
    _seen("interpreter", case)


@pytest.mark.parametrize("mode", ["any", "gpu"], ids=["any math", "guarded"])  # not "gpu": a marker name
def test_coverage_graphs(mode):
    """The fixed graphs that use every row with every parameter value (whatever the random draws
    above miss): the interpreter matches the reference, and they emit."""
    for case in fz.coverage_cases(3, every_row=True, mode=mode):
        M, N, K = 7, 2 * case.n_multiple, 16
        A, W, inputs = fz.make_inputs(case, M, N, K, seed=5)
        want = fz.evaluate(case, A, W, inputs)
        got = ce.interpret(case.build(), A, W, compute_dtype=torch.float64, **inputs)
        assert sorted(got) == sorted(want)
        for name in want:
            _assert_same(got[name], want[name], name)
        ce.kernel_source(case.build(), case.dtype, case.config)
        _seen("coverage", case)


@settings(max_examples=200, **SETTINGS)
@given(data=st.data())
def test_fp32_interpreter_passes_the_device_rule(data):
    """What tests/gpu/test_fuzz_gpu.py asserts of a kernel, asserted of the fp32 interpreter and of a
    perturbed fp32 evaluation (outputs rounded to their dtypes): the rule holds for honest fp32 math."""
    case = data.draw(fz.hypothesis_cases("gpu"), label="case")
    M, N, K = _dims(data, case, gpu_like=True)
    A, W, inputs = fz.make_inputs(case, M, N, K, seed=M + N * K)
    g = case.build()
    ref = fz.reference(case, A, W, inputs)
    baseline = ce.interpret(g, A, W, compute_dtype=fz.TORCH[case.dtype], **inputs)
    specs = case.outputs()
    fp32 = ce.interpret(g, A, W, compute_dtype=torch.float32, **inputs)
    perturbed = fz.reference(case, A, W, inputs, seed=1234)
    for device in (fp32, {k: v.lanes[-1] for k, v in perturbed.items()}):
        got = {k: v.to(fz.TORCH[specs[k][1]]) for k, v in device.items()}
        fz.check_device(case, got, ref, baseline)
    _seen("device rule", case)


ACC, OUT = ("g.accumulator()", (), {}, None), "g.output({0})"
PLANTED = {  # bug: (the graph, the row whose math is planted wrong, the wrong math)
    "pair_swap": (fz.make_case(ACC, ("g.tile({name!r})", (), {}, "t"), ("ce.pair_swap({0})", (1,), {}, None),
                               ("{0} * {1}", (2, 0), {}, None), (OUT, (3,), {}, "out")),
                  "ce.pair_swap({0})", lambda x: x),
    "col_index": (fz.make_case(ACC, ("g.col_index()", (), {}, None),
                               ("g.col_vector({name!r}, {dtype!r})", (), {"dtype": "int32"}, "c"),
                               ("ce.eq({0}, {1})", (1, 2), {}, None), ("g.tile({name!r})", (), {}, "t"),
                               ("ce.where({0}, {1}, {2})", (3, 4, 0.0), {}, None), (OUT, (5,), {}, "out"),
                               ("g.store({name!r}, {0})", (0,), {}, "a")),
                  "g.col_index()", lambda lane, name: lane.col_index + 1),
    "pair_tile halves": (fz.make_case(ACC, ("g.pair_tile({name!r})", (), {}, "z"), ("{0} * {1}", ((1, 0), 0), {}, None),
                                      ("{0} + {1}", (2, (1, 1)), {}, None), (OUT, (3,), {}, "out")),
                         "g.pair_tile({name!r})", lambda lane, name: lane.inputs[name][::-1]),
    "store_pairs order": (fz.make_case(ACC, ("ce.silu({0})", (0,), {}, None),
                                       ("g.store_pairs({name!r}, {0}, {1})", (0, 1), {}, "dz")),
                          "g.store_pairs({name!r}, {0}, {1})",
                          lambda even, odd, dtype: fz._store_pairs(odd, even, dtype)),
    "bias": (fz.make_case(ACC, ("ce.silu({0})", (0,), {}, None), (OUT, (1,), {}, "out"),
                          ("g.row_reduce({name!r}, {0})", (1,), {}, "r")), None, None),
    "unwritten": (fz.make_case(ACC, ("g.row_vector({name!r})", (), {}, "b"), ("{0} + {1}", (0, 1), {}, None),
                               (OUT, (2,), {}, "out")), None, None),
}


@pytest.mark.parametrize("bug", list(PLANTED))
def test_device_rule_catches_planted_bugs(bug):
    """The rule has teeth: an unswapped pair, a column index off by one, a pair tile's halves swapped,
    pairs stored in the wrong order, a 10% error and an unwritten element all fail it (while an honest
    perturbed fp32 evaluation passes)."""
    case, code, wrong = PLANTED[bug]
    M, N, K = 33, 40, 24
    A, W, inputs = fz.make_inputs(case, M, N, K, seed=3)
    if bug == "col_index":
        inputs["c"][::2] = torch.arange(0, M, 2) % N    # a match in every other row
    ref = fz.reference(case, A, W, inputs)
    baseline = ce.interpret(case.build(), A, W, compute_dtype=torch.bfloat16, **inputs)
    specs = case.outputs()

    def device():
        out = fz.reference(case, A, W, inputs, seed=9)
        return {k: v.lanes[-1].to(fz.TORCH[specs[k][1]]) for k, v in out.items()}

    fz.check_device(case, device(), ref, baseline)
    table = next((t for t in fz.TABLES.values() for r in t if r.code == code), None)
    i = next((i for i, r in enumerate(table or ()) if r.code == code), None)
    if table is not None:
        saved, table[i] = table[i], dataclasses.replace(table[i], ref=wrong)
    try:
        got = device()
    finally:
        if table is not None:
            table[i] = saved
    if bug == "bias":
        got = {k: v * 1.1 for k, v in got.items()}
    if bug == "unwritten":
        got["out"][-1, -1] = float("nan")
    with pytest.raises(AssertionError, match="unwritten" if bug == "unwritten" else None):
        fz.check_device(case, got, ref, baseline)


# --- lowering and emission -----------------------------------------------------------------------


def _config_line(source: str) -> str:
    return next(line for line in source.splitlines() if line.startswith("using Cfg = "))


@settings(max_examples=350, **SETTINGS)
@given(case=fz.hypothesis_cases("any"), majors=st.lists(st.sampled_from(MAJORS), min_size=2, max_size=2))
def test_every_graph_emits(case, majors):
    """With each config of CONFIGS (the second and third in a drawn operand layout, KernelConfig.major)."""
    g = case.build()
    inputs = {name for name, _, _ in case.inputs()}
    outputs = {name for name, (kind, _, _) in case.outputs().items() if kind != "output"}
    configs = CONFIGS[:1] + [dataclasses.replace(c, major=m) for c, m in zip(CONFIGS[1:], majors)]
    for dtype in ("bfloat16", "float16"):
        for config in configs:
            try:
                ks = ce.kernel_source(g, dtype, config)
            except ce.UnsupportedError as e:  # refused before nvcc, with the fix (wide fp32 epilogues)
                # a refusal may come, not must: when it does, it names the fix
                assert "shared memory" in str(e) and "fewer than 2 stages" in str(e), str(e)  # noqa: PT017
                continue
            assert ks.source.startswith("// Generated by coda_ext") and ks.lowered.digest() in ks.source
            lowered = ks.lowered
            names = {lowered[i].name for i in lowered.slots()}
            assert names == inputs | outputs, f"launch slots {sorted(names)} != {sorted(inputs | outputs)}"
            assert ks.source == ce.emit_source(g, dtype, config)
            # the operand layout: two bools (A's M, W's N contiguous) close Config<...>, and the tag says it
            major, line = ks.config.major, _config_line(ks.source)
            tag = ks.config.tag.removesuffix("_gr")   # "_gr": register gated stores where the TMA stage did not fit
            if major == "kk":
                assert not line.endswith(("true>;", "false>;")), line
                assert not tag.endswith(tuple(f"_{m}" for m in MAJORS)), ks.config.tag
            else:
                assert line.endswith(f", {str(major[0] == 'm').lower()}, {str(major[1] == 'n').lower()}>;"), line
                assert tag.endswith(f"_{major}"), ks.config.tag
    _seen("emit", case)
    FEATURES.update(f"config major={m}" for m in majors)


# --- graphs the builder must reject ------------------------------------------------------------------

#: (id, applies to the case, a line added to its program, what the GraphError must say: it names the node)
MUTATIONS = [
    ("math on a half-width value", None, "ce.exp(ce.pair_gate({v}))", r"exp: .*half-width result of pair_gate"),
    ("reduction of a half-width value", None, "g.row_reduce('bad', ce.pair_gate({v}))",
     r"row_reduce 'bad'.*half-width result of .*pair_gate"),
    ("output of a half-width value", "no output", "g.output(ce.pair_gate({v}))", r"output 'out'.*half-width"),
    ("second output", "output", "g.output({v}, name='second')", r"already has an output"),
    ("duplicate name", None, "g.tile({taken!r})", r"'{taken}' is already used"),
    ("unused input", None, "g.row_vector('unused')", r"'unused' is never used"),
    ("unknown reduction op", None, "g.col_reduce('bad', {v}, 'mean')", r"col_reduce 'bad'.*'mean'"),
    ("logsumexp over M", None, "g.col_reduce('bad', {v}, 'logsumexp')", r"col_reduce 'bad'.*'logsumexp'"),
    ("segment size", "segment_reduce", "ce.segment_reduce({v}, 48)", r"segment_reduce: size"),
    ("segment op", "segment_reduce", "ce.segment_reduce({v}, 32, 'logsumexp')", r"segment_reduce: op"),
    ("two segment sizes", "segment_reduce",
     "g.store('bad', ce.segment_reduce({v}, 32) + ce.segment_reduce({v}, 64))", r"segment_reduce.*one segment size"),
    ("integer tile", None, "g.tile('bad', 'int32')", r"'bad'"),
    ("integer store", None, "g.store('bad', {v}, dtype='int64')", r"'bad'"),
    ("unknown vector dtype", None, "g.row_vector('bad', 'float64')", r"'bad'"),
    ("integer cast", None, "ce.cast({v}, 'int32')", r"\bcasts?\b"),
    ("value of another graph", None, "{v} + ce.Graph().accumulator()", r"operand 1 of add belongs to another Graph"),
    ("NaN constant", None, "{v} * float('nan')", r"operand 1 of mul is nan: constants must be finite"),
    ("constant beyond fp32", None, "{v} - 1e39", r"operand 1 of sub is 1e\+39, outside the fp32 range"),
    ("bool operand", None, "ce.maximum({v}, True)", r"operand 1 of max must be a coda_ext Value .* got bool"),
    ("numbers only", None, "ce.exp(2.0)", r"\bexp\b"),
    ("reserved name", None, "g.store('A', {v})", r"store name 'A' is reserved"),
    ("keyword name", None, "g.row_vector('lambda')", r"row vector name 'lambda' must be a Python identifier"),
    ("gelu mode", None, "ce.gelu({v}, approximate='fast')", r"gelu: approximate"),
    ("pair activation", None, "ce.pair_gate({v}, 'tanh')", r"pair_gate: unsupported activation 'tanh'"),
    ("scalar with name and value", None, "g.scalar('bad', 2.0)", r"scalar 'bad'"),
    ("too many reductions", None, "for i in range(9): g.row_reduce(f'many{{i}}', {v})", r"reductions; at most 8"),
    ("too many inputs", None, "g.store('many', sum(g.tile(f'many{{i}}') for i in range(33)) * {v})",
     r"runtime inputs and outputs; at most 32"),
    ("fp32 pair tile", "pair_tile", "g.pair_tile('bad', 'float32')", r"pair tile 'bad': pairs are 16-bit elements"),
    ("integer pair tile", "pair_tile", "g.pair_tile('bad', 'int32')", r"pair tile 'bad'"),
    ("unused pair tile", "pair_tile", "g.pair_tile('unused')", r"\(pair_tile 'unused'\).*never used"),
    ("pair tile name taken", "pair_tile", "g.pair_tile({taken!r})", r"'{taken}' is already used"),
    ("a pair tile as an operand", "pair_tile", "{v} + g.pair_tile('bad')",
     r"operand 1 of add must be a coda_ext Value or a Python number, got tuple"),
    ("fp32 pair store", "store_pairs", "g.store_pairs('bad', {v}, {v}, dtype='float32')",
     r"store_pairs 'bad': pairs are 16-bit elements"),
    ("half-width pair store", "store_pairs", "g.store_pairs('bad', {v}, ce.pair_gate({v}))",
     r"store_pairs 'bad': .*full-width.*pair_gate"),
    ("pair store name taken", "store_pairs", "g.store_pairs({taken!r}, {v}, 1.0)", r"'{taken}' is already used"),
    ("pair store of another graph", "store_pairs", "g.store_pairs('bad', {v}, ce.Graph().accumulator())",
     r"store_pairs 'bad' odd value belongs to another Graph"),
]


#: Mutations whose message is wrong today, each pinned by a regression test at the end of this file:
#: drop the entry when its test starts to pass (strict xfail: it then fails until the marker goes).
KNOWN: dict[str, str] = {}


def _applies(condition: str | None, case: fz.Case) -> bool:
    has_output = any(kind == "output" for kind, _, _ in case.outputs().values())
    if condition in ("output", "no output"):
        return has_output == (condition == "output")
    return condition is None or hasattr(ce, condition) or hasattr(ce.Graph, condition)


def rejected(case: fz.Case, line: str) -> Exception | None:
    """Runs the case's program plus `line`, builds and emits; returns what it raised."""
    ns = {"ce": ce}
    try:
        exec("\n".join(case.lines() + [line]), ns)
        ce.kernel_source(ns["g"].build())
    except Exception as e:  # noqa: BLE001 - the caller inspects it
        return e
    return None


@settings(max_examples=150, **SETTINGS)
@given(data=st.data())
def test_mistakes_raise_graph_error_naming_the_node(data):
    case = data.draw(fz.hypothesis_cases("any", max_ops=6), label="case")
    mutations = [m for m in MUTATIONS if m[0] not in KNOWN and _applies(m[1], case)]
    mutation = data.draw(st.sampled_from(mutations), label="mutation")
    taken = [s.name for s in case.steps if s.name]
    fields = dict(v=data.draw(st.sampled_from(case.values())), taken=data.draw(st.sampled_from(taken)))
    line = mutation[2].format(**fields)
    error = rejected(case, line)
    assert isinstance(error, ce.GraphError), f"{mutation[0]}: {line!r} raised {error!r}, not GraphError\n{case!r}"
    assert re.search(mutation[3].format(**fields), str(error)), \
        f"{mutation[0]}: the message does not name the node ({mutation[3]!r}): {error}"
    _seen("rejected", case)


# --- coverage ----------------------------------------------------------------------------------------


def expected_features() -> set[str]:
    """Every available row (and the kinds its call adds, the variants it names), and every value of the
    dtype/op/act/size parameters it takes."""
    want = {"no output"} if fz.no_output_graphs() else set()
    want |= {f"config major={m}" for m in MAJORS}
    for table in fz.TABLES:
        for i in fz.rows(table):
            r = fz.TABLES[table][i]
            want |= {r.code, r.kind} | set(r.adds) | {f"{r.kind}:{v}" for v in r.variants}
            for key, _ in r.params:
                if key in ("dtype", "op", "act", "size"):
                    want |= {f"{r.kind}:{key}={v}" for v in r.choices(key)}
    return want


def test_tables_cover_every_ir_kind():
    """A node kind added to the IR needs a row in tests/helpers/fuzz_strategies.py: every kind a graph may
    hold before lowering (ir.ARITY, less the kinds lowering passes introduce) is a row's kind, or one
    a row's builder call adds besides it (pair_tile's unpacks, store_pairs' pack)."""
    from coda_ext.graph import ir

    public = set(ir.ARITY) - set(ir.LOWERED_KINDS)
    kinds = {k for table in fz.TABLES.values() for r in table for k in (r.kind,) + r.adds}
    assert public <= kinds, f"no fuzz rows for {sorted(public - kinds)}"


def test_zz_every_kind_exercised(capsys):
    """Runs last (by name): every row and parameter value was drawn by the tests above; logs the count."""
    if not GRAPHS:
        pytest.skip("run the whole file: this test counts what the others drew")
    missing = expected_features() - FEATURES
    with capsys.disabled():
        randoms = {k: v for k, v in GRAPHS.items() if k != "coverage"}
        print(f"\nfuzz: {sum(randoms.values())} random graphs ({', '.join(f'{k} {v}' for k, v in randoms.items())}) "
              f"and {GRAPHS['coverage']} fixed coverage graphs; {len(FEATURES)} features")
    assert not missing, f"never drawn: {sorted(missing)}"


# --- regressions the fuzzer found ----------------------------------------------------------------------


@pytest.mark.parametrize("call", ["g.tile('res', 'int32')", "g.store('res', acc, dtype='int64')",
                                  "g.row_vector('res', 'float64')", "g.col_vector('res', torch.complex64)"])
def test_regression_dtype_error_names_the_node(call):
    g = ce.Graph()
    with pytest.raises(ce.GraphError, match=r"'res'"):
        exec(call, {"g": g, "acc": g.accumulator(), "torch": torch})


@pytest.mark.parametrize("call", ["g.output(acc - 1e39)", "g.output(acc * g.scalar(value=-1e300))"])
def test_regression_constant_beyond_fp32_range(call):
    g = ce.Graph()
    with pytest.raises(ce.GraphError, match=r"outside the fp32 range"):
        exec(call, {"g": g, "acc": g.accumulator()})


def test_regression_numbers_only_call_names_the_function():
    with pytest.raises(ce.GraphError, match=r"\bexp\b"):
        ce.exp(2.0)
