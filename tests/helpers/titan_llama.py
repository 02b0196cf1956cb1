"""A stand-in for torchtitan's Llama 3 Transformer (torchtitan is not a test dependency): the module
tree, attribute names and forward signatures coda_ext.models.torchtitan relies on, and the same math
(complex RoPE on adjacent pairs from a freqs_cis buffer, torch.nn.RMSNorm, SwiGLU feed-forward,
causal SDPA with grouped KV heads), written for these tests."""
from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclasses.dataclass
class Args:
    dim: int = 128
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    hidden: int = 192
    vocab_size: int = 256
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_seq_len: int = 64


def freqs_cis(head_dim: int, end: int, theta: float) -> torch.Tensor:
    """(end, head_dim/2) complex64: exp(i · position · inv_freq), angles in fp32."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
    angles = torch.outer(torch.arange(end).float(), inv_freq)
    return torch.polar(torch.ones_like(angles), angles)


def rope(t: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """t (B, S, heads, hd) rotated pair by pair (t[2i], t[2i+1]) as complex numbers."""
    c = torch.view_as_complex(t.float().reshape(*t.shape[:-1], -1, 2))
    return torch.view_as_real(c * table[: t.shape[1]][None, :, None, :]).flatten(3).type_as(t)


class Attention(nn.Module):
    def __init__(self, a: Args):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = a.n_heads, a.n_kv_heads, a.dim // a.n_heads
        self.wq = nn.Linear(a.dim, a.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(a.dim, a.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(a.dim, a.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(a.n_heads * self.head_dim, a.dim, bias=False)

    def forward(self, x, table, attention_masks=None, positions=None):
        B, S, _ = x.shape
        q, k, v = (w(x).view(B, S, -1, self.head_dim) for w in (self.wq, self.wk, self.wv))
        q, k = rope(q, table), rope(k, table)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                             enable_gqa=self.n_heads != self.n_kv_heads)
        return self.wo(out.transpose(1, 2).reshape(B, S, -1))


class FeedForward(nn.Module):
    def __init__(self, a: Args):
        super().__init__()
        self.w1 = nn.Linear(a.dim, a.hidden, bias=False)
        self.w2 = nn.Linear(a.hidden, a.dim, bias=False)
        self.w3 = nn.Linear(a.dim, a.hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, a: Args):
        super().__init__()
        self.attention, self.feed_forward = Attention(a), FeedForward(a)
        self.attention_norm = nn.RMSNorm(a.dim, eps=a.norm_eps)
        self.ffn_norm = nn.RMSNorm(a.dim, eps=a.norm_eps)

    def forward(self, x, freqs_cis, attention_masks=None, positions=None):
        h = x + self.attention(self.attention_norm(x), freqs_cis, attention_masks, positions)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, a: Args):
        super().__init__()
        self.args = a
        self.tok_embeddings = nn.Embedding(a.vocab_size, a.dim)
        self.register_buffer("freqs_cis", freqs_cis(a.dim // a.n_heads, a.max_seq_len, a.rope_theta), persistent=False)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(a) for i in range(a.n_layers)})
        self.norm = nn.RMSNorm(a.dim, eps=a.norm_eps)
        self.output = nn.Linear(a.dim, a.vocab_size, bias=False)

    def init_weights(self, buffer_device=None, seed: int = 0):
        """Fills every weight (norms away from 1, so a γ mistake shows) and freqs_cis on buffer_device."""
        a = self.args
        with torch.device(buffer_device or self.freqs_cis.device):
            self.freqs_cis = freqs_cis(a.dim // a.n_heads, a.max_seq_len, a.rope_theta)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in self.parameters():
                std = 0.2 if p.dim() == 1 else 0.05
                p.copy_((1.0 if p.dim() == 1 else 0.0) + std * torch.randn(p.shape, generator=gen))

    def forward(self, tokens, positions=None):
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h, self.freqs_cis, attention_masks=None, positions=positions)
        return self.output(self.norm(h))


def build(seed: int = 0, device=None, **overrides) -> Transformer:
    """A Transformer with weights from `seed` (init_weights)."""
    model = Transformer(Args(**overrides))
    model.init_weights(device, seed)
    return model


def loss(model, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy, as torchtitan's loss takes the logits (targets: tokens shifted by one)."""
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
