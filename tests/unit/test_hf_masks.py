"""coda_ext.fusion.hf_masks: a compiled Hugging Face model traces with no attention mask where it needs none
(SDPA keeps its flash kernel), and keeps a padding mask that is given and the packed sequences that position ids
given say."""
from __future__ import annotations

import sys

import pytest
import torch

from coda_ext.fusion import hf_masks

pytest.importorskip("transformers")


def _sdpa_masks(model, monkeypatch, masks, exporting_bug: bool, **inputs) -> list:
    """The attn_mask of every SDPA call in the graph torch.compile traces of model(**inputs)."""
    import transformers.masking_utils as mu

    if exporting_bug:   # torch < 2.14 answers torch.compiler.is_exporting() with True under torch.compile
        monkeypatch.setattr(mu, "is_torchdynamo_exporting", lambda: True, raising=False)
    seen = []

    def backend(gm, example_inputs):
        seen.extend(n.kwargs.get("attn_mask", n.args[3] if len(n.args) > 3 else None) for n in gm.graph.nodes
                    if n.op == "call_function" and "scaled_dot_product_attention" in str(n.target))
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    if masks:
        compiled = hf_masks.with_plain_masks(compiled)
    compiled(**inputs)
    return seen


def _bert():
    from transformers import BertConfig, BertModel

    cfg = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=16, attn_implementation="sdpa")
    torch.manual_seed(0)
    return BertModel(cfg).eval()


@pytest.mark.parametrize("exporting_bug", [False, True])
def test_no_mask_without_padding(monkeypatch, exporting_bug):
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    got = _sdpa_masks(_bert(), monkeypatch, True, exporting_bug, input_ids=ids)
    assert got and all(m is None for m in got), got


def test_a_padding_mask_is_kept(monkeypatch):
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 5:] = 0
    got = _sdpa_masks(_bert(), monkeypatch, True, False, input_ids=ids, attention_mask=mask)
    assert got and all(m is not None for m in got)


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=32,
                      use_cache=False, bos_token_id=0, eos_token_id=0, attn_implementation="sdpa")
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).train()


@pytest.mark.parametrize("exporting_bug", [False, True])
def test_a_causal_lm_in_training_traces_causal_without_a_mask(monkeypatch, exporting_bug):
    # no KV cache and no position ids: transformers' packed-sequence check cannot read traced positions and,
    # unpatched, builds a full mask (SDPA masked, not causal, K and V repeated per query head)
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    got = _sdpa_masks(_llama(), monkeypatch, True, exporting_bug, input_ids=ids, labels=ids)
    assert got and all(m is None for m in got), got
    assert _sdpa_masks(_llama(), monkeypatch, False, exporting_bug, input_ids=ids, labels=ids)[0] is not None


def test_packed_position_ids_keep_their_mask(monkeypatch):
    # two sequences of 6 tokens in each row: each attends only within itself, as eager computes it
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(6).repeat(2).expand(2, 12)
    got = _sdpa_masks(_llama(), monkeypatch, True, False, input_ids=ids, position_ids=positions)
    assert got and all(m is not None for m in got)
    model = _llama().eval()
    compiled = hf_masks.with_plain_masks(torch.compile(model, backend="eager"))
    torch.testing.assert_close(compiled(input_ids=ids, position_ids=positions).logits,
                               model(input_ids=ids, position_ids=positions).logits)


def test_unpacked_call():
    assert hf_masks.unpacked_call((), {})
    assert hf_masks.unpacked_call((torch.zeros(1),), {"position_ids": None})
    assert not hf_masks.unpacked_call((), {"position_ids": torch.zeros(1)})
    assert not hf_masks.unpacked_call((torch.zeros(1), None, torch.zeros(1)), {})


def test_the_patch_is_undone_after_each_call(monkeypatch):
    import transformers.masking_utils as mu

    before = {name: getattr(mu, name, None) for name in ("is_tracing", "is_torchdynamo_exporting",
                                                        "find_packed_sequence_indices")}
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    compiled = hf_masks.with_plain_masks(torch.compile(_bert(), backend="eager"))
    out = compiled(input_ids=ids).last_hidden_state
    assert {name: getattr(mu, name, None) for name in before} == before
    torch.testing.assert_close(out, _bert()(input_ids=ids).last_hidden_state)


def test_without_transformers_imported_it_is_a_no_op(monkeypatch):
    monkeypatch.delitem(sys.modules, "transformers.masking_utils", raising=False)
    with hf_masks.plain_masks():
        pass
