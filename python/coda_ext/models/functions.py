"""The two autograd Functions of a Llama decoder layer, with the CODA fusions in their backward:

    QKVRoPE   x -> (q, k, v, x)        input RMSNorm (statistic and h = x ⊙ γ in one element-wise pass,
                                       ops.rms_norm_input; rstd folded into the QKV GEMM) + QKV
                                       projection + RoPE; x handed on unchanged (the residual stream)
    (attention: torch SDPA under ordinary autograd)
    MLPBlock  (y0, x) -> x2            output projection + residual + post-attention RMSNorm, gate/up
                                       GEMM + SwiGLU, down projection + residual

The residual stream runs through both: MLPBlock takes the x that QKVRoPE handed on, so x has one
consumer in the autograd graph and its two gradients are never summed by autograd in a pass of their
own: MLPBlock's dx comes back to QKVRoPE's backward, whose QKV dX GEMM adds it in its epilogue.

Backward of MLPBlock, given dx2 (CODA): the SwiGLU backward runs in the down projection's dX GEMM
(which also yields the ZdZ statistic of the gate/up GEMM), the post-attention norm's backward in
the gate/up dX GEMM (accumulating the residual gradient dx2). QKVRoPE's backward, given dq, dk, dv
and the residual's gradient dx1 (MLPBlock's dx): rotates them back (element-wise, with its ZdZ) and
finishes the input norm's backward
in the QKV dX GEMM, accumulating dx1 there. Saved: QKVRoPE x, rstd, qkv;
MLPBlock y0, x1, rstd1, z1 (h, n, y1 are recomputed in epilogues).

Each Function takes `impl`: "fused" runs coda_ext.ops (16-bit CUDA tensors on an SM90 GPU),
"reference" runs the same data flow with every op's fp32 reference (any device; outputs cast to
the input dtype), so the autograd wiring is testable without a GPU.
"""
from __future__ import annotations

import math

import torch

from .. import ops
from ..ops import linear_grad, lm_head_ce, norm_backward, residual_norm, rope_backward, swiglu, swiglu_backward
from ..ops import qkv as qkv_mod

IMPLS = ("auto", "fused", "reference")

#: Where the fused layers' weight gradients dzᵀ @ x run — GEMMs with nothing in their epilogue: "cublas"
#: (torch.mm on the stored tensors, transposes folded into cuBLAS's operand modes) or "coda" (ops.weight_grad,
#: the project's own kernel). Read when a backward runs (or, under torch.compile, when it is traced: a compiled
#: backward keeps the choice it was traced with); weight_grad_backend(name) switches it for a block, process-wide.
WEIGHT_GRAD_BACKENDS = ("cublas", "coda")
_weight_grad = {"backend": "cublas"}


def weight_grad_backend(name: str):
    """Within the block (a context manager), the fused layers compute their weight gradients with `name`
    (WEIGHT_GRAD_BACKENDS)."""
    return ops.common.switched(_weight_grad, name, WEIGHT_GRAD_BACKENDS, "weight_grad_backend")


def _fused_weight_grad(dz: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """dzᵀ @ x over every leading row, in dz's dtype, by the backend weight_grad_backend chose."""
    if _weight_grad["backend"] == "coda":
        return ops.weight_grad(dz, x)
    return torch.mm(ops.common.rows(dz).t(), ops.common.rows(x))


class _Fused:
    """coda_ext.ops, as they are."""
    qkv_rope = staticmethod(ops.qkv_rope)
    qkv_rope_backward = staticmethod(ops.qkv_rope_backward)
    rms_norm_backward_linear = staticmethod(ops.rms_norm_backward_linear)
    linear_residual_norm = staticmethod(ops.linear_residual_norm)
    linear_swiglu_train = staticmethod(ops.linear_swiglu_train)
    linear_residual = staticmethod(ops.linear_residual)
    swiglu_backward_linear = staticmethod(ops.swiglu_backward_linear)
    linear_dx = staticmethod(ops.linear_dx)
    weight_grad = staticmethod(_fused_weight_grad)
    lm_head_cross_entropy = staticmethod(ops.lm_head_cross_entropy)


def _inv_freq(freqs: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Radians per position of each pair (fp64), from a rope_frequencies table (turns, hi + lo)."""
    f = freqs[:, 0:head_dim:2].double()
    return (f[0] + f[1]) * (2 * math.pi)


class _Reference:
    """The fp32 references of coda_ext.ops with the fused ops' signatures and output dtypes."""

    @staticmethod
    def qkv_rope(h, w, positions, freqs, n_heads, n_kv_heads, rstd=None):
        hd = w.shape[0] // (n_heads + 2 * n_kv_heads)
        out = qkv_mod.reference(h, w, positions, n_heads, n_kv_heads, inv_freq=_inv_freq(freqs, hd), rstd=rstd)
        return out.to(h.dtype)

    @staticmethod
    def qkv_rope_backward(dqkv, qkv, positions, freqs, n_heads, n_kv_heads, shared_heads=None):
        dz, zdz = rope_backward.reference(dqkv, qkv, positions, freqs, n_heads, n_kv_heads)
        return dz.to(qkv.dtype), zdz

    @staticmethod
    def rms_norm_backward_linear(dz, w, x, rstd, norm_weight, zdz, dx_in=None):
        dx, n, dgamma = norm_backward.reference(dz, w, x, rstd, norm_weight, zdz, dx_in)
        return dx.to(dz.dtype), n.to(dz.dtype), dgamma

    @staticmethod
    def linear_residual_norm(x, w, residual, norm_weight, eps=1e-6):
        out, h, rstd = residual_norm.reference(x, w, residual, norm_weight, eps)
        return out.to(x.dtype), h.to(x.dtype), rstd

    @staticmethod
    def linear_swiglu_train(x, w, rstd=None):
        y, z = swiglu.reference(x, w, rstd)
        return y.to(x.dtype), z.to(x.dtype)

    @staticmethod
    def linear_residual(x, w, residual):
        return linear_grad.reference_linear_residual(x, w, residual).to(x.dtype)

    @staticmethod
    def swiglu_backward_linear(dy, w, z, overwrite_z=False):
        dz, y, zdz = swiglu_backward.reference(dy, w, z)
        if overwrite_z:   # as the fused op: dz in z's memory
            return z.copy_(dz), y.to(dy.dtype), zdz
        return dz.to(dy.dtype), y.to(dy.dtype), zdz

    @staticmethod
    def linear_dx(dz, w):
        return linear_grad.reference_linear_dx(dz, w).to(dz.dtype)

    @staticmethod
    def weight_grad(dz, x, accumulate=None):
        return linear_grad.reference_weight_grad(dz, x, accumulate).to(dz.dtype)

    @staticmethod
    def lm_head_cross_entropy(x, w, target, rstd=None, ignore_index=-100, reduction="mean"):
        return lm_head_ce.reference(x, w, target, rstd, ignore_index, reduction)


BACKENDS = {"fused": _Fused, "reference": _Reference}


def resolve_impl(impl: str, x: torch.Tensor) -> str:
    """"fused" or "reference" for a call on x. "auto": fused on CUDA tensors, the fp32 references
    elsewhere (there is no fused kernel off the GPU)."""
    if impl == "auto":
        return "fused" if x.is_cuda else "reference"
    if impl == "fused" and not x.is_cuda:
        raise ValueError(f"impl='fused' runs coda_ext's kernels on an SM90 GPU, but the input is on {x.device}; move "
                         "the model and its inputs to CUDA, or use impl='reference' (the fp32 references)")
    if impl not in BACKENDS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    return impl


def _grad(needed: bool, fn):
    return fn() if needed else None


class QKVRoPE(torch.autograd.Function):
    """(q, k, v, x): qkv = RoPE(RMSNorm(x) @ W_qkvᵀ) as its heads, q (..., n_heads, head_dim), k and v
    (..., n_kv_heads, head_dim) (views of one (..., N) tensor), RMSNorm(x) = x·rstd ⊙ γ: rstd in torch
    (fp32), h = x ⊙ γ, and the QKV GEMM scales its rows by rstd. The backward takes attention's dq, dk, dv
    as they come. x comes back as it went in (autograd makes it a view whose gradient returns here): give it
    to MLPBlock, and the residual's gradient is added in this backward's QKV dX GEMM (dx_in) instead of by
    autograd.
    freqs: a table of ops.rope_frequencies (every head at the same frequencies: the backward's RoPE pass
    computes one head's cosines and sines, also under torch.compile; another layout is refused)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, norm_weight: torch.Tensor, w_qkv: torch.Tensor, positions: torch.Tensor,
                freqs: torch.Tensor, n_heads: int, n_kv_heads: int, eps: float, impl: str):
        be = BACKENDS[impl]
        h, rstd = ops.rms_norm_input(x, norm_weight, eps)     # one element-wise pass on a GPU
        qkv = be.qkv_rope(h, w_qkv.to(x.dtype), positions, freqs, n_heads, n_kv_heads, rstd=rstd)
        ctx.save_for_backward(x, norm_weight, w_qkv, positions, freqs, rstd, qkv)
        ctx.heads, ctx.impl = (n_heads, n_kv_heads), impl
        ctx.set_materialize_grads(False)   # an output that does not reach the loss gets None, not zeros
        hd = qkv.shape[-1] // (n_heads + 2 * n_kv_heads)
        q, k, v = qkv.unflatten(-1, (n_heads + 2 * n_kv_heads, hd)).split([n_heads, n_kv_heads, n_kv_heads], dim=-2)
        return q, k, v, x

    @staticmethod
    def backward(ctx, dq: torch.Tensor | None, dk: torch.Tensor | None, dv: torch.Tensor | None,
                 dx_res: torch.Tensor | None):
        x, norm_weight, w_qkv, positions, freqs, rstd, qkv = ctx.saved_tensors
        be, dt = BACKENDS[ctx.impl], x.dtype
        dx_in = None if dx_res is None else dx_res.to(dt).contiguous()
        if dq is None and dk is None and dv is None:   # only the handed-on x reached the loss
            return dx_in, None, None, None, None, None, None, None, None
        n_heads, n_kv_heads = ctx.heads
        hd = qkv.shape[-1] // (n_heads + 2 * n_kv_heads)
        lead = qkv.shape[:-1]
        parts = tuple(qkv.new_zeros(*lead, n, hd) if d is None else d.to(dt)
                      for d, n in ((dq, n_heads), (dk, n_kv_heads), (dv, n_kv_heads)))
        # the layers' tables come from rope_frequencies (ModelConfig.rope_table, the torchtitan adapter)
        dz, zdz = be.qkv_rope_backward(parts, qkv, positions, freqs, n_heads, n_kv_heads, shared_heads=True)
        w = w_qkv.to(dt)
        dx, n, dgamma = be.rms_norm_backward_linear(dz, w, x, rstd, norm_weight.to(dt), zdz, dx_in=dx_in)
        need = ctx.needs_input_grad
        dw = _grad(need[2], lambda: be.weight_grad(dz, n).to(w_qkv.dtype))
        return dx, dgamma.to(norm_weight.dtype), dw, None, None, None, None, None, None


class MLPBlock(torch.autograd.Function):
    """x2 = x1 + SwiGLU(RMSNorm(x1) @ W_guᵀ) @ W_downᵀ with x1 = y0 @ W_oᵀ + x (x: the residual stream as
    QKVRoPE handed it on). W_gu rows interleaved gate/up. Returns x2 (..., d)."""

    @staticmethod
    def forward(ctx, y0: torch.Tensor, x: torch.Tensor, w_o: torch.Tensor, norm_weight: torch.Tensor,
                w_gu: torch.Tensor, w_down: torch.Tensor, eps: float, impl: str) -> torch.Tensor:
        be, dt = BACKENDS[impl], y0.dtype
        x1, h1, r1 = be.linear_residual_norm(y0, w_o.to(dt), x.to(dt), norm_weight.to(dt), eps)
        y1, z1 = be.linear_swiglu_train(h1, w_gu.to(dt), r1)
        x2 = be.linear_residual(y1, w_down.to(dt), x1)
        ctx.save_for_backward(y0, x1, r1, z1, w_o, norm_weight, w_gu, w_down)
        ctx.impl, ctx.x_dtype = impl, x.dtype
        return x2

    @staticmethod
    def backward(ctx, dx2: torch.Tensor):
        y0, x1, r1, z1, w_o, norm_weight, w_gu, w_down = ctx.saved_tensors
        be, dt = BACKENDS[ctx.impl], y0.dtype
        need = ctx.needs_input_grad
        dx2 = dx2.to(dt).contiguous()
        # dz1 over z1 (needed no more) unless the graph runs again (retain_graph) or is traced
        dz1, y1, zdz1 = be.swiglu_backward_linear(dx2, w_down.to(dt), z1, overwrite_z=_saved_used_once(z1))
        dw_down = _grad(need[5], lambda: be.weight_grad(dx2, y1).to(w_down.dtype))
        dx1, n1, dgamma = be.rms_norm_backward_linear(dz1, w_gu.to(dt), x1, r1, norm_weight.to(dt), zdz1, dx_in=dx2)
        dw_gu = _grad(need[4], lambda: be.weight_grad(dz1, n1).to(w_gu.dtype))
        dy0 = _grad(need[0], lambda: be.linear_dx(dx1, w_o.to(dt)))
        dw_o = _grad(need[2], lambda: be.weight_grad(dx1, y0).to(w_o.dtype))
        return dy0, dx1.to(ctx.x_dtype), dw_o, dgamma.to(norm_weight.dtype), dw_gu, dw_down, None, None


def _saved_used_once(t: torch.Tensor) -> bool:
    """Whether a backward may overwrite t, a tensor its Function saved for it alone: the graph is freed after
    this backward (retain_graph off; unknown: no), and t is contiguous with values (not traced)."""
    return not (ops.common.traced(t) or ops.common.graph_kept()) and t.is_contiguous()


def lm_head_loss(h: torch.Tensor, w_lm: torch.Tensor, target: torch.Tensor, rstd: torch.Tensor | None,
                 ignore_index: int, impl: str, reduction: str = "mean", chunk_bytes: int | None = None) -> torch.Tensor:
    """Cross-entropy of logits = [rstd ⊙row] (h @ W_lmᵀ) against target ('mean' over the targets that
    are not ignore_index, or 'sum'), without the M × V logits (fused: ops.lm_head_cross_entropy_loss, the
    gradients with the loss in three GEMMs when training in bf16, chunk_bytes its chunk budget; reference:
    fp32 torch)."""
    if impl == "fused":
        return ops.lm_head_cross_entropy_loss(h, w_lm.to(h.dtype), target, rstd, ignore_index, reduction,
                                              chunk_bytes=chunk_bytes)
    loss, _ = BACKENDS[impl].lm_head_cross_entropy(h, w_lm.to(h.dtype), target, rstd, ignore_index, reduction)
    return loss


def training_kernels(config, tokens: int, dtype: str = "bfloat16", lm_head: bool = True, lm_head_rstd: bool = True,
                     sms: int | None = None, lm_head_chunk_bytes: int | None = None) -> list:
    """(graph, dtype, kernel config) of every kernel one training step of a CodaLlamaForCausalLM with
    `config` (a LlamaConfig) launches at `tokens` = batch × seq tokens with the fused impl, for
    coda_ext.prebuild (in parallel, before training; nvcc only, no GPU). lm_head=False: the layers
    only; lm_head_rstd=False: an LM head fed normalized rows (coda_ext.hf's loss). sms: the GPU's SM
    count (default: this machine's GPU, else an H100's); lm_head_chunk_bytes: the LM head's chunk budget
    (ops.lm_head_cross_entropy_loss's chunk_bytes). The weight gradients' kernels are listed only where
    weight_grad_backend is "coda" (cuBLAS runs them otherwise)."""
    from ..runtime.tuned import auto_items

    lm_head_ce.check_chunk_bytes("training_kernels", lm_head_chunk_bytes, "lm_head_chunk_bytes")
    M, d, F_, hd = tokens, config.hidden_size, config.intermediate_size, config.head_dim
    Nq, Do = config.qkv_size, config.num_attention_heads * hd
    gemms = [  # (graph, major, (M, N, K) as launched)
        (qkv_mod.graph(True, False, hd), "kk", (M, Nq, d)),           # QKVRoPE forward
        (residual_norm.graph(), "kk", (M, d, Do)),                    # MLPBlock forward
        (swiglu.graph(True, True), "kk", (M, 2 * F_, d)),
        (linear_grad.graph(True), "kk", (M, d, F_)),
        (swiglu_backward.graph(), "kn", (M, F_, d)),                  # MLPBlock backward
        (norm_backward.graph(True), "kn", (M, d, 2 * F_)),
        (linear_grad.graph(False), "kn", (M, Do, d)),
        (norm_backward.graph(True), "kn", (M, d, Nq)),                # QKVRoPE backward (+ MLPBlock's dx)
    ]
    if _weight_grad["backend"] == "coda":   # the weight gradients of down, gate/up, o and QKV
        gemms += [(linear_grad.graph(False), "mn", mnk) for mnk in ((d, F_, M), (2 * F_, d, M), (d, Do, M),
                                                                    (Nq, d, M))]
    if lm_head:
        gemms += lm_head_ce.gemms(M, config.vocab_size, d, lm_head_rstd,
                                  train=dtype == "bfloat16" and config.vocab_size % 8 == 0,
                                  train_chunk_bytes=lm_head_chunk_bytes)
    return auto_items(gemms, dtype, sms)
