"""coda_ext.models.torchtitan on a stand-in of torchtitan's Llama 3 (tests/helpers/titan_llama.py),
impl="reference" on the CPU, fp32: the converted model keeps every parameter (names, layouts, values)
and gives the original's logits, loss and gradients, also built on the meta device and initialized
afterwards (torchtitan's order), and under torch.compile per block; what it does not run is refused."""
from __future__ import annotations

import copy
import sys
import types

import pytest
import torch

from coda_ext.models import torchtitan as titan
from tests.helpers import titan_llama

RTOL = 2e-5   # fp32 against fp32, the same math in another order (as tests/unit/test_llama_cpu.py)


def tokens(seed=1, batch=2, seq=17, vocab=256):
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


def close(got, want, what):
    torch.testing.assert_close(got, want, rtol=RTOL, atol=2e-6 * (1 + want.abs().max().item()), msg=what)


def check_same_training_step(converted, ref, ids):
    for m in (converted, ref):
        m.zero_grad(set_to_none=True)
    got, want = titan_llama.loss(converted, ids), titan_llama.loss(ref, ids)
    close(got, want, "loss")
    got.backward()
    want.backward()
    grads = dict(ref.named_parameters())
    for name, p in converted.named_parameters():
        close(p.grad, grads[name.replace("._orig_mod", "")].grad, f"gradient of {name}")   # compiled blocks: _orig_mod


def test_converted_blocks_match_torchtitans_math():
    ref = titan_llama.build()
    model = titan.convert_torchtitan_llama(copy.deepcopy(ref), impl="reference")
    assert list(model.state_dict()) == list(ref.state_dict())   # torchtitan's names, layouts and values
    for k, v in ref.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k
    ids = tokens()
    with torch.no_grad():
        close(model(ids), ref(ids), "logits")
    check_same_training_step(model, ref, ids)


def test_positions_argument_as_torchtitan_passes_it():
    ref = titan_llama.build(seed=3)
    model = titan.convert_torchtitan_llama(copy.deepcopy(ref), impl="reference")
    ids = tokens(4)
    pos = torch.arange(ids.shape[1])[None]   # (1, S), as torchtitan's positions
    with torch.no_grad():
        close(model(ids, positions=pos), ref(ids), "logits with positions")


def test_meta_device_build_then_init_weights():
    """torchtitan builds the model on the meta device, converts it, then fills it (to_empty +
    init_weights): the RoPE tables are read from freqs_cis after init_weights."""
    with torch.device("meta"):
        model = titan_llama.Transformer(titan_llama.Args())
    titan.convert_torchtitan_llama(model, impl="reference")
    assert all(b._coda_rope is None for b in model.layers.values())
    with pytest.raises(RuntimeError, match="init_weights"):
        model.layers["0"](torch.randn(1, 4, 128), model.freqs_cis)
    model.to_empty(device="cpu")
    model.init_weights(buffer_device="cpu", seed=5)
    ref = titan_llama.build(seed=5)
    eager_table = titan.convert_torchtitan_llama(copy.deepcopy(ref), impl="reference").layers["0"]._coda_rope
    assert all(torch.equal(b._coda_rope, eager_table) for b in model.layers.values())
    check_same_training_step(model, ref, tokens(2))


def test_rope_frequencies_read_from_freqs_cis():
    f = titan_llama.freqs_cis(64, 8, 500000.0)
    want = 1.0 / 500000.0 ** (torch.arange(0, 64, 2).float() / 64)
    torch.testing.assert_close(titan.rope_inv_freq(f), want.double(), rtol=2e-7, atol=0)


def test_torch_compile_per_block(fresh_dynamo):
    """torchtitan compiles each block (fullgraph) after the conversion."""
    ref = titan_llama.build(seed=6)
    model = titan.convert_torchtitan_llama(copy.deepcopy(ref), impl="reference")
    for name, block in list(model.layers.items()):
        model.layers[name] = torch.compile(block, fullgraph=True, backend="aot_eager")
    check_same_training_step(model, ref, tokens(6))


def test_refusals_name_the_fix():
    model = titan.convert_torchtitan_llama(titan_llama.build(), impl="reference")
    x = torch.randn(1, 4, 128)
    with pytest.raises(NotImplementedError, match="sdpa"):
        model.layers["0"](x, model.freqs_cis, attention_masks=object())
    with pytest.raises(TypeError, match="Transformer"):
        titan.convert_torchtitan_llama(torch.nn.Linear(2, 2))
    biased = titan_llama.build()
    biased.layers["1"].feed_forward.w2 = torch.nn.Linear(192, 128)
    with pytest.raises(ValueError, match=r"layer 1 has biases in \['feed_forward.w2'\]"):
        titan.convert_torchtitan_llama(biased)
    no_rope = titan_llama.build()
    del no_rope.freqs_cis
    with pytest.raises(TypeError, match="freqs_cis"):
        titan.convert_torchtitan_llama(no_rope)
    assert "_coda_impl" not in vars(no_rope.layers["0"])   # refused before any change
    with pytest.raises(ValueError, match="impl"):
        titan.convert_torchtitan_llama(titan_llama.build(), impl="cuda")
    with pytest.raises(ValueError, match="TP"):
        titan.CodaConverter(None, types.SimpleNamespace(tp_enabled=True, cp_enabled=False))


def test_converter_protocol_and_registration(monkeypatch):
    registry = {}
    fake = types.ModuleType("torchtitan.protocols.model_converter")
    fake.register_model_converter = lambda cls, name: registry.setdefault(name, cls)
    for name in ("torchtitan", "torchtitan.protocols"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "torchtitan.protocols.model_converter", fake)
    titan.register()
    assert registry == {"coda_ext": titan.CodaConverter}
    conv = registry["coda_ext"](None, types.SimpleNamespace(tp_enabled=False, cp_enabled=False))
    model = titan_llama.build()
    conv.convert(model)
    conv.post_optimizer_hook(model)
    assert all(b._coda_impl == "auto" and b._coda_rope is not None for b in model.layers.values())


def test_register_without_torchtitan_says_what_to_do(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchtitan", None)
    with pytest.raises(ImportError, match="convert_torchtitan_llama"):
        titan.register()


def test_torchtitan_llama3_itself_when_installed():
    """torchtitan's own Llama 3 (0.1 or 0.2, the model.converters protocol) where it is installed:
    built on the meta device with Llama 3.1's RoPE scaling, converted, initialized, compiled per block."""
    pytest.importorskip("torchtitan.protocols.model_converter", reason="torchtitan 0.1 or 0.2 is not installed")
    from torchtitan.models.llama3.model.args import TransformerModelArgs
    from torchtitan.models.llama3.model.model import Transformer

    args = TransformerModelArgs(dim=128, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=256, multiple_of=64,
                                rope_theta=500000, max_seq_len=64)
    torch.manual_seed(0)
    ref = Transformer(args)
    with torch.no_grad():
        ref.init_weights()
        for p in ref.parameters():
            if p.dim() == 1:   # norms away from 1
                p.add_(0.2 * torch.randn_like(p))
    with torch.device("meta"):
        model = Transformer(args)
    titan.convert_torchtitan_llama(model, impl="reference")
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights(buffer_device=torch.device("cpu"))
    model.load_state_dict(ref.state_dict())
    for name, block in list(model.layers.named_children()):
        model.layers.register_module(name, torch.compile(block, backend="aot_eager", fullgraph=True))
    check_same_training_step(model, ref, tokens(8))
