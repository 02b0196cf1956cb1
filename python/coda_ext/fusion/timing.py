"""Measured vetoes: a fused kernel slower than what it replaces is left to the fallback.

The partition objective counts bytes kept on chip (cost.py). Where a GEMM's mainloop is short (K of a few
hundred) its epilogue is not hidden behind it, and a kernel that keeps bytes on chip can still take longer
than the bare GEMM followed by the fallback's element-wise kernel for the same work (BERT's N-major layer-norm
backward epilogues at K = 768 ran 2-3.6x their cuBLAS GEMM). So, on a GPU, each distinct fused kernel of a
partition is timed at its GEMM shape against the bare cuBLAS GEMM of the same shape and operand layout
(interleaved, medians), and every GEMM whose fused kernel is slower than that GEMM plus the fallback's kernel
(the IO model's bound at the fallback's efficiency: CostModel.slower) takes no epilogue when the graph is
partitioned again (frontend.fuse_graph, up to MAX_ROUNDS times).

verdicts(lowered, cost, timer) -> [Verdict]: one per fused GEMM of the partition, with its times.
gpu_timer(site, (M, N, K)) -> (fused_s, gemm_s): the measurement, on this process's GPU, cached per kernel and
shape (random inputs of the kernel's signature; the kernel config "auto" takes there, as the launch will).
"""
from __future__ import annotations

import dataclasses
import statistics
import warnings
from collections.abc import Callable, Iterable
from typing import Any

from ..errors import CodaError
from .cost import CostModel
from .op import Site

#: Partitions after the first that a graph may get from vetoes (each can fuse other GEMMs, to be timed again).
MAX_ROUNDS = 3
#: Timed calls of each kernel and of its GEMM (interleaved, after one warm-up call each).
REPS = 10

Timer = Callable[[Site, tuple[int, int, int]], tuple[float, float]]


@dataclasses.dataclass(frozen=True)
class Verdict:
    """One fused GEMM's measurement: the fused kernel and the bare GEMM (measured), the fallback's kernel for
    the epilogue's work (the IO model's bound), and whether the epilogue is left to the fallback."""

    anchor: str
    kernel: str                  # digest of the fused kernel's graph
    mnk: tuple[int, int, int]
    fused_s: float
    gemm_s: float
    fallback_s: float
    slow: bool

    def __str__(self) -> str:
        M, N, K = self.mnk
        verdict = "left to the fallback" if self.slow else "kept"
        return (f"{self.anchor} {M}x{N}x{K} kernel {self.kernel[:8]}: fused {self.fused_s * 1e6:.1f} us against the "
                f"GEMM's {self.gemm_s * 1e6:.1f} us + the fallback's {self.fallback_s * 1e6:.1f} us (IO model): "
                f"{verdict}")

    def to_dict(self) -> dict[str, Any]:
        return {"anchor": self.anchor, "kernel": self.kernel, "mnk": list(self.mnk), "fused_us": self.fused_s * 1e6,
                "gemm_us": self.gemm_s * 1e6, "fallback_us": self.fallback_s * 1e6, "slow": self.slow}


def verdicts(anchors: Iterable[tuple[str, Site, tuple[int, int, int]]], cost: CostModel, timer: Timer,
             seen: dict[Any, tuple[float, float, float] | None] | None = None) -> list[Verdict]:
    """A Verdict for each (anchor name, site, (M, N, K)) of a partition's fused GEMMs; each distinct kernel and
    shape is timed once (once across calls given the same `seen`). fp32 kernels (they run in the interpreter)
    are neither timed nor vetoed."""
    out: list[Verdict] = []
    seen = {} if seen is None else seen
    for name, site, mnk in anchors:
        key = (site.kernel_key, mnk)
        if key not in seen:
            seen[key] = None
            if site.dtype in ("bfloat16", "float16"):
                try:
                    fused_s, gemm_s = timer(site, mnk)
                except CodaError as e:   # not built (its launch says why): kept, as without a measurement
                    warnings.warn(f"coda fusion: kernel {site.graph.digest()[:8]} at {mnk} was not timed ({e})",
                                  stacklevel=2)
                    continue
                seen[key] = (fused_s, gemm_s, cost.kernel(site.graph, site.dtype, mnk).fallback_s)
        if seen[key] is not None:
            f, g, fb = seen[key]
            out.append(Verdict(name, site.graph.digest(), mnk, f, g, fb, cost.slower(f, g, fb)))
    return out


_MEASURED: dict[Any, tuple[float, float]] = {}


def gpu_timer(site: Site, mnk: tuple[int, int, int]) -> tuple[float, float]:
    """(fused kernel, bare cuBLAS GEMM) seconds at (M, N, K) on the current CUDA device, medians of REPS
    measurements each (of CALLS calls queued behind a GPU wait), interleaved; cached per (kernel, shape, device)
    for the process. The kernel must be built (the caller prebuilds: a build here would run serially)."""
    import torch
    from torch.utils._python_dispatch import _disable_current_modes

    from ..runtime.tuned import TunedOp

    device = torch.cuda.current_device()
    key = (site.kernel_key, mnk, device)
    if key in _MEASURED:
        return _MEASURED[key]
    M, N, K = mnk
    with _disable_current_modes(), torch.no_grad():   # real tensors, under whatever mode traces the graph
        tuned = TunedOp(site.graph, site.dtype, tune=False, major=site.major)
        op = tuned.op_for(tuned.config_for(M, N, K, TunedOp.sms(torch.empty(0, device="cuda"))))
        dtype = getattr(torch, site.dtype)
        sets = [_sample(op, M, N, K, dtype, site.major, seed) for seed in (0, 1)]
        outs = [torch.empty(M, N, dtype=dtype, device="cuda") for _ in sets]
        fused: list[float] = []
        gemm: list[float] = []
        for r in range(REPS):
            A, W, inputs = sets[r % 2]
            fused.append(_gpu_ms(lambda A=A, W=W, inputs=inputs: op.run(A, W, inputs, {})))
            gemm.append(_gpu_ms(lambda A=A, W=W, o=outs[r % 2]: torch.mm(A, W.t(), out=o)))
        _MEASURED[key] = (statistics.median(fused) * 1e-3, statistics.median(gemm) * 1e-3)
    return _MEASURED[key]


#: Calls per timed measurement, and the GPU wait queued before them (clock cycles, about 0.5 ms): the host
#: queues every call while the GPU waits, so its launch time stays out of the GPU's.
CALLS = 4
WAIT_CYCLES = 1_000_000


def _gpu_ms(fn: Callable[[], Any]) -> float:
    """Milliseconds of GPU time per call of fn, CALLS calls queued behind a GPU wait (after one warm-up call)."""
    import torch

    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(WAIT_CYCLES)
    start.record()
    for _ in range(CALLS):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / CALLS


def _sample(op: Any, M: int, N: int, K: int, dtype: Any, major: str, seed: int) -> tuple[Any, Any, dict[str, Any]]:
    """Operands in the layout `major` reads them (A (M, K), W (N, K), each of unit-order products) and random
    values for every input of the compiled op: integer vectors in [0, N), bytes in [0, 256), scalars 0.5."""
    import torch

    from ..graph.interpret import torch_dtype

    gen = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape: int, dt: Any = dtype, scale: float = 1.0) -> Any:
        return (torch.randn(*shape, generator=gen, device="cuda", dtype=torch.float32) * scale).to(dt)

    A, W = randn(M, K, scale=K ** -0.25), randn(N, K, scale=K ** -0.25)
    if major[0] == "m":
        A = A.t().contiguous().t()
    if major[1] == "n":
        W = W.t().contiguous().t()
    inputs: dict[str, Any] = {}
    for s in op.slots:
        if s.kind == "scalar" and s.mode == "pointer":
            inputs[s.name] = torch.full((1,), 0.5, dtype=torch.float32, device="cuda")
        elif s.kind == "scalar":
            inputs[s.name] = 0.5
        elif s.name in op.input_names:
            dt = torch_dtype(s.dtype) if s.dtype else dtype
            shape = op.input_shape(s.name, M, N)
            if dt.is_floating_point:
                inputs[s.name] = randn(*shape, dt=dt)
            else:
                high = 256 if dt == torch.uint8 else max(N, 2)
                inputs[s.name] = torch.randint(0, high, shape, generator=gen, device="cuda", dtype=dt)
    return A, W, inputs
