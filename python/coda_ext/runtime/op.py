"""A compiled epilogue op: checks inputs, allocates outputs, launches on the current stream."""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import re
import weakref
from typing import Any

import torch

from ..config import GRIDS, RASTER_ORDERS, KernelConfig
from ..errors import LaunchError
from ..graph import ir
from ..graph.interpret import Outputs
from . import checks
from .interface import GraphOp, Slot

__all__ = ["CompiledOp", "Slot", "compile_config", "kernel_symbols"]

_SAME_DEVICE = contextlib.nullcontext()
#: the current stream's handle without building a torch.cuda.Stream (what Inductor's launchers call)
_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


#: (M, N) problem sizes whose output shapes a CompiledOp keeps
MAX_SPEC_SHAPES = 64


def _raw_stream(device: torch.device) -> int:
    if _RAW_STREAM is not None:
        return _RAW_STREAM(device.index)
    return torch.cuda.current_stream(device).cuda_stream


#: The GEMM kernel's device function in a kernel library, as a profiler names it (the mangled symbol)
_DEVICE_SYMBOL = re.compile(rb"(?<![.\w])(_ZN7cutlass13device_kernel\w+)")
#: Every CompiledOp of this process (kernel_symbols)
_LOADED: weakref.WeakSet = weakref.WeakSet()


def kernel_symbols() -> dict[str, str]:
    """{device symbol: "coda <graph digest> <config tag>"} of every compiled op loaded in this process: the names a
    profiler gives this package's GEMM kernels (CUTLASS's mangled device_kernel<...>, thousands of characters that
    differ only deep inside) told apart by graph and config."""
    out: dict[str, str] = {}
    for op in list(_LOADED):
        symbol = op.device_symbol
        if symbol:
            out.setdefault(symbol, f"coda {op.graph.digest()[:8]} {op.config.tag}")
    return out


def op_key(graph: ir.GraphIR, dtype: str, config: KernelConfig, source: str) -> str:
    """The key an op is registered under for run_graph: its graph, dtype and config, and its kernel's source (the
    same graph and config emitted otherwise, as an ablation's override of the emitter does, is another kernel:
    one key for both would run whichever was compiled last)."""
    return f"{graph.digest()}|{dtype}|{config.tag}|{hashlib.sha256(source.encode()).hexdigest()[:16]}"


def compile_config(graph: Any, dtype: Any, config: KernelConfig | None) -> CompiledOp:
    """The op of `graph` on one concrete kernel config, building its kernel on a cache miss."""
    from ..jit import kernel_source, nvcc

    ks = kernel_source(graph, dtype, config)
    return CompiledOp(ks.graph, ks.lowered, ks.dtype, ks.config, nvcc.build(ks.source, ks.label), ks.source)


class CompiledOp(GraphOp):
    """Callable as op(A, W, **inputs, out=None) -> Outputs (a dict with attribute access).

    `out` may map output names to preallocated tensors (for example poisoned ones in tests);
    other outputs are allocated. M (the rows of A) is a runtime size: any M runs on this kernel.
    """

    #: The persistent CTAs a launch asks for (CodaLaunch.sm_count); 0: one per SM. Tests set a few on an op
    #: so each CTA runs many tiles (the ping-pong kernels' warp groups then alternate over several).
    sm_count: int = 0

    def __init__(self, graph: ir.GraphIR, lowered: ir.GraphIR, dtype: str, config: KernelConfig, library: str,
                 source: str):
        self.graph = graph              # canonical user graph
        self.config = config
        self.library_path = library
        self.source = source
        self.major = config.major
        self._lib = ctypes.CDLL(library)
        self._run = ctypes.cast(self._lib.coda_run, ctypes.c_void_p).value
        self._workspace = ctypes.cast(self._lib.coda_workspace_size, ctypes.c_void_p).value
        self._specs: dict[tuple[int, int], dict] = {}
        self._init_interface(lowered, dtype, op_key(graph, dtype, config, source))
        _LOADED.add(self)   # once whole: a library that fails to load leaves no op behind

    @property
    def device_symbol(self) -> str | None:
        """The mangled name of the kernel's GEMM device function (what torch.profiler and Nsight list), read from
        its library once; None where the library has none (or none to read)."""
        if not hasattr(self, "_device_symbol"):
            try:
                with open(self.library_path, "rb") as f:
                    found = _DEVICE_SYMBOL.search(f.read())
            except OSError:
                found = None
            self._device_symbol = found.group(1).decode() if found else None
        return self._device_symbol

    def __repr__(self) -> str:
        return (f"<coda_ext.CompiledOp graph={self.graph.digest()} dtype={self.dtype} config={self.config.tag} "
                f"inputs={list(self.input_names)} outputs={list(self.output_names)}>")

    def _output_specs(self, M: int, N: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """{output: (shape, dtype)} at (M, N), kept per (M, N) (a launch reads them for every output)."""
        specs = self._specs.get((M, N))
        if specs is None:
            specs = {name: self.output_spec(name, M, N) for name in self.output_names}
            if len(self._specs) < MAX_SPEC_SHAPES:
                self._specs[(M, N)] = specs
        return specs

    def workspace_size(self, M: int, N: int, K: int) -> int:
        from ..jit.binding import load_binding

        return load_binding().workspace_size(self._workspace, M, N, K)

    def launch(self, A: torch.Tensor, W: torch.Tensor, inputs: dict[str, Any], out: dict[str, torch.Tensor],
               M: int, N: int, aliases: dict[str, str] | None = None) -> Outputs:
        """After check_call: allocates the outputs not in `out`, checks that no output overlaps another
        tensor (but for `aliases`, {output: input} pairs the caller knows the epilogue reads element by element
        before it writes them: such an output may be that input's tensor itself) and (last) that A is on an
        SM90 GPU, launches."""
        from ..jit.binding import load_binding

        device = A.device
        tensors: list[torch.Tensor | None] = []
        lds: list[int] = []
        values: list[float] = []
        checked_inputs: dict[str, torch.Tensor] = {"A": A, "W": W}
        outputs: dict[str, torch.Tensor] = {}

        specs = self._output_specs(M, N)

        def output_tensor(name: str) -> torch.Tensor:
            shape, dtype = specs[name]
            outputs[name] = t = out[name] if name in out else self.new_output(name, shape, dtype, device)
            return t

        D = output_tensor(self.output_name) if self.output_name else None
        for s in self.slots:
            ld, value, t = 0, 0.0, None
            if s.kind == "scalar" and s.mode == "value":
                value = float(inputs[s.name])
            elif s.kind == "scalar":
                t = inputs[s.name]
            elif s.kind in ir.INPUT_KINDS:
                t = checked_inputs[s.name] = inputs[s.name]
                if t.dtype == torch.int64:  # kernels read integer vectors as int32 (exact in fp32 below 2**24)
                    t = t.to(torch.int32)
                if s.kind == "pair_tile":  # the kernel reads each 16-bit pair as one 32-bit element
                    t = t.view(torch.float32)
                ld = t.stride(0) if s.kind in ("tile", "pair_tile") else 0
            else:
                t = output_tensor(s.name)
                if s.kind == "pair_store":
                    t = t.view(torch.float32)
                ld = t.stride(0) if t.dim() == 2 else 0
            tensors.append(t)
            lds.append(ld)
            values.append(value)
        checks.check_no_overlap(outputs, checked_inputs, given=out, aliases=aliases)
        checks.require_gpu(A)

        # the launch goes to the current device: made A's for the call where it is another one
        with torch.cuda.device(device) if device.index != torch.cuda.current_device() else _SAME_DEVICE:
            stream = _raw_stream(device)
            try:
                cfg = self.config
                load_binding().launch(self._run, self._workspace, A, W, D, tensors, lds, values, cfg.swizzle,
                                      RASTER_ORDERS[cfg.raster] | GRIDS[cfg.grid],
                                      self.sm_count, stream)
            except RuntimeError as e:
                raise LaunchError(f"{self!r}: {e}") from e
        result = Outputs()
        for name in self.output_names:
            result[name] = outputs[name]
        return result
