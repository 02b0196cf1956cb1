"""torch.nn modules of a Llama decoder built on coda_ext's fused ops, forward and backward:

    from coda_ext.models import CodaLlamaForCausalLM, LlamaConfig

    cfg = LlamaConfig(hidden_size=2048, intermediate_size=8192, num_attention_heads=32,
                      num_key_value_heads=8, num_hidden_layers=16, vocab_size=128256)
    model = CodaLlamaForCausalLM(cfg).to("cuda", torch.bfloat16)
    model.load_state_dict(hf_state_dict)        # Hugging Face names and layouts, converted once
    loss = model(input_ids, labels=input_ids).loss
    loss.backward()

Weights live in the fused layouts (QKV concatenated with Q/K rows in adjacent-pair RoPE order,
gate/up interleaved); `state_dict()` writes Hugging Face's names and layouts. `impl="reference"`
runs the same autograd wiring on every op's fp32 reference (CPU works). EagerLlamaForCausalLM is
a plain PyTorch Llama with the same names, the baseline of comparisons. Build the kernels of a
training step ahead of time, in parallel: coda_ext.prebuild(training_kernels(cfg, batch * seq)).
"""
from .config import LlamaConfig
from .eager import EagerLlamaDecoderLayer, EagerLlamaForCausalLM, EagerLlamaModel
from .functions import WEIGHT_GRAD_BACKENDS, MLPBlock, QKVRoPE, training_kernels, weight_grad_backend
from .llama import (
    CausalLMOutput,
    CodaAttention,
    CodaLlamaDecoderLayer,
    CodaLlamaForCausalLM,
    CodaLlamaModel,
    CodaMLP,
    RMSNorm,
    shift_labels,
)

__all__ = [
    "WEIGHT_GRAD_BACKENDS", "CausalLMOutput", "CodaAttention", "CodaLlamaDecoderLayer", "CodaLlamaForCausalLM",
    "CodaLlamaModel", "CodaMLP", "EagerLlamaDecoderLayer", "EagerLlamaForCausalLM", "EagerLlamaModel", "LlamaConfig",
    "MLPBlock", "QKVRoPE", "RMSNorm", "shift_labels", "training_kernels", "weight_grad_backend",
]
