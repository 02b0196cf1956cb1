"""The two torch custom ops the fusion compiler writes into FX graphs.

coda_ext::fusion_gemm(a, w, major)    A @ Wᵀ with A (M, K) and W (N, K) read from the stored tensors a
                                      and w in the operand layout `major` (coda_ext.config.MAJORS): the
                                      form every GEMM takes once transposes are folded into layouts.
coda_ext::fusion_kernel(spec, tensors) one fused GEMM + epilogue. `spec` is a self-contained JSON text
                                      (the canonical coda_ext graph, the GEMM dtype and layout, the role
                                      of each tensor and the shape and dtype of each result), so a graph
                                      that holds the call needs nothing registered elsewhere; `tensors` are
                                      [a, w, *inputs]. On CUDA it runs coda_ext.compile(graph, dtype,
                                      config="auto", major=...); elsewhere (and with execute="interpret")
                                      the reference interpreter of the same graph.

Both have fake implementations (shapes and dtypes from their arguments or the spec), so they trace
under AOTAutograd, Dynamo and Inductor (as extern kernels) like any ATen op.
"""
from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any

import torch

from ..config import MAJORS
from ..graph import interpret, ir
from ..graph.canonical import as_ir
from ..runtime import checks

SPEC_VERSION = 1
#: Roles of a kernel's tensor inputs: an (M, N) tile, a length-N row vector, a length-M column
#: vector, a one-element scalar.
ROLES = ("tile", "row", "col", "scalar")
#: the profiler range around each fused kernel launch: PROFILE_PREFIX + graph digest + M x N x K
PROFILE_PREFIX = "coda_fusion:"
EXECUTE = ("auto", "interpret")


def operands(a: torch.Tensor, w: torch.Tensor, major: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A (M, K) and W (N, K) as views of the stored a and w: major[0] 'k' takes a as stored, 'm' its
    transpose; major[1] 'k' takes w as stored, 'n' its transpose."""
    if major not in MAJORS:
        raise ValueError(f"coda_ext fusion: major must be one of {MAJORS}, got {major!r}")
    return (a if major[0] == "k" else a.t()), (w if major[1] == "k" else w.t())


@torch.library.custom_op("coda_ext::fusion_gemm", mutates_args=())
def fusion_gemm(a: torch.Tensor, w: torch.Tensor, major: str) -> torch.Tensor:
    A, W = operands(a, w, major)
    return A @ W.t()


@fusion_gemm.register_fake
def _fusion_gemm_fake(a: torch.Tensor, w: torch.Tensor, major: str) -> torch.Tensor:
    A, W = operands(a, w, major)
    return A.new_empty((A.shape[0], W.shape[0]))


@dataclasses.dataclass(frozen=True)
class Output:
    name: str                 # the graph output it comes from (several results may share one)
    shape: tuple[int, ...]    # the FX node's shape
    dtype: torch.dtype        # the FX node's dtype


@dataclasses.dataclass(frozen=True)
class Site:
    """One fused kernel call: what the spec text of fusion_kernel holds."""

    graph: ir.GraphIR
    dtype: str
    major: str
    inputs: tuple[tuple[str, str], ...]     # (graph input name, role), in the order of the tensors after a, w
    outputs: tuple[Output, ...]
    execute: str = "auto"

    def spec(self) -> str:
        return json.dumps({
            "v": SPEC_VERSION,
            "graph": [[n.kind, list(n.inputs), [list(a) for a in n.attrs]] for n in self.graph.nodes],
            "dtype": self.dtype, "major": self.major, "execute": self.execute,
            "inputs": [list(i) for i in self.inputs],
            "outputs": [[o.name, list(o.shape), str(o.dtype).replace("torch.", "")] for o in self.outputs],
        }, separators=(",", ":"))

    @property
    def kernel_key(self) -> tuple[str, str, str]:
        """Identical graphs at the same dtype and layout share one kernel."""
        return self.graph.digest(), self.dtype, self.major


@functools.cache
def load_site(spec: str) -> Site:
    d = json.loads(spec)
    if d.get("v") != SPEC_VERSION:
        raise ValueError(f"coda_ext::fusion_kernel: spec version {d.get('v')!r}, this coda_ext reads {SPEC_VERSION}")
    nodes = tuple(ir.Node(k, tuple(i), tuple((a, v) for a, v in attrs)) for k, i, attrs in d["graph"])
    return Site(as_ir(ir.GraphIR(nodes)), d["dtype"], d["major"], tuple(tuple(i) for i in d["inputs"]),
                tuple(Output(n, tuple(s), getattr(torch, t)) for n, s, t in d["outputs"]), d["execute"])


def _prepare(t: torch.Tensor, role: str, M: int, N: int) -> torch.Tensor:
    """An input in the shape the graph takes it: (M, N), (N,), (M,) or a one-element fp32 tensor."""
    if role == "scalar":
        return t.reshape(1).to(torch.float32)
    shape = (M, N) if role == "tile" else (N,) if role == "row" else (M,)
    out = t if t.shape == shape else t.reshape(shape)   # (a reshape per input per call costs host time)
    if role != "tile" and out.dtype == torch.bool:
        out = out.to(torch.float32)
    return out.contiguous()


_COMPILED: dict[int, tuple[Site, Any]] = {}


def _compiled(site: Site) -> Any:
    """The config="auto" op of a site's graph, found by the site object (load_site keeps one Site per spec
    text, so no graph is hashed per call; the entry holds its site, so an id is never reused)."""
    entry = _COMPILED.get(id(site))
    if entry is None or entry[0] is not site:
        from ..runtime import compile as compile_graph

        entry = _COMPILED[id(site)] = (site, compile_graph(site.graph, site.dtype, config="auto", major=site.major))
    return entry[1]


def launch(site: Site, A: torch.Tensor, W: torch.Tensor, inputs: dict[str, Any]) -> Any:
    """The site's compiled op on (A, W, inputs), called directly (already inside a custom op: no second
    dispatch); under the profiler, inside a range that names the site and its GEMM shape."""
    op = _compiled(site)
    if not torch.autograd.profiler._is_profiler_enabled:
        return op.run(A, W, inputs, {})
    with torch.profiler.record_function(f"{PROFILE_PREFIX}{site.graph.digest()[:8]} "
                                        f"{A.shape[0]}x{W.shape[0]}x{A.shape[1]}"):
        return op.run(A, W, inputs, {})


def run_site(site: Site, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    A, W = operands(tensors[0], tensors[1], site.major)
    M, N = A.shape[0], W.shape[0]
    inputs = {name: _prepare(t, role, M, N) for (name, role), t in zip(site.inputs, tensors[2:])}
    if site.execute == "interpret" or not A.is_cuda:
        outs = interpret(site.graph, A, W, **inputs)
        taken = {x.untyped_storage().data_ptr() for x in tensors}   # a custom op's results alias nothing
    else:
        outs = launch(site, A, W, inputs)
        # a kernel's outputs are new tensors: only two results of one output can share memory (no storage
        # lookups a call otherwise: each costs host time)
        taken = set() if len({o.name for o in site.outputs}) < len(site.outputs) else None
    results = []
    for o in site.outputs:
        t = outs[o.name]
        if t.shape != o.shape:
            t = t.reshape(o.shape)
        if t.dtype != o.dtype:
            t = t.to(o.dtype)
        if taken is not None:
            if t.untyped_storage().data_ptr() in taken:
                t = t.clone()
            taken.add(t.untyped_storage().data_ptr())
        results.append(t)
    return results


# fusion_kernel is registered with the dispatcher directly, not as a torch.library.custom_op: it runs once
# per fused GEMM in every step, and custom_op's Python layers (an autograd wrapper, the aliasing check of
# the results) cost more host time than the launch itself. It has no autograd formula: it runs inside
# compiled graphs, where AOTAutograd owns the backward.
_LIB = torch.library.Library("coda_ext", "FRAGMENT")
_LIB.define("fusion_kernel(str spec, Tensor[] tensors) -> Tensor[]", tags=(torch.Tag.pt2_compliant_tag,))


def _fusion_kernel(spec: str, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        raise RuntimeError("coda_ext::fusion_kernel has no autograd formula: it runs inside the graphs the coda "
                           "backend compiles (coda_ext.fusion.fuse), where AOTAutograd owns the backward; call it "
                           "under torch.no_grad() or on tensors that do not require grad")
    return run_site(load_site(spec), tensors)


for _key in ("CPU", "CUDA"):
    _LIB.impl("fusion_kernel", _fusion_kernel, _key)


@torch.library.register_fake("coda_ext::fusion_kernel", lib=_LIB)
def _fusion_kernel_fake(spec: str, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """The results' shapes, dtypes and strides as the real op gives them: the kernel's (M, N) outputs have
    16-byte rows (runtime.checks.empty_rows: padded where N is not a multiple of 8); the interpreter's are
    contiguous."""
    site = load_site(spec)
    like = tensors[0]
    kernel = like.device.type == "cuda" and site.execute != "interpret"
    return [checks.empty_rows(o.shape, o.dtype, like.device)
            if kernel and site.graph[site.graph.named(o.name)].kind in ("output", "store")
            else like.new_empty(o.shape, dtype=o.dtype) for o in site.outputs]


fusion_kernel = torch.ops.coda_ext.fusion_kernel.default
