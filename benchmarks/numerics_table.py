"""The numerics table of docs/numerics.md, measured: for each node kind and each ready op, the max
error of coda_ext's result against an fp64 reference (the ready ops: their module's fp32 reference),
in bf16 and fp16, at a benchmark shape and a ragged one, next to the error of PyTorch doing the same
math in the same dtype; and whether repeated launches give the same bits (per kernel; for the
node-kind kernels also under other swizzle/raster launch orders, which compile to the same kernel).

    python -m coda_ext prebuild benchmarks/numerics_table.py -j 16   # the kernels below, in parallel
    python -m benchmarks.numerics_table                              # H100: expected about a minute
        [--quick] [--ops linear_residual_norm ...] [--dtypes bfloat16] [--out PATH]

Writes numerics_<gpu>.json in benchmarks/results/ (--out; <gpu> the GPU it runs on: h100, h200, …) and prints
markdown tables.

Node kinds: five graphs (KIND_GRAPHS), each output one kind applied to the accumulator (and to
fresh inputs), stored in the op's dtype, written as tests/helpers/fuzz_strategies.py cases so its fp64
reference (and its fragile-element mask: elements whose comparison, select, cast or turns decision
fp32 rounding may take the other way are left out) measures them; the config is the default
(ping-pong 128x128x64) at every shape. Unit-scale operands (A, W ~ K**-0.25 N(0, 1): acc ~ N(0, 1)).
PyTorch in the dtype: coda_ext.interpret(compute_dtype=dtype) (the GEMM output rounded to the dtype,
then every node in it). The rule of docs/design.md (error <= 2x PyTorch's + 1e-5 (1 + max |ref|)) is
checked and reported, not asserted.

Ready ops: Llama-3-8B dimensions (d 4096, F 14336, 32/8 heads of 128, vocabulary 128256) at
M = 4096 and M = 4000 (not a tile multiple; the "auto" config is the same, so one kernel each).
"""
# No `from __future__ import annotations`: `python -m coda_ext prebuild` loads this file outside sys.modules,
# where dataclasses cannot resolve string annotations.
import argparse
import concurrent.futures
import dataclasses
import math
import os
import pathlib
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import coda_ext as ce
from benchmarks import common
from coda_ext import tuning
from tests.helpers import fuzz_strategies as fz
from tests.helpers import rand, references
from tests.helpers.checks import floor, max_err, nan_outputs, within_rule

ROOT = common.ROOT

DTYPES = ("bfloat16", "float16")
CONFIG = ce.DEFAULT_CONFIG
#: (M, N, K): a benchmark shape and a ragged one (M, N, K none a tile multiple; N a multiple of 32
#: for the segments and of 4 for the pair tile).
KIND_SHAPES = {"4096^3": (4096, 4096, 4096), "333x4000x4040": (333, 4000, 4040)}
QUICK_KIND_SHAPES = {"333x4000x4040": (333, 4000, 4040)}
#: The launch orders compared with the default one (swizzle, raster): launch arguments, same kernel.
ORDERS = ((1, "heuristic"), (8, "along_m"), (2, "along_n"))

# --- the node-kind graphs ---------------------------------------------------------------------------


class _Calls:
    """fz.make_case calls, written as a program: add() returns the step's index."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def add(self, code: str, *args: Any, name: str | None = None, **params: Any) -> int:
        self.calls.append((code, args, params, name))
        return len(self.calls) - 1

    def store(self, name: str, value: int) -> None:
        self.add("g.store({name!r}, {0})", value, name=name)

    def case(self, dtype: str) -> fz.Case:
        return fz.make_case(*self.calls, dtype=dtype)


def _unary(dtype: str) -> fz.Case:
    c = _Calls()
    a = c.add("g.accumulator()")
    c.add("g.output({0})", a, name="out")
    absa = c.add("ce.abs({0})", a)
    pos = c.add("{0} + {1}", absa, 0.5)
    c.store("exp", c.add("ce.exp({0})", c.add("ce.minimum({0}, {1})", a, 8.0)))
    c.store("log", c.add("ce.log({0})", pos))
    c.store("sqrt", c.add("ce.sqrt({0})", absa))
    c.store("rsqrt", c.add("ce.rsqrt({0})", pos))
    c.store("square", c.add("ce.square({0})", a))
    c.store("tanh", c.add("ce.tanh({0})", a))
    c.store("sigmoid", c.add("ce.sigmoid({0})", a))
    c.store("silu", c.add("ce.silu({0})", a))
    c.store("gelu_erf", c.add("ce.gelu({0})", a))
    c.store("gelu_tanh", c.add("ce.gelu({0}, approximate='tanh')", a))
    c.store("gelu_erf_grad", c.add("ce.gelu_grad({0})", a))
    c.store("gelu_tanh_grad", c.add("ce.gelu_grad({0}, approximate='tanh')", a))
    return c.case(dtype)


def _select(dtype: str) -> fz.Case:
    """Exact kinds, casts, comparisons, where, col_index, integer vectors, pair_swap; no output D."""
    c = _Calls()
    a = c.add("g.accumulator()")
    t = c.add("g.tile({name!r})", name="t")
    r = c.add("g.row_vector({name!r})", name="r")
    col = c.add("g.col_vector({name!r}, {dtype!r})", name="c", dtype="float32")
    target = c.add("g.col_vector({name!r}, {dtype!r})", name="target", dtype="int32")
    c.store("neg", c.add("ce.neg({0})", a))
    c.store("abs", c.add("ce.abs({0})", a))
    c.store("relu", c.add("ce.relu({0})", a))
    c.store("max", c.add("ce.maximum({0}, {1})", a, t))
    c.store("min", c.add("ce.minimum({0}, {1})", a, r))
    c.store("cast_bf16", c.add("ce.cast({0}, {dtype!r})", a, dtype="bfloat16"))
    c.store("cast_fp16", c.add("ce.cast({0}, {dtype!r})", a, dtype="float16"))
    c.store("where_lt", c.add("ce.where({0}, {1}, {2})", c.add("ce.lt({0}, {1})", a, t), a, r))
    hit = c.add("ce.eq({0}, {1})", c.add("g.col_index()"), target)
    c.store("where_eq_col_index", c.add("ce.where({0}, {1}, {2})", hit, a, 0.0))
    gt, ge = c.add("ce.gt({0}, {1})", a, t), c.add("ce.ge({0}, {1})", a, r)
    le, ne = c.add("ce.le({0}, {1})", a, col), c.add("ce.ne({0}, {1})", a, 0.0)
    c.store("compare_sum", c.add("{0} + {1}", c.add("{0} + {1}", gt, ge), c.add("{0} + {1}", le, ne)))
    c.store("pair_swap", c.add("ce.pair_swap({0})", a))
    return c.case(dtype)


def _binary(dtype: str) -> fz.Case:
    """Binary ops with every leaf kind, fma, scalars; turns, cos/sin_turns and rotate_pairs (RoPE); hi16, lo8 and
    join24 (the accumulator rounded to 24 bits)."""
    c = _Calls()
    a = c.add("g.accumulator()")
    r = c.add("g.row_vector({name!r})", name="r")
    col = c.add("g.col_vector({name!r}, {dtype!r})", name="c", dtype="float32")
    t = c.add("g.tile({name!r})", name="t")
    alpha = c.add("g.scalar({name!r})", name="alpha")
    scale = c.add("g.scalar({name!r}, pointer=True)", name="scale")
    pos = c.add("g.col_vector({name!r}, {dtype!r})", name="pos", dtype="int32")
    fhi = c.add("g.row_vector({name!r}, {dtype!r})", name="fhi", dtype="float32")
    flo = c.add("g.row_vector({name!r}, {dtype!r})", name="flo", dtype="float32")
    c.add("g.output({0})", c.add("ce.fma({0}, {1}, {2})", a, r, col), name="out")
    c.store("add_row", c.add("{0} + {1}", a, r))
    c.store("sub_col", c.add("{0} - {1}", a, col))
    c.store("mul_tile", c.add("{0} * {1}", a, t))
    c.store("div", c.add("{0} / {1}", a, c.add("{0} + {1}", c.add("ce.abs({0})", t), 0.5)))
    c.store("mul_scalar", c.add("{0} * {1}", a, alpha))
    c.store("mul_pointer", c.add("{0} * {1}", a, scale))
    c.store("fma_const", c.add("ce.fma({0}, {1}, {2})", a, 3.0, -1.5))
    turns = c.add("ce.turns({0}, {1}, {2})", pos, fhi, flo)
    c.store("turns", turns)
    c.store("cos_turns", c.add("ce.cos_turns({0})", turns))
    c.store("sin_turns", c.add("ce.sin_turns({0})", turns))
    c.store("rotate_pairs", c.add("ce.rotate_pairs({0}, {1})", a, turns))
    c.store("join24", c.add("ce.join24(ce.hi16({0}), ce.lo8({0}))", a))
    return c.case(dtype)


def _segments(dtype: str) -> fz.Case:
    """segment_reduce (32 columns) and pair_gate with every activation; the graph also gets a pair tile
    and store_pairs (PAIRS_EXTRA: fuzz_strategies has no rows for them)."""
    c = _Calls()
    a = c.add("g.accumulator()")
    for op in ("sum", "sumsq", "max"):
        c.store(f"segment_{op}", c.add("ce.segment_reduce({0}, {size}, {op!r})", a, size=32, op=op))
    for act in ("silu", "sigmoid", "relu", "gelu_tanh", "gelu_erf"):
        c.store(f"pair_gate_{act}", c.add("ce.pair_gate({0}, {act!r})", a, act=act))
    return c.case(dtype)


def _reductions(dtype: str) -> fz.Case:
    c = _Calls()
    a = c.add("g.accumulator()")
    c.add("g.output({0})", a, name="out")
    for op in ("sum", "max", "sumsq", "logsumexp"):
        c.add("g.row_reduce({name!r}, {0}, {op!r})", a, name=f"row_{op}", op=op)
    for op in ("sum", "max", "sumsq"):
        c.add("g.col_reduce({name!r}, {0}, {op!r})", a, name=f"col_{op}", op=op)
    return c.case(dtype)


def add_pairs(g: ce.Graph) -> ce.Graph:
    """even, odd = pair_tile("z"); store_pairs("pairs", acc * even, acc * odd)."""
    acc = g.accumulator()
    even, odd = g.pair_tile("z")
    g.store_pairs("pairs", acc * even, acc * odd)
    return g


#: name -> (fz case of a dtype, extra builder steps beyond fuzz_strategies' rows or None)
KIND_GRAPHS: dict[str, tuple[Callable[[str], fz.Case], Callable[[ce.Graph], ce.Graph] | None]] = {
    "unary": (_unary, None),
    "select": (_select, None),
    "binary": (_binary, None),
    "segments": (_segments, add_pairs),
    "reductions": (_reductions, None),
}

#: output -> what it measures (the row label of the table)
LABELS = {
    "unary/out": "accumulator (D = acc)", "unary/exp": "exp (of min(acc, 8))", "unary/log": "log (of abs(acc) + 0.5)",
    "unary/sqrt": "sqrt (of abs(acc))", "unary/rsqrt": "rsqrt (of abs(acc) + 0.5)", "unary/square": "square",
    "unary/tanh": "tanh", "unary/sigmoid": "sigmoid", "unary/silu": "silu", "unary/gelu_erf": "gelu (erf)",
    "unary/gelu_tanh": "gelu (tanh)", "unary/gelu_erf_grad": "gelu_grad (erf)",
    "unary/gelu_tanh_grad": "gelu_grad (tanh)",
    "select/neg": "neg", "select/abs": "abs", "select/relu": "relu", "select/max": "max (acc, tile)",
    "select/min": "min (acc, row vector)", "select/cast_bf16": "cast to bf16", "select/cast_fp16": "cast to fp16",
    "select/where_lt": "where(lt(acc, tile), acc, row)",
    "select/where_eq_col_index": "where(eq(col_index, int32 target), acc, 0)",
    "select/compare_sum": "gt + ge + le + ne (0/1 sums)", "select/pair_swap": "pair_swap",
    "binary/out": "fma(acc, row, fp32 col) (D)", "binary/add_row": "add (row vector)",
    "binary/sub_col": "sub (fp32 col vector)", "binary/mul_tile": "mul (tile)",
    "binary/div": "div (by abs(tile) + 0.5)",
    "binary/mul_scalar": "mul (runtime scalar)", "binary/mul_pointer": "mul (pointer scalar)",
    "binary/fma_const": "fma (constants)", "binary/turns": "turns (int32 pos, fp32 hi/lo)",
    "binary/cos_turns": "cos_turns", "binary/sin_turns": "sin_turns", "binary/rotate_pairs": "rotate_pairs",
    "binary/join24": "join24(hi16(acc), lo8(acc)) (acc to 24 bits)",
    "segments/segment_sum": "segment_reduce sum (32)", "segments/segment_sumsq": "segment_reduce sumsq (32)",
    "segments/segment_max": "segment_reduce max (32)", "segments/pair_gate_silu": "pair_gate silu",
    "segments/pair_gate_sigmoid": "pair_gate sigmoid", "segments/pair_gate_relu": "pair_gate relu",
    "segments/pair_gate_gelu_tanh": "pair_gate gelu_tanh", "segments/pair_gate_gelu_erf": "pair_gate gelu_erf",
    "segments/pairs": "pair_tile + store_pairs (acc * even, acc * odd)",
    "reductions/out": "accumulator (D, with reductions)", "reductions/row_sum": "row_reduce sum",
    "reductions/row_max": "row_reduce max", "reductions/row_sumsq": "row_reduce sumsq",
    "reductions/row_logsumexp": "row_reduce logsumexp", "reductions/col_sum": "col_reduce sum",
    "reductions/col_max": "col_reduce max", "reductions/col_sumsq": "col_reduce sumsq",
}


def kind_graph(name: str, dtype: str) -> ce.Graph:
    make, extra = KIND_GRAPHS[name]
    g = make(dtype).build()
    return extra(g) if extra else g


# --- the ready ops ------------------------------------------------------------------------------------

D_MODEL, FFN, N_HEADS, N_KV_HEADS, HEAD_DIM, VOCAB = 4096, 14336, 32, 8, 128, 128256
THETA, EPS = 500000.0, 1e-6
OP_SHAPES = {"M=4096": 4096, "M=4000": 4000}
QUICK_OP_SHAPES = {"M=4000": 4000}


@dataclasses.dataclass(frozen=True)
class ReadyOp:
    name: str               # the public function of coda_ext.ops
    outputs: tuple[str, ...]
    major: str
    build: Callable[..., Any]   # the module's graph builder, called with `args` (as the op calls it)
    args: tuple
    gemm: Callable[[int], tuple[int, int, int]]   # M (tokens) -> the GEMM's (M, N, K)

    def graph(self):
        return self.build(*self.args)


def _ready_ops() -> dict[str, ReadyOp]:
    from coda_ext.ops import (
        linear_grad,
        lm_head_ce,
        norm_backward,
        qkv,
        residual_norm,
        rms_scale,
        swiglu,
        swiglu_backward,
    )
    d, f = D_MODEL, FFN
    ops = [
        ReadyOp("linear_residual_norm", ("out", "h", "rstd"), "kk", residual_norm.graph, (), lambda m: (m, d, f)),
        ReadyOp("rms_linear", ("out",), "kk", rms_scale.graph, ("silu",), lambda m: (m, f, d)),
        ReadyOp("linear_swiglu_train", ("y", "z"), "kk", swiglu.graph, (True, True), lambda m: (m, 2 * f, d)),
        ReadyOp("qkv_rope", ("qkv",), "kk", qkv.graph, (True, True, HEAD_DIM),
                lambda m: (m, (N_HEADS + 2 * N_KV_HEADS) * HEAD_DIM, d)),
        ReadyOp("lm_head_cross_entropy", ("loss", "lse"), "kk", lm_head_ce.graph, (True,), lambda m: (m, VOCAB, d)),
        ReadyOp("rms_norm_backward_linear", ("dx", "n", "dgamma"), "kn", norm_backward.graph, (True,),
                lambda m: (m, d, 2 * f)),
        ReadyOp("swiglu_backward_linear", ("dz", "y", "zdz"), "kn", swiglu_backward.graph, (), lambda m: (m, f, d)),
        ReadyOp("linear_dx", ("dx",), "kn", linear_grad.graph, (False,), lambda m: (m, f, d)),
        ReadyOp("weight_grad", ("dw",), "mn", linear_grad.graph, (False,), lambda m: (d, f, m)),
    ]
    return {o.name: o for o in ops}


def dispatched_config(op: ReadyOp, dtype: str, M: int) -> str | None:
    """The config tag the op's "auto" dispatch used for M tokens in this process (None if unknown)."""
    try:
        from coda_ext import tuning as t
        from coda_ext.ops import common

        tuned = common.graph_op(op.build, dtype, "auto", *op.args, major=op.major)
        Mg, N, K = op.gemm(M)
        for (bucket, n, k, _), compiled in tuned._chosen.items():
            if (bucket, n, k) == (t.m_bucket(Mg), N, K):
                return compiled.config.tag
    except Exception:  # noqa: BLE001 - only a label
        pass
    return None


READY_OPS = _ready_ops()


def selected_ops(names: list[str] | None = None) -> list[ReadyOp]:
    """The ready ops to measure: `names`, else $CODA_NUMERICS_OPS (comma-separated; "none" for none), else all."""
    if names is None:
        env = os.environ.get("CODA_NUMERICS_OPS")
        names = None if env is None else [n for n in env.split(",") if n and n != "none"]
    if names is None:
        return list(READY_OPS.values())
    unknown = sorted(set(names) - set(READY_OPS))
    if unknown:
        raise SystemExit(f"unknown ready op(s) {unknown}; known: {sorted(READY_OPS)}")
    return [READY_OPS[n] for n in names]


def op_config(op: ReadyOp, dtype: str, M: int, sms: int = tuning.DEFAULT_SMS) -> ce.KernelConfig:
    """The config the op's config="auto" dispatch picks (no tuning memory) for M tokens."""
    from coda_ext.runtime import TunedOp

    return TunedOp(op.graph(), dtype, tune=False, major=op.major).config_for(*op.gemm(M), sms)


def _sms() -> int:
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_properties(0).multi_processor_count
    except Exception:  # noqa: BLE001 - no GPU: the H100 SXM's count
        pass
    return tuning.DEFAULT_SMS


def build_items(dtypes: tuple[str, ...] = DTYPES, ops: list[ReadyOp] | None = None) -> list:
    """(graph, dtype, config) of every kernel this script runs: each node-kind graph at the default
    config, and each ready op at the config "auto" picks for its shapes (the same for M = 4096 and 4000)."""
    items = {}
    for dtype in dtypes:
        for name in KIND_GRAPHS:
            g = kind_graph(name, dtype)
            items.setdefault(ce.kernel_source(g, dtype, CONFIG).source, (g, dtype, CONFIG))
        sms = _sms()
        for op in (selected_ops() if ops is None else ops):
            for M in OP_SHAPES.values():
                cfg = op_config(op, dtype, M, sms)
                g = op.graph()
                items.setdefault(ce.kernel_source(g, dtype, cfg).source, (g, dtype, cfg))
    return list(items.values())


# --- measuring ------------------------------------------------------------------------------------


def same_bits(a, b) -> bool:
    import torch

    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.contiguous().view(torch.uint8),
                                                                        b.contiguous().view(torch.uint8))


def measure_kind_graph(name: str, dtype: str, shape: tuple[int, int, int], seed: int = 0) -> tuple[list, dict]:
    """Rows {graph, output, dtype, shape, max_err, torch_err, ...} of one node-kind graph at one shape, and
    its determinism {repeat, orders}."""
    import torch

    make, extra = KIND_GRAPHS[name]
    case = make(dtype)
    g = kind_graph(name, dtype)
    M, N, K = shape
    op = ce.compile(g, dtype, CONFIG)
    A, W, inputs = fz.make_inputs(case, M, N, K, seed=seed, device="cuda")
    all_inputs = dict(inputs)
    gen = torch.Generator(device="cuda").manual_seed(seed + 1)
    if extra is not None:
        all_inputs["z"] = rand.randn(gen, M, 2 * N, dtype=fz.TORCH[dtype])
    got = op(A, W, out=nan_outputs(op, M, N), **all_inputs)
    again = op(A, W, out=nan_outputs(op, M, N), **all_inputs)
    torch.cuda.synchronize()
    determinism = {"repeat": all(same_bits(got[k], again[k]) for k in got), "orders": {}}
    del again
    for swizzle, raster in ORDERS:
        other = ce.compile(g, dtype, dataclasses.replace(CONFIG, swizzle=swizzle, raster=raster))
        res = other(A, W, out=nan_outputs(op, M, N), **all_inputs)
        determinism["orders"][f"swizzle={swizzle},{raster}"] = all(same_bits(got[k], res[k]) for k in got)
        del res
    rows, determinism["check_device"] = kind_rows(name, dtype, shape, A, W, inputs, all_inputs.get("z"), got)
    return rows, determinism


def kind_rows(name: str, dtype: str, shape: tuple[int, int, int], A, W, inputs: dict, z, got: dict) -> tuple[list, str]:
    """The rows of one node-kind graph's outputs `got` (on any device): errors against fuzz_strategies' fp64
    reference and PyTorch's in the dtype; and the fuzz tests' check_device verdict ("ok" or its first line)."""
    import torch

    make, extra = KIND_GRAPHS[name]
    case = make(dtype)
    M, N, K = shape
    rows = []
    ref = fz.reference(case, A, W, inputs)
    base = ce.interpret(case.build(), A, W, compute_dtype=fz.TORCH[dtype], **inputs)
    specs = case.outputs()
    try:   # the GPU fuzz tests' full check (exact outputs bit for bit, inf/NaN classes, the 2x rule)
        fz.check_device(case, {k: got[k] for k in specs}, ref, base, label=f"{name}/{dtype}/{M}x{N}x{K}")
        check = "ok"
    except AssertionError as e:
        check = str(e).splitlines()[0]
    for out_name, (_, out_dtype, _) in specs.items():
        r = ref[out_name]
        l64 = r.lanes[0]
        ok = ~torch.broadcast_to(r.fragile, l64.shape) & l64.isfinite()
        ok &= l64.abs() <= 0.99 * torch.finfo(fz.TORCH[out_dtype]).max
        for lane in r.lanes[1:]:
            ok &= lane.isfinite()
        rows.append(_row(name, out_name, dtype, shape, got[out_name], base[out_name], l64, ok))
    del ref, base
    if extra is not None:   # the pair tile: fp64 by hand (the interpreter rounds a pack to its dtype)
        acc = A.double() @ W.double().t()
        z64 = z.double()
        ref64 = torch.stack([acc * z64[:, 0::2], acc * z64[:, 1::2]], dim=-1).reshape(M, 2 * N)
        base = ce.interpret(add_pairs(ce.Graph()), A, W, compute_dtype=fz.TORCH[dtype], z=z)["pairs"]
        rows.append(_row(name, "pairs", dtype, shape, got["pairs"], base, ref64,
                         torch.ones_like(ref64, dtype=torch.bool)))
    return rows, check


def _row(graph: str, output: str, dtype: str, shape, got, base, ref64, ok) -> dict:
    n_ok = int(ok.sum())
    max_ref = ref64[ok].abs().max().item() if n_ok else math.nan
    row = {"graph": graph, "output": output, "label": LABELS.get(f"{graph}/{output}", output), "dtype": dtype,
           "shape": "x".join(map(str, shape)), "max_err": max_err(got, ref64, ok),
           "torch_err": max_err(base, ref64, ok),
           "max_ref": max_ref, "floor": floor(max_ref) if n_ok else math.nan, "checked": n_ok,
           "elements": ok.numel()}
    row["rule"] = rule_verdict(row)
    return row


def rule_verdict(row: dict) -> str:
    """The 2x rule (docs/design.md, tests/helpers/checks.py) on a row: "ok" if within it (or nothing was checked)."""
    if row["checked"] == 0:
        return "ok"
    if not math.isfinite(row["max_err"]):
        return "unwritten or non-finite elements"
    return "ok" if within_rule(row["max_err"], row["torch_err"], row["max_ref"]) else "over 2x PyTorch's error"


def ready_op_case(name: str, dtype: str, M: int, seed: int = 0, device: str = "cuda"):
    """(call, reference outputs, PyTorch-in-dtype outputs) of one ready op at M tokens (the call launches
    the op; the references are computed here, on `device`)."""
    import torch
    import torch.nn.functional as F

    from coda_ext import ops
    from coda_ext.ops import (
        linear_grad,
        lm_head_ce,
        norm_backward,
        qkv,
        residual_norm,
        rms_scale,
        swiglu,
        swiglu_backward,
    )

    gen = torch.Generator(device=device).manual_seed(seed + 1000 * M)
    dt = getattr(torch, dtype)
    d, f = D_MODEL, FFN
    def r(*s, scale=1.0):
        return rand.randn(gen, *s, dtype=dt, scale=scale)
    rstd = rand.positive(gen, M)
    if name == "linear_residual_norm":
        x, w, res, gamma = r(M, f), r(d, f, scale=f ** -0.5), r(M, d), r(d)
        out = F.linear(x, w) + res
        return (lambda: ops.linear_residual_norm(x, w, res, gamma, eps=EPS),
                residual_norm.reference(x, w, res, gamma, EPS),
                (out, out * gamma, torch.rsqrt(out.pow(2).mean(-1) + EPS)))
    if name == "rms_linear":
        x, w = r(M, d), r(f, d, scale=d ** -0.5)
        return (lambda: (ops.rms_linear(x, w, rstd, activation="silu"),),
                (rms_scale.reference(x, w, rstd, "silu"),), (F.silu(F.linear(x, w) * rstd.to(dt)[:, None]),))
    if name == "linear_swiglu_train":
        x, w = r(M, d), r(2 * f, d, scale=d ** -0.5)
        z = F.linear(x, w) * rstd.to(dt)[:, None]
        return (lambda: ops.linear_swiglu_train(x, w, rstd), swiglu.reference(x, w, rstd),
                (F.silu(z[:, 0::2]) * z[:, 1::2], z))
    if name == "qkv_rope":
        x, w = r(M, d), r((N_HEADS + 2 * N_KV_HEADS) * HEAD_DIM, d, scale=d ** -0.5)
        pos = rand.indices(gen, M, high=100_000)
        q_w, k_w = r(HEAD_DIM), r(HEAD_DIM)
        freqs = ops.rope_frequencies(HEAD_DIM, N_HEADS, N_KV_HEADS, theta=THETA, device=device)
        ref = qkv.reference(x, w, pos, N_HEADS, N_KV_HEADS, theta=THETA, rstd=rstd, q_norm_weight=q_w,
                            k_norm_weight=k_w, eps=EPS)
        return (lambda: (ops.qkv_rope(x, w, pos, freqs, N_HEADS, N_KV_HEADS, rstd=rstd, q_norm_weight=q_w,
                                      k_norm_weight=k_w, eps=EPS),),
                (ref,), (references.qkv_in_dtype(F.linear(x, w), pos, N_HEADS, N_KV_HEADS, THETA, rstd=rstd,
                                                 q_norm_weight=q_w, k_norm_weight=k_w, eps=EPS),))
    if name == "lm_head_cross_entropy":
        x, w = r(M, d, scale=2.0), r(VOCAB, d, scale=d ** -0.5)
        target = rand.targets(gen, M, vocab=VOCAB)
        logits = F.linear(x, w) * rstd.to(dt)[:, None]
        base = (F.cross_entropy(logits, target, reduction="none"), torch.logsumexp(logits, -1))
        del logits
        return (lambda: ops.lm_head_cross_entropy(x, w, target, rstd, reduction="none"),
                lm_head_ce.reference(x, w, target, rstd, reduction="none"), base)
    if name == "rms_norm_backward_linear":
        dz, w, x = r(M, 2 * f), r(2 * f, d, scale=(2 * f) ** -0.5), r(M, d)
        gamma, zdz, dx_in = r(d), rand.randn(gen, M, scale=10.0), r(M, d)
        acc = dz @ w
        rr = rstd.to(dt)[:, None]
        xhat = x * rr
        dx = (acc * gamma - xhat * (zdz.to(dt)[:, None] / d)) * rr + dx_in
        return (lambda: ops.rms_norm_backward_linear(dz, w, x, rstd, gamma, zdz, dx_in=dx_in),
                norm_backward.reference(dz, w, x, rstd, gamma, zdz, dx_in), (dx, xhat * gamma, (acc * xhat).sum(0)))
    if name == "swiglu_backward_linear":
        dy, w, z = r(M, d), r(d, f, scale=f ** -0.5), r(M, 2 * f)
        acc = dy @ w
        g, u = z[:, 0::2], z[:, 1::2]
        sig = torch.sigmoid(g)
        dg, du = acc * u * sig * (1 + g * (1 - sig)), acc * F.silu(g)
        return (lambda: ops.swiglu_backward_linear(dy, w, z), swiglu_backward.reference(dy, w, z),
                (torch.stack([dg, du], -1).flatten(-2), F.silu(g) * u, (g * dg + u * du).sum(-1)))
    if name == "linear_dx":
        dz, w = r(M, d), r(d, f, scale=f ** -0.5)
        return (lambda: (ops.linear_dx(dz, w),), (linear_grad.reference_linear_dx(dz, w),), (dz @ w,))
    if name == "weight_grad":
        dz, x = r(M, d, scale=0.3), r(M, f)
        return (lambda: (ops.weight_grad(dz, x),), (linear_grad.reference_weight_grad(dz, x),), (dz.t() @ x,))
    raise KeyError(name)


def measure_ready_op(op: ReadyOp, dtype: str, M: int, shape_name: str) -> tuple[list, dict]:
    import torch

    call, ref, base = ready_op_case(op.name, dtype, M)
    expected = op_config(op, dtype, M, _sms()).tag
    got = call()
    again = call()
    torch.cuda.synchronize()
    got = got if isinstance(got, tuple) else (got,)
    again = again if isinstance(again, tuple) else (again,)
    rows = []
    for out_name, g, r, b in zip(op.outputs, got, ref, base):
        ok = r.isfinite()
        row = _row(op.name, out_name, dtype, (M,) + op.gemm(M)[1:], g, b, r, ok)
        row.update(shape=shape_name, gemm="x".join(map(str, op.gemm(M))), expected_config=expected,
                   config=dispatched_config(op, dtype, M) or expected, reference="fp32 (the op module's)")
        rows.append(row)
    return rows, {"repeat": all(same_bits(a, b) for a, b in zip(got, again))}


# --- formatting ---------------------------------------------------------------------------------------


def _fmt(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return "0" if x == 0 else f"{x:.1e}"


def _cell(row: dict | None) -> str:
    if row is None:
        return "-"
    mark = "" if row.get("rule", "ok") == "ok" else " (!)"
    return f"{_fmt(row['max_err'])} / {_fmt(row['torch_err'])}{mark}"


def format_tables(result: dict) -> str:
    """The markdown tables of a result dict (as written to the JSON): node kinds, ready ops, determinism."""
    lines = []
    kinds, ops_rows = result.get("kinds", []), result.get("ops", [])
    det = {d["kernel"]: d for d in result.get("determinism", [])}
    for title, rows, key in (("node kind", kinds, "label"), ("ready op output", ops_rows, "label")):
        if not rows:
            continue
        columns = []
        for r in rows:
            c = (r["dtype"], r["shape"])
            if c not in columns:
                columns.append(c)
        order, cells = [], {}
        for r in rows:
            k = (r["graph"], r["output"])
            if k not in cells:
                order.append(k)
                cells[k] = {"label": r[key] if title == "node kind" else f"{r['graph']} {r['output']}"}
            cells[k][(r["dtype"], r["shape"])] = r
        short = {"bfloat16": "bf16", "float16": "fp16"}
        head = " | ".join(f"{short.get(d, d)} {s}" for d, s in columns)
        lines.append(f"| {title} | {head} | bits repeat |")
        lines.append("|---" * (len(columns) + 2) + "|")
        for k in order:
            c = cells[k]
            bits = []
            for d in dict.fromkeys(dt for dt, _ in columns):
                entry = det.get(f"{k[0]} {d}")
                bits.append("-" if entry is None else ("yes" if entry["identical"] else "NO"))
            body = " | ".join(_cell(c.get(col)) for col in columns)
            label = c["label"].replace("|", "\\|")
            lines.append(f"| {label} | {body} | {' / '.join(bits)} |")
        lines.append("")
    if lines:
        lines.insert(0, "Cells: coda_ext max abs error / PyTorch-in-dtype max abs error, against fp64 (ready ops: "
                        "their fp32 reference); (!) marks a cell over the 2x rule of docs/design.md. bits repeat: "
                        "every launch of the kernel gave the same bits (per dtype).\n")
    return "\n".join(lines)


def summarize_determinism(det: dict[tuple[str, str], list[dict]]) -> list[dict]:
    """[{kernel: "<graph> <dtype>", identical, repeat, orders}] from per-shape determinism records."""
    out = []
    for (graph, dtype), records in det.items():
        repeat = all(r.get("repeat", False) for r in records)
        orders: dict[str, bool] = {}
        for r in records:
            for k, v in r.get("orders", {}).items():
                orders[k] = orders.get(k, True) and v
        checks = [r["check_device"] for r in records if r.get("check_device", "ok") != "ok"]
        out.append({"kernel": f"{graph} {dtype}", "repeat": repeat, "orders": orders,
                    "identical": repeat and all(orders.values()), "check_device": checks or "ok"})
    return out


# --- the run ----------------------------------------------------------------------------------------


def run(args) -> dict:
    import torch

    from coda_ext.jit.binding import load_binding
    from coda_ext.runtime import prebuild

    dtypes = tuple(args.dtypes)
    ops_list = selected_ops(args.ops)
    kind_shapes = QUICK_KIND_SHAPES if args.quick else KIND_SHAPES
    op_shapes = QUICK_OP_SHAPES if args.quick else OP_SHAPES
    start = time.monotonic()
    result: dict[str, Any] = {"environment": common.gpu_info(), "config": CONFIG.tag,
                              "kind_shapes": kind_shapes, "op_shapes": op_shapes, "kinds": [], "ops": [],
                              "determinism": [], "failures": []}
    not_built = set()   # kernel sources nvcc failed on: their graph or op is skipped, the rest measured
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1)) as pool:
        binding = pool.submit(load_binding)
        builds = [(item, pool.submit(prebuild, [item], 1)) for item in build_items(dtypes, ops_list)]
        for (g, dtype, cfg), fut in builds:   # cache hits when prebuilt
            try:
                fut.result()
            except Exception as e:  # noqa: BLE001 - recorded, the rest goes on
                not_built.add(ce.kernel_source(g, dtype, cfg).source)
                result["failures"].append(f"not built: {dtype} {cfg.tag}: {type(e).__name__}: {e}"[:500])
        binding.result()
    det: dict[tuple[str, str], list[dict]] = {}
    for dtype in dtypes:
        for name in KIND_GRAPHS:
            if ce.kernel_source(kind_graph(name, dtype), dtype, CONFIG).source in not_built:
                continue
            for shape_name, shape in kind_shapes.items():
                try:
                    rows, d = measure_kind_graph(name, dtype, shape)
                except Exception as e:  # noqa: BLE001 - recorded, the rest goes on
                    traceback.print_exc()
                    result["failures"].append(f"{name} {dtype} {shape_name}: {type(e).__name__}: {e}"[:500])
                    continue
                finally:
                    torch.cuda.empty_cache()
                for row in rows:
                    row["shape"] = shape_name
                result["kinds"] += rows
                det.setdefault((name, dtype), []).append(d)
                print(f"[numerics] {name} {dtype} {shape_name}: {len(rows)} outputs "
                      f"({time.monotonic() - start:.0f} s)", flush=True)
        for op in ops_list:
            if {ce.kernel_source(op.graph(), dtype, op_config(op, dtype, M, _sms())).source
                    for M in op_shapes.values()} & not_built:
                continue
            for shape_name, M in op_shapes.items():
                try:
                    rows, d = measure_ready_op(op, dtype, M, shape_name)
                except Exception as e:  # noqa: BLE001 - recorded, the rest goes on
                    traceback.print_exc()
                    result["failures"].append(f"{op.name} {dtype} {shape_name}: {type(e).__name__}: {e}"[:500])
                    continue
                finally:
                    torch.cuda.empty_cache()
                result["ops"] += rows
                det.setdefault((op.name, dtype), []).append(d)
                print(f"[numerics] {op.name} {dtype} {shape_name} ({time.monotonic() - start:.0f} s)", flush=True)
    result["determinism"] = summarize_determinism(det)
    result["seconds"] = round(time.monotonic() - start, 1)
    return result


def _jsonable(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the ragged shapes only")
    parser.add_argument("--ops", nargs="*", default=None, help=f"ready ops (default all: {', '.join(READY_OPS)})")
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES))
    parser.add_argument("--out", default=None, help="results JSON (default: numerics_<gpu>.json in "
                        "benchmarks/results/, <gpu> the GPU it runs on: h100, h200, …)")
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = common.results_path("numerics")
    result = run(args)
    path = common.write_json(args.out, _jsonable(result))
    print(format_tables(result))
    not_identical = [d["kernel"] for d in result["determinism"] if not d["identical"]]
    checks = [f"{d['kernel']}: {d['check_device']}" for d in result["determinism"]
              if d.get("check_device", "ok") != "ok"]
    over = [f"{r['graph']}/{r['output']} {r['dtype']} {r['shape']}" for r in result["kinds"] + result["ops"]
            if r.get("rule", "ok") != "ok"]
    print(f"numerics: {len(result['kinds'])} node-kind rows, {len(result['ops'])} ready-op rows in "
          f"{result['seconds']} s; not bit-identical: {not_identical or 'none'}; over the 2x rule: {over or 'none'}; "
          f"fuzz check_device: {checks or 'ok'}; "
          f"failures: {result['failures'] or 'none'}; wrote {_shown_path(path)}")
    return 1 if result["failures"] else 0


def _shown_path(path) -> str:
    """path relative to the checkout where it lies inside it (what the printed table records)."""
    p = pathlib.Path(path).resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(path)


if __name__ == "__main__":
    sys.exit(main())
