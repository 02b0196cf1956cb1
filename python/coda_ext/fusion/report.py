"""What the compiler fused, for a user to read: per GEMM its epilogue (the nodes fused, what the kernel
loads, stores and reduces), the HBM bytes kept on chip, the IO model's time of the fused kernel against
a torch.compile-style GEMM + element-wise kernel and eager PyTorch, the kernel it shares; then what was
left to the fallback, and why.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Any

from .analyze import Analysis
from .cost import CostModel, KernelCost
from .lowering import Lowered
from .partition import Partition, gain, io


@dataclasses.dataclass(frozen=True)
class KernelReport:
    anchor: str
    backward: bool
    mnk: tuple[int, int, int]
    major: str
    dtype: str
    members: tuple[str, ...]          # "name (aten op)"
    loads: tuple[str, ...]
    stores: tuple[str, ...]
    reductions: tuple[str, ...]
    bytes_kept: int                   # HBM bytes kept on chip (the objective, without the tie breaker)
    kernel: str | None                # digest of the shared kernel (None: the builder refused the graph)
    predicted: KernelCost | None
    error: str | None = None


@dataclasses.dataclass(frozen=True)
class LeftOut:
    name: str
    target: str
    reason: str


@dataclasses.dataclass
class GraphReport:
    """One compiled graph (a joint forward + backward graph, or an inference graph)."""

    name: str
    nodes: int
    gemms: int
    method: str
    status: str
    solve_s: float
    kernels: list[KernelReport]
    left_out: list[LeftOut]
    note: str = ""
    gemm_shapes: tuple[tuple[int, int, int], ...] = ()   # distinct (M, N, K) of every GEMM of the graph
    pairs: tuple[str, ...] = ()       # GEMMs on one input whose outputs meet in an epilogue (SwiGLU)
    folded: tuple[str, ...] = ()      # layer norms folded into the GEMMs that read them (passes/norm_fold.py)
    merged: tuple[str, ...] = ()      # GEMMs of one input merged into one (passes/hmerge.py)
    bytes_moved: int = 0              # HBM bytes the graph moves under this partition (bytes_moved())
    measured: tuple[Any, ...] = ()    # timing.Verdict of each fused GEMM, where the kernels were timed
    vetoed: tuple[Any, ...] = ()      # timing.Verdict of each veto, with what was done (fold undone, no epilogue)

    def add_note(self, text: str) -> None:
        """Appends `text` to the note ("; " between notes)."""
        self.note = f"{self.note}; {text}" if self.note else text

    @property
    def bytes_kept(self) -> int:
        return sum(k.bytes_kept for k in self.kernels if k.kernel)

    @property
    def distinct_kernels(self) -> int:
        return len({(k.kernel, k.dtype, k.major) for k in self.kernels if k.kernel})

    @property
    def fused_gemms(self) -> int:
        return sum(1 for k in self.kernels if k.kernel)

    def __str__(self) -> str:
        head = (f"coda fusion: {self.name}: {self.nodes} nodes, {self.gemms} GEMMs of {len(self.gemm_shapes)} shapes, "
                f"{self.fused_gemms} fused into {self.distinct_kernels} distinct kernels; "
                f"partition {self.method} ({self.status}) in {self.solve_s:.2f} s; "
                f"{self.bytes_kept / 1e6:.3f} MB kept on chip, {self.bytes_moved / 1e6:.3f} MB moved")
        lines = [head]
        if self.note:
            lines.append(f"  note: {self.note}")
        for k in self.kernels:
            phase = "backward" if k.backward else "forward"
            M, N, K = k.mnk
            head = f"  GEMM {k.anchor} [{phase}] {M}x{N}x{K} {k.dtype} major={k.major}"
            if k.kernel is None:
                lines.append(f"{head}: not fused ({k.error})")
                continue
            t = k.predicted
            timing = "" if t is None else (f"; IO model ({t.gpu}, {t.config}): fused {t.fused_s * 1e6:.1f} us, "
                                           f"compile-style {t.compile_s * 1e6:.1f} us, "
                                           f"eager {t.unfused_s * 1e6:.1f} us")
            lines.append(f"{head} kernel {k.kernel[:8]}: {len(k.members)} nodes fused, "
                         f"{k.bytes_kept / 1e6:.3f} MB kept on chip{timing}")
            lines.append(f"    epilogue: {', '.join(k.members)}")
            lines.append(f"    loads: {', '.join(k.loads) or '-'}; stores: {', '.join(k.stores) or '-'}; "
                         f"reductions: {', '.join(k.reductions) or '-'}")
        if self.measured:
            lines.append("  fused kernels timed against their GEMM (measured) and the fallback's kernel (IO model):")
            lines += [f"    {v}" for v in self.measured]
        if self.vetoed:
            lines.append("  vetoes, each fused kernel measured slower than its GEMM and the fallback (the GEMM as "
                         "named in that round's partition):")
            lines += [f"    {v}" for v in self.vetoed]
        if self.folded:
            lines.append("  layer norms folded into the GEMMs that read them (x @ (W⊙γ)ᵀ, then rstd ⊙ (· − μ s) + W β "
                         "in the epilogue):")
            lines += [f"    {x}" for x in self.folded]
        if self.merged:
            lines.append("  GEMMs of one input merged into one GEMM of their concatenated weights (with their dX and "
                         "weight-gradient GEMMs):")
            lines += [f"    {x}" for x in self.merged]
        if self.pairs:
            lines.append("  not fused across GEMMs:")
            lines += [f"    {x}" for x in self.pairs]
        if self.left_out:
            lines.append("  left to the fallback:")
            counted = collections.Counter((x.target, x.reason) for x in self.left_out)
            examples: dict[tuple[str, str], list[str]] = {}
            for x in self.left_out:
                examples.setdefault((x.target, x.reason), []).append(x.name)
            for (target, reason), n in counted.most_common():
                names = examples[target, reason]
                shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
                lines.append(f"    {n} x {target} ({shown}): {reason}")
        return "\n".join(lines)


class FusionReport:
    """Every graph a backend compiled, in order (a model may compile several: forward + backward as one
    joint graph, an inference graph, recompilations)."""

    def __init__(self) -> None:
        self.graphs: list[GraphReport] = []

    def add(self, report: GraphReport) -> None:
        self.graphs.append(report)

    @property
    def kernels(self) -> list[KernelReport]:
        return [k for g in self.graphs for k in g.kernels]

    @property
    def bytes_kept(self) -> int:
        return sum(g.bytes_kept for g in self.graphs)

    @property
    def distinct_kernels(self) -> int:
        return len({(k.kernel, k.dtype, k.major) for k in self.kernels if k.kernel})

    @property
    def gemm_shapes(self) -> tuple[tuple[int, int, int], ...]:
        """The distinct (M, N, K) of every GEMM of every graph."""
        return tuple(sorted({s for g in self.graphs for s in g.gemm_shapes}))

    @property
    def solve_s(self) -> float:
        return sum(g.solve_s for g in self.graphs)

    @property
    def bytes_moved(self) -> int:
        return sum(g.bytes_moved for g in self.graphs)

    def __str__(self) -> str:
        if not self.graphs:
            return "coda fusion: nothing compiled yet (the first call of the compiled model compiles)"
        return "\n".join(str(g) for g in self.graphs)

    def __repr__(self) -> str:
        return (f"<FusionReport graphs={len(self.graphs)} fused={sum(1 for k in self.kernels if k.kernel)} "
                f"kernels={self.distinct_kernels} kept={self.bytes_kept / 1e6:.3f} MB>")


def graph_report(name: str, an: Analysis, part: Partition, lowered: tuple[Lowered, ...], cost: CostModel,
                 predict: bool = True) -> GraphReport:
    pg = an.pgraph
    cons = pg.consumers()
    plain = dataclasses.replace(cost, member_cost=0.0)
    kernels: list[KernelReport] = []
    predictions: dict[Any, KernelCost | None] = {}
    fused: set[int] = set()
    for low in lowered:
        grp = low.group
        anchor = an.fx_nodes[grp.anchor]
        mnk = an.gemm_mnk(grp.anchor)
        loads, stores, reductions = io(pg, grp.anchor, grp.members, cons, grp.outside)
        site = low.site
        predicted = None
        if site is not None:
            fused.update((grp.anchor,) + grp.members)
            key = (site.kernel_key, mnk)
            if predict and key not in predictions:
                try:
                    predictions[key] = cost.kernel(site.graph, site.dtype, mnk, major=site.major)
                except Exception:   # noqa: BLE001  (the IO model is a report, never a reason to fail a compile)
                    predictions[key] = None
            predicted = predictions.get(key)
        kernels.append(KernelReport(
            anchor=anchor.name, backward=pg[grp.anchor].backward, mnk=mnk, major=anchor.args[2],
            dtype=str(anchor.args[0].meta["val"].dtype).replace("torch.", ""),
            members=tuple(f"{pg[m].name} ({pg[m].target})" for m in grp.members),
            loads=tuple(f"{pg[s].name} ({role})" for s, role in loads),
            stores=tuple(pg[s].name for s in stores), reductions=tuple(pg[r].name for r in reductions),
            bytes_kept=int(gain(pg, plain, grp.anchor, grp.members, cons)),
            kernel=site.graph.digest() if site else None, predicted=predicted, error=low.error))
    left: list[LeftOut] = []
    candidate_of: dict[int, list[int]] = {}
    for g, cs in part.candidates.items():
        for v in cs:
            candidate_of.setdefault(v, []).append(g)
    for n in pg.nodes:
        if n.id in fused or n.op == "input" or _free(n):
            continue
        if n.op == "gemm":
            reason = "GEMM without an epilogue node: left as a plain GEMM"
        elif n.op in ("math", "reduce"):
            if n.id in candidate_of:
                anchors = ", ".join(pg[g].name for g in candidate_of[n.id])
                reason = f"candidate of {anchors}; not chosen (a cycle, the kernel's limits, or nothing kept on chip)"
            else:
                reason = "no GEMM output reaches it through epilogue math of its frame and pass (forward/backward)"
        else:
            reason = n.reason or "not epilogue math"
        left.append(LeftOut(n.name, n.target, reason))
    gemm_ids = [n.id for n in pg.nodes if "fusion_gemm" in n.target]
    shapes = tuple(sorted({an.gemm_mnk(i) for i in gemm_ids}))
    return GraphReport(name, len(pg), len(gemm_ids), part.method, part.status, part.solve_s, kernels, left,
                       gemm_shapes=shapes, pairs=tuple(gemm_pairs(an, part, lowered)),
                       bytes_moved=bytes_moved(pg, [low.group for low in lowered if low.site is not None], cons))


def bytes_moved(pg, groups, cons: list[list[int]] | None = None) -> int:
    """The HBM bytes a graph moves with these epilogues fused, as the IO model counts them: each fused
    kernel its GEMM's operands, loads, stores and reductions; every other node its operands and its
    result, as if it ran alone (what the partition objective counts against; the fallback's own fusion
    moves less). Comparable across rewrites of the graph (a layer norm folded or not), where the bytes
    kept on chip are not: those count against the nodes of each graph."""
    cons = cons or pg.consumers()
    fused: set[int] = set()
    total = 0
    for grp in groups:   # members the fallback computes again (Group.outside) count on its side too
        fused.update(v for v in (grp.anchor, *grp.members) if v not in grp.outside)
        loads, stores, reductions = io(pg, grp.anchor, grp.members, cons, grp.outside)
        total += sum(pg[u].nbytes for u in pg.sources(grp.anchor)) + sum(pg[t].nbytes for t, _ in loads)
        total += sum(pg[u].nbytes for u in stores) + sum(pg[r].nbytes for r in reductions)
    for n in pg.nodes:
        if n.id not in fused and n.op != "input" and not _free(n):
            total += sum(pg[u].nbytes for u in pg.sources(n.id)) + n.nbytes
    return total


def gemm_pairs(an: Analysis, part: Partition, lowered: tuple[Lowered, ...]) -> list[str]:
    """Epilogues that load the output of another GEMM on the same input (A stored tensor and layout): the
    pair SwiGLU's separate gate and up projections make. One epilogue anchors one GEMM, so the other's
    output is written and read again; a single GEMM over both weights interleaved (ops.linear_swiglu's
    layout) would keep both on chip, and that rewrite is not derived automatically."""
    pg = an.pgraph
    owner = part.group_of()
    out = []
    for low in lowered:
        if low.site is None:
            continue
        g = low.group.anchor
        a, _, major = an.fx_nodes[g].args
        for t, role in io(pg, g, low.group.members)[0]:
            h = t if pg[t].op == "gemm" else owner.get(t)
            if role != "tile" or h is None or h == g or "fusion_gemm" not in pg[h].target:
                continue
            a2, _, major2 = an.fx_nodes[h].args
            if a2 is a and major2[0] == major[0]:
                out.append(f"{pg[g].name} and {pg[h].name} read the same input ({a.name}): {pg[g].name}'s epilogue "
                           f"loads {pg[t].name} from {pg[h].name}'s ({pg[t].nbytes / 1e6:.3f} MB written and read "
                           "again); one GEMM of their interleaved weights (ops.linear_swiglu's layout) would keep "
                           "both on chip: not derived automatically")
    return out


def _free(n) -> bool:
    """Nodes that cost nothing to leave out: views, constants, getitem of a multi-output op."""
    t = n.target
    return n.nbytes == 0 or any(s in t for s in ("view", "expand", "squeeze", "unsqueeze", "permute", "transpose",
                                                 "aten.t.", "getitem", "full", "scalar_tensor", "arange",
                                                 "slice", "select", "detach", "clone", "alias"))
