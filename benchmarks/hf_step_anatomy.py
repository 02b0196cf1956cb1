"""Where a Hugging Face Llama training step's time goes besides its kernels (one variant of bench_hf_training):
the GPU's clocks and power while steps run back to back, the host's own time to issue a step, and the GPU's idle
gaps between kernels.

    python -m benchmarks.hf_step_anatomy [--model llama-1b] [--layers 8] [--variant coda|liger|eager]

Measured, after 4 warm-up steps (batch 8 x 2048 tokens, AdamW):
- step_lead_ms / step_nolead_ms: 10 steps each timed alone (CUDA events), with and without a queued GPU wait
  before it (common.LEAD_CYCLES, so the host runs ahead), and back_to_back_ms: 10 steps in one span, twice;
- host_only: 5 steps issued while the GPU sleeps (~0.6 s queued ahead of them), the LM head's range check
  (coda_ext.ops.lm_head_ce, the one host read of a coda step) answered without waiting: the host's time per
  phase (forward, backward, optimizer) with no wait on the GPU in it, and the GPU time those steps took;
- profile: torch.profiler over 3 consecutive steps: busy and idle ms, the longest gaps with the kernels around
  them, the kernels by time per step;
- clocks: nvidia-smi sampled every 100 ms through all of it (a CSV beside the JSON); summary: the mean SM clock
  and power over the samples drawing more than 600 W (the steps).
Results: the hf_step_anatomy_<variant>_<model>_<gpu> JSON in benchmarks/results/ (--out to choose).
"""
from __future__ import annotations

import argparse
import itertools
import json
import pathlib
import statistics
import time

from benchmarks import bench_hf_training as hf
from benchmarks import common

#: GPU cycles of sleep queued ahead of a host-only step (~0.6 s at 1.98 GHz): the host issues the whole step
#: before the GPU starts it
HOST_ONLY_SLEEP_CYCLES = 1_200_000_000


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.hf_step_anatomy", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama-1b", choices=list(hf.MODELS))
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--variant", default="coda", choices=["coda", "liger", "eager"])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def make_variant(args) -> tuple[dict, list]:
    import torch

    from coda_ext.hf import apply_coda_to_llama

    cfg = hf.hf_config(args.model, args.layers, False)
    model = hf.base_model(cfg, "cuda", torch.bfloat16)
    call, kwargs = model, hf.NO_CACHE
    if args.variant == "coda":
        call, kwargs = apply_coda_to_llama(model, impl="auto"), {}
        model = call
    elif args.variant == "liger":
        call, _ = hf.liger_variant(model)
    variant = {"call": call, "opt": hf.make_optimizer(model, "cuda", 3e-4), "kwargs": kwargs}
    return variant, hf.batches(cfg, args, 2, seed=1, device="cuda")


def timed_steps(variant, data, n: int, lead: bool) -> list[float]:
    import torch

    out = []
    for i in range(n):
        torch.cuda.synchronize()
        if lead:
            torch.cuda._sleep(common.LEAD_CYCLES)
        out.append(common.event_ms(lambda i=i: hf.train_step(variant, data[i % 2])))
    return out


def host_only(variant, data, n: int = 5) -> dict:
    import torch

    from coda_ext.ops import lm_head_ce

    host, gpu = [], []
    passed = lm_head_ce._RangeCheck.passed
    lm_head_ce._RangeCheck.passed = lambda self: True   # the step's one host read, answered without waiting
    try:
        for i in range(n):
            torch.cuda.synchronize()
            torch.cuda._sleep(HOST_ONLY_SLEEP_CYCLES)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            stamps = [time.perf_counter()]
            start.record()
            hf.train_step(variant, data[i % 2], after=lambda k: stamps.append(time.perf_counter()))
            end.record()
            ahead = not start.query()   # the GPU still asleep: the host issued the whole step before it began
            end.synchronize()
            host.append([(b - a) * 1e3 for a, b in itertools.pairwise(stamps)])
            gpu.append(start.elapsed_time(end))
            if not ahead:
                print("host_only: the GPU woke before the host had issued the step", flush=True)
    finally:
        lm_head_ce._RangeCheck.passed = passed
    return {"host_phases_ms": dict(zip(hf.PHASES, (statistics.median(x) for x in zip(*host)))),
            "gpu_ms": statistics.median(gpu), "rounds": {"host": host, "gpu": gpu}}


def profile(variant, data, steps: int = 3) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(steps):
            hf.train_step(variant, data[i % 2])
        torch.cuda.synchronize()
    kernels = sorted((e for e in prof.events() if common.is_kernel(e) and e.time_range.end > e.time_range.start),
                     key=lambda e: e.time_range.start)
    gaps, end, before = [], kernels[0].time_range.end, kernels[0].name
    for e in kernels[1:]:
        if e.time_range.start > end:
            gaps.append(((e.time_range.start - end) / 1e3, before[:80], e.name[:80]))
        if e.time_range.end > end:
            end, before = e.time_range.end, e.name
    busy, idle = common.busy_and_idle(kernels)
    from coda_ext.runtime import kernel_symbols

    known = kernel_symbols()
    by_name: dict[str, list] = {}
    for e in kernels:
        row = by_name.setdefault(common.kernel_label(e.name, 100, known), [0, 0.0])
        row[0] += 1
        row[1] += (e.time_range.end - e.time_range.start) / 1e3
    top = sorted(([k, c / steps, ms / steps] for k, (c, ms) in by_name.items()), key=lambda r: -r[2])[:40]
    return {"steps": steps, "busy_ms_per_step": busy / steps, "idle_ms_per_step": idle / steps,
            "longest_gaps_ms": sorted(gaps, reverse=True)[:20], "kernels_per_step": top}


def clock_summary(csv: pathlib.Path, min_watts: float = 600.0) -> dict:
    """common.clock_summary of a CSV file of nvidia-smi samples."""
    return common.clock_summary(csv.read_text().splitlines(), min_watts)


def main(argv=None) -> None:
    import torch

    args = parse(argv)
    env = common.gpu_info()
    out = pathlib.Path(args.out or common.results_path(f"hf_step_anatomy_{args.variant}_{args.model}", gpu=env["gpu"]))
    variant, data = make_variant(args)
    for i in range(4):
        hf.train_step(variant, data[i % 2])
    torch.cuda.synchronize()
    csv = out.with_suffix(".clocks.csv")
    with csv.open("w") as f, common.nvidia_smi_samples(f):
        doc = {"env": env, "model": args.model, "layers": args.layers, "variant": args.variant,
               "tokens": args.batch * args.seq,
               "step_lead_ms": timed_steps(variant, data, 10, True),
               "step_nolead_ms": timed_steps(variant, data, 10, False),
               "back_to_back_ms": [common.event_ms(lambda: [hf.train_step(variant, data[i % 2])
                                                            for i in range(10)]) / 10 for _ in range(2)]}
        doc["host_only"] = host_only(variant, data)
        doc["profile"] = profile(variant, data)
    doc["clocks"] = clock_summary(csv)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    h = doc["host_only"]
    print(f"{args.variant} {args.model} {args.layers} layers: step {statistics.median(doc['step_lead_ms']):.2f} ms "
          f"(no lead {statistics.median(doc['step_nolead_ms']):.2f}, back to back "
          f"{statistics.median(doc['back_to_back_ms']):.2f}); host alone "
          + ", ".join(f"{p} {ms:.2f}" for p, ms in h["host_phases_ms"].items())
          + f" ms, its GPU time {h['gpu_ms']:.2f}; profiled busy {doc['profile']['busy_ms_per_step']:.2f}, idle "
          f"{doc['profile']['idle_ms_per_step']:.2f} ms a step; clocks {doc['clocks']}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
