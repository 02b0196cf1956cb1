"""The IO model of one Llama decoder layer, forward + backward, as CODA fuses it
(docs/patterns.md), against torch.compile-style and eager unfused execution.

Each step of the layer is one GEMM with its epilogue (or one element-wise pass), described by its
own small spec: the epilogue graph the ready op runs, from coda_ext.graphs, where the graph language
says it (the IO model of explain() then gives all three variants), or kernels listed by hand where
it does not give the sequence to compare with (the dSwiGLU step: its eager sequence is the eleven
kernels PyTorch runs, not one per graph node; the RoPE backward pass is not a GEMM). Weight-gradient
GEMMs are plain GEMMs, the same in every variant.

Attention (SDPA forward and backward) is the same kernel in every variant and is left out: the
totals are the non-attention part of the layer, and "GEMM floor" is the bare-GEMM bound of its
linears (forward, dX and dW) at each step's kernel config, as in docs/design.md ("The bars").
The unfused and compile-style variants run the same CODA algorithm without fusion (e.g. RMSNorm
split into statistics in one GEMM's epilogue and scaling in the next); a textbook eager Llama
layer launches more kernels. The rsqrt that turns Σx² into rstd is counted inside the finalize
(M floats).
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from .. import graphs, tuning
from ..config import KernelConfig
from ..graph.builder import Graph, dtype_name
from .costs import DTYPE_BYTES
from .model import VARIANTS, gemm_operands, io_model
from .roofline import GPU, Access, Kernel, Variant, gpu_spec


@dataclasses.dataclass(frozen=True)
class LayerShape:
    name: str
    d: int
    F: int
    heads: int
    kv_heads: int
    head_dim: int
    tokens: int

    @property
    def q(self) -> int:
        return self.heads * self.head_dim

    @property
    def qkv(self) -> int:
        return (self.heads + 2 * self.kv_heads) * self.head_dim


#: The layers of the Llama-layer table in docs/design.md ("The bars").
LAYERS = {
    "8b": LayerShape("Llama-3-8B layer", d=4096, F=14336, heads=32, kv_heads=8, head_dim=128, tokens=8192),
    "1b": LayerShape("Llama-1B-like layer", d=2048, F=8192, heads=32, kv_heads=8, head_dim=64, tokens=4 * 8192),
}


# --- the epilogue graphs of the layer's GEMMs: the graphs the ready ops run --------------------

def graph_steps(L: LayerShape) -> list[tuple[str, str, Callable[[], Graph], tuple[int, int, int]]]:
    """(name, phase, graph builder, (M, N, K)) of every GEMM step the IO model gives from its graph, in
    execution order (the steps listed by hand are left out). Each builder is a coda_ext.graphs function
    with the arguments coda_ext.models runs the op with: the forward's rstd-scaled QKV + RoPE (no QK-norm),
    residual norm and SwiGLU train; the backward's norm backward (accumulating the residual gradient in
    the gate/up dX GEMM, and MLPBlock's gradient of the residual stream in the QKV dX GEMM) and plain GEMMs
    (identity: linear_dx and weight_grad, read as stored)."""
    T = L.tokens
    qkv = functools.partial(graphs.qkv_rope, True, False, L.head_dim)
    swiglu = functools.partial(graphs.linear_swiglu, True, True)
    norm_bwd = functools.partial(graphs.rms_norm_backward_linear, True)
    plain = graphs.identity
    return [("fwd QKV + RoPE (K4)", "forward", qkv, (T, L.qkv, L.d)),
            ("fwd O-proj + residual + norm stats (K1)", "forward", graphs.linear_residual_norm, (T, L.d, L.q)),
            ("fwd gate/up + SwiGLU (K2)", "forward", swiglu, (T, 2 * L.F, L.d)),
            ("fwd down + residual + norm stats (K3)", "forward", graphs.linear_residual_norm, (T, L.d, L.F)),
            ("bwd down dW", "backward", plain, (L.d, L.F, T)),
            ("bwd gate/up dX + RMSNorm bwd", "backward", norm_bwd, (T, L.d, 2 * L.F)),
            ("bwd gate/up dW", "backward", plain, (2 * L.F, L.d, T)),
            ("bwd O-proj dX", "backward", plain, (T, L.q, L.d)),
            ("bwd O-proj dW", "backward", plain, (L.d, L.q, T)),
            ("bwd QKV dX + RMSNorm bwd + dx", "backward", norm_bwd, (T, L.d, L.qkv)),
            ("bwd QKV dW", "backward", plain, (L.qkv, L.d, T))]


# --- steps -----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Step:
    """One step of the layer: its kernels in each variant and the bare-GEMM bound it contains."""

    name: str
    phase: str                       # forward | backward
    shape: tuple[int, int, int] | None
    config: str
    variants: dict[str, Variant]
    floor_s: float


def _graph_step(name: str, phase: str, build: Callable[[], Graph], shape: tuple[int, int, int], dtype: str,
                gpu: GPU) -> Step:
    m = io_model(build(), dtype, shape, "auto", gpu)
    return Step(name, phase, shape, m.config.tag, m.variants, _floor(shape, dtype, m.config, gpu))


def _floor(shape: tuple[int, int, int], dtype: str, config: KernelConfig, gpu: GPU) -> float:
    """The bound of the bare GEMM (A, W read; D written) at the step's config."""
    return io_model(graphs.identity(), dtype, shape, config, gpu).variants["fused"].seconds(gpu)


def _ew(name: str, reads: dict[str, int], writes: dict[str, int], flops: float = 0.0) -> Kernel:
    """An element-wise kernel given by the bytes it reads and writes per tensor."""
    return Kernel(name, tuple(Access(t, read=b) for t, b in reads.items())
                  + tuple(Access(t, write=b) for t, b in writes.items()), vector_flops=flops)


def _dswiglu_step(L: LayerShape, dtype: str, gpu: GPU) -> Step:
    """Down projection dX (dy1 = dx2 @ W_down, T x F) with the dSwiGLU epilogue: loads the saved z1
    pairs (g, u), writes dz1 (T x 2F), recomputes y1 (T x F) for the dW GEMM and reduces
    ζ1 = Σ (g dg + u du) per row. Listed by hand for the eager sequence; the fused kernel's bytes and
    time are those explain() gives for the op's graph (ops/swiglu_backward.py, pair tiles)."""
    T, F, d, b = L.tokens, L.F, L.d, DTYPE_BYTES[dtype]
    cfg = tuning.heuristic(T, F, d, gpu.sms, tuning.Epilogue(tile_load=True))
    sched, operands, work = gemm_operands(T, F, d, dtype, cfg, gpu, ("dx2", "W_down"))
    half, full, row = T * F * b, T * 2 * F * b, T * 4
    partials = T * sched.tiles_n * 4
    flops = 22.0 * T * F   # per (g, u) pair: sigmoid, silu, dg, du, y, two products of ζ
    fused = Variant("fused", (
        Kernel("GEMM + dSwiGLU epilogue",
               operands + (Access("z1", read=full), Access("dz1", write=full), Access("y1", write=half),
                           Access("zeta1:partials", write=partials)), work, flops),
        _ew("finalize reductions", {"zeta1:partials": partials}, {"zeta1": row})))
    gemm = Kernel("cuBLAS GEMM", operands + (Access("dy1", write=half),), work)
    compiled = Variant("compile", (gemm, _ew("fused pointwise + reductions", {"dy1": half, "z1": full},
                                             {"dz1": full, "y1": half, "zeta1": row}, flops)))
    unfused = Variant("unfused", (
        gemm,
        _ew("sigmoid(g)", {"g": half}, {"sig": half}, 6 * T * F),
        _ew("s = g * sig", {"g": half, "sig": half}, {"s": half}, T * F),
        _ew("du = dy * s", {"dy1": half, "s": half}, {"du": half}, T * F),
        _ew("dsu = dy * u", {"dy1": half, "u": half}, {"dsu": half}, T * F),
        _ew("dg = silu_backward(dsu, g)", {"dsu": half, "g": half}, {"dg": half}, 5 * T * F),
        _ew("dz1 = interleave(dg, du)", {"dg": half, "du": half}, {"dz1": full}),
        _ew("y1 = s * u", {"s": half, "u": half}, {"y1": half}, T * F),
        _ew("g * dg", {"g": half, "dg": half}, {"gdg": half}, T * F),
        _ew("u * du", {"u": half, "du": half}, {"udu": half}, T * F),
        _ew("gdg + udu", {"gdg": half, "udu": half}, {"zdz": half}, T * F),
        _ew("zeta1 = sum(zdz)", {"zdz": half}, {"zeta1": row}, T * F)))
    return Step("bwd down dX + dSwiGLU", "backward", (T, F, d), cfg.tag,
                {"fused": fused, "compile": compiled, "unfused": unfused}, _floor((T, F, d), dtype, cfg, gpu))


def _rope_backward_step(L: LayerShape, dtype: str, gpu: GPU) -> Step:
    """RoPE backward and ζ0 = Σ qkv · dqkv per row (rotation-invariant, so the saved post-RoPE qkv
    serves): an element-wise pass between attention backward and the QKV dX GEMM (not a GEMM)."""
    T, b = L.tokens, DTYPE_BYTES[dtype]
    full, row = T * L.qkv * b, T * 4
    one = _ew("rope backward + ZdZ", {"dqkv": full, "qkv": full}, {"dz0": full, "zeta0": row}, 16.0 * T * L.qkv)
    unfused = Variant("unfused", (
        _ew("dqkv * cos", {"dqkv": full}, {"c": full}, T * L.qkv),
        _ew("dqkv * sin", {"dqkv": full}, {"s": full}, T * L.qkv),
        _ew("rotate_half(s)", {"s": full}, {"rs": full}),
        _ew("dz0 = c + rs", {"c": full, "rs": full}, {"dz0": full}, T * L.qkv),
        _ew("qkv * dqkv", {"qkv": full, "dqkv": full}, {"p": full}, T * L.qkv),
        _ew("zeta0 = sum(p)", {"p": full}, {"zeta0": row}, T * L.qkv)))
    return Step("bwd RoPE + ZdZ (element-wise)", "backward", None, "-",
                {"fused": Variant("fused", (one,)), "compile": Variant("compile", (one,)), "unfused": unfused}, 0.0)


def layer_steps(L: LayerShape, dtype: Any = "bfloat16", gpu: str | GPU = "H100 SXM") -> list[Step]:
    """The steps of one layer's forward and backward, in execution order (attention left out)."""
    d, spec = dtype_name(dtype), gpu_spec(gpu)
    steps = [_graph_step(name, phase, build, shape, d, spec) for name, phase, build, shape in graph_steps(L)]
    names = [s.name for s in steps]   # the hand-listed steps go in where they run (the later one first)
    steps.insert(names.index("bwd QKV dX + RMSNorm bwd + dx"), _rope_backward_step(L, d, spec))
    steps.insert(names.index("bwd down dW"), _dswiglu_step(L, d, spec))
    return steps


# --- tables and charts -----------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class LayerModel:
    layer: LayerShape
    dtype: str
    gpu: GPU
    steps: tuple[Step, ...]

    def total_s(self, variant: str) -> float:
        return sum(s.variants[variant].seconds(self.gpu) for s in self.steps)

    def total_bytes(self, variant: str) -> int:
        return sum(s.variants[variant].bytes for s in self.steps)

    def launches(self, variant: str) -> int:
        return sum(len(s.variants[variant].kernels) for s in self.steps)

    @property
    def floor_s(self) -> float:
        return sum(s.floor_s for s in self.steps)

    def table(self) -> str:
        L, gpu = self.layer, self.gpu
        lines = [(f"{L.name}: d {L.d}, F {L.F}, heads {L.heads}/{L.kv_heads} x {L.head_dim}, {L.tokens} tokens, "
                  f"{self.dtype}, {gpu.name} (attention left out)"),
                 f"  {'step':<40s} {'M x N x K':<20s}" + "".join(f"{v + ' GB':>11s}" for v in VARIANTS)
                 + "".join(f"{v + ' ms':>11s}" for v in VARIANTS) + f"{'floor ms':>10s}"]
        lines.append("  " + "-" * (len(lines[1]) - 2))
        for s in self.steps:
            shape = "x".join(map(str, s.shape)) if s.shape else "element-wise"
            lines.append(f"  {s.name[:40]:<40s} {shape:<20s}"
                         + "".join(f"{s.variants[v].bytes / 1e9:>11.3f}" for v in VARIANTS)
                         + "".join(f"{s.variants[v].seconds(gpu) * 1e3:>11.3f}" for v in VARIANTS)
                         + f"{s.floor_s * 1e3:>10.3f}")
        lines.append(f"  {'total':<61s}" + "".join(f"{self.total_bytes(v) / 1e9:>11.3f}" for v in VARIANTS)
                     + "".join(f"{self.total_s(v) * 1e3:>11.3f}" for v in VARIANTS) + f"{self.floor_s * 1e3:>10.3f}")
        lines.append(f"  {'kernel launches':<61s}" + "".join(f"{self.launches(v):>11d}" for v in VARIANTS))
        lines.append(f"  {'time / GEMM floor':<61s}" + " " * 33
                     + "".join(f"{self.total_s(v) / self.floor_s:>11.3f}" for v in VARIANTS))
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"layer": dataclasses.asdict(self.layer), "dtype": self.dtype, "gpu": self.gpu.name,
                "floor_s": self.floor_s,
                "totals": {v: {"bytes": self.total_bytes(v), "time_s": self.total_s(v), "launches": self.launches(v)}
                           for v in VARIANTS},
                "steps": [{"name": s.name, "phase": s.phase, "shape": s.shape, "config": s.config,
                           "floor_s": s.floor_s, "variants": {v: s.variants[v].to_dict(self.gpu) for v in VARIANTS}}
                          for s in self.steps]}


def layer_model(layer: str | LayerShape = "8b", dtype: Any = "bfloat16", gpu: str | GPU = "H100 SXM",
                tokens: int | None = None) -> LayerModel:
    """The layer's steps in every variant. layer: a key of LAYERS or a LayerShape; tokens overrides its M."""
    L = LAYERS[layer] if isinstance(layer, str) else layer
    if tokens is not None:
        L = dataclasses.replace(L, tokens=tokens)
    spec = gpu_spec(gpu)
    return LayerModel(L, dtype_name(dtype), spec, tuple(layer_steps(L, dtype, spec)))


#: bench_llama_training's variant names -> the model's
MEASURED_VARIANTS = {"coda": "fused", "torch.compile": "compile", "eager": "unfused"}
VARIANT_LABELS = {"fused": "coda_ext fused", "compile": "torch.compile-style", "unfused": "eager unfused"}


def chart(models: list[LayerModel], path: str, measured: dict[str, dict[str, float]] | None = None,
          measured_label: str = "measured") -> None:
    """A stacked bar chart (PNG, matplotlib): per layer, one bar per variant, stacked by step, of
    the modelled time lower bound and HBM traffic. measured: {layer name: {variant: ms}}, measured
    times of the same layer's non-attention part, drawn as labelled markers beside the bars."""
    try:
        import matplotlib
    except ImportError:
        raise ImportError("the block chart needs matplotlib (pip install matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = figure(models, measured, measured_label)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def figure(models: list[LayerModel], measured: dict[str, dict[str, float]] | None = None,
           measured_label: str = "measured"):
    """The matplotlib figure of chart()."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(models), 2, figsize=(13, 4.2 * len(models) + 0.6), squeeze=False)
    fig.suptitle("IO model of a Llama layer, forward + backward, attention left out: the bars are modelled "
                 "(time lower bound, HBM traffic), not measured" + ("; ◆ measured times" if measured else ""),
                 fontsize=10)
    cmap = plt.get_cmap("tab20")
    x = range(len(VARIANTS))
    for row, m in zip(axes, models):
        for ax, (what, unit, fn) in zip(row, (("time lower bound", "ms", lambda v, s: v.seconds(m.gpu) * 1e3),
                                              ("HBM traffic", "GB", lambda v, s: v.bytes / 1e9))):
            bottoms = [0.0] * len(VARIANTS)
            for k, s in enumerate(m.steps):
                heights = [fn(s.variants[v], s) for v in VARIANTS]
                ax.bar(x, heights, 0.6, bottom=bottoms, color=cmap(k % 20), label=s.name)
                bottoms = [b + h for b, h in zip(bottoms, heights)]
            if what.startswith("time"):
                handles = [ax.axhline(m.floor_s * 1e3, color="k", ls="--", lw=0.8, label="GEMM floor (modelled)")]
                got = (measured or {}).get(m.layer.name, {})
                at = [i for i, v in enumerate(VARIANTS) if v in got]
                if at:
                    ms = [got[VARIANTS[i]] for i in at]
                    handles.append(ax.scatter(at, ms, marker="D", s=36, color="k", zorder=3, label=measured_label))
                    for i, t in zip(at, ms):
                        ax.annotate(f"{t:.1f} ms measured", (i, t), xytext=(8, 0), textcoords="offset points",
                                    fontsize=7, va="center", bbox=dict(fc="white", ec="none", alpha=0.8, pad=1))
                ax.set_ylim(0, 1.25 * max(bottoms + list(got.values())))   # room for the legend
                ax.legend(handles=handles, fontsize=7, loc="upper left")
            ax.set_xticks(list(x), [VARIANT_LABELS[v] for v in VARIANTS])
            ax.set_ylabel(unit)
            ax.set_title(f"{m.layer.name}, {m.layer.tokens} tokens: modelled {what} ({m.gpu.name})", fontsize=9)
        row[1].legend(fontsize=6, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    return fig
