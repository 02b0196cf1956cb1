"""The backend on the benchmark's models (benchmarks/bench_autofusion.py's tiny configs, random weights,
fp32 on CPU, every fused kernel run by the reference interpreter): GPT-2 (causal LM: Conv1D linears,
GELU-tanh, layer norm, tied LM head), ViT (patch-embedding convolution, GELU, layer norm, a
classification loss) and a Llama-like model (RMSNorm, SiLU·up, RoPE). Loss and every gradient equal
eager's within fp32 rounding, no graph break (fullgraph=True), and the report says what was fused and
what was left out. The tiny models' weights are as large as their activations, so the cost model never
folds a layer norm into its GEMMs there; FOLD (weights free) makes it fold every one it can."""
from __future__ import annotations

import copy

import pytest
import torch
from torch._dynamo.utils import counters

import coda_ext.fusion as cf
from coda_ext.fusion.cost import CostModel

pytest.importorskip("transformers")

from benchmarks.bench_autofusion import MODELS, build_model, make_batch

pytestmark = pytest.mark.usefixtures("fresh_dynamo")

FOLD = CostModel(fold_weight_passes=0.0)


def step(model, batch):
    """Loss and every parameter's gradient (by name) of one forward + backward."""
    model.zero_grad(set_to_none=True)
    out = model(**batch)
    loss = out if isinstance(out, torch.Tensor) else out.loss
    loss.backward()
    return loss.detach(), {n.removeprefix("_orig_mod."): p.grad.detach().clone()
                           for n, p in model.named_parameters() if p.grad is not None}


def fused_and_eager(name: str, **options):
    """The report of the tiny model's graph through the backend, once its loss and every gradient are
    checked against eager PyTorch's."""
    spec = MODELS[name]
    torch.manual_seed(0)
    model = build_model(spec, tiny=True)
    eager = copy.deepcopy(model)
    batch = make_batch(spec, model, spec.tiny_batch, torch.Generator().manual_seed(3), torch.float32)
    backend = cf.CodaBackend(fallback="eager", **options)
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


def folded_gemms(graph) -> list:
    """Forward kernels that finish a folded layer norm: μ ⊗ s subtracted, scaled by rstd (μ and rstd
    loaded per row, s and W β per column)."""
    return [k for k in graph.kernels if k.kernel and not k.backward and "aten.sub.Tensor" in " ".join(k.members)
            and sum("(col)" in x for x in k.loads) >= 2 and sum("(row)" in x for x in k.loads) >= 2
            and not any("(tile)" in x for x in k.loads)]


def norm_statistics(graph) -> list:
    """Forward kernels that reduce Σx and Σx·x of their output (a layer norm's statistics, one pass)."""
    return [k for k in graph.kernels if k.kernel and not k.backward and len(k.reductions) >= 2
            and "aten.mul.Tensor" in " ".join(k.members) and "aten.logsumexp.default" not in " ".join(k.members)]


def norm_backward(graph) -> list:
    """dX kernels that take a layer norm's backward (two row and two column sums) and recompute its
    normalised input there (x − μ: a folded layer norm's output, stored for the weight gradients)."""
    return [k for k in graph.kernels if k.kernel and k.backward and len(k.reductions) == 4
            and "aten.sub.Tensor" in " ".join(k.members)]


def test_gpt2_matches_eager_with_its_conv1d_linears_and_tied_head():
    graph = fused_and_eager("gpt2", cost=FOLD)
    fused = [k for k in graph.kernels if k.kernel]
    # Conv1D is addmm(bias, x, W) with W stored (in, out): the forward GEMMs read W N-major
    assert {k.major for k in fused if not k.backward} >= {"kn", "kk"}
    # GELU-tanh, written out by GPT-2: one gelu and one gelu_backward in epilogues (passes.gelu_tanh_form)
    text = members(graph)
    assert "aten.gelu.default" in text and "aten.gelu_backward.default" in text and "aten.tanh.default" not in text
    head = [k for k in fused if "aten.logsumexp.default" in " ".join(k.members)]
    assert len(head) == 1 and len(head[0].reductions) == 2          # the tied LM head: log-sum-exp, target logit
    ln_backward = [k for k in fused if k.backward and len(k.reductions) == 4]
    assert len(ln_backward) >= 4                                    # layer norm backward in dX epilogues
    assert "aten.embedding.default" in left_targets(graph)
    # every layer norm (two a layer, and the final one before the tied head) folded into its GEMM
    assert len(graph.folded) == 5 and len(folded_gemms(graph)) == 5
    assert len(norm_statistics(graph)) == 4                         # the residual GEMMs reduce Σx, Σx²
    # the first layer norm reads the embeddings' sum (no GEMM's epilogue): it keeps two-pass statistics,
    # and its backward loads the saved x − μ
    assert len(norm_backward(graph)) == 4


def test_vit_matches_eager_and_leaves_the_patch_convolution():
    graph = fused_and_eager("vit-b16", cost=FOLD)
    assert "aten.gelu.default" in members(graph)
    assert {"aten.convolution.default", "aten.convolution_backward.default"} <= left_targets(graph)
    fused = [k for k in graph.kernels if k.kernel]
    assert any(k.backward and len(k.reductions) == 4 for k in fused)   # layer norm backward
    # the classifier reads the CLS token (a slice): its loss reductions join the head GEMM
    assert any("aten.logsumexp.default" in " ".join(k.members) for k in fused)
    # the layer norms before attention (q, k, v: three GEMMs) and before the MLP are folded; the final
    # one, read through the CLS slice, is not
    assert len(graph.folded) == 4 and len(folded_gemms(graph)) == 8
    assert len(norm_backward(graph)) == 3               # the first reads the patch embeddings (two-pass)


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
    # SwiGLU: the up GEMM's epilogue multiplies by silu(gate), its gate loaded from the gate GEMM's output (the
    # backward recomputes silu and its derivative from it: coda_ext/fusion/passes/remat.py): one pair a layer
    assert len(graph.pairs) == 2 and all("interleaved" in x for x in graph.pairs)
    assert "not fused across GEMMs" in str(graph)


def test_bert_two_layers_has_at_most_three_kernels_per_gemm_shape():
    """Issue 25's goal: distinct kernels <= 3x distinct GEMM shapes (identical layers share kernels),
    with every layer norm folded."""
    graph = fused_and_eager("bert-base", cost=FOLD)
    assert graph.gemm_shapes and graph.fused_gemms >= 20
    assert graph.distinct_kernels <= 3 * len(graph.gemm_shapes)
    assert f"of {len(graph.gemm_shapes)} shapes" in str(graph)


def test_bert_layer_norms_fold_and_their_residual_add_recomputes_them():
    """BERT normalises after the residual add, and the normalised value is the next residual: the
    embeddings', each layer's two and the MLM head's layer norms fold into the GEMMs that read them
    (q, k, v; the FFN's first; the decoder), the residual add in the next output GEMM's epilogue
    recomputes the normalised value from x, μ, rstd, γ and β as it loads them (no y in the forward),
    and the dX epilogue that takes each layer norm's backward stores y for the weight gradients."""
    graph = fused_and_eager("bert-base", cost=FOLD)
    assert len(graph.folded) == 6 and len(folded_gemms(graph)) == 10
    recompute = [k for k in norm_statistics(graph) if "aten.sub.Tensor" in " ".join(k.members)
                 and sum("(col)" in x for x in k.loads) == 2 and sum("(tile)" in x for x in k.loads) == 1]
    assert len(recompute) == 4                      # attention output and FFN output GEMMs of both layers
    assert len(norm_backward(graph)) >= 5


def test_plan_reports_what_the_first_step_fuses_without_running_anything(monkeypatch):
    """coda_ext.fusion.plan traces the training graph under the GPU kernel's rules and stops before
    anything compiles or runs: its report is the first step's of fuse() (GPT-2: its tied LM head too; traced as
    fuse() traces it, inside hf_masks' plain masks)."""
    import coda_ext.fusion.op as fop
    from coda_ext.fusion.hf_masks import with_plain_masks

    spec = MODELS["gpt2"]
    torch.manual_seed(0)
    model = build_model(spec, tiny=True).to(torch.bfloat16)
    batch = make_batch(spec, model, spec.tiny_batch, torch.Generator().manual_seed(3), torch.bfloat16)
    backend = cf.CodaBackend(target="cuda", execute="interpret", fallback="eager", prebuild=False)
    step(with_plain_masks(torch.compile(copy.deepcopy(model), backend=backend, dynamic=False)), batch)
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


#: Batches the bf16 loss is compared over (one compiled graph): a mean over a few thousand logits, the
#: loss of one tiny batch is off by chance as often as not (eager's own error ranges over 10x, batch to
#: batch), so the rule takes the mean error over several; each gradient is a tensor: one batch's.
LOSS_BATCHES = 6


@pytest.mark.parametrize("name", ["gpt2", "bert-base", "vit-b16", "llama-1b"])
def test_bf16_loss_and_gradients_are_within_the_numerics_rule(name):
    """bf16 through the backend, every layer norm folded, against an fp64 reference: the loss's mean
    error over LOSS_BATCHES batches and each gradient's error at most 2x eager bf16's plus the rule's
    floor (tests/helpers/checks.py)."""
    from tests.helpers.checks import floor, max_err, within_rule

    spec = MODELS[name]
    torch.manual_seed(0)
    model = build_model(spec, tiny=True).to(torch.bfloat16)
    eager, ref = copy.deepcopy(model), copy.deepcopy(model).double()
    backend = cf.CodaBackend(fallback="eager", cost=FOLD)
    fused = torch.compile(model, backend=backend, fullgraph=True, dynamic=False)
    errs, errs_eager, tops = [], [], []
    for k in range(LOSS_BATCHES):
        batch = make_batch(spec, model, spec.tiny_batch, torch.Generator().manual_seed(3 + k), torch.bfloat16)
        (loss, grads), (loss_e, grads_e), (loss_r, grads_r) = (step(m, batch) for m in (fused, eager, ref))
        errs.append(max_err(loss, loss_r))
        errs_eager.append(max_err(loss_e, loss_r))
        tops.append(loss_r.abs().item())
        if k == 0:
            for n in grads_r:
                err, err_eager, top = max_err(grads[n], grads_r[n]), max_err(grads_e[n], grads_r[n]), \
                    grads_r[n].abs().max().item()
                assert within_rule(err, err_eager, top), f"{n}: {err:.3e} > 2 x {err_eager:.3e} + {floor(top):.1e}"
    err, err_eager = sum(errs) / len(errs), sum(errs_eager) / len(errs_eager)
    assert within_rule(err, err_eager, max(tops)), f"loss: {err:.3e} > 2 x {err_eager:.3e} + {floor(max(tops)):.1e}"
    # (ViT's first call sets its config's problem_type: the second compiles again, the same graph)
    assert all((len(graph.folded) > 0) == (name != "llama-1b") for graph in backend.report.graphs)
