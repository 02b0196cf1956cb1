"""coda_ext's Llama under PyTorch's distributed engines on the CPU: two processes (gloo), the fp32
references (impl="reference"), a tiny random transformers LlamaForCausalLM patched with
apply_coda_to_llama, coda_ext's own CodaLlamaForCausalLM, and torchtitan's Llama (a stand-in)
converted by coda_ext.models.torchtitan.

Each engine trains on a global batch of 4 sequences, 2 per process, and is compared with one process
training on all 4 (every sequence has as many targets, so the mean of the two processes' mean
losses, which DDP and FSDP2 differentiate, is the global mean): DDP and FSDP2 (fully_shard per
decoder layer and the root) give the same losses, gradients and, after AdamW steps, the same
weights; so do activation checkpointing under both, FSDP2's mixed precision (bf16 parameters, fp32
gradient reduction) against one process in bf16, and torch.compile per layer (torchtitan's order).
Sharded state dicts keep Hugging Face's names and layouts, stay sharded (DTensors, Shard(0)) and
round-trip through torch.distributed.checkpoint; the full state dict loads into plain transformers
and gives the same loss.

Tolerance (fp32): every token's loss and gradient is the same math in both runs; only the sums over
tokens are grouped differently (two halves then averaged, exactly, by a factor of 2, against one sum),
so results differ by a few fp32 roundings of the largest partial sum: RTOL 2e-5 with an absolute
floor of 2e-6 of the largest value, as the single-process tests of tests/unit/test_llama_cpu.py.
AdamW divides by the square root of the gradients' second moment, which turns roundings of gradients
that are zero in exact arithmetic into noise of the learning rate's size: eps is 1e-6 here (the
gradients are ~1e-3), so that noise stays below the tolerance.

The workers run in one spawned pair of processes (module fixture), bounded by a timeout; rank 0
saves what they computed and the tests compare it here.
"""
from __future__ import annotations

import copy
import datetime
import os
import socket
import time

import pytest
import torch

transformers = pytest.importorskip("transformers")

from coda_ext.hf import apply_coda_to_llama  # noqa: E402  (after the importorskip)
from coda_ext.models import CodaLlamaForCausalLM, LlamaConfig  # noqa: E402
from coda_ext.models.torchtitan import convert_torchtitan_llama  # noqa: E402
from tests.helpers import titan_llama  # noqa: E402
from tests.helpers.hf_llama import VOCAB, tiny_llama  # noqa: E402

pytestmark = pytest.mark.slow

WORLD, ROWS, S, V = 2, 4, 16, VOCAB
STEPS = 3
TIMEOUT_S = 300   # both processes, every scenario; a collective that never completes fails after 120 s
RTOL = 2e-5
BF16_RTOL = 2e-2  # bf16 weights and activations: a few bf16 roundings (2^-8) of each value
CFG = LlamaConfig(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                  num_hidden_layers=2, vocab_size=V, rms_norm_eps=1e-5, rope_theta=10000.0)


# --- models, data and the training loop both sides run ------------------------------------------------------


def hf_model(seed=0):
    return tiny_llama(seed)


def coda_hf(seed=0):
    return apply_coda_to_llama(hf_model(seed), impl="reference")


def coda_native(seed=0):
    torch.manual_seed(seed)
    return CodaLlamaForCausalLM(CFG, impl="reference")


def titan(seed=0):
    return convert_torchtitan_llama(titan_llama.build(seed), impl="reference")


def batches(rank=0, world=1) -> torch.Tensor:
    """(STEPS, rows, S) token ids: the global batch of every step, or this rank's rows of it."""
    ids = torch.randint(0, V, (STEPS, ROWS, S), generator=torch.Generator().manual_seed(7))
    per = ROWS // world
    return ids[:, rank * per:(rank + 1) * per]


def lm_loss(model, ids):
    return model(ids, labels=ids).loss


def titan_loss(model, ids):
    return titan_llama.loss(model, ids)


def full(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()


def train(model, ids: torch.Tensor, steps: int, loss_fn=lm_loss, names=None) -> dict:
    """`steps` AdamW steps on ids[step]: the loss of each (averaged over the ranks), the gradients
    of the first step and the weights after the last (full tensors, by parameter name)."""
    import torch.distributed as dist

    names = names or model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, eps=1e-6)
    out = {"losses": []}
    for step in range(steps):
        loss = loss_fn(model, ids[step])
        loss.backward()
        if step == 0:
            out["grads"] = {n: full(p.grad) for n, p in names.named_parameters()}
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss = loss.detach().float()
        if dist.is_initialized():
            dist.all_reduce(loss)
            loss /= dist.get_world_size()
        out["losses"].append(loss.item())
    out["params"] = {n: full(p) for n, p in names.named_parameters()}
    return out


# --- the workers ------------------------------------------------------------------------------------------------


def sharded(model, layers=None, **kw):
    """FSDP2: fully_shard on every decoder layer (default: a transformers-style model's), then the root."""
    from torch.distributed.fsdp import fully_shard

    for layer in model.model.layers if layers is None else layers:
        fully_shard(layer, **kw)
    return fully_shard(model, **kw)


def max_diff(a, b) -> float:
    return max((full(x).float() - full(y).float()).abs().max().item()
               for x, y in zip(a.parameters(), b.parameters(), strict=True))


def state_dict_checks(model, checkpoint_dir: str) -> dict:
    """On a sharded coda model: its sharded state dict (placements, local rows), the full one, a DCP
    round trip into a sharded model of other weights, and a Hugging Face state dict loaded into one.
    A check that raises records its error (every rank raises alike) and the others still run."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

    out = {}

    def attempt(key, fn):
        try:
            out[key] = fn()
        except Exception as e:  # noqa: BLE001  (recorded, asserted on by the tests)
            out[key] = f"{type(e).__name__}: {e}"

    def placements(sd):
        return {k: (tuple(repr(p) for p in v.placements), tuple(v.to_local().shape), tuple(v.shape))
                for k, v in sd.items()}

    def round_trip():
        dcp.save(get_model_state_dict(model), checkpoint_id=checkpoint_dir)
        other = sharded(coda_hf(seed=1))
        before = max_diff(other, model)
        sd = get_model_state_dict(other)
        dcp.load(sd, checkpoint_id=checkpoint_dir)
        set_model_state_dict(other, sd)
        return before, max_diff(other, model)

    def hf_load():
        hf = hf_model(seed=2)
        want = apply_coda_to_llama(copy.deepcopy(hf), impl="reference")
        other = sharded(coda_hf(seed=1))
        set_model_state_dict(other, hf.state_dict(), options=StateDictOptions(full_state_dict=True))
        return max_diff(other, want)

    attempt("sharded", lambda: placements(get_model_state_dict(model)))
    attempt("plain", lambda: placements(model.state_dict()))
    attempt("full", lambda: get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                                  cpu_offload=True)))
    attempt("dcp_round_trip", round_trip)
    attempt("hf_full_state_dict_load", hf_load)
    return out


def worker(rank: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from torch.nn.parallel import DistributedDataParallel as DDP

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=120))
    torch.set_num_threads(1)
    ids, res = batches(rank, WORLD), {}

    model = coda_hf()
    res["ddp"] = train(DDP(model), ids, STEPS, names=model)

    model = coda_hf()
    sharded(model)
    res["fsdp"] = train(model, ids, STEPS)
    res["fsdp_params"] = {n: (type(p).__name__, tuple(repr(x) for x in p.placements), tuple(p.to_local().shape),
                              tuple(p.shape)) for n, p in model.named_parameters()}
    res["state"] = state_dict_checks(model, os.path.join(out_dir, "dcp"))

    model = coda_hf()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    res["ddp_checkpointing"] = train(DDP(model), ids, 1, names=model)

    model = coda_native()
    model.model.gradient_checkpointing = True
    sharded(model)
    res["fsdp_native_checkpointing"] = train(model, ids, 1)

    model = coda_hf()
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    sharded(model, mp_policy=policy)
    res["fsdp_bf16"] = train(model, ids, 1)

    model = coda_hf()
    for layer in model.model.layers:   # torchtitan's order: compile each layer, then shard
        layer.compile(backend="aot_eager", fullgraph=True)
    sharded(model)
    res["fsdp_compile"] = train(model, ids, 1)

    model = titan()
    sharded(model, model.layers.values())
    res["fsdp_torchtitan"] = train(model, ids, 1, loss_fn=titan_loss)

    if rank == 0:
        torch.save(res, os.path.join(out_dir, "results.pt"))
    dist.barrier()
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_spawned(fn, args: tuple, timeout: float) -> None:
    """fn(rank, *args) in WORLD spawned processes; a child's exception fails the test with its
    traceback, and children still running after `timeout` seconds are killed."""
    ctx = torch.multiprocessing.start_processes(fn, args=args, nprocs=WORLD, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
        if time.monotonic() >= deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
                    p.join()
            pytest.fail(f"the {WORLD} distributed workers did not finish within {timeout} s")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("distributed")
    run_spawned(worker, (free_port(), str(out)), TIMEOUT_S)
    return torch.load(out / "results.pt", weights_only=False)


# --- the single-process runs and the comparisons ----------------------------------------------------------------


def close(got, want, what, rtol=RTOL):
    torch.testing.assert_close(got, want, rtol=rtol, atol=rtol / 10 * (1 + want.abs().max().item()), msg=what)


def check_same(got: dict, want: dict, rtol=RTOL):
    assert len(got["losses"]) == len(want["losses"])
    for i, (a, b) in enumerate(zip(got["losses"], want["losses"])):
        assert a == pytest.approx(b, rel=rtol), f"loss of step {i}"
    assert set(got["grads"]) == set(want["grads"])
    for name, g in want["grads"].items():
        close(got["grads"][name].float(), g.float(), f"gradient of {name}", rtol)
    if len(want["losses"]) > 1:
        for name, p in want["params"].items():
            close(got["params"][name], p, f"{name} after {len(want['losses'])} steps", rtol)


@pytest.fixture(scope="module")
def one_process():
    return train(coda_hf(), batches(), STEPS)


def test_ddp_losses_gradients_and_steps_equal_one_process(results, one_process):
    check_same(results["ddp"], one_process)
    start = dict(coda_hf().named_parameters())
    moved = min((p - start[n]).abs().max().item() for n, p in one_process["params"].items())
    assert moved > 1e-3   # every weight moved (AdamW: about lr per step), far beyond the tolerance


def test_fsdp2_losses_gradients_and_steps_equal_one_process(results, one_process):
    check_same(results["fsdp"], one_process)


def test_fsdp2_shards_every_parameter_including_the_fused_layouts(results):
    params = results["fsdp_params"]
    for name, (kind, placements, local, shape) in params.items():
        assert kind == "DTensor" and placements == ("Shard(dim=0)",), name
        assert local == (-(-shape[0] // WORLD), *shape[1:]), name   # this rank's half of the rows
    qkv = params["model.layers.0.self_attn.qkv_weight"][2]
    gate_up = params["model.layers.1.mlp.gate_up_weight"][2]
    assert qkv == (CFG.qkv_size // WORLD, 128) and gate_up == (2 * 256 // WORLD, 128)


def test_activation_checkpointing_under_ddp_and_fsdp2(results, one_process):
    check_same(results["ddp_checkpointing"], {**one_process, "losses": one_process["losses"][:1]})
    check_same(results["fsdp_native_checkpointing"], train(coda_native(), batches(), 1))


def test_fsdp2_mixed_precision_bf16_params_fp32_reduce(results):
    """FSDP2 computes with bf16 copies of the fp32 weights; one process does the same in bf16."""
    model = coda_hf().to(torch.bfloat16)
    want = train(model, batches(), 1)
    got = results["fsdp_bf16"]
    assert all(g.dtype == torch.float32 for g in got["grads"].values())   # fp32 weights keep fp32 gradients
    check_same(got, want, BF16_RTOL)


def test_torch_compile_per_layer_under_fsdp2(results, one_process):
    check_same(results["fsdp_compile"], {**one_process, "losses": one_process["losses"][:1]})


def test_torchtitan_converter_under_fsdp2(results):
    """The converted stand-in against the unconverted one in one process (torchtitan's own math)."""
    check_same(results["fsdp_torchtitan"], train(titan_llama.build(0), batches(), 1, loss_fn=titan_loss))


def state(results, key):
    value = results["state"][key]
    assert not isinstance(value, str), f"{key}: {value}"
    return value


def test_sharded_state_dict_stays_sharded_in_hugging_face_layouts(results):
    """Regression: get_model_state_dict (torch.distributed.checkpoint's API, which torchtitan and
    accelerate call) raised AttributeError on the Hugging Face names the coda layers save, and
    model.state_dict() gathered every converted weight on every rank (Replicate)."""
    want = hf_model().state_dict()
    for key in ("sharded", "plain"):
        got = state(results, key)
        assert list(got) == list(want), key
        for name, (placements, local, shape) in got.items():
            assert placements == ("Shard(dim=0)",) and shape == tuple(want[name].shape), (key, name, placements)
            assert local[0] == -(-shape[0] // WORLD), (key, name)


def test_full_state_dict_is_the_trained_weights_in_hugging_face_layouts(results, one_process):
    """The gathered checkpoint equals the one-process model's state_dict (q/k rotate-half, gate and up
    apart): the layout conversions ran correctly on DTensors."""
    model = coda_hf()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(one_process["params"][name])
    want = model.state_dict()
    got = state(results, "full")
    assert list(got) == list(want)
    for k, v in want.items():
        close(got[k], v, k)


def test_checkpoint_loads_into_plain_transformers_with_the_same_loss(results):
    full_sd = state(results, "full")
    plain = hf_model(seed=3)
    plain.load_state_dict(full_sd, strict=True)
    coda = coda_hf(seed=3)
    coda.load_state_dict(full_sd, strict=True)
    ids = batches()[0]
    with torch.no_grad():
        assert lm_loss(coda, ids).item() == pytest.approx(lm_loss(plain, ids).item(), rel=RTOL)


def test_dcp_round_trip_into_a_sharded_model(results):
    before, after = state(results, "dcp_round_trip")
    assert before > 1e-3 and after == 0.0   # the other model's weights differed; now they are equal


def test_hugging_face_state_dict_into_a_sharded_model(results):
    """Regression: set_model_state_dict of a full Hugging Face state dict into a sharded coda model
    failed ('mixed torch.Tensor and DTensor') in the fused weights' load hooks."""
    assert state(results, "hf_full_state_dict_load") == 0.0
