"""The epilogue graphs of the backward GEMMs (and linear_residual): coda_ext.ops runs them with the
operand layouts of coda_ext.config.MAJORS, so nothing is transposed in memory. acc is the GEMM's fp32
product (for the dX GEMMs acc = dz @ W)."""
from __future__ import annotations

from ..graph.builder import Graph
from ..graph.math import eq, exp, hi16, join24, lo8, sigmoid, where


def linear(residual: bool, scaled: bool = False) -> Graph:
    """D = [scale ·] acc [+ residual]: linear_residual (residual tile), linear_dx (plain) and weight_grad
    (scale a runtime scalar, residual the gradient it accumulates into) in one family. linear(False) is
    the bare GEMM (identity)."""
    g = Graph()
    acc = g.accumulator()
    if scaled:
        acc = acc * g.scalar("scale")
    g.output(acc + g.tile("residual") if residual else acc)
    return g


def weight_grad_f32(accumulate: bool) -> Graph:
    """A weight gradient kept in fp32 across chunks of rows (the training LM head's dW): no main output;

        store "out" (fp32) = acc [+ tile "acc" (fp32)]

    With accumulate the op may write "out" over "acc" itself (each element is read before it is written)."""
    g = Graph()
    acc = g.accumulator()
    g.store("out", acc + g.tile("acc", "float32") if accumulate else acc, dtype="float32")
    return g


def weight_grad_split(accumulate: bool, final: bool) -> Graph:
    """A weight gradient kept across chunks of rows in 3 bytes an element (the training LM head's dW): the fp32
    sum rounded to 24 bits, its top 16 bits in a bfloat16 tensor and the next 8 in a uint8 one; no main output:

        v          = acc [+ join24(tile "hi_in" (bfloat16), tile "lo_in" (uint8))]     (accumulate)
        store "hi" (bfloat16) = hi16(v),  store "lo" (uint8) = lo8(v)               (not final)
        store "dw" (the op's dtype) = v, rounded once                               (final)

    With accumulate the op may write "hi" over "hi_in", "lo" over "lo_in" and "dw" over "hi_in" (each element is
    read before it is written, "dw" a 16-bit value where "hi_in" held one). Each chunk's sum is rounded to 15
    mantissa bits (relative error 2^-16, a 256th of a bfloat16 rounding); an fp32 accumulator takes 4 bytes."""
    g = Graph()
    v = g.accumulator()
    if accumulate:
        v = v + join24(g.tile("hi_in", "bfloat16"), g.tile("lo_in", "uint8"))
    if final:
        g.store("dw", v)
    else:
        g.store("hi", hi16(v), dtype="bfloat16")
        g.store("lo", lo8(v), dtype="uint8")
    return g


def rms_norm_backward_linear(accumulate: bool, store_n: bool = True, dgamma: bool = True) -> Graph:
    """RMSNorm backward in the dX GEMM that follows it (the ZdZ identity), acc = dz @ W = dL/dn:

        x̂        = x ⊙row rstd
        D "dx"   = [dx_in +] (acc ⊙col γ − x̂ ⊙row (zdz · inv_d)) ⊙row rstd   (dx_in if accumulate)
        n        = x̂ ⊙col γ                 (store: the weight gradient's input, recomputed)
        dgamma   = Σ_m acc · x̂              (column reduction, fp32)
    γ = norm_weight, zdz (M,) fp32 = Σ_k z_k dz_k, inv_d = 1/d a runtime scalar. store_n / dgamma False
    leave that output out (the ablation of benchmarks/ablate_epilogue.py)."""
    g = Graph()
    acc = g.accumulator()
    rstd = g.col_vector("rstd", "float32")
    gamma = g.row_vector("norm_weight")
    xhat = g.tile("x") * rstd
    dx = (acc * gamma - xhat * (g.col_vector("zdz", "float32") * g.scalar("inv_d"))) * rstd
    g.output(g.tile("dx_in") + dx if accumulate else dx, name="dx")
    if store_n:
        g.store("n", xhat * gamma)
    if dgamma:
        g.col_reduce("dgamma", acc * xhat, "sum")
    return g


def swiglu_backward_linear(store_dz: bool = True, store_y: bool = True, reduce: bool = True) -> Graph:
    """SwiGLU backward in the down projection's dX GEMM, acc = dy @ W_down = dL/d(silu(g)·u):

        (g, u) = z[:, 2i], z[:, 2i+1]            (pair tile "z": the saved interleaved pre-activation)
        dg     = acc · u · σ(g) · (1 + g (1 − σ(g))),   du = acc · silu(g)
        dz     = (dg, du) interleaved             (pair store, (M, 2F))
        y      = silu(g) · u                      (store: the down projection's weight-gradient input)
        zdz    = Σ_i (g·dg + u·du)                (row reduction, fp32: ZdZ for the norm backward)
    store_dz / store_y / reduce False leave that output out (the ablation of benchmarks/ablate_epilogue.py)."""
    g = Graph()
    acc = g.accumulator()
    gate, up = g.pair_tile("z")
    sig = sigmoid(gate)
    silu = gate * sig
    dg = acc * up * sig * (1.0 + gate * (1.0 - sig))
    du = acc * silu
    if store_dz:
        g.store_pairs("dz", dg, du)
    if store_y:
        g.store("y", silu * up)
    if reduce:
        g.row_reduce("zdz", gate * dg + up * du, "sum")
    return g


def pair_tile_read() -> Graph:
    """D = acc · z[:, 2i+1]: the dSwiGLU's pair tile read with one half-width output, nothing else (the
    ablation's load path alone)."""
    g = Graph()
    acc = g.accumulator()
    _, up = g.pair_tile("z")
    g.output(acc * up)
    return g


def swiglu_backward_math() -> Graph:
    """The dSwiGLU's math with the accumulator standing in for the saved gate and up: no tile input, one
    half-width output, as the plain GEMM (the ablation's math alone, benchmarks/epilogue_timeline.py --ablate)."""
    g = Graph()
    acc = g.accumulator()
    sig = sigmoid(acc)
    silu = acc * sig
    dg = acc * acc * sig * (1.0 + acc * (1.0 - sig))
    g.output(dg + acc * silu + silu * acc)
    return g


def lm_head_cross_entropy_backward(scaled: bool) -> Graph:
    """dlogits of one vocabulary chunk of the LM head (target is chunk-relative):

        logits  = acc [⊙row rstd]
        dlogits = exp(logits − lse) · coef − where(n == target, g_target, 0)   (softmax · coef − onehot · g)
        D "dacc" = dlogits [⊙row rstd]
        drstd   = Σ_n acc · dlogits                (row reduction, only if scaled)"""
    g = Graph()
    acc = g.accumulator()
    rstd = g.col_vector("rstd", "float32") if scaled else None
    logits = acc * rstd if scaled else acc
    hit = eq(g.col_index(), g.col_vector("target", "int32"))
    dlogits = exp(logits - g.col_vector("lse", "float32")) * g.col_vector("coef", "float32") \
        - where(hit, g.col_vector("g_target", "float32"), 0.0)
    if scaled:
        g.output(dlogits * rstd, name="dacc")
        g.row_reduce("drstd", acc * dlogits, "sum")
    else:
        g.output(dlogits, name="dacc")
    return g
