"""The bad-input matrix of a compiled op: each case takes a valid call and breaks one argument,
and says which error it must raise and what the message must say (the argument and the fix).

Shared by tests/unit/test_bad_inputs.py (on CPU tensors, through the real argument checks) and
tests/gpu/test_bad_inputs_gpu.py (a compiled op on an SM90 GPU).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

import coda_ext as ce
from tests.helpers import rand


def main_graph() -> ce.Graph:
    """Every kind of runtime argument and output: tiles (op dtype, fp32), vectors (op dtype, fp32,
    int32), runtime and pointer scalars; D, stores (op dtype, fp32), a pair store, reductions."""
    g = ce.Graph()
    acc = g.accumulator()
    bias = g.row_vector("bias")
    y = (acc * g.scalar("alpha") + bias) * g.col_vector("rstd", "float32") * g.scalar("scale", pointer=True)
    y = y + g.tile("res") + g.tile("res32", "float32") + g.col_vector("target", "int32")
    g.output(y)
    g.store("pre", acc + bias)
    g.store("pre32", acc, dtype="float32")
    g.store("half", ce.swiglu_pairs(y))
    g.row_reduce("rsum", y)
    g.col_reduce("cmax", y, "max")
    return g


def segment_graph() -> ce.Graph:
    g = ce.Graph()
    g.output(ce.segment_reduce(g.accumulator(), 32, "sum"))
    return g


def pairs_only_graph() -> ce.Graph:
    """No main output: N need not suit a TMA store of D, only be even."""
    g = ce.Graph()
    g.store("half", ce.swiglu_pairs(g.accumulator()))
    return g


GRAPHS = {"main": main_graph, "segment": segment_graph, "pairs": pairs_only_graph}


@dataclasses.dataclass
class Call:
    """The arguments of one call: op(A, W, out=out, **inputs)."""

    A: Any
    W: Any
    inputs: dict
    out: dict


def good_call(graph: str, M: int, N: int, K: int, dtype: torch.dtype, device: Any, seed: int = 0) -> Call:
    gen = torch.Generator(device=device).manual_seed(seed)
    A, W = rand.operands(gen, M, N, K, dtype)
    if graph != "main":
        return Call(A, W, {}, {})
    inputs = dict(bias=rand.randn(gen, N, dtype=dtype), rstd=rand.positive(gen, M),
                  res=rand.randn(gen, M, N, dtype=dtype), res32=rand.randn(gen, M, N),
                  target=rand.indices(gen, M, high=N, dtype=torch.int32), alpha=rand.scalar(gen),
                  scale=rand.positive(gen, 1))
    return Call(A, W, inputs, {})


def misaligned(t: torch.Tensor) -> torch.Tensor:
    """The same shape and values one element past a 16-byte boundary."""
    buf = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    view = buf[1:].view(t.shape)
    view.copy_(t)
    return view


def padded(t: torch.Tensor, pad: int) -> torch.Tensor:
    """The same (M, N) values in rows of N + pad elements."""
    buf = torch.zeros(t.shape[0], t.shape[1] + pad, dtype=t.dtype, device=t.device)
    buf[:, : t.shape[1]] = t
    return buf[:, : t.shape[1]]


def transposed(t: torch.Tensor) -> torch.Tensor:
    return t.t().contiguous().t()


def every_other_column(t: torch.Tensor) -> torch.Tensor:
    return torch.repeat_interleave(t, 2, dim=-1)[..., ::2]


@dataclasses.dataclass(frozen=True)
class Bad:
    id: str
    graph: str                           # which of GRAPHS
    shape: tuple[int, int, int]          # M, N, K of the valid call it breaks
    edit: Callable[[Call, Any], None]    # (call, other_device) -> None, edits the call in place
    error: type
    message: str                         # a regex the message must match: the argument and the fix


def _set(where: str, name: str, value: Callable[[Call], Any]):
    def edit(c: Call, other: Any) -> None:
        getattr(c, where)[name] = value(c)
    return edit


def _input(name, value):
    return _set("inputs", name, value)


def _out(name, value):
    return _set("out", name, value)


def _attr(name, value):
    def edit(c: Call, other: Any) -> None:
        setattr(c, name, value(c))
    return edit


def _drop(name):
    def edit(c: Call, other: Any) -> None:
        del c.inputs[name]
    return edit


def _elsewhere(where: str, name: str):
    """Moves one argument to the other device."""
    def edit(c: Call, other: Any) -> None:
        if where in ("A", "W"):
            setattr(c, where, getattr(c, where).to(other))
        else:
            getattr(c, where)[name] = getattr(c, where)[name].to(other)
    return edit


MNK = (37, 72, 64)   # M not a tile multiple; N, K multiples of 8
D = (37, 72)
BF = torch.bfloat16

CASES = [
    # --- A and W ---------------------------------------------------------------------------------
    Bad("A list", "main", MNK, _attr("A", lambda c: c.A.tolist()), TypeError,
        r"A and W must be torch.Tensors, got list"),
    Bad("W ndarray", "main", MNK, _attr("W", lambda c: c.W.float().cpu().numpy()), TypeError,
        r"A and W must be torch.Tensors, got Tensor and ndarray"),
    Bad("A 1-D", "main", MNK, _attr("A", lambda c: c.A[0]), ValueError, r"A must be 2-D"),
    Bad("W 3-D", "main", MNK, _attr("W", lambda c: c.W[None]), ValueError, r"W must be 2-D"),
    Bad("A fp32", "main", MNK, _attr("A", lambda c: c.A.float()), TypeError,
        r"A has dtype torch.float32, expected torch.bfloat16; convert it with \.to"),
    Bad("W fp16", "main", MNK, _attr("W", lambda c: c.W.half()), TypeError, r"W has dtype torch.float16.*\.to"),
    Bad("K mismatch", "main", MNK, _attr("W", lambda c: c.W[:, :56].contiguous()), ValueError,
        r"W must be \(N, K\) with the same K"),
    Bad("M = 0", "main", MNK, _attr("A", lambda c: c.A[:0]), ValueError, r"M=0.*at least 1"),
    Bad("N = 0", "main", MNK, _attr("W", lambda c: c.W[:0]), ValueError, r"N=0.*at least 1"),
    Bad("K = 0", "main", MNK, lambda c, o: (setattr(c, "A", c.A[:, :0]), setattr(c, "W", c.W[:, :0])), ValueError,
        r"K=0.*at least 1"),
    Bad("huge M", "main", MNK, _attr("A", lambda c: c.A[:1].expand(2 ** 31, c.A.shape[1])), ValueError,
        r"must be < 2\*\*31"),
    Bad("A transposed", "main", MNK, _attr("A", lambda c: transposed(c.A)), ValueError,
        r"A must have a contiguous last dimension.*\.contiguous\(\)"),
    Bad("W transposed", "main", MNK, _attr("W", lambda c: transposed(c.W)), ValueError,
        r"W must have a contiguous last"),
    Bad("A every other column", "main", MNK, _attr("A", lambda c: every_other_column(c.A)), ValueError,
        r"A must have a contiguous last dimension"),
    Bad("A misaligned", "main", MNK, _attr("A", lambda c: misaligned(c.A)), ValueError,
        r"A's data pointer is not 16-byte aligned"),
    Bad("W rows unaligned", "main", MNK, _attr("W", lambda c: padded(c.W, 3)), ValueError,
        r"W's rows are 134 bytes apart; they must be a multiple of 16 bytes"),
    Bad("K not a multiple of 8", "main", (37, 72, 60), lambda c, o: None, ValueError, r"A's rows are 120 bytes apart"),
    Bad("A overlapping rows", "main", MNK, _attr("A", lambda c: c.A[:1].expand(*c.A.shape)), ValueError,
        r"A has row stride 0 < 64 columns \(overlapping rows\); call \.contiguous\(\)"),
    Bad("N not a multiple of 8", "main", (37, 68, 64), lambda c, o: None, ValueError,
        r"N = 68 .*must be a multiple of 8"),
    Bad("W elsewhere", "main", MNK, _elsewhere("W", None), ValueError, r"W is on .*; move it with \.to"),
    # --- named inputs ------------------------------------------------------------------------------
    Bad("missing input", "main", MNK, _drop("res"), TypeError, r"missing input\(s\) \['res'\]; this op takes"),
    Bad("missing scalar", "main", MNK, _drop("alpha"), TypeError, r"missing input\(s\) \['alpha'\]"),
    Bad("unknown input", "main", MNK, _input("bogus", lambda c: 1.0), TypeError,
        r"unexpected input\(s\) \['bogus'\]; this op takes"),
    Bad("misspelt input", "main", MNK,
        lambda c, o: c.inputs.__setitem__("Bias", c.inputs.pop("bias")), TypeError, r"\['bias'\]"),
    Bad("tile list", "main", MNK, _input("res", lambda c: c.inputs["res"].tolist()), TypeError,
        r"res must be a torch.Tensor, got list"),
    Bad("tile fp16", "main", MNK, _input("res", lambda c: c.inputs["res"].half()), TypeError,
        r"res has dtype torch.float16, expected torch.bfloat16; convert it with \.to"),
    Bad("fp32 tile given bf16", "main", MNK, _input("res32", lambda c: c.inputs["res32"].to(BF)), TypeError,
        r"res32 has dtype torch.bfloat16, expected torch.float32"),
    Bad("tile too wide", "main", MNK, _input("res", lambda c: torch.zeros(37, 80, dtype=BF, device=c.A.device)),
        ValueError, r"res must have shape \(37, 72\), got \(37, 80\)"),
    Bad("tile too short", "main", MNK, _input("res", lambda c: c.inputs["res"][:36]), ValueError,
        r"res must have shape \(37, 72\)"),
    Bad("tile flat", "main", MNK, _input("res", lambda c: c.inputs["res"].reshape(-1)), ValueError,
        r"res must have 2 dimension\(s\)"),
    Bad("tile transposed", "main", MNK, _input("res", lambda c: transposed(c.inputs["res"])), ValueError,
        r"res must have a contiguous last dimension"),
    Bad("tile every other column", "main", MNK, _input("res", lambda c: every_other_column(c.inputs["res"])),
        ValueError, r"res must have a contiguous last dimension"),
    Bad("tile misaligned", "main", MNK, _input("res", lambda c: misaligned(c.inputs["res"])), ValueError,
        r"res's data pointer is not 16-byte aligned; pass a fresh or \.clone\(\)d tensor"),
    Bad("tile rows unaligned", "main", MNK, _input("res", lambda c: padded(c.inputs["res"], 3)), ValueError,
        r"res's rows are 150 bytes apart; .*pad the last dimension to a multiple of 8"),
    Bad("fp32 tile rows unaligned", "main", MNK, _input("res32", lambda c: padded(c.inputs["res32"], 2)), ValueError,
        r"res32's rows are 296 bytes apart; .*multiple of 4"),
    Bad("tile broadcast rows", "main", MNK, _input("res", lambda c: c.inputs["res"][:1].expand(37, 72)), ValueError,
        r"res has row stride 0 < 72 columns"),
    Bad("tile elsewhere", "main", MNK, _elsewhere("inputs", "res"), ValueError, r"res is on .*move it with \.to"),
    Bad("row vector too long", "main", MNK, _input("bias", lambda c: torch.zeros(80, dtype=BF, device=c.A.device)),
        ValueError, r"bias must have shape \(72,\), got \(80,\)"),
    Bad("row vector 2-D", "main", MNK, _input("bias", lambda c: c.inputs["bias"][None]), ValueError,
        r"bias must have 1 dimension\(s\) \(72,\)"),
    Bad("row vector fp32", "main", MNK, _input("bias", lambda c: c.inputs["bias"].float()), TypeError,
        r"bias has dtype torch.float32, expected torch.bfloat16"),
    Bad("row vector strided", "main", MNK, _input("bias", lambda c: every_other_column(c.inputs["bias"])), ValueError,
        r"bias must have a contiguous last dimension"),
    Bad("row vector misaligned", "main", MNK, _input("bias", lambda c: misaligned(c.inputs["bias"])), ValueError,
        r"bias's data pointer is not 16-byte aligned"),
    Bad("row vector elsewhere", "main", MNK, _elsewhere("inputs", "bias"), ValueError, r"bias is on "),
    Bad("col vector length N", "main", MNK, _input("rstd", lambda c: torch.ones(72, device=c.A.device)), ValueError,
        r"rstd must have shape \(37,\), got \(72,\)"),
    Bad("col vector bf16", "main", MNK, _input("rstd", lambda c: c.inputs["rstd"].to(BF)), TypeError,
        r"rstd has dtype torch.bfloat16, expected torch.float32"),
    Bad("int32 vector given int64", "main", MNK, _input("target", lambda c: c.inputs["target"].long()), TypeError,
        r"target has dtype torch.int64, expected torch.int32"),
    Bad("int32 vector given floats", "main", MNK, _input("target", lambda c: c.inputs["target"].float()), TypeError,
        r"target has dtype torch.float32, expected torch.int32"),
    Bad("col vector misaligned", "main", MNK, _input("rstd", lambda c: misaligned(c.inputs["rstd"])), ValueError,
        r"rstd's data pointer is not 16-byte aligned"),
    Bad("scalar given a tensor", "main", MNK, _input("alpha", lambda c: torch.tensor(0.5)), TypeError,
        r"alpha is a runtime scalar and must be a Python int or float, got Tensor"),
    Bad("scalar given a bool", "main", MNK, _input("alpha", lambda c: True), TypeError,
        r"alpha is a runtime scalar .* got bool"),
    Bad("scalar given a str", "main", MNK, _input("alpha", lambda c: "0.5"), TypeError, r"alpha .* got str"),
    Bad("scalar given None", "main", MNK, _input("alpha", lambda c: None), TypeError, r"alpha .* got NoneType"),
    Bad("pointer given a float", "main", MNK, _input("scale", lambda c: 0.5), TypeError,
        r"scale is a device-pointer scalar and must be a one-element torch.Tensor, got float"),
    Bad("pointer fp64", "main", MNK, _input("scale", lambda c: c.inputs["scale"].double()), TypeError,
        r"scale must be a one-element float32 tensor, got torch.float64"),
    Bad("pointer two elements", "main", MNK, _input("scale", lambda c: c.inputs["scale"].repeat(2)), TypeError,
        r"scale must be a one-element float32 tensor, got torch.float32 with 2 elements"),
    Bad("pointer elsewhere", "main", MNK, _elsewhere("inputs", "scale"), ValueError, r"scale is on .*; it must be on"),
    # --- out= ---------------------------------------------------------------------------------------
    Bad("out unknown name", "main", MNK, _out("bogus", lambda c: torch.empty(1)), TypeError,
        r"out= names unknown output\(s\) \['bogus'\]; outputs are"),
    Bad("out D wrong shape", "main", MNK, _out("out", lambda c: torch.empty(37, 80, dtype=BF, device=c.A.device)),
        ValueError, r"out\['out'\] must have shape \(37, 72\)"),
    Bad("out D fp32", "main", MNK, _out("out", lambda c: torch.empty(D, device=c.A.device)), TypeError,
        r"out\['out'\] has dtype torch.float32, expected torch.bfloat16"),
    Bad("out D transposed", "main", MNK, _out("out", lambda c: torch.empty(72, 37, dtype=BF, device=c.A.device).t()),
        ValueError, r"out\['out'\] must have a contiguous last dimension"),
    Bad("out D misaligned", "main", MNK, _out("out", lambda c: misaligned(torch.empty(D, dtype=BF, device=c.A.device))),
        ValueError, r"out\['out'\]'s data pointer is not 16-byte aligned"),
    Bad("out D rows unaligned", "main", MNK,
        _out("out", lambda c: padded(torch.empty(D, dtype=BF, device=c.A.device), 3)), ValueError,
        r"out\['out'\]'s rows are 150 bytes apart"),
    Bad("out store dtype", "main", MNK, _out("pre32", lambda c: torch.empty(D, dtype=BF, device=c.A.device)), TypeError,
        r"out\['pre32'\] has dtype torch.bfloat16, expected torch.float32"),
    Bad("out pair store full width", "main", MNK, _out("half", lambda c: torch.empty(D, dtype=BF, device=c.A.device)),
        ValueError, r"out\['half'\] must have shape \(37, 36\)"),
    Bad("out row reduction bf16", "main", MNK, _out("rsum", lambda c: torch.empty(37, dtype=BF, device=c.A.device)),
        TypeError, r"out\['rsum'\] has dtype torch.bfloat16, expected torch.float32"),
    Bad("out col reduction length M", "main", MNK, _out("cmax", lambda c: torch.empty(37, device=c.A.device)),
        ValueError, r"out\['cmax'\] must have shape \(72,\)"),
    Bad("out list", "main", MNK, _out("out", lambda c: [[0.0]]), TypeError, r"out\['out'\] must be a torch.Tensor"),
    Bad("out elsewhere", "main", MNK, lambda c, o: c.out.__setitem__("out", torch.empty(D, dtype=BF, device=o)),
        ValueError, r"out\['out'\] is on "),
    Bad("out aliases a tile", "main", MNK, _out("pre", lambda c: c.inputs["res"]), ValueError,
        r"output 'pre' overlaps 'res' in memory; give every output its own tensor"),
    Bad("out aliases A", "main", (37, 64, 64), _out("out", lambda c: c.A), ValueError, r"output 'out' overlaps 'A'"),
    Bad("out aliases W", "main", (64, 72, 72), _out("out", lambda c: c.W[:64]), ValueError,
        r"output 'out' overlaps 'W'"),
    Bad("outs alias each other", "main", MNK,
        lambda c, o: c.out.update(out=(t := torch.empty(D, dtype=BF, device=c.A.device)), pre=t), ValueError,
        r"output '(out|pre)' overlaps '(out|pre)'"),
    Bad("out overlaps a vector", "main", MNK,
        lambda c, o: c.out.__setitem__("rsum", c.inputs["rstd"]), ValueError, r"output 'rsum' overlaps 'rstd'"),
    # --- what a graph asks of N ----------------------------------------------------------------------
    Bad("segments need N % 32", "segment", (37, 72, 64), lambda c, o: None, ValueError,
        r"segments of 32 columns, so N = 72 .*must be a multiple of 32"),
    Bad("pairs need an even N", "pairs", (37, 35, 64), lambda c, o: None, ValueError, r"N = 35 .*must be even"),
]

#: Calls that must pass every check (the matrix's controls).
GOOD = [
    ("valid", "main", MNK, lambda c, o: None),
    ("A with padded rows", "main", MNK, _attr("A", lambda c: padded(c.A, 8))),
    ("tile with padded rows", "main", MNK, _input("res", lambda c: padded(c.inputs["res"], 8))),
    ("pair store with odd padding", "main", MNK, _out("half", lambda c: padded(torch.empty(37, 36, dtype=BF,
                                                                                          device=c.A.device), 3))),
    ("int scalar", "main", MNK, _input("alpha", lambda c: 2)),
    ("every output given", "main", MNK, lambda c, o: c.out.update(
        out=torch.empty(D, dtype=BF, device=c.A.device), pre=torch.empty(D, dtype=BF, device=c.A.device),
        pre32=torch.empty(D, device=c.A.device), half=torch.empty(37, 36, dtype=BF, device=c.A.device),
        rsum=torch.empty(37, device=c.A.device), cmax=torch.empty(72, device=c.A.device))),
    ("segments", "segment", (37, 96, 64), lambda c, o: None),
    ("pairs without D: N % 8 != 0", "pairs", (37, 36, 64), lambda c, o: None),
]

#: Cases whose message is wrong today on the plain call path (no out=), each a strict xfail there:
#: drop the entry once it passes.
KNOWN_PLAIN: dict[str, str] = {}
