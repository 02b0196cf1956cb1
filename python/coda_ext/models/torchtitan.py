"""coda_ext's decoder layer inside torchtitan's Llama 3: a model converter (torchtitan's
`model.converters` hook, as its float8 converter is one) that runs every TransformerBlock on the
autograd Functions of coda_ext.models (QKVRoPE, MLPBlock) and keeps torchtitan's parameters, names and
layouts, so checkpoints, torchtitan's Hugging Face state-dict adapter, FSDP2, activation
checkpointing and torch.compile per block work as before. Recipe: docs/distributed.md.

    from coda_ext.models.torchtitan import convert_torchtitan_llama
    convert_torchtitan_llama(model)          # any torchtitan Llama 3 Transformer, before parallelize

What a block computes: x ─ attention_norm ─ wq|wk|wv + RoPE (QKVRoPE) ─ SDPA (causal) ─ wo + residual
─ ffn_norm ─ w1|w3 + SwiGLU ─ w2 + residual (MLPBlock), the same math as torchtitan's block.
torchtitan's wq and wk already keep each head's RoPE pairs adjacent (its complex RoPE), the order
coda_ext's qkv_rope rotates, so the QKV weight is [wq; wk; wv] as stored; the gate/up weight
interleaves w1 (gate) and w3 (up). Both are assembled each step from the (FSDP2-unsharded) weights:
one copy of those weights per layer, kept for backward unless activation checkpointing recomputes it.
RoPE frequencies come from the model's own freqs_cis (position 1's angles), read once when it holds
values: at conversion, or else right after torchtitan's init_weights (meta-device initialization).
Not supported (raise): attention masks (flex or varlen attention: use attn_type "sdpa"), biases;
CodaConverter also refuses tensor and context parallelism (heads split across ranks).
"""
from __future__ import annotations

import functools
import types

import torch

from ..ops import interleave_gate_up, rope_frequencies
from .functions import IMPLS, MLPBlock, QKVRoPE, resolve_impl
from .llama import attention, default_positions


def _blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    layers = getattr(model, "layers", None)
    if layers is None:
        raise TypeError(f"convert_torchtitan_llama takes torchtitan's Llama 3 Transformer (with .layers), got "
                        f"{type(model).__name__}")
    blocks = list(layers.values() if isinstance(layers, torch.nn.ModuleDict) else layers)
    for i, b in enumerate(blocks):
        missing = [n for n in ("attention.wq", "attention.wk", "attention.wv", "attention.wo", "attention.head_dim",
                               "feed_forward.w1", "feed_forward.w2", "feed_forward.w3", "attention_norm", "ffn_norm")
                   if _get(b, n) is None]
        if missing:
            raise TypeError(f"convert_torchtitan_llama: layer {i} ({type(b).__name__}) has no {missing}; it takes "
                            "torchtitan's Llama 3 TransformerBlock (call it before torch.compile and activation "
                            "checkpointing wrap the blocks)")
        biased = [n for n in ("attention.wq", "attention.wk", "attention.wv", "attention.wo", "feed_forward.w1",
                              "feed_forward.w2", "feed_forward.w3") if getattr(_get(b, n), "bias", None) is not None]
        if biased:
            raise ValueError(f"convert_torchtitan_llama: layer {i} has biases in {biased}; not supported")
    return blocks


def _get(module, path: str):
    for name in path.split("."):
        module = getattr(module, name, None)
    return module


def rope_inv_freq(freqs_cis: torch.Tensor) -> torch.Tensor:
    """(head_dim/2,) radians per position, fp64 on the CPU, from torchtitan's freqs_cis table
    (max_seq_len, head_dim/2) of complex exp(i·position·inv_freq): the angles at position 1."""
    return freqs_cis[1].detach().cpu().to(torch.complex128).angle()


def _set_rope_tables(model: torch.nn.Module, blocks: list) -> None:
    """Each block's qkv_rope frequency table (fp32 hi + lo) from model.freqs_cis, on its device (once)."""
    inv_freq = rope_inv_freq(model.freqs_cis)
    for b in blocks:
        n_heads, n_kv_heads, head_dim = b.attention._coda_heads
        b._coda_rope = rope_frequencies(head_dim, n_heads, n_kv_heads, inv_freq=inv_freq,
                                        device=model.freqs_cis.device)


def _heads(attn) -> tuple[int, int, int]:
    """(n_heads, n_kv_heads, head_dim) from the weights' shapes and the module's head_dim."""
    hd = attn.head_dim
    return attn.wq.weight.shape[0] // hd, attn.wk.weight.shape[0] // hd, hd


def _block_forward(self, x: torch.Tensor, freqs_cis: torch.Tensor, attention_masks=None,
                   positions: torch.Tensor | None = None) -> torch.Tensor:
    """torchtitan's TransformerBlock.forward on coda_ext's autograd Functions."""
    if attention_masks is not None:
        raise NotImplementedError("coda_ext's torchtitan block runs causal SDPA only; set the model's attn_type "
                                  "to 'sdpa' (flex and varlen attention masks are not supported)")
    if self._coda_rope is None:
        raise RuntimeError("coda_ext's torchtitan block has no RoPE table: the model's freqs_cis had no values at "
                           "conversion and init_weights has not run since; call model.init_weights() first")
    if self._coda_rope.device != x.device:   # the model moved after conversion: the table follows, once
        self._coda_rope = self._coda_rope.to(x.device)
    a, f = self.attention, self.feed_forward
    impl = resolve_impl(self._coda_impl, x)
    n_heads, n_kv_heads, _ = a._coda_heads
    eps = _eps(self.attention_norm, x)
    w_qkv = torch.cat([a.wq.weight, a.wk.weight, a.wv.weight])
    q, k, v, x = QKVRoPE.apply(x, self.attention_norm.weight, w_qkv, default_positions(x, positions),
                               self._coda_rope, n_heads, n_kv_heads, eps, impl)   # x handed on to MLPBlock
    y0 = attention(q, k, v)
    w_gu = interleave_gate_up(f.w1.weight, f.w3.weight)
    return MLPBlock.apply(y0.contiguous(), x, a.wo.weight, self.ffn_norm.weight, w_gu, f.w2.weight,
                          _eps(self.ffn_norm, x), impl)


def _eps(norm, x: torch.Tensor) -> float:
    eps = getattr(norm, "eps", None)
    return torch.finfo(x.dtype).eps if eps is None else float(eps)   # torch.nn.RMSNorm's default


def _init_weights_then_tables(model, blocks, init_weights, *args, **kwargs):
    out = init_weights(*args, **kwargs)
    _set_rope_tables(model, blocks)
    return out


def convert_torchtitan_llama(model: torch.nn.Module, impl: str = "auto") -> torch.nn.Module:
    """Runs every block of torchtitan's Llama 3 `model` on coda_ext's fused ops, in place (before
    torchtitan's parallelize: activation checkpointing, torch.compile and FSDP2 then wrap the converted
    blocks); parameters are untouched. impl: 'auto' (fused on CUDA tensors, the fp32 references
    elsewhere), 'fused' or 'reference'. Returns model."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    blocks = _blocks(model)
    freqs = getattr(model, "freqs_cis", None)
    if not isinstance(freqs, torch.Tensor):
        raise TypeError("convert_torchtitan_llama: the model has no freqs_cis buffer (torchtitan's RoPE table)")
    for b in blocks:
        b.attention._coda_heads = _heads(b.attention)
        b._coda_impl, b._coda_rope = impl, None
        b.forward = types.MethodType(_block_forward, b)
    if freqs.is_meta:   # torchtitan builds on the meta device; its init_weights fills freqs_cis later
        model.init_weights = functools.partial(_init_weights_then_tables, model, blocks, model.init_weights)
    else:
        _set_rope_tables(model, blocks)
    return model


class CodaConverter:
    """torchtitan's ModelConverter (the `model.converters` protocol of torchtitan 0.1 and 0.2), registered
    by register() as "coda_ext". Works with data parallelism (FSDP2, HSDP, DDP), activation
    checkpointing and torch.compile per block; refuses tensor and context parallelism."""

    def __init__(self, job_config, parallel_dims):
        for dim in ("tp", "cp"):
            if getattr(parallel_dims, f"{dim}_enabled", False):
                raise ValueError(f"coda_ext's torchtitan converter does not support {dim.upper()} (heads sharded "
                                 "across ranks); use data parallelism (FSDP2) only")

    def convert(self, model: torch.nn.Module) -> None:
        convert_torchtitan_llama(model)

    def post_optimizer_hook(self, model) -> None:
        pass


def register(name: str = "coda_ext") -> None:
    """Registers CodaConverter with torchtitan under `name` (call it from the module torchtitan's
    `--experimental.custom_import` imports; then `--model.converters coda_ext`)."""
    try:
        from torchtitan.protocols.model_converter import register_model_converter
    except ImportError as e:
        raise ImportError("coda_ext.models.torchtitan.register needs torchtitan with the model.converters protocol "
                          "(0.1 or 0.2: torchtitan.protocols.model_converter); on newer torchtitan call "
                          "convert_torchtitan_llama(model) where the model is built (docs/distributed.md)") from e
    register_model_converter(CodaConverter, name)
