"""The coda fusion backend on an SM90 GPU: a small MLP, a 2-layer BERT and a 2-layer Llama-like model (its q, k
and v projections merged: passes.hmerge) through coda_ext.fuse (Inductor the fallback), one bf16 training step:
the loss and every gradient within the numerics rule against fp64 (eager bf16 the baseline), no graph break, and
the fused epilogues launched as compiled kernels (not the interpreter)."""
from __future__ import annotations

import copy
import os

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import coda_ext.fusion as cf
from tests.helpers.checks import floor, max_err, within_rule
from tests.unit.test_fusion_backend import step

BF = torch.bfloat16


class MLP(nn.Module):
    def __init__(self, d: int = 64, hidden: int = 256, vocab: int = 128):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, hidden), nn.Linear(hidden, d)
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        y = self.ln(self.fc2(F.gelu(self.fc1(x))) + x)
        return F.cross_entropy(self.head(y).flatten(0, 1), target.flatten())


def _bert():
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=256, max_position_embeddings=128, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0)
    return BertForMaskedLM(cfg)


def _llama():
    """A 2-layer Llama-like model whose q, k and v projections the compiler merges (passes.hmerge)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128, use_cache=False)
    return LlamaForCausalLM(cfg)


def _model(name: str) -> nn.Module:
    torch.manual_seed(0)
    if name in ("bert", "llama"):
        pytest.importorskip("transformers")
        return _bert() if name == "bert" else _llama()
    return MLP()


def _inputs(name: str, device) -> dict:
    g = torch.Generator().manual_seed(1)
    if name == "bert":
        ids = torch.randint(0, 128, (4, 64), generator=g)
        labels = torch.where(torch.rand(4, 64, generator=g) < 0.3, ids, -100)
        return {"input_ids": ids.to(device), "labels": labels.to(device)}
    if name == "llama":
        ids = torch.randint(0, 128, (4, 64), generator=g)
        return {"input_ids": ids.to(device), "labels": ids.to(device)}
    # x in the model's dtype (regression: a float32 x met bfloat16 weights in the first GEMM)
    return {"x": torch.randn(4, 64, 64, generator=g).to(device, BF), "target": torch.randint(0, 128, (4, 64),
                                                                                         generator=g).to(device)}


MODELS = ("mlp", "bert", "llama")


def build_items() -> list:
    """(graph, dtype, config) of the kernels the two models' fused steps launch (planned on the CPU)."""
    items = []
    for name in MODELS:
        if name in ("bert", "llama"):
            try:
                import transformers  # noqa: F401
            except ImportError:
                continue
        model = _model(name).to(BF)
        items += cf.kernel_items(cf.plan(model, kwargs=_inputs(name, "cpu")), sms=132)
    return items


@pytest.fixture(scope="module")
def built():
    from coda_ext.runtime import prebuild

    prebuild(build_items(), jobs=os.cpu_count(), binding=True)


def _step(model, inputs):
    loss, grads = step(model, **inputs)
    return [loss, *grads]


def _within_rule(name, got, base, want) -> float:
    """Asserts each output within the rule against fp64 (eager bf16 the baseline); the worst error ÷ eager's."""
    worst = 0.0
    for i, (g, b, w) in enumerate(zip(got, base, want, strict=True)):
        err, err_eager, top = max_err(g, w), max_err(b, w), w.abs().max().item()
        assert within_rule(err, err_eager, top), \
            f"{name} output {i}: max error {err:.3e} > 2 x {err_eager:.3e} + {floor(top):.1e}"
        worst = max(worst, err / max(err_eager, 1e-30))
    return worst


def _double(inputs: dict) -> dict:
    return {k: v.double() if v.is_floating_point() else v for k, v in inputs.items()}


@pytest.mark.parametrize("name", MODELS)
def test_fused_training_step_within_the_rule(built, name, monkeypatch, report):
    from torch._dynamo.utils import counters

    import coda_ext.fusion.op as fo

    launches = []
    real = fo.launch
    monkeypatch.setattr(fo, "launch", lambda *a: launches.append(1) or real(*a))
    torch._dynamo.reset()
    counters.clear()
    model = _model(name).to("cuda", BF).train()
    eager, ref = copy.deepcopy(model), copy.deepcopy(model).double()
    fused = cf.fuse(model, measure=False)   # every epilogue the partition chose runs (the vetoes: below)
    inputs = _inputs(name, "cuda")
    got = _step(fused, inputs)
    base = _step(eager, inputs)
    want = _step(ref, _double(inputs))
    assert launches, "no fused kernel was launched"
    assert sum(counters["graph_break"].values()) == 0
    if name == "llama":   # q, k and v merged in each layer (forward, dX and weight-gradient GEMMs)
        assert all(len(g.merged) == 2 for g in cf.report_of(fused).graphs)
    worst = _within_rule(name, got, base, want)
    report(f"{name}: {len(launches)} fused launches, {len(got)} values, worst error ÷ eager bf16's {worst:.2f}")


@pytest.mark.parametrize("name", MODELS)
def test_cuda_graphs_replay_the_fused_step_within_the_rule(built, name, monkeypatch, report):
    """fuse(model, cudagraphs=True): Inductor's CUDA-graph trees record the fused step, kernels included, and
    replay it. Three steps on new inputs of the same shapes: the third replays without launching from Python
    and its loss and gradients are within the rule against fp64 (eager bf16 the baseline)."""
    import coda_ext.fusion.op as fo

    launches = []
    real = fo.launch
    monkeypatch.setattr(fo, "launch", lambda *a: launches.append(1) or real(*a))
    torch._dynamo.reset()
    model = _model(name).to("cuda", BF).train()
    eager, ref = copy.deepcopy(model), copy.deepcopy(model).double()
    fused = cf.fuse(model, cudagraphs=True, measure=False)
    for k in range(3):
        inputs = _inputs(name, "cuda")
        for v in inputs.values():
            if v.is_floating_point():
                v.mul_(1.0 + 0.1 * k)   # new values each step, the same shapes
        before = len(launches)
        got = _step(fused, inputs)
    assert launches and len(launches) == before, "the last step launched fused kernels from Python: not replayed"
    base = _step(eager, inputs)
    _within_rule(name, got, base, _step(ref, _double(inputs)))
    report(f"{name}: CUDA graphs, {len(launches)} fused launches while recording, none in the replayed step")


def test_the_veto_timer_times_kernels_of_each_input_kind():
    """fusion.timing.gpu_timer (the measured vetoes) on kernels whose inputs are a row vector (bias + GELU), bf16
    and uint8 tiles read transposed (the split weight gradient, mn), a tile, a store and a row reduction (the README
    example, kn): positive times, cached, and a shape whose tensors would not fit refused before any allocation."""
    from coda_ext import graphs
    from coda_ext.fusion import timing
    from coda_ext.fusion.op import Site
    from coda_ext.runtime import prebuild
    from coda_ext.runtime.tuned import auto_items

    cases = [(graphs.bias_gelu(), "kk", (1000, 512, 256)),
             (graphs.weight_grad_split(True, False), "mn", (336, 272, 72)),
             (graphs.example(), "kn", (777, 264, 136))]
    prebuild(auto_items(cases, "bfloat16"), jobs=os.cpu_count())
    for graph, major, mnk in cases:
        site = Site(graph.build(), "bfloat16", major, (), ())
        fused, gemm = timing.gpu_timer(site, mnk)
        assert 0 < fused < 1e-2 and 0 < gemm < 1e-2, (major, fused, gemm)
        assert timing.gpu_timer(site, mnk) == (fused, gemm)
    with pytest.raises(MemoryError, match="more than 50% of the"):
        timing.gpu_timer(Site(graphs.bias_gelu().build(), "bfloat16", "kk", (), ()), (1 << 22, 1 << 17, 4096))


@pytest.mark.parametrize("size", ["tiny", "4096_rows"])
def test_measured_vetoes_time_every_fused_kernel_and_the_step_stays_within_the_rule(built, size, report):
    """fuse(model) with its default measure="auto" on the GPU: every fused GEMM of the final partition was timed,
    none of them slower than its line unless the rounds ran out, every veto says what it did, and the step's loss
    and gradients stay within the rule whatever was vetoed. At the tests' tiny shapes every fused kernel loses to
    torch.mm and its fallback (the kernels' fixed cost); at 4096 rows of d 1024 (the benchmark MLP's width) some are
    kept, so the kept kernels' timing is checked too."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = (MLP() if size == "tiny" else MLP(1024, 4096, 1024)).to("cuda", BF).train()
    eager, ref = copy.deepcopy(model), copy.deepcopy(model).double()
    fused = cf.fuse(model)
    if size == "tiny":
        inputs = _inputs("mlp", "cuda")
    else:
        g = torch.Generator().manual_seed(1)
        inputs = {"x": torch.randn(8, 512, 1024, generator=g).to("cuda", BF),
                  "target": torch.randint(0, 1024, (8, 512), generator=g).to("cuda")}
    got = _step(fused, inputs)
    base = _step(eager, inputs)
    _within_rule("mlp", got, base, _step(ref, _double(inputs)))
    (rep,) = cf.report_of(fused).graphs
    kept = {k.anchor for k in rep.kernels if k.kernel}
    assert {v.anchor for v in rep.measured} == kept
    assert all(v.fused_s > 0 and v.gemm_s > 0 for v in rep.measured)
    assert not any(v.slow for v in rep.measured) or "partitions ran out" in str(rep)
    assert all(v.action for v in rep.vetoed)
    if size != "tiny":
        assert kept, "no fused kernel kept at 4096 rows: " + "; ".join(str(v) for v in rep.vetoed)
    report(f"mlp {size}: {len(kept)} fused GEMMs timed, {len(rep.vetoed)} vetoes: "
           + "; ".join(str(v) for v in rep.vetoed))
