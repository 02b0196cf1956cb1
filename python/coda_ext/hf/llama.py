"""apply_coda_to_llama: a transformers LlamaForCausalLM on coda_ext's decoder layers and fused loss.

What changes, in place:
- every `model.model.layers[i]` becomes a CodaHFLlamaDecoderLayer (a CodaLlamaDecoderLayer that
  takes Hugging Face's layer arguments: position_ids, a 4-D attention mask, a KV cache), its
  weights converted once into the fused layouts;
- `model.forward` computes the loss with the fused LM head + cross-entropy (no M × V logits) when
  labels are given in training; logits are computed when there are no labels or in eval mode. A
  forward in training mode with gradients on builds no KV cache unless `use_cache=True` is passed
  (transformers builds one from `config.use_cache`, copying every layer's keys and values into it).
- the final norm (`model.model.norm`) keeps its math and weight but saves only its input and statistic
  for the backward (transformers' eager norm saves an fp32 copy of its input too: 0.40 against 0.13 GB
  at 16384 tokens, d = 4096); on a GPU its forward and backward run as kernels torch.compile generates
  (one or two each, where the eager math launched about ten passes with fp32 temporaries).
- the rotary embedding module (`model.model.rotary_emb`) returns empty tables: the coda layers compute their
  angles from their own frequency table (taken from its inv_freq), so transformers' per-step cos/sin
  (about six small kernels and their launches at the start of every forward) are not computed.
What does not: the embedding, generation, gradient
checkpointing (`activation_checkpointing_enable()`, before transformers 5 `gradient_checkpointing_enable()`),
`state_dict()` and `save_pretrained()`
(Hugging Face names and layouts: the result loads in plain transformers).
Not supported (raise): attention or MLP biases, attention dropout, RoPE types whose frequencies
change at run time (dynamic, longrope) or that scale attention, output_attentions and
output_hidden_states, attention masks that are not 4-D tensors (attn_implementation "sdpa" or "eager").
For the fused kernels the model must be bf16 or fp16 on an SM90 GPU (`model.to(torch.bfloat16)`).

Kernels: every kernel a training step launches is built on its first use, one after another (about a
minute each with nvcc); `prebuild_llama(model, tokens)` (or `apply_coda_to_llama(model,
prebuild_tokens=tokens)`) builds them all ahead, in parallel, with the torch binding, from the
model's config and the tokens per step (batch × sequence; `step_kernels` lists them). Another token
count may pick other kernel configs: prebuild each count you train
with. Generation (few tokens per call) launches other configs, built on first use.
"""
from __future__ import annotations

import sys
import types

import torch
import transformers
from packaging import version
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.models.llama.modeling_llama import LlamaForCausalLM

from .. import jit
from ..graph.builder import dtype_name
from ..models.config import LlamaConfig
from ..models.functions import IMPLS, lm_head_loss, resolve_impl, training_kernels
from ..models.llama import CodaLlamaDecoderLayer, attention, default_positions, shift_labels
from ..ops import common
from ..ops.lm_head_ce import check_chunk_bytes
from ..runtime import prebuild

MIN_VERSION = "4.54"   # decoder layers return a tensor (earlier: a tuple)


#: The keyword the patched forward hands its decoder layers when the attention is plain causal (no
#: attention_mask or position_ids given, no tokens in the KV cache): the layers then run SDPA with is_causal=True and
#: no mask. transformers builds the causal mask as a tensor while torch.compile traces (it cannot tell
#: a traced mask is all causal), and SDPA with a mask tensor leaves the flash kernel for one 2-3x
#: slower; with this flag a compiled model keeps the flash kernel.
CAUSAL_FLAG = "coda_plain_causal"
#: The attention mask the patched forward hands transformers' model with CAUSAL_FLAG: 4-D (passed through as an
#: already built mask), empty, never read.
_UNREAD_MASK = torch.empty((0, 0, 0, 0), dtype=torch.bool)


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
        q, k, v, x = self.project_qkv(x, default_positions(x, pos), impl)   # x handed on, for output_and_mlp
        cache = past_key_values if past_key_values is not None else kwargs.get("past_key_value")
        if cache is not None:   # the cache holds (B, kv_heads, S, hd)
            k, v = (t.transpose(1, 2) for t in cache.update(k.transpose(1, 2), v.transpose(1, 2), self.layer_idx))
        if attention_mask is not None and not (isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 4):
            raise NotImplementedError(
                f"coda_ext layers take a 4-D attention mask (attn_implementation 'sdpa' or 'eager'), got "
                f"{type(attention_mask).__name__} {tuple(getattr(attention_mask, 'shape', ()))}; load the model with "
                "attn_implementation='sdpa'")
        mask = None if kwargs.get(CAUSAL_FLAG) else attention_mask
        y0 = attention(q, k, v, mask=mask, is_causal=q.shape[1] > 1)
        return self.output_and_mlp(y0, x, impl)


def _norm_math(x: torch.Tensor, weight: torch.Tensor, eps: float):
    """LlamaRMSNorm's forward of rows x (M, d): (weight ⊙ (x · rstd in fp32, cast to x's dtype), rstd (M, 1) fp32)."""
    rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    return weight * (x.float() * rstd).to(x.dtype), rstd


def _norm_backward_math(g: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor):
    """(dx in x's dtype, dweight fp32) of _norm_math's rows for the output gradient g, as autograd forms them."""
    xhat = x.float() * rstd
    dweight = (g.float() * xhat.to(x.dtype).float()).sum(0)
    gn = (g * weight).float()                       # the gradient of the normalized x
    dx = rstd * (gn - xhat * (gn * xhat).mean(-1, keepdim=True))
    return dx.to(x.dtype), dweight


#: on a GPU, each direction one or two generated kernels (eagerly: about ten passes, with fp32 temporaries of
#: M · d · 4 bytes)
_norm_fused, _norm_backward_fused = common.compiled_rows(_norm_math), common.compiled_rows(_norm_backward_math)


def _generated(x: torch.Tensor) -> bool:
    return x.is_cuda and not common.traced(x)


class _FinalNorm(torch.autograd.Function):
    """LlamaRMSNorm's forward, weight ⊙ (x · rsqrt(mean(x²) + eps) in fp32, cast to x's dtype), saving only x
    and the fp32 statistic for the backward. transformers' eager norm leaves its autograd graph an fp32 copy of
    x and the normalized x (M · d · 6 bytes: 0.40 GB at 16384 tokens and d = 4096, alive at the step's memory
    peak, the LM head's forward); this keeps M · d · 2 + M · 4 (0.13 GB there)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        # generated kernels where a gradient is wanted (training); evaluation and generation (few rows, other
        # input variants) keep the eager math
        fused = _generated(x) and any(ctx.needs_input_grad[:2])
        y, rstd = (_norm_fused if fused else _norm_math)(x2, weight, eps)
        ctx.save_for_backward(x2, weight, rstd)
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        x2, weight, rstd = ctx.saved_tensors
        g2 = g.reshape(x2.shape)
        dx, dweight = (_norm_backward_fused if _generated(g) else _norm_backward_math)(g2, x2, weight, rstd)
        return dx.view(g.shape), dweight.to(weight.dtype), None


def _final_norm_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    """The patched model's final norm (LlamaRMSNorm's math and parameters; _FinalNorm's saved tensors)."""
    return _FinalNorm.apply(hidden_states, self.weight, self.variance_epsilon)


def _unused_rotary_forward(self, x: torch.Tensor, position_ids: torch.Tensor | None = None, *args, **kwargs):
    """The patched model's rotary embedding: empty (cos, sin), which its coda layers never read (no kernel
    is launched). A module that shares this rotary module with the model (a drafter tied to it) gets the empty
    tables too."""
    empty = x.new_empty(0)
    return empty, empty


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


def apply_coda_to_llama(model, impl: str = "auto", prebuild_tokens: int | torch.Tensor | None = None,
                        jobs: int | None = None, lm_head_chunk_bytes: int | None = None):
    """See the module docstring; returns model. impl: 'auto' (fused on CUDA tensors, the fp32
    references elsewhere), 'fused' or 'reference'. prebuild_tokens: the tokens per training step
    (or a batch of input_ids): every kernel such a step launches is built now, in parallel
    (prebuild_llama, `jobs` nvcc processes at once). lm_head_chunk_bytes: the training loss's exp(logits)
    chunk (default 1 GiB; 512 MiB holds 0.56 GB less at V 128256 for about 3 % of a 1B-like step: see
    ops.lm_head_cross_entropy_loss)."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    check_chunk_bytes("apply_coda_to_llama", lm_head_chunk_bytes, "lm_head_chunk_bytes")
    if prebuild_tokens is not None and impl == "reference":
        raise ValueError("apply_coda_to_llama: prebuild_tokens builds the fused kernels, but impl='reference' "
                         "launches none; leave prebuild_tokens out, or use impl='auto' or 'fused'")
    _check_model(model)
    if prebuild_tokens is not None:   # its refusals (dtype, shapes, tokens) before the model changes
        step_kernels(model, prebuild_tokens, lm_head_chunk_bytes)
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
    model._coda_lm_head_chunk_bytes = lm_head_chunk_bytes
    model.forward = types.MethodType(_causal_lm_forward, model)
    model.model.rotary_emb.forward = types.MethodType(_unused_rotary_forward, model.model.rotary_emb)
    norm = model.model.norm
    if hasattr(norm, "weight") and hasattr(norm, "variance_epsilon"):   # LlamaRMSNorm
        norm.forward = types.MethodType(_final_norm_forward, norm)
    if prebuild_tokens is not None:
        prebuild_llama(model, prebuild_tokens, jobs)
    return model


def _token_count(tokens) -> int:
    """Tokens per step from a count or a batch of input_ids (B, S)."""
    n = tokens.numel() if isinstance(tokens, torch.Tensor) else tokens
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"tokens must be a positive int (batch × sequence length) or a tensor of input_ids, got "
                         f"{tokens!r}")
    return n


#: step_kernels' default chunk budget: the patched model's (apply_coda_to_llama's lm_head_chunk_bytes)
MODEL_CHUNK = "model"


def step_kernels(model, tokens: int | torch.Tensor, lm_head_chunk_bytes: int | str | None = MODEL_CHUNK) -> list:
    """(graph, dtype, kernel config) of every kernel one training step (forward and backward, the
    fused impl) of `model` (a transformers LlamaForCausalLM, patched or not yet) launches at `tokens`
    tokens per step: the decoder layers and the fused LM head + cross-entropy (fed the final norm's
    output, as the patch's loss is, in chunks of lm_head_chunk_bytes: the patched model's by default, None
    for the library's default). The kernels' dtype is the model's (bf16 or fp16)."""
    _check_model(model)
    if lm_head_chunk_bytes == MODEL_CHUNK:
        lm_head_chunk_bytes = getattr(model, "_coda_lm_head_chunk_bytes", None)
    check_chunk_bytes("step_kernels", lm_head_chunk_bytes, "lm_head_chunk_bytes")
    cfg = LlamaConfig.from_hf(model.config)
    if cfg.fused_problems():
        raise ValueError("the fused Llama layer does not take " + "; ".join(cfg.fused_problems()))
    dtype = model.dtype
    if dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"the fused kernels run bf16 or fp16, but the model is {dtype}: cast it first "
                         "(model.to(torch.bfloat16)), then prebuild")
    return training_kernels(cfg, _token_count(tokens), dtype_name(dtype), lm_head=True, lm_head_rstd=False,
                            lm_head_chunk_bytes=lm_head_chunk_bytes)


def prebuild_llama(model, tokens: int | torch.Tensor, jobs: int | None = None,
                   lm_head_chunk_bytes: int | str | None = MODEL_CHUNK) -> list[str]:
    """Builds every kernel a training step of `model` at `tokens` tokens per step launches
    (step_kernels, with its lm_head_chunk_bytes) and the torch binding, in parallel (`jobs` nvcc processes,
    default: the CPU count capped by memory, jit.default_jobs), with one progress line; kernels already in
    the cache are not rebuilt. Needs nvcc, not a GPU. Returns the kernels' library paths."""
    items = step_kernels(model, tokens, lm_head_chunk_bytes)
    sources = {ks.source: ks for ks in (jit.kernel_source(*item) for item in items)}
    hits = sum(jit.cached(ks) for ks in sources.values())
    todo = f"; building {len(sources) - hits} with -j {jobs or jit.default_jobs()}" if hits < len(sources) else ""
    print(f"coda_ext: a training step of this Llama at {_token_count(tokens)} tokens launches {len(sources)} "
          f"kernels ({items[0][1]}): {hits} in the cache{todo}", file=sys.stderr, flush=True)
    return prebuild(items, jobs, binding=True)


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
    if use_cache is None and self.training and torch.is_grad_enabled():
        # a training step builds no KV cache unless asked (transformers' model builds one from config.use_cache:
        # each layer's k and v copied into it, 3 ms a step at Llama-3.2-1B-like, 8 layers, 16384 tokens, H200)
        use_cache = False
    if attention_mask is None and position_ids is None and (past_key_values is None or
                                                            past_key_values.get_seq_length() == 0):
        # (position_ids given may pack several sequences in a row: transformers then builds their block mask)
        kwargs[CAUSAL_FLAG] = True
        # transformers returns a 4-D mask as given (the layers never read it under the flag): without one, its mask
        # code checks position_ids for packed sequences with a host read, which stalled the forward on the GPU
        attention_mask = _UNREAD_MASK
    outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache, **kwargs)
    hidden = outputs.last_hidden_state
    loss = logits = None
    if labels is not None or target is not None:
        if target is None:
            target = shift_labels(labels, ignore_index)
        target = target.to(hidden.device)
        impl = resolve_impl(self._coda_impl, hidden)
        chunk = getattr(self, "_coda_lm_head_chunk_bytes", None)
        if num_items_in_batch is None:
            loss = lm_head_loss(hidden, self.lm_head.weight, target, None, ignore_index, impl, chunk_bytes=chunk)
        else:   # gradient accumulation: the sum over this batch, divided by the tokens of all its micro-batches
            loss = lm_head_loss(hidden, self.lm_head.weight, target, None, ignore_index, impl, reduction="sum",
                                chunk_bytes=chunk)
            loss = loss / torch.as_tensor(num_items_in_batch, device=loss.device)
    if loss is None or not self.training:
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(hidden[:, keep, :])
    out = CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=outputs.past_key_values)
    return out.to_tuple() if return_dict is False else out
