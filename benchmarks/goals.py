"""The speed goals, checked against the benchmarks' results files (no GPU needed):

    python -m benchmarks.goals [--gpu h100] [--graphs GRAPHS_JSON]
                               [--ops OPS_JSON] [--out REPORT_MD]

--gpu (h100, h200, …; default h100, the committed results) picks the results files read by default:
graphs_<gpu>.json and ops_<gpu>.json; --graphs and --ops override them.
Every ratio is time / the bare cuBLAS GEMM of the same shape and operand layout (bf16, on the GPU the files
were measured on, medians of interleaved per-round ratios, one run).
The goals, each a median over the training rows (tokens not in SMALL_M) unless it says otherwise:

    plain GEMM                   ≤ graphs.CASES["identity"] at M ≥ PLAIN_MIN_M (bench_graphs)
    SwiGLU with z, y only        ≤ graphs.CASES["swiglu"], ["swiglu_y"]: the graphs swiglu, rstd_swiglu
                                 and swiglu_y (bench_graphs) and the ready ops swiglu_train and swiglu_y
                                 (bench_fused_ops; OP_GOAL_CASE)
    every forward ready op       ≤ FORWARD_OP     (bench_fused_ops' forward rows, and linear_residual)
    every backward epilogue GEMM ≤ BACKWARD_GEMM  (bench_fused_ops --backward)
    no fused op slower than torch.compile of the same math, at every row where both were timed
and for what those leave out: every other epilogue graph family (bench_graphs) median ≤ FUSED_MEDIAN
over all its shapes and each row ≤ its graphs.CASES bound; every graph ≤ SMALL_M_BOUND at the inference
rows (M 128 and 1024).

A goal that is missed lists its rows over the bound with the measured split: mainloop = the plain GEMM
run with the kernel config (and operand layout) the op ran / cuBLAS, epilogue = the op / that plain GEMM
(the op's ratio = mainloop × epilogue); a missed median also quotes the medians of both.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import statistics
import sys

from benchmarks import graphs
from benchmarks.common import results_path

#: inference rows (tokens): every graph within SMALL_M_BOUND of cuBLAS
SMALL_M = (128, 1024)
SMALL_M_BOUND = 1.03
#: the plain GEMM's goal holds from this many rows up
PLAIN_MIN_M = 4096
FORWARD_OP, BACKWARD_GEMM = 1.00, 1.02
#: the epilogue graph families no goal above covers: median over all their shapes
FUSED_MEDIAN = 1.02
SWIGLU_CASES = ("swiglu", "rstd_swiglu", "swiglu_y")
#: ready ops whose goal is a graph's (bench_fused_ops row name -> graphs.CASES name)
OP_GOAL_CASE = {"swiglu_train": "rstd_swiglu", "swiglu_y": "swiglu_y"}
#: bench_fused_ops' variant running the identity graph with the op's config
PLAIN = "plain_same_config"


def rows_of(shape: str) -> int:
    return int(shape.split("x")[0])


def training(shape: str) -> bool:
    return rows_of(shape) not in SMALL_M


def row_bound(case: str, shape) -> float:
    """The largest ratio one row of graph `case` may take: SMALL_M_BOUND at inference rows, else the case's
    bound from graphs.CASES."""
    M = shape[0] if isinstance(shape, tuple) else rows_of(shape)
    return SMALL_M_BOUND if M in SMALL_M else graphs.CASES[case][1]


def op_bound(op: str) -> float:
    """The goal of a forward ready op's row (bench_fused_ops' op name)."""
    return graphs.CASES[OP_GOAL_CASE[op]][1] if op in OP_GOAL_CASE else FORWARD_OP


@dataclasses.dataclass
class Row:
    case: str                  # graph case or ready op
    shape: str                 # M x N x K as launched
    tokens: int                # rows of the batch (a weight gradient's K)
    coda: float
    iqr: tuple[float, float] | None
    compile: float | None
    mainloop: float | None     # the plain GEMM in the same config / cuBLAS
    epilogue: float | None     # coda / that plain GEMM
    config: str
    fused: bool = True         # False: the identity epilogue (a plain GEMM)
    model: str = ""

    @property
    def training(self) -> bool:
        return self.tokens not in SMALL_M

    @property
    def label(self) -> str:
        return f"{self.case} {self.model}".strip()

    @property
    def split(self) -> str:
        if self.mainloop is None:
            return f"mainloop {self.coda:.3f} (a plain GEMM)" if not self.fused else "not measured"
        return f"mainloop {self.mainloop:.3f}, epilogue {self.epilogue:.3f}"


@dataclasses.dataclass
class Goal:
    name: str
    target: str
    measured: str
    met: bool | None           # None: no rows measured
    misses: list[Row]

    @property
    def verdict(self) -> str:
        return {True: "met", False: "missed", None: "not measured"}[self.met]


def load_graph_rows(results: dict) -> dict[str, list[Row]]:
    """bench_graphs' "results" as rows per case (the best coda variant of each shape)."""
    out: dict[str, list[Row]] = {}
    for case, r in results.items():
        for shape, e in r["shapes"].items():
            v = e["variants"]
            best = min((x for x in v if x.startswith("coda_")), key=lambda x: v[x]["median_ratio_to_cublas"])
            iqr = v[best].get("ratio_iqr")
            comp = v.get("torch_compile", {}).get("median_ratio_to_cublas")
            plain = case == "identity"
            mainloop = None if plain else e.get("mainloop_ratio")
            epilogue = e.get("epilogue_ratio") or (e["coda_ratio"] / mainloop if mainloop else None)
            row = Row(case, shape, rows_of(shape), e["coda_ratio"], tuple(iqr) if iqr else None, comp, mainloop,
                      epilogue, e.get("auto_config", ""), not plain)
            out.setdefault(case, []).append(row)
    return out


def load_op_rows(rows: list[dict]) -> tuple[dict[str, list[Row]], dict[str, list[Row]]]:
    """bench_fused_ops' rows as (forward, backward) rows per op (rows without "pass" are forward)."""
    fwd: dict[str, list[Row]] = {}
    bwd: dict[str, list[Row]] = {}
    for row in rows:
        res = row["results"]
        coda = res["coda"]["median_ratio_to_cublas"]
        iqr = res["coda"].get("ratio_iqr")
        mainloop = row.get("mainloop_ratio", res.get(PLAIN, {}).get("median_ratio_to_cublas"))
        epilogue = row.get("epilogue_ratio") or (coda / mainloop if mainloop else None)
        r = Row(row["op"], f"{row['M']}x{row['N']}x{row['K']}", row.get("tokens", row["M"]), coda,
                tuple(iqr) if iqr else None, res.get("torch.compile", {}).get("median_ratio_to_cublas"), mainloop,
                epilogue, row.get("config", ""), row.get("fused", True), row.get("model", ""))
        (bwd if row.get("pass", "forward") == "backward" else fwd).setdefault(row["op"], []).append(r)
    return fwd, bwd


def _median(values) -> float | None:
    values = list(values)
    return statistics.median(values) if values and None not in values else None


def _median_goal(name: str, rows: list[Row], bound: float) -> Goal:
    target = f"median <= {bound:.2f}"
    if not rows:
        return Goal(name, target, "not measured", None, [])
    med = statistics.median(r.coda for r in rows)
    measured = f"median {med:.3f} over {len(rows)} shape{'s' if len(rows) > 1 else ''}"
    mainloop, epilogue = _median(r.mainloop for r in rows), _median(r.epilogue for r in rows)
    if med > bound and mainloop is not None and epilogue is not None:
        measured += f" (mainloop {mainloop:.3f}, epilogue {epilogue:.3f})"
    misses = sorted((r for r in rows if r.coda > bound), key=lambda r: -r.coda) if med > bound else []
    return Goal(name, target, measured, med <= bound, misses)


def _bound_goal(name: str, rows: list[Row], bound: float) -> Goal:
    target = f"<= {bound:.2f} at every shape"
    if not rows:
        return Goal(name, target, "not measured", None, [])
    misses = sorted((r for r in rows if r.coda > bound), key=lambda r: -r.coda)
    worst = max(r.coda for r in rows)
    return Goal(name, target, f"worst {worst:.3f}, {len(misses)} of {len(rows)} over", not misses, misses)


def check(graph_results: dict | None = None, op_rows: list[dict] | None = None) -> list[Goal]:
    """Every goal, against bench_graphs' "results" and bench_fused_ops' "results" rows (either may be
    None: its goals are not measured)."""
    g = load_graph_rows(graph_results or {})
    fwd, bwd = load_op_rows(op_rows or [])
    plain = [r for r in g.get("identity", []) if r.tokens >= PLAIN_MIN_M]
    goals = [_median_goal(f"plain GEMM, M >= {PLAIN_MIN_M}", plain, graphs.CASES["identity"][1])]
    goals += [_median_goal(f"{case} (graph), training shapes", [r for r in g[case] if r.training],
                           graphs.CASES[case][1]) for case in SWIGLU_CASES if case in g]
    if not fwd:
        goals.append(Goal("every forward ready op", f"median <= {FORWARD_OP:.2f}", "not measured", None, []))
    for op, rows in fwd.items():
        goals.append(_median_goal(f"{op} (ready op), training shapes", [r for r in rows if r.training], op_bound(op)))
    if not bwd:
        goals.append(Goal("every backward epilogue GEMM", f"median <= {BACKWARD_GEMM:.2f}",
                          "not measured (no backward rows: bench_fused_ops --backward)", None, []))
    for op, rows in bwd.items():
        goals.append(_median_goal(f"{op} (backward GEMM), training shapes", [r for r in rows if r.training],
                                  BACKWARD_GEMM))
    timed = [r for rows in (*g.values(), *fwd.values(), *bwd.values()) for r in rows
             if r.fused and r.compile is not None]
    slower = sorted((r for r in timed if r.coda > r.compile), key=lambda r: r.compile - r.coda)
    goals.append(Goal("no fused op slower than torch.compile", f"<= torch.compile at each of {len(timed)} rows",
                      f"{len(slower)} slower", not slower if timed else None, slower))
    for case, rows in g.items():
        if case != "identity" and case not in SWIGLU_CASES:
            goals.append(_median_goal(f"{case} (graph)", rows, FUSED_MEDIAN))
            goals.append(_bound_goal(f"{case} (graph), worst shape", rows, graphs.CASES[case][1]))
    if g:
        goals.append(_bound_goal("small M, every graph", [r for rows in g.values() for r in rows if not r.training],
                                 SMALL_M_BOUND))
    return goals


def lines(goals: list[Goal]) -> list[str]:
    """One line per goal (the ops results file keeps these)."""
    return [f"{g.name}: {g.target}; {g.measured}: {g.verdict}" for g in goals]


def _env_line(name: str, env: dict) -> str:
    return (f"{name}: GPU {env.get('gpu')}, torch {env.get('torch')}, CUDA {env.get('cuda')}, "
            f"CUTLASS {env.get('cutlass')}, commit {env.get('commit')}, {env.get('date')}.")


def render(goals: list[Goal], sources: dict[str, dict]) -> str:
    """The goals report (markdown); sources: {results file name: its environment record}."""
    measured = [g for g in goals if g.met is not None]
    lines_ = [f"# Speed goals against {' and '.join(sources) or 'no results'}", ""]
    lines_ += [_env_line(n, env) for n, env in sources.items()]
    lines_ += ["", ("Ratios: time / the bare cuBLAS GEMM of the same shape and operand layout, medians of "
                    "interleaved per-round ratios; goals are medians over the training shapes unless they say "
                    "otherwise (benchmarks/goals.py)."), "",
               f"{sum(bool(g.met) for g in goals)} of {len(measured)} measured goals met"
               + (f"; {len(goals) - len(measured)} not measured." if len(measured) < len(goals) else "."), "",
               "| goal | target | measured | verdict |", "|---|---|---|---|"]
    lines_ += [f"| {g.name} | {g.target} | {g.measured} | {g.verdict} |" for g in goals]
    missed = [g for g in goals if g.met is False and g.misses]
    if missed:
        lines_ += ["", "## Rows that miss, with the measured split", "",
                   ("mainloop: the plain GEMM with the op's kernel config and operand layout / cuBLAS; epilogue: the "
                    "op / that plain GEMM (the op = mainloop × epilogue)."), "",
                   "| goal | row | shape | config | coda (IQR) | torch.compile | split |",
                   "|---|---|---|---|---|---|---|"]
        for g in missed:
            for r in g.misses:
                iqr = f" ({r.iqr[0]:.3f}–{r.iqr[1]:.3f})" if r.iqr else ""
                comp = "" if r.compile is None else f"{r.compile:.3f}"
                lines_.append(f"| {g.name} | {r.label} | {r.shape} | {r.config} | {r.coda:.3f}{iqr} | {comp} "
                              f"| {r.split} |")
    return "\n".join(lines_) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpu", default="h100", metavar="TAG", help="the GPU whose results files are read by default "
                   "(h100, h200, …): graphs_<gpu>.json and ops_<gpu>.json in benchmarks/results/ (default: h100)")
    p.add_argument("--graphs", default=None, help="bench_graphs' results file (default: graphs_<gpu>.json)")
    p.add_argument("--ops", default=None, help="bench_fused_ops' results file (forward and backward rows; "
                   "default: ops_<gpu>.json)")
    p.add_argument("--out", help="write the report here (markdown) as well (e.g. goals_<gpu>.md in "
                   "benchmarks/results/)")
    args = p.parse_args(argv)
    args.graphs = args.graphs or str(results_path("graphs", gpu=args.gpu))
    args.ops = args.ops or str(results_path("ops", gpu=args.gpu))
    sources, graph_results, op_rows = {}, None, None
    for path, kind in ((args.graphs, "graphs"), (args.ops, "ops")):
        file = pathlib.Path(path)
        if not file.is_file():
            print(f"goals: {file} not found; its goals are not measured", file=sys.stderr)
            continue
        data = json.loads(file.read_text())
        if kind == "graphs":
            graph_results, sources[file.name] = data["results"], data.get("env", {})
        else:
            op_rows, sources[file.name] = data["results"], data.get("gpu", {})
    if not sources:
        p.error("no results file found (--graphs, --ops)")
    text = render(check(graph_results, op_rows), sources)
    print(text, end="")
    if args.out:
        pathlib.Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
