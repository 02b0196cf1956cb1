"""QKV projection + RoPE (+ QK-norm) in one GEMM epilogue (CODA K4):

    z   = [rstd ⊙row] (x @ weightᵀ)                    weight = [W_q; W_k; W_v], GQA head counts
    z_h = z_h ⊙ γ · rsqrt(mean(z_h²) + eps)            per Q and K head, if QK-norm (Qwen3, OLMo-2)
    out = RoPE(z) on Q and K heads, V passed through

RoPE uses the adjacent-pair convention: out[2i] = a·cosθ − b·sinθ, out[2i+1] = b·cosθ + a·sinθ
for (a, b) = (z[2i], z[2i+1]), θ = position · inv_freq[i]. Hugging Face checkpoints store Q and K
in the rotate-half order: convert their rows (and the QK-norm weights) once with
coda_ext.ops.rotate_half_to_pairs; attention scores need no conversion back (q and k carry the
same permutation). In the graph the rotation is coda_ext.rotate_pairs (one sine and cosine per pair),
and the angle is reduced exactly in turns (coda_ext.turns): frequencies come as a float pair
(rope_frequencies), so positions of 10⁵ and more keep full precision.

Backward (autograd), without QK-norm, from the saved output qkv, positions and freqs: the RoPE is
rotated back element-wise (rope_backward.qkv_rope_backward: dz and zdz = Σ qkv·dqkv = Σ z·dz, the
rotation being orthogonal), then

    dacc = [rstd ·] dz rounded to x's dtype,   drstd = zdz / rstd
    dx = dacc @ weight (coda_ext::linear_dx),  dweight = daccᵀ @ x (coda_ext::weight_grad)

With QK-norm the per-head RMSNorm is differentiated in between (element-wise, on z recomputed by one
plain GEMM): see _qk_norm_backward; q_norm_weight and k_norm_weight get their gradients through the
(norm_a, norm_b) vectors qk_norm_vectors builds from them.
"""
from __future__ import annotations

import math

import torch

from .. import graphs
from . import common, rope_backward
from .rope_backward import qkv_rope_backward

NAME = "qkv_rope"


def default_inv_freq(head_dim: int, theta: float = 10000.0) -> torch.Tensor:
    """Llama's inverse frequencies (radians per position) of the head_dim/2 pairs, fp64."""
    return 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)


def rope_frequencies(head_dim: int, n_heads: int, n_kv_heads: int, theta: float = 10000.0,
                     inv_freq: torch.Tensor | None = None, device=None) -> torch.Tensor:
    """The (2, N) fp32 table qkv_rope takes, N = (n_heads + 2 n_kv_heads) · head_dim: per column its
    pair's frequency in turns per position, as a hi + lo float pair; 0 on V (no rotation).
    inv_freq (head_dim/2,), radians per position, overrides theta (e.g. Llama 3's scaled ones).
    Compute it once per model, not per step."""
    if head_dim % 2:
        raise ValueError(f"rope_frequencies: head_dim must be even, got {head_dim}")
    f = (default_inv_freq(head_dim, theta) if inv_freq is None else inv_freq.detach().double().cpu())
    if tuple(f.shape) != (head_dim // 2,):
        raise ValueError(f"rope_frequencies: inv_freq must have shape ({head_dim // 2},), got {tuple(f.shape)}")
    turns = f / (2 * math.pi)
    per_head = torch.stack([turns, turns], dim=-1).reshape(head_dim)
    cols = torch.cat([per_head.repeat(n_heads + n_kv_heads), torch.zeros(n_kv_heads * head_dim, dtype=torch.float64)])
    hi = cols.float()
    lo = (cols - hi.double()).float()
    return torch.stack([hi, lo]).to(device)


#: The op's epilogue graph (coda_ext.graphs): graph(scaled, qk_norm, head_dim).
graph = graphs.qkv_rope


def reference(x: torch.Tensor, weight: torch.Tensor, positions: torch.Tensor, n_heads: int, n_kv_heads: int,
              inv_freq: torch.Tensor | None = None, theta: float = 10000.0, rstd: torch.Tensor | None = None,
              q_norm_weight: torch.Tensor | None = None, k_norm_weight: torch.Tensor | None = None,
              eps: float = 1e-6) -> torch.Tensor:
    """fp32 reference (angles in fp64), written head by head: the (..., N) output of qkv_rope."""
    z = x.float() @ weight.float().t()
    if rstd is not None:
        z = rstd.float()[..., None] * z
    hd = weight.shape[0] // (n_heads + 2 * n_kv_heads)
    heads = z.reshape(*z.shape[:-1], n_heads + 2 * n_kv_heads, hd)
    q, k, v = heads.split([n_heads, n_kv_heads, n_kv_heads], dim=-2)
    if q_norm_weight is not None:
        q = q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + eps) * q_norm_weight.float()
        k = k * torch.rsqrt(k.pow(2).mean(-1, keepdim=True) + eps) * k_norm_weight.float()
    f = default_inv_freq(hd, theta) if inv_freq is None else inv_freq.double().cpu()
    angle = positions.double()[..., None, None] * f.to(positions.device)      # (..., 1, hd/2)
    cos, sin = torch.cos(angle).float(), torch.sin(angle).float()

    def rotate(t):
        a, b = t[..., 0::2], t[..., 1::2]
        return torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).flatten(-2)

    return torch.cat([rotate(q), rotate(k), v], dim=-2).flatten(-2)


@common.direct
@torch.library.custom_op("coda_ext::qkv_rope", mutates_args=())
def _op(x: torch.Tensor, weight: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor,
        rstd: torch.Tensor | None, norm_a: torch.Tensor | None, norm_b: torch.Tensor | None,
        n_heads: int, n_kv_heads: int, eps: float) -> torch.Tensor:
    return common.run_gemm(NAME, **_gemm(x, weight, positions, freqs, rstd, norm_a, norm_b, n_heads, n_kv_heads,
                                         eps)).qkv


def _gemm(x, weight, positions, freqs, rstd, norm_a, norm_b, n_heads, n_kv_heads, eps):
    """The op's GEMM, as common.run_gemm and check_gemm take it, once the head counts fit weight and freqs."""
    head_dim = _head_dim(weight, n_heads, n_kv_heads)
    _check_table(freqs, n_heads, n_kv_heads, head_dim)
    freq_hi, freq_lo = freqs.unbind(0)
    inputs = {"positions": positions, "freq_hi": freq_hi, "freq_lo": freq_lo}
    if rstd is not None:
        inputs["rstd"] = rstd
    if norm_a is not None:
        inputs.update(norm_a=norm_a, norm_b=norm_b, eps=eps)
    return dict(build=graph, args=(rstd is not None, norm_a is not None, head_dim), A=x, W=weight, inputs=inputs)


def _head_dim(weight: torch.Tensor, n_heads: int, n_kv_heads: int) -> int:
    """The head_dim of a [W_q; W_k; W_v] weight of n_heads + 2·n_kv_heads heads: 64 or 128."""
    n_cols = n_heads + 2 * n_kv_heads
    if n_heads < 1 or n_kv_heads < 1 or weight.shape[0] % n_cols:
        raise ValueError(f"{NAME}: weight has {weight.shape[0]} rows, not a multiple of n_heads + 2·n_kv_heads = "
                         f"{n_cols} heads")
    hd = int(weight.shape[0] // n_cols)
    if hd not in (64, 128):
        raise ValueError(f"{NAME}: head_dim {hd} is not supported; use 64 or 128")
    return hd


def _check_table(freqs: torch.Tensor, n_heads: int, n_kv_heads: int, head_dim: int) -> None:
    """freqs (2, N) fp32 laid out as rope_frequencies(head_dim, n_heads, n_kv_heads) lays it out: every Q and K
    head with the first one's pair frequencies, 0 on V. Its values are read once per table and version (not
    while traced, on meta tensors or in CUDA-graph capture: no values there): a table built for other head
    counts or another head_dim has the right shape but rotates the wrong columns."""
    N = (n_heads + 2 * n_kv_heads) * head_dim
    if not isinstance(freqs, torch.Tensor) or tuple(freqs.shape) != (2, N) or freqs.dtype != torch.float32:
        raise ValueError(f"{NAME}: freqs must be the (2, {N}) float32 table of "
                         "coda_ext.ops.rope_frequencies(head_dim, n_heads, n_kv_heads, ...)")
    if common.readable(freqs) and not rope_backward._one_head_table(freqs, n_heads + n_kv_heads, head_dim):
        raise ValueError(f"{NAME}: freqs is not the table of rope_frequencies(head_dim={head_dim}, "
                         f"n_heads={n_heads}, n_kv_heads={n_kv_heads}) (every Q and K head with the first head's "
                         "pair frequencies, 0 on V): was it built for other head counts or another head_dim?")


@_op.register_fake
def _fake(x, weight, positions, freqs, rstd, norm_a, norm_b, n_heads, n_kv_heads, eps):
    common.check_gemm(NAME, **_gemm(x, weight, positions, freqs, rstd, norm_a, norm_b, n_heads, n_kv_heads, eps))
    return x.new_empty(x.shape[0], weight.shape[0])


def _setup_context(ctx, inputs, output):
    x, weight, positions, freqs, rstd, norm_a, norm_b, n_heads, n_kv_heads, eps = inputs
    ctx.qk_norm = norm_a is not None
    ctx.heads, ctx.eps = (n_heads, n_kv_heads), eps
    ctx.save_for_backward(x, weight, positions, freqs, rstd, output, norm_a, norm_b)


def _backward(ctx, dqkv):
    x, weight, positions, freqs, rstd, qkv, norm_a, norm_b = ctx.saved_tensors
    need_x, need_w, _, _, need_rstd, need_a, need_b = ctx.needs_input_grad[:7]
    dz, zdz = qkv_rope_backward(dqkv, qkv, positions, freqs, *ctx.heads)   # RoPE rotated back
    da = db = None
    if ctx.qk_norm:
        dz, zdz, da, db = _qk_norm_backward(dz, x, weight, rstd, norm_a, norm_b, ctx.eps, sum(ctx.heads) +
                                            ctx.heads[1], need_a, need_b)
    drstd = zdz / rstd.float() if rstd is not None and need_rstd else None
    dx = dweight = None
    if need_x or need_w:
        dacc = (dz if rstd is None else rstd.float()[:, None] * dz.float()).to(x.dtype).contiguous()
        if need_x:
            dx = common.call("linear_dx", dacc, weight.contiguous())
        if need_w:
            dweight = common.call("weight_grad", dacc, x.contiguous(), None)
    return dx, dweight, None, None, drstd, da, db, None, None, None


def _qk_norm_backward(dy, x, weight, rstd, norm_a, norm_b, eps, n_segments, need_a, need_b):
    """The per-head RMSNorm of the QK-norm variant, backward: the epilogue computed, per head segment h,
    y = z·(b·s_h + a) with s_h = rsqrt(mean_h(z²) + eps) (a = 0, b = γ on Q and K; a = 1, b = 0 on V).
    z = [rstd ⊙row] x @ Wᵀ is recomputed (one plain cuBLAS GEMM); from dy = dL/dy:
    dz = dy·(b·s + a) − (s³/hd)·z·Σ_h(dy·z·b),  da = Σ_rows dy·z,  db = Σ_rows dy·z·s.
    Returns (dz, zdz = Σ_n z·dz per row, da, db)."""
    hd = weight.shape[0] // n_segments
    z = torch.nn.functional.linear(x, weight).float()
    if rstd is not None:
        z = z * rstd.float()[:, None]
    M, N = z.shape
    zs = z.view(M, N // hd, hd)
    s = torch.rsqrt(zs.pow(2).mean(-1, keepdim=True) + eps)
    a, b = norm_a.float().view(N // hd, hd), norm_b.float().view(N // hd, hd)
    d = dy.float().view(M, N // hd, hd)
    dz = d * (b * s + a) - (s.pow(3) / hd) * zs * (d * zs * b).sum(-1, keepdim=True)
    da = (d * zs).sum(0).reshape(N) if need_a else None
    db = (d * zs * s).sum(0).reshape(N) if need_b else None
    dz = dz.reshape(M, N)
    return dz, (z * dz).sum(-1), da, db


_op.register_autograd(_backward, setup_context=_setup_context)


def qkv_rope(x: torch.Tensor, weight: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor, n_heads: int,
             n_kv_heads: int, rstd: torch.Tensor | None = None, q_norm_weight: torch.Tensor | None = None,
             k_norm_weight: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """[Q | K | V] (..., (n_heads + 2 n_kv_heads) · head_dim) in x's dtype: RoPE on Q and K (adjacent
    pairs), V passed through, optionally QK-norm (per-head RMSNorm with q/k_norm_weight (head_dim,))
    before RoPE and the rstd scaling of a fused RMSNorm. positions (...) integer or float (< 2**24);
    freqs from rope_frequencies(). Split the result with split_qkv."""
    common.check_linear(NAME, x, weight)
    hd = _head_dim(weight, n_heads, n_kv_heads)
    lead = tuple(x.shape[:-1])
    if not isinstance(positions, torch.Tensor):
        raise TypeError(f"{NAME}: positions must be a tensor of shape {lead}, got {type(positions).__name__}")
    common.check_rows(NAME, "positions", positions, lead, None, None, x.device)
    _check_table(freqs, n_heads, n_kv_heads, hd)
    if freqs.device != x.device:
        raise ValueError(f"{NAME}: freqs is on {freqs.device} but x is on {x.device}; move it with .to(x.device)")
    if rstd is not None:
        common.check_rows(NAME, "rstd", rstd, lead, None, torch.float32, x.device)
        rstd = rstd.reshape(-1)
    norm_a = norm_b = None
    if (q_norm_weight is None) != (k_norm_weight is None):
        raise ValueError(f"{NAME}: QK-norm needs both q_norm_weight and k_norm_weight (or neither)")
    if q_norm_weight is not None:
        common.check_vector(NAME, "q_norm_weight", q_norm_weight, hd, x.device)
        common.check_vector(NAME, "k_norm_weight", k_norm_weight, hd, x.device)
        norm_a, norm_b = qk_norm_vectors(q_norm_weight, k_norm_weight, n_heads, n_kv_heads)
    pos = positions.reshape(-1).to(torch.float32)
    out = common.call("qkv_rope", common.rows(x), weight, pos, freqs, rstd, norm_a, norm_b, n_heads, n_kv_heads,
                                      float(eps))
    return out.reshape(*lead, weight.shape[0])


def qk_norm_vectors(q_norm_weight: torch.Tensor, k_norm_weight: torch.Tensor, n_heads: int,
                    n_kv_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm_a, norm_b) fp32 (N,): the epilogue scales column n by norm_b[n]·inv_rms + norm_a[n]. norm_b is one
    concatenation of the two weights' broadcasts and V's zeros (one kernel, fp32 by type promotion), norm_a a
    constant of the shape kept per device (built again while traced)."""
    hd = q_norm_weight.shape[0]
    norm_a, zeros = _constants(n_heads, n_kv_heads, hd, q_norm_weight)
    norm_b = torch.cat([q_norm_weight.expand(n_heads, hd), k_norm_weight.expand(n_kv_heads, hd), zeros])
    return norm_a, norm_b.reshape(-1)


_CONSTANTS: dict = {}


def _constants(n_heads: int, n_kv_heads: int, hd: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """norm_a (0 on the Q and K columns, 1 on V's) and V's zeros of norm_b (n_kv_heads, hd), fp32 on like's device:
    built once per shape and device (again while traced or captured)."""
    key = (n_heads, n_kv_heads, hd, like.device)
    keep = common.readable(like)   # not a traced value, nor one of a CUDA graph's pool
    out = _CONSTANTS.get(key) if keep else None
    if out is None:
        out = (torch.cat([torch.zeros((n_heads + n_kv_heads) * hd, device=like.device),
                          torch.ones(n_kv_heads * hd, device=like.device)]),
               torch.zeros(n_kv_heads, hd, device=like.device))
        if keep:
            _CONSTANTS[key] = out
    return out


def split_qkv(qkv: torch.Tensor, n_heads: int, n_kv_heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Views q (..., n_heads, hd), k and v (..., n_kv_heads, hd) of a qkv_rope result."""
    n = n_heads + 2 * n_kv_heads
    if n_heads < 1 or n_kv_heads < 1 or qkv.shape[-1] % n:
        raise ValueError(f"split_qkv: the last dimension {qkv.shape[-1]} is not n_heads + 2·n_kv_heads = {n} heads")
    hd = qkv.shape[-1] // n
    heads = qkv.unflatten(-1, (n, hd))
    return heads.split([n_heads, n_kv_heads, n_kv_heads], dim=-2)


BUILDS = [(graph, (s, n, hd), "kk") for s in (False, True) for n in (False, True) for hd in (64, 128)]
