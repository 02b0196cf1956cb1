"""apply_coda_to_llama: a transformers LlamaForCausalLM on coda_ext's decoder layers and fused loss.

What changes, in place:
- every `model.model.layers[i]` becomes a CodaHFLlamaDecoderLayer (a CodaLlamaDecoderLayer that
  takes Hugging Face's layer arguments: position_ids, a 4-D attention mask, a KV cache), its
  weights converted once into the fused layouts;
- `model.forward` computes the loss with the fused LM head + cross-entropy (no M × V logits) when
  labels are given in training; logits are computed when there are no labels or in eval mode.
What does not: the embedding, the final norm, the rotary tables, generation, gradient
checkpointing (`activation_checkpointing_enable()`, before transformers 5 `gradient_checkpointing_enable()`),
`state_dict()` and `save_pretrained()`
(Hugging Face names and layouts: the result loads in plain transformers).
Not supported (raise): attention or MLP biases, attention dropout, RoPE types whose frequencies
change at run time (dynamic, longrope) or that scale attention, output_attentions and
output_hidden_states, attention masks that are not 4-D tensors (attn_implementation "sdpa" or "eager").
For the fused kernels the model must be bf16 or fp16 on an SM90 GPU (`model.to(torch.bfloat16)`).
"""
from __future__ import annotations

import types

import torch
import transformers
from packaging import version
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.models.llama.modeling_llama import LlamaForCausalLM

from ..models.config import LlamaConfig
from ..models.functions import IMPLS, lm_head_loss, resolve_impl
from ..models.llama import CodaLlamaDecoderLayer, attention, default_positions, shift_labels

MIN_VERSION = "4.54"   # decoder layers return a tensor (earlier: a tuple)


class CodaHFLlamaDecoderLayer(CodaLlamaDecoderLayer, GradientCheckpointingLayer):
    """A CodaLlamaDecoderLayer called as transformers calls LlamaDecoderLayer."""

    def __init__(self, config: LlamaConfig, impl: str, layer_idx: int):
        super().__init__(config, impl)
        self.layer_idx = layer_idx

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, past_key_values=None, use_cache: bool = False,
                position_embeddings=None, **kwargs) -> torch.Tensor:
        x = hidden_states
        impl = self._impl(x)
        pos = position_ids if position_ids is not None else kwargs.get("cache_position")
        q, k, v = self.split_heads(self.project_qkv(x, default_positions(x, pos), impl))
        cache = past_key_values if past_key_values is not None else kwargs.get("past_key_value")
        if cache is not None:   # the cache holds (B, kv_heads, S, hd)
            k, v = (t.transpose(1, 2) for t in cache.update(k.transpose(1, 2), v.transpose(1, 2), self.layer_idx))
        if attention_mask is not None and not (isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 4):
            raise NotImplementedError(
                f"coda_ext layers take a 4-D attention mask (attn_implementation 'sdpa' or 'eager'), got "
                f"{type(attention_mask).__name__} {tuple(getattr(attention_mask, 'shape', ()))}; load the model with "
                "attn_implementation='sdpa'")
        y0 = attention(q, k, v, mask=attention_mask, is_causal=q.shape[1] > 1)
        return self.output_and_mlp(y0, x, impl)


def _check_model(model) -> None:
    if version.parse(transformers.__version__) < version.parse(MIN_VERSION):
        raise ImportError(f"coda_ext.hf needs transformers >= {MIN_VERSION}, found {transformers.__version__}: "
                          "pip install -U transformers")
    if not isinstance(model, LlamaForCausalLM):
        raise TypeError(f"apply_coda_to_llama takes a transformers LlamaForCausalLM, got {type(model).__name__}")
    cfg = model.config
    if getattr(cfg, "attention_dropout", 0.0):
        raise ValueError(f"apply_coda_to_llama: attention_dropout {cfg.attention_dropout} is not supported (set 0.0)")
    rope = model.model.rotary_emb
    if getattr(rope, "rope_type", "default") in ("dynamic", "longrope") or getattr(rope, "attention_scaling", 1) != 1:
        raise ValueError(f"apply_coda_to_llama: RoPE type {rope.rope_type!r} (frequencies that change with the "
                         "sequence length or scale attention) is not supported")


def _convert_layer(old: torch.nn.Module, cfg: LlamaConfig, impl: str, idx: int) -> CodaHFLlamaDecoderLayer:
    """A coda layer with old's weights, device, dtype and mode (built on the meta device: no init)."""
    w = old.input_layernorm.weight
    with torch.device("meta"):
        new = CodaHFLlamaDecoderLayer(cfg, impl, idx)
    new = new.to(dtype=w.dtype).to_empty(device=w.device)
    new.load_state_dict(old.state_dict())
    new.train(old.training)
    for attr in ("gradient_checkpointing", "_gradient_checkpointing_func"):
        if attr in old.__dict__:
            setattr(new, attr, old.__dict__[attr])
    return new


def apply_coda_to_llama(model, impl: str = "auto"):
    """See the module docstring; returns model. impl: 'auto' (fused on CUDA tensors, the fp32
    references elsewhere), 'fused' or 'reference'."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    _check_model(model)
    cfg = LlamaConfig.from_hf(model.config, rope_inv_freq=model.model.rotary_emb.inv_freq)
    if impl == "fused" and cfg.fused_problems():
        raise ValueError("the fused Llama layer does not take " + "; ".join(cfg.fused_problems()))
    layers = model.model.layers
    for i, old in enumerate(layers):
        if isinstance(old, CodaHFLlamaDecoderLayer):
            old.impl = impl
        else:
            layers[i] = _convert_layer(old, cfg, impl, i)
    model._coda_impl = impl
    model.forward = types.MethodType(_causal_lm_forward, model)
    return model


def _causal_lm_forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                       inputs_embeds=None, labels=None, use_cache=None, logits_to_keep=0, **kwargs):
    """LlamaForCausalLM.forward with the fused LM head + cross-entropy for the training loss."""
    for flag in ("output_attentions", "output_hidden_states"):
        if kwargs.pop(flag, None):
            raise NotImplementedError(f"{flag}=True is not supported by a model patched with apply_coda_to_llama")
    return_dict = kwargs.pop("return_dict", None)
    num_items_in_batch = kwargs.pop("num_items_in_batch", None)
    target = kwargs.pop("shift_labels", None)
    ignore_index = kwargs.pop("ignore_index", -100)
    outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache, **kwargs)
    hidden = outputs.last_hidden_state
    loss = logits = None
    if labels is not None or target is not None:
        if target is None:
            target = shift_labels(labels, ignore_index)
        target = target.to(hidden.device)
        impl = resolve_impl(self._coda_impl, hidden)
        if num_items_in_batch is None:
            loss = lm_head_loss(hidden, self.lm_head.weight, target, None, ignore_index, impl)
        else:   # gradient accumulation: the sum over this batch, divided by the tokens of all its micro-batches
            loss = lm_head_loss(hidden, self.lm_head.weight, target, None, ignore_index, impl, reduction="sum")
            loss = loss / torch.as_tensor(num_items_in_batch, device=loss.device)
    if loss is None or not self.training:
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(hidden[:, keep, :])
    out = CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=outputs.past_key_values)
    return out.to_tuple() if return_dict is False else out
