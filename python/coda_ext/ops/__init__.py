"""Ready-made fused Transformer ops, each a torch custom op (torch.compile and CUDA graphs work) with
autograd, each written with coda_ext's public graph builder, each with its fp32 reference beside it.

    out, h, rstd = linear_residual_norm(x, W_o, residual, norm_weight)      # residual + RMSNorm stats
    y            = linear_swiglu(h, W_gate_up, rstd)                        # RMSNorm-scaled up-proj + SwiGLU
    qkv          = qkv_rope(h, W_qkv, positions, freqs, n_heads, n_kv_heads, rstd)
    loss, lse    = lm_head_cross_entropy(h, W_lm, target, rstd)             # no logits in memory
    loss         = lm_head_cross_entropy_loss(h, W_lm, target, rstd)        # training: gradients with the loss

and the backward half: the GEMMs read their operands as stored (no transposed copies), and the
RMSNorm and SwiGLU backward run in the dX GEMMs' epilogues:

    dz, zdz        = qkv_rope_backward(dqkv, qkv, positions, freqs, n_heads, n_kv_heads)
    dx, n, dgamma  = rms_norm_backward_linear(dz, W, x, rstd, norm_weight, zdz, dx_in)
    dz, y, zdz     = swiglu_backward_linear(dy, W_down, z)
    dx = linear_dx(dz, W);   dW = weight_grad(dz, x, accumulate=None, scale=None)
"""
from . import linear_grad, lm_head_ce, norm_backward, qkv, residual_norm, rms_scale, swiglu, swiglu_backward
from .layouts import interleave_gate_up, pairs_to_rotate_half, rotate_half_to_pairs, split_gate_up
from .linear_grad import linear_dx, linear_residual, weight_grad
from .lm_head_ce import lm_head_cross_entropy, lm_head_cross_entropy_loss
from .norm_backward import rms_norm_backward_linear
from .norm_input import rms_norm_input
from .qkv import default_inv_freq, qkv_rope, rope_frequencies, split_qkv
from .residual_norm import linear_residual_norm
from .rms_scale import rms_linear
from .rope_backward import qkv_rope_backward
from .swiglu import linear_swiglu, linear_swiglu_train
from .swiglu_backward import swiglu_backward_linear

#: The op modules: each has graph(...), reference(...), BUILDS (its graph variants: (graph, args, major)).
MODULES = (residual_norm, rms_scale, swiglu, qkv, lm_head_ce)
#: The GEMM modules of the backward pass (and linear_residual), built the same way.
BACKWARD_MODULES = (linear_grad, norm_backward, swiglu_backward)

__all__ = [
    "BACKWARD_MODULES", "MODULES", "default_inv_freq", "interleave_gate_up", "linear_dx", "linear_residual",
    "linear_residual_norm", "linear_swiglu", "linear_swiglu_train", "lm_head_cross_entropy",
    "lm_head_cross_entropy_loss", "pairs_to_rotate_half",
    "qkv_rope", "qkv_rope_backward", "rms_linear", "rms_norm_backward_linear", "rms_norm_input", "rope_frequencies",
    "rotate_half_to_pairs", "split_gate_up", "split_qkv", "swiglu_backward_linear", "weight_grad",
]
