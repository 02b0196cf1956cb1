"""Per-shape config dispatch: an op that runs each call on the kernel config chosen for its
(N, K, M) on this GPU — remembered from tuning (per power-of-two M bucket), else the shape heuristic (tuning.py)."""
from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Iterable
from typing import Any

import torch

from .. import tuning
from ..config import KernelConfig
from ..errors import UnsupportedError
from ..graph.interpret import Outputs
from ..jit import build_kernels, kernel_source
from . import checks
from .interface import GraphOp
from .op import compile_config


class TunedOp(GraphOp):
    """Dispatches each call to the config chosen for its (N, K, M) on this GPU."""

    def __init__(self, graph: Any, dtype: Any, tune: bool,
                 candidates: tuple[KernelConfig, ...] = tuning.CANDIDATES, reps: int = 20,
                 time_fn: Callable[[Callable[[], Any], int], list[float]] = tuning.cuda_event_time_ms,
                 major: str = "kk"):
        self.graph, self.tune, self.major = graph, tune, major
        self.candidates = tuple(self._laid_out(c) for c in candidates)
        self.reps, self.time_fn = reps, time_fn
        first = self._first_source(graph, dtype)
        self.digest, self.dtype_name = first.graph.digest(), first.dtype
        self.epilogue = tuning.Epilogue.of(first.lowered)
        self.candidates = tuple(c for c in self.candidates if tuning.fits(c, self.epilogue))
        self._ops: dict[str, Any] = {}
        self._chosen: dict[tuple, Any] = {}  # (M tiles of 128, N, K, device) -> op, so a call reads no file
        layout = "" if major == "kk" else f"|{major}"
        self._init_interface(first.lowered, first.dtype,
                             f"{self.digest}|{first.dtype}|{'tune' if tune else 'auto'}{layout}")

    def __repr__(self) -> str:
        return (f"<coda_ext.TunedOp graph={self.digest} dtype={self.dtype} {'tune' if self.tune else 'auto'} "
                f"major={self.major} inputs={list(self.input_names)} outputs={list(self.output_names)}>")

    def _first_source(self, graph: Any, dtype: Any):
        """The kernel source of the first candidate the graph fits (the interface does not depend on the
        config; a heavy epilogue may not fit the first, 128x256, candidate's shared memory). No refusal is
        kept while the next is tried: a kept exception's traceback holds its callers' frames (a compiled
        graph's, with its tensors) in a reference cycle until the garbage collector runs, and CUDA graph trees
        find such tensors alive in their pool and then freed under them."""
        for c in self.candidates:
            try:
                return kernel_source(graph, dtype, c)
            except UnsupportedError:
                continue
        if not self.candidates:
            raise UnsupportedError("coda_ext: no kernel config to build this graph with")
        return kernel_source(graph, dtype, self.candidates[0])   # none fits: the first candidate's refusal

    def _laid_out(self, config: KernelConfig) -> KernelConfig:
        """The config with this op's operand layout."""
        return config if config.major == self.major else dataclasses.replace(config, major=self.major)

    @staticmethod
    def sms(A: Any) -> int:
        try:
            return torch.cuda.get_device_properties(A.device).multi_processor_count
        except Exception:  # noqa: BLE001  (no CUDA device at hand, CPU tests: assume an H100)
            return tuning.DEFAULT_SMS

    def config_for(self, M: int, N: int, K: int, sms: int = tuning.DEFAULT_SMS) -> KernelConfig:
        """The heuristic's choice for this graph (used where tuning has remembered nothing)."""
        return self._laid_out(tuning.heuristic(M, N, K, sms, self.epilogue, self.major))

    def op_for(self, config: KernelConfig):
        if config.tag not in self._ops:
            self._ops[config.tag] = compile_config(self.graph, self.dtype_name, config)
        return self._ops[config.tag]

    def choose(self, A: Any, W: Any, inputs: dict[str, Any], gpu: str) -> KernelConfig:
        M, K = A.shape
        N = W.shape[0]
        key = tuning.memory_key(self.digest, self.dtype_name, N, K, M, gpu, self.major)
        known = tuning.load_memory().get(key)
        if known and tuning.config_by_tag(known["config"], self.candidates):
            return tuning.config_by_tag(known["config"], self.candidates)
        if not self.tune:
            return self.config_for(M, N, K, self.sms(A))
        build_kernels([(self.graph, self.dtype_name, c) for c in self.candidates])  # all candidates, in parallel
        timings = {c.tag: statistics.median(self.time_fn(lambda c=c: self.op_for(c).run(A, W, inputs, {}),
                                                         self.reps))
                   for c in self.candidates}
        best = min(self.candidates, key=lambda c: timings[c.tag])
        tuning.remember(key, best.tag, timings)
        return best

    def launch(self, A: Any, W: Any, inputs: dict[str, Any], out: dict[str, Any], M: int, N: int,
               aliases: dict[str, str] | None = None) -> Outputs:
        """After check_call, and before any tuning: no given output overlapping another tensor (but for
        `aliases`, as CompiledOp.launch), an SM90 GPU; then the op of the config chosen for this shape launches."""
        where = (-(-M // 128), N, A.shape[1], A.device.index)   # what the heuristic reads of M: its tiles
        op = self._chosen.get(where)
        if op is None:  # first call of this shape class in this process (the op's launch checks again after)
            tensors = {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}
            checks.check_no_overlap(out, {"A": A, "W": W, **tensors}, aliases=aliases)
            checks.require_gpu(A)
            op = self._chosen[where] = self.op_for(self.choose(A, W, inputs, torch.cuda.get_device_name(A.device)))
        return op.launch(A, W, inputs, out, M, N, aliases)

    def prebuild_items(self) -> list[tuple[Any, Any, KernelConfig]]:
        """What this op may compile: the heuristic's configs, or every candidate when tuning."""
        configs = self.candidates if self.tune else tuning.heuristic_configs(self.epilogue, self.major)
        return [(self.graph, self.dtype_name, self._laid_out(c)) for c in configs]


def auto_items(gemms: Iterable[tuple[Any, str, tuple[int, int, int]]], dtype: Any = "bfloat16",
               sms: int | None = None) -> list[tuple[Any, Any, KernelConfig]]:
    """(graph, dtype, config) of the kernel config="auto" launches for each (graph, major, (M, N, K) as
    launched), without repeats: what to prebuild before running ops at known shapes. sms: the GPU's
    SM count (default: this machine's GPU, else an H100's)."""
    if sms is None:
        sms = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() \
            else tuning.DEFAULT_SMS
    items: dict = {}
    for graph, major, mnk in gemms:
        cfg = TunedOp(graph, dtype, tune=False, major=major).config_for(*mnk, sms)
        items[(graph.build().digest(), str(dtype), cfg.tag)] = (graph, dtype, cfg)
    return list(items.values())
