"""fusion_chart(): a picture of what automatic fusion did to a model (the report of coda_ext.fuse).

    model = coda_ext.fuse(model); model(**batch)                          # compiles on the first call
    coda_ext.analysis.fusion_chart(coda_ext.fusion.report_of(model), "fusion.png")   # needs matplotlib

Left: per distinct fused kernel (its GEMM shape, forward or backward, how many GEMMs share it), the
HBM bytes its epilogues keep on chip in one step. Middle: the IO model's time of those GEMMs fused and
as torch.compile would run them (GEMM + one fused element-wise kernel), in ms a step. Right: what was
left to the fallback compiler, by reason. The report is read by its fields only (duck typing: this
module is below the fusion package and never imports it).
"""
from __future__ import annotations

import collections
import pathlib
from typing import Any


def rows(report: Any) -> list[dict]:
    """One row per distinct fused kernel and GEMM shape: label, count, bytes kept and the IO model's
    fused and compile-style seconds summed over its GEMMs; largest bytes first."""
    groups: dict[tuple, dict] = {}
    for k in report.kernels:
        if not k.kernel:
            continue
        key = (k.kernel, k.mnk, k.backward)
        M, N, K = k.mnk
        row = groups.setdefault(key, {"label": f"{'bwd' if k.backward else 'fwd'} {M}x{N}x{K} {k.kernel[:8]}",
                                      "count": 0, "bytes_kept": 0, "fused_s": 0.0, "compile_s": 0.0})
        row["count"] += 1
        row["bytes_kept"] += k.bytes_kept
        if k.predicted is not None:
            row["fused_s"] += k.predicted.fused_s
            row["compile_s"] += k.predicted.compile_s
    return sorted(groups.values(), key=lambda r: -r["bytes_kept"])


def left_out(report: Any, top: int = 10) -> list[tuple[str, int]]:
    """(reason, how many nodes) of what the fallback runs, most first."""
    counts = collections.Counter(x.reason for g in report.graphs for x in g.left_out)
    return counts.most_common(top)


def fusion_chart(report: Any, path: str | pathlib.Path, title: str = "") -> pathlib.Path:
    """Draws the report (above) into path (PNG, SVG or PDF by its suffix); returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = rows(report)
    if not data:
        raise ValueError("fusion_chart: the report has no fused kernel (has the fused model run once? "
                         "it compiles on its first call)")
    reasons = left_out(report)
    labels = [f"{r['label']} ×{r['count']}" for r in data]
    y = range(len(data))
    fig, axes = plt.subplots(1, 3, figsize=(17, 1.2 + 0.38 * max(len(data), len(reasons), 4)),
                             gridspec_kw={"width_ratios": [1.1, 1.1, 1.0]})
    scale, unit = (1e9, "GB") if max(r["bytes_kept"] for r in data) >= 1e9 else (1e6, "MB")
    ax = axes[0]
    ax.barh(y, [r["bytes_kept"] / scale for r in data], color="#4c9a2a")
    ax.set_yticks(list(y), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(f"HBM bytes kept on chip per step ({unit})")
    ax = axes[1]
    height = 0.4
    ax.barh([i - height / 2 for i in y], [r["fused_s"] * 1e3 for r in data], height, label="fused (coda)",
            color="#2b6cb0")
    ax.barh([i + height / 2 for i in y], [r["compile_s"] * 1e3 for r in data], height,
            label="GEMM + one fused pass (compile-style)", color="#f0a040")
    ax.set_yticks(list(y), [""] * len(data))
    ax.invert_yaxis()
    ax.set_xlabel("IO model: ms per step")
    ax.legend(fontsize=7, loc="lower right")
    ax = axes[2]
    if reasons:
        ax.barh(range(len(reasons)), [n for _, n in reasons], color="#999999")
        ax.set_yticks(range(len(reasons)), [_wrap(r) for r, _ in reasons], fontsize=6)
        ax.invert_yaxis()
    ax.set_xlabel("nodes left to the fallback, by reason")
    kept = f"{report.bytes_kept / scale:.3g} {unit}"
    fig.suptitle(title or f"coda fusion: {len(data)} fused kernel shapes, {kept} kept on chip, "
                 f"{report.distinct_kernels} distinct kernels", fontsize=10)
    fig.tight_layout()
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)   # a new folder (bench_autofusion --charts DIR)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def _wrap(text: str, width: int = 48) -> str:
    words, lines, line = text.split(), [], ""
    for w in words:
        if line and len(line) + 1 + len(w) > width:
            lines.append(line)
            line = w
        else:
            line = f"{line} {w}".strip()
    lines.append(line)
    return "\n".join(lines[:3]) + (" …" if len(lines) > 3 else "")
