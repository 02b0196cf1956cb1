"""coda_ext.hf.apply_coda_to_llama on a tiny random transformers LlamaForCausalLM (no downloads),
impl="reference" on the CPU: the patched model gives the original's loss, gradients (every
parameter), logits and greedy generations, with and without padding and gradient checkpointing;
its state_dict()/save_pretrained() load in plain transformers.
"""
from __future__ import annotations

import copy
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

from coda_ext import ops  # noqa: E402  (after the importorskip)
from coda_ext.hf import apply_coda_to_llama  # noqa: E402  (after the importorskip)
from tests.helpers.autograd_graph import summed_gradients  # noqa: E402
from tests.helpers.hf_llama import VOCAB, tiny_llama  # noqa: E402

B, S, V = 2, 16, VOCAB
RTOL = 2e-5


def hf_model(seed=0, **overrides):
    return tiny_llama(seed, **overrides)


def pair(**overrides):
    ref = hf_model(**overrides)
    patched = apply_coda_to_llama(copy.deepcopy(ref), impl="reference")
    return ref, patched


def batch(seed=1):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (B, S), generator=gen)
    labels = ids.clone()
    labels[1, :4] = -100
    return ids, labels


def grads_by_hf_name(model) -> dict:
    cfg = model.config
    hd, nq, nkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    out = {}
    for name, p in model.named_parameters():
        if name.endswith("qkv_weight"):
            q, k, v = p.grad.split([nq * hd, nkv * hd, nkv * hd])
            base = name[: -len("qkv_weight")]
            out.update({base + "q_proj.weight": ops.pairs_to_rotate_half(q, hd),
                        base + "k_proj.weight": ops.pairs_to_rotate_half(k, hd), base + "v_proj.weight": v})
        elif name.endswith("gate_up_weight"):
            base = name[: -len("gate_up_weight")]
            out[base + "gate_proj.weight"], out[base + "up_proj.weight"] = ops.split_gate_up(p.grad)
        else:
            out[name] = p.grad
    return out


def close(got, want, what):
    torch.testing.assert_close(got, want, rtol=RTOL, atol=2e-6 * (1 + want.abs().max().item()), msg=what)


def check_grads(patched, ref):
    got = grads_by_hf_name(patched)
    want = {n: p.grad for n, p in ref.named_parameters()}
    assert set(got) == set(want)
    for name in want:
        close(got[name], want[name], f"gradient of {name}")


def test_layers_are_swapped_and_names_kept():
    ref, patched = pair()
    from coda_ext.hf.llama import CodaHFLlamaDecoderLayer

    assert all(isinstance(layer, CodaHFLlamaDecoderLayer) for layer in patched.model.layers)
    sd, want = patched.state_dict(), ref.state_dict()
    assert list(sd) == list(want)
    for k in want:
        assert torch.equal(sd[k], want[k]), k


def test_lm_head_chunk_bytes_reaches_the_loss_and_the_prebuild(monkeypatch):
    """apply_coda_to_llama(lm_head_chunk_bytes=...) hands the budget to the fused loss on every training
    forward and to step_kernels (the LM head's chunk GEMMs that prebuild lists); a bad budget is refused before
    the model changes."""
    import coda_ext.hf.llama as hfl

    seen = []
    real_loss = hfl.lm_head_loss

    def loss(*args, **kwargs):
        seen.append(("loss", kwargs.get("chunk_bytes")))
        return real_loss(*args, **kwargs)

    def kernels(*args, **kwargs):
        seen.append(("kernels", kwargs.get("lm_head_chunk_bytes")))
        return []

    monkeypatch.setattr(hfl, "lm_head_loss", loss)
    monkeypatch.setattr(hfl, "training_kernels", kernels)
    model = apply_coda_to_llama(hf_model(), impl="reference", lm_head_chunk_bytes=64 << 20)
    ids, labels = batch(2)
    model.train()
    model(ids, labels=labels).loss.backward()
    hfl.step_kernels(model.to(torch.bfloat16), 64)
    hfl.step_kernels(model, 64, None)                     # the library's default, not the model's
    assert seen == [("loss", 64 << 20), ("kernels", 64 << 20), ("kernels", None)]
    with pytest.raises(ValueError, match="step_kernels: lm_head_chunk_bytes must be a positive int"):
        hfl.step_kernels(model, 64, 1.5e9)
    fresh = hf_model()
    with pytest.raises(ValueError, match="apply_coda_to_llama: lm_head_chunk_bytes must be a positive int"):
        apply_coda_to_llama(fresh, impl="reference", lm_head_chunk_bytes=-5)
    assert not isinstance(fresh.model.layers[0], hfl.CodaHFLlamaDecoderLayer)


def test_rotary_tables_are_not_computed():
    """The patched layers take their angles from their own table, so the rotary module returns empty tables
    (no kernels); the model's output stays transformers' (the training and generation tests)."""
    ref, patched = pair()
    h = torch.randn(B, S, 128)
    cos, sin = patched.model.rotary_emb(h, torch.arange(S)[None])
    assert cos.numel() == sin.numel() == 0 and cos.dtype == h.dtype
    assert ref.model.rotary_emb(h, torch.arange(S)[None])[0].shape[-2] == S


@pytest.mark.parametrize("padded", [False, True])
def test_training_loss_and_every_gradient(padded):
    ref, patched = pair()
    ids, labels = batch()
    mask = None
    if padded:   # left padding of the second sequence
        mask = torch.ones(B, S, dtype=torch.long)
        mask[1, :4] = 0
    ref.train()
    patched.train()
    want = ref(ids, attention_mask=mask, labels=labels, use_cache=False)
    got = patched(ids, attention_mask=mask, labels=labels, use_cache=False)
    assert got.logits is None   # training with labels: the fused loss, no logits
    close(got.loss, want.loss, "loss")
    want.loss.backward()
    got.loss.backward()
    check_grads(patched, ref)


def _sdpa_calls(model, ids, labels, mask) -> list:
    """(attn_mask is given, is_causal) of every SDPA call in the graphs torch.compile traces of one step."""
    calls = []

    def backend(gm, example_inputs):
        for node in gm.graph.nodes:
            if node.op == "call_function" and "scaled_dot_product_attention" in str(node.target):
                mask_arg = node.kwargs.get("attn_mask", node.args[3] if len(node.args) > 3 else None)
                calls.append((mask_arg is not None, node.kwargs.get("is_causal", False)))
        return gm.forward

    torch._dynamo.reset()
    try:
        loss = torch.compile(model, backend=backend, fullgraph=True)(ids, attention_mask=mask, labels=labels).loss
    finally:
        torch._dynamo.reset()
    return calls, loss


@pytest.mark.parametrize("padded", [False, True])
def test_compiled_attention_stays_causal_without_a_mask(padded, monkeypatch):
    """transformers materializes the causal mask while torch.compile traces (with torch < 2.14, whose dynamo
    answers torch.compiler.is_exporting() with True: simulated here); without an attention_mask the patched
    layers still call SDPA with is_causal=True and no mask (the flash kernel), and with padding they pass the
    mask; the loss is eager's either way."""
    import transformers.masking_utils as masking_utils

    monkeypatch.setattr(masking_utils, "is_torchdynamo_exporting", lambda: True)
    ref, patched = pair()
    ids, labels = batch(3)
    mask = None
    if padded:
        mask = torch.ones(B, S, dtype=torch.long)
        mask[1, :4] = 0
    patched.train()
    calls, loss = _sdpa_calls(patched, ids, labels, mask)
    assert len(calls) == len(patched.model.layers)
    assert all(c == ((True, False) if padded else (False, True)) for c in calls), calls
    close(loss, ref(ids, attention_mask=mask, labels=labels, use_cache=False).loss, "loss")


def test_gradient_checkpointing():
    ref, patched = pair()
    ids, labels = batch(2)
    for m in (ref, patched):
        m.train()
        if hasattr(m, "activation_checkpointing_enable"):   # transformers 5 (the older name warns)
            m.activation_checkpointing_enable({"use_reentrant": False})
        else:
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ref(ids, labels=labels).loss.backward()
    patched(ids, labels=labels).loss.backward()
    assert all(layer.gradient_checkpointing for layer in patched.model.layers)
    check_grads(patched, ref)


def test_layers_sum_no_gradient_of_the_residual_stream():
    """Through the patched layers the residual stream has one consumer per layer: autograd sums none of
    its gradients (the QKV dX GEMM adds the residual's), and the input's gradient is the original
    layers'."""
    ref, patched = pair()
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(B, S, 128, generator=gen)
    dy = torch.randn(B, S, 128, generator=gen)
    pos = torch.arange(S)[None]
    grads = []
    for model in (ref, patched):
        xx = h = x.clone().requires_grad_()
        emb = model.model.rotary_emb(h, pos)
        for layer in model.model.layers:
            h = layer(h, position_ids=pos, position_embeddings=emb)
        assert (summed_gradients(h.grad_fn) == []) == (model is patched)   # transformers' layers sum x's
        h.backward(dy)
        grads.append(xx.grad)
    close(grads[1], grads[0], "gradient of the layers' input")


def test_num_items_in_batch_as_transformers():
    ref, patched = pair()
    ids, labels = batch(3)
    for m in (ref, patched):
        m.train()
    n = torch.tensor(50)
    close(patched(ids, labels=labels, num_items_in_batch=n).loss, ref(ids, labels=labels, num_items_in_batch=n).loss,
          "loss with num_items_in_batch")


def test_eval_logits_and_greedy_generation():
    ref, patched = pair()
    ids, labels = batch(4)
    ref.eval()
    patched.eval()
    with torch.no_grad():
        want, got = ref(ids, labels=labels), patched(ids, labels=labels)
        close(got.logits, want.logits, "logits")
        close(got.loss, want.loss, "eval loss")
        a = ref.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False,
                         pad_token_id=0)
        b = patched.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False,
                             pad_token_id=0)
    assert torch.equal(a, b)


def test_save_pretrained_loads_in_plain_transformers(tmp_path):
    ref, patched = pair()
    patched.save_pretrained(tmp_path)
    plain = transformers.LlamaForCausalLM.from_pretrained(tmp_path)
    want = ref.state_dict()
    for k, v in plain.state_dict().items():
        assert torch.equal(v, want[k]), k


def test_tied_embeddings_and_llama3_rope():
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64, "rope_theta": 500000.0}
    try:
        ref, patched = pair(tie_word_embeddings=True, rope_parameters=rope)
    except TypeError:
        ref, patched = pair(tie_word_embeddings=True, rope_scaling=rope, rope_theta=500000.0)
    assert ref.model.rotary_emb.rope_type == "llama3"
    assert patched.lm_head.weight is patched.model.embed_tokens.weight
    ids, labels = batch(5)
    for m in (ref, patched):
        m.train()
    want, got = ref(ids, labels=labels, use_cache=False), patched(ids, labels=labels, use_cache=False)
    close(got.loss, want.loss, "loss")
    want.loss.backward()
    got.loss.backward()
    check_grads(patched, ref)


def test_apply_twice_is_harmless():
    _, patched = pair()
    layers = list(patched.model.layers)
    apply_coda_to_llama(patched, impl="reference")
    assert list(patched.model.layers) == layers


def test_refusals():
    ref, patched = pair()
    with pytest.raises(TypeError, match="LlamaForCausalLM"):
        apply_coda_to_llama(ref.model)
    with pytest.raises(ValueError, match="impl"):
        apply_coda_to_llama(ref, impl="cuda")
    ids, _ = batch()
    with pytest.raises(NotImplementedError, match="output_hidden_states"):
        patched(ids, output_hidden_states=True)
    dropout = hf_model(attention_dropout=0.1)
    with pytest.raises(ValueError, match="attention_dropout"):
        apply_coda_to_llama(dropout)


def test_patch_warns_nothing_deprecated():
    """Regression (the patch's layer takes the cache as transformers 5 passes it, `past_key_values`):
    applying the patch, a training step and cached decoding emit no FutureWarning or
    DeprecationWarning, and the cached step gives the full forward's last logits."""
    ref = hf_model()
    ids, labels = batch(6)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        patched = apply_coda_to_llama(copy.deepcopy(ref), impl="reference")
        patched.train()
        loss = patched(ids, labels=labels, use_cache=False).loss
        loss.backward()
        patched.eval()
        with torch.no_grad():
            full = patched(ids).logits
            prefix = patched(ids[:, :-1], use_cache=True)
            step = patched(ids[:, -1:], past_key_values=prefix.past_key_values, use_cache=True).logits
    ref.train()
    close(loss, ref(ids, labels=labels, use_cache=False).loss, "loss")
    close(step[:, -1], full[:, -1], "cached last-token logits")


def test_training_forward_builds_no_kv_cache_unless_asked(monkeypatch):
    """A training forward (train mode, gradients on, use_cache not given) builds no KV cache: transformers'
    model builds one from config.use_cache, and every layer copied its keys and values into it (3 ms a step,
    and the copies held to the step's end, at Llama-3.2-1B-like sizes). use_cache=True still gets one, and
    eval mode keeps transformers' default; the loss is the same."""
    from transformers import cache_utils

    ref, patched = pair()
    ids, labels = batch(7)
    updates = []
    real = cache_utils.DynamicCache.update
    monkeypatch.setattr(cache_utils.DynamicCache, "update",
                        lambda self, *a, **k: updates.append(1) or real(self, *a, **k))
    patched.train()
    out = patched(ids, labels=labels)
    assert out.past_key_values is None and updates == []
    close(out.loss, ref(ids, labels=labels, use_cache=False).loss, "loss")
    asked = patched(ids, labels=labels, use_cache=True)
    assert asked.past_key_values is not None and len(updates) == patched.config.num_hidden_layers
    patched.eval()
    with torch.no_grad():
        assert patched(ids).past_key_values is not None


def test_final_norm_saves_its_input_and_statistic_only():
    """The patched final norm: transformers' output exactly, gradients within fp32 round-off of its eager
    norm's, and for the backward it keeps x and the fp32 statistic (plus the weight), where transformers'
    norm kept an fp32 copy of x and the normalized x as well (6 · M · d bytes: 0.40 GB at 16384 tokens,
    d = 4096, alive at the step's memory peak)."""
    import types

    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    from coda_ext.hf import llama as hf_llama

    gen = torch.Generator().manual_seed(11)
    M, d = 2 * 8, 64
    ref = LlamaRMSNorm(d, eps=1e-5).to(torch.bfloat16)
    with torch.no_grad():
        ref.weight.copy_(1 + 0.2 * torch.randn(d, generator=gen))
    lean = copy.deepcopy(ref)
    lean.forward = types.MethodType(hf_llama._final_norm_forward, lean)
    x = torch.randn(2, 8, d, generator=gen).to(torch.bfloat16)
    g = torch.randn(2, 8, d, generator=gen).to(torch.bfloat16)

    def run(norm):
        xx = x.clone().requires_grad_()
        saved = {}

        def pack(t):
            saved[(t.data_ptr(), t.dtype, tuple(t.shape))] = t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = norm(xx)
        y.backward(g)
        return y, xx.grad, norm.weight.grad, sum(saved.values())

    y_ref, dx_ref, dw_ref, bytes_ref = run(ref)
    y, dx, dw, nbytes = run(lean)
    assert torch.equal(y, y_ref)
    # fp64 gradients of the same forward (the normalized x rounded to bf16 as both forwards round it)
    x64, g64, w64 = x.double(), g.double(), ref.weight.detach().double()
    rstd = torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-5)
    xhat = x64 * rstd
    dw64 = (g64 * xhat.to(torch.bfloat16).double()).reshape(-1, d).sum(0)
    gn = g64 * w64
    dx64 = rstd * (gn - xhat * (gn * xhat).mean(-1, keepdim=True))
    for got, want, name in ((dx, dx64, "dx"), (dw, dw64, "dweight")):
        err = (got.double() - want).abs().max().item()
        assert err <= 2 ** -6 * want.abs().max().item(), (name, err)   # bf16 results of bf16 products
    for got, eager, want in ((dx, dx_ref, dx64), (dw, dw_ref, dw64)):   # no worse than transformers' eager norm
        assert (got.double() - want).abs().max() <= 1.05 * (eager.double() - want).abs().max() + 1e-6
    assert nbytes == M * d * 2 + M * 4 + d * 2
    assert bytes_ref == M * d * 6 + M * 4 + d * 2
    patched = apply_coda_to_llama(hf_model(), impl="reference")
    assert patched.model.norm.forward.__func__ is hf_llama._final_norm_forward


def test_final_norm_generated_kernels_match_its_math():
    """On a GPU the final norm runs as kernels torch.compile generates (one graph for every row count); here the
    same functions through Inductor's CPU backend: within bf16 round-off of the eager math, forward and
    backward (the eager math launched about ten passes with fp32 temporaries of M · d · 4 bytes)."""
    from torch._dynamo.utils import counters

    from coda_ext.hf import llama as hf_llama

    assert hf_llama._norm_fused.__wrapped__ is hf_llama._norm_math
    assert hf_llama._norm_backward_fused.__wrapped__ is hf_llama._norm_backward_math
    gen = torch.Generator().manual_seed(12)
    d = 96
    w = (1 + 0.2 * torch.randn(d, generator=gen)).to(torch.bfloat16)
    torch._dynamo.reset()
    counters.clear()
    for m in (5, 33, 130):
        x = torch.randn(m, d, generator=gen).to(torch.bfloat16)
        g = torch.randn(m, d, generator=gen).to(torch.bfloat16)
        y, rstd = hf_llama._norm_fused(x, w, 1e-5)
        y_ref, rstd_ref = hf_llama._norm_math(x, w, 1e-5)
        torch.testing.assert_close(rstd, rstd_ref, rtol=1e-5, atol=0)
        torch.testing.assert_close(y.float(), y_ref.float(), rtol=2 ** -7, atol=2 ** -7 * y_ref.abs().max().item())
        dx, dw = hf_llama._norm_backward_fused(g, x, w, rstd_ref)
        dx_ref, dw_ref = hf_llama._norm_backward_math(g, x, w, rstd_ref)
        assert dx.dtype == torch.bfloat16 and dw.dtype == torch.float32 and dx.shape == (m, d) and dw.shape == (d,)
        torch.testing.assert_close(dx.float(), dx_ref.float(), rtol=2 ** -7, atol=2 ** -7 * dx_ref.abs().max().item())
        # Inductor may skip the bf16 rounding of the normalized x that eager applies before the product
        torch.testing.assert_close(dw, dw_ref, rtol=2 ** -7, atol=2 ** -7 * dw_ref.abs().max().item())
    assert counters["stats"]["unique_graphs"] == 2, dict(counters["stats"])


def test_training_forward_reads_no_value_for_its_mask():
    """A plain causal training forward (no attention_mask, no cached tokens) builds no mask and reads nothing
    on the host for it: transformers' mask code checked position_ids for packed sequences with a host read (a
    sync at the start of every step on a GPU); the patched forward hands it an unread 4-D mask instead. The
    loss is unchanged."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Reads(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.reads = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.reads += func.overloadpacket in (torch.ops.aten._local_scalar_dense, torch.ops.aten.item,
                                                  torch.ops.aten.is_nonzero)
            return func(*args, **(kwargs or {}))

    ref, patched = pair()
    ids, labels = batch()
    with Reads() as r:
        hf = ref(ids, labels=labels, use_cache=False)
    assert r.reads >= 1   # transformers' own check (if this fails, transformers dropped it: drop the workaround)
    with Reads() as r:
        out = patched(ids, labels=labels)
    assert r.reads == 0
    torch.testing.assert_close(out.loss, hf.loss, rtol=1e-4, atol=1e-4)


def test_packed_sequences_keep_to_their_own_tokens():
    """position_ids that restart within a row (several sequences packed in it): transformers builds their block
    causal mask, and the patched model's loss and gradients follow it (regression: with no attention_mask the
    patched forward called every training forward plain causal, and tokens attended across the packed sequences)."""
    ref, patched = pair()
    ids, labels = batch()
    half = S // 2
    packed = torch.cat([torch.arange(half), torch.arange(S - half)]).expand(B, S)
    plain = ref(ids, labels=labels, use_cache=False).loss
    hf = ref(ids, labels=labels, position_ids=packed, use_cache=False).loss
    out = patched(ids, labels=labels, position_ids=packed).loss
    assert abs(hf.item() - plain.item()) > 1e-4   # packing changes the loss here
    torch.testing.assert_close(out, hf, rtol=1e-4, atol=1e-4)
    hf.backward()
    out.backward()
    for name, g in grads_by_hf_name(patched).items():
        want = dict(ref.named_parameters())[name].grad
        torch.testing.assert_close(g, want, rtol=1e-3, atol=1e-4 * want.abs().max().item(), msg=name)
