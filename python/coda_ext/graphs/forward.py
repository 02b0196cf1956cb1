"""The epilogue graphs of the forward ops (coda_ext.ops runs them; libcoda's kernels are emitted from
them; the block analysis models them). acc = A @ Wᵀ in fp32 (M × N); "⊙row" scales row m by a
per-token value, "⊙col" column n by a per-feature one."""
from __future__ import annotations

from collections.abc import Callable

from ..errors import GraphError
from ..graph.builder import Graph, Value
from ..graph.math import eq, exp, fma, gelu, relu, rotate_pairs, rsqrt, segment_reduce, silu, swiglu_pairs, turns, where

#: rms_linear's activations: name -> its epilogue function (None: no activation; "gelu" is the erf form).
ACTIVATIONS: dict[str | None, Callable[[Value], Value]] = {
    None: lambda v: v, "silu": silu, "relu": relu,
    "gelu": gelu, "gelu_tanh": lambda v: gelu(v, approximate="tanh"),
}


def linear_residual_norm(residual: bool = True, reduce: bool = True) -> Graph:
    """Output projection + residual + the next RMSNorm's weight and statistic (CODA K1/K3):

        out   = acc + residual         (D, the new residual stream)
        h     = out ⊙col norm_weight   (store "h": the next GEMM's input)
        sumsq = Σ_n out²               (row reduction, fp32: rstd = rsqrt(sumsq / N + eps))
    residual / reduce False leave out the residual tile / the row statistic (each part timed apart:
    benchmarks/epilogue_timeline.py --forward --ablate)."""
    g = Graph()
    out = g.accumulator() + g.tile("residual") if residual else g.accumulator()
    g.output(out)
    g.store("h", out * g.row_vector("norm_weight"))
    if reduce:
        g.row_reduce("sumsq", out, "sumsq")
    return g


def rms_linear(activation: str | None = None) -> Graph:
    """The consuming half of a fused RMSNorm: D = act(acc ⊙row rstd), rstd (M,) fp32; activation one
    of ACTIVATIONS (None, "silu", "relu", "gelu", "gelu_tanh")."""
    if activation not in ACTIVATIONS:
        raise GraphError(f"rms_linear: activation must be one of {list(ACTIVATIONS)}, got {activation!r}")
    g = Graph()
    g.output(ACTIVATIONS[activation](g.accumulator() * g.col_vector("rstd", "float32")))
    return g


def linear_swiglu(scaled: bool, store_preact: bool) -> Graph:
    """SwiGLU on interleaved gate/up columns (CODA K2):

        z       = acc [⊙row rstd]              (rstd (M,) fp32 if scaled)
        y[:, i] = silu(z[:, 2i]) · z[:, 2i+1]  (store "y", half width)
        D "z"   = z                            (only if store_preact: the pre-activation for backward)"""
    g = Graph()
    z = g.accumulator()
    if scaled:
        z = z * g.col_vector("rstd", "float32")
    if store_preact:
        g.output(z, name="z")
    g.store("y", swiglu_pairs(z))
    return g


def qkv_rope(scaled: bool, qk_norm: bool, head_dim: int, rope: str | None = "vectors") -> Graph:
    """QKV projection + (QK-norm) + RoPE on adjacent pairs (CODA K4):

        z     = acc [⊙row rstd]
        z     = z · (norm_b · rsqrt(mean_h(z²) + eps) + norm_a)   if qk_norm: per head h of head_dim
                columns; norm_b = γ on Q/K columns (0 on V), norm_a = 1 on V columns (0 on Q/K)
        t     = frac(positions · (freq_hi + freq_lo))             turns, reduced exactly
        D "qkv" = each pair (z[2i], z[2i+1]) rotated by 2π·t      (freq 0 on V: passed through)

    Without QK-norm the graph does not depend on head_dim. rope: "vectors" (the op's: positions per row,
    frequencies per column), "scalars" (positions and frequencies launch scalars: one angle for the launch) or None
    (z stored unrotated); the last two time the rotation's parts apart (benchmarks/epilogue_timeline.py --forward
    --ablate)."""
    if rope not in ("vectors", "scalars", None):
        raise GraphError(f"qkv_rope: rope must be 'vectors', 'scalars' or None, got {rope!r}")
    g = Graph()
    z = g.accumulator()
    if scaled:
        z = z * g.col_vector("rstd", "float32")
    if qk_norm:
        inv_rms = rsqrt(segment_reduce(z, head_dim, "sumsq") * (1.0 / head_dim) + g.scalar("eps"))
        z = z * fma(g.row_vector("norm_b", "float32"), inv_rms, g.row_vector("norm_a", "float32"))
    if rope == "vectors":
        z = rotate_pairs(z, turns(g.col_vector("positions", "float32"), g.row_vector("freq_hi", "float32"),
                                  g.row_vector("freq_lo", "float32")))
    elif rope == "scalars":
        z = rotate_pairs(z, turns(g.scalar("positions"), g.scalar("freq_hi"), g.scalar("freq_lo")))
    g.output(z, name="qkv")
    return g


def lm_head_cross_entropy(scaled: bool) -> Graph:
    """LM head + cross-entropy statistics, no logits written:

        logits       = acc [⊙row rstd]
        lse          = logsumexp_n(logits)                    (online, per-tile partials)
        target_logit = Σ_n where(n == target[m], logits, 0)   (target (M,) int32)
    so loss = lse − target_logit."""
    g = Graph()
    logits = g.accumulator()
    if scaled:
        logits = logits * g.col_vector("rstd", "float32")
    g.row_reduce("lse", logits, "logsumexp")
    picked = where(eq(g.col_index(), g.col_vector("target", "int32")), logits, 0.0)
    g.row_reduce("target_logit", picked, "sum")
    return g


def lm_head_cross_entropy_train(scaled: bool) -> Graph:
    """The training LM head's logits GEMM (rows chunk by chunk): the unnormalized softmax written for the
    gradients that follow in the same pass, and its row sum (the op takes the target logit from a dot
    product of M rows, outside the GEMM):

        logits  = acc [⊙row rstd]
        D "e"   = exp(logits)                 (16-bit: the op keeps |lse| in range)
        sumexp  = Σ_n exp(logits)             (lse = log sumexp: one exp per element)"""
    g = Graph()
    logits = g.accumulator()
    if scaled:
        logits = logits * g.col_vector("rstd", "float32")
    e = exp(logits)
    g.output(e, name="e")
    g.row_reduce("sumexp", e, "sum")
    return g
