"""The Llama configuration of coda_ext.models and the weight-layout conversions between Hugging
Face checkpoints and the layouts the fused ops read (done at load and save, never per step).

Stored layouts: the attention's `qkv_weight` is [W_q; W_k; W_v] with the rows of every Q and K head
in adjacent-pair RoPE order (coda_ext.ops.rotate_half_to_pairs); the MLP's `gate_up_weight` has
rows gate₀, up₀, gate₁, up₁, … (coda_ext.ops.interleave_gate_up). `state_dict()` and
`load_state_dict()` speak Hugging Face's names and layouts (`self_attn.q_proj.weight`, …,
`mlp.gate_proj.weight`, …) through the module hooks installed here.
"""
from __future__ import annotations

import dataclasses
import functools
import types

import torch

from .. import ops

#: LlamaConfig.rope_table's tables: {(config, device): table}
_ROPE_TABLES: dict = {}


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """A Llama decoder's shape (Hugging Face LlamaConfig names). The defaults are Llama-3.2-1B's
    shape without its RoPE scaling; `rope_inv_freq` (head_dim/2 radians per position) overrides
    `rope_theta`, e.g. with Llama 3's scaled frequencies."""
    hidden_size: int = 2048
    intermediate_size: int = 8192
    num_attention_heads: int = 32
    num_key_value_heads: int = 8
    head_dim: int | None = None
    num_hidden_layers: int = 16
    vocab_size: int = 128256
    rms_norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    rope_inv_freq: tuple[float, ...] | None = None
    tie_word_embeddings: bool = False
    initializer_range: float = 0.02

    def __post_init__(self):
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"LlamaConfig: num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                             f"num_key_value_heads ({self.num_key_value_heads})")
        if self.head_dim % 2:
            raise ValueError(f"LlamaConfig: head_dim must be even (RoPE rotates pairs), got {self.head_dim}")
        if self.rope_inv_freq is not None and len(self.rope_inv_freq) != self.head_dim // 2:
            raise ValueError(f"LlamaConfig: rope_inv_freq needs head_dim/2 = {self.head_dim // 2} values, got "
                             f"{len(self.rope_inv_freq)}")

    @property
    def qkv_size(self) -> int:
        return (self.num_attention_heads + 2 * self.num_key_value_heads) * self.head_dim

    def inv_freq(self) -> torch.Tensor:
        """(head_dim/2,) fp64 radians per position, on the CPU."""
        with torch.device("cpu"):   # also inside a torch.device("meta") context (modules built without init)
            if self.rope_inv_freq is not None:
                return torch.tensor(self.rope_inv_freq, dtype=torch.float64)
            return ops.default_inv_freq(self.head_dim, self.rope_theta)

    def rope_table(self, device=None) -> torch.Tensor:
        """The (2, qkv_size) fp32 frequency table of coda_ext.ops.qkv_rope: one tensor per config and device,
        shared by the layers that ask (the RoPE backward then computes its cos/sin tables once a step, not once
        a layer)."""
        key = (self, str(torch.device(device) if device is not None else torch.device("cpu")))
        try:
            table = _ROPE_TABLES.get(key)
        except TypeError:   # a config with an unhashable field: a table of its own
            key, table = None, None
        if table is None:
            with torch.device("cpu"):
                table = ops.rope_frequencies(self.head_dim, self.num_attention_heads, self.num_key_value_heads,
                                             inv_freq=self.inv_freq()).to(device)
            if key is not None:
                _ROPE_TABLES[key] = table
        return table

    def fused_problems(self) -> list[str]:
        """What keeps this shape from the fused kernels (empty when they take it)."""
        out = []
        if self.head_dim not in (64, 128):
            out.append(f"head_dim {self.head_dim} (the fused QKV + RoPE kernel takes 64 or 128)")
        if self.hidden_size % 8:
            out.append(f"hidden_size {self.hidden_size} (a multiple of 8 keeps rows 16-byte aligned)")
        if self.intermediate_size % 4:
            out.append(f"intermediate_size {self.intermediate_size} (the SwiGLU backward needs a multiple of 4)")
        if self.vocab_size % 8:
            out.append(f"vocab_size {self.vocab_size} (the LM head backward needs a multiple of 8: pad the vocabulary)")
        return out

    @classmethod
    def from_hf(cls, hf_config, rope_inv_freq: torch.Tensor | None = None) -> LlamaConfig:
        """From a transformers LlamaConfig. rope_inv_freq: the model's RoPE frequencies (its
        rotary_emb.inv_freq), which carry any RoPE scaling; else rope_theta is read."""
        if getattr(hf_config, "attention_bias", False) or getattr(hf_config, "mlp_bias", False):
            raise ValueError("coda_ext.models: Llama with attention or MLP biases is not supported")
        if getattr(hf_config, "hidden_act", "silu") != "silu":
            raise ValueError(f"coda_ext.models: hidden_act {hf_config.hidden_act!r} is not supported (SwiGLU: silu)")
        params = getattr(hf_config, "rope_parameters", None) or {}
        theta = params.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
        return cls(
            hidden_size=hf_config.hidden_size, intermediate_size=hf_config.intermediate_size,
            num_attention_heads=hf_config.num_attention_heads, num_key_value_heads=hf_config.num_key_value_heads,
            head_dim=getattr(hf_config, "head_dim", None), num_hidden_layers=hf_config.num_hidden_layers,
            vocab_size=hf_config.vocab_size, rms_norm_eps=hf_config.rms_norm_eps, rope_theta=float(theta),
            rope_inv_freq=None if rope_inv_freq is None else tuple(float(f) for f in rope_inv_freq.double().cpu()),
            tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
            initializer_range=getattr(hf_config, "initializer_range", 0.02))


# --- Hugging Face <-> coda layouts ------------------------------------------------------------------------

_QKV = ("q_proj.weight", "k_proj.weight", "v_proj.weight")
_GU = ("gate_proj.weight", "up_proj.weight")


def qkv_from_hf(cfg: LlamaConfig, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    hd = cfg.head_dim
    return torch.cat([ops.rotate_half_to_pairs(q, hd), ops.rotate_half_to_pairs(k, hd), v])


def qkv_to_hf(cfg: LlamaConfig, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    hd, nq, nkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    q, k, v = w.split([nq * hd, nkv * hd, nkv * hd])
    return ops.pairs_to_rotate_half(q, hd), ops.pairs_to_rotate_half(k, hd), v.contiguous()


def _move_last(state_dict, key: str) -> None:
    if key in state_dict:
        state_dict[key] = state_dict.pop(key)


def _placed_like(t: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """t with ref's mesh and placements when ref is a DTensor (a parameter sharded by FSDP2 or
    tensor parallelism), else t: a converted weight stays sharded as its parameter is (no full copy
    per rank), and a plain tensor loaded into a sharded parameter is sharded first."""
    if not torch.distributed.is_available():
        return t
    from torch.distributed.tensor import DTensor, distribute_tensor

    if not isinstance(ref, DTensor):
        return t
    if isinstance(t, DTensor):
        return t.redistribute(ref.device_mesh, ref.placements)
    return distribute_tensor(t.to(ref.device), ref.device_mesh, ref.placements)


def _save_hook(fused: str, hf_names: tuple[str, ...], split, after: str):
    """A state-dict hook: the fused parameter `fused` written as the Hugging Face tensors `hf_names`
    (then `after`, to keep Hugging Face's order)."""
    def hook(module, state_dict, prefix, local_metadata):
        w = state_dict.pop(prefix + fused)
        with torch.no_grad():
            parts = split(module.config, w.detach())
        for name, t in zip(hf_names, parts):
            state_dict[prefix + name] = _placed_like(t, w)
        _move_last(state_dict, prefix + after)
    return hook


def _load_hook(fused: str, hf_names: tuple[str, ...], join, shapes):
    """A load-state-dict pre-hook: the Hugging Face tensors `hf_names`, if present, joined into `fused`."""
    def hook(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
        keys = [prefix + n for n in hf_names]
        present = [k in state_dict for k in keys]
        if not any(present):
            return
        if not all(present):
            error_msgs.append(f"{prefix}: found {[k for k, p in zip(keys, present) if p]} but not "
                              f"{[k for k, p in zip(keys, present) if not p]}; the fused {prefix}{fused} needs all "
                              f"of {list(hf_names)}")
            return
        want = shapes(module.config)
        got = [tuple(state_dict[k].shape) for k in keys]
        if got != want:
            error_msgs.append(f"size mismatch for {prefix}{hf_names}: the checkpoint has {got}, the model {want}")
            return
        with torch.no_grad():
            joined = join(module.config, *(state_dict.pop(k) for k in keys))
            state_dict[prefix + fused] = _placed_like(joined, getattr(module, fused))
    return hook


def _name_hf_weights(module: torch.nn.Module, hf_names: tuple[str, ...]) -> None:
    """Lets torch.distributed.checkpoint's get/set_model_state_dict resolve the Hugging Face keys
    `hf_names` the hooks write (it follows each key's attributes from the model, and a module's
    `_fqn_modifiers` mapping, written for state-dict hooks that rename keys, to an object holding
    them): `<prefix>q_proj.weight` resolves through `module._hf_weights.q_proj.weight` (None)."""
    names = tuple(n.split(".")[0] for n in hf_names)
    module._hf_weights = types.SimpleNamespace(**{n: types.SimpleNamespace(weight=None) for n in names})
    module._fqn_modifiers = functools.partial(dict, dict.fromkeys(names, "_hf_weights"))


def install_qkv_hooks(module: torch.nn.Module) -> None:
    """`module.qkv_weight` saved and loaded as q_proj/k_proj/v_proj (module.config: a LlamaConfig)."""
    def shapes(c):
        return [(c.num_attention_heads * c.head_dim, c.hidden_size)] + \
            [(c.num_key_value_heads * c.head_dim, c.hidden_size)] * 2
    module._register_state_dict_hook(_save_hook("qkv_weight", _QKV, qkv_to_hf, "o_proj.weight"))
    module._register_load_state_dict_pre_hook(_load_hook("qkv_weight", _QKV, qkv_from_hf, shapes), with_module=True)
    _name_hf_weights(module, _QKV)


def install_gate_up_hooks(module: torch.nn.Module) -> None:
    """`module.gate_up_weight` saved and loaded as gate_proj/up_proj."""
    def shapes(c):
        return [(c.intermediate_size, c.hidden_size)] * 2
    module._register_state_dict_hook(
        _save_hook("gate_up_weight", _GU, lambda c, w: ops.split_gate_up(w), "down_proj.weight"))
    module._register_load_state_dict_pre_hook(
        _load_hook("gate_up_weight", _GU, lambda c, g, u: ops.interleave_gate_up(g, u), shapes), with_module=True)
    _name_hf_weights(module, _GU)
