"""diagram(): a picture of the fused kernel's graph, every edge labelled on-chip or HBM with its bytes.

    coda_ext.diagram(g, torch.bfloat16, (16384, 6144, 4096), "graph.svg")   # pure Python
    coda_ext.diagram(g, torch.bfloat16, (16384, 6144, 4096), "graph.png")   # needs matplotlib

Boxes are the lowered graph's nodes (what the kernel runs) plus the tensors in HBM (orange) and
the finalize kernel of reductions. The layout is layered top to bottom by longest path (the graph's
sinks share one layer); an edge that skips layers bends through a slot in each layer it crosses;
boxes and slots in a layer are ordered by the mean position of their inputs.
"""
from __future__ import annotations

import dataclasses
import itertools
import pathlib
from typing import Any
from xml.sax.saxutils import escape

from ..graph import ir
from .costs import kind_cost
from .model import KERNEL_INT_DTYPE, Model, io_model
from .roofline import GPU

BOX_W, BOX_H, GAP_X, GAP_Y, MARGIN = 168, 40, 28, 76, 24
FILL = {"hbm": "#fde2c8", "value": "#dbe9f7", "sink": "#d9f2d9", "kernel": "#e6e6e6"}
HBM_EDGE, CHIP_EDGE = "#c0392b", "#7f8c8d"


@dataclasses.dataclass
class _Box:
    label: tuple[str, ...]
    style: str
    layer: int = 0
    x: float = 0.0
    y: float = 0.0


@dataclasses.dataclass(frozen=True)
class _Edge:
    src: int
    dst: int
    label: str
    hbm: bool


def _size(nbytes: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{int(nbytes)} B"


def _label(node: ir.Node) -> tuple[str, ...]:
    k, name = node.kind, node.name
    if k == "accumulator":
        return ("accumulator", "A @ W^T, fp32")
    if k == "scalar":
        return (f"const {node.attr('value'):g}",) if node.attr("mode") == "constant" else (f"scalar {name}",)
    if k in ir.INPUT_KINDS or k in ("store", "pair_gated_store"):
        return (f"{k} {name}", node.attr("dtype") or "")
    if k in ("row_reduce", "col_reduce"):
        return (f"{k} {name}", node.attr("op"))
    if k == "output":
        return (f"output {name}", "D")
    extra = ", ".join(f"{a}={v}" for a, v in node.attrs if a != "name")
    return (k, extra) if extra else (k,)


def _build(model: Model) -> tuple[list[_Box], list[_Edge]]:
    """Boxes and edges of the fused kernel, with bytes from the model's fused variant."""
    graph = model.lowered
    moved: dict[tuple[str, str], int] = {}   # (kernel kind, tensor) -> bytes read or written
    for k in model.variants["fused"].kernels:
        role = "finalize" if k.name.startswith("finalize") else ("gemm" if k.gemm else "other")
        for a in k.accesses:
            moved[(role, a.tensor)] = a.read + a.write
    boxes = [_Box(_label(n), "sink" if n.is_sink else "value") for n in graph.nodes]
    edges = [_Edge(j, i, "on-chip", False) for i, n in enumerate(graph.nodes) for j in dict.fromkeys(n.inputs)]

    def hbm_box(label: str, *more: str) -> int:
        boxes.append(_Box((label,) + more, "hbm"))
        return len(boxes) - 1

    edges.extend(_Edge(hbm_box(f"{op} (HBM)"), i, f"HBM read {_size(moved[('gemm', op)])}", True)
                 for op in ("A", "W") for i in graph.find("accumulator"))
    finalize = None
    for i, n in enumerate(graph.nodes):
        hbm = kind_cost(n.kind).hbm
        if hbm == "read":
            copy = f"{n.name}:{KERNEL_INT_DTYPE}"
            read = moved.get(("gemm", copy), moved.get(("gemm", n.name), 0))
            via = f" ({KERNEL_INT_DTYPE} copy)" if ("gemm", copy) in moved else ""
            edges.append(_Edge(hbm_box(f"{n.name} (HBM)"), i, f"HBM read {_size(read)}{via}", True))
        elif hbm == "write":
            edges.append(_Edge(i, hbm_box(f"{n.name} (HBM)"), f"HBM write {_size(moved[('gemm', n.name)])}", True))
        elif hbm == "partials":
            part = f"{n.name}:partials"
            p = hbm_box(f"{n.name} partials (HBM)", "fp32 per tile")
            edges.append(_Edge(i, p, f"HBM write {_size(moved[('gemm', part)])}", True))
            if finalize is None:
                boxes.append(_Box(("finalize kernel",), "kernel"))
                finalize = len(boxes) - 1
            edges.append(_Edge(p, finalize, f"HBM read {_size(moved[('finalize', part)])}", True))
            out = hbm_box(f"{n.name} (HBM)", "fp32")
            edges.append(_Edge(finalize, out, f"HBM write {_size(moved[('finalize', n.name)])}", True))
    return boxes, edges


DUMMY_W = 16


@dataclasses.dataclass
class _Route:
    """An edge as drawn: its points (through the dummy slots of the layers it crosses) and label spot."""

    edge: _Edge
    points: list[tuple[float, float]]
    label_at: tuple[float, float] = (0.0, 0.0)


def _layers(boxes: list[_Box], edges: list[_Edge]) -> dict[int, int]:
    """HBM sources on layer 0, graph leaves on 1, values by longest path; the graph's sinks share the
    layer below the deepest value, and what follows them (HBM outputs, finalize) comes after."""
    preds: dict[int, list[int]] = {i: [] for i in range(len(boxes))}
    succs: dict[int, list[int]] = {i: [] for i in range(len(boxes))}
    for e in edges:
        preds[e.dst].append(e.src)
        succs[e.src].append(e.dst)
    waiting = {i: len(preds[i]) for i in preds}
    order = [i for i in preds if not preds[i]]
    for i in order:                        # Kahn's topological order (grows while iterating)
        for j in succs[i]:
            waiting[j] -= 1
            if not waiting[j]:
                order.append(j)
    layer: dict[int, int] = {}
    for i in order:
        layer[i] = max((layer[j] + 1 for j in preds[i]), default=0 if boxes[i].style == "hbm" else 1)
    bottom = max(layer[i] for i, b in enumerate(boxes) if b.style == "sink")
    below: set[int] = set()                # the sinks and what hangs from them
    for i in order:
        if boxes[i].style == "sink":
            layer[i] = bottom
            below.add(i)
        elif any(j in below for j in preds[i]):
            layer[i] = max(layer[j] for j in preds[i]) + 1
            below.add(i)
    return layer


def _layout(boxes: list[_Box], edges: list[_Edge], title_width: float) -> tuple[list[_Route], float, float]:
    layer = _layers(boxes, edges)
    # Each edge crossing layers passes through one dummy slot per layer in between.
    slots: list[tuple[int, float]] = [(layer[i], BOX_W) for i in range(len(boxes))]   # (layer, width)
    chains: list[list[int]] = []
    for e in edges:
        chain = [e.src]
        for d in range(layer[e.src] + 1, layer[e.dst]):
            slots.append((d, DUMMY_W))
            chain.append(len(slots) - 1)
        chains.append(chain + [e.dst])
    preds: dict[int, list[int]] = {i: [] for i in range(len(slots))}
    succs: dict[int, list[int]] = {i: [] for i in range(len(slots))}
    for chain in chains:
        for a, b in itertools.pairwise(chain):
            preds[b].append(a)
            succs[a].append(b)
    rows: dict[int, list[int]] = {}
    for i, (d, _) in enumerate(slots):
        rows.setdefault(d, []).append(i)
    row_width = {d: sum(slots[i][1] for i in r) + GAP_X * (len(r) - 1) for d, r in rows.items()}
    width = max(max(row_width.values()) + 2 * MARGIN, title_width + 2 * MARGIN)
    xs: dict[int, float] = {}

    def place(d: int) -> None:
        x = (width - row_width[d]) / 2
        for i in rows[d]:
            xs[i] = x + slots[i][1] / 2
            x += slots[i][1] + GAP_X

    def mean_x(i: int, near: list[int]) -> float:
        return sum(xs[j] for j in near) / len(near) if near else xs[i]

    for d in sorted(rows):
        place(d)
    # Sweeps: order each layer by the mean position of its neighbours above, then below, then above.
    down, up = sorted(rows)[1:], sorted(rows)[-2::-1]
    for sweep, near in ((down, preds), (up, succs), (down, preds)):
        for d in sweep:
            rows[d].sort(key=lambda i: mean_x(i, near[i]))
            place(d)
    y = {d: MARGIN + 30 + d * (BOX_H + GAP_Y) + BOX_H / 2 for d in rows}
    for i, b in enumerate(boxes):
        b.layer, b.x, b.y = layer[i], xs[i], y[layer[i]]
    routes = []
    for e, chain in zip(edges, chains):
        pts = [(xs[e.src], y[layer[e.src]] + BOX_H / 2)] + [(xs[i], y[slots[i][0]]) for i in chain[1:-1]]
        routes.append(_Route(e, pts + [(xs[e.dst], y[layer[e.dst]] - BOX_H / 2)]))
    by_source: dict[int, list[_Route]] = {}
    for r in routes:
        by_source.setdefault(r.edge.src, []).append(r)
    for group in by_source.values():   # spread the labels of edges leaving one box
        group.sort(key=lambda r: r.points[1][0])
        for k, r in enumerate(group):
            t = 0.5 if len(group) == 1 else 0.3 + 0.4 * k / (len(group) - 1)
            (x1, y1), (x2, y2) = r.points[0], r.points[1]
            r.label_at = (x1 + (x2 - x1) * t, y1 + (y2 - y1) * t)
    height = MARGIN * 2 + 30 + (max(rows) + 1) * (BOX_H + GAP_Y) - GAP_Y
    return routes, width, height


def _title(model: Model) -> str:
    M, N, K = model.shape
    v = model.variants["fused"]
    return (f"{model.dtype} {M} x {N} x {K}, {model.config.tag}: {len(v.kernels)} kernel(s), "
            f"{_size(v.bytes)} HBM traffic, modelled time >= {v.seconds(model.gpu) * 1e6:,.1f} us on {model.gpu.name}")


def _svg(title: str, boxes: list[_Box], routes: list[_Route], width: float, height: float) -> str:
    out = [(f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
            f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="sans-serif" font-size="12">'),
           ('<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
            'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#555"/></marker></defs>'),
           '<rect width="100%" height="100%" fill="white"/>',
           f'<text x="{MARGIN}" y="{MARGIN + 6}" font-size="13" font-weight="bold">{escape(title)}</text>']
    labels = []
    for r in routes:
        color = HBM_EDGE if r.edge.hbm else CHIP_EDGE
        dash = "" if r.edge.hbm else ' stroke-dasharray="4 3"'
        pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in r.points)
        out.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="1.4"{dash} '
                   'marker-end="url(#arrow)"/>')
        (lx, ly), w = r.label_at, 6.2 * len(r.edge.label) + 8
        labels.append(f'<rect x="{lx - w / 2:.1f}" y="{ly - 8:.1f}" width="{w:.1f}" height="15" rx="3" '
                      f'fill="white" fill-opacity="0.9"/><text x="{lx:.1f}" y="{ly + 3:.1f}" font-size="10" '
                      f'text-anchor="middle" fill="{color}">{escape(r.edge.label)}</text>')
    for b in boxes:
        out.append(f'<rect x="{b.x - BOX_W / 2:.1f}" y="{b.y - BOX_H / 2:.1f}" width="{BOX_W}" height="{BOX_H}" '
                   f'rx="6" fill="{FILL[b.style]}" stroke="#444"/>')
        lines = [s for s in b.label if s]
        for k, s in enumerate(lines):
            dy = (k - (len(lines) - 1) / 2) * 14 + 4
            out.append(f'<text x="{b.x:.1f}" y="{b.y + dy:.1f}" text-anchor="middle" '
                       f'font-size="{12 if k == 0 else 10}">{escape(s)}</text>')
    return "\n".join(out + labels + ["</svg>"]) + "\n"


def _svg_title_width(title: str) -> float:
    """The SVG title's width in pixels (13 px bold sans-serif: about 8 px a character)."""
    return 8.0 * len(title)


def _png_title_width(title: str) -> float:
    """The PNG title's width in pixels, measured in matplotlib's font (TITLE_PT bold at PNG_DPI)."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextPath

    path = TextPath((0, 0), title, size=TITLE_PT * PNG_DPI / 72, prop=FontProperties(weight="bold"))
    return 1.03 * path.get_extents().width   # a little room for the rasteriser's hinting


TITLE_PT, PNG_DPI = 10, 100


def _png_figure(title: str, boxes: list[_Box], routes: list[_Route], width: float, height: float):
    """(the figure, its title's Text): one pixel of the layout is one data unit."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    fig = plt.figure(figsize=(width / PNG_DPI, height / PNG_DPI), dpi=PNG_DPI)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(height, 0)
    ax.axis("off")
    heading = ax.text(MARGIN, MARGIN + 6, title, fontsize=TITLE_PT, weight="bold")
    for r in routes:
        color, ls = (HBM_EDGE, "-") if r.edge.hbm else (CHIP_EDGE, "--")
        xs, ys = zip(*r.points)
        ax.plot(xs[:-1], ys[:-1], color=color, lw=1.2, ls=ls)
        ax.annotate("", xy=r.points[-1], xytext=r.points[-2],
                    arrowprops=dict(arrowstyle="-|>", color=color, lw=1.2, ls=ls, shrinkA=0, shrinkB=0))
        ax.text(*r.label_at, r.edge.label, fontsize=7, color=color, ha="center", va="center",
                bbox=dict(fc="white", ec="none", alpha=0.9, pad=1))
    for b in boxes:
        ax.add_patch(FancyBboxPatch((b.x - BOX_W / 2, b.y - BOX_H / 2), BOX_W, BOX_H,
                                    boxstyle="round,pad=0,rounding_size=6", fc=FILL[b.style], ec="#444"))
        ax.text(b.x, b.y, "\n".join(s for s in b.label if s), ha="center", va="center", fontsize=8)
    return fig, heading


def diagram(graph: Any, dtype: Any, shape: tuple[int, int, int], path: str | pathlib.Path, config: Any = None,
            gpu: str | GPU = "H100 SXM") -> pathlib.Path:
    """Writes the fused kernel's graph at shape (M, N, K) to `path` (.svg; .png with matplotlib) and
    returns the path. config and gpu as for explain()."""
    path = pathlib.Path(path)
    if path.suffix.lower() not in (".svg", ".png"):
        raise ValueError(f"diagram: path must end in .svg or .png, got {str(path)!r}")
    model = io_model(graph, dtype, shape, config, gpu)
    boxes, edges = _build(model)
    title = _title(model)
    if path.suffix.lower() == ".png":
        try:
            import matplotlib
        except ImportError:
            raise ImportError(f"diagram: writing {path.name} needs matplotlib (pip install matplotlib); "
                              "an .svg path needs nothing") from None
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        routes, width, height = _layout(boxes, edges, _png_title_width(title))
        fig, _ = _png_figure(title, boxes, routes, width, height)
        fig.savefig(path)
        plt.close(fig)
    else:
        routes, width, height = _layout(boxes, edges, _svg_title_width(title))
        path.write_text(_svg(title, boxes, routes, width, height))
    return path
