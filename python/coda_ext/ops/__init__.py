"""Ready-made fused Transformer ops, each a torch custom op (torch.compile and CUDA graphs work),
each written with coda_ext's public graph builder, each with its fp32 reference beside it.

    out, h, rstd = linear_residual_norm(x, W_o, residual, norm_weight)      # residual + RMSNorm stats
    y            = linear_swiglu(h, W_gate_up, rstd)                        # RMSNorm-scaled up-proj + SwiGLU
    qkv          = qkv_rope(h, W_qkv, positions, freqs, n_heads, n_kv_heads, rstd)
    loss, lse    = lm_head_cross_entropy(h, W_lm, target, rstd)             # no logits in memory
"""
from . import lm_head_ce, qkv, residual_norm, rms_scale, swiglu
from .layouts import interleave_gate_up, pairs_to_rotate_half, rotate_half_to_pairs, split_gate_up
from .lm_head_ce import lm_head_cross_entropy
from .qkv import default_inv_freq, qkv_rope, rope_frequencies, split_qkv
from .residual_norm import linear_residual_norm
from .rms_scale import rms_linear
from .swiglu import linear_swiglu, linear_swiglu_train

#: The op modules: each has graph(...), reference(...), BUILDS (its graph variants).
MODULES = (residual_norm, rms_scale, swiglu, qkv, lm_head_ce)

__all__ = [
    "MODULES", "default_inv_freq", "interleave_gate_up", "linear_residual_norm", "linear_swiglu",
    "linear_swiglu_train", "lm_head_cross_entropy", "pairs_to_rotate_half", "qkv_rope", "rms_linear",
    "rope_frequencies", "rotate_half_to_pairs", "split_gate_up", "split_qkv",
]
