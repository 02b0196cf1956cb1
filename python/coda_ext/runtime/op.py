"""A compiled epilogue op: checks inputs, allocates outputs, launches on the current stream."""
from __future__ import annotations

import ctypes
import dataclasses
from typing import Any

import torch

from ..config import RASTER_ORDERS, KernelConfig
from ..errors import LaunchError
from ..graph import ir
from ..graph.interpret import Outputs, torch_dtype
from . import checks


@dataclasses.dataclass(frozen=True)
class Slot:
    """One runtime operand of the kernel, in launch-slot order."""

    node: int
    kind: str          # node kind (tile, row_vector, scalar, store, row_reduce, ...)
    name: str
    dtype: str | None
    mode: str | None = None  # for scalars: value | pointer


class CompiledOp:
    """Callable as op(A, W, **inputs, out=None) -> Outputs (a dict with attribute access).

    `out` may map output names to preallocated tensors (for example poisoned ones in tests);
    other outputs are allocated. M (A.shape[0]) is a runtime size: any M runs on this kernel.
    """

    def __init__(self, graph: ir.Graph, lowered: ir.Graph, dtype: str, config: KernelConfig, library: str,
                 source: str):
        self.graph = graph              # canonical user graph
        self.lowered = lowered          # after the lowering passes (what was emitted)
        self.dtype = torch_dtype(dtype)
        self.config = config
        self.library_path = library
        self.source = source
        self._lib = ctypes.CDLL(library)
        self._run = ctypes.cast(self._lib.coda_run, ctypes.c_void_p).value
        self._workspace = ctypes.cast(self._lib.coda_workspace_size, ctypes.c_void_p).value
        self.slots = tuple(
            Slot(i, lowered[i].kind, lowered[i].name, lowered[i].attr("dtype"), lowered[i].attr("mode"))
            for i in lowered.slots()
        )
        self.output_name = lowered[lowered.find("output")[0]].name
        self.input_names = tuple(s.name for s in self.slots if s.kind in ir.INPUT_KINDS or s.kind == "scalar")
        self.output_names = (self.output_name,) + tuple(
            s.name for s in self.slots if s.kind not in ir.INPUT_KINDS and s.kind != "scalar")

    def __repr__(self) -> str:
        return (f"<coda_ext.CompiledOp graph={self.graph.digest()} dtype={self.dtype} config={self.config.tag} "
                f"inputs={list(self.input_names)} outputs={list(self.output_names)}>")

    def workspace_size(self, M: int, N: int, K: int) -> int:
        from ..compile.binding import load_binding

        return load_binding().workspace_size(self._workspace, M, N, K)

    def _output_shape(self, s: Slot, M: int, N: int) -> tuple[tuple[int, ...], torch.dtype]:
        if s.kind == "store":
            return (M, N), torch_dtype(s.dtype)
        if s.kind == "pair_gated_store":
            return (M, N // 2), torch_dtype(s.dtype)
        if s.kind == "row_reduce":
            return (M,), torch.float32
        return (N,), torch.float32  # col_reduce

    def __call__(self, A: torch.Tensor, W: torch.Tensor, *, out: dict[str, torch.Tensor] | None = None,
                 **inputs: Any) -> Outputs:
        from ..compile.binding import load_binding

        M, N, K = checks.check_operands(A, W, self.dtype)
        device = A.device
        missing = [n for n in self.input_names if n not in inputs]
        extra = sorted(set(inputs) - set(self.input_names))
        if missing:
            raise TypeError(f"missing input(s) {missing}; this op takes {list(self.input_names)}")
        if extra:
            raise TypeError(f"unexpected input(s) {extra}; this op takes {list(self.input_names)}")
        out = dict(out or {})
        unknown = sorted(set(out) - set(self.output_names))
        if unknown:
            raise TypeError(f"out= names unknown output(s) {unknown}; outputs are {list(self.output_names)}")

        tensors: list[torch.Tensor | None] = []
        lds: list[int] = []
        values: list[float] = []
        checked_inputs: dict[str, torch.Tensor] = {"A": A, "W": W}
        outputs: dict[str, torch.Tensor] = {}

        def output_tensor(name: str, shape: tuple[int, ...], dtype: torch.dtype, row_align: int = 16) -> torch.Tensor:
            if name in out:
                t = checks.check_tensor(f"out[{name!r}]", out[name], dtype=dtype, device=device, shape=shape,
                                        row_align=row_align)
            else:
                t = torch.empty(shape, dtype=dtype, device=device)
            outputs[name] = t
            return t

        D = output_tensor(self.output_name, (M, N), self.dtype)
        for s in self.slots:
            ld, value, t = 0, 0.0, None
            if s.kind == "scalar":
                if s.mode == "value":
                    value = checks.check_scalar_value(s.name, inputs[s.name])
                else:
                    t = checks.check_scalar_pointer(s.name, inputs[s.name], device)
            elif s.kind in ir.INPUT_KINDS:
                shape = {"tile": (M, N), "row_vector": (N,), "col_vector": (M,)}[s.kind]
                t = checks.check_tensor(s.name, inputs[s.name], dtype=torch_dtype(s.dtype), device=device,
                                        shape=shape)
                checked_inputs[s.name] = t
                ld = t.stride(0) if s.kind == "tile" else 0
            else:
                if s.kind == "pair_gated_store" and N % 2:
                    raise ValueError(f"output {s.name!r} pairs adjacent columns, so N = {N} must be even")
                shape, dtype = self._output_shape(s, M, N)
                # TMA-stored tiles need 16-byte rows; the pair store writes single elements.
                row_align = dtype.itemsize if s.kind == "pair_gated_store" else 16
                t = output_tensor(s.name, shape, dtype, row_align)
                ld = t.stride(0) if t.dim() == 2 else 0
            tensors.append(t)
            lds.append(ld)
            values.append(value)
        checks.check_no_overlap(outputs, checked_inputs)

        with torch.cuda.device(device):
            stream = torch.cuda.current_stream(device).cuda_stream
            try:
                load_binding().launch(self._run, self._workspace, A, W, D, tensors, lds, values,
                                      self.config.swizzle, RASTER_ORDERS[self.config.raster], stream)
            except RuntimeError as e:
                raise LaunchError(f"{self!r}: {e}") from e
        result = Outputs()
        for name in self.output_names:
            result[name] = outputs[name]
        return result
