"""Builder and verifier: bad graphs raise GraphError/UnsupportedError naming the node or
argument; Python numbers and operators build the expected nodes and values."""
from __future__ import annotations

import pytest
import torch

import coda_ext as ce
from coda_ext.graph import ir, verify


def _acc_graph():
    g = ce.Graph()
    return g, g.accumulator()


def _attrs(**kw):
    return ir.make_attrs(**kw)


# --- names --------------------------------------------------------------------------------


def test_duplicate_name_between_inputs():
    g, _acc = _acc_graph()
    g.row_vector("bias")
    with pytest.raises(ce.GraphError, match=r"'bias' is already used by a row vector"):
        g.tile("bias")


def test_duplicate_name_between_input_and_store():
    g, acc = _acc_graph()
    r = g.tile("res")
    g.output(acc + r)
    with pytest.raises(ce.GraphError, match=r"'res' is already used by a tile"):
        g.store("res", acc)


def test_default_output_name_is_claimed():
    g, acc = _acc_graph()
    g.store("out", acc * 2.0)
    with pytest.raises(ce.GraphError, match=r"'out' is already used by a store"):
        g.output(acc)
    g.output(acc, name="d")  # another name works
    assert g.build()[g.build().named("d")].kind == "output"


def test_duplicate_scalar_name():
    g, acc = _acc_graph()
    g.scalar("alpha")
    with pytest.raises(ce.GraphError, match=r"'alpha' is already used by a scalar"):
        g.row_reduce("alpha", acc)


@pytest.mark.parametrize("bad", ["1x", "has space", "a-b", "", "class", "lambda", 3, None])
def test_invalid_names(bad):
    g, _acc = _acc_graph()
    with pytest.raises(ce.GraphError, match=r"tile name .* must be a Python identifier"):
        g.tile(bad)


@pytest.mark.parametrize("reserved", ["A", "W", "out_tensors"])
@pytest.mark.parametrize("maker", ["row_vector", "col_vector", "tile", "scalar", "store", "row_reduce"])
def test_reserved_names(maker, reserved):
    g, acc = _acc_graph()
    fn = getattr(g, maker)
    args = (reserved, acc) if maker in ("store", "row_reduce") else (reserved,)
    with pytest.raises(ce.GraphError, match=rf"name '{reserved}' is reserved"):
        fn(*args)


def test_invalid_store_name_is_rejected_before_anything_is_added():
    g, acc = _acc_graph()
    n_before = len(g.raw())
    with pytest.raises(ce.GraphError, match=r"store name '2y'"):
        g.store("2y", acc)
    assert len(g.raw()) == n_before


# --- outputs --------------------------------------------------------------------------------


def test_two_outputs():
    g, acc = _acc_graph()
    g.output(acc)
    with pytest.raises(ce.GraphError, match=r"already has an output\(\).*store\(name, value\)"):
        g.output(acc * 2.0, name="other")


def test_graph_without_main_output():
    """Only stores and reductions: valid (the kernel writes no D)."""
    g, acc = _acc_graph()
    g.store("y", acc)
    g.row_reduce("lse", acc, "logsumexp")
    built = g.build()
    assert not built.find("output")
    assert [built[i].name for i in built.output_nodes()] == ["lse", "y"]


def test_empty_graph():
    with pytest.raises(ce.GraphError, match=r"produces nothing"):
        ce.Graph().build()


def test_hand_made_graph_with_two_outputs():
    graph = ir.GraphIR((
        ir.Node("accumulator"),
        ir.Node("output", (0,), _attrs(name="a")),
        ir.Node("output", (0,), _attrs(name="b")),
    ))
    with pytest.raises(ce.GraphError, match=r"has 2 main outputs; call g.output\(value\) at most once"):
        verify(graph)


# --- unused inputs and accumulator -------------------------------------------------------------


def test_unused_row_vector():
    g, acc = _acc_graph()
    g.row_vector("bias")
    g.output(acc)
    with pytest.raises(ce.GraphError, match=r"\(row_vector 'bias'\): input 'bias' is never used"):
        g.build()


def test_unused_runtime_scalar():
    g, acc = _acc_graph()
    g.scalar("alpha")
    g.output(acc)
    with pytest.raises(ce.GraphError, match=r"input 'alpha' is never used"):
        g.build()


def test_input_used_only_by_dead_value_is_unused():
    g, acc = _acc_graph()
    res = g.tile("res")
    _dead = acc * res  # never reaches a sink
    g.output(acc)
    with pytest.raises(ce.GraphError, match=r"input 'res' is never used"):
        g.build()


def test_unused_constant_is_fine():
    g, acc = _acc_graph()
    g.scalar(value=3.0)
    g.output(acc)
    built = g.build()
    assert [n.kind for n in built.nodes] == ["accumulator", "output"]


def test_accumulator_unused_output_of_row_vector_only():
    g, _acc = _acc_graph()
    g.output(g.row_vector("bias") * 2.0)
    with pytest.raises(ce.GraphError, match=r"accumulator is never used"):
        g.build()


def test_accumulator_never_created():
    g = ce.Graph()
    g.output(g.tile("x"))
    with pytest.raises(ce.GraphError, match=r"accumulator is never used"):
        g.build()


# --- reductions ----------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["mean", "min", "prod", "SUM", None])
@pytest.mark.parametrize("kind", ["row_reduce", "col_reduce"])
def test_unsupported_reduction_op(kind, op):
    g, acc = _acc_graph()
    with pytest.raises(ce.GraphError, match=rf"{kind} 'stat': unsupported reduction op {op!r}"):
        getattr(g, kind)("stat", acc, op)


def test_hand_made_graph_with_bad_reduce_op():
    graph = ir.GraphIR((
        ir.Node("accumulator"),
        ir.Node("output", (0,), _attrs(name="out")),
        ir.Node("row_reduce", (0,), _attrs(name="r", op="mean")),
    ))
    with pytest.raises(ce.GraphError, match=r"node 2 \(row_reduce 'r'\): reduction op 'mean'"):
        verify(graph)


def test_too_many_reductions():
    g, acc = _acc_graph()
    g.output(acc)
    for i in range(9):
        g.row_reduce(f"r{i}", acc * float(i + 1))
    with pytest.raises(ce.GraphError, match=r"9 reductions; at most 8"):
        g.build()


def test_too_many_slots():
    g, acc = _acc_graph()
    y = acc
    for i in range(33):
        y = y + g.row_vector(f"b{i}")
    g.output(y)
    with pytest.raises(ce.GraphError, match=r"33 runtime inputs and outputs; at most 32"):
        g.build()


# --- pair_gate --------------------------------------------------------------------------------


def _pair():
    g, acc = _acc_graph()
    return g, acc, ce.swiglu_pairs(acc)


@pytest.mark.parametrize("use", [
    lambda p, acc: p + 1.0,
    lambda p, acc: 1.0 - p,
    lambda p, acc: acc * p,
    lambda p, acc: ce.silu(p),
    lambda p, acc: -p,
    lambda p, acc: ce.cast(p, "bfloat16"),
    lambda p, acc: ce.fma(acc, acc, p),
    lambda p, acc: ce.pair_gate(p, "relu"),
])
def test_pair_result_used_in_math(use):
    _g, acc, p = _pair()
    with pytest.raises(ce.GraphError, match=r"half-width result of pair_gate; such a value can only be stored"):
        use(p, acc)


@pytest.mark.parametrize("kind", ["row_reduce", "col_reduce"])
def test_pair_result_reduced(kind):
    g, acc, p = _pair()
    g.output(acc)
    getattr(g, kind)("stat", p, "sum")
    with pytest.raises(ce.GraphError,
                       match=rf"\({kind} 'stat'\) reads the half-width result of node \d+ \(pair_gate\)"):
        g.build()


def test_pair_result_as_main_output():
    g, _acc, p = _pair()
    g.output(p)
    with pytest.raises(ce.GraphError, match=r"\(output 'out'\) reads the half-width result"):
        g.build()


def test_pair_result_stored_is_fine():
    g, acc, p = _pair()
    g.output(acc)
    g.store("y", p)
    built = g.build()
    assert built[built.named("y")].kind == "store"
    assert built[built[built.named("y")].inputs[0]].kind == "pair_gate"


def test_bad_pair_activation_and_gelu_mode():
    _g, acc = _acc_graph()
    with pytest.raises(ce.GraphError, match=r"pair_gate: unsupported activation 'swish'"):
        ce.pair_gate(acc, "swish")
    with pytest.raises(ce.GraphError, match=r"gelu: approximate must be 'none' or 'tanh', got 'fast'"):
        ce.gelu(acc, approximate="fast")


# --- operands ------------------------------------------------------------------------------


def test_values_from_two_graphs():
    _g1, a1 = _acc_graph()
    g2, a2 = _acc_graph()
    with pytest.raises(ce.GraphError, match=r"operand 1 of add belongs to another Graph"):
        a1 + a2
    with pytest.raises(ce.GraphError, match=r"operand 2 of fma belongs to another Graph"):
        ce.fma(a1, a1, a2)
    with pytest.raises(ce.GraphError, match=r"output value belongs to another Graph"):
        g2.output(a1)
    with pytest.raises(ce.GraphError, match=r"store 'y' value belongs to another Graph"):
        g2.store("y", a1)
    with pytest.raises(ce.GraphError, match=r"row_reduce 'r' value belongs to another Graph"):
        g2.row_reduce("r", a1)


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_non_finite_constants(bad):
    g, acc = _acc_graph()
    with pytest.raises(ce.GraphError, match=r"operand 1 of mul is .*: constants must be finite"):
        acc * bad
    with pytest.raises(ce.GraphError, match=r"operand 0 of add is .*: constants must be finite"):
        bad + acc
    with pytest.raises(ce.GraphError, match=r"scalar value is .*: constants must be finite"):
        g.scalar(value=bad)


@pytest.mark.parametrize("bad", [True, "2.0", None, torch.tensor(1.0), [1.0]])
def test_non_number_operands(bad):
    _g, acc = _acc_graph()
    with pytest.raises(ce.GraphError, match=r"operand 1 of add must be a coda_ext Value or a Python number"):
        ce.add(acc, bad)


def test_no_value_operand():
    with pytest.raises(ce.GraphError, match=r"at least one operand must be a coda_ext Value"):
        ce.add(1.0, 2.0)


def test_value_has_no_truth_value():
    _g, acc = _acc_graph()
    with pytest.raises(TypeError, match=r"no truth value; use coda_ext.maximum"):
        bool(acc)


def test_scalar_argument_errors():
    g = ce.Graph()
    with pytest.raises(ce.GraphError, match=r"scalar\(\) needs a value"):
        g.scalar()
    with pytest.raises(ce.GraphError, match=r"scalar 'alpha': give either a name .* or a value"):
        g.scalar("alpha", 2.0)


@pytest.mark.parametrize("bad", [torch.int32, torch.float64, "int8", "bf8", "float64"])
def test_bad_dtype(bad):
    g, acc = _acc_graph()
    with pytest.raises(ce.GraphError, match=r"(unsupported dtype .*use one of torch.bfloat16)|(only allowed for row "
                                            r"and column vectors)"):
        g.tile("x", dtype=bad)
    with pytest.raises(ce.GraphError, match=r"unsupported dtype"):
        g.store("y", acc, dtype=bad)
    with pytest.raises(ce.GraphError, match=r"unsupported dtype"):
        ce.cast(acc, bad)


@pytest.mark.parametrize("alias,name", [
    (torch.bfloat16, "bfloat16"), ("bf16", "bfloat16"), ("fp16", "float16"), ("half", "float16"),
    (torch.float32, "float32"), ("float", "float32"), ("fp32", "float32"),
])
def test_dtype_aliases(alias, name):
    g, acc = _acc_graph()
    g.output(acc + g.row_vector("b", dtype=alias))
    built = g.build()
    assert built[built.named("b")].attr("dtype") == name


def test_fp32_gemm_operands_unsupported():
    g, acc = _acc_graph()
    g.output(acc)
    with pytest.raises(ce.UnsupportedError, match=r"torch.bfloat16 or torch.float16"):
        ce.emit_source(g, torch.float32)


# --- hand-made IR passed to verify ---------------------------------------------------------


def test_forward_reference():
    graph = ir.GraphIR((
        ir.Node("accumulator"),
        ir.Node("add", (0, 2)),
        ir.Node("scalar", (), _attrs(mode="constant", value=1.0)),
        ir.Node("output", (1,), _attrs(name="out")),
    ))
    with pytest.raises(ce.GraphError, match=r"node 1 \(add\): reads node 2, which does not come before it"):
        verify(graph)
    # The same check guards every entry point that accepts IR.
    with pytest.raises(ce.GraphError, match=r"node 1 \(add\): reads node 2"):
        ce.emit_source(graph)


def test_cycle():
    graph = ir.GraphIR((
        ir.Node("accumulator"),
        ir.Node("mul", (0, 2)),
        ir.Node("neg", (1,)),
        ir.Node("output", (2,), _attrs(name="out")),
    ))
    with pytest.raises(ce.GraphError, match=r"node 1 \(mul\): reads node 2, .*cycle"):
        verify(graph)


def test_self_loop():
    graph = ir.GraphIR((ir.Node("accumulator"), ir.Node("neg", (1,)), ir.Node("output", (1,), _attrs(name="out"))))
    with pytest.raises(ce.GraphError, match=r"node 1 \(neg\): reads node 1"):
        verify(graph)


def test_input_out_of_range():
    graph = ir.GraphIR((ir.Node("accumulator"), ir.Node("neg", (7,)), ir.Node("output", (1,), _attrs(name="out"))))
    with pytest.raises(ce.GraphError, match=r"node 1 \(neg\): input 7 is not a node of this graph"):
        verify(graph)


def test_node_reading_a_sink():
    graph = ir.GraphIR((
        ir.Node("accumulator"),
        ir.Node("store", (0,), _attrs(name="s")),
        ir.Node("neg", (1,)),
        ir.Node("output", (2,), _attrs(name="out")),
    ))
    with pytest.raises(ce.GraphError, match=r"node 2 \(neg\): reads node 1 \(store 's'\), a sink"):
        verify(graph)


def test_unknown_kind_and_arity():
    bad_kind = ir.GraphIR((ir.Node("accumulator"), ir.Node("softmax", (0,)), ir.Node("output", (1,), _attrs(name="o"))))
    with pytest.raises(ce.GraphError, match=r"node 1 \(softmax\): unknown node kind 'softmax'"):
        verify(bad_kind)
    bad_arity = ir.GraphIR((ir.Node("accumulator"), ir.Node("add", (0,)), ir.Node("output", (1,), _attrs(name="o"))))
    with pytest.raises(ce.GraphError, match=r"node 1 \(add\): takes 2 inputs, got 1"):
        verify(bad_arity)


def test_hand_made_attribute_errors():
    def graph_with(node):
        return ir.GraphIR((ir.Node("accumulator"), node, ir.Node("add", (0, 1)),
                           ir.Node("output", (2,), _attrs(name="o"))))

    cases = [
        (ir.Node("tile", (), _attrs(name="t", dtype="int8")), r"node 1 \(tile 't'\): dtype 'int8' is not one of"),
        (ir.Node("tile", ()), r"node 1 \(tile\): needs a name"),
        (ir.Node("scalar", (), _attrs(mode="weird", name="s")), r"scalar mode must be one of"),
        (ir.Node("scalar", (), _attrs(mode="constant", value=1)), r"a constant scalar needs a float value"),
        (ir.Node("scalar", (), _attrs(mode="value")), r"a runtime scalar needs a name"),
    ]
    for node, pattern in cases:
        with pytest.raises(ce.GraphError, match=pattern):
            verify(graph_with(node))


def test_hand_made_duplicate_names():
    graph = ir.GraphIR((
        ir.Node("accumulator"),
        ir.Node("row_vector", (), _attrs(name="x")),
        ir.Node("add", (0, 1)),
        ir.Node("output", (2,), _attrs(name="out")),
        ir.Node("store", (0,), _attrs(name="x")),
    ))
    with pytest.raises(ce.GraphError,
                       match=r"node 4 \(store 'x'\): name 'x' is also used by node 1 \(row_vector 'x'\)"):
        verify(graph)


def test_verify_returns_valid_graph_unchanged():
    g, acc = _acc_graph()
    g.output(ce.silu(acc + g.row_vector("b")))
    raw = g.raw()
    assert verify(raw) is raw


def test_errors_are_value_errors():
    # GraphError is a ValueError (and UnsupportedError a GraphError), so generic handlers catch them.
    assert issubclass(ce.GraphError, ValueError) and issubclass(ce.UnsupportedError, ce.GraphError)
    assert issubclass(ce.CompileError, RuntimeError) and issubclass(ce.LaunchError, ce.CodaError)


# --- happy paths: Python numbers on either side, abs(), unary minus ------------------------------


def _eval(build, a_vals):
    """Builds D = build(acc) and interprets it with acc = diag-free values a_vals (M x N)."""
    g, acc = _acc_graph()
    g.output(build(acc))
    _M, N = a_vals.shape
    A = a_vals.double()
    W = torch.eye(N, dtype=torch.float64)
    return g, ce.interpret(g, A, W, compute_dtype=torch.float64).out


@pytest.mark.parametrize("build,ref,kind,const_first", [
    (lambda a: a + 3, lambda x: x + 3, "add", None),
    (lambda a: 3 + a, lambda x: 3 + x, "add", None),
    (lambda a: a - 3, lambda x: x - 3, "sub", False),
    (lambda a: 3 - a, lambda x: 3 - x, "sub", True),
    (lambda a: a * 2.5, lambda x: x * 2.5, "mul", None),
    (lambda a: 2.5 * a, lambda x: 2.5 * x, "mul", None),
    (lambda a: a / 4, lambda x: x / 4, "div", False),
    (lambda a: 4 / a, lambda x: 4 / x, "div", True),
    (lambda a: abs(a), torch.abs, "abs", None),
    (lambda a: -a, torch.neg, "neg", None),
    (lambda a: ce.abs(-a), lambda x: torch.abs(-x), "abs", None),
])
def test_python_scalars_and_operators(build, ref, kind, const_first):
    torch.manual_seed(11)
    x = torch.randint(-6, 7, (5, 8)).double()
    x[x == 0] = 1.0  # no division by zero
    g, got = _eval(build, x)
    assert torch.equal(got, ref(x))
    built = g.build()
    root = built[built[built.find("output")[0]].inputs[0]]
    assert root.kind == kind
    if const_first is not None:  # non-commutative ops keep the operand order
        first = built[root.inputs[0]]
        assert (first.kind == "scalar") is const_first
        if const_first:
            assert first.attr("value") == float(4 if kind == "div" else 3)


def test_int_constants_become_floats():
    g, acc = _acc_graph()
    g.output(acc * 2)
    built = g.build()
    consts = [n for n in built.nodes if n.kind == "scalar"]
    assert consts == [ir.Node("scalar", (), _attrs(mode="constant", value=2.0))]
    assert isinstance(consts[0].attr("value"), float)


def test_builder_dedups_structurally_equal_nodes():
    g, acc = _acc_graph()
    assert g.accumulator()._index == acc._index
    a = ce.silu(acc + 1.0)
    b = ce.silu(acc + 1.0)
    assert a._index == b._index
    # named inputs are never merged
    r1, r2 = g.row_vector("r1"), g.row_vector("r2")
    assert r1._index != r2._index
