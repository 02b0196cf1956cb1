"""A tiny transformers LlamaForCausalLM with random weights (fp32, SDPA attention, norms away from 1 so a γ
mistake shows): the model the Hugging Face patch tests and the distributed tests start from."""
from __future__ import annotations

import torch

#: its vocabulary
VOCAB = 256


def tiny_llama(seed: int = 0, **overrides):
    import transformers

    torch.manual_seed(seed)
    kw = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
              num_hidden_layers=2, vocab_size=VOCAB, max_position_embeddings=256, rms_norm_eps=1e-5)
    kw.update(overrides)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**kw)).to(torch.float32)
    model.config._attn_implementation = "sdpa"
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.2 * torch.randn_like(p))
    return model
