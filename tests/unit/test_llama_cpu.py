"""coda_ext.models on the CPU, impl="reference" (the same autograd Functions, each op's fp32
reference): against a plain PyTorch Llama written here with Hugging Face's conventions
(rotate-half RoPE, separate q/k/v and gate/up weights), in fp32. Outputs, the loss and the gradient
of every parameter and of the input match; state_dict() and load_state_dict() speak Hugging Face's
names and layouts; checkpointing, torch.compile (aot_eager) and 300 optimizer steps work;
the training demo's CPU smoke run passes.
"""
from __future__ import annotations

import collections
import copy
import io

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

from coda_ext import ops
from coda_ext.models import (
    CodaLlamaDecoderLayer,
    CodaLlamaForCausalLM,
    EagerLlamaForCausalLM,
    LlamaConfig,
    shift_labels,
)
from coda_ext.models.llama import attention
from tests.helpers.autograd_graph import summed_gradients

CFG = LlamaConfig(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                  num_hidden_layers=2, vocab_size=256, rms_norm_eps=1e-5, rope_theta=10000.0)
B, S = 2, 24
# fp32 against fp32: the two compute the same math in a different order (fused weights, the norm's
# γ and rstd on either side of a GEMM, the ZdZ form of the norm backward), so they agree to a few
# fp32 roundings of the largest value involved.
RTOL, ATOL_SCALE = 2e-5, 2e-6


# --- the reference: a plain PyTorch Llama, Hugging Face conventions and names -----------------------------


class RefNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def ref_rope(t, pos, theta):
    """Rotate-half RoPE of t (B, S, heads, hd), angles in fp64."""
    hd = t.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = pos.double()[..., None] * inv
    cos, sin = (torch.cat([f(ang), f(ang)], -1).float()[..., None, :] for f in (torch.cos, torch.sin))
    a, b = t.chunk(2, dim=-1)
    return t * cos + torch.cat([-b, a], dim=-1) * sin


class RefAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)

    def forward(self, h, pos, mask=None):
        c = self.c
        q, k, v = (p(h).unflatten(-1, (-1, c.head_dim)) for p in (self.q_proj, self.k_proj, self.v_proj))
        q, k = ref_rope(q, pos, c.rope_theta), ref_rope(k, pos, c.rope_theta)
        rep = c.num_attention_heads // c.num_key_value_heads
        k, v = k.repeat_interleave(rep, 2), v.repeat_interleave(rep, 2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        scores = q @ k.transpose(-1, -2) / c.head_dim ** 0.5
        if mask is None:
            mask = torch.ones(S, S, dtype=torch.bool).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
        return self.o_proj((scores.softmax(-1) @ v).transpose(1, 2).flatten(-2))


class RefMLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, h):
        return self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class RefLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self_attn = RefAttention(c)
        self.mlp = RefMLP(c)
        self.input_layernorm = RefNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RefNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x, pos, mask=None):
        x = x + self.self_attn(self.input_layernorm(x), pos, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class RefLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.model.layers = nn.ModuleList(RefLayer(c) for _ in range(c.num_hidden_layers))
        self.model.norm = RefNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)

    def forward(self, ids, labels=None, pos=None):
        x = self.model.embed_tokens(ids)
        pos = torch.arange(ids.shape[1]).expand(ids.shape) if pos is None else pos
        for layer in self.model.layers:
            x = layer(x, pos)
        logits = self.lm_head(self.model.norm(x))
        if labels is None:
            return logits
        target = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], 1)
        return F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=-100)


def randomize(module, seed=0):
    """Random weights everywhere, norms included (ones would hide a γ mistake)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen) if p.dim() == 1 else
                    torch.randn(p.shape, generator=gen) * p.shape[-1] ** -0.5)
    return module


def hf_grads(model) -> dict:
    """The coda model's gradients under Hugging Face's names and layouts (each conversion is a
    permutation of rows, so gradients convert as the weights do)."""
    c, out = model.config if hasattr(model, "config") else CFG, {}
    for name, p in model.named_parameters():
        g = p.grad
        if name.endswith("qkv_weight"):
            q, k, v = g.split([c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim,
                               c.num_key_value_heads * c.head_dim])
            base = name[: -len("qkv_weight")]
            out[base + "q_proj.weight"] = ops.pairs_to_rotate_half(q, c.head_dim)
            out[base + "k_proj.weight"] = ops.pairs_to_rotate_half(k, c.head_dim)
            out[base + "v_proj.weight"] = v
        elif name.endswith("gate_up_weight"):
            base = name[: -len("gate_up_weight")]
            out[base + "gate_proj.weight"], out[base + "up_proj.weight"] = ops.split_gate_up(g)
        else:
            out[name] = g
    return out


def assert_close(got, want, what):
    torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL_SCALE * (1 + want.abs().max().item()), msg=what)


def assert_grads_match(coda, ref):
    got, want = hf_grads(coda), {n: p.grad for n, p in ref.named_parameters()}
    assert set(got) == set(want)
    for name in want:
        assert_close(got[name], want[name], f"gradient of {name}")


@pytest.fixture(scope="module")
def ref_model():
    torch.manual_seed(0)
    return randomize(RefLM(CFG))


def coda_from(ref, cls=CodaLlamaForCausalLM):
    model = cls(CFG, impl="reference")
    model.load_state_dict(ref.state_dict())
    return model


def tokens(seed=1):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, CFG.vocab_size, (B, S), generator=gen)
    labels = ids.clone()
    labels[0, 5:9] = -100
    return ids, labels


# --- one layer ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("positions", ["default", "offset"])
def test_layer_output_and_every_gradient(positions):
    ref = randomize(RefLayer(CFG), seed=3)
    layer = CodaLlamaDecoderLayer(CFG, impl="reference")
    layer.load_state_dict(ref.state_dict())
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(B, S, CFG.hidden_size, generator=gen)
    pos = torch.arange(S).expand(B, S) if positions == "default" else \
        torch.arange(S) + torch.tensor([[7], [3000]])
    dy = torch.randn(B, S, CFG.hidden_size, generator=gen)
    xr, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    want = ref(xr, pos)
    got = layer(xc, None if positions == "default" else pos)
    assert_close(got, want, "layer output")
    want.backward(dy)
    got.backward(dy)
    assert_close(xc.grad, xr.grad, "input gradient")
    for name, g in hf_grads(layer).items():
        assert_close(g, dict(ref.named_parameters())[name].grad, f"gradient of {name}")


def test_layer_backward_overwrites_its_saved_z_only_when_the_graph_is_freed(monkeypatch):
    """MLPBlock's backward writes dz over its saved gate/up pre-activation z (the layer's memory peak: no second
    M × 2F tensor) when the graph is freed after it; run twice through a retained graph, it keeps z, so both runs
    give the same gradients."""
    from coda_ext.models import functions

    seen = []
    real = functions._saved_used_once
    monkeypatch.setattr(functions, "_saved_used_once", lambda t: seen.append(real(t)) or seen[-1])
    layer = CodaLlamaDecoderLayer(CFG, impl="reference")
    randomize(layer, seed=5)
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(B, S, CFG.hidden_size, generator=gen, requires_grad=True)
    dy = torch.randn(B, S, CFG.hidden_size, generator=gen)
    out = layer(x)
    first = torch.autograd.grad(out, [x, *layer.parameters()], dy, retain_graph=True)
    second = torch.autograd.grad(out, [x, *layer.parameters()], dy)
    assert seen == [False, True]
    for a, b in zip(first, second):
        assert torch.equal(a, b)


def test_layer_attention_mask_replaces_causal():
    ref = randomize(RefLayer(CFG), seed=5)
    layer = CodaLlamaDecoderLayer(CFG, impl="reference")
    layer.load_state_dict(ref.state_dict())
    x = torch.randn(B, S, CFG.hidden_size)
    mask = torch.ones(S, S, dtype=torch.bool).tril()
    mask[:, :3] = False
    mask[:3, :3] = torch.eye(3, dtype=torch.bool)   # every row keeps at least one key
    pos = torch.arange(S).expand(B, S)
    assert_close(layer(x, pos, attention_mask=mask), ref(x, pos, mask), "layer output with a mask")


def old_data_flow(layer, x, pos):
    """The layer as it ran before QKVRoPE handed x on: x fed to both Functions, so autograd sums x's two
    gradients in a pass of its own."""
    q, k, v, _ = layer.project_qkv(x, pos, "reference")
    return layer.output_and_mlp(attention(q, k, v), x, "reference")


def test_residual_gradient_is_added_in_the_qkv_dx_gemm():
    """The layer's gradients (input and every parameter) equal the old data flow's, where autograd
    summed the two gradients of x; the new backward graph sums none (the QKV dX GEMM adds MLPBlock's dx
    in its epilogue), the old one summed x's."""
    gen = torch.Generator().manual_seed(6)
    layer = randomize(CodaLlamaDecoderLayer(CFG, impl="reference"), seed=6)
    x = torch.randn(B, S, CFG.hidden_size, generator=gen)
    dy = torch.randn(B, S, CFG.hidden_size, generator=gen)
    pos = torch.arange(S).expand(B, S)
    runs = {}
    for flow, run in (("new", lambda x: layer(x, pos)), ("old", lambda x: old_data_flow(layer, x, pos))):
        layer.zero_grad()
        xx = x.clone().requires_grad_()
        out = run(xx)
        sums = summed_gradients(out.grad_fn)
        out.backward(dy)
        runs[flow] = (out, sums, [xx.grad] + [p.grad for p in layer.parameters()])
    (new, new_sums, new_grads), (old, old_sums, old_grads) = runs["new"], runs["old"]
    assert new_sums == [] and old_sums == ["torch::autograd::AccumulateGrad[0]"]   # x's two gradients
    assert torch.equal(new, old)
    names = ["x"] + [n for n, _ in layer.named_parameters()]
    for name, g, want in zip(names, new_grads, old_grads, strict=True):
        assert_close(g, want, f"gradient of {name}")


def test_qkv_rope_hands_x_on_whichever_output_reaches_the_loss():
    """QKVRoPE returns q, k, v and x as it took it; x's gradient is the QKV path's plus the handed-on x's,
    and any of the outputs alone reaching the loss works (the others' gradients are None, not zeros: the
    RoPE backward takes a missing head gradient as zeros)."""
    gen = torch.Generator().manual_seed(10)
    layer = randomize(CodaLlamaDecoderLayer(CFG, impl="reference"), seed=10)
    x = torch.randn(B, S, CFG.hidden_size, generator=gen)
    dq = torch.randn(B, S, CFG.qkv_size, generator=gen)
    dr = torch.randn(B, S, CFG.hidden_size, generator=gen)
    pos = torch.arange(S).expand(B, S)

    def grad_of_x(heads: tuple[bool, bool, bool], use_x: bool) -> torch.Tensor:
        xx = x.clone().requires_grad_()
        q, k, v, out = layer.project_qkv(xx, pos, "reference")
        assert torch.equal(out, x)
        parts = dq.split([t.shape[-2] * t.shape[-1] for t in (q, k, v)], dim=-1)
        terms = [(t.flatten(-2) * d).sum() for t, d, used in zip((q, k, v), parts, heads) if used]
        terms += [(out * dr).sum()] if use_x else []
        sum(terms).backward()
        return xx.grad

    only_qkv, both = grad_of_x((True, True, True), False), grad_of_x((True, True, True), True)
    assert torch.equal(grad_of_x((False, False, False), True), dr)
    assert only_qkv.abs().max() > 0.1
    assert_close(both, only_qkv + dr, "gradient of x through both outputs")
    each = [grad_of_x(tuple(i == j for j in range(3)), False) for i in range(3)]
    assert min(float(g.abs().max()) for g in each) > 0.01
    assert_close(sum(each), only_qkv, "gradients of x through q, k and v alone, summed")


# --- the model ---------------------------------------------------------------------------------------------


def test_model_sums_no_gradient_of_the_residual_stream(ref_model):
    """Across layers too: each layer's output has one consumer (the next layer's QKVRoPE), so nothing in
    the residual stream's backward graph receives two gradients."""
    x = coda_from(ref_model).model.residual_stream(tokens()[0])
    assert summed_gradients(x.grad_fn) == []
    seen, todo = set(), [x.grad_fn]
    while todo:
        fn = todo.pop()
        if fn not in seen:
            seen.add(fn)
            todo += [f for f, _ in fn.next_functions if f is not None]
    names = collections.Counter(fn.name() for fn in seen)   # the graph walked is every layer's
    assert names["QKVRoPEBackward"] == names["MLPBlockBackward"] == CFG.num_hidden_layers


def test_loss_and_every_gradient(ref_model):
    ref, coda = ref_model, coda_from(ref_model)
    ids, labels = tokens()
    ref.zero_grad()
    want = ref(ids, labels)
    got = coda(ids, labels=labels)
    assert got.logits is None
    assert_close(got.loss, want, "loss")
    want.backward()
    got.loss.backward()
    assert_grads_match(coda, ref)


def test_logits_without_labels(ref_model):
    ids, _ = tokens(2)
    out = coda_from(ref_model)(ids)
    assert out.loss is None
    assert_close(out.logits, ref_model(ids), "logits")


def test_positions_are_used(ref_model):
    ids, labels = tokens(3)
    pos = torch.arange(S).expand(B, S) + 100
    assert_close(coda_from(ref_model)(ids, labels=labels, positions=pos).loss, ref_model(ids, labels, pos), "loss")


def test_shift_labels():
    labels = torch.tensor([[1, 2, 3], [4, -100, 6]])
    assert torch.equal(shift_labels(labels), torch.tensor([[2, 3, -100], [-100, 6, -100]]))


def test_eager_baseline_matches_reference(ref_model):
    """The package's eager Llama (the demo's baseline) is the same model (its RoPE angles in fp32)."""
    eager = EagerLlamaForCausalLM(CFG)
    eager.load_state_dict(ref_model.state_dict())
    ids, labels = tokens(4)
    torch.testing.assert_close(eager(ids, labels=labels).loss, ref_model(ids, labels), rtol=1e-5, atol=1e-5)


# --- weights: Hugging Face names and layouts at the boundary, fused layouts inside --------------------------


def test_state_dict_speaks_hf(ref_model):
    coda = coda_from(ref_model)
    sd, want = coda.state_dict(), ref_model.state_dict()
    assert list(sd) == list(want)   # names and order
    for k in want:
        assert torch.equal(sd[k], want[k]), k


def test_stored_layouts(ref_model):
    coda, sd = coda_from(ref_model), ref_model.state_dict()
    hd = CFG.head_dim
    attn, mlp = coda.model.layers[1].self_attn, coda.model.layers[1].mlp
    want_qkv = torch.cat([ops.rotate_half_to_pairs(sd["model.layers.1.self_attn.q_proj.weight"], hd),
                          ops.rotate_half_to_pairs(sd["model.layers.1.self_attn.k_proj.weight"], hd),
                          sd["model.layers.1.self_attn.v_proj.weight"]])
    assert torch.equal(attn.qkv_weight, want_qkv)
    assert torch.equal(mlp.gate_up_weight[0::2], sd["model.layers.1.mlp.gate_proj.weight"])
    assert torch.equal(mlp.gate_up_weight[1::2], sd["model.layers.1.mlp.up_proj.weight"])


def test_state_dict_round_trip_through_a_file(ref_model):
    coda = coda_from(ref_model)
    buf = io.BytesIO()
    torch.save(coda.state_dict(), buf)
    buf.seek(0)
    again = CodaLlamaForCausalLM(CFG, impl="reference")
    again.load_state_dict(torch.load(buf))
    for (n, a), (_, b) in zip(coda.named_parameters(), again.named_parameters()):
        assert torch.equal(a, b), n
    assert list(again.state_dict(keep_vars=True)) == list(ref_model.state_dict())


def test_deepcopy_keeps_the_conversions(ref_model):
    again = copy.deepcopy(coda_from(ref_model))
    sd = again.state_dict()
    assert list(sd) == list(ref_model.state_dict())
    again.load_state_dict(sd)


def test_load_reports_an_incomplete_projection(ref_model):
    sd = dict(ref_model.state_dict())
    del sd["model.layers.0.self_attn.k_proj.weight"]
    with pytest.raises(RuntimeError, match="k_proj"):
        CodaLlamaForCausalLM(CFG, impl="reference").load_state_dict(sd)


def test_load_reports_a_shape_mismatch(ref_model):
    sd = dict(ref_model.state_dict())
    sd["model.layers.0.mlp.up_proj.weight"] = torch.zeros(8, CFG.hidden_size)
    with pytest.raises(RuntimeError, match="size mismatch"):
        CodaLlamaForCausalLM(CFG, impl="reference").load_state_dict(sd)


def test_tied_embeddings_load_without_lm_head():
    import dataclasses

    cfg = dataclasses.replace(CFG, tie_word_embeddings=True)
    model = CodaLlamaForCausalLM(cfg, impl="reference")
    assert model.lm_head.weight is model.model.embed_tokens.weight
    sd = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    fresh = CodaLlamaForCausalLM(cfg, impl="reference")
    fresh.load_state_dict(sd)
    assert torch.equal(fresh.lm_head.weight, model.model.embed_tokens.weight)


def test_dtype_cast_keeps_the_rope_table_fp32():
    layer = CodaLlamaDecoderLayer(CFG, impl="reference")
    table = layer.rope_freqs.clone()
    layer.to(torch.bfloat16)
    assert layer.rope_freqs.dtype == torch.float32 and torch.equal(layer.rope_freqs, table)
    assert layer.self_attn.qkv_weight.dtype == torch.bfloat16


# --- impl choice and errors --------------------------------------------------------------------------------


def test_fused_impl_on_cpu_says_what_to_do():
    layer = CodaLlamaDecoderLayer(CFG, impl="fused")
    with pytest.raises(ValueError, match="impl='reference'"):
        layer(torch.randn(1, 4, CFG.hidden_size))


def test_unknown_impl():
    with pytest.raises(ValueError, match="impl must be one of"):
        CodaLlamaDecoderLayer(CFG, impl="triton")


def test_fused_problems_name_the_shape():
    import dataclasses

    assert CFG.fused_problems() == []
    bad = dataclasses.replace(CFG, head_dim=32, vocab_size=250)
    problems = " ".join(bad.fused_problems())
    assert "head_dim 32" in problems and "vocab_size 250" in problems


# --- training ----------------------------------------------------------------------------------------------


def test_gradient_checkpointing_gives_the_same_gradients(ref_model):
    ids, labels = tokens(5)
    plain, ckpt = coda_from(ref_model), coda_from(ref_model)
    ckpt.model.gradient_checkpointing = True
    plain(ids, labels=labels).loss.backward()
    ckpt(ids, labels=labels).loss.backward()
    for (n, a), (_, b) in zip(plain.named_parameters(), ckpt.named_parameters()):
        assert torch.equal(a.grad, b.grad), n


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpointed_layer(reentrant):
    layer = CodaLlamaDecoderLayer(CFG, impl="reference")
    x = torch.randn(B, S, CFG.hidden_size, requires_grad=True)
    layer(x).sum().backward()
    want = [x.grad.clone()] + [p.grad.clone() for p in layer.parameters()]
    x.grad = None
    layer.zero_grad()
    torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=reentrant).sum().backward()
    for a, b in zip([x.grad] + [p.grad for p in layer.parameters()], want):
        assert torch.equal(a, b)


def test_torch_compile_fullgraph():
    """Dynamo traces both autograd Functions without a graph break (aot_eager: no inductor codegen,
    so the test stays fast; inductor compiles the same graph)."""
    layer = CodaLlamaDecoderLayer(CFG, impl="reference")
    x = torch.randn(B, S, CFG.hidden_size, requires_grad=True)
    want = layer(x)
    want.sum().backward()
    gx = x.grad.clone()
    x.grad = None
    got = torch.compile(layer, fullgraph=True, backend="aot_eager")(x)
    got.sum().backward()
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(x.grad, gx, rtol=1e-6, atol=1e-6)


def test_optimizer_steps_track_the_reference():
    """300 AdamW steps on the demo's learnable task: the two loss curves agree step by step (fp32: the
    fused model's autograd wiring on the op references against a plain PyTorch Llama)."""
    from coda_ext.tools.train_demo import make_batches

    ref = randomize(RefLM(CFG), seed=7)
    coda = coda_from(ref)
    opts = [torch.optim.AdamW(m.parameters(), lr=3e-3) for m in (ref, coda)]
    curves = ([], [])
    for ids in make_batches(300, B, S, CFG.vocab_size, seed=8):
        for model, opt, curve in zip((ref, coda), opts, curves):
            out = model(ids, ids)
            loss = out if isinstance(out, torch.Tensor) else out.loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            curve.append(loss.item())
        assert abs(curves[0][-1] - curves[1][-1]) <= 1e-3 * abs(curves[0][-1]), \
            (len(curves[0]), curves[0][-1], curves[1][-1])
    assert curves[1][-1] < curves[1][0] - 1.0, curves[1]   # it learns


def test_demo_smoke(capsys):
    from coda_ext.tools import train_demo

    rc = train_demo.main(["--device", "cpu", "--impl", "reference", "--steps", "5", "--hidden", "128",
                          "--layers", "1", "--seq", "32", "--batch", "2", "--vocab", "64"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "loss curves match" in out and "tokens/s" in out


def test_demo_builds_the_fused_kernels_first(monkeypatch):
    """With the fused impl, the demo hands training_kernels' list to coda_ext.prebuild before the first step
    (regression: it called the prebuild tool's module instead of the function)."""
    from coda_ext import runtime
    from coda_ext.tools import train_demo

    class Built(Exception):
        pass

    def prebuild(items, jobs=None):
        assert items and all(len(item) == 3 for item in items)
        raise Built

    monkeypatch.setattr(runtime, "prebuild", prebuild)
    monkeypatch.setattr(train_demo, "resolve_impl", lambda impl, x: "fused")
    with pytest.raises(Built):
        train_demo.main(["--device", "cpu", "--impl", "reference", "--dtype", "bfloat16", "--steps", "1",
                         "--hidden", "128", "--layers", "1", "--seq", "32", "--batch", "2", "--vocab", "64"])


def test_weight_grad_backend():
    """The fused layers' weight gradients run in cuBLAS (torch.mm over the stored tensors) unless
    weight_grad_backend("coda") asks for the project's kernel: the choice is read at each call, restored after
    the block (also on an error), a bad name is refused, and training_kernels lists the weight-gradient kernels
    ("mn" GEMMs) only where they will run."""
    from unittest import mock

    from coda_ext.models import WEIGHT_GRAD_BACKENDS, functions, training_kernels, weight_grad_backend
    from coda_ext.ops import linear_grad
    from coda_ext.runtime import tuned

    g = torch.Generator().manual_seed(7)
    dz, x = torch.randn(3, 5, 6, generator=g), torch.randn(3, 5, 4, generator=g)
    got = functions.BACKENDS["fused"].weight_grad(dz, x)
    torch.testing.assert_close(got, linear_grad.reference_weight_grad(dz, x), rtol=1e-5, atol=1e-5)
    assert got.shape == (6, 4) and WEIGHT_GRAD_BACKENDS == ("cublas", "coda")
    with mock.patch.object(ops, "weight_grad", return_value="coda kernel"):
        assert functions.BACKENDS["fused"].weight_grad(dz, x) is not None
        with weight_grad_backend("coda"):
            assert functions.BACKENDS["fused"].weight_grad(dz, x) == "coda kernel"
        with pytest.raises(RuntimeError, match="inside"), weight_grad_backend("coda"):
            raise RuntimeError("inside")
        assert torch.is_tensor(functions.BACKENDS["fused"].weight_grad(dz, x))   # cuBLAS again
    with pytest.raises(ValueError, match="must be one of"), weight_grad_backend("cutlass"):
        pass

    majors = []
    with mock.patch.object(tuned, "auto_items", lambda gemms, dtype="bfloat16", sms=None: majors.append(
            [m for _, m, _ in gemms]) or []):
        training_kernels(CFG, 64, lm_head=False)
        with weight_grad_backend("coda"):
            training_kernels(CFG, 64, lm_head=False)
    assert "mn" not in majors[0] and majors[1].count("mn") == 4 and len(majors[1]) == len(majors[0]) + 4
