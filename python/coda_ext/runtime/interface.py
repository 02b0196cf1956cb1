"""The call interface every graph op shares (CompiledOp, TunedOp): argument names, output
shapes, leading batch dimensions, the checks of a call, and the torch custom op it goes through.

    out = op(A, W, bias=b, residual=r)     # A (..., K) as F.linear takes it; W (N, K)

Without `out=`, a call is the custom op `coda_ext::run_graph` (torch_op.py): opaque to Dynamo,
with a fake implementation, so `torch.compile(fullgraph=True)` and CUDA-graph capture work.
With `out=` (preallocated outputs) it launches directly (eager only). Either way check_call
validates every argument first; the fake runs it too, so tracing refuses what a launch would.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ..graph import ir, signature
from ..graph.interpret import Outputs, torch_dtype
from . import checks

#: argument layouts an op remembers as checked (a bound: shapes that keep changing are checked every time)
MAX_CHECKED_LAYOUTS = 64
_MISSING = object()
#: tensors whose layout key is remembered (a fake or other subclass is checked every time), and which a ready
#: op may hand its implementation without the dispatcher (ops.common.call)
PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


def _aligned(A: torch.Tensor, W: torch.Tensor, inputs: dict[str, Any]) -> bool:
    """Every tensor's data 16-byte aligned (empty ones have no data to align)."""
    return not any(type(t) in PLAIN_TENSORS and t.numel() and t.data_ptr() % 16 for t in (A, W, *inputs.values()))


@dataclasses.dataclass(frozen=True)
class Slot:
    """One runtime operand of the kernel, in launch-slot order."""

    node: int
    kind: str          # node kind (tile, row_vector, scalar, store, row_reduce, ...)
    name: str
    dtype: str | None
    mode: str | None = None  # for scalars: value | pointer


class GraphOp:
    """Names, shapes, checks and the public call of an op compiled from one lowered graph."""

    major = "kk"  # the operand layout (coda_ext.config.MAJORS)

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
        #: outputs in the GEMM's (M, N) frame: their rows start 16 bytes apart (checks.empty_rows), so any N stores
        self.tile_outputs = frozenset(main + tuple(s.name for s in self.slots if s.kind == "store"))
        self.pairs, self.segment = signature.columns(lowered)
        self._checked: dict[tuple, tuple[int, int, int]] = {}   # (M, N, K) per argument layout check_call passed
        self.key = register(key, self)

    def _slot(self, name: str) -> Slot | None:
        return next((s for s in self.slots if s.name == name), None)

    def _kind(self, name: str) -> str | None:
        """The node kind of input or output `name` (the main output's is "output")."""
        return "output" if name == self.output_name else getattr(self._slot(name), "kind", None)

    # --- shapes ---------------------------------------------------------------------------

    def output_spec(self, name: str, M: Any, N: Any) -> tuple[tuple[Any, ...], torch.dtype]:
        """(shape, dtype) of output `name` for an (M, N) problem (M may be symbolic)."""
        if name == self.output_name:
            return (M, N), self.dtype
        s = self._slot(name)
        if s.kind == "store":
            return (M, N), torch_dtype(s.dtype)
        if s.kind == "pair_gated_store":
            return (M, N // 2), torch_dtype(s.dtype)
        if s.kind == "pair_store":
            return (M, 2 * N), torch_dtype(s.dtype)
        if s.kind == "row_reduce":
            return (M,), torch.float32
        return (N,), torch.float32  # col_reduce

    def empty_output(self, name: str, M: Any, N: Any, device: Any) -> torch.Tensor:
        """A new tensor for output `name` (the real op's and the fake's: the same strides)."""
        return self.new_output(name, *self.output_spec(name, M, N), device)

    def new_output(self, name: str, shape: tuple[Any, ...], dtype: torch.dtype, device: Any) -> torch.Tensor:
        """A new tensor of output `name`'s shape and dtype: 16-byte rows for a tile output, else contiguous."""
        if name in self.tile_outputs:
            return checks.empty_rows(shape, dtype, device)
        return torch.empty(shape, dtype=dtype, device=device)

    def input_shape(self, name: str, M: Any, N: Any) -> tuple[Any, ...] | None:
        return signature.input_shape(self._slot(name).kind, M, N)

    def _row_align(self, name: str) -> int:
        """TMA-stored outputs need 16-byte rows; the half-width pair store writes single elements."""
        s = self._slot(name)
        return torch_dtype(s.dtype).itemsize if s is not None and s.kind == "pair_gated_store" else 16

    # --- the checks -------------------------------------------------------------------------

    def check_names(self, inputs: dict[str, Any], out: dict[str, Any]) -> None:
        signature.check_names(inputs, self.input_names)
        unknown = sorted(set(out) - set(self.output_names))
        if unknown:
            raise TypeError(f"out= names unknown output(s) {unknown}; outputs are {list(self.output_names)}")

    def check_call(self, A: Any, W: Any, inputs: dict[str, Any], out: dict[str, Any],
                   operands: tuple[str, str] = ("A", "W")) -> tuple[int, int, int]:
        """Every check of run(A, W, inputs, out) but the last two (outputs overlapping, an SM90 GPU):
        names, A and W, then each input and given output (type, dtype, shape, strides, alignment,
        A's device). Fake and meta tensors get the same checks (no data pointers). operands: what the
        caller calls A and W. Returns (M, N, K)."""
        self.check_names(inputs, out)
        M, N, K = checks.check_operands(A, W, self.dtype, major=self.major, names=operands)
        signature.check_columns(N, self.pairs, self.segment)
        short = [s.name for s in self.slots if s.kind == "row_vector" and (N * torch_dtype(s.dtype).itemsize) % 16]
        if short:
            raise ValueError(f"N = {N} ({operands[1]}.shape[0]) must be a multiple of 8 for this graph: its row "
                             f"vector input(s) {short} are read 16 bytes at a time (a graph without row vectors "
                             "takes any N: its outputs are stored with padded rows)")
        device = A.device
        for s in self.slots:
            if s.kind == "scalar" and s.mode == "value":
                checks.check_scalar_value(s.name, inputs[s.name])
            elif s.kind == "scalar":
                checks.check_scalar_pointer(s.name, inputs[s.name], device)
            elif s.kind in ir.INPUT_KINDS:
                checks.check_tensor(s.name, inputs[s.name], dtype=torch_dtype(s.dtype), device=device,
                                    shape=self.input_shape(s.name, M, N))
        for name, t in out.items():
            shape, dtype = self.output_spec(name, M, N)
            checks.check_tensor(f"out[{name!r}]", t, dtype=dtype, device=device, shape=shape,
                                row_align=self._row_align(name))
        return M, N, K

    # --- the call -------------------------------------------------------------------------

    def __call__(self, A: torch.Tensor, W: torch.Tensor, *args: Any, out: dict[str, torch.Tensor] | None = None,
                 **inputs: Any) -> Outputs:
        signature.by_name(args, self.input_names)
        out = dict(out or {})
        self.check_names(inputs, out)
        if not isinstance(A, torch.Tensor) or not isinstance(W, torch.Tensor):
            signature.check_operands(A, W)
        lead = tuple(A.shape[:-1]) if A.dim() >= 1 else ()
        if A.dim() > 2:  # (B, S, K) as F.linear takes it: rows are tokens
            A = A.reshape(-1, A.shape[-1])
            inputs = {k: signature.flatten_input(self._kind(k), v) for k, v in inputs.items()}
            out = {k: self._flatten_out(k, v, len(lead)) for k, v in out.items()}
        if out:
            result = self.run(A, W, inputs, out)
        else:
            tensors, scalars = [], []
            for n in self.input_names:
                v = inputs[n]
                s = self._slot(n)
                if s.kind == "scalar":
                    signature.check_scalar(n, v, pointer=s.mode == "pointer")
                elif not isinstance(v, torch.Tensor):
                    raise TypeError(f"{n} must be a torch.Tensor, got {type(v).__name__}")
                tensors.append(v if isinstance(v, torch.Tensor) else None)
                scalars.append(0.0 if isinstance(v, torch.Tensor) else float(v))
            values = torch.ops.coda_ext.run_graph(self.key, A, W, tensors, scalars)
            result = Outputs(zip(self.output_names, values))
        if len(lead) > 1:
            result = Outputs({k: signature.unflatten_output(self._kind(k), v, lead) for k, v in result.items()})
        return result

    def inputs_from_lists(self, tensors: list, scalars: list) -> dict[str, Any]:
        """The keyword inputs of run() from the custom op's positional lists."""
        return {n: (t if t is not None else s) for n, t, s in zip(self.input_names, tensors, scalars)}

    def run(self, A: torch.Tensor, W: torch.Tensor, inputs: dict[str, Any], out: dict[str, torch.Tensor]) -> Outputs:
        """Checks every argument (check_call), then launches. A is (M, K); `out` maps output names to given
        tensors (the others are allocated). A call whose arguments have the layout of one already checked
        (shapes, strides, dtypes, devices and scalar values, no given outputs) repeats only the check that
        depends on the data: 16-byte aligned pointers."""
        mnk = self.check_call(A, W, inputs, out) if out else self.check_call_remembered(A, W, inputs)
        return self.launch(A, W, inputs, out, mnk[0], mnk[1])

    def check_call_remembered(self, A: Any, W: Any, inputs: dict[str, Any],
                              operands: tuple[str, str] = ("A", "W")) -> tuple[int, int, int]:
        """check_call of a call without given outputs, its verdict remembered per argument layout (shapes,
        strides, dtypes, devices, scalar values): a call of a layout already checked repeats only the check
        that depends on the data, 16-byte aligned pointers (the whole check took about a third of a ready op's
        host time). Fake, meta and other tensors are checked every time."""
        key = self._layout_key(A, W, inputs)
        mnk = self._checked.get(key) if key is not None else None
        if mnk is None or not _aligned(A, W, inputs):
            mnk = self.check_call(A, W, inputs, {}, operands)
            if key is not None and len(self._checked) < MAX_CHECKED_LAYOUTS:
                self._checked[key] = mnk
        return mnk

    def _layout_key(self, A: Any, W: Any, inputs: dict[str, Any]) -> tuple | None:
        """What check_call's verdict depends on besides the data pointers (None: not a plain tensor call)."""
        if len(inputs) != len(self.input_names):
            return None
        parts: list[Any] = []
        for v in (A, W, *(inputs.get(n, _MISSING) for n in self.input_names)):
            if type(v) in PLAIN_TENSORS and not v.is_meta:
                parts.append((v.shape, v.stride(), v.dtype, v.device))
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                parts.append((type(v), v))
            else:
                return None   # anything else (a missing name, a fake or meta tensor): check every time
        return tuple(parts)

    def launch(self, A: torch.Tensor, W: torch.Tensor, inputs: dict[str, Any], out: dict[str, torch.Tensor],
               M: int, N: int, aliases: dict[str, str] | None = None) -> Outputs:
        """run() after check_call: the checks of the launch itself (no output overlapping another tensor but an
        allowed alias, {output: input}, that is the input itself; an SM90 GPU, last), then the kernel."""
        raise NotImplementedError

    def _flatten_out(self, name: str, v: Any, n_lead: int) -> Any:
        """A given per-token output as the (M, X) or (M,) view the kernel writes."""
        if not isinstance(v, torch.Tensor) or self._kind(name) not in signature.ROW_OUTPUTS + signature.VALUE_OUTPUTS:
            return v
        return v.view(-1, v.shape[-1]) if v.dim() > n_lead else v.view(-1)
