"""The whole backend on CPU — torch.compile(model, backend="coda") and fuse(model) — with every fused kernel
run by the reference interpreter: a small MLP (Linear-bias-GELU-Linear + residual + LayerNorm + RMSNorm +
cross-entropy) and a 2-layer BERT (transformers BertForMaskedLM from a tiny config, random weights).
Loss and gradients against eager PyTorch: equal within fp32 rounding in fp32, and within the numerics
rule (tests/helpers/checks.py) against an fp64 reference in bf16. No graph break is added."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._dynamo.utils import counters

import coda_ext.fusion as cf
from tests.helpers.checks import floor, max_err, within_rule

aten = torch.ops.aten


class MLP(nn.Module):
    def __init__(self, d: int = 16, hidden: int = 32, vocab: int = 24):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, hidden), nn.Linear(hidden, d)
        self.ln, self.rms = nn.LayerNorm(d), nn.RMSNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        y = self.ln(self.fc2(F.gelu(self.fc1(x))) + x)
        logits = self.head(self.rms(y))
        return F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=-100)


def mlp_inputs():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 8, 16, generator=g)
    t = torch.randint(0, 24, (2, 8), generator=g)
    t[0, :3] = -100
    return x, t


def step(model, *args, **kwargs):
    """Loss and every parameter's gradient of one forward + backward."""
    for p in model.parameters():
        p.grad = None
    out = model(*args, **kwargs)
    loss = out if isinstance(out, torch.Tensor) else out.loss
    loss.backward()
    return loss.detach(), [p.grad.detach().clone() for p in model.parameters()]


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def fused_mlp_matches_eager(fallback: str, loss_tol: float, grad_rtol: float, grad_atol: float, **options):
    """fuse(MLP(), fallback=..., **options) against eager: the loss and every gradient of one fp32 step; the
    fused model."""
    torch.manual_seed(0)
    model = MLP()
    eager = copy.deepcopy(model)
    fused = cf.fuse(model, fallback=fallback, **options)
    x, t = mlp_inputs()
    loss, grads = step(fused, x, t)
    loss_e, grads_e = step(eager, x, t)
    torch.testing.assert_close(loss, loss_e, rtol=loss_tol, atol=loss_tol)
    for got, want in zip(grads, grads_e, strict=True):
        torch.testing.assert_close(got, want, rtol=grad_rtol, atol=grad_atol)
    return fused


def test_mlp_fp32_matches_eager():
    fused = fused_mlp_matches_eager("eager", 1e-6, 1e-5, 1e-6)
    assert sum(counters["graph_break"].values()) == 0
    report = cf.report_of(fused)
    kernels = [k for k in report.kernels if k.kernel]
    assert len(kernels) >= 4 and report.bytes_kept > 0
    assert {k.backward for k in kernels} == {False, True}            # forward and backward epilogues
    members = " ".join(m for k in kernels for m in k.members)
    assert "aten.gelu.default" in members and "aten.logsumexp.default" in members
    head = next(k for k in kernels if "aten.logsumexp.default" in " ".join(k.members))
    assert len(head.reductions) == 2                # the LM head: logsumexp and the target logit, per row


def test_mlp_bf16_is_within_the_numerics_rule():
    torch.manual_seed(0)
    model = MLP().to(torch.bfloat16)
    eager, ref = copy.deepcopy(model), copy.deepcopy(model).double()
    fused = cf.fuse(model, fallback="eager")
    x, t = mlp_inputs()
    loss, grads = step(fused, x.to(torch.bfloat16), t)
    loss_e, grads_e = step(eager, x.to(torch.bfloat16), t)
    loss_r, grads_r = step(ref, x.double(), t)
    assert cf.report_of(fused).kernels[0].dtype == "bfloat16"
    items = cf.kernel_items(fused)            # what coda_ext.prebuild would build, before a GPU step
    assert {c.major for _, _, c in items} >= {"kk", "kn"} and all(d == "bfloat16" for _, d, _ in items)
    for got, base, want in zip([loss] + grads, [loss_e] + grads_e, [loss_r] + grads_r, strict=True):
        err, err_eager, top = max_err(got, want), max_err(base, want), want.abs().max().item()
        assert within_rule(err, err_eager, top), f"max error {err:.3e} > 2 x {err_eager:.3e} + {floor(top):.1e}"


def test_inference_graphs_are_fused_too():
    torch.manual_seed(0)
    model = MLP().eval()
    fused = cf.fuse(model, fallback="eager")
    x, t = mlp_inputs()
    with torch.no_grad():
        torch.testing.assert_close(fused(x, t), model(x, t), rtol=1e-6, atol=1e-6)
    report = cf.report_of(fused)
    assert report.graphs[0].name.startswith("inference graph") and report.kernels


def test_cpu_inputs_build_no_kernel_whatever_the_target(monkeypatch):
    """Regression: the "cuda" target's partition on CPU tensors (a plan checked on a machine without a GPU)
    prebuilt its kernels with nvcc, though the interpreter runs them there."""
    from coda_ext.fusion.frontend import CodaBackend

    built = []
    monkeypatch.setattr(CodaBackend, "_prebuild", staticmethod(lambda lowered, rep: built.append(lowered)))
    torch.manual_seed(0)
    model = MLP().to(torch.bfloat16)
    x, t = mlp_inputs()
    fused = cf.fuse(model, fallback="eager", target="cuda")
    step(fused, x.to(torch.bfloat16), t)
    assert cf.report_of(fused).kernels and built == []


def _sized_inputs(B: int, T: int):
    g = torch.Generator().manual_seed(100 * B + T)
    x = torch.randn(B, T, 16, generator=g)
    t = torch.randint(0, 24, (B, T), generator=g)
    t[0, :2] = -100
    return x, t


def _matches_eager_at(compiled, eager, shapes) -> None:
    """One fp32 step of each model at each (batch, sequence) shape: equal loss and gradients."""
    for B, T in shapes:
        x, t = _sized_inputs(B, T)
        loss, grads = step(compiled, x, t)
        loss_e, grads_e = step(eager, x, t)
        torch.testing.assert_close(loss, loss_e, rtol=1e-6, atol=1e-6)
        for got, want in zip(grads, grads_e, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fallback", ["eager", "inductor"])
def test_a_dynamic_recompilation_is_fused_at_the_shapes_that_recur(fallback):
    """torch.compile(model, backend=...) without dynamic=False: a call at other sizes makes Dynamo compile the graph
    with symbolic sizes, which ran unfused only. It still compiles that graph unfused (a shape's first call runs
    it), and the second call at a shape fuses the graph at that shape (the fallback compiler given the call's
    tensors) for every later call there; loss and gradients equal to eager's throughout, no graph break."""
    torch.manual_seed(0)
    model = MLP()
    eager = copy.deepcopy(model)
    backend = cf.CodaBackend(fallback=fallback)
    compiled = torch.compile(model, backend=backend)
    counters.clear()
    _matches_eager_at(compiled, eager, ((2, 8), (2, 12), (2, 5), (2, 12), (2, 12), (2, 5)))
    graphs = backend.report.graphs
    # the static graph at (2, 8); the symbolic one unfused; fused at T = 12 (its second call), then T = 5
    assert len(graphs) == 4 and graphs[0].kernels and not graphs[1].kernels
    assert "symbolic shapes" in graphs[1].note and "its second call fuses" in graphs[1].note
    assert all(g.kernels and "fused at one shape (" in g.note for g in graphs[2:])
    assert sum(counters["graph_break"].values()) == 0


def test_past_the_specializations_a_symbolic_graph_runs_unfused(monkeypatch):
    """Beyond MAX_SPECIALIZATIONS fused shapes the others keep running the graph compiled with symbolic sizes
    (unfused), correct."""
    from coda_ext.fusion import frontend

    monkeypatch.setattr(frontend, "MAX_SPECIALIZATIONS", 1)
    torch.manual_seed(0)
    model = MLP()
    eager = copy.deepcopy(model)
    backend = cf.CodaBackend(fallback="eager")
    compiled = torch.compile(model, backend=backend)
    _matches_eager_at(compiled, eager, ((2, 8), (2, 12), (2, 12), (2, 5), (2, 5), (2, 5)))
    graphs = backend.report.graphs
    assert len(graphs) == 3 and graphs[2].kernels and not graphs[1].kernels   # T = 12 fused; T = 5 not


def test_torch_compile_s_mode_reaches_the_backend(monkeypatch):
    """mode="reduce-overhead" (CUDA graphs) is Options(cudagraphs=True) where the fallback is Inductor; where it
    cannot be (an eager fallback) or for another mode, a warning says it is not applied (it was ignored silently)."""
    from coda_ext.fusion import cudagraphs, frontend

    asked = []
    original = cudagraphs.compilers

    def compilers(*args, **kwargs):
        asked.append(True)
        return original(*args, **kwargs)

    monkeypatch.setattr(cudagraphs, "compilers", compilers)
    opts = frontend.Options(fallback="inductor")
    assert frontend._with_mode(opts, "reduce-overhead", "inductor")[0].cudagraphs
    assert frontend._with_mode(opts, None, "inductor") == (opts, None) == frontend._with_mode(opts, "default", "x")
    tuned, why = frontend._with_mode(opts, "max-autotune", "inductor")
    assert not tuned.cudagraphs and "mode='max-autotune' is not applied" in why and "default mode" in why
    assert "the fallback is eager" in frontend._with_mode(frontend.Options(), "reduce-overhead", "eager")[1]
    model = MLP()   # said once a backend, not at each graph it compiles (a dynamic recompilation compiles several)
    compiled = torch.compile(model, backend=cf.CodaBackend(fallback="eager"), mode="max-autotune")
    import warnings

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        for T in (8, 12, 12):
            step(compiled, *_sized_inputs(2, T))
    assert [str(w.message) for w in said if "is not applied" in str(w.message)] == \
        ["coda fusion: torch.compile's mode='max-autotune' is not applied (the fallback is eager)"]
    torch.manual_seed(0)
    model = MLP()
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend=cf.CodaBackend(fallback="inductor"), mode="reduce-overhead")
    x, t = mlp_inputs()
    torch.testing.assert_close(step(compiled, x, t)[0], step(eager, x, t)[0], rtol=1e-6, atol=1e-6)
    assert asked   # the fallback's CUDA-graph compilers (which record CUDA graphs only, and run the rest as before)


def test_the_registered_backend_name_and_options(capsys):
    torch.manual_seed(0)
    model = MLP()
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend="coda", fullgraph=True,
                             options={"method": "greedy", "fallback": "eager", "report": True})
    x, t = mlp_inputs()
    loss, _ = step(compiled, x, t)
    torch.testing.assert_close(loss, step(eager, x, t)[0], rtol=1e-6, atol=1e-6)
    printed = capsys.readouterr().out
    assert "coda fusion: joint graph" in printed and "partition greedy" in printed
    with pytest.raises(ValueError, match="narrow_stores must be True or False"):
        cf.fuse(MLP(), narrow_stores="no")


def bert(hidden_dropout: float = 0.0):
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=16, hidden_dropout_prob=hidden_dropout,
                     attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    return BertForMaskedLM(cfg)


def bert_inputs():
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 64, (2, 8), generator=g)
    labels = ids.clone()
    labels[:, ::3] = -100
    return {"input_ids": ids, "labels": labels}


def test_bert_two_layers_fp32_matches_eager_without_graph_breaks():
    pytest.importorskip("transformers")
    model = bert()
    eager = copy.deepcopy(model)
    fused = torch.compile(model, backend=cf.CodaBackend(fallback="eager"), fullgraph=True)
    loss, grads = step(fused, **bert_inputs())
    loss_e, grads_e = step(eager, **bert_inputs())
    torch.testing.assert_close(loss, loss_e, rtol=1e-6, atol=1e-6)
    for got, want in zip(grads, grads_e, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert sum(counters["graph_break"].values()) == 0


def test_bert_two_layers_report():
    pytest.importorskip("transformers")
    fused = cf.fuse(bert(), fallback="eager")
    step(fused, **bert_inputs())
    report = cf.report_of(fused)
    (graph,) = report.graphs
    fused_kernels = [k for k in graph.kernels if k.kernel]
    # each layer's q/k/v/o, FFN and their backward GEMMs: identical subgraphs share kernels
    assert len(fused_kernels) >= 20 and graph.distinct_kernels <= 0.6 * len(fused_kernels)
    ln_backward = [k for k in fused_kernels if k.backward and len(k.reductions) == 4]
    assert len(ln_backward) >= 3          # LayerNorm backward: two row and two column sums in a dX epilogue
    assert any("aten.gelu.default" in " ".join(k.members) for k in fused_kernels)
    left = {x.target for x in graph.left_out}
    assert "aten.embedding.default" in left and any("scaled_dot_product" in t for t in left)
    text = str(report)
    assert "kept on chip" in text and "left to the fallback" in text and "IO model" in text
    # the IO model names the GPU it priced the kernels for (the CUDA device in use; no GPU: the H100 default)
    assert "IO model (H100 SXM, " in text


def test_the_io_model_prices_a_kernel_for_the_gpu_it_is_given():
    """regression: the report printed 'IO model (H100, ...)' whatever the GPU (the runs on an H200 said H100)."""
    from coda_ext import graphs

    g = graphs.reductions().build()
    h100, h200 = (cf.CostModel(gpu=name).kernel(g, "bfloat16", (16384, 4096, 64)) for name in ("H100 SXM", "H200"))
    assert (h100.gpu, h200.gpu) == ("H100 SXM", "H200")
    assert h200.fused_s < h100.fused_s          # memory-bound (K = 64): the H200's faster HBM takes less time


def test_bert_dropout_is_left_to_the_fallback():
    pytest.importorskip("transformers")
    fused = cf.fuse(bert(hidden_dropout=0.1), fallback="eager")
    loss, grads = step(fused, **bert_inputs())
    assert torch.isfinite(loss) and all(torch.isfinite(g).all() for g in grads)
    left = [x for x in cf.report_of(fused).graphs[0].left_out if x.target == "aten.native_dropout.default"]
    assert len(left) >= 4 and "random" in left[0].reason


def test_the_entry_point_names_the_registered_backend():
    """pyproject's torch_dynamo_backends entry point (backend="coda" without an import) is the function
    importing coda_ext.fusion registers."""
    import importlib
    import pathlib
    import re

    from torch._dynamo.backends.registry import lookup_backend

    text = (pathlib.Path(__file__).parents[2] / "pyproject.toml").read_text()
    section = text.split("[project.entry-points.torch_dynamo_backends]")[1]
    module, name = re.search(r'^coda = "([\w.]+):(\w+)"', section, re.MULTILINE).groups()
    assert getattr(importlib.import_module(module), name) is lookup_backend("coda") is cf.coda_backend


def test_the_inductor_fallback_runs_inductors_joint_graph_passes(monkeypatch):
    """The fallback graphs get the joint-graph passes torch.compile runs in its own partitioner (pad_mm among
    them: without them GPT-2's unaligned head GEMMs ran in align-1 kernels); loss and gradients stay eager's."""
    from coda_ext.fusion import frontend

    seen = []
    real = frontend.inductor_joint_passes

    def spy(gm):
        seen.append(sum(1 for n in gm.graph.nodes if n.op == "call_function"))
        return real(gm)

    monkeypatch.setattr(frontend, "inductor_joint_passes", spy)
    fused_mlp_matches_eager("inductor", 1e-5, 1e-4, 1e-5)
    assert len(seen) == 2 and all(seen)     # the forward graph and the backward graph


def test_cudagraphs_compiles_through_inductors_forward_and_backward_compilers(monkeypatch):
    """Options(cudagraphs=True): the fallback graphs go through Inductor's own forward and backward compilers
    (those of mode="reduce-overhead", which record CUDA graphs on a GPU; on the CPU Inductor records
    nothing), with the fallback's decompositions and joint-graph passes inside; loss and gradients stay
    eager's. fallback="eager" refuses the option before anything is traced."""
    from torch._inductor import compile_fx

    from coda_ext.fusion import cudagraphs, frontend

    calls = []
    for name in ("compile_fx_forward", "compile_fx_backward"):
        real = getattr(compile_fx, name)
        monkeypatch.setattr(compile_fx, name, lambda *a, _real=real, _name=name, **k: calls.append(
            (_name, k["inner_compile"] is frontend._inductor_inner)) or _real(*a, **k))
    passes = []
    real_passes = frontend.inductor_joint_passes
    monkeypatch.setattr(frontend, "inductor_joint_passes", lambda gm: passes.append(1) or real_passes(gm))
    statics = []
    real_inner = frontend._inductor_inner

    def inner(gm, inputs, **kw):   # the backward's static inputs: every input but the tangents (regression:
        names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]   # the retrace had renamed them all)
        if kw.get("is_backward"):
            statics.append(({names[i] for i in kw["static_input_idxs"]}, names))
        return real_inner(gm, inputs, **kw)

    monkeypatch.setattr(frontend, "_inductor_inner", inner)
    fused_mlp_matches_eager("inductor", 1e-5, 1e-4, 1e-5, cudagraphs=True)
    assert calls == [("compile_fx_forward", True), ("compile_fx_backward", True)]
    assert len(passes) == 2
    ((static, names),) = statics
    assert any(n.startswith("tangents") for n in names)
    assert static and not any(n.startswith("tangents") for n in static)
    with pytest.raises(ValueError, match="cudagraphs=True records the Inductor fallback"):
        cf.fuse(MLP(), fallback="eager", cudagraphs=True)
    torch._dynamo.reset()
    assert cf.plan(MLP(), args=mlp_inputs(), cudagraphs=True).report.graphs   # plan() records nothing: no refusal
    assert set(cudagraphs.ENTRY_POINTS) <= set(dir(compile_fx))


def test_the_forward_gemms_stay_in_the_forward(monkeypatch):
    """Regression: the GEMMs the layout pass rebuilt carried no partitioner tag, and AOTAutograd's default partition
    runs every node after the last forward-tagged one in the backward: a model whose forward ends in GEMMs had its
    last layer's GEMM recomputed there (a whole GEMM twice a step). The backward of two linears is their four
    GEMMs (dW and dX each), the forward's two are not repeated."""
    from torch._functorch import partitioners

    parts = {}
    default = partitioners.default_partition

    def spy(joint, inputs, **kw):
        parts["fw"], parts["bw"] = default(joint, inputs, **kw)
        return parts["fw"], parts["bw"]

    monkeypatch.setattr(partitioners, "default_partition", spy)
    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(32, 64, bias=False), nn.Linear(64, 48, bias=False))
    x = torch.randn(8, 32, requires_grad=True)
    want = model(x)
    got = torch.compile(model, backend=cf.CodaBackend(fallback="eager"))(x)
    got.sum().backward()
    torch.testing.assert_close(got, want)

    def mms(gm):
        return sum(n.target is torch.ops.aten.mm.default for n in gm.graph.nodes)

    assert (mms(parts["fw"]), mms(parts["bw"])) == (2, 4)
