"""The GEMMs of a Llama training step beyond the forward ready ops, for `bench_fused_ops --backward`:
every backward epilogue GEMM, and linear_residual (the down projection's forward), at the shapes and
operand layouts the step launches them (coda_ext.models.functions), each with its inputs
(tests.helpers.rand), the ready op's call, the GEMM as the kernel reads it and the same math unfused.

    swiglu_backward_linear          dy @ W_down            (tokens, F, d)   "kn"  dSwiGLU, y, ZdZ
    rms_norm_backward_linear_dx_in  dz1 @ W_gate_up        (tokens, d, 2F)  "kn"  RMSNorm backward + dx_in (MLP)
    rms_norm_backward_linear        dz @ W_qkv             (tokens, d, Nq)  "kn"  RMSNorm backward + dx_in (attention:
                                                                                  the residual's gradient from the MLP)
    linear_dx                       dx1 @ W_o              (tokens, Do, d)  "kn"
    linear_residual                 y1 @ W_downᵀ + x1      (tokens, d, F)   "kk"  (a forward op)
    weight_grad_{down,gate_up,o,qkv}  dzᵀ @ x              (N, K, tokens)   "mn"
    weight_grad_accumulate          dz1ᵀ @ n1 + accumulate (2F, d, tokens)  "mn"
    lm_head_{dlogits,dx,dx_accumulate,dw}   the LM head backward's GEMMs of each vocabulary chunk width
                                    (coda_ext.ops.lm_head_ce.gemms), run as the op runs them

operands(g, s) is the GEMM (A (M, K), W (N, K), views of what is stored): the bare cuBLAS GEMM of a
row is torch.mm(A, W.t()) and the plain GEMM in the op's config runs the identity graph on (A, W).
eager(g, s) is the unfused math a model would run: the GEMM in the op dtype, the epilogue math in
fp32, outputs in the op dtype (torch.compile compiles it).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from tests.helpers import rand

#: the GEMMs of a layer's step, at `tokens` rows of the batch
STEP_OPS = ("swiglu_backward_linear", "rms_norm_backward_linear_dx_in", "rms_norm_backward_linear", "linear_dx",
            "linear_residual", "weight_grad_down", "weight_grad_gate_up", "weight_grad_o", "weight_grad_qkv",
            "weight_grad_accumulate")
#: the LM head backward's GEMMs of one vocabulary chunk (dx_accumulate: from the second chunk on)
LM_HEAD_OPS = ("lm_head_dlogits", "lm_head_dx", "lm_head_dx_accumulate", "lm_head_dw")
#: the LM head the benchmarks run (Llama-3-8B's at 8192 tokens): cases(lm_head=...)
LM_HEAD = dict(model="8B", M=8192, K=4096, V=128256)
OPS = STEP_OPS + LM_HEAD_OPS
#: ops that run in the forward pass (their goal is the forward ops')
FORWARD = ("linear_residual",)


@dataclasses.dataclass(frozen=True)
class Gemm:
    """One row: a GEMM (M, N, K) as launched, in operand layout `major`, of a step of `tokens` rows; its
    kernel is the epilogue graph build(*args)."""
    op: str
    model: str
    tokens: int
    M: int
    N: int
    K: int
    major: str
    build: Callable[..., Any]
    args: tuple

    @property
    def kind(self) -> str:
        """What is called and how its inputs look: swiglu, norm, dx, residual, wgrad, dlogits."""
        if self.op.startswith("weight_grad") or self.op == "lm_head_dw":
            return "wgrad"
        if self.op in ("linear_dx", "lm_head_dx", "lm_head_dx_accumulate"):
            return "dx"
        return {"swiglu_backward_linear": "swiglu", "linear_residual": "residual",
                "lm_head_dlogits": "dlogits"}.get(self.op, "norm")

    @property
    def accumulates(self) -> bool:
        """Whether the epilogue reads a tile it adds (dx_in, accumulate, the running dx)."""
        return self.op.endswith(("_dx_in", "accumulate")) or self.op == "rms_norm_backward_linear"

    @property
    def pass_name(self) -> str:
        return "forward" if self.op in FORWARD else "backward"

    def graph(self):
        return self.build(*self.args)


def kernel(op: str) -> tuple[Callable[..., Any], tuple, str]:
    """(graph builder, its args, operand layout) of an op's GEMM, as the op (or the LM head backward) runs it."""
    from coda_ext import graphs

    return {"swiglu_backward_linear": (graphs.swiglu_backward_linear, (), "kn"),
            "rms_norm_backward_linear_dx_in": (graphs.rms_norm_backward_linear, (True,), "kn"),
            "rms_norm_backward_linear": (graphs.rms_norm_backward_linear, (True,), "kn"),
            "linear_dx": (graphs.linear, (False,), "kn"),
            "linear_residual": (graphs.linear, (True,), "kk"),
            "weight_grad_accumulate": (graphs.linear, (True,), "mn"),
            "lm_head_dlogits": (graphs.lm_head_cross_entropy_backward, (True,), "kk"),
            "lm_head_dx": (graphs.linear, (False,), "kn"),
            "lm_head_dx_accumulate": (graphs.linear, (True,), "kn"),
            }.get(op, (graphs.linear, (False,), "mn"))


def step_shapes(c: dict, T: int) -> dict[str, tuple[int, int, int]]:
    """(M, N, K) as launched of every STEP_OPS GEMM of a model `c` (d, F, hq, hkv, hd) at T tokens."""
    d, F = c["d"], c["F"]
    nq, do = (c["hq"] + 2 * c["hkv"]) * c["hd"], c["hq"] * c["hd"]
    return {"swiglu_backward_linear": (T, F, d), "rms_norm_backward_linear_dx_in": (T, d, 2 * F),
            "rms_norm_backward_linear": (T, d, nq), "linear_dx": (T, do, d), "linear_residual": (T, d, F),
            "weight_grad_down": (d, F, T), "weight_grad_gate_up": (2 * F, d, T), "weight_grad_o": (d, do, T),
            "weight_grad_qkv": (nq, d, T), "weight_grad_accumulate": (2 * F, d, T)}


def cases(models: dict[str, dict], ms, ops=OPS, lm_head: dict | None = None) -> list[Gemm]:
    """The rows: every STEP_OPS op in `ops` for each model and token count, then (lm_head: model, M tokens,
    V, K = d, optionally chunk_bytes) the LM head's backward GEMMs of each chunk width its backward launches."""
    out = []
    for model, c in models.items():
        for T in ms:
            shapes = step_shapes(c, T)
            out += [Gemm(op, model, T, *shapes[op], kernel(op)[2], *kernel(op)[:2]) for op in STEP_OPS if op in ops]
    if lm_head:
        from coda_ext.ops import lm_head_ce

        T = lm_head["M"]
        name = {(build(*args).build().digest(), major): op for op in LM_HEAD_OPS
                for build, args, major in (kernel(op),)}
        launched = lm_head_ce.gemms(T, lm_head["V"], lm_head["K"], True, lm_head.get("chunk_bytes"))
        for graph, major, mnk in launched[1:]:   # [0] is the forward
            op = name[(graph.build().digest(), major)]
            if op in ops:
                out.append(Gemm(op, lm_head["model"], T, *mnk, major, *kernel(op)[:2]))
    return out


def inputs(g: Gemm, i: int, device: Any = "cuda") -> dict:
    """Fresh input set i of a row (tensors on `device`), named as the op calls them."""
    import torch

    gen = rand.generator(g.op, g.model, g.M, g.N, g.K, i, device=device)
    dt = torch.bfloat16
    M, N, K = g.M, g.N, g.K

    def randn(*shape, scale=1.0, dtype=dt):
        return rand.randn(gen, *shape, dtype=dtype, scale=scale)

    if g.kind == "wgrad":      # the step's gradient (tokens, M) and activation (tokens, N), read transposed
        s = dict(dz=randn(K, M, scale=K ** -0.25), x=randn(K, N, scale=K ** -0.25))
        if g.accumulates:
            s["acc"] = randn(M, N)
        if g.op == "lm_head_dw":   # the backward writes each chunk's dW into the whole dW
            s["out"] = torch.empty(M, N, dtype=dt, device=device)
        return s
    if g.kind == "residual":
        return dict(x=randn(M, K), w=randn(N, K, scale=K ** -0.5), res=randn(M, N))
    if g.kind == "dlogits":    # one vocabulary chunk: targets chunk-relative, lse above every logit
        return dict(x=randn(M, K), w=randn(N, K, scale=K ** -0.5), rstd=rand.positive(gen, M),
                    lse=rand.positive(gen, M) + math.log(N), coef=rand.positive(gen, M),
                    g_target=rand.positive(gen, M), target=rand.indices(gen, M, high=N, dtype=torch.int32))
    s = dict(dz=randn(M, K), w=randn(K, N, scale=K ** -0.5))   # the weight (K, N) as stored, read as W = w.t()
    if g.kind == "swiglu":
        s["z"] = randn(M, 2 * N)
    elif g.kind == "norm":
        s.update(x=randn(M, N), rstd=rand.positive(gen, M), gamma=rand.positive(gen, N, dtype=dt),
                 zdz=randn(M, dtype=torch.float32))
    if g.accumulates:
        s["acc"] = randn(M, N)
    return s


def operands(g: Gemm, s: dict):
    """(A (M, K), W (N, K)): the GEMM as the kernel reads it (views of the stored tensors, nothing copied)."""
    if g.kind == "wgrad":
        return s["dz"].t(), s["x"].t()
    if g.kind in ("residual", "dlogits"):
        return s["x"], s["w"]
    return s["dz"], s["w"].t()


def call(g: Gemm, s: dict):
    """The fused op: the ready op, or for the LM head's GEMMs the graph op its backward launches."""
    from coda_ext import ops
    from coda_ext.ops import common

    if g.op == "swiglu_backward_linear":
        return ops.swiglu_backward_linear(s["dz"], s["w"], s["z"])
    if g.kind == "norm":
        return ops.rms_norm_backward_linear(s["dz"], s["w"], s["x"], s["rstd"], s["gamma"], s["zdz"], s.get("acc"))
    if g.op == "linear_dx":
        return ops.linear_dx(s["dz"], s["w"])
    if g.op == "linear_residual":
        return ops.linear_residual(s["x"], s["w"], s["res"])
    if g.op.startswith("weight_grad"):
        return ops.weight_grad(s["dz"], s["x"], s.get("acc"))
    op = common.graph_op(g.build, "bfloat16", "auto", *g.args, major=g.major)
    A, W = operands(g, s)
    tensors = {k: s[k] for k in ("rstd", "lse", "coef", "g_target", "target") if k in s}
    if "acc" in s:
        tensors["residual"] = s["acc"]
    return op.run(A, W, tensors, {"out": s["out"]} if "out" in s else {})


def eager(g: Gemm, s: dict):
    """The same math unfused, as a model would run it in PyTorch."""
    import torch
    import torch.nn.functional as F

    A, W = operands(g, s)
    acc = torch.mm(A, W.t())
    dt = acc.dtype
    if g.kind in ("dx", "wgrad", "residual"):
        tile = s.get("acc", s.get("res"))
        return acc if tile is None else acc + tile
    acc = acc.float()
    if g.kind == "swiglu":
        gate, up = s["z"].float()[:, 0::2], s["z"].float()[:, 1::2]
        sig = torch.sigmoid(gate)
        dg, du = acc * up * sig * (1 + gate * (1 - sig)), acc * F.silu(gate)
        dz = torch.stack([dg, du], -1).flatten(-2)
        return dz.to(dt), (F.silu(gate) * up).to(dt), (gate * dg + up * du).sum(-1)
    if g.kind == "norm":
        r = s["rstd"][:, None]
        xhat = s["x"].float() * r
        gamma = s["gamma"].float()
        dx = (acc * gamma - xhat * (s["zdz"][:, None] / g.N)) * r
        if "acc" in s:
            dx = dx + s["acc"].float()
        return dx.to(dt), (xhat * gamma).to(dt), (acc * xhat).sum(0)
    r = s["rstd"][:, None]      # dlogits
    hit = torch.arange(g.N, device=acc.device)[None, :] == s["target"][:, None]
    dlogits = torch.exp(acc * r - s["lse"][:, None]) * s["coef"][:, None] \
        - torch.where(hit, s["g_target"][:, None], 0.0)
    return (dlogits * r).to(dt), (acc * dlogits).sum(-1)
