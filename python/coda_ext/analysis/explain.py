"""explain(): the IO/roofline model of one graph at one shape, as a table a person can read.

    print(coda_ext.explain(g, torch.bfloat16, shape=(16384, 6144, 4096), config="auto"))
    coda_ext.explain(g, "bfloat16", (128, 6144, 4096)).to_dict()   # the same, JSON-ready
"""
from __future__ import annotations

from typing import Any

from .model import ROLES, VARIANTS, Model, io_model
from .roofline import GPU

_LABELS = {"fused": "coda_ext fused", "compile": "torch.compile-style", "unfused": "eager unfused"}


def explain(graph: Any, dtype: Any, shape: tuple[int, int, int], config: Any = None,
            gpu: str | GPU = "H100 SXM") -> Explanation:
    """HBM bytes per tensor, FLOPs, arithmetic intensity, bound and time lower bound of `graph` run
    fused (coda_ext), compile-style (cuBLAS GEMM + one fused kernel) and unfused (eager), at shape
    (M, N, K) on `gpu`. config: None (DEFAULT_CONFIG, as coda_ext.compile), a KernelConfig, or "auto"
    (the heuristic config="auto" uses)."""
    return Explanation(io_model(graph, dtype, shape, config, gpu))


def _mb(nbytes: float) -> str:
    mb = nbytes / 1e6
    return f"{mb:,.1f}" if mb >= 1 or mb == 0 else f"{mb:.3f}"


def launches(fused: int, other: int) -> str:
    """The launch counts of the fused kernel and another sequence, in words."""
    if fused == other:
        return f"the same {fused} launch{'es' if fused > 1 else ''}"
    return f"{fused} launch{'es' if fused > 1 else ''} instead of {other}"


def _shape(shape: tuple[int, ...]) -> str:
    return "x".join(str(s) for s in shape)


class Explanation:
    """The model of one graph at one shape; str() is the table, to_dict() the data."""

    def __init__(self, model: Model):
        self.model = model

    @property
    def variants(self):
        return self.model.variants

    def seconds(self, variant: str) -> float:
        return self.model.variants[variant].seconds(self.model.gpu)

    def __repr__(self) -> str:
        m = self.model
        return f"<coda_ext.Explanation {m.graph.digest()} {m.dtype} {_shape(m.shape)} {m.config.tag} {m.gpu.name}>"

    def __str__(self) -> str:
        m, gpu = self.model, self.model.gpu
        M, N, K = m.shape
        v = m.variants
        lines = [(f"explain: {m.dtype} M x N x K = {M} x {N} x {K} on {gpu.name}, config {m.config.tag} "
                  f"({m.config_source})"),
                 f"GEMM: {m.schedule.describe()}", "",
                 "HBM traffic per tensor, MB read + written"]
        head = f"  {'tensor':<22s} {'role':<14s} {'shape':<14s}" + "".join(f"{n:>12s}" for n in VARIANTS)
        lines += [head, "  " + "-" * (len(head) - 2)]
        per = {n: v[n].per_tensor() for n in VARIANTS}
        order = sorted(m.tensors.values(), key=lambda t: (ROLES.index(t.role), t.name))
        for t in order:
            cells = "".join(f"{_mb(per[n][t.name]) if t.name in per[n] else '-':>12s}" for n in VARIANTS)
            lines.append(f"  {t.name[:22]:<22s} {t.role:<14s} {_shape(t.shape)[:14]:<14s}{cells}")
        lines.append(f"  {'total':<52s}" + "".join(f"{_mb(v[n].bytes):>12s}" for n in VARIANTS))
        lines += ["", f"  {'':<28s}" + "".join(f"{_LABELS[n]:>22s}" for n in VARIANTS)]
        rows = [
            ("kernel launches", lambda x: f"{len(x.kernels)}"),
            ("GFLOP", lambda x: f"{x.flops / 1e9:,.2f}"),
            ("FLOP per HBM byte", lambda x: f"{x.flops / x.bytes:,.1f}"),
            ("bound (share of time)", lambda x: "{} ({:.0%})".format(*x.bound(gpu))),
            ("time lower bound, us", lambda x: f"{x.seconds(gpu) * 1e6:,.1f}"),
        ]
        for label, fn in rows:
            lines.append(f"  {label:<28s}" + "".join(f"{fn(v[n]):>22s}" for n in VARIANTS))
        fused_b, fused_t = v["fused"].bytes, v["fused"].seconds(gpu)
        for other in ("compile", "unfused"):
            ob, ot = v[other].bytes, v[other].seconds(gpu)
            lines.append(f"  fused vs {other}: {_mb(abs(ob - fused_b))} MB {'less' if ob >= fused_b else 'more'} "
                         f"HBM traffic ({abs(1 - fused_b / ob):.0%}), a {abs(ot - fused_t) * 1e6:,.1f} us "
                         f"{'lower' if ot >= fused_t else 'higher'} time bound ({abs(1 - fused_t / ot):.0%}), "
                         + launches(len(v["fused"].kernels), len(v[other].kernels)))
        lines += ["", "kernels"]
        for n in VARIANTS:
            for k in v[n].kernels:
                t = k.timing(gpu)
                lines.append(f"  {n:<8s} {k.name[:34]:<34s} read {_mb(k.read):>9s} MB  write {_mb(k.written):>9s} MB"
                             f"  {k.flops / 1e9:>9,.2f} GFLOP  {t.bound:<7s} {t.seconds * 1e6:>9,.1f} us")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        m = self.model
        out = {
            "graph": m.graph.text(), "digest": m.graph.digest(), "dtype": m.dtype,
            "shape": {"M": m.shape[0], "N": m.shape[1], "K": m.shape[2]},
            "config": m.config.tag, "config_source": m.config_source, "gpu": m.gpu.name,
            "schedule": {"tiles_m": m.schedule.tiles_m, "tiles_n": m.schedule.tiles_n, "raster": m.schedule.raster,
                         "band": m.schedule.band, "bands": m.schedule.bands, "a_reads": m.schedule.a_reads,
                         "w_reads": m.schedule.w_reads},
            "tensors": {t.name: {"role": t.role, "shape": list(t.shape), "dtype": t.dtype}
                        for t in m.tensors.values()},
            "variants": {n: m.variants[n].to_dict(m.gpu) for n in VARIANTS},
        }
        fused = out["variants"]["fused"]
        out["savings"] = {other: {"bytes": out["variants"][other]["bytes"] - fused["bytes"],
                                  "time_s": out["variants"][other]["time_s"] - fused["time_s"],
                                  "launches": out["variants"][other]["launches"] - fused["launches"]}
                          for other in ("compile", "unfused")}
        return out
