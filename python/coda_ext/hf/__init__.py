"""Hugging Face transformers integration (optional: `pip install transformers`, 4.54 or newer).

    from transformers import LlamaForCausalLM
    from coda_ext.hf import apply_coda_to_llama

    model = LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.bfloat16).cuda()
    apply_coda_to_llama(model)          # decoder layers and loss swapped in place, weights converted once
    loss = model(input_ids, labels=input_ids).loss

transformers is imported only when a function here is called.
"""
from __future__ import annotations


def _transformers():
    try:
        import transformers
    except ImportError as e:
        raise ImportError("coda_ext.hf needs Hugging Face transformers: pip install transformers") from e
    return transformers


def apply_coda_to_llama(model, impl: str = "auto"):
    """Swap a transformers LlamaForCausalLM's decoder layers for coda_ext's and its loss for the
    fused LM head + cross-entropy, in place (weights converted once); returns the model.
    See coda_ext.hf.llama for what is supported."""
    _transformers()
    from .llama import apply_coda_to_llama as apply

    return apply(model, impl=impl)


__all__ = ["apply_coda_to_llama"]
