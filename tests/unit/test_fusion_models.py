"""The backend on the benchmark's models (benchmarks/bench_autofusion.py's tiny configs, random weights,
fp32 on CPU, every fused kernel run by the reference interpreter): GPT-2 (causal LM: Conv1D linears,
GELU-tanh, layer norm, tied LM head), ViT (patch-embedding convolution, GELU, layer norm, a
classification loss) and a Llama-like model (RMSNorm, SiLU·up, RoPE). Loss and every gradient equal
eager's within fp32 rounding, no graph break (fullgraph=True), and the report says what was fused and
what was left out."""
from __future__ import annotations

import copy

import pytest
import torch
from torch._dynamo.utils import counters

import coda_ext.fusion as cf

pytest.importorskip("transformers")

from benchmarks.bench_autofusion import MODELS, build_model, make_batch

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def step(model, batch):
    """Loss and every parameter's gradient (by name) of one forward + backward."""
    model.zero_grad(set_to_none=True)
    out = model(**batch)
    loss = out if isinstance(out, torch.Tensor) else out.loss
    loss.backward()
    return loss.detach(), {n.removeprefix("_orig_mod."): p.grad.detach().clone()
                           for n, p in model.named_parameters() if p.grad is not None}


def fused_and_eager(name: str):
    """(loss, grads, report) of the tiny model through the backend, and (loss, grads) of eager PyTorch."""
    spec = MODELS[name]
    torch.manual_seed(0)
    model = build_model(spec, tiny=True)
    eager = copy.deepcopy(model)
    batch = make_batch(spec, model, spec.tiny_batch, torch.Generator().manual_seed(3), torch.float32)
    backend = cf.CodaBackend(fallback="eager")
    fused = torch.compile(model, backend=backend, fullgraph=True, dynamic=False)
    loss, grads = step(fused, batch)
    loss_e, grads_e = step(eager, batch)
    assert sum(counters["graph_break"].values()) == 0
    torch.testing.assert_close(loss, loss_e, rtol=1e-6, atol=1e-6)
    assert grads.keys() == grads_e.keys() and len(grads) == len(list(eager.parameters()))
    for n, g in grads.items():
        torch.testing.assert_close(g, grads_e[n], rtol=1e-5, atol=1e-6, msg=lambda m, n=n: f"{n}: {m}")
    (graph,) = backend.report.graphs
    return graph


def members(graph) -> str:
    return " ".join(m for k in graph.kernels if k.kernel for m in k.members)


def left_targets(graph) -> set[str]:
    return {x.target for x in graph.left_out}


def test_gpt2_matches_eager_with_its_conv1d_linears_and_tied_head():
    graph = fused_and_eager("gpt2")
    fused = [k for k in graph.kernels if k.kernel]
    # Conv1D is addmm(bias, x, W) with W stored (in, out): the forward GEMMs read W N-major
    assert {k.major for k in fused if not k.backward} >= {"kn", "kk"}
    assert "aten.tanh.default" in members(graph)                    # GELU-tanh, written out by GPT-2
    head = [k for k in fused if "aten.logsumexp.default" in " ".join(k.members)]
    assert len(head) == 1 and len(head[0].reductions) == 2          # the tied LM head: log-sum-exp, target logit
    ln_backward = [k for k in fused if k.backward and len(k.reductions) == 4]
    assert len(ln_backward) >= 4                                    # layer norm backward in dX epilogues
    assert "aten.embedding.default" in left_targets(graph)


def test_vit_matches_eager_and_leaves_the_patch_convolution():
    graph = fused_and_eager("vit-b16")
    assert "aten.gelu.default" in members(graph)
    assert {"aten.convolution.default", "aten.convolution_backward.default"} <= left_targets(graph)
    fused = [k for k in graph.kernels if k.kernel]
    assert any(k.backward and len(k.reductions) == 4 for k in fused)   # layer norm backward
    # the classifier reads the CLS token (a slice): its loss reductions join the head GEMM
    assert any("aten.logsumexp.default" in " ".join(k.members) for k in fused)


def test_llama_matches_eager_rms_norm_and_silu_fuse_rope_does_not():
    graph = fused_and_eager("llama-1b")
    fused = [k for k in graph.kernels if k.kernel]
    text = members(graph)
    assert "aten.silu.default" in text and "aten.sigmoid.default" in text   # SiLU and its derivative
    # RMSNorm's statistic: the residual GEMM's epilogue squares and sums its rows
    assert any(not k.backward and "aten.pow.Tensor_Scalar" in " ".join(k.members) and k.reductions for k in fused)
    left = left_targets(graph)
    assert {"aten.cat.default", "aten.neg.default"} <= left                 # RoPE's rotate_half
    assert any("scaled_dot_product" in t for t in left)
    # SwiGLU: the up GEMM's epilogue multiplies by silu(gate), loaded from the gate GEMM's: one pair a layer
    assert len(graph.pairs) == 2 and all("silu" in x and "interleaved" in x for x in graph.pairs)
    assert "not fused across GEMMs" in str(graph)


def test_bert_two_layers_has_at_most_three_kernels_per_gemm_shape():
    """Issue 25's goal: distinct kernels <= 3x distinct GEMM shapes (identical layers share kernels)."""
    graph = fused_and_eager("bert-base")
    assert graph.gemm_shapes and graph.fused_gemms >= 20
    assert graph.distinct_kernels <= 3 * len(graph.gemm_shapes)
    assert f"of {len(graph.gemm_shapes)} shapes" in str(graph)


def test_plan_reports_what_the_first_step_fuses_without_running_anything(monkeypatch):
    """coda_ext.fusion.plan traces the training graph under the GPU kernel's rules and stops before
    anything compiles or runs: its report is the first step's (GPT-2: its tied LM head too)."""
    import coda_ext.fusion.op as fop

    spec = MODELS["gpt2"]
    torch.manual_seed(0)
    model = build_model(spec, tiny=True).to(torch.bfloat16)
    batch = make_batch(spec, model, spec.tiny_batch, torch.Generator().manual_seed(3), torch.bfloat16)
    backend = cf.CodaBackend(target="cuda", execute="interpret", fallback="eager", prebuild=False)
    step(torch.compile(copy.deepcopy(model), backend=backend, dynamic=False), batch)
    torch._dynamo.reset()

    def never(site, tensors):
        raise AssertionError("plan ran a kernel")

    monkeypatch.setattr(fop, "run_site", never)
    planned = cf.plan(model, kwargs=batch)
    assert all(p.grad is None for p in model.parameters())          # nothing ran
    (got,), (want,) = planned.report.graphs, backend.report.graphs
    assert str(got).splitlines()[1:] == str(want).splitlines()[1:]   # the same epilogues (timing line aside)
    assert cf.kernel_items(planned) == cf.kernel_items(backend) and cf.kernel_items(planned)
    tied = [k for k in got.kernels if k.kernel and k.major == "mn" and "embedding_dense_backward" in " ".join(k.loads)]
    assert tied                            # the tied head's weight gradient adds the embedding's


@pytest.mark.parametrize("name", ["gpt2", "llama-1b"])
def test_bf16_loss_and_gradients_are_within_the_numerics_rule(name):
    """bf16 through the backend against an fp64 reference: each gradient's error at most 2x eager bf16's
    plus the rule's floor (tests/helpers/checks.py)."""
    from tests.helpers.checks import floor, max_err, within_rule

    spec = MODELS[name]
    torch.manual_seed(0)
    model = build_model(spec, tiny=True).to(torch.bfloat16)
    eager, ref = copy.deepcopy(model), copy.deepcopy(model).double()
    batch = make_batch(spec, model, spec.tiny_batch, torch.Generator().manual_seed(3), torch.bfloat16)
    fused = torch.compile(model, backend=cf.CodaBackend(fallback="eager"), fullgraph=True, dynamic=False)
    loss, grads = step(fused, batch)
    loss_e, grads_e = step(eager, batch)
    loss_r, grads_r = step(ref, batch)
    for n in ["loss", *grads_r]:
        got, base, want = (loss, loss_e, loss_r) if n == "loss" else (grads[n], grads_e[n], grads_r[n])
        err, err_eager, top = max_err(got, want), max_err(base, want), want.abs().max().item()
        assert within_rule(err, err_eager, top), f"{n}: {err:.3e} > 2 x {err_eager:.3e} + {floor(top):.1e}"
