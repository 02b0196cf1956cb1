"""What a compiled Hugging Face Llama hands SDPA in a training call, and attention alone timed.

    python -m benchmarks.attention_masks      # a GPU; prints, writes nothing

A Llama-3.2-1B-like layer (32 query heads, 8 key/value heads of 64, 2 × 2048 tokens, no KV cache) is traced
by torch.compile with and without coda_ext.fusion.hf_masks.with_plain_masks: the SDPA call Dynamo records
(its mask, is_causal, enable_gqa) and the attention op AOTAutograd lowers it to. Then SDPA forward + backward
alone, eager and compiled: causal with grouped-query heads, causal with K and V repeated per query head (what
transformers does when a mask is given), and masked (docs/measured.md, the Llama step's attention).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

B, S, H, KV, D = 2, 2048, 32, 8, 64


def traced_attention(wrap: bool) -> None:
    """Prints the SDPA calls of one compiled training call (Dynamo's graph and AOTAutograd's)."""
    from torch._functorch.aot_autograd import aot_module_simplified, make_boxed_func
    from transformers import LlamaConfig, LlamaForCausalLM

    from coda_ext.fusion.hf_masks import with_plain_masks

    cfg = LlamaConfig(vocab_size=1024, hidden_size=H * D, intermediate_size=8192, num_hidden_layers=1,
                      num_attention_heads=H, num_key_value_heads=KV, head_dim=D, use_cache=False,
                      bos_token_id=0, eos_token_id=0, attn_implementation="sdpa")
    model = LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).train()

    def shapes(args, key):
        return [tuple(a.meta[key].shape) if hasattr(a, "meta") and key in a.meta else a for a in args]

    def backend(gm, example_inputs):
        for n in gm.graph.nodes:
            if n.op == "call_function" and "attention" in str(n.target):
                print("  dynamo:", n.target.__name__, shapes(n.args, "example_value"), n.kwargs, flush=True)

        def show(g, _):
            for n in g.graph.nodes:
                if n.op == "call_function" and "attention" in str(n.target):
                    print("  aot:", n.target, shapes(n.args, "val"), flush=True)
            return make_boxed_func(g.forward)
        return aot_module_simplified(gm, example_inputs, fw_compiler=show, bw_compiler=show)

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    compiled = with_plain_masks(compiled) if wrap else compiled
    print("with plain_masks" if wrap else "without plain_masks", flush=True)
    ids = torch.randint(0, cfg.vocab_size, (B, S), device="cuda")
    compiled(input_ids=ids, labels=ids).loss.backward()


def timed(fn, q, k, v, do, reps: int = 20) -> float:
    for _ in range(3):
        fn(q, k, v).backward(do)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn(q, k, v).backward(do)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def main() -> None:
    import transformers

    print("torch", torch.__version__, "transformers", transformers.__version__, flush=True)
    for wrap in (True, False):
        traced_attention(wrap)
    g = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape, grad=True):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(grad)
    q, k, v, do = randn(B, H, S, D), randn(B, KV, S, D), randn(B, KV, S, D), randn(B, H, S, D, grad=False)
    mask = torch.ones(S, S, dtype=torch.bool, device="cuda").tril()

    def gqa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    def repeated(q, k, v):
        k, v = (t[:, :, None].expand(B, KV, H // KV, S, D).reshape(B, H, S, D) for t in (k, v))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def masked(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)

    for name, fn in (("causal, grouped-query", gqa), ("causal, K and V repeated", repeated), ("masked", masked)):
        eager = timed(fn, q, k, v, do)
        torch._dynamo.reset()
        compiled = timed(torch.compile(fn), q, k, v, do)
        print(f"{name}: forward + backward eager {eager:.3f} ms, compiled {compiled:.3f} ms", flush=True)


if __name__ == "__main__":
    main()
