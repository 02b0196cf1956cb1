"""Packed pairs (Graph.pair_tile / Graph.store_pairs) and operand layouts (KernelConfig.major), on
the CPU: builder and verifier errors, the interpreter against hand-computed tensors (pack rounds to
the 16-bit dtype), the emitted C++, config validation, tags and the Config<...> template arguments,
the runtime layout checks, the op interface's (M, 2N) shapes (through the custom op's fake and an
interpreted run), a compiled op's argument checks up to the launch (the library a stub, CPU tensors
standing in for CUDA ones, as in test_bad_inputs.py), and `python -m coda_ext prebuild --ops` items.
"""
from __future__ import annotations

import collections
import dataclasses
import importlib
import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import coda_ext as ce
from coda_ext import ops, tuning
from coda_ext.config import DEFAULT_CONFIG, MAJORS
from coda_ext.graph import ir
from coda_ext.graph.builder import Value
from coda_ext.graph.interpret import Outputs
from coda_ext.graph.verify import verify
from coda_ext.jit import nvcc
from coda_ext.runtime import TunedOp, checks

BF16, FP16 = torch.bfloat16, torch.float16


def _pair_graph(dtype=None):
    g = ce.Graph()
    acc = g.accumulator()
    even, odd = g.pair_tile("z", dtype)
    return g, acc, even, odd


def _packed(g: ce.Graph, half: Value) -> Value:
    """The packed pair_tile value an unpack reads (the builder never hands one out)."""
    return Value(g, g._nodes[half._index].inputs[0])


# --- the builder ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, "float32", "fp32", "float"])
def test_pair_tile_refuses_fp32(dtype):
    g = ce.Graph()
    with pytest.raises(ce.GraphError, match=r"pair tile 'z': pairs are 16-bit elements; use torch.bfloat16 or "
                                            r"torch.float16"):
        g.pair_tile("z", dtype)
    g.pair_tile("z", "bfloat16")   # the refused call claimed no name


@pytest.mark.parametrize("dtype", [torch.int32, "int64", torch.float64, "complex64"])
def test_pair_tile_refuses_other_dtypes(dtype):
    with pytest.raises(ce.GraphError, match=r"pair tile 'z': unsupported dtype"):
        ce.Graph().pair_tile("z", dtype)


@pytest.mark.parametrize("dtype, match", [
    (torch.float32, r"store_pairs 'dz': pairs are 16-bit elements; use torch.bfloat16 or torch.float16"),
    ("fp32", r"store_pairs 'dz': pairs are 16-bit elements"),
    (torch.int32, r"store_pairs 'dz': unsupported dtype"),
    (torch.float64, r"store_pairs 'dz': unsupported dtype"),
])
def test_store_pairs_refuses_non_16_bit_dtypes(dtype, match):
    g, acc, even, odd = _pair_graph()
    with pytest.raises(ce.GraphError, match=match):
        g.store_pairs("dz", acc, even, dtype=dtype)
    g.store_pairs("dz", acc, odd, dtype=torch.float16)   # the refused call claimed no name


def test_pair_tile_gives_two_unpacks_of_one_packed_input():
    g, acc, even, odd = _pair_graph(torch.float16)
    assert (even.kind, odd.kind) == ("unpack", "unpack")
    nodes = g._nodes
    assert nodes[even._index].inputs == nodes[odd._index].inputs
    assert (nodes[even._index].attr("half"), nodes[odd._index].attr("half")) == (0, 1)
    tile = nodes[nodes[even._index].inputs[0]]
    assert (tile.kind, tile.name, tile.attr("dtype")) == ("pair_tile", "z", "float16")
    g.store_pairs("dz", odd * acc, even)
    assert [n.kind for n in nodes[-2:]] == ["pack", "pair_store"]
    assert nodes[-2].inputs == (len(nodes) - 3, even._index)       # (even, odd) in that order
    assert nodes[-1].attr("dtype") is None and nodes[-1].name == "dz"   # the op's dtype, resolved at emission


MATH = {
    "exp": lambda p, acc: ce.exp(p),
    "add": lambda p, acc: acc + p,
    "radd": lambda p, acc: 1.0 + p,
    "cast": lambda p, acc: ce.cast(p, "float32"),
    "where": lambda p, acc: ce.where(acc, p, 0.0),
    "pair_swap": lambda p, acc: ce.pair_swap(p),
    "rotate_pairs": lambda p, acc: ce.rotate_pairs(acc, p),
    "pair_gate": lambda p, acc: ce.pair_gate(p),
    "segment_reduce": lambda p, acc: ce.segment_reduce(p, 32),
}


@pytest.mark.parametrize("use", list(MATH))
def test_packed_pairs_are_not_math_operands(use):
    g, acc, even, _odd = _pair_graph()
    kind = {"radd": "add"}.get(use, use)
    with pytest.raises(ce.GraphError, match=rf"^{kind}: its operand is a packed pair value \(pair_tile\); use the "
                                            r"two values pair_tile returns, and store_pairs to write pairs"):
        MATH[use](_packed(g, even), acc)


def test_a_pack_is_not_a_math_operand():
    g, acc, even, _odd = _pair_graph()
    g.store_pairs("dz", acc, even)
    pack = Value(g, len(g._nodes) - 2)
    assert pack.kind == "pack"
    with pytest.raises(ce.GraphError, match=r"mul: its operand is a packed pair value \(pack\)"):
        pack * acc


@pytest.mark.parametrize("which", ["even", "odd"])
@pytest.mark.parametrize("bad", ["pair_gate", "packed"])
def test_store_pairs_takes_full_width_values_only(which, bad):
    g, acc, even, _odd = _pair_graph()
    value = ce.pair_gate(acc) if bad == "pair_gate" else _packed(g, even)
    args = (value, acc) if which == "even" else (acc, value)
    with pytest.raises(ce.GraphError, match=rf"store_pairs 'dz': its values must be full-width element-wise values, "
                                            rf"not the result of {'pair_gate' if bad == 'pair_gate' else 'pair_tile'}"):
        g.store_pairs("dz", *args)


def test_store_pairs_checks_its_operands():
    g, acc, even, odd = _pair_graph()
    with pytest.raises(ce.GraphError, match=r"store_pairs 'dz' odd value belongs to another Graph"):
        g.store_pairs("dz", acc, ce.Graph().accumulator())
    with pytest.raises(ce.GraphError, match=r"store_pairs 'dz' even value must be a coda_ext Value or a Python "
                                            r"number, got str"):
        g.store_pairs("dz", "acc", odd)
    with pytest.raises(ce.GraphError, match=r"store_pairs 'dz' odd value is nan: constants must be finite"):
        g.store_pairs("dz", even, math.nan)
    g.store_pairs("dz", 0.5, odd * acc)   # a number is a constant, broadcast
    g.build()


SINKS = {"store": lambda g, v: g.store("bad", v), "output": lambda g, v: g.output(v),
         "row_reduce": lambda g, v: g.row_reduce("bad", v)}


@pytest.mark.parametrize("sink", list(SINKS))
def test_packed_values_reaching_other_sinks_fail_at_build(sink):
    """store/output/reductions take any Value; a packed one is refused by the verifier, naming both nodes."""
    g, acc, even, odd = _pair_graph()
    g.store("keep", acc + even + odd)
    SINKS[sink](g, _packed(g, even))
    with pytest.raises(ce.GraphError, match=rf"\({sink}[^)]*\) reads the packed pairs of node \d+ "
                                            r"\(pair_tile 'z'\); use the two values Graph.pair_tile returns"):
        g.build()


def test_pair_names_are_claimed():
    g, acc, even, odd = _pair_graph()
    for call in (lambda: g.tile("z"), lambda: g.pair_tile("z"), lambda: g.store("z", acc),
                 lambda: g.store_pairs("z", acc, odd)):
        with pytest.raises(ce.GraphError, match=r"name 'z' is already used by a pair tile; names must be unique"):
            call()
    g.store_pairs("dz", acc, even)
    for call in (lambda: g.store("dz", acc), lambda: g.row_vector("dz"), lambda: g.store_pairs("dz", acc, odd),
                 lambda: g.pair_tile("dz")):
        with pytest.raises(ce.GraphError, match=r"name 'dz' is already used by a pair store"):
            call()
    g.tile("t")
    with pytest.raises(ce.GraphError, match=r"name 't' is already used by a tile"):
        g.pair_tile("t")
    with pytest.raises(ce.GraphError, match=r"pair tile name 'A' is reserved"):
        g.pair_tile("A")
    with pytest.raises(ce.GraphError, match=r"pair store name 'not ok' must be a Python identifier"):
        g.store_pairs("not ok", acc, odd)


def test_an_unused_pair_tile_is_an_error_and_one_half_is_enough():
    g, acc, _even, _odd = _pair_graph()
    g.output(acc)
    with pytest.raises(ce.GraphError, match=r"\(pair_tile 'z'\): input 'z' is never used"):
        g.build()
    g, acc, _even, odd = _pair_graph()
    g.output(acc * odd)
    kinds = [n.kind for n in g.build().nodes]
    assert kinds.count("unpack") == 1 and kinds.count("pair_tile") == 1   # the unused half is dropped


# --- the verifier on raw IR ---------------------------------------------------------------------------

N, A_ = ir.Node, ir.make_attrs
VALID = (
    N("accumulator"),                                        # 0
    N("pair_tile", (), A_(name="z", dtype="bfloat16")),      # 1
    N("unpack", (1,), A_(half=0)),                           # 2
    N("unpack", (1,), A_(half=1)),                           # 3
    N("mul", (0, 2)),                                        # 4
    N("pack", (4, 3), A_(dtype="bfloat16")),                 # 5
    N("pair_store", (5,), A_(name="dz", dtype="bfloat16")),  # 6
    N("output", (4,), A_(name="out")),                       # 7
)


def _edited(**nodes) -> ir.GraphIR:
    """VALID with nodes replaced (n4=...) or appended (n8=...)."""
    out = list(VALID)
    for key, node in sorted(nodes.items(), key=lambda kv: int(kv[0][1:])):
        i = int(key[1:])
        if i < len(out):
            out[i] = node
        else:
            out.append(node)
    return ir.GraphIR(tuple(out))


def test_valid_raw_pair_graph_verifies():
    g = ir.GraphIR(VALID)
    assert verify(g) is g
    one_half = ir.GraphIR(VALID[:3] + (N("mul", (0, 2)), N("pack", (3, 0), A_()), N("pair_store", (4,), A_(name="dz"))))
    assert verify(one_half) is one_half   # dtype None: the op's


RAW = {  # id: (the edit, what the GraphError says)
    "math on a pair tile": (dict(n4=N("mul", (0, 1))),
                            (r"node 4 \(mul\) reads the packed pairs of node 1 \(pair_tile 'z'\); use the two values "
                             r"Graph.pair_tile returns, and Graph.store_pairs to write pairs")),
    "store of a pair tile": (dict(n8=N("store", (1,), A_(name="s"))),
                             r"node 8 \(store 's'\) reads the packed pairs of node 1 \(pair_tile 'z'\)"),
    "store of a pack": (dict(n8=N("store", (5,), A_(name="s"))),
                        r"node 8 \(store 's'\) reads the packed pairs of node 5 \(pack\)"),
    "unpack of a pack": (dict(n8=N("unpack", (5,), A_(half=0)), n9=N("store", (8,), A_(name="s"))),
                         r"node 8 \(unpack\) reads the packed pairs of node 5 \(pack\)"),
    "pack of a pair tile": (dict(n5=N("pack", (4, 1), A_(dtype="bfloat16"))),
                            r"node 5 \(pack\) reads the packed pairs of node 1 \(pair_tile 'z'\)"),
    "pack of a pack": (dict(n8=N("pack", (5, 4), A_()), n9=N("pair_store", (8,), A_(name="p2"))),
                       r"node 8 \(pack\) reads the packed pairs of node 5 \(pack\)"),
    "pack of a pair_gate": (dict(n4=N("pair_gate", (0,), A_(act="silu")), n7=N("output", (0,), A_(name="out"))),
                            r"node 5 \(pack\) reads the half-width result of node 4 \(pair_gate\)"),
    "unpack of a tile": (dict(n1=N("tile", (), A_(name="z"))),
                         r"node 2 \(unpack\) must read a pair_tile, not node 1 \(tile 'z'\)"),
    "unpack of the accumulator": (dict(n2=N("unpack", (0,), A_(half=0))),
                                  r"node 2 \(unpack\) must read a pair_tile, not node 0 \(accumulator\)"),
    "pair store of a value": (dict(n6=N("pair_store", (4,), A_(name="dz", dtype="bfloat16"))),
                              r"node 6 \(pair_store 'dz'\) must read a pack, not node 4 \(mul\)"),
    "fp32 pair tile": (dict(n1=N("pair_tile", (), A_(name="z", dtype="float32"))),
                       (r"node 1 \(pair_tile 'z'\): pairs are 16-bit elements; dtype must be bfloat16 or float16, "
                        r"got 'float32'")),
    "fp32 pack": (dict(n5=N("pack", (4, 3), A_(dtype="float32"))), r"node 5 \(pack\): pairs are 16-bit elements"),
    "int pair store": (dict(n6=N("pair_store", (5,), A_(name="dz", dtype="int32"))),
                       r"node 6 \(pair_store 'dz'\): pairs are 16-bit elements; .*got 'int32'"),
    "unpack half 2": (dict(n3=N("unpack", (1,), A_(half=2))),
                      r"node 3 \(unpack\): unpack takes half 0 \(even column\) or 1 \(odd column\), got 2"),
    "unpack without a half": (dict(n3=N("unpack", (1,))), r"node 3 \(unpack\): unpack takes half .*got None"),
    "unnamed pair tile": (dict(n1=N("pair_tile", (), A_(dtype="bfloat16"))), r"node 1 \(pair_tile\): needs a name"),
    "unnamed pair store": (dict(n6=N("pair_store", (5,), A_())), r"node 6 \(pair_store\): needs a name"),
    "pack of one value": (dict(n5=N("pack", (4,), A_())), r"node 5 \(pack\): takes 2 inputs, got 1"),
    "pair tile name taken": (dict(n8=N("tile", (), A_(name="z")), n9=N("store", (8,), A_(name="s"))),
                             r"node 8 \(tile 'z'\): name 'z' is also used by node 1 \(pair_tile 'z'\)"),
    "unused pair tile": (dict(n8=N("pair_tile", (), A_(name="y")), n9=N("unpack", (8,), A_(half=1))),
                         r"node 8 \(pair_tile 'y'\): input 'y' is never used"),
}


@pytest.mark.parametrize("case", list(RAW))
def test_verifier_refuses_raw_pair_graphs(case):
    edit, message = RAW[case]
    with pytest.raises(ce.GraphError, match=message):
        verify(_edited(**edit))


# --- the interpreter ------------------------------------------------------------------------------------


def test_interpreter_reads_and_writes_pairs():
    """even[:, i] = z[:, 2i], odd[:, i] = z[:, 2i+1]; store_pairs interleaves; a graph of small integers,
    so every value is exact."""
    M, N, K = 3, 4, 4
    g, acc, even, odd = _pair_graph()
    g.output(acc * even + odd)
    g.store_pairs("dz", odd, acc - even)
    g.store("e", even, dtype="float32")
    A = torch.tensor([[1, 2, 0, -1], [0, 1, 3, 2], [-2, 0, 1, 1]], dtype=BF16)
    W = torch.eye(N, K, dtype=BF16)                            # acc = A
    z = torch.arange(M * 2 * N, dtype=BF16).reshape(M, 2 * N)  # z[m, c] = 8m + c
    got = ce.interpret(g, A, W, z=z, compute_dtype=torch.float64)
    ev = torch.tensor([[0, 2, 4, 6], [8, 10, 12, 14], [16, 18, 20, 22]], dtype=torch.float64)
    od = ev + 1
    a = A.double()
    assert torch.equal(got["e"], ev)
    assert torch.equal(got["out"], a * ev + od)
    want = torch.tensor([[1, 1 - 0, 3, 2 - 2, 5, 0 - 4, 7, -1 - 6],
                         [9, 0 - 8, 11, 1 - 10, 13, 3 - 12, 15, 2 - 14],
                         [17, -2 - 16, 19, 0 - 18, 21, 1 - 20, 23, 1 - 22]], dtype=torch.float64)
    assert got["dz"].shape == (M, 2 * N) and torch.equal(got["dz"], want)


# fp32 values and what they round to in bf16 / fp16 (round to nearest, ties to even):
# 1 + 2^-10: bf16 1 (8 significant bits), fp16 exact (11); 1 + 2^-8: a bf16 tie -> 1 (even);
# 1 + 3*2^-8: a bf16 tie between 1 + 2^-7 (odd) and 1 + 2^-6 (even); 65520: bf16 65536, fp16 overflows (inf);
# 2^-20: fp16 subnormal 2^-20 (exact), bf16 exact.
T = [1 + 2**-10, 1 + 2**-8, 1 + 3 * 2**-8, 65520.0, 2**-20]
ROUNDED = {"bfloat16": [1.0, 1.0, 1.015625, 65536.0, 2**-20],
           "float16": [1.0009765625, 1.00390625, 1.01171875, math.inf, 2**-20]}


@pytest.mark.parametrize("op_dtype", [BF16, FP16], ids=["bf16 op", "fp16 op"])
@pytest.mark.parametrize("compute", [torch.float64, torch.float32])
def test_pack_rounds_each_value_to_the_16_bit_dtype(op_dtype, compute):
    """store_pairs rounds each value to its dtype (the op's by default) -- the interpreter's result is
    not the unrounded math (unlike store, whose rounding happens when the kernel writes)."""
    M, N, K = 1, len(T), 8
    g = ce.Graph()
    acc = g.accumulator()
    t = g.tile("t", "float32")
    g.store_pairs("default", acc + t, acc - t)
    g.store_pairs("bf", acc + t, acc - t, dtype="bfloat16")
    g.store_pairs("hf", acc + t, acc - t, dtype=torch.float16)
    A = torch.zeros(M, K, dtype=op_dtype)                      # acc = 0: the stored values are t and -t
    W = torch.ones(N, K, dtype=op_dtype)
    got = ce.interpret(g, A, W, t=torch.tensor([T], dtype=torch.float32), compute_dtype=compute)
    for name, dtype in (("default", str(op_dtype)[6:]), ("bf", "bfloat16"), ("hf", "float16")):
        r = ROUNDED[dtype]
        want = torch.tensor([[v for x in r for v in (x, -x)]], dtype=compute)
        assert got[name].dtype == compute and got[name].shape == (M, 2 * N)
        assert torch.equal(got[name], want), (name, got[name], want)


def test_interpreter_checks_the_pair_tile_shape():
    g, acc, even, _odd = _pair_graph()
    g.output(acc + even)
    A, W = torch.ones(3, 8, dtype=BF16), torch.ones(4, 8, dtype=BF16)
    with pytest.raises(ValueError, match=r"z must have shape \(3, 8\), got \(3, 4\)"):
        ce.interpret(g, A, W, z=torch.ones(3, 4, dtype=BF16))


# --- emission ---------------------------------------------------------------------------------------------


def test_emitted_cpp_moves_pairs_as_32_bit_elements():
    g, acc, even, odd = _pair_graph(torch.float16)
    g.output(acc * even + odd)
    g.store_pairs("dz", acc, even)                        # the op's dtype (bf16)
    g.store_pairs("dh", acc, odd, dtype=torch.float16)
    ks = ce.kernel_source(g, torch.bfloat16)
    src = ks.source
    assert src.count("TileLoad<Cfg, float>") == 1                 # the (M, 2N) pairs as (M, N) 32-bit elements
    assert "Unpack<Cfg, cutlass::half_t, 0>" in src and "Unpack<Cfg, cutlass::half_t, 1>" in src
    assert "Pack<Cfg, cutlass::bfloat16_t>" in src and "Pack<Cfg, cutlass::half_t>" in src
    assert src.count("TileStore<Cfg, float>") == 2
    slots = {ks.lowered[i].name: ks.lowered[i].kind for i in ks.lowered.slots()}
    assert slots == {"z": "pair_tile", "dz": "pair_store", "dh": "pair_store"}


def test_unpack_takes_the_pair_tiles_dtype_and_only_the_used_half_is_emitted():
    g, acc, _even, odd = _pair_graph()         # the op's dtype
    g.output(acc * odd)
    src = ce.emit_source(g, torch.float16)
    assert "Unpack<Cfg, cutlass::half_t, 1>" in src and "Unpack<Cfg, cutlass::half_t, 0>" not in src
    assert "TileLoad<Cfg, float>" in src and "Pack<" not in src


# --- operand layouts: KernelConfig.major ---------------------------------------------------------------


@pytest.mark.parametrize("major", ["", "KK", "nk", "km", "k", "kkk", None])
def test_major_must_be_a_known_layout(major):
    with pytest.raises(ce.UnsupportedError, match=r"KernelConfig: major must be one of \('kk', 'kn', 'mk', 'mn'\) "
                                                  r"\(the contiguous dimension of A and of W\), got"):
        ce.KernelConfig(major=major)


def test_major_tags():
    base = ce.KernelConfig()
    assert base.major == "kk" and DEFAULT_CONFIG.major == "kk"
    assert [dataclasses.replace(base, major=m).tag for m in MAJORS] == \
        [base.tag, base.tag + "_kn", base.tag + "_mk", base.tag + "_mn"]
    c = ce.KernelConfig(tile=(64, 256, 64), schedule="pingpong", swizzle=8, raster="along_n", epilogue_tile=(64, 32),
                        major="mn")
    assert c.tag == "ping_64x256x64_c1x1_e64x32_s8_along_n_mn"
    assert len({dataclasses.replace(c, major=m).tag for m in MAJORS}) == len(MAJORS)


@pytest.mark.parametrize("epilogue_tile", [None, (128, 32)], ids=["cutlass epilogue tile", "epilogue tile 128x32"])
@pytest.mark.parametrize("major", MAJORS)
def test_config_template_arguments(major, epilogue_tile):
    """Config<..., EpiTileM, EpiTileN, AMajorM, BMajorN>: kk keeps the short form."""
    g = ce.Graph()
    g.output(g.accumulator())
    ks = ce.kernel_source(g, torch.bfloat16, ce.KernelConfig(major=major, epilogue_tile=epilogue_tile))
    line = next(x for x in ks.source.splitlines() if x.startswith("using Cfg = "))
    em, en = epilogue_tile or (0, 0)
    tail = {"kk": f", {em}, {en}" if epilogue_tile else "", "kn": f", {em}, {en}, false, true",
            "mk": f", {em}, {en}, true, false", "mn": f", {em}, {en}, true, true"}[major]
    assert line == ("using Cfg = coda::kernels::Config<cutlass::bfloat16_t, cutlass::bfloat16_t, 128, 256, 64, 1, 1, "
                    f"coda::kernels::Cooperative{tail}>;")
    assert ks.label.endswith(f"{ks.config.tag}]") and ks.config.major == major


def test_each_major_is_its_own_kernel():
    g, acc, even, _odd = _pair_graph()
    g.output(acc * even)
    sources = {m: ce.kernel_source(g, "bfloat16", ce.KernelConfig(major=m)).source for m in MAJORS}
    assert len(set(sources.values())) == len(MAJORS)       # the cache key is the source: one kernel per layout


def test_tuned_op_carries_its_major():
    """config="auto" builds no kernel up front: TunedOp lays every config out in its major."""
    g, acc, even, _odd = _pair_graph()
    g.output(acc * even)
    plain = ce.compile(g, "bfloat16", "auto")
    op = ce.compile(g, "bfloat16", "auto", major="kn")
    assert plain.major == "kk" and op.major == "kn"
    assert plain.key != op.key and op.key.endswith("|kn")
    assert "major=kn" in repr(op)
    assert {c.major for c in op.candidates} == {"kn"}
    assert op.config_for(4096, 4096, 4096).major == "kn" and plain.config_for(4096, 4096, 4096).major == "kk"
    items = op.prebuild_items()
    assert [c.tag for _, _, c in items] == [dataclasses.replace(c, major="kn").tag
                                            for c in tuning.heuristic_configs(op.epilogue, "kn")]
    # the 128x192 tiles: K-major, and N-major for a pair-tile epilogue over K >= 4096 (the dSwiGLU's)
    wide = [dataclasses.replace(tuning.TALL_192_S8, major="kn")] if op.epilogue.pair_loads else []
    assert [c for _, _, c in items if c.tile[:2] == (128, 192)] == wide
    tuned = ce.compile(g, "bfloat16", "tune", major="mn")
    assert {c.major for _, _, c in tuned.prebuild_items()} == {"mn"}


def test_prebuild_ops_items_carry_each_modules_major():
    """`python -m coda_ext prebuild --ops`: every config "auto" may use for every graph variant, in the
    layout that variant is called with (BUILDS: (graph, args, major))."""
    cli = importlib.import_module("coda_ext.tools.prebuild")   # the module (coda_ext.prebuild is the function)
    majors_seen = set()
    for m in ops.MODULES + ops.BACKWARD_MODULES:
        items = cli.ready_op_items([m.NAME], ["bfloat16", "float16"])
        want = collections.Counter()
        for build, args, major in m.BUILDS:
            digest = build(*args).build().digest()
            epilogue = TunedOp(build(*args), "bfloat16", tune=False, major=major).epilogue
            for dtype in ("bfloat16", "float16"):
                for c in tuning.heuristic_configs(epilogue, major):
                    want[(digest, dtype, dataclasses.replace(c, major=major).tag)] += 1
        got = collections.Counter((g.build().digest(), dtype, c.tag) for g, dtype, c in items)
        assert got == want, m.NAME
        assert {c.major for _, _, c in items} == {major for _, _, major in m.BUILDS}, m.NAME
        majors_seen |= {c.major for _, _, c in items}
    assert {"kk", "kn", "mn"} <= majors_seen
    everything = cli.ready_op_items([], ["bfloat16"])
    epilogues = [(TunedOp(b(*a), "bfloat16", tune=False, major=mj).epilogue, mj)
                 for m in ops.MODULES + ops.BACKWARD_MODULES for b, a, mj in m.BUILDS]
    assert len(everything) == sum(len(tuning.heuristic_configs(e, mj)) for e, mj in epilogues)


# --- runtime checks of transposed operands ---------------------------------------------------------------


def _transposed(rows: int, K: int, ld: int | None = None, dtype=BF16, offset: int = 0) -> torch.Tensor:
    """A (rows, K) view with rows contiguous: strides (1, ld), from a (K, ld) buffer."""
    ld = ld or rows
    buf = torch.zeros(K * ld + offset, dtype=dtype)
    return buf[offset:].view(K, ld)[:, :rows].t()


def test_check_transposed_accepts_transposed_views():
    for t in (_transposed(16, 40), _transposed(16, 40, ld=24), torch.zeros(40, 8, dtype=BF16).t()):
        assert checks._check_transposed("W", t, BF16, torch.device("cpu"), "N") is None


TRANSPOSED_ERRORS = {  # id: (tensor, expected dtype, error, message)
    "contiguous rows": (lambda: torch.zeros(16, 40, dtype=BF16), BF16, ValueError,
                        (r"W \(N, K\) = \(16, 40\) must be contiguous along N \(a transposed view such as x.t\(\), "
                         r"strides \(1, ld\) with ld >= 16\), got strides \(40, 1\); this op reads W in that layout")),
    "overlapping columns": (lambda: torch.zeros(256, dtype=BF16).as_strided((16, 8), (1, 8)), BF16, ValueError,
                            r"must be contiguous along N .* got strides \(1, 8\)"),
    "N not a multiple of 8": (lambda: _transposed(12, 40, ld=16), BF16, ValueError,
                              (r"W \(N, K\) = \(12, 40\) is read along N: N and the stride of K must be multiples of "
                               r"8 elements and the data 16-byte aligned \(got N = 12, strides \(1, 16\)\); pad the "
                               r"contiguous dimension")),
    "stride not a multiple of 8": (lambda: _transposed(16, 40, ld=20), BF16, ValueError,
                                   r"must be multiples of 8 elements .*strides \(1, 20\)"),
    "misaligned data": (lambda: _transposed(16, 40, offset=1), BF16, ValueError,
                        r"N and the stride of K must be multiples of 8 elements and the data 16-byte aligned"),
    "wrong dtype": (lambda: _transposed(16, 40, dtype=FP16), BF16, TypeError,
                    r"W has dtype torch.float16, expected torch.bfloat16; convert it with .to\(torch.bfloat16\)"),
    "fp32": (lambda: _transposed(16, 40, dtype=torch.float32), FP16, TypeError,
             r"W has dtype torch.float32, expected torch.float16"),
    "another device": (lambda: _transposed(16, 40).to("meta"), BF16, ValueError,
                       r"W is on meta but A is on cpu; put the operands on one device"),
}


@pytest.mark.parametrize("case", list(TRANSPOSED_ERRORS))
def test_check_transposed_errors(case):
    make, dtype, error, message = TRANSPOSED_ERRORS[case]
    with pytest.raises(error, match=message):
        checks._check_transposed("W", make(), dtype, torch.device("cpu"), "N")


def test_check_transposed_names_m_for_a():
    with pytest.raises(ValueError, match=r"A \(M, K\) = \(20, 16\) is read along M: M and the stride of K"):
        checks._check_transposed("A", _transposed(20, 16, ld=24), BF16, torch.device("cpu"), "M")


# --- the op interface: (M, 2N) pair tiles and stores --------------------------------------------------------

M0, N0, K0 = 5, 8, 16


STORES = {"dz": BF16, "dh": FP16}   # pair stores of _interface_graph: the op's dtype (bf16), and fp16


def _interface_graph(stores=tuple(STORES)):
    """A pair tile read, pair stores written (with 'auto', one of them: a pair tile and two pair stores
    leave the cooperative 128x256 config, "auto"'s first candidate, too little shared memory)."""
    g, acc, even, odd = _pair_graph()
    g.output(acc * even + odd)
    if "dz" in stores:
        g.store_pairs("dz", acc, odd)
    if "dh" in stores:
        g.store_pairs("dh", odd, acc, dtype="float16")
    g.row_reduce("rs", acc * even)
    return g


@pytest.mark.parametrize("store", list(STORES))
def test_interface_reports_pair_shapes(store):
    op = ce.compile(_interface_graph((store,)), "bfloat16", "auto")   # a TunedOp: kernel_source only, no nvcc
    assert op.input_names == ("z",) and op.output_names == ("out", store, "rs")
    assert op.input_shape("z", M0, N0) == (M0, 2 * N0)
    assert op.output_spec(store, M0, N0) == ((M0, 2 * N0), STORES[store])
    assert op.output_spec("out", M0, N0) == ((M0, N0), BF16)
    assert op.output_spec("rs", M0, N0) == ((M0,), torch.float32)


@pytest.mark.parametrize("store", list(STORES))
@pytest.mark.parametrize("lead", [(M0,), (2, 3)], ids=["2-D", "batched"])
def test_fake_gives_pair_shapes(lead, store):
    op = ce.compile(_interface_graph((store,)), "bfloat16", "auto")
    with FakeTensorMode():
        out = op(torch.empty(*lead, K0, dtype=BF16), torch.empty(N0, K0, dtype=BF16),
                 z=torch.empty(*lead, 2 * N0, dtype=BF16))
    shapes = {k: (tuple(v.shape), v.dtype) for k, v in out.items()}
    assert shapes == {"out": ((*lead, N0), BF16), store: ((*lead, 2 * N0), STORES[store]),
                      "rs": (lead, torch.float32)}


def test_interpreted_op_flattens_and_restores_pair_tensors(monkeypatch):
    """The custom op's real path with the kernel replaced by the interpreter: a batched (B, S, 2N) pair
    tile is flattened to (B*S, 2N) and the pair stores come back as (B, S, 2N)."""
    def run(self, A, W, inputs, out):
        assert not out and inputs["z"].shape == (A.shape[0], 2 * W.shape[0])
        got = ce.interpret(self.graph, A, W, compute_dtype=torch.float64, **inputs)
        return Outputs({k: v.to(self.output_spec(k, A.shape[0], W.shape[0])[1]) for k, v in got.items()})

    monkeypatch.setattr(TunedOp, "run", run)
    g = _interface_graph(("dz",))
    op = ce.compile(g, "bfloat16", "auto")
    gen = torch.Generator().manual_seed(0)
    A = torch.randn(2, 3, K0, generator=gen).to(BF16)
    W = torch.randn(N0, K0, generator=gen).to(BF16)
    z = torch.randn(2, 3, 2 * N0, generator=gen).to(BF16)
    out = op(A, W, z=z)
    flat = ce.interpret(g, A.reshape(6, K0), W, z=z.reshape(6, 2 * N0), compute_dtype=torch.float64)
    assert out["dz"].shape == (2, 3, 2 * N0) and out["out"].shape == (2, 3, N0) and out["rs"].shape == (2, 3)
    assert torch.equal(out["dz"], flat["dz"].to(BF16).reshape(2, 3, 2 * N0))
    assert torch.equal(out["dz"][..., 1::2], z[..., 1::2])       # the odd half passed through


# --- a compiled op's checks, up to the launch ------------------------------------------------------------


@pytest.fixture
def no_nvcc(monkeypatch, stub_library):
    """ce.compile without nvcc: every kernel is the stub; returns the sources it was asked to build."""
    built: list[str] = []

    def build(source, label):
        built.append(source)
        return stub_library

    monkeypatch.setattr(nvcc, "build", build)
    return built


def test_compile_lays_the_config_out(no_nvcc):
    g = _interface_graph()
    assert ce.compile(g, "bfloat16").config == DEFAULT_CONFIG
    assert ce.compile(g, "bfloat16", major="kn").config == dataclasses.replace(DEFAULT_CONFIG, major="kn")
    cfg = ce.KernelConfig(tile=(64, 128, 64), schedule="pingpong", major="mn")
    assert ce.compile(g, "bfloat16", cfg).config == cfg                       # major=None keeps the config's
    assert ce.compile(g, "bfloat16", cfg, major="kk").config == dataclasses.replace(cfg, major="kk")
    assert [s.count(", true") for s in no_nvcc] == [0, 1, 2, 0]


def _launch(launched, op, A, W, **kw):
    with pytest.raises(launched) as e:
        op(A, W, **kw)
    return e.value.args[0]


@pytest.mark.parametrize("major", MAJORS)
def test_op_reads_operands_in_its_layout(no_nvcc, cpu_as_gpu, major):
    """A (M, K) / W (N, K) as views with M / N contiguous where the major says so; the other layout is
    refused, naming the operand and the fix. Pair tiles and stores are (M, 2N)."""
    M, N, K = 16, 8, 24
    op = ce.compile(_interface_graph(), "bfloat16", major=major)
    z = torch.zeros(M, 2 * N, dtype=BF16)
    A = _transposed(M, K) if major[0] == "m" else torch.zeros(M, K, dtype=BF16)
    W = _transposed(N, K) if major[1] == "n" else torch.zeros(N, K, dtype=BF16)
    outputs = _launch(cpu_as_gpu, op, A, W, z=z, out={"dz": torch.zeros(M, 2 * N, dtype=BF16)})
    assert {k: (tuple(v.shape), v.dtype) for k, v in outputs.items()} == {
        "out": ((M, N), BF16), "dz": ((M, 2 * N), BF16), "dh": ((M, 2 * N), FP16), "rs": ((M,), torch.float32)}
    other_A = torch.zeros(M, K, dtype=BF16) if major[0] == "m" else _transposed(M, K)
    other_W = torch.zeros(N, K, dtype=BF16) if major[1] == "n" else _transposed(N, K)
    for name, args in (("A", (other_A, W)), ("W", (A, other_W))):
        contiguous = {"A": "M", "W": "N"}[name] if (major[0] if name == "A" else major[1]) != "k" else None
        message = rf"{name} \({'M' if name == 'A' else 'N'}, K\) = .* must be contiguous along {contiguous}" \
            if contiguous else rf"{name} must have a contiguous last dimension \(stride 1\)"
        with pytest.raises(ValueError, match=message):
            op(*args, z=z, out={})


def test_m_major_needs_m_a_multiple_of_8(no_nvcc, cpu_as_gpu):
    op = ce.compile(_interface_graph(), "bfloat16", major="mk")
    with pytest.raises(ValueError, match=r"A \(M, K\) = \(12, 24\) is read along M: M and the stride of K must be "
                                         r"multiples of 8"):
        op(_transposed(12, 24, ld=16), torch.zeros(8, 24, dtype=BF16), z=torch.zeros(12, 16, dtype=BF16), out={})


PAIR_INPUT_ERRORS = {  # id: (z, out, error, message)
    "z at width N": (lambda M, N: torch.zeros(M, N, dtype=BF16), {}, ValueError,
                     r"z must have shape \(16, 16\), got \(16, 8\)"),
    "z in fp32": (lambda M, N: torch.zeros(M, 2 * N, dtype=torch.float32), {}, TypeError,
                  r"z has dtype torch.float32, expected torch.bfloat16"),
    "z transposed": (lambda M, N: torch.zeros(2 * N, M, dtype=BF16).t(), {}, ValueError,
                     r"z must have a contiguous last dimension"),
    "dz at width N": (lambda M, N: torch.zeros(M, 2 * N, dtype=BF16), {"dz": torch.zeros(16, 8, dtype=BF16)},
                      ValueError, r"out\['dz'\] must have shape \(16, 16\), got \(16, 8\)"),
    "dh in bf16": (lambda M, N: torch.zeros(M, 2 * N, dtype=BF16), {"dh": torch.zeros(16, 16, dtype=BF16)},
                   TypeError, r"out\['dh'\] has dtype torch.bfloat16, expected torch.float16"),
}


@pytest.mark.parametrize("case", list(PAIR_INPUT_ERRORS))
def test_pair_tensors_are_checked(no_nvcc, cpu_as_gpu, case):
    make, out, error, message = PAIR_INPUT_ERRORS[case]
    M, N, K = 16, 8, 24
    op = ce.compile(_interface_graph(), "bfloat16")
    with pytest.raises(error, match=message):
        op(torch.zeros(M, K, dtype=BF16), torch.zeros(N, K, dtype=BF16), z=make(M, N), out=out)


def test_pair_rows_need_n_a_multiple_of_4(no_nvcc, cpu_as_gpu):
    """(M, 2N) 16-bit rows are 4N bytes: TMA needs them 16-byte aligned (a graph without D, so N = 6 passes
    the operand checks)."""
    g, acc, even, odd = _pair_graph()
    g.store_pairs("dz", acc, even + odd)
    op = ce.compile(g, "bfloat16")
    A, z = torch.zeros(4, 8, dtype=BF16), torch.zeros(4, 16, dtype=BF16)
    _launch(cpu_as_gpu, op, A, torch.zeros(8, 8, dtype=BF16), z=z, out={})
    with pytest.raises(ValueError, match=r"z's rows are 24 bytes apart; they must be a multiple of 16 bytes"):
        op(A, torch.zeros(6, 8, dtype=BF16), z=torch.zeros(4, 12, dtype=BF16), out={})
