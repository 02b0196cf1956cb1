"""A plain PyTorch Llama with Hugging Face's conventions (rotate-half RoPE with cos/sin tables in the
activation dtype, separate q/k/v and gate/up linears, the norms and the loss as LlamaForCausalLM
computes them) and Hugging Face's parameter names: the eager baseline of the training demo and the
benchmarks. `EagerLlamaForCausalLM(cfg).load_state_dict(coda_model.state_dict())` gives the same
weights as a CodaLlamaForCausalLM.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import LlamaConfig
from .llama import CausalLMOutput, RMSNorm, attention, default_positions, shift_labels


class Rotary(nn.Module):
    """cos, sin (..., head_dim) of positions in rotate-half order, angles in fp32 as Hugging Face
    computes them; the inverse frequencies stay an fp32 buffer through .to(dtype)."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        self.register_buffer("inv_freq", cfg.inv_freq().float(), persistent=False)

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        self.inv_freq = self.cfg.inv_freq().float().to(self.inv_freq.device)
        return out

    def forward(self, positions: torch.Tensor, dtype: torch.dtype):
        angle = positions[..., None].float() * self.inv_freq
        emb = torch.cat([angle, angle], dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(t: torch.Tensor) -> torch.Tensor:
    a, b = t.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


class EagerAttention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        hd, d = cfg.head_dim, cfg.hidden_size
        self.q_proj = nn.Linear(d, cfg.num_attention_heads * hd, bias=False)
        self.k_proj = nn.Linear(d, cfg.num_key_value_heads * hd, bias=False)
        self.v_proj = nn.Linear(d, cfg.num_key_value_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.num_attention_heads * hd, d, bias=False)

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        hd = self.cfg.head_dim
        q, k, v = (p(h).unflatten(-1, (-1, hd)) for p in (self.q_proj, self.k_proj, self.v_proj))
        c, s = cos[..., None, :], sin[..., None, :]
        q, k = q * c + rotate_half(q) * s, k * c + rotate_half(k) * s
        return self.o_proj(attention(q, k, v))


class EagerMLP(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        d, f = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class EagerLlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        self.self_attn = EagerAttention(cfg)
        self.mlp = EagerMLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = Rotary(cfg)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None,
                cos_sin: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        cos, sin = cos_sin if cos_sin is not None else self.rotary(default_positions(x, positions), x.dtype)
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class EagerLlamaModel(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(EagerLlamaDecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = Rotary(cfg)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        cos_sin = self.rotary(default_positions(x, positions), x.dtype)   # once for every layer
        for layer in self.layers:
            x = layer(x, cos_sin=cos_sin)
        return self.norm(x)


class EagerLlamaForCausalLM(nn.Module):
    """forward(input_ids, labels=None, positions=None) -> CausalLMOutput, the loss from full logits
    (upcast to fp32, as Hugging Face's loss does)."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.config = cfg
        self.model = EagerLlamaModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                positions: torch.Tensor | None = None, ignore_index: int = -100,
                reduction: str = "mean") -> CausalLMOutput:
        logits = self.lm_head(self.model(input_ids, positions))
        if labels is None:
            return CausalLMOutput(None, logits)
        target = shift_labels(labels, ignore_index)
        loss = F.cross_entropy(logits.float().flatten(0, -2), target.flatten(), ignore_index=ignore_index,
                               reduction=reduction)
        return CausalLMOutput(loss.reshape(target.shape) if reduction == "none" else loss, None)
