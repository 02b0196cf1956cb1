"""Measured vetoes: a fused kernel slower than what it replaces is left to the fallback.

The partition objective counts bytes kept on chip (cost.py). Where a GEMM's mainloop is short (K of a few
hundred) its epilogue is not hidden behind it, and a kernel that keeps bytes on chip can still take longer
than the bare GEMM followed by the fallback's element-wise kernel for the same work (BERT's N-major layer-norm
backward epilogues at K = 768 ran 2-3.6x their cuBLAS GEMM). So, on a GPU, each distinct fused kernel of a
partition is timed at its GEMM shape against the bare cuBLAS GEMM of the same shape and operand layout
(interleaved, medians). A kernel slower than that GEMM plus the fallback's kernel (the IO model's bound at the
fallback's efficiency: CostModel.slower) is vetoed and the graph partitioned again (frontend.fuse_graph; up to
MAX_ROUNDS more partitions that time new kernels, MAX_PARTITIONS in all): a GEMM that took a folded layer norm first
has the fold undone (the layer norm runs as before, the GEMM keeps an epilogue of its own, timed in the next
round); any other takes no epilogue.

verdicts(anchors, cost, timer) -> [Verdict]: one per fused GEMM of the partition, with its times.
gpu_timer(site, (M, N, K), device) -> (fused_s, gemm_s): the measurement on a GPU, cached per kernel, shape and
device (random inputs of the kernel's signature; the kernel a call at that shape launches).
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import warnings
from collections.abc import Callable, Iterable
from typing import Any

from .cost import CostModel
from .op import Site

#: Partitions after the first that may time kernels not timed before (each can fuse other GEMMs, to be built and
#: timed); a partition whose kernels were all timed already (a vetoed epilogue's math moved to another GEMM, the same
#: kernel there) does not count, up to MAX_PARTITIONS partitions in all.
MAX_ROUNDS = 3
MAX_PARTITIONS = 8
#: Timed calls of each kernel and of its GEMM (interleaved, after one warm-up call each).
REPS = 10

Timer = Callable[[Site, tuple[int, int, int]], tuple[float, float]]
#: The dtypes whose fused kernels are compiled, timed and vetoed (fp32 ones run in the interpreter).
KERNEL_DTYPES = ("bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class Verdict:
    """One fused GEMM's measurement: the fused kernel and the bare GEMM (measured), the fallback's kernel for
    the epilogue's work (the IO model's bound), whether the kernel is slower than their line (CostModel.slower),
    and, for a veto, what was done (`action`) and in which partition of the graph (`round`: its GEMM names)."""

    anchor: str                  # the GEMM's name in that round's graph
    gemm: str                    # its identity across rounds (fx_util.GEMM_ID)
    kernel: str                  # digest of the fused kernel's graph
    mnk: tuple[int, int, int]
    fused_s: float
    gemm_s: float
    fallback_s: float
    slow: bool
    action: str = ""
    round: int = 0

    def __str__(self) -> str:
        M, N, K = self.mnk
        what = self.action if self.action else (
            "slower, kept: the veto's partitions ran out" if self.slow else "kept")
        where = f"round {self.round}: " if self.action else ""
        return (f"{where}{self.anchor} {M}x{N}x{K} kernel {self.kernel[:8]}: fused {self.fused_s * 1e6:.1f} us "
                f"against the GEMM's {self.gemm_s * 1e6:.1f} us + the fallback's {self.fallback_s * 1e6:.1f} us "
                f"(IO model): {what}")

    def to_dict(self) -> dict[str, Any]:
        """The verdict as JSON-ready data (times in µs; action and round where it was a veto)."""
        out = {"anchor": self.anchor, "gemm": self.gemm, "kernel": self.kernel, "mnk": list(self.mnk),
               "fused_us": self.fused_s * 1e6, "gemm_us": self.gemm_s * 1e6, "fallback_us": self.fallback_s * 1e6,
               "slow": self.slow}
        return {**out, "action": self.action, "round": self.round} if self.action else out


def verdicts(anchors: Iterable[tuple[str, str, Site, tuple[int, int, int]]], cost: CostModel, timer: Timer,
             seen: dict[Any, tuple[float, float, float] | None] | None = None, partition_round: int = 0
             ) -> list[Verdict]:
    """A Verdict for each (anchor name, GEMM identity, site, (M, N, K)) of a partition's fused GEMMs; each distinct
    kernel and shape is timed once (once across calls given the same `seen`). fp32 kernels (they run in the
    interpreter) are neither timed nor vetoed, and a kernel the timer fails on is kept, with a warning."""
    out: list[Verdict] = []
    seen = {} if seen is None else seen
    for name, gemm, site, mnk in anchors:
        key = (site.kernel_key, mnk)
        if key not in seen:
            seen[key] = None
            if site.dtype in KERNEL_DTYPES:
                try:
                    fused_s, gemm_s = timer(site, mnk)
                except Exception as e:  # noqa: BLE001  (a measurement is advice: the kernel stays fused, said)
                    warnings.warn(f"coda fusion: kernel {site.graph.digest()[:8]} at {mnk} was not timed, it stays "
                                  f"fused ({type(e).__name__}: {e})", stacklevel=2)
                    continue
                seen[key] = (fused_s, gemm_s, cost.kernel(site.graph, site.dtype, mnk, major=site.major).fallback_s)
        if seen[key] is not None:
            f, g, fb = seen[key]
            out.append(Verdict(name, gemm, site.graph.digest(), mnk, f, g, fb, cost.slower(f, g, fb),
                               round=partition_round))
    return out


_MEASURED: dict[Any, tuple[float, float]] = {}
#: The share of the device's free memory one measurement's tensors may take; above it the kernel is not timed.
MEMORY_SHARE = 0.5


def gpu_timer(site: Site, mnk: tuple[int, int, int], device: Any = None) -> tuple[float, float]:
    """(fused kernel, bare cuBLAS GEMM) seconds at (M, N, K) on `device` (default: the current CUDA device),
    medians of REPS measurements each (CALLS calls queued behind a GPU wait, alternating between two input sets
    so that neither call finds the other's data in L2), interleaved; cached per (kernel, shape, device) for the
    process. The kernel launched is the one a call at that shape launches (TunedOp.choose: a remembered tuning,
    else the heuristic's); the caller prebuilds (a build here runs serially). Raises MemoryError where the
    tensors would take more than MEMORY_SHARE of the device's free memory (one input set then, if it fits)."""
    import torch
    from torch.utils._python_dispatch import _disable_current_modes

    from ..runtime.tuned import TunedOp

    device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    key = (site.kernel_key, mnk, device.index)
    if key in _MEASURED:
        return _MEASURED[key]
    M, N, K = mnk
    with _disable_current_modes(), torch.no_grad(), torch.cuda.device(device):   # real tensors, whatever traces
        tuned = TunedOp(site.graph, site.dtype, tune=False, major=site.major)
        dtype = getattr(torch, site.dtype)
        free = torch.cuda.mem_get_info(device)[0]
        one = _set_bytes(tuned, M, N, K, dtype.itemsize)
        if one > MEMORY_SHARE * free:
            raise MemoryError(f"its tensors need {one / 1e9:.2f} GB, more than {MEMORY_SHARE:.0%} of the "
                              f"{free / 1e9:.2f} GB free")
        sets = [_sample(tuned, M, N, K, dtype, site.major, seed) for seed in range(2 if 2 * one <= MEMORY_SHARE * free
                                                                                   else 1)]
        op = tuned.op_for(tuned.choose(*sets[0], torch.cuda.get_device_name(device)))
        outs = [torch.empty(M, N, dtype=dtype, device="cuda") for _ in sets]
        fused_fns = [lambda A=A, W=W, inputs=inputs: op.run(A, W, inputs, {}) for A, W, inputs in sets]
        gemm_fns = [lambda A=A, W=W, o=o: torch.mm(A, W.t(), out=o) for (A, W, _), o in zip(sets, outs, strict=True)]
        fused: list[float] = []
        gemm: list[float] = []
        for _ in range(REPS):
            fused.append(_gpu_ms(fused_fns))
            gemm.append(_gpu_ms(gemm_fns))
        _MEASURED[key] = (statistics.median(fused) * 1e-3, statistics.median(gemm) * 1e-3)
        del sets, outs, fused_fns, gemm_fns
        torch.cuda.empty_cache()
    return _MEASURED[key]


def _set_bytes(op: Any, M: int, N: int, K: int, itemsize: int) -> int:
    """About what one measurement's input set and outputs take: A, W, every tensor input (4-byte elements at most),
    every output as M x N fp32 (a pair store's M x 2N 16-bit values alike) and the GEMM's M x N."""
    inputs = sum(4 * math.prod(op.input_shape(s.name, M, N) or (1,)) for s in op.slots
                 if s.name in op.input_names and s.kind != "scalar")
    return (M + N) * K * itemsize + inputs + (4 * len(op.output_names) + itemsize) * M * N


#: Calls per timed measurement, and the GPU wait queued before them (clock cycles, about 1 ms): the host queues
#: every call while the GPU waits, so its launch time stays out of the GPU's. Where the wait ended before the host
#: had queued the calls (the GPU may then have waited on the host, whose time would be measured), the measurement is
#: taken again behind a wait WAIT_GROWTH times as long, up to MAX_WAIT_CYCLES.
CALLS = 4
WAIT_CYCLES = 2_000_000
WAIT_GROWTH = 4
MAX_WAIT_CYCLES = 128_000_000


def _gpu_ms(fns: list[Callable[[], Any]]) -> float:
    """Milliseconds of GPU time per call, CALLS calls (cycling through fns) queued behind a GPU wait, after one
    warm-up call of each. The wait lengthens until it outlasts the host's queueing (the start event still pending
    once every call is queued); at MAX_WAIT_CYCLES the host-bound time is returned, with a warning."""
    import torch

    for fn in fns:
        fn()
    wait = WAIT_CYCLES
    while True:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(wait)
        start.record()
        for i in range(CALLS):
            fns[i % len(fns)]()
        end.record()
        host_bound = start.query()   # the wait ended before the host had queued the calls and the end event
        end.synchronize()
        if not host_bound:
            return start.elapsed_time(end) / CALLS
        if wait >= MAX_WAIT_CYCLES:
            warnings.warn(f"coda fusion: {CALLS} calls took the host longer to queue than a GPU wait of {wait} "
                          "cycles: the time measured includes the host's", stacklevel=2)
            return start.elapsed_time(end) / CALLS
        wait *= WAIT_GROWTH


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
