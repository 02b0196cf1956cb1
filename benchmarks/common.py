"""What the benchmarks share: the environment record, interleaved timing with L2 flushes, ratios,
peak memory, results files. Their inputs come from tests.helpers.rand (the tests' factories).

Method (docs/design.md, "How speed is judged"): every variant runs in one process, interleaved, each call
timed with CUDA events on inputs rotated between two sets; L2 is flushed before every timed call;
figures are medians of per-round ratios to the bare cuBLAS GEMM of the same shape.
"""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import statistics
import subprocess
import time
from typing import Any

from coda_ext.jit import paths

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"


def gpu_tag(name: str | None) -> str:
    """'h100', 'h200', … from a GPU's name (its model), 'cpu' without one: the results file's suffix. A model's
    other forms keep their own files: 'h100_pcie', 'h100_nvl' (other memory, other clocks than the SXM part)."""
    if not name:
        return "cpu"
    m = re.search(r"\b([A-Z]{1,2}\d{2,4})\b", name)
    if not m:
        return re.sub(r"\W+", "_", name).lower()
    form = next((f"_{f.lower()}" for f in ("PCIe", "NVL") if re.search(rf"\b{f}\b", name, re.IGNORECASE)), "")
    return m.group(1).lower() + form


def results_path(stem: str, suffix: str = ".json", gpu: str | None = None) -> pathlib.Path:
    """RESULTS / f"{stem}_{tag}{suffix}": tag is gpu_tag(gpu) for a GPU's name, else that of the GPU
    this process runs on (torch.cuda.get_device_name()), "cpu" without one. Results measured on an
    H200 thus land in *_h200 files, never in the committed *_h100 ones."""
    if gpu is None:
        import torch

        gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return RESULTS / f"{stem}_{gpu_tag(gpu)}{suffix}"


def gpu_info() -> dict:
    """The environment a result is recorded with: GPU, SMs, versions, commit, date, clocks."""
    import torch

    info = {
        "gpu": torch.cuda.get_device_name(),
        "sms": torch.cuda.get_device_properties(0).multi_processor_count,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cutlass": paths.cutlass_version(),
        "nvcc": paths.nvcc_version(),
        "commit": commit(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    try:
        q = "clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu"
        out = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
        info["nvidia_smi"] = {"query": q, "value": out}
    except (OSError, subprocess.SubprocessError) as e:  # nvidia-smi missing or hung: record why
        info["nvidia_smi"] = f"unavailable: {e}"
    return info


#: nvidia-smi's query of clocks_while: one CSV line per sample
CLOCK_QUERY = "timestamp,clocks.sm,power.draw,temperature.gpu"


def clock_summary(lines: list[str], min_watts: float = 600.0) -> dict:
    """Mean SM clock (MHz) and power (W) of nvidia-smi samples (CLOCK_QUERY lines) drawing more than min_watts
    (the GPU at work, not between calls)."""
    rows = []
    for line in lines:
        f = [x.strip() for x in line.split(",")]
        try:
            rows.append((float(f[1].split()[0]), float(f[2].split()[0])))
        except (IndexError, ValueError):
            continue
    busy = [r for r in rows if r[1] > min_watts]
    if not busy:
        return {"samples": len(rows), "busy_samples": 0}
    return {"samples": len(rows), "busy_samples": len(busy), "min_watts": min_watts,
            "mean_sm_mhz": statistics.mean(r[0] for r in busy), "mean_watts": statistics.mean(r[1] for r in busy)}


@contextlib.contextmanager
def nvidia_smi_samples(stream, period_ms: int = 100):
    """nvidia-smi writes a CLOCK_QUERY line to `stream` every period_ms while inside (OSError where it cannot run)."""
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={CLOCK_QUERY}", "--format=csv,noheader",
                            "-lms", str(period_ms)], stdout=stream, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        smi.terminate()
        smi.wait()


def clocks_while(fn, seconds: float = 2.0, period_ms: int = 100) -> dict | None:
    """clock_summary of nvidia-smi sampled every period_ms while fn() runs again and again for about `seconds`
    (synchronized at the end); None where nvidia-smi cannot run."""
    import tempfile

    import torch

    with tempfile.TemporaryFile("w+") as f:
        with contextlib.ExitStack() as sampling:
            try:
                sampling.enter_context(nvidia_smi_samples(f, period_ms))
            except OSError:
                return None
            start = time.perf_counter()
            while time.perf_counter() - start < seconds:
                fn()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
        f.seek(0)
        return clock_summary(f.read().splitlines())


def commit() -> str:
    """The commit results are recorded against: $CODA_COMMIT (or $CODA_BENCH_COMMIT) where the tree was
    copied to the machine without its git metadata (or with stale metadata), else `git rev-parse HEAD`, with
    "+modified" where the tracked files differ from that commit (uncommitted changes, or a copy whose git
    metadata is older than its files): such results are not that commit's."""
    named = os.environ.get("CODA_COMMIT") or os.environ.get("CODA_BENCH_COMMIT")
    if named:
        return named

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=HERE, timeout=10).stdout.strip()

    try:
        head = git("rev-parse", "HEAD")
        if not head:
            return "unknown"
        return head + ("+modified" if git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.SubprocessError):  # no git, or it hung
        return "unknown"


def write_json(path: Any, doc: Any, **dumps: Any) -> pathlib.Path:
    """Writes a results file (its folder made if missing), indented as every results file is."""
    out = pathlib.Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, **dumps) + "\n")
    return out


#: GPU cycles of busy-waiting queued between the L2 flush and the start event (~1 ms), so the
#: CPU has queued all kernels of the timed call before its start event fires: the events then
#: time GPU work only, not Python, guard and launch overhead (which differs between variants and
#: between host machines, and dominates at small shapes). 0.2 ms proved too short on a slow host
#: for torch.compile and for ops that launch a finalize kernel after the GEMM.
LEAD_CYCLES = 2_000_000


def compile_for_one_shape(fn, max_autotune: bool = False, backend=None):
    """torch.compile of `fn` for the calls of one shape: dynamo is reset first and shapes are
    static. Dynamo counts recompilations per code object for the whole process, so one compiled
    reference reused across shapes and graphs silently runs eagerly once the recompile limit
    (8) is reached. `backend` replaces inductor (tests)."""
    import torch

    torch._dynamo.reset()
    if backend is not None:
        return torch.compile(fn, dynamic=False, backend=backend)
    return torch.compile(fn, dynamic=False, mode="max-autotune" if max_autotune else None)


def time_interleaved(variants: dict, reps: int, warmup: int = 5, flush_l2: bool = True) -> dict[str, list[float]]:
    """{name: [ms per round]}: every round runs every variant once on rotated input sets, starting
    at a different variant each round; L2 is flushed (256 MB written) before every timed call, so
    no variant inherits another's cached operands (flush_l2=False: warm L2); a queued GPU wait
    (LEAD_CYCLES) keeps host overhead out of the timed span."""
    import torch

    names = list(variants)
    flush = torch.empty(256 * 2**20 if flush_l2 else 1, dtype=torch.int8, device="cuda")
    times = {k: [] for k in names}
    for r in range(warmup + reps):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            if flush_l2:
                flush.zero_()
            torch.cuda._sleep(LEAD_CYCLES)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            variants[name](r % 2)
            end.record()
            end.synchronize()
            if r >= warmup:
                times[name].append(start.elapsed_time(end))
    return times


#: Milliseconds of back-to-back calls per timed block of time_sustained, and of the warm-up that brings the
#: GPU to its power limit first: a training step runs its GEMMs back to back at the limit (an H200 at 690-700 W
#: ran a Llama step at 1400-1550 MHz; docs/measured.md), where a call timed alone after a pause runs at boost
#: clocks, so the two rank configs differently when their energy per FLOP differs.
SUSTAINED_BLOCK_MS = 100.0
SUSTAINED_HEAT_MS = 400.0


def block_calls(call_ms: float, block_ms: float = SUSTAINED_BLOCK_MS) -> int:
    """Calls of `call_ms` each that fill a block of about block_ms (at least 3)."""
    return max(3, round(block_ms / max(call_ms, 1e-3)))


def time_sustained(variants: dict, reps: int, warmup: int = 1, block_ms: float = SUSTAINED_BLOCK_MS,
                   heat_ms: float = SUSTAINED_HEAT_MS) -> dict[str, list[float]]:
    """{name: [ms per call]} at the GPU's sustained clocks: the GPU is first kept busy for heat_ms (the variants
    in turn), then every round times each variant (rotated) as a block of back-to-back calls filling about
    block_ms, on alternating input sets, warm L2 and no pause between blocks (as a training step runs its
    kernels); a round's entry is the block's time over its calls."""
    import torch

    names = list(variants)
    calls = {}
    for name in names:   # one call each (compiles, allocations), then the block size from a timed call
        variants[name](0)
        calls[name] = block_calls(statistics.median(event_ms(lambda n=name: variants[n](1)) for _ in range(3)),
                                  block_ms)
    start = time.perf_counter()
    while (time.perf_counter() - start) * 1e3 < heat_ms:
        for name in names:
            _block(variants[name], calls[name])
    times = {k: [] for k in names}
    for r in range(warmup + reps):
        for name in names[r % len(names):] + names[:r % len(names)]:
            ms = _block(variants[name], calls[name])
            if r >= warmup:
                times[name].append(ms / calls[name])
    torch.cuda.synchronize()
    return times


def event_ms(fn) -> float:
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def _block(fn, calls: int) -> float:
    """ms of `calls` back-to-back calls of fn(i) (i alternating 0, 1), the host queueing ahead."""
    return event_ms(lambda: [fn(i % 2) for i in range(calls)])


def time_interleaved_cpu(variants: dict, reps: int, warmup: int = 5) -> dict[str, list[float]]:
    """time_interleaved's rounds on the CPU: the same rotation, wall-clock ms per call."""
    names = list(variants)
    times: dict[str, list[float]] = {k: [] for k in names}
    for r in range(warmup + reps):
        for name in names[r % len(names):] + names[:r % len(names)]:
            start = time.perf_counter()
            variants[name](r % 2)
            if r >= warmup:
                times[name].append((time.perf_counter() - start) * 1e3)
    return times


def summarize(times: dict[str, list[float]], baseline: str) -> dict:
    out = {}
    for name, ts in times.items():
        ratios = sorted(t / b for t, b in zip(ts, times[baseline]))
        q = len(ratios) // 4
        out[name] = {"median_ms": statistics.median(ts), "median_ratio_to_cublas": statistics.median(ratios),
                     "ratio_iqr": [ratios[q], ratios[-q - 1]], "min_ms": min(ts)}
    return out


def relative_gaps(curve: list[float], ref: list[float]) -> list[float]:
    """|curve - ref| / |ref| at each step (of two loss curves, over the shorter one)."""
    return [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(curve, ref)]


def is_kernel(event) -> bool:
    """A torch.profiler event that is a GPU kernel (or copy): not a CPU op, and not the GPU-side annotation a
    record_function range also leaves on the timeline (counting it would count its kernels twice)."""
    from torch.autograd import DeviceType

    return event.device_type != DeviceType.CPU and not getattr(event, "is_user_annotation", False)


def kernel_label(name: str, width: int = 120, known: dict[str, str] | None = None) -> str:
    """A kernel's name for a table: `known`'s label for it (coda_ext.runtime.kernel_symbols(): this package's
    kernels by graph and config), else the name whole up to `width` characters, else its first width - 12 and a
    hash of the whole (CUTLASS kernels differ only far into their mangled names: cut short they would all be one
    row)."""
    import hashlib

    if known and name in known:
        return known[name]
    if len(name) <= width:
        return name
    return f"{name[:width - 12]} #{hashlib.sha1(name.encode()).hexdigest()[:10]}"


def busy_and_idle(kernels) -> tuple[float, float]:
    """(ms some kernel ran, ms none did) between the first kernel's start and the last one's end: the idle
    part is the GPU waiting for the host (launches, synchronisations) within the profiled step."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in kernels)
    if not spans:
        return 0.0, 0.0
    busy, (start, end) = 0.0, spans[0]
    for a, b in spans[1:]:
        if a > end:
            busy += end - start
            start, end = a, b
        else:
            end = max(end, b)
    busy += end - start
    last = max(b for _, b in spans)
    return busy / 1e3, (last - spans[0][0] - busy) / 1e3


def peak_memory_gb(fn) -> tuple[float, float]:
    """(peak, peak without what fn returns): GB allocated during fn(0) above what was allocated
    before it (fn's result is a tensor or a tuple of tensors, e.g. the gradients a step returns)."""
    import gc

    import torch

    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn(0)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    outs = out if isinstance(out, (tuple, list)) else (out,)
    returned = sum(t.numel() * t.element_size() for t in outs if isinstance(t, torch.Tensor))
    del out, outs
    return peak / 1e9, (peak - returned) / 1e9


def write_trace(prof, path) -> str:
    """The profile's Chrome trace, gzipped, at path (its folder made); returns the file's name."""
    import gzip
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        raw = pathlib.Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(raw))
        with open(raw, "rb") as src, gzip.open(path, "wb") as dst:
            dst.write(src.read())
    return path.name
