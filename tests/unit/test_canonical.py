"""Canonical form (equal graphs -> equal IR, digest and C++), the lowering passes, and the
tree/topological planning of the emitter."""
from __future__ import annotations

import torch

import coda_ext as ce
from coda_ext.codegen.plan import plan
from coda_ext.graph import ir
from coda_ext.passes import (
    canonicalize,
    fold_square_reduce,
    lower,
    lower_pair_stores,
    prune,
    resolve_dtypes,
    tanh_sigmoid,
)


def _example(order: int) -> ce.Graph:
    """The README example (bias, SiLU, residual, aux store, sum of squares), written in two
    different orders: inputs declared in different order, a+b vs b+a, sinks added in different order."""
    g = ce.Graph()
    if order == 0:
        acc = g.accumulator()
        bias = g.row_vector("bias")
        res = g.tile("residual")
        pre = acc + bias
        y = ce.silu(pre) * res
        g.store("pre", pre)
        g.output(y)
        g.row_reduce("sqsum", y * y, "sum")
    else:
        res = g.tile("residual")
        bias = g.row_vector("bias")
        unused_dead = ce.exp(bias) * 3.0  # dead value: must not matter  # noqa: F841
        acc = g.accumulator()
        y = res * ce.silu(bias + acc)
        g.row_reduce("sqsum", y * y, "sum")
        g.output(y)
        g.store("pre", bias + acc)
    return g


def _kinds(graph: ir.GraphIR) -> list[str]:
    return [n.kind for n in graph.nodes]


# --- canonical hashing ----------------------------------------------------------------------


def test_same_graph_two_orders_is_identical():
    g0, g1 = _example(0), _example(1)
    assert g0.raw() != g1.raw()            # built differently...
    b0, b1 = g0.build(), g1.build()
    assert b0 == b1                        # ...but one canonical form
    assert b0.digest() == b1.digest()
    assert b0.text() == b1.text()
    s0, s1 = ce.emit_source(g0), ce.emit_source(g1)
    assert s0 == s1
    assert ce.emit_source(g0, "float16") == ce.emit_source(g1, "float16")
    assert ce.emit_source(g0, "float16") != s0


def test_commutative_operands_and_nested_order():
    def build(flip: bool) -> ir.GraphIR:
        g = ce.Graph()
        if flip:
            b = g.row_vector("b")
            a = g.col_vector("a")
            acc = g.accumulator()
            g.output(ce.minimum(acc, 1.0 + ce.maximum(b, a * acc)))
        else:
            acc = g.accumulator()
            a = g.col_vector("a")
            b = g.row_vector("b")
            g.output(ce.minimum(ce.maximum(acc * a, b) + 1.0, acc))
        return g.build()

    assert build(False) == build(True)
    assert build(False).digest() == build(True).digest()


def test_non_commutative_operand_order_matters():
    def build(flip: bool) -> ir.GraphIR:
        g = ce.Graph()
        acc = g.accumulator()
        b = g.row_vector("b")
        g.output(b - acc if flip else acc - b)
        return g.build()

    assert build(False).digest() != build(True).digest()


def test_different_graphs_have_different_digests():
    def build(const=2.0, op="sum", name="r", dtype=None, fn=ce.silu, axis="row_reduce"):
        g = ce.Graph()
        acc = g.accumulator()
        y = fn(acc * const + g.row_vector("b", dtype=dtype))
        g.output(y)
        getattr(g, axis)(name, y, op)
        return g.build()

    variants = [
        build(), build(const=3.0), build(op="max"), build(name="s"), build(dtype="float32"),
        build(fn=ce.sigmoid), build(axis="col_reduce"), build(op="sumsq"),
    ]
    digests = [v.digest() for v in variants]
    assert len(set(digests)) == len(variants)
    assert len(set(variants)) == len(variants)
    assert build().digest() == build().digest()


def test_cse_merges_duplicated_subexpressions():
    g = ce.Graph()
    acc = g.accumulator()
    bias = g.row_vector("bias")
    s1 = ce.silu(acc + bias)
    s2 = ce.silu(bias + acc)        # the same value, built with swapped operands
    g.output(s1 * 2.0)
    g.store("s", s2 * 2.0)
    raw, built = g.raw(), g.build()
    assert _kinds(raw).count("add") == 2 and _kinds(raw).count("silu") == 2 and _kinds(raw).count("mul") == 2
    assert _kinds(built).count("add") == 1 and _kinds(built).count("silu") == 1 and _kinds(built).count("mul") == 1
    out, store = built[built.named("out")], built[built.named("s")]
    assert out.inputs == store.inputs    # both sinks read the one merged value


def test_cse_on_hand_made_ir():
    raw = ir.GraphIR((
        ir.Node("accumulator"),
        ir.Node("exp", (0,)),
        ir.Node("accumulator"),
        ir.Node("exp", (2,)),
        ir.Node("add", (1, 3)),
        ir.Node("output", (4,), ir.make_attrs(name="out")),
    ))
    assert canonicalize(raw) == ir.GraphIR((
        ir.Node("accumulator"),
        ir.Node("exp", (0,)),
        ir.Node("add", (1, 1)),
        ir.Node("output", (2,), ir.make_attrs(name="out")),
    ))


def test_dead_values_are_dropped():
    g = ce.Graph()
    acc = g.accumulator()
    dead = ce.tanh(acc) * 7.0 + 1.0  # noqa: F841
    g.output(ce.relu(acc))
    assert len(g.raw()) == 8
    assert _kinds(g.build()) == ["accumulator", "relu", "output"]
    assert _kinds(prune(g.raw())) == ["accumulator", "relu", "output"]


def test_canonical_numbering_is_post_order_from_sorted_sinks():
    built = _example(0).build()
    # sinks sorted by (kind, name): output first, then stores, then reductions; operands before users
    sink_kinds = [n.kind for n in built.nodes if n.is_sink]
    assert sink_kinds == ["output", "store", "row_reduce"]
    for i, n in enumerate(built.nodes):
        assert all(j < i for j in n.inputs)


def test_canonicalize_is_idempotent():
    for order in (0, 1):
        built = _example(order).build()
        assert canonicalize(built) == built
        lowered = lower(built, "bfloat16")
        assert canonicalize(lowered) == lowered


def test_built_graph_is_hashable():
    b0, b1 = _example(0).build(), _example(1).build()
    other = ce.Graph()
    other.output(other.accumulator())
    table = {b0: "example", other.build(): "identity"}
    assert table[b1] == "example"
    assert hash(b0) == hash(b1)
    assert len({b0, b1, other.build()}) == 2


def test_explicit_default_dtype_emits_the_same_kernel():
    def build(dtype):
        g = ce.Graph()
        acc = g.accumulator()
        g.output(acc + g.tile("res", dtype=dtype))
        g.store("y", ce.relu(acc), dtype=dtype)
        return g

    assert build(None).build() != build("bfloat16").build()
    assert ce.emit_source(build(None), "bfloat16") == ce.emit_source(build(torch.bfloat16), "bfloat16")
    assert ce.emit_source(build(None), "float16") != ce.emit_source(build(torch.bfloat16), "float16")


# --- fold_square_reduce ------------------------------------------------------------------------


def _reduce_of_square(square, extra_consumer=False, op="sum", axis="row_reduce"):
    g = ce.Graph()
    acc = g.accumulator()
    y = acc + g.row_vector("b")
    g.output(y)
    sq = square(y)
    getattr(g, axis)("stat", sq, op)
    if extra_consumer:
        g.store("sq", sq)
    return g


def test_fold_square_reduce_mul():
    built = _reduce_of_square(lambda y: y * y).build()
    folded = fold_square_reduce(built)
    r = folded[folded.named("stat")]
    assert r.attr("op") == "sumsq"
    assert folded[r.inputs[0]].kind == "add"                  # reads y itself
    assert r.inputs[0] == folded[folded.named("out")].inputs[0]
    assert "mul" not in _kinds(folded)                         # the square is gone


def test_fold_square_reduce_square_and_col_reduce():
    folded = fold_square_reduce(_reduce_of_square(ce.square, axis="col_reduce").build())
    r = folded[folded.named("stat")]
    assert (r.kind, r.attr("op")) == ("col_reduce", "sumsq")
    assert "square" not in _kinds(folded)


def test_no_fold_when_square_has_another_consumer():
    built = _reduce_of_square(lambda y: y * y, extra_consumer=True).build()
    assert fold_square_reduce(built) == built


def test_no_fold_for_max_or_non_square():
    built = _reduce_of_square(lambda y: y * y, op="max").build()
    assert fold_square_reduce(built) == built
    g = ce.Graph()
    acc = g.accumulator()
    y = acc + g.row_vector("b")
    g.output(y)
    g.row_reduce("stat", y * acc, "sum")                       # not a square
    assert fold_square_reduce(g.build()) == g.build()


def test_fold_preserves_semantics():
    torch.manual_seed(3)
    M, N, K = 37, 72, 16
    A, W, b = torch.randn(M, K), torch.randn(N, K), torch.randn(N)
    built = _reduce_of_square(lambda y: y * y).build()
    ref = ce.interpret(built, A, W, b=b, compute_dtype=torch.float64)
    got = ce.interpret(fold_square_reduce(built), A, W, b=b, compute_dtype=torch.float64)
    assert torch.allclose(got.stat, ref.stat, rtol=1e-12, atol=0)
    assert torch.equal(got.out, ref.out)


def test_fold_makes_the_example_a_tree():
    built = _example(0).build()
    typed = resolve_dtypes(built, "bfloat16")
    assert not plan(lower_pair_stores(typed)).is_tree            # y feeds D and y*y
    assert plan(lower(built, "bfloat16")).is_tree


# --- tanh_sigmoid -----------------------------------------------------------------------------


def _gelu_tanh_written_out(grad: bool, extra: bool = False) -> ce.Graph:
    """The tanh GELU as a model writes it in Python (GPT-2's NewGELU) and, grad=True, its derivative as
    autograd spells it (1 - t * t, 1 + t); extra=True: the tanh is also stored."""
    g = ce.Graph()
    x = g.accumulator() + g.row_vector("b")
    t = ce.tanh(0.7978845834732056 * (x + 0.044715 * (ce.square(x) * x)))
    if grad:
        dy = g.tile("dy")
        g.output(dy * 0.5 * (1.0 + t) + dy * 0.5 * x * (1.0 - t * t) * 0.7978845834732056 *
                 (1.0 + 3.0 * 0.044715 * ce.square(x)))
    else:
        g.output(0.5 * x * (t + 1.0))
        g.store("pre", x)
    if extra:
        g.store("t", t)
    return g


def _run(graph, M=29, N=72, K=16, seed=0, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    A = torch.randn(M, K, generator=gen, dtype=torch.float64) * scale
    W = torch.randn(N, K, generator=gen, dtype=torch.float64)
    args = {"b": torch.randn(N, generator=gen, dtype=torch.float64)}
    if any(n.kind == "tile" for n in graph.nodes):
        args["dy"] = torch.randn(M, N, generator=gen, dtype=torch.float64)
    return ce.interpret(graph, A, W, compute_dtype=torch.float64, **args)


def test_tanh_sigmoid_removes_the_tanh_of_gelu_and_its_derivative():
    for grad in (False, True):
        built = _gelu_tanh_written_out(grad).build()
        rewritten = tanh_sigmoid(built)
        assert "tanh" not in _kinds(rewritten) and "sigmoid" in _kinds(rewritten)
        assert _kinds(rewritten).count("sigmoid") == 1        # one sigmoid serves 1 + t and 1 - t²
        assert "tanh" not in _kinds(lower(built, "bfloat16"))
        for scale in (0.05, 1.0, 30.0):                     # small u, the GELU's range, saturated tails
            ref, got = _run(built, scale=scale), _run(rewritten, scale=scale)
            assert torch.allclose(got.out, ref.out, rtol=1e-12, atol=1e-12 * scale)


def test_tanh_sigmoid_leaves_a_tanh_with_other_readers():
    """A tanh also stored (or squared for a store) stays as written: the sigmoid would add to it."""
    built = _gelu_tanh_written_out(False, extra=True).build()
    assert tanh_sigmoid(built) == built
    g = ce.Graph()
    t = ce.tanh(g.accumulator())
    g.output(1.0 - ce.square(t))
    g.store("sq", ce.square(t) * 3.0)       # the square has another reader than 1 - t²
    assert tanh_sigmoid(g.build()) == g.build()


def test_tanh_sigmoid_takes_the_square_form():
    g = ce.Graph()
    t = ce.tanh((g.accumulator() + g.row_vector("b")) * 0.5)
    g.output((1.0 - ce.square(t)) * (t + 1.0))
    built = g.build()
    rewritten = tanh_sigmoid(built)
    assert "tanh" not in _kinds(rewritten) and _kinds(rewritten).count("sigmoid") == 1
    ref, got = _run(built, scale=3.0), _run(rewritten, scale=3.0)
    assert torch.allclose(got.out, ref.out, rtol=1e-12, atol=1e-12)


def test_tanh_sigmoid_leaves_other_tanh_math():
    g = ce.Graph()
    t = ce.tanh(g.accumulator())
    g.output(2.0 + t)          # not 1 + t
    g.store("q", 1.0 - t * 0.5)
    built = g.build()
    assert tanh_sigmoid(built) == built


# --- lower_pair_stores ------------------------------------------------------------------------


def test_lower_pair_stores():
    g = ce.Graph()
    z = g.accumulator()
    g.output(z)
    g.store("y", ce.swiglu_pairs(z))
    g.store("yg", ce.pair_gate(z * 0.5, "gelu_tanh"), dtype="float32")
    lowered = lower_pair_stores(resolve_dtypes(g.build(), "float16"))
    assert "pair_gate" not in _kinds(lowered) and "store" not in _kinds(lowered)
    y, yg = lowered[lowered.named("y")], lowered[lowered.named("yg")]
    assert (y.kind, y.attr("act"), y.attr("dtype")) == ("pair_gated_store", "silu", "float16")
    assert (yg.kind, yg.attr("act"), yg.attr("dtype")) == ("pair_gated_store", "gelu_tanh", "float32")
    assert lowered[y.inputs[0]].kind == "accumulator"
    assert lowered[yg.inputs[0]].kind == "mul"


def test_lower_pair_stores_leaves_plain_stores():
    built = _example(0).build()
    assert lower_pair_stores(built) == built


# --- resolve_dtypes ---------------------------------------------------------------------------


def test_resolve_dtypes():
    g = ce.Graph()
    acc = g.accumulator()
    a = g.col_vector("a", dtype="float32")
    b = g.row_vector("b")
    x = ce.cast(acc * a + b + g.tile("t") + g.scalar("s"), "float16")
    g.output(x)
    g.store("y", x)
    g.store("z", x * 2.0, dtype="float32")
    g.row_reduce("r", x)
    resolved = resolve_dtypes(g.build(), "bfloat16")
    dt = {resolved[i].name: resolved[i].attr("dtype") for i in resolved.slots()}
    assert dt == {"a": "float32", "b": "bfloat16", "t": "bfloat16", "s": None, "y": "bfloat16",
                  "z": "float32", "r": None}
    cast = resolved[resolved.find("cast")[0]]
    assert cast.attr("dtype") == "float16"
    assert resolve_dtypes(resolved, "float16") == resolved     # explicit dtypes are never overwritten


# --- plan: tree or topological ------------------------------------------------------------------


def _planned(build) -> tuple[ir.GraphIR, object]:
    g = ce.Graph()
    build(g, g.accumulator())
    lowered = lower(g.build(), "bfloat16")
    return lowered, plan(lowered)


def test_plan_shared_non_leaf_is_topological():
    def build(g, acc):
        y = acc + g.row_vector("b")
        g.output(ce.silu(y) * y)

    _lowered, p = _planned(build)
    assert not p.is_tree
    add_ops = [o for o, op in enumerate(p.ops) if op.kind == "add"]
    assert len(add_ops) == 1
    assert sum(op.children.count(add_ops[0]) for op in p.ops) == 2
    assert "Sm90TopologicalVisitor" in ce.emit_source(_graph(build))


def _graph(build) -> ce.Graph:
    g = ce.Graph()
    build(g, g.accumulator())
    return g


def test_plan_accumulator_used_twice_is_tree():
    def build(g, acc):
        g.output(ce.silu(acc) * acc + acc)

    _, p = _planned(build)
    assert p.is_tree
    assert [op.kind for op in p.ops].count("accumulator") == 3     # duplicated per use
    assert all(op.kind != "keep_first" for op in p.ops)
    src = ce.emit_source(_graph(build))
    assert "Sm90TopologicalVisitor" not in src and "fusion::Sm90EVT" in src


def test_plan_constant_used_twice_is_tree():
    def build(g, acc):
        g.output((acc + 1.0) * (ce.exp(acc) + 1.0))

    _, p = _planned(build)
    assert p.is_tree
    assert [op.kind for op in p.ops].count("scalar") == 2


def test_plan_side_store_gets_keep_first_root():
    def build(g, acc):
        g.output(ce.silu(acc))
        g.store("side", acc * 2.0)

    lowered, p = _planned(build)
    assert p.is_tree
    root = p.ops[-1]
    assert (root.node, root.kind) == (-1, "keep_first")
    d_op, side_op = root.children
    assert p.ops[d_op].kind == "silu"                       # D first
    assert p.ops[side_op].kind == "store" and lowered[p.ops[side_op].node].name == "side"
    assert "Compute<Cfg, KeepFirst>" in ce.emit_source(_graph(build))


def test_plan_store_on_d_path_needs_no_keep_first():
    def build(g, acc):
        y = acc + g.row_vector("b")
        g.store("pre", y)
        g.row_reduce("r", y, "max")
        g.output(ce.relu(y))

    _lowered, p = _planned(build)
    assert p.is_tree
    kinds = [op.kind for op in p.ops]
    assert "keep_first" not in kinds
    # the sinks are threaded onto y in node order, and relu reads the end of that chain
    assert kinds == ["row_vector", "accumulator", "add", "store", "row_reduce", "relu"]
    assert p.ops[-1].children == (4,)


def test_plan_d_value_also_read_by_side_output_is_topological():
    def build(g, acc):
        y = ce.silu(acc)
        g.output(y)
        g.store("z", y * 2.0)

    _, p = _planned(build)
    assert not p.is_tree
    assert p.ops[-1].kind == "keep_first"


def test_plan_identity():
    _, p = _planned(lambda g, acc: g.output(acc))
    assert p.is_tree and [op.kind for op in p.ops] == ["accumulator"]
