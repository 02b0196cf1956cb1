"""The call interface every graph op shares (CompiledOp, TunedOp): argument names, output
shapes, leading batch dimensions, and the torch custom op the call goes through.

    out = op(A, W, bias=b, residual=r)     # A (..., K) as F.linear takes it; W (N, K)

Without `out=`, a call is the custom op `coda_ext::run_graph` (torch_op.py): opaque to Dynamo,
with a fake implementation, so `torch.compile(fullgraph=True)` and CUDA-graph capture work.
With `out=` (preallocated outputs) it launches directly (eager only).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ..graph import ir
from ..graph.interpret import Outputs, torch_dtype


@dataclasses.dataclass(frozen=True)
class Slot:
    """One runtime operand of the kernel, in launch-slot order."""

    node: int
    kind: str          # node kind (tile, row_vector, scalar, store, row_reduce, ...)
    name: str
    dtype: str | None
    mode: str | None = None  # for scalars: value | pointer


class GraphOp:
    """Names, shapes and the public call of an op compiled from one lowered graph."""

    def _init_interface(self, lowered: ir.GraphIR, dtype: str, key: str) -> None:
        from .torch_op import register

        self.lowered = lowered
        self.dtype = torch_dtype(dtype)
        self.slots = tuple(
            Slot(i, lowered[i].kind, lowered[i].name, lowered[i].attr("dtype"), lowered[i].attr("mode"))
            for i in lowered.slots()
        )
        outs = lowered.find("output")
        self.output_name = lowered[outs[0]].name if outs else None   # None: no main output D
        self.input_names = tuple(s.name for s in self.slots if s.kind in ir.INPUT_KINDS or s.kind == "scalar")
        main = (self.output_name,) if self.output_name else ()
        self.output_names = main + tuple(
            s.name for s in self.slots if s.kind not in ir.INPUT_KINDS and s.kind != "scalar")
        self.pairs = any(lowered.find(k) for k in ("pair_gated_store", "pair_swap", "rotate_pairs"))
        sizes = {lowered[i].attr("size") for i in lowered.find("segment_reduce")}
        self.segment = sizes.pop() if sizes else None
        self.key = register(key, self)

    # --- shapes ---------------------------------------------------------------------------

    def output_spec(self, name: str, M: Any, N: Any) -> tuple[tuple[Any, ...], torch.dtype]:
        """(shape, dtype) of output `name` for an (M, N) problem (M may be symbolic)."""
        if name == self.output_name:
            return (M, N), self.dtype
        s = next(s for s in self.slots if s.name == name)
        if s.kind == "store":
            return (M, N), torch_dtype(s.dtype)
        if s.kind == "pair_gated_store":
            return (M, N // 2), torch_dtype(s.dtype)
        if s.kind == "pair_store":
            return (M, 2 * N), torch_dtype(s.dtype)
        if s.kind == "row_reduce":
            return (M,), torch.float32
        return (N,), torch.float32  # col_reduce

    def input_shape(self, name: str, M: Any, N: Any) -> tuple[Any, ...] | None:
        s = next(s for s in self.slots if s.name == name)
        return {"tile": (M, N), "pair_tile": (M, 2 * N), "row_vector": (N,), "col_vector": (M,)}.get(s.kind)

    # --- the call -------------------------------------------------------------------------

    def check_names(self, inputs: dict[str, Any], out: dict[str, Any]) -> None:
        missing = [n for n in self.input_names if n not in inputs]
        extra = sorted(set(inputs) - set(self.input_names))
        if missing:
            raise TypeError(f"missing input(s) {missing}; this op takes {list(self.input_names)}")
        if extra:
            raise TypeError(f"unexpected input(s) {extra}; this op takes {list(self.input_names)}")
        unknown = sorted(set(out) - set(self.output_names))
        if unknown:
            raise TypeError(f"out= names unknown output(s) {unknown}; outputs are {list(self.output_names)}")

    def __call__(self, A: torch.Tensor, W: torch.Tensor, *, out: dict[str, torch.Tensor] | None = None,
                 **inputs: Any) -> Outputs:
        out = dict(out or {})
        self.check_names(inputs, out)
        if not isinstance(A, torch.Tensor) or not isinstance(W, torch.Tensor):
            raise TypeError(f"A and W must be torch.Tensors, got {type(A).__name__} and {type(W).__name__}")
        lead = tuple(A.shape[:-1]) if A.dim() >= 1 else ()
        if A.dim() > 2:  # (B, S, K) as F.linear takes it: rows are tokens
            A = A.reshape(-1, A.shape[-1])
            inputs = {k: self._flatten(k, v, len(lead)) for k, v in inputs.items()}
            out = {k: self._flatten_out(k, v, len(lead)) for k, v in out.items()}
        if out:
            result = self.run(A, W, inputs, out)
        else:
            tensors, scalars = [], []
            for n in self.input_names:
                v = inputs[n]
                if self._takes_tensor(n) and not isinstance(v, torch.Tensor):
                    what = "is a device-pointer scalar and must be a one-element torch.Tensor" \
                        if next(s for s in self.slots if s.name == n).mode == "pointer" else "must be a torch.Tensor"
                    raise TypeError(f"{n} {what}, got {type(v).__name__}")
                tensors.append(v if isinstance(v, torch.Tensor) else None)
                scalars.append(0.0 if isinstance(v, torch.Tensor) else _number(n, v))
            values = torch.ops.coda_ext.run_graph(self.key, A, W, tensors, scalars)
            result = Outputs(zip(self.output_names, values))
        if len(lead) > 1:
            result = Outputs({k: self._unflatten(k, v, lead) for k, v in result.items()})
        return result

    def inputs_from_lists(self, tensors: list, scalars: list) -> dict[str, Any]:
        """The keyword inputs of run() from the custom op's positional lists."""
        return {n: (t if t is not None else s) for n, t, s in zip(self.input_names, tensors, scalars)}

    def run(self, A: torch.Tensor, W: torch.Tensor, inputs: dict[str, Any], out: dict[str, torch.Tensor]) -> Outputs:
        raise NotImplementedError

    def _takes_tensor(self, name: str) -> bool:
        """Tiles, vectors and device-pointer scalars are tensors; value scalars are numbers."""
        s = next(s for s in self.slots if s.name == name)
        return s.kind in ir.INPUT_KINDS or s.mode == "pointer"

    # --- leading dimensions ---------------------------------------------------------------

    def _row_input(self, name: str) -> bool:
        s = next((s for s in self.slots if s.name == name), None)
        return s is not None and s.kind in ("tile", "pair_tile", "col_vector")

    def _flatten(self, name: str, v: Any, n_lead: int) -> Any:
        if not (isinstance(v, torch.Tensor) and self._row_input(name) and v.dim() > 1):
            return v
        s = next(s for s in self.slots if s.name == name)
        return v.reshape(-1, v.shape[-1]) if s.kind in ("tile", "pair_tile") else v.reshape(-1)

    def _flatten_out(self, name: str, v: Any, n_lead: int) -> Any:
        if not isinstance(v, torch.Tensor):
            return v
        per_row = name == self.output_name or any(
            s.name == name and s.kind in ("store", "pair_gated_store", "pair_store", "row_reduce") for s in self.slots)
        if not per_row:
            return v
        flat = v.view(-1, v.shape[-1]) if v.dim() > n_lead else v.view(-1)
        return flat

    def _unflatten(self, name: str, v: torch.Tensor, lead: tuple[int, ...]) -> torch.Tensor:
        s = next((s for s in self.slots if s.name == name), None)
        if name == self.output_name or (s is not None and s.kind in ("store", "pair_gated_store", "pair_store")):
            return v.reshape(*lead, v.shape[-1])
        if s is not None and s.kind == "row_reduce":
            return v.reshape(lead)
        return v


def _number(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"{name} is a runtime scalar and must be a Python int or float, got {type(v).__name__}")
    return float(v)
