"""The fused kernels' speed goals, checked against a bench_graphs results file.

    python -m benchmarks.goals [benchmarks/results/graphs_h100.json] [--out benchmarks/results/goals_h100.md]

Every ratio is time / the bare cuBLAS GEMM of the same shape (bf16, H100, medians of interleaved
per-round ratios, one run). A goal that is missed is listed row by row with its measured split:
the plain GEMM run with the same kernel config as the fused op (bench_graphs' `plain_same_config`)
over cuBLAS is the mainloop's share, the fused kernel over that plain GEMM the epilogue's; both are
given in cuBLAS time (coda - 1 = mainloop share + epilogue share). No GPU needed.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import statistics
import sys

from benchmarks import graphs
from benchmarks.common import RESULTS

#: inference rows: every graph within SMALL_M_BOUND of cuBLAS and never slower than torch.compile
SMALL_M = (128, 1024)
SMALL_M_BOUND = 1.03
PLAIN_MEDIAN, PLAIN_WORST, PLAIN_TRAINING = 1.00, 1.03, 0.98
FUSED_MEDIAN, FUSED_WORST = 1.02, 1.06
SWIGLU_CASES = ("swiglu", "swiglu_y", "rstd_swiglu")

#: The expert CuTe-DSL peer (QuACK 0.6.1, default configs), one interleaved run on an H100, time /
#: cuBLAS, for the patterns it shares with a case: coda_ext must not be slower at the same shape.
PEER = {
    ("identity", "16384x28672x4096"): 0.979,
    ("swiglu", "16384x28672x4096"): 0.969,
    ("swiglu", "16384x16384x2048"): 0.989,
    ("swiglu_y", "16384x28672x4096"): 0.957,
    ("swiglu_y", "16384x16384x2048"): 0.955,
    ("rstd_swiglu", "16384x16384x2048"): 0.985,
    ("residual", "16384x4096x14336"): 1.075,
    ("residual", "16384x2048x8192"): 1.094,
    ("swiglu", "1024x28672x4096"): 1.067,
}


def rows_of(shape: str) -> int:
    return int(shape.split("x")[0])


def training(shape: str) -> bool:
    return rows_of(shape) not in SMALL_M


def row_bound(case: str, shape) -> float:
    """The largest ratio one row of `case` may take: SMALL_M_BOUND at inference rows, else the case's
    bound from graphs.CASES (the plain GEMM's worst case, SwiGLU's per-shape goal, the fused worst)."""
    M = shape[0] if isinstance(shape, tuple) else rows_of(shape)
    return SMALL_M_BOUND if M in SMALL_M else graphs.CASES[case][1]


@dataclasses.dataclass
class Row:
    case: str
    shape: str
    coda: float
    iqr: tuple[float, float] | None
    compile: float | None
    mainloop: float | None     # plain GEMM of the same config / cuBLAS (None for the identity case)
    config: str

    @property
    def split(self) -> str:
        main = self.coda if self.mainloop is None else self.mainloop
        text = f"mainloop {100 * (main - 1):+.1f} %"
        if self.mainloop is not None:
            text += f", epilogue {100 * (self.coda - self.mainloop):+.1f} %"
        return text


@dataclasses.dataclass
class Goal:
    name: str
    target: str
    measured: str
    met: bool
    misses: list[Row]


def load_rows(results: dict) -> dict[str, list[Row]]:
    out: dict[str, list[Row]] = {}
    for case, r in results.items():
        for shape, e in r["shapes"].items():
            v = e["variants"]
            best = min((x for x in v if x.startswith("coda_")), key=lambda x: v[x]["median_ratio_to_cublas"])
            iqr = v[best].get("ratio_iqr")
            comp = v.get("torch_compile", {}).get("median_ratio_to_cublas")
            mainloop = e.get("mainloop_ratio")
            if case == "identity":
                mainloop = None
            out.setdefault(case, []).append(Row(case, shape, e["coda_ratio"], tuple(iqr) if iqr else None, comp,
                                                mainloop, e.get("auto_config", "")))
    return out


def _bound_goal(name: str, rows: list[Row], bound: float) -> Goal:
    misses = [r for r in rows if r.coda > bound]
    worst = max((r.coda for r in rows), default=float("nan"))
    return Goal(name, f"<= {bound:.2f} at each of {len(rows)} shapes", f"worst {worst:.3f}, {len(misses)} over",
                not misses and bool(rows), misses)


def _median_goal(name: str, rows: list[Row], bound: float) -> Goal:
    med = statistics.median(r.coda for r in rows) if rows else float("nan")
    misses = sorted((r for r in rows if r.coda > bound), key=lambda r: -r.coda) if med > bound else []
    return Goal(name, f"median <= {bound:.2f}", f"median {med:.3f} over {len(rows)} shapes", med <= bound, misses)


def check(results: dict) -> list[Goal]:
    """Every goal that `results` (bench_graphs' "results") has the rows for."""
    rows = load_rows(results)
    goals: list[Goal] = []
    plain = rows.get("identity", [])
    if plain:
        goals.append(_median_goal("plain GEMM", plain, PLAIN_MEDIAN))
        goals.append(_bound_goal("plain GEMM, worst shape", plain, PLAIN_WORST))
        goals.append(_bound_goal("plain GEMM, training shapes", [r for r in plain if training(r.shape)],
                                 PLAIN_TRAINING))
    for case in SWIGLU_CASES:
        train = [r for r in rows.get(case, []) if training(r.shape)]
        if train:
            goals.append(_bound_goal(f"{case}, training shapes", train, graphs.CASES[case][1]))
    for case, case_rows in rows.items():
        if case == "identity" or case in SWIGLU_CASES:
            continue
        goals.append(_median_goal(case, case_rows, FUSED_MEDIAN))
        goals.append(_bound_goal(f"{case}, worst shape", case_rows, FUSED_WORST))
    peer_rows = [(r, PEER[(r.case, r.shape)]) for case_rows in rows.values() for r in case_rows
                 if (r.case, r.shape) in PEER]
    if peer_rows:
        misses = [r for r, p in peer_rows if r.coda > p]
        goals.append(Goal("never behind the peer (QuACK)", f"<= the peer at {len(peer_rows)} rows",
                          ", ".join(f"{r.case} {r.shape} {r.coda:.3f} vs {p:.3f}" for r, p in peer_rows),
                          not misses, misses))
    small = [r for case_rows in rows.values() for r in case_rows if not training(r.shape)]
    if small:
        goals.append(_bound_goal("small M, every graph", small, SMALL_M_BOUND))
        slower = [r for r in small if r.compile is not None and r.coda > r.compile]
        goals.append(Goal("small M, never slower than torch.compile", f"<= torch.compile at {len(small)} rows",
                          f"{len(slower)} slower", not slower, slower))
    return goals


def render(goals: list[Goal], env: dict, source: str) -> str:
    lines = [f"# Speed goals against {source}", "",
             (f"GPU {env.get('gpu')}, torch {env.get('torch')}, CUDA {env.get('cuda')}, CUTLASS {env.get('cutlass')}, "
              f"commit {env.get('commit')}, {env.get('date')}. Ratios: time / bare cuBLAS GEMM, medians of "
              "interleaved per-round ratios (benchmarks/goals.py)."), "",
             f"{sum(g.met for g in goals)} of {len(goals)} goals met.", "",
             "| goal | target | measured | met |", "|---|---|---|---|"]
    lines += [f"| {g.name} | {g.target} | {g.measured} | {'yes' if g.met else 'no'} |" for g in goals]
    missed = [g for g in goals if not g.met and g.misses]
    if missed:
        lines += ["", "## Rows that miss, with the measured split", "",
                  ("mainloop: the plain GEMM with the same config / cuBLAS − 1; epilogue: fused − that plain GEMM "
                   "(both in cuBLAS time)."), "",
                  "| goal | case | shape | config | coda (IQR) | torch.compile | split |",
                  "|---|---|---|---|---|---|---|"]
        for g in missed:
            for r in g.misses:
                iqr = f" ({r.iqr[0]:.3f}–{r.iqr[1]:.3f})" if r.iqr else ""
                comp = "" if r.compile is None else f"{r.compile:.3f}"
                lines.append(f"| {g.name} | {r.case} | {r.shape} | {r.config} | {r.coda:.3f}{iqr} | {comp} "
                             f"| {r.split} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="?", default=str(RESULTS / "graphs_h100.json"))
    p.add_argument("--out", help="write the table here (markdown) as well")
    args = p.parse_args(argv)
    data = json.loads(pathlib.Path(args.results).read_text())
    text = render(check(data["results"]), data.get("env", {}), pathlib.Path(args.results).name)
    print(text, end="")
    if args.out:
        pathlib.Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
