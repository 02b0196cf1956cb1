"""Checks the IO/roofline model (coda_ext.analysis) against Nsight Compute on a GPU (H100, H200, …): DRAM bytes
read and written, and kernel time, of every benchmark graph's op at M = 128 and M = 16384.

    python -m coda_ext prebuild benchmarks/validate_io.py -j 16     # the kernels, ahead of time
    python -m benchmarks.validate_io [--cases design,swiglu] [--shapes 16384,6144,4096 ...] [--ncu PATH]
    python -m benchmarks.validate_io --merge PART.json ... --out FILE.json      # runs split by --cases/--shapes

For each (graph, shape) the config is the one config="auto" picks (the model's "auto"); this script
then runs itself in runner mode (--run) under

    ncu --metrics dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum,\\
                  lts__t_sector_op_read_hit_rate.pct \\
        --profile-from-start off --cache-control all --clock-control none --csv --page details --print-units base

The runner builds inputs and calls the op twice to warm up, then profiles one call between
cudaProfilerStart and cudaProfilerStop, so every kernel of that call is measured (int64 narrowing
copies, the GEMM, the finalize) and nothing else. Caches are flushed before each kernel, as the
model assumes nothing in L2; clocks are left to the GPU because the model's rates are sustained
boost-clock rates. The measured kernels are summed and compared with the model's fused variant;
the model time compared is max(compute, memory) per kernel, without the launch cost (Nsight
Compute times kernels, not the gaps between them).

Writes io_validation_<gpu>.json in benchmarks/results/ (--out; <gpu> the GPU it runs on: h100, h200, …) and prints
a table. The model's GPU is --gpu (default: the GPU it runs on).
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import json
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile

import coda_ext as ce
from benchmarks import common, graphs
from coda_ext import tuning
from coda_ext.analysis import io_model
from coda_ext.analysis.roofline import current_gpu, gpu_spec
from tests.helpers import rand

METRICS = "dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum,lts__t_sector_op_read_hit_rate.pct"
UNITS = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "nsecond": 1e-9, "usecond": 1e-6,
         "msecond": 1e-3, "second": 1.0, "ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "%": 1.0}
DTYPE = "bfloat16"


def default_shapes() -> list[tuple[int, int, int]]:
    """The Llama shapes of bench_graphs.py at M = 128 and M = 16384."""
    from benchmarks import bench_graphs

    return [s for s in bench_graphs.SHAPES["llama"] if s[0] in (128, 16384)]


def model_of(case: str, shape: tuple[int, int, int], gpu):
    return io_model(graphs.CASES[case][0](), DTYPE, shape, config="auto", gpu=gpu)


def build_items():
    """(graph, dtype, config) of every kernel this script runs (for coda_ext.prebuild)."""
    gpu = gpu_spec("H100 SXM")
    items, seen = [], set()
    for case in graphs.CASES:
        for shape in default_shapes():
            cfg = model_of(case, shape, gpu).config
            if (case, cfg.tag) not in seen:
                seen.add((case, cfg.tag))
                items.append((graphs.CASES[case][0](), DTYPE, cfg))
    return items


# --- runner mode: one profiled call ----------------------------------------------------------

def run_once(case: str, shape: tuple[int, int, int], tag: str) -> None:
    import torch

    cfg = tuning.config_by_tag(tag, tuning.CANDIDATES)
    if cfg is None:
        raise SystemExit(f"unknown config tag {tag!r}")
    op = ce.compile(graphs.CASES[case][0](), DTYPE, cfg)
    M, N, K = shape
    A, W, inputs = rand.op_inputs(op, M, N, K, rand.generator(0, device="cuda"))
    for _ in range(2):
        op(A, W, **inputs)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    op(A, W, **inputs)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


# --- parent mode: ncu, parsing, comparison ---------------------------------------------------

def parse_ncu_csv(text: str) -> list[dict]:
    """Kernels in launch order, each {name, read_bytes, write_bytes, time_s}, from ncu --csv output."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return []
    kernels: dict[str, dict] = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        if not row.get("Metric Name") or row.get("ID") is None:
            continue
        k = kernels.setdefault(row["ID"], {"name": row.get("Kernel Name", "")[:120]})
        unit = row.get("Metric Unit", "")
        if unit not in UNITS:
            raise ValueError(f"ncu reported {row['Metric Name']} in unit {unit!r}, unknown to validate_io.UNITS")
        value = float(row["Metric Value"].replace(",", "")) * UNITS[unit]
        key = {"dram__bytes_read.sum": "read_bytes", "dram__bytes_write.sum": "write_bytes",
               "gpu__time_duration.sum": "time_s",
               "lts__t_sector_op_read_hit_rate.pct": "l2_read_hit_pct"}.get(row["Metric Name"])
        if key:
            k[key] = value
    return [kernels[i] for i in sorted(kernels, key=int)]


def measure(ncu: str, case: str, shape: tuple[int, int, int], tag: str, timeout: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        log = pathlib.Path(tmp) / "ncu.csv"
        cmd = [ncu, "--metrics", METRICS, "--profile-from-start", "off", "--cache-control", "all",
               "--clock-control", "none", "--csv", "--page", "details", "--print-units", "base", "--log-file", str(log),
               sys.executable, "-m", "benchmarks.validate_io", "--run", case,
               "--shape", ",".join(map(str, shape)), "--config", tag]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=common.ROOT)
        text = log.read_text() if log.is_file() else ""
    try:
        kernels = parse_ncu_csv(text)
    except ValueError as e:   # an ncu unit this script does not know: recorded, the next row still runs
        return {"error": str(e), "log_tail": text[-2000:]}
    if proc.returncode != 0 or not kernels:
        tail = (proc.stdout + proc.stderr + text)[-2000:]
        return {"error": f"ncu exited {proc.returncode} with {len(kernels)} kernel(s) measured", "log_tail": tail}
    return {"kernels": kernels, "read_bytes": sum(k.get("read_bytes", 0.0) for k in kernels),
            "write_bytes": sum(k.get("write_bytes", 0.0) for k in kernels),
            "time_s": sum(k.get("time_s", 0.0) for k in kernels)}


def model_summary(model) -> dict:
    fused, gpu = model.variants["fused"], model.gpu
    kernels = []
    for k in fused.kernels:
        t = k.timing(gpu)
        kernels.append({"name": k.name, "read_bytes": k.read, "write_bytes": k.written,
                        "time_s": max(t.compute_s, t.memory_s), "bound": t.bound})
    return {"kernels": kernels, "read_bytes": fused.read, "write_bytes": fused.written,
            "time_s": sum(k["time_s"] for k in kernels), "schedule": model.schedule.describe()}


def _ratio(measured: float, modelled: float) -> float | None:
    return measured / modelled if modelled else None


def summarize(rows: list[dict], echo: bool = False) -> list[dict]:
    """The rows measured without error; with echo, the measured/model ratio ranges printed."""
    ok = [r for r in rows if "ratio_measured_to_model" in r]
    for key in ("read_bytes", "write_bytes", "time_s"):
        ratios = sorted(r["ratio_measured_to_model"][key] for r in ok if r["ratio_measured_to_model"][key])
        if ratios and echo:
            median = ratios[len(ratios) // 2]
            print(f"measured / model {key}: {ratios[0]:.2f} .. {ratios[-1]:.2f} (median {median:.2f})")
    return ok


def result(gpu_model: dict, environment: dict, rows: list[dict]) -> dict:
    """The results file's content: the rows, and per quantity the range of measured / model over the
    rows measured without error (time also as the median of |measured / model - 1|)."""
    ok = summarize(rows)
    out = {"gpu_model": gpu_model, "environment": environment, "metrics": METRICS,
           "ncu_flags": "--profile-from-start off --cache-control all --clock-control none", "rows": rows}
    for key in ("read_bytes", "write_bytes", "time_s"):
        ratios = sorted(r["ratio_measured_to_model"][key] for r in ok if r["ratio_measured_to_model"][key])
        out[f"{key}_ratio_range"] = [ratios[0], ratios[-1]] if ratios else None
    deviations = [abs(r["ratio_measured_to_model"]["time_s"] - 1) for r in ok if r["ratio_measured_to_model"]["time_s"]]
    out["time_median_abs_deviation"] = statistics.median(deviations) if deviations else None
    return out


def write_result(path: str, gpu, rows: list[dict]) -> None:
    common.write_json(path, result(dataclasses.asdict(gpu), common.gpu_info(), rows))


def merge(paths: list[str]) -> dict:
    """One results file from runs of parts of the matrix (each within one process and machine): a
    later part's row replaces an earlier one of the same case and shape; environment.parts lists
    each part's commit, date, GPU and cases."""
    parts = [json.loads(pathlib.Path(p).read_text()) for p in paths]
    rows: dict[tuple, dict] = {}
    for part in parts:
        for row in part["rows"]:
            rows[(row["case"], tuple(row["shape"]))] = row
    environment = dict(parts[0]["environment"])
    environment["parts"] = [{"commit": part["environment"].get("commit"), "date": part["environment"].get("date"),
                             "gpu": part["environment"].get("gpu"), "cases": sorted({r["case"] for r in part["rows"]})}
                            for part in parts]
    return result(parts[0]["gpu_model"], environment, list(rows.values()))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default=",".join(graphs.CASES))
    p.add_argument("--shapes", nargs="*", default=None, help="M,N,K ... (default: the Llama shapes at M 128 and 16384)")
    p.add_argument("--ncu", default=shutil.which("ncu") or "/usr/local/cuda/bin/ncu")
    p.add_argument("--gpu", default=None, help="the model's GPU (coda_ext.analysis.GPUS; default: the GPU it "
                   "runs on, coda_ext.analysis.roofline.current_gpu)")
    p.add_argument("--timeout", type=int, default=600, help="seconds per profiled run")
    p.add_argument("--out", default=None, help="results JSON (default: io_validation_<gpu>.json in "
                   "benchmarks/results/, <gpu> the GPU measured on, with --merge the first part's: h100, h200, …)")
    p.add_argument("--merge", nargs="+", metavar="PART", help="combine results files of runs split by --cases or "
                   "--shapes into --out; no GPU")
    p.add_argument("--run", metavar="CASE", help=argparse.SUPPRESS)      # runner mode (under ncu)
    p.add_argument("--shape", help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.run:
        run_once(args.run, tuple(int(x) for x in args.shape.split(",")), args.config)
        return 0
    if args.merge:
        merged = merge(args.merge)
        if args.out is None:   # named by the GPU the parts were measured on (the first part's)
            args.out = common.results_path("io_validation", gpu=merged["environment"].get("gpu") or "cpu")
        common.write_json(args.out, merged)
        summarize(merged["rows"], echo=True)
        print(f"wrote {args.out}: {len(merged['rows'])} rows from {len(args.merge)} parts")
        return 0

    import torch

    if args.out is None:
        args.out = common.results_path("io_validation")
    cases = args.cases.split(",")
    unknown = [c for c in cases if c not in graphs.CASES]
    if unknown:
        p.error(f"unknown case(s) {unknown}; known: {list(graphs.CASES)}")
    shapes = [tuple(int(x) for x in s.split(",")) for s in args.shapes] if args.shapes else default_shapes()
    gpu = dataclasses.replace(gpu_spec(args.gpu or current_gpu()),
                              sms=torch.cuda.get_device_properties(0).multi_processor_count)
    rows = []
    print(f"{'case':<13s} {'M x N x K':<18s} {'config':<32s} {'kernels':>8s} {'read GB model/meas':>21s} "
          f"{'write GB model/meas':>21s} {'time us model/meas':>21s}", flush=True)
    for case in cases:
        for shape in shapes:
            model = model_of(case, shape, gpu)
            row = {"case": case, "shape": list(shape), "config": model.config.tag, "model": model_summary(model),
                   "measured": measure(args.ncu, case, shape, model.config.tag, args.timeout)}
            mod, meas = row["model"], row["measured"]
            label = f"{case:<13s} {'x'.join(map(str, shape)):<18s} {model.config.tag:<32s}"
            if "error" in meas:
                print(f"{label} {meas['error']}", flush=True)
            else:
                row["ratio_measured_to_model"] = {k: _ratio(meas[k], mod[k])
                                                  for k in ("read_bytes", "write_bytes", "time_s")}
                print(f"{label} {len(mod['kernels']):>3d}/{len(meas['kernels']):<4d}"
                      f" {mod['read_bytes'] / 1e9:>9.3f}/{meas['read_bytes'] / 1e9:<9.3f}"
                      f"  {mod['write_bytes'] / 1e9:>9.4f}/{meas['write_bytes'] / 1e9:<9.4f}"
                      f"  {mod['time_s'] * 1e6:>9.1f}/{meas['time_s'] * 1e6:<9.1f}", flush=True)
            rows.append(row)
            write_result(args.out, gpu, rows)   # after every row: a cut-off run keeps what it measured
    ok = summarize(rows, echo=True)
    print(f"wrote {args.out}")
    return 0 if len(ok) == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
