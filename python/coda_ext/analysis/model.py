"""The IO model of one epilogue graph at one (M, N, K): three ways to run it, as kernel sequences.

fused    coda_ext: one GEMM whose epilogue reads the graph's inputs and writes its outputs (a pair
         store at half width, reductions as fp32 partials per tile), then one finalize kernel that
         reads every reduction's partials and writes the vectors. int64 vectors are first narrowed
         to int32 by the runtime (one small copy each), and the kernel reads the copy.
compile  torch.compile style: the cuBLAS GEMM writes its result once (M x N, the op dtype), then one
         fused kernel reads it with the graph's inputs and writes every output, reductions included.
unfused  eager PyTorch: the cuBLAS GEMM writes its result, then every node of the graph runs as its
         own kernel, reading its operands from HBM and writing its result in the op dtype.

Every variant reads the operands as the fused kernel's tile schedule does (schedule.py), so the
variants differ by epilogue traffic alone. Vectors are read from HBM once per kernel (their
re-reads by every tile hit L2). Intermediates of the unfused sequence go through HBM even where
they would fit in L2 (small M): at such shapes launches dominate anyway.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

from .. import tuning
from ..config import DEFAULT_CONFIG, KernelConfig
from ..errors import UnsupportedError
from ..graph import ir
from ..graph.builder import dtype_name
from ..graph.canonical import as_ir
from ..passes import lower, resolve_dtypes
from .costs import DTYPE_BYTES, REDUCE_FLOPS, kind_cost, node_flops
from .roofline import GPU, Access, GemmWork, Kernel, Variant, gpu_spec
from .schedule import Schedule, schedule

VARIANTS = ("fused", "compile", "unfused")
#: Row order of tensors in tables.
ROLES = ("operand", "tile input", "row vector", "col vector", "int32 copy", "output D", "store", "pair store",
         "row reduction", "col reduction", "partials", "GEMM result", "intermediate")
#: The dtype kernels read integer vectors in (runtime/op.py narrows int64 vectors before the launch).
KERNEL_INT_DTYPE = "int32"


@dataclasses.dataclass(frozen=True)
class Tensor:
    name: str
    role: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPE_BYTES[self.dtype]


class _Tensors(dict):
    """name -> Tensor, filled as the variants are built; add() returns the tensor's size in bytes."""

    def add(self, name: str, role: str, shape: tuple[int, ...], dtype: str) -> int:
        return self.setdefault(name, Tensor(name, role, shape, dtype)).nbytes


def io_tensor(node: ir.Node, M: int, N: int, dtype: str, half: bool = False) -> tuple[str, tuple[int, ...], str]:
    """(role, shape, dtype) of the tensor an input or sink node reads or writes (half: a store of a
    half-width pair value, before lowering makes it a pair_gated_store)."""
    own = node.attr("dtype") or dtype
    if half and node.kind == "store":
        return "pair store", (M, N // 2), own
    return {
        "tile": ("tile input", (M, N), own),
        "pair_tile": ("tile input", (M, 2 * N), own),
        "row_vector": ("row vector", (N,), own),
        "col_vector": ("col vector", (M,), own),
        "output": ("output D", (M, N), dtype),
        "store": ("store", (M, N), own),
        "pair_gated_store": ("pair store", (M, N // 2), own),
        "pair_store": ("store", (M, 2 * N), own),
        "row_reduce": ("row reduction", (M,), "float32"),
        "col_reduce": ("col reduction", (N,), "float32"),
    }[node.kind]


@dataclasses.dataclass(frozen=True)
class Model:
    """The three variants of one graph at one shape, and what they were computed from."""

    graph: ir.GraphIR           # canonical user graph
    lowered: ir.GraphIR         # what the fused kernel runs
    dtype: str
    shape: tuple[int, int, int]
    config: KernelConfig
    config_source: str
    gpu: GPU
    schedule: Schedule
    tensors: dict[str, Tensor]
    variants: dict[str, Variant]


def resolve_config(config: Any, lowered: ir.GraphIR, M: int, N: int, K: int, gpu: GPU,
                   major: str = "kk") -> tuple[KernelConfig, str]:
    """The kernel config and how it was chosen: None -> DEFAULT_CONFIG (as coda_ext.compile), "auto" ->
    the shape heuristic exactly as config="auto" dispatches for operands laid out as `major` (tuning.heuristic on
    the M bucket; the layout picks among tiles and schedules too: runtime/tuned.py)."""
    if config is None:
        return DEFAULT_CONFIG, "default"
    if isinstance(config, KernelConfig):
        return config, "given"
    if config == "auto":
        epilogue = tuning.Epilogue.of(lowered)
        cfg = tuning.heuristic(M, N, K, gpu.sms, epilogue, major)
        return (cfg if cfg.major == major else dataclasses.replace(cfg, major=major)), "auto"
    raise ValueError(f"config must be None, a KernelConfig or 'auto', got {config!r}")


def io_model(graph: Any, dtype: Any, shape: tuple[int, int, int], config: Any = None,
             gpu: str | GPU = "H100 SXM", major: str = "kk") -> Model:
    """Builds the fused, compile-style and unfused kernel sequences of `graph` at shape (M, N, K); `major`: the
    operands' layout config="auto" picks a kernel for."""
    if len(shape) != 3 or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in shape):
        raise ValueError(f"shape must be three positive ints (M, N, K), got {shape!r}")
    M, N, K = shape
    d = dtype_name(dtype)
    if d not in ("bfloat16", "float16"):
        raise UnsupportedError("GEMM operands must be torch.bfloat16 or torch.float16 (fp32 accumulate)")
    spec = gpu_spec(gpu)
    g = as_ir(graph)
    lowered = lower(g, d)
    cfg, source = resolve_config(config, lowered, M, N, K, spec, major)
    sched, operands, work = gemm_operands(M, N, K, d, cfg, spec)
    tensors = _Tensors()
    tensors.add("A", "operand", (M, K), d)
    tensors.add("W", "operand", (N, K), d)
    variants = {
        "fused": _fused(lowered, d, M, N, sched, tensors, operands, work),
        "compile": _compile_style(lowered, d, M, N, tensors, operands, work),
        "unfused": _unfused(resolve_dtypes(g, d), d, M, N, tensors, operands, work),
    }
    return Model(g, lowered, d, (M, N, K), cfg, source, spec, sched, dict(tensors), variants)


def gemm_operands(M: int, N: int, K: int, dtype: str, config: KernelConfig, gpu: GPU,
                  names: tuple[str, str] = ("A", "W")) -> tuple[Schedule, tuple[Access, Access], GemmWork]:
    """The tile schedule of a GEMM, its operand reads (A (M, K) and W (N, K), with re-reads) and its work."""
    sched = schedule(M, N, K, config, DTYPE_BYTES[dtype], gpu.l2_bytes)
    b = DTYPE_BYTES[dtype]
    operands = (Access(names[0], read=M * K * b * sched.a_reads), Access(names[1], read=N * K * b * sched.w_reads))
    return sched, operands, GemmWork(M, N, K, config.tile[0], config.tile[1], streamk=config.schedule == "streamk")


def _epilogue_flops(graph: ir.GraphIR, M: int, N: int) -> float:
    return sum(node_flops(n) * (M * (N // 2) if kind_cost(n.kind).half else M * N) for n in graph.nodes)


def _fused(lowered: ir.GraphIR, dtype: str, M: int, N: int, sched: Schedule, tensors: _Tensors,
           operands: tuple[Access, ...], work: GemmWork) -> Variant:
    before: list[Kernel] = []
    gemm = list(operands)
    finalize: list[Access] = []
    for node in lowered.nodes:
        hbm = kind_cost(node.kind).hbm
        if hbm == "none":
            continue
        role, shape, own = io_tensor(node, M, N, dtype)
        size = tensors.add(node.name, role, shape, own)
        if hbm == "read" and own == "int64":
            copy = f"{node.name}:{KERNEL_INT_DTYPE}"
            copy_size = tensors.add(copy, "int32 copy", shape, KERNEL_INT_DTYPE)
            before.append(Kernel(f"narrow {node.name} to {KERNEL_INT_DTYPE}",
                                 (Access(node.name, read=size), Access(copy, write=copy_size))))
            gemm.append(Access(copy, read=copy_size))
        elif hbm == "read":
            gemm.append(Access(node.name, read=size))
        elif hbm == "write":
            gemm.append(Access(node.name, write=size))
        else:  # partials: one fp32 per (row, N-tile) or (M-tile, column), finished by the finalize kernel
            pshape = (M, sched.tiles_n) if node.kind == "row_reduce" else (sched.tiles_m, N)
            pname = f"{node.name}:partials"
            psize = tensors.add(pname, "partials", pshape, "float32")
            gemm.append(Access(pname, write=psize))
            finalize += [Access(pname, read=psize), Access(node.name, write=size)]
    kernels = before + [Kernel("GEMM + epilogue", tuple(gemm), work, _epilogue_flops(lowered, M, N))]
    if finalize:
        kernels.append(Kernel("finalize reductions", tuple(finalize)))
    return Variant("fused", tuple(kernels))


def _owner_of_accumulator(graph: ir.GraphIR, dtype: str) -> int | None:
    """The first output/store that is the bare accumulator in the op dtype: the GEMM writes it directly."""
    for j, n in enumerate(graph.nodes):
        if n.kind in ("output", "store") and graph[n.inputs[0]].kind == "accumulator" \
                and (n.attr("dtype") or dtype) == dtype:
            return j
    return None


def _compile_style(lowered: ir.GraphIR, dtype: str, M: int, N: int, tensors: _Tensors,
                   operands: tuple[Access, ...], work: GemmWork) -> Variant:
    owner = _owner_of_accumulator(lowered, dtype)
    if owner is None:
        acc, acc_size = "acc", tensors.add("acc", "GEMM result", (M, N), dtype)
    else:
        acc = lowered[owner].name
        acc_size = tensors.add(acc, *io_tensor(lowered[owner], M, N, dtype))
    kernels = [Kernel("cuBLAS GEMM", operands + (Access(acc, write=acc_size),), work)]
    rest: list[Access] = []
    for j, node in enumerate(lowered.nodes):
        hbm = kind_cost(node.kind).hbm
        if hbm == "none" or j == owner:
            continue
        size = tensors.add(node.name, *io_tensor(node, M, N, dtype))
        rest.append(Access(node.name, read=size) if hbm == "read" else Access(node.name, write=size))
    if any(a.write for a in rest):
        uses_acc = [False] * len(lowered)   # does the node depend on the accumulator?
        for j, node in enumerate(lowered.nodes):
            uses_acc[j] = node.kind == "accumulator" or any(uses_acc[i] for i in node.inputs)
        reads_acc = any(uses_acc[j] for j, n in enumerate(lowered.nodes) if n.is_sink and j != owner)
        accesses = ((Access(acc, read=acc_size),) if reads_acc else ()) + tuple(rest)
        kernels.append(Kernel("fused pointwise + reductions", accesses, vector_flops=_epilogue_flops(lowered, M, N)))
    return Variant("compile", tuple(kernels))


_LEAF_SHAPES = {"accumulator": "full", "tile": "full", "pair_tile": "full", "row_vector": "row", "col_vector": "col",
                "scalar": "scalar", "col_index": "row"}


def _value_shape(node: ir.Node, inputs: list[str]) -> str:
    """Broadcast shape of an eager result: scalar, row (N), col (M), full (M x N) or half (M x N/2)."""
    if node.kind in _LEAF_SHAPES:
        return _LEAF_SHAPES[node.kind]
    if kind_cost(node.kind).half:
        return "half"
    s = set(inputs) - {"scalar"}
    if "half" in s:
        return "half"
    if "full" in s or {"row", "col"} <= s:
        return "full"
    return s.pop() if s else "scalar"


def _unfused(graph: ir.GraphIR, dtype: str, M: int, N: int, tensors: _Tensors,
             operands: tuple[Access, ...], work: GemmWork) -> Variant:
    nodes = graph.nodes
    elems = {"scalar": 0, "row": N, "col": M, "full": M * N, "half": M * (N // 2)}
    first_sink: dict[int, int] = {}   # computed value -> its first output/store in the op dtype
    for j, n in enumerate(nodes):
        if n.kind in ("output", "store") and (n.attr("dtype") or dtype) == dtype:
            first_sink.setdefault(n.inputs[0], j)
    owner: dict[int, int] = {}        # value -> the output/store that is its tensor
    shapes: list[str] = []
    names: dict[int, str] = {}
    sizes: dict[int, int] = {}
    kernels: list[Kernel] = []

    def reads(node: ir.Node) -> tuple[Access, ...]:
        return tuple(Access(names[i], read=sizes[i]) for i in dict.fromkeys(node.inputs) if i in names)

    for i, n in enumerate(nodes):
        shapes.append("" if n.is_sink else _value_shape(n, [shapes[j] for j in n.inputs]))
        if n.is_sink or n.kind in ("scalar", "col_index") or shapes[i] == "scalar":
            continue                                   # sinks below; free values have no tensor
        if n.kind in ir.INPUT_KINDS:
            names[i] = n.name
            sizes[i] = tensors.add(n.name, *io_tensor(n, M, N, dtype))
            continue
        if i in first_sink and shapes[i] in ("full", "half"):
            owner[i] = first_sink[i]
            names[i] = nodes[owner[i]].name
            role, _, _ = io_tensor(nodes[owner[i]], M, N, dtype, half=shapes[i] == "half")
        else:
            names[i] = "acc" if n.kind == "accumulator" else f"%{i} {n.kind}"
            role = "GEMM result" if n.kind == "accumulator" else "intermediate"
        shape = (M, N // 2) if shapes[i] == "half" else {"row": (N,), "col": (M,)}.get(shapes[i], (M, N))
        sizes[i] = tensors.add(names[i], role, shape, dtype)
        write = Access(names[i], write=sizes[i])
        if n.kind == "accumulator":
            kernels.append(Kernel("cuBLAS GEMM", operands + (write,), work))
        else:
            kernels.append(Kernel(f"{n.kind} -> {names[i]}", reads(n) + (write,),
                                  vector_flops=node_flops(n) * elems[shapes[i]]))
    for j, n in enumerate(nodes):
        if not n.is_sink or owner.get(n.inputs[0]) == j:
            continue
        size = tensors.add(n.name, *io_tensor(n, M, N, dtype, half=shapes[n.inputs[0]] == "half"))
        if n.kind in ("row_reduce", "col_reduce"):
            flops = REDUCE_FLOPS[n.attr("op")] * elems[shapes[n.inputs[0]]]
            kernels.append(Kernel(f"{n.attr('op')} -> {n.name}", reads(n) + (Access(n.name, write=size),),
                                  vector_flops=flops))
        else:
            kernels.append(Kernel(f"copy -> {n.name}", reads(n) + (Access(n.name, write=size),)))
    return Variant("unfused", tuple(kernels))
