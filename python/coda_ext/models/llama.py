"""A Llama decoder (layer, model, causal LM) on coda_ext's fused ops, forward and backward.

    layer:  x ─ RMSNorm ─ QKV + RoPE ─ SDPA (causal, GQA) ─ o_proj + residual ─ RMSNorm ─ gate/up + SwiGLU
              ─ down_proj + residual ─▶ x2
    model:  embed_tokens ─ layers ─ norm          causal LM: + LM head + cross-entropy (no M × V logits)

Each layer runs two autograd Functions (coda_ext.models.functions: QKVRoPE before attention,
MLPBlock after it) so the RMSNorm and SwiGLU backward run in the dX GEMMs' epilogues; the residual
stream x passes through QKVRoPE into MLPBlock, so its gradient from MLPBlock is added in the QKV dX
GEMM's epilogue (autograd sums no two gradients of x). Weights are
stored in the fused layouts and speak Hugging Face's names and layouts through state_dict() and
load_state_dict() (coda_ext.models.config). `impl`: "fused" (SM90 GPU, bf16/fp16), "reference"
(the ops' fp32 references, any device) or "auto" (fused on CUDA tensors, reference elsewhere).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

from . import config as _config
from .config import LlamaConfig
from .functions import IMPLS, MLPBlock, QKVRoPE, lm_head_loss, resolve_impl

_SDPA_GQA = torch.__version__ >= "2.5"   # scaled_dot_product_attention(enable_gqa=...)


def _check_impl(impl: str) -> str:
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    return impl


def default_positions(x: torch.Tensor, positions: torch.Tensor | None) -> torch.Tensor:
    """positions broadcast to x's leading dimensions (batch, seq); 0 … seq-1 when None."""
    lead = x.shape[:-1]
    if positions is None:
        positions = torch.arange(lead[-1], device=x.device)
    return positions.expand(lead)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
              is_causal: bool = True) -> torch.Tensor:
    """SDPA on (B, S, heads, hd) q and (B, S_kv, kv_heads, hd) k, v (grouped heads); returns (B, S, heads·hd).
    mask: an SDPA attn_mask (boolean keep-mask or additive), replacing the causal mask."""
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    causal = is_causal and mask is None
    if k.shape[1] != q.shape[1] and not _SDPA_GQA:
        k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
    extra = {"enable_gqa": k.shape[1] != q.shape[1]} if _SDPA_GQA else {}
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, **extra)
    return out.transpose(1, 2).flatten(-2)


class RMSNorm(nn.Module):
    """RMSNorm with weight γ (Hugging Face LlamaRMSNorm semantics in forward)."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def statistic(self, x: torch.Tensor) -> torch.Tensor:
        """rstd = rsqrt(mean(x²) + eps), fp32, one per row."""
        return torch.rsqrt(x.float().pow(2).mean(-1) + self.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x.float() * self.statistic(x)[..., None]).to(x.dtype)


class CodaAttention(nn.Module):
    """The attention's weights: qkv_weight [W_q; W_k; W_v] (Q/K rows in adjacent-pair RoPE order) and
    o_proj. Saved and loaded as Hugging Face's q_proj, k_proj, v_proj, o_proj."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        self.qkv_weight = nn.Parameter(torch.empty(config.qkv_size, config.hidden_size))
        self.o_proj = nn.Linear(config.num_attention_heads * config.head_dim, config.hidden_size, bias=False)
        _config.install_qkv_hooks(self)


class CodaMLP(nn.Module):
    """The MLP's weights: gate_up_weight (rows gate₀, up₀, gate₁, up₁, …) and down_proj. Saved and
    loaded as Hugging Face's gate_proj, up_proj, down_proj."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        self.gate_up_weight = nn.Parameter(torch.empty(2 * config.intermediate_size, config.hidden_size))
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        _config.install_gate_up_hooks(self)


class CodaLlamaDecoderLayer(nn.Module):
    """One Llama decoder layer. forward(x (B, S, d), positions (B, S) or (S,), optional) -> (B, S, d).
    Parameter names are Hugging Face's LlamaDecoderLayer's (`state_dict()` gives its layouts too)."""

    def __init__(self, config: LlamaConfig, impl: str = "auto"):
        super().__init__()
        self.config, self.impl = config, _check_impl(impl)
        d, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = CodaAttention(config)      # Hugging Face's order of the state dict
        self.mlp = CodaMLP(config)
        self.input_layernorm = RMSNorm(d, eps)
        self.post_attention_layernorm = RMSNorm(d, eps)
        self.register_buffer("rope_freqs", config.rope_table(), persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        std = self.config.initializer_range
        for w in (self.self_attn.qkv_weight, self.self_attn.o_proj.weight, self.mlp.gate_up_weight,
                  self.mlp.down_proj.weight):
            nn.init.normal_(w, std=std)
        nn.init.ones_(self.input_layernorm.weight)
        nn.init.ones_(self.post_attention_layernorm.weight)

    def _apply(self, fn, recurse=True):
        # .to(dtype) casts buffers too: the RoPE table stays fp32 (a hi + lo pair), rebuilt on the new device
        out = super()._apply(fn, recurse)
        self.rope_freqs = self.config.rope_table(self.rope_freqs.device)
        return out

    def _impl(self, x: torch.Tensor) -> str:
        impl = resolve_impl(self.impl, x)
        if impl == "fused" and self.config.fused_problems():
            raise ValueError("the fused Llama layer does not take " + "; ".join(self.config.fused_problems()) +
                             "; use impl='reference'")
        return impl

    def project_qkv(self, x: torch.Tensor, positions: torch.Tensor, impl: str):
        """(q, k, v, x): q (B, S, heads, hd), k and v (B, S, kv_heads, hd) of the input RMSNorm of x, RoPE
        applied to q and k, and x handed on: give that x to output_and_mlp (its gradient then returns
        through QKVRoPE's backward)."""
        c = self.config
        return QKVRoPE.apply(x, self.input_layernorm.weight, self.self_attn.qkv_weight, positions, self.rope_freqs,
                             c.num_attention_heads, c.num_key_value_heads, c.rms_norm_eps, impl)

    def output_and_mlp(self, y0: torch.Tensor, x: torch.Tensor, impl: str) -> torch.Tensor:
        """x1 = x + y0 @ W_oᵀ, then x1 + MLP(RMSNorm(x1)); x as project_qkv handed it on."""
        return MLPBlock.apply(y0.contiguous(), x, self.self_attn.o_proj.weight, self.post_attention_layernorm.weight,
                              self.mlp.gate_up_weight, self.mlp.down_proj.weight, self.config.rms_norm_eps, impl)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """attention_mask: an SDPA attn_mask (B or 1, 1 or heads, S, S) replacing the causal mask."""
        impl = self._impl(x)
        q, k, v, x = self.project_qkv(x, default_positions(x, positions), impl)
        y0 = attention(q, k, v, mask=attention_mask)
        return self.output_and_mlp(y0, x, impl)


class CodaLlamaModel(nn.Module):
    """embed_tokens ─ layers ─ norm. forward(input_ids (B, S), positions=None) -> normalized hidden
    states (B, S, d); residual_stream() stops before the final norm. gradient_checkpointing=True
    recomputes each layer in backward (torch.utils.checkpoint, non-reentrant)."""

    def __init__(self, config: LlamaConfig, impl: str = "auto"):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(CodaLlamaDecoderLayer(config, impl) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.gradient_checkpointing = False
        nn.init.normal_(self.embed_tokens.weight, std=config.initializer_range)

    def residual_stream(self, input_ids: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        positions = default_positions(x, positions)
        checkpointing = self.gradient_checkpointing and self.training and torch.is_grad_enabled()
        for layer in self.layers:
            if checkpointing:
                x = torch.utils.checkpoint.checkpoint(layer, x, positions, use_reentrant=False)
            else:
                x = layer(x, positions)
        return x

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        return self.norm(self.residual_stream(input_ids, positions))


class CausalLMOutput(NamedTuple):
    loss: torch.Tensor | None     # cross-entropy of the next-token targets (when labels were given)
    logits: torch.Tensor | None   # (B, S, V), only when no labels were given


def shift_labels(labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Next-token targets: position t predicts labels[t + 1]; the last position is ignored."""
    pad = torch.full_like(labels[..., :1], ignore_index)
    return torch.cat([labels[..., 1:], pad], dim=-1)


class CodaLlamaForCausalLM(nn.Module):
    """model + lm_head. forward(input_ids, labels=None, positions=None) -> CausalLMOutput: with labels
    (as Hugging Face takes them: unshifted, ignore_index -100) the loss from the fused LM head +
    cross-entropy, with the final RMSNorm folded into it (no M × V logits); without, the logits."""

    def __init__(self, config: LlamaConfig, impl: str = "auto"):
        super().__init__()
        self.config, self.impl = config, _check_impl(impl)
        self.model = CodaLlamaModel(config, impl)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        else:
            nn.init.normal_(self.lm_head.weight, std=config.initializer_range)
        self._register_load_state_dict_pre_hook(self._tied_load_hook, with_module=False)

    def _tied_load_hook(self, state_dict, prefix, *args):
        # checkpoints of tied models (save_pretrained) may omit lm_head.weight
        if self.config.tie_word_embeddings and prefix + "lm_head.weight" not in state_dict:
            emb = state_dict.get(prefix + "model.embed_tokens.weight")
            if emb is not None:
                state_dict[prefix + "lm_head.weight"] = emb

    def set_impl(self, impl: str) -> CodaLlamaForCausalLM:
        """Switch every layer (and the LM head) to impl: 'auto', 'fused' or 'reference'."""
        self.impl = _check_impl(impl)
        for layer in self.model.layers:
            layer.impl = impl
        return self

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                positions: torch.Tensor | None = None, ignore_index: int = -100,
                reduction: str = "mean") -> CausalLMOutput:
        """reduction: 'mean' over the counted targets, 'sum', or 'none' (per token, (B, S))."""
        x = self.model.residual_stream(input_ids, positions)
        if labels is None:
            return CausalLMOutput(None, self.lm_head(self.model.norm(x)))
        norm = self.model.norm
        rstd = norm.statistic(x)                      # the final RMSNorm: γ here, rstd in the LM head's epilogue
        h = x * norm.weight.to(x.dtype)
        loss = lm_head_loss(h, self.lm_head.weight, shift_labels(labels, ignore_index), rstd, ignore_index,
                            resolve_impl(self.impl, h), reduction)
        return CausalLMOutput(loss, None)
