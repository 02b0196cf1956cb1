"""Cold nvcc time of one kernel, alone on this machine, and where it goes (nvcc's own phase times):

    python -m benchmarks.compile_time [--graph design] [--config ping_128x128x64_c1x1_s4]
        [--baseline-csrc DIR]   # also build the same kernel against another csrc/ tree (builds alternate)

The kernel is one of benchmarks/graphs.py in bf16 with a tuning candidate's config, built with
coda_ext's nvcc command into a temporary directory, outside the cache, `--repeat` times. Prints the
wall seconds of each build and its five longest phases as nvcc reports them with --time. No GPU
needed.
"""
from __future__ import annotations

import argparse
import csv
import pathlib
import subprocess
import sys
import tempfile
import time

import coda_ext as ce
from benchmarks import graphs
from coda_ext import tuning
from coda_ext.jit import nvcc
from coda_ext.jit.paths import csrc_dir


def phases(path: pathlib.Path) -> dict[str, float]:
    out: dict[str, float] = {}
    with open(path) as f:
        for row in csv.DictReader(f, skipinitialspace=True):
            name = (row.get("phase name ") or row.get("phase name") or "").strip()
            value = row.get("metric ") or row.get("metric") or "0"
            out[name] = out.get(name, 0.0) + float(value)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--graph", default="design", choices=list(graphs.CASES))
    p.add_argument("--config", default="ping_128x128x64_c1x1_s4", help="a tag of coda_ext.tuning.CANDIDATES")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--baseline-csrc", metavar="DIR",
                   help="a csrc/ tree of another revision (e.g. from `git archive REV csrc`): each build of the "
                        "kernel is followed by one against DIR's headers, so both see the same machine load")
    args = p.parse_args(argv)
    cfg = tuning.config_by_tag(args.config, tuning.CANDIDATES)
    if cfg is None:
        p.error(f"unknown config {args.config!r}; known: {[c.tag for c in tuning.CANDIDATES]}")
    source = ce.emit_source(graphs.CASES[args.graph][0](), "bfloat16", cfg)
    with tempfile.TemporaryDirectory() as tmp:
        src = pathlib.Path(tmp) / "kernel.cu"
        src.write_text(source)
        trees = [("", None)] + ([(" [baseline csrc]", pathlib.Path(args.baseline_csrc))] if args.baseline_csrc else [])
        for i in range(args.repeat):
            for t, (label, tree) in enumerate(trees):
                timing = pathlib.Path(tmp) / f"time{i}_{t}.csv"   # nvcc --time appends: one file per build
                cmd = with_csrc(nvcc.build_command(str(src), str(pathlib.Path(tmp) / "kernel.so")), tree)
                start = time.monotonic()
                proc = subprocess.run(cmd + ["--time", str(timing)], capture_output=True, text=True)
                wall = time.monotonic() - start
                if proc.returncode:
                    print(proc.stdout + proc.stderr, file=sys.stderr)
                    return 1
                top = sorted(phases(timing).items(), key=lambda kv: -kv[1])[:5]
                print(f"{args.graph} {cfg.tag}{label}, build {i + 1}: {wall:.1f} s  ("
                      + ", ".join(f"{k} {v / 1e3:.1f} s" for k, v in top) + ")", flush=True)
    return 0


def with_csrc(cmd: list[str], tree: pathlib.Path | None) -> list[str]:
    """The nvcc command with the project's -I directories (csrc/, csrc/include/) taken from `tree`."""
    if tree is None:
        return cmd
    ours = {f"-I{d}": f"-I{tree / d.relative_to(csrc_dir())}" for d in (csrc_dir(), csrc_dir() / "include")}
    return [ours.get(a, a) for a in cmd]


if __name__ == "__main__":
    raise SystemExit(main())
