"""Hugging Face transformers integration (optional: `pip install transformers`, 4.54 or newer).

    from transformers import LlamaForCausalLM
    from coda_ext.hf import apply_coda_to_llama

    model = LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.bfloat16).cuda()
    apply_coda_to_llama(model, prebuild_tokens=8 * 2048)   # layers and loss swapped in place, weights
                                                           # converted once; every kernel of an 8 x 2048-token
                                                           # training step built now, in parallel
    loss = model(input_ids, labels=input_ids).loss

Without prebuild_tokens each kernel is built on its first use, one after another (about a minute
each); `prebuild_llama(model, tokens, jobs=None)` does the same build separately (before or after the
patch, on any machine with nvcc: no GPU needed; the cache then holds the kernels).
transformers is imported only when a function here is called.
"""
from __future__ import annotations


def _transformers():
    try:
        import transformers
    except ImportError as e:
        raise ImportError("coda_ext.hf needs Hugging Face transformers: pip install transformers") from e
    return transformers


def apply_coda_to_llama(model, impl: str = "auto", prebuild_tokens=None, jobs: int | None = None,
                        lm_head_chunk_bytes: int | None = None):
    """Swap a transformers LlamaForCausalLM's decoder layers for coda_ext's and its loss for the
    fused LM head + cross-entropy, in place (weights converted once); returns the model.
    prebuild_tokens (tokens per training step, or a batch of input_ids): build every kernel such a
    step launches now, in parallel (prebuild_llama). lm_head_chunk_bytes: the training loss's exp(logits)
    chunk (default 1 GiB; less holds less memory for some time). See coda_ext.hf.llama for what is
    supported."""
    _transformers()
    from .llama import apply_coda_to_llama as apply

    return apply(model, impl=impl, prebuild_tokens=prebuild_tokens, jobs=jobs, lm_head_chunk_bytes=lm_head_chunk_bytes)


def prebuild_llama(model, tokens, jobs: int | None = None, lm_head_chunk_bytes="model") -> list[str]:
    """Build every kernel a training step of `model` (a transformers LlamaForCausalLM, bf16 or fp16,
    patched or not yet) launches at `tokens` tokens per step (batch × sequence, or a batch of
    input_ids), and the torch binding, in parallel with one progress line; `jobs` nvcc at once
    (default: the CPU count capped by memory). lm_head_chunk_bytes: the LM head's chunk budget the step
    will use ("model": the one apply_coda_to_llama was given; None: the default). Cached kernels are not
    rebuilt. Returns their paths."""
    _transformers()
    from .llama import prebuild_llama as build

    return build(model, tokens, jobs, lm_head_chunk_bytes)


__all__ = ["apply_coda_to_llama", "prebuild_llama"]
