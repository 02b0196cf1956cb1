"""coda_ext.hf.prebuild_llama / apply_coda_to_llama(prebuild_tokens=...): every kernel a training
step of a patched transformers Llama launches is built ahead, in one parallel pool with the torch
binding, with one progress line -- checked against the kernels the step really launches (the fused
impl on the CPU, each launch recorded by the kernel stand-in: the ops' own per-shape dispatch) with
a fake nvcc; a second prebuild builds nothing."""
from __future__ import annotations

import copy
import io
import re
import sys
import threading
import time

import pytest
import torch

transformers = pytest.importorskip("transformers")

import coda_ext.jit as jit  # noqa: E402  (after the importorskip)
from coda_ext import graphs  # noqa: E402
from coda_ext.hf import apply_coda_to_llama, prebuild_llama  # noqa: E402
from coda_ext.hf.llama import step_kernels  # noqa: E402
from coda_ext.jit import binding, cache, kernel_source, nvcc, paths  # noqa: E402
from coda_ext.models import weight_grad_backend  # noqa: E402
from coda_ext.runtime import api  # noqa: E402
from tests.helpers.fake_nvcc import timed_body, write_fake_nvcc  # noqa: E402

JOBS = 4


def hf_model(d=256, ffn=1024, vocab=2048, layers=2, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(hidden_size=d, intermediate_size=ffn, num_attention_heads=4, num_key_value_heads=2,
                                   head_dim=64, num_hidden_layers=layers, vocab_size=vocab,
                                   max_position_embeddings=2048)
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.config._attn_implementation = "sdpa"
    return model


def spans(path):
    return [tuple(map(float, line.split())) for line in path.read_text().splitlines()] if path.exists() else []


def most_at_once(intervals) -> int:
    edges = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    depth = best = 0
    for _, step in edges:
        depth += step
        best = max(best, depth)
    return best


@pytest.fixture
def builds(tmp_path, monkeypatch):
    """An empty cache, a fake nvcc that takes 0.3 s and logs its spans, a stand-in torch binding that
    takes 0.3 s, JOBS default jobs; returns what ran."""
    monkeypatch.setenv("CODA_EXT_CACHE_DIR", str(tmp_path / "cache"))
    log = tmp_path / "nvcc_calls.txt"
    monkeypatch.setenv("CODA_EXT_NVCC", str(write_fake_nvcc(tmp_path / "nvcc", log, timed_body(tmp_path / "spans"))))
    monkeypatch.setattr(nvcc, "_VERIFIED", set())
    monkeypatch.setattr(nvcc, "include_dirs", lambda: [paths.csrc_dir(), paths.csrc_dir() / "include"])
    for fn in (cache.headers_digest, paths.nvcc_version):   # the fake nvcc's version (cleared again after)
        fn.cache_clear()
    monkeypatch.setattr(jit, "default_jobs", lambda: JOBS)
    ran = {"binding": [], "pools": [], "nvcc": tmp_path / "spans"}

    def load_binding():
        t0 = time.time()
        time.sleep(0.3)
        ran["binding"].append((t0, time.time(), threading.current_thread() is threading.main_thread()))

    monkeypatch.setattr(binding, "load_binding", load_binding)
    monkeypatch.setattr(binding, "built", lambda: bool(ran["binding"]))
    real = api.build_kernels

    def build_kernels(items, jobs=None, binding=False):
        ran["pools"].append((len(items), jobs, binding))
        return real(items, jobs, binding=binding)

    monkeypatch.setattr(api, "build_kernels", build_kernels)
    yield ran
    for fn in (cache.headers_digest, paths.nvcc_version):
        fn.cache_clear()


def in_cache(source: str) -> bool:
    return nvcc.check_entry(cache.entry_dir(cache.cache_key(source))) is None


@pytest.mark.parametrize("batch,seq,dw", [(2, 16, "cublas"), (4, 1024, "cublas"), (4, 1024, "coda")])
def test_prebuild_builds_what_the_step_launches(builds, kernel_standin, capsys, batch, seq, dw):
    """The kernels prebuilt for B x S tokens are exactly those a training step launches (at 32 tokens
    every GEMM takes the small-M configs; at 4096 four configs or more in three operand layouts (the LM head's
    fp32 weight gradient is a coda_ext kernel, lm_head_ce.dw_backend), and five or more with the layers' own
    weight-gradient kernels too, models.weight_grad_backend("coda")), all built in
    one pool with the binding, JOBS at a time; the step then finds every kernel in the cache.
    Regression: the LM head's accumulating dX GEMM was listed for a vocabulary of one backward chunk,
    which never launches it (a kernel built for nothing)."""
    tokens = batch * seq
    model = hf_model()
    with weight_grad_backend(dw):
        apply_coda_to_llama(model, prebuild_tokens=tokens)
        err = capsys.readouterr().err
        items = step_kernels(model, tokens)
        want = {kernel_source(*item).label for item in items}
        built = spans(builds["nvcc"])
        assert builds["pools"] == [(len(items), None, True)]          # one parallel call, binding included
        assert len(built) == len({kernel_source(*i).source for i in items})   # one nvcc per distinct kernel
        assert 2 <= most_at_once(built + [b[:2] for b in builds["binding"]]) <= JOBS
        (b0, b1, on_main), = builds["binding"]
        assert not on_main and any(s < b1 and b0 < e for s, e in built)   # the binding builds beside the kernels

        ids = torch.randint(0, model.config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(1))
        model.train()
        model(input_ids=ids, labels=ids).loss.backward()
    assert set(kernel_standin.labels) == want
    assert all(in_cache(s) for s in kernel_standin.sources)        # no kernel build after the prebuild
    if tokens >= 4096:   # the check covers several configs and layouts
        assert len({label.split(", ")[1] for label in want}) >= (5 if dw == "coda" else 4), want
        head_dw = {graphs.weight_grad_split(a, f).build().digest() for a in (False, True)
                   for f in (False, True)}   # the LM head's (the default backend's)
        layers_dw = {label for label in want if "_mn" in label and label.split()[0] not in head_dw}
        assert bool(layers_dw) == (dw == "coda"), want
        assert any(label.split()[0] in head_dw for label in want), want

    lines = err.strip().splitlines()
    assert re.fullmatch(rf"coda_ext: a training step of this Llama at {tokens} tokens launches {len(built)} "
                        rf"kernels \(bfloat16\): 0 in the cache; building {len(built)} with -j {JOBS}", lines[0])
    assert lines[1] == f"coda_ext: building {len(built)} kernels and the torch binding …"
    assert re.fullmatch(rf"coda_ext: built {len(built)} kernels and the torch binding in \d+ s", lines[-1])
    assert not [line for line in lines if "with nvcc" in line], lines   # no line per kernel


def test_second_prebuild_builds_nothing(builds, capsys):
    model = hf_model(layers=1)
    first = prebuild_llama(model, 64)
    calls = spans(builds["nvcc"])
    capsys.readouterr()
    again = prebuild_llama(copy.deepcopy(model), torch.zeros(2, 32, dtype=torch.long))   # the same 64 tokens
    assert again == first and spans(builds["nvcc"]) == calls and len(builds["binding"]) == 1
    n = len(set(first))
    assert capsys.readouterr().err.strip().splitlines() == [
        f"coda_ext: a training step of this Llama at 64 tokens launches {n} kernels (bfloat16): {n} in the cache"]


def test_prebuild_refusals():
    model = hf_model(layers=1)
    with pytest.raises(ValueError, match=r"model.to\(torch.bfloat16\)"):
        prebuild_llama(model.float(), 64)
    with pytest.raises(ValueError, match="tokens must be a positive int"):
        prebuild_llama(model.bfloat16(), 0)
    with pytest.raises(ValueError, match="impl='reference' launches none"):
        apply_coda_to_llama(model, impl="reference", prebuild_tokens=64)
    fp32 = hf_model(layers=1).float()
    layer = fp32.model.layers[0]
    with pytest.raises(ValueError, match=r"model.to\(torch.bfloat16\)"):
        apply_coda_to_llama(fp32, prebuild_tokens=64)
    assert fp32.model.layers[0] is layer   # refused before the model changed
    with pytest.raises(TypeError, match="LlamaForCausalLM"):
        prebuild_llama(model.model, 64)
    odd = hf_model(d=256, vocab=2047, layers=1)
    with pytest.raises(ValueError, match="vocab_size 2047"):
        prebuild_llama(odd, 64)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_one_progress_line_on_a_terminal(builds, monkeypatch):
    """On a terminal the parallel build is one status line, rewritten in place (builds done of all,
    seconds), between the count and the closing line."""
    monkeypatch.setattr(nvcc, "TTY_EVERY_S", 0.05)
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    paths_ = prebuild_llama(hf_model(layers=1), 64)
    n = len(set(paths_))
    out = terminal.getvalue()
    updates = re.findall(rf"\r\x1b\[Kcoda_ext: building {n} kernels and the torch binding: (\d+)/{n + 1} done … \d+ s",
                         out)
    assert len(updates) >= 2 and int(updates[-1]) >= int(updates[0]), out
    assert out.count("\n") == 3, out   # the count, the batch's first line, the closing line
    assert re.search(rf"\r\x1b\[Kcoda_ext: built {n} kernels and the torch binding in \d+ s\n$", out), out
