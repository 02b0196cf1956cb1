"""A transformers Llama patched with apply_coda_to_llama under torch.compile(model, fullgraph=True),
forward + backward on the CPU: one graph, no graph break, no recompile for new batches of the same
shape, one recompile for a new sequence length and none after it -- for the fp32 references and for
the fused impl (its kernels stood in for by the graph interpreter: tests/helpers/kernel_standin.py,
so the custom ops, their fake implementations and checks are what Dynamo traces, as on a GPU).

Why one recompile: the first graph is compiled for the shapes it saw (static); a second sequence
length fails a shape guard, and Dynamo's automatic dynamic shapes recompile once with the sizes that
changed symbolic (the batch × sequence rows of every op: the fake implementations and their checks
take symbolic sizes). Every later length runs that graph. The backend is aot_eager (AOTAutograd's
joint forward/backward graph without inductor codegen: graph breaks and recompiles are Dynamo's,
whatever the backend).
"""
from __future__ import annotations

import copy

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters

transformers = pytest.importorskip("transformers")

from coda_ext.hf import apply_coda_to_llama  # noqa: E402  (after the importorskip)

B, V = 2, 256


def patched_model(impl: str, dtype: torch.dtype):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
                                   head_dim=64, num_hidden_layers=2, vocab_size=V, max_position_embeddings=256)
    model = transformers.LlamaForCausalLM(cfg).to(dtype)
    model.config._attn_implementation = "sdpa"
    return apply_coda_to_llama(model, impl=impl).train()


def batch(seq: int, seed: int):
    ids = torch.randint(0, V, (B, seq), generator=torch.Generator().manual_seed(seed))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


def step(model, inputs):
    """Loss and every parameter's gradient of one forward + backward (gradients cleared)."""
    model.zero_grad(set_to_none=True)
    loss = model(**inputs).loss
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.fixture
def dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def counted_step(model, inputs, launches):
    """step(), and the kernels it launched ({label: launches}; None without the stand-in)."""
    if launches is None:
        return step(model, inputs), None
    launches.clear()
    result = step(model, inputs)
    return result, dict(launches.labels)


def check_compiled(impl: str, dtype: torch.dtype, rtol: float, launches=None):
    """launches: the kernel stand-in's record (the compiled step launches what the eager step does)."""
    eager = patched_model(impl, dtype)
    model = copy.deepcopy(eager)
    backend = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    graphs = []
    for seq, seed in [(16, 1), (16, 2), (24, 3), (32, 4)]:
        inputs = batch(seq, seed)
        (got, ran), (want, wanted) = counted_step(compiled, inputs, launches), counted_step(eager, inputs, launches)
        assert ran == wanted and (launches is None or ran)
        torch.testing.assert_close(got[0], want[0], rtol=rtol, atol=0)
        for g, w in zip(got[1], want[1]):
            torch.testing.assert_close(g, w, rtol=rtol, atol=rtol * w.abs().max().item())
        graphs.append(backend.frame_count)
    assert graphs == [1, 1, 2, 2]     # a new batch of the same shape: no recompile; a new length: one, once
    assert dict(counters["graph_break"]) == {}


def test_reference_impl_compiles_to_one_graph(dynamo):
    check_compiled("reference", torch.float32, 1e-5)


def test_fused_impl_compiles_to_one_graph(dynamo, kernel_standin):
    check_compiled("fused", torch.bfloat16, 1e-2, kernel_standin)
