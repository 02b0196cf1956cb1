"""A Hugging Face Llama's training step as users run it: eager, torch.compile, Liger, coda_ext and
coda_ext + torch.compile side by side, with the floor a step cannot beat.

    python -m benchmarks.bench_hf_training                          # both models, every variant (GPU)
    python -m benchmarks.bench_hf_training --prebuild --cold        # + coda's kernels built ahead; the
                                                                    #   cold first step with an empty cache
    python -m benchmarks.bench_hf_training --models llama-8b --layers llama-8b=2
    python -m benchmarks.bench_hf_training --device cpu --tiny --steps 3   # tiny configs, coda's references

Models: transformers LlamaForCausalLM from a config with random weights (no downloads), bf16:
Llama-3.2-1B-like (d 2048, 32/8 heads of 64, F 8192, V 128256, tied embeddings, 16 layers) and
Llama-3.1-8B-like (d 4096, 32/8 heads of 128, F 14336, V 128256, LAYERS_8B layers: what fits beside
the other variants on an 80 GB H100; `--layers` changes either). 8 x 2048 tokens per step (`--batch`,
`--seq`), AdamW (fused on CUDA) in every step.

Variants: eager; compile (torch.compile(model), traced inside coda_ext.fusion.hf_masks.plain_masks(): with
transformers 5.17 on torch < 2.14 a compiled model otherwise builds the causal mask as a tensor and SDPA
leaves its flash kernel, which the patched model avoids by itself; runs before this change measured
torch.compile without it); liger (liger_kernel's apply_liger_kernel_to_llama:
RoPE, RMSNorm, SwiGLU, fused linear cross-entropy; skipped with the reason when liger_kernel does not
import; its module-level patches are active only during its own calls, so the other variants run
plain transformers); coda (coda_ext.hf.apply_coda_to_llama); coda_compile (torch.compile of the
patched model); coda_kernel_dw, run only when named (coda with the layers' weight gradients in coda_ext's own
kernel instead of cuBLAS: coda_ext.models.weight_grad_backend). eager, compile and liger share one set of
parameters and one optimizer, the coda variants another (the patched model's fused layouts): all start every
loss curve from the same
initial weights (reloaded), on the same batches (coda_ext's train_demo task: learnable, so the curves
fall).

Per model and variant: the loss of each of --steps steps from the initial weights (eager's twice: its
run-to-run spread, against which the loss goal is read); the step time
(forward, backward, optimizer step; the median of --rounds interleaved rounds, common.time_interleaved
on the GPU); each phase of a step (forward, backward, optimizer) on the device and on the host, medians of
PHASE_REPS steps each started on an idle device (phase_times: where a step's time goes with no profiler
in it); on a GPU the clocks and power its steps hold back to back (nvidia-smi sampled for CLOCK_SECONDS, the
samples above 600 W: common.clocks_while); tokens/s; MFU (model FLOPs: 6 x tokens x linear parameters, LM
head included, plus causal attention, over the GPU's dense bf16 peak); peak memory of one step beyond what
was allocated before it; a per-component breakdown from torch.profiler of one step (breakdown()). The floor: the bare
cuBLAS GEMMs of the step (forward, dX, dW of every linear and the LM head) + SDPA forward and backward
+ the optimizer step (the fastest variant's, from its profile), printed beside the variants: each part timed
alone after a pause (boost clocks), and again back to back at the GPU's power limit ("floor held", where a
step runs: an H200 held 1400-1550 MHz through a Llama step against 1980 MHz boost, docs/measured.md).

--prebuild builds coda's kernels for the step (coda_ext.hf.prebuild_llama) before anything is timed;
--cold measures, in a child process with empty kernel, inductor and triton caches, the time from
apply_coda_to_llama (with prebuild_tokens when --prebuild is given) to the end of the first step.
Results: --out (default: the hf_training_<gpu> JSON in benchmarks/results/, <gpu> the GPU it runs on:
h100, h200, …, or cpu; the models of an earlier run on the same GPU are kept, --fresh starts over) and a
PNG beside it. On a GPU machine without network, bring liger-kernel (pure Python) as a wheel:
benchmarks/gpu_session.sh's WHEELS.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import itertools
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from benchmarks import common

VARIANTS = ("eager", "compile", "liger", "coda", "coda_compile", "coda_kernel_dw")
#: What --variants runs unless told: coda_kernel_dw (coda_ext with its own weight-gradient kernels in place of
#: cuBLAS's, models.weight_grad_backend) is the A/B of that choice, run when named.
DEFAULT_VARIANTS = VARIANTS[:-1]
LAYERS_8B = 4
MODELS = {
    "llama-1b": dict(hidden_size=2048, intermediate_size=8192, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=64, vocab_size=128256, num_hidden_layers=16, tie_word_embeddings=True),
    "llama-8b": dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128, vocab_size=128256, num_hidden_layers=LAYERS_8B, tie_word_embeddings=False),
}
#: --tiny: the same model names on a CPU-sized config (the wiring, not the speed), every weight shape
#: distinct (so the breakdown tells the linears apart by shape, as at full size).
TINY = dict(hidden_size=128, intermediate_size=352, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
            vocab_size=384, num_hidden_layers=2)
COMMON = dict(rms_norm_eps=1e-5, rope_theta=500000.0, max_position_embeddings=8192, attention_dropout=0.0)
#: Dense bf16 tensor-core peaks (FLOP/s) by GPU name (the first that matches), for MFU.
PEAK_BF16 = (("H100 PCIe", 756e12), ("H100", 989.4e12), ("H200", 989.4e12), ("A100", 312e12))
#: Linear modules of a transformers Llama layer, by the GEMM they are in the breakdown.
LINEARS = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "o_proj": "o", "gate_proj": "gate_up",
           "up_proj": "gate_up", "down_proj": "down"}
GOAL_VS_BEST = 0.90
GOAL_LOSS_REL = 0.005


# --- models and variants -------------------------------------------------------------------------------------


def hf_config(name: str, layers: int | None, tiny: bool):
    import transformers

    kw = {**COMMON, **MODELS[name]}
    if tiny:
        kw.update(TINY, max_position_embeddings=512)
    if layers is not None:
        kw["num_hidden_layers"] = layers
    cfg = transformers.LlamaConfig(**kw)
    cfg._attn_implementation = "sdpa"
    return cfg


def base_model(cfg, device: str, dtype):
    import torch
    import transformers

    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.LlamaForCausalLM(cfg)
    return model.to(dtype).train()


def sharing_parameters(model):
    """A copy of model's modules that holds model's very parameters and buffers (liger patches its copy)."""
    memo = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    return copy.deepcopy(model, memo)


def module_globals(module, values: dict):
    """module's globals set to `values` inside the block, restored after."""
    from unittest import mock

    return mock.patch.multiple(module, **values)


def liger_variant(model):
    """(call, patches) of a Liger-patched copy sharing model's parameters: liger patches transformers'
    modeling_llama globals (RoPE, classes) for every model; they are undone here and reapplied by
    `call` around each of its calls only."""
    from liger_kernel.transformers import apply_liger_kernel_to_llama
    from transformers.models.llama import modeling_llama

    twin = sharing_parameters(model)
    before = dict(vars(modeling_llama))
    apply_liger_kernel_to_llama(model=twin)
    patches = {k: v for k, v in vars(modeling_llama).items() if before.get(k, object()) is not v}
    for k in patches:
        setattr(modeling_llama, k, before[k])

    def call(**batch):
        with module_globals(modeling_llama, patches):
            return twin(**batch)
    return call, twin


def skip_reason(variant: str) -> str | None:
    if variant == "liger":
        try:
            import liger_kernel.transformers  # noqa: F401
        except Exception as e:  # noqa: BLE001  (ImportError, or triton failing to find a GPU)
            return f"liger_kernel does not import: {type(e).__name__}: {e}"
    return None


def make_optimizer(model, device: str, lr: float):
    import torch

    return torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1,
                             fused=device == "cuda")


#: Each variant's step as a user who knows gets it fastest: eager and Liger with use_cache=False (transformers
#: builds a KV cache from config.use_cache in training too, copying every layer's keys and values into it);
#: torch.compile with the default (with use_cache=False it traced transformers' mask code into a mask tensor,
#: and SDPA took its masked path: 155 against 140 ms a step at 1B-8L on an H200); the patched model builds no
#: cache in training by itself.
NO_CACHE = {"use_cache": False}
#: Steps of each variant timed phase by phase (phase_times)
PHASE_REPS = 5


def build_variants(cfg, args, device: str, dtype) -> tuple[dict, dict, dict]:
    """({name: variant}, {name: why skipped}, info): a variant is a dict with call (the model call),
    module (what holds its weights: reloaded before its loss curve), opt, compiled, profile_model
    (the module to scope in its profile)."""
    import torch

    from coda_ext.fusion.hf_masks import with_plain_masks
    from coda_ext.hf import apply_coda_to_llama, prebuild_llama
    from coda_ext.models import weight_grad_backend

    base = base_model(cfg, device, dtype)
    initial = {k: v.detach().to("cpu", copy=True) for k, v in base.state_dict().items()}
    variants, skipped, info = {}, {}, {"initial": initial}
    wanted = [v for v in VARIANTS if v in args.variants]
    for name in wanted:
        why = skip_reason(name)
        if why:
            skipped[name] = why
    opt = make_optimizer(base, device, args.lr)
    backend = args.compile_backend
    if "eager" in wanted:
        variants["eager"] = dict(call=base, module=base, opt=opt, compiled=False, profile_model=base,
                                 kwargs=NO_CACHE)
    if "compile" in wanted:
        # traced with no causal mask tensor where none is needed, as the patched model is (coda_ext.fusion.hf_masks):
        # the best torch.compile a user gets from this transformers and torch
        variants["compile"] = dict(call=with_plain_masks(torch.compile(base, backend=backend)), module=base, opt=opt,
                                   compiled=True)
    if "liger" in wanted and "liger" not in skipped:
        call, twin = liger_variant(base)
        variants["liger"] = dict(call=call, module=base, opt=opt, compiled=False, profile_model=twin, kwargs=NO_CACHE)
    if {"coda", "coda_compile", "coda_kernel_dw"} & set(wanted):
        impl = "auto" if device == "cuda" else "reference"
        coda = apply_coda_to_llama(copy.deepcopy(base), impl=impl)
        if args.prebuild and impl != "reference":
            start = time.monotonic()
            with weight_grad_backend("coda" if "coda_kernel_dw" in wanted else "cublas"):
                prebuild_llama(coda, args.batch * args.seq)
            info["prebuild_s"] = time.monotonic() - start
        copt = make_optimizer(coda, device, args.lr)
        if "coda" in wanted:
            variants["coda"] = dict(call=coda, module=coda, opt=copt, compiled=False, profile_model=coda)
        if "coda_compile" in wanted:
            variants["coda_compile"] = dict(call=torch.compile(coda, backend=backend), module=coda, opt=copt,
                                            compiled=True)
        if "coda_kernel_dw" in wanted:   # the same model and optimizer, its steps run with the other backend
            variants["coda_kernel_dw"] = dict(call=coda, module=coda, opt=copt, compiled=False, profile_model=coda,
                                              context=lambda: weight_grad_backend("coda"))
    return variants, skipped, info


def batches(cfg, args, n: int, seed: int, device: str) -> list[dict]:
    from coda_ext.tools.train_demo import make_batches

    ids = make_batches(n, args.batch, args.seq, cfg.vocab_size, seed)
    return [{"input_ids": t.to(device), "labels": t.to(device)} for t in ids]


PHASES = ("forward", "backward", "optimizer")
#: Seconds of back-to-back steps per variant while nvidia-smi samples the clocks (common.clocks_while)
CLOCK_SECONDS = 3.0


def train_step(variant: dict, batch: dict, scopes: bool = False, after=None):
    """Forward, backward, optimizer step (gradients cleared); returns the loss (not synchronized).
    scopes: the phases as profiler ranges; after(i): called when phase PHASES[i] has been issued."""
    from torch.profiler import record_function

    scope = record_function if scopes else (lambda name: contextlib.nullcontext())
    mark = after or (lambda i: None)
    with variant.get("context", contextlib.nullcontext)():
        with scope("bench:forward"):
            loss = variant["call"](**batch, **variant.get("kwargs", {})).loss
        mark(0)
        with scope("bench:backward"):
            loss.backward()
        mark(1)
        with scope("bench:optimizer"):
            variant["opt"].step()
            variant["opt"].zero_grad(set_to_none=True)
        mark(2)
    return loss.detach()


def phase_times(variant: dict, batch: dict, reps: int, device: str) -> dict:
    """Medians over `reps` steps (each started on an idle device, as a timed round starts) of each phase's time
    on the device (CUDA events between the phases; on a CPU the host's clock) and on the host: where a step's
    time goes without a profiler's own host cost in it ({"gpu": {phase: ms}, "host": {phase: ms}})."""
    import torch

    gpu, host = [], []
    for _ in range(reps):
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda._sleep(common.LEAD_CYCLES)
            events = [torch.cuda.Event(enable_timing=True) for _ in range(len(PHASES) + 1)]
        stamps = [time.perf_counter()]

        def after(i):
            if device == "cuda":
                events[i + 1].record()
            stamps.append(time.perf_counter())

        if device == "cuda":
            events[0].record()
        train_step(variant, batch, after=after)
        if device == "cuda":
            events[-1].synchronize()
        spans = [(b - a) * 1e3 for a, b in itertools.pairwise(stamps)]
        host.append(spans)
        gpu.append([a.elapsed_time(b) for a, b in itertools.pairwise(events)] if device == "cuda" else spans)
    med = [statistics.median(x) for x in zip(*gpu)], [statistics.median(x) for x in zip(*host)]
    return {"gpu": dict(zip(PHASES, med[0])), "host": dict(zip(PHASES, med[1]))}


def loss_curve(variant: dict, initial: dict, data: list[dict]) -> list[float]:
    """The loss of each step from the initial weights (and a fresh optimizer state)."""
    variant["module"].load_state_dict(initial)
    variant["opt"].state.clear()
    return [float(train_step(variant, b)) for b in data]


# --- timing and memory ---------------------------------------------------------------------------------------



def time_rounds(fns: dict, reps: int, warmup: int, device: str) -> dict[str, list[float]]:
    if device == "cuda":
        return common.time_interleaved(fns, reps, warmup=warmup)
    return common.time_interleaved_cpu(fns, reps, warmup)


def step_flops(cfg, batch: int, seq: int) -> float:
    """Model FLOPs of one training step: 6 x tokens x (linear weights of every layer + LM head) +
    causal attention (QKᵀ and PV over half the square, forward once, backward twice)."""
    d, f, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    hq, hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    per_layer = d * (hq + 2 * hkv) * hd + hq * hd * d + 3 * d * f
    tokens = batch * seq
    dense = 6 * tokens * (cfg.num_hidden_layers * per_layer + cfg.vocab_size * d)
    return dense + cfg.num_hidden_layers * 6 * batch * seq * seq * hq * hd


def peak_flops(gpu: str | None) -> float | None:
    return next((f for key, f in PEAK_BF16 if gpu and key in gpu), None)


def floor_fns(cfg, batch: int, seq: int, device: str, dtype) -> dict[str, tuple[Any, int]]:
    """{name: (fn, times per step)}: the bare GEMMs of every linear (forward, dX, dW; per layer) and of
    the LM head, and SDPA forward + backward (per layer)."""
    import torch
    import torch.nn.functional as F

    from tests.helpers import rand

    M, d, f, hd, L = batch * seq, cfg.hidden_size, cfg.intermediate_size, cfg.head_dim, cfg.num_hidden_layers
    hq, hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    gen = rand.generator("hf floor", M, d, device=device)
    fns = {}
    linears = {"qkv": ((hq + 2 * hkv) * hd, d, L), "o": (d, hq * hd, L), "gate_up": (2 * f, d, L),
               "down": (d, f, L), "lm_head": (cfg.vocab_size, d, 1)}
    for name, (N, K, count) in linears.items():
        x, w, g = (rand.randn(gen, *s, dtype=dtype) for s in ((M, K), (N, K), (M, N)))
        fns[f"{name}.fwd"] = (lambda i, x=x, w=w: x @ w.t(), count)
        fns[f"{name}.dx"] = (lambda i, g=g, w=w: g @ w, count)
        fns[f"{name}.dw"] = (lambda i, g=g, x=x: g.t() @ x, count)
    q = rand.randn(gen, batch, hq, seq, hd, dtype=dtype).requires_grad_()
    k, v = (rand.randn(gen, batch, hkv, seq, hd, dtype=dtype).requires_grad_() for _ in range(2))
    go = rand.randn(gen, batch, hq, seq, hd, dtype=dtype)

    def attention(i):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=hkv != hq)
        return torch.autograd.grad(out, (q, k, v), go)
    fns["attention"] = (attention, L)
    return fns


def measure_floor(cfg, args, device: str, dtype, sustained: bool = False) -> dict:
    """{part: ms per step} of the floor's GEMMs and attention: medians of interleaved rounds, each part timed
    alone after a pause (the GPU at boost clocks), or with sustained, as blocks of back-to-back calls at the
    clocks the GPU holds at its power limit, which a training step runs at (common.time_sustained; on a CPU
    the same rounds as without)."""
    fns = floor_fns(cfg, args.batch, args.seq, device, dtype)
    calls = {k: fn for k, (fn, _) in fns.items()}
    if sustained and device == "cuda":
        times = common.time_sustained(calls, max(3, args.rounds // 2))
    else:
        times = time_rounds(calls, args.rounds, args.warmup, device)
    return {k: statistics.median(times[k]) * count for k, (_, count) in fns.items()}


def floor_entry(floor: dict, optimizer: float) -> dict:
    """The floor of a step from its parts' ms (measure_floor) and the fastest variant's optimizer time."""
    gemms = sum(ms for k, ms in floor.items() if k != "attention")
    return {"gemms_ms": gemms, "attention_ms": floor["attention"], "optimizer_ms": optimizer, "parts_ms": floor,
            "step_ms": gemms + floor["attention"] + optimizer}


# --- the breakdown -------------------------------------------------------------------------------------------


@contextlib.contextmanager
def module_scopes(model):
    """Every module's forward as a profiler range 'bench:module:<qualified name>' ('<root>' for model)."""
    from torch.profiler import record_function

    handles, open_ = [], {}

    def pre(name):
        def hook(module, args):
            rf = record_function(f"bench:module:{name}")
            rf.__enter__()
            open_.setdefault(id(module), []).append(rf)
        return hook

    def post(module, args, out):
        open_[id(module)].pop().__exit__(None, None, None)

    for name, module in model.named_modules():
        handles.append(module.register_forward_pre_hook(pre(name or "<root>")))
        handles.append(module.register_forward_hook(post))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def profile_step(variant: dict, batch: dict, device: str):
    """torch.profiler of one training step, with the phases and (uncompiled models) every module scoped."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    scoped = module_scopes(variant["profile_model"]) if not variant["compiled"] else contextlib.nullcontext()
    with scoped, profile(activities=activities, record_shapes=True) as prof:
        train_step(variant, batch, scopes=True)
        if device == "cuda":
            torch.cuda.synchronize()
    return prof


def _chain(e) -> list:
    out = []
    while e is not None:
        out.append(e)
        e = e.cpu_parent
    return out


GEMM_OPS = re.compile(r"^aten::(mm|addmm|bmm|baddbmm|matmul|linear|_scaled_mm)$")
ELEMENTWISE_CODA = re.compile(r"^coda_ext::(rms_norm_input|qkv_rope_backward|rope_backward_rows|rope_cos_sin)")
KINDS = (("attention", re.compile(r"attention|flash|fmha|efficient_attn", re.I)),
         ("embedding", re.compile(r"embedding", re.I)),
         ("loss", re.compile(r"cross_entropy|log_softmax|nll_loss|lm_head", re.I)),
         ("gemm", re.compile(r"gemm|cutlass|xmma|nvjet|cublas|sm90_", re.I)))


def kind_of(name: str, ops: list) -> str:
    """gemm, attention, embedding, loss or elementwise: by the innermost launching op that says, else
    by the kernel's (or CPU op's) name."""
    for e in ops:
        if e.name.startswith(("bench:", "autograd::engine")):
            break
        if GEMM_OPS.match(e.name):
            return "gemm"
        if ELEMENTWISE_CODA.match(e.name):
            return "elementwise"
        if e.name.startswith("coda_ext::lm_head"):
            return "loss_gemm"
        if e.name.startswith("coda_ext::"):
            return "gemm"
        for kind, pattern in KINDS[:3]:
            if pattern.search(e.name):
                return kind
    for kind, pattern in KINDS:
        if pattern.search(name):
            return kind
    return "elementwise"


def _scope_path(ops: list) -> str | None:
    return next((e.name[len("bench:module:"):] for e in ops if e.name.startswith("bench:module:")), None)


def gemm_dims(e) -> tuple[int, ...] | None:
    """(rows, cols, contraction) of an aten::mm / addmm / bmm op from its recorded shapes (bmm's
    batches count as rows)."""
    if e.name == "aten::bmm" and len(e.input_shapes or []) >= 2 and len(e.input_shapes[0]) == 3:
        (n, a, b), (_, b2, c) = e.input_shapes[:2]
        return (n * a, c, b) if b == b2 else None
    shapes = [s for s in (e.input_shapes or []) if len(s) == 2]
    if e.name not in ("aten::mm", "aten::addmm") or len(shapes) < 2:
        return None
    (a, b), (b2, c) = shapes[-2:]
    return (a, c, b) if b == b2 else None


def linear_by_shape(dims, table: dict, tokens: int, phase: str, dw_first: str = "activation") -> str | None:
    """'<linear>.<fwd|dx|dw>' of an (M, N, K) GEMM of the step, from the linears' (N, K) weight shapes.
    dw_first: the weight gradient's first operand (transposed): 'activation' (aten: dWᵀ) or 'gradient'."""
    M, N, K = dims
    if K == tokens:   # aten's linear backward computes dWᵀ = xᵀ·dz, coda's weight_grad dW = dzᵀ·x
        names, part = table.get((M, N) if dw_first == "gradient" else (N, M)), "dw"
    elif phase == "forward":
        names, part = table.get((N, K)), "fwd"
    else:
        names, part = table.get((K, N)), "dx"
    return f"{'|'.join(sorted(names))}.{part}" if names else None


def weight_table(cfg) -> dict:
    """{(N, K): {linear names}} of every weight layout a variant may multiply by."""
    d, f, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    hq, hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    table: dict = {}
    for name, shape in (("qkv", ((hq + 2 * hkv) * hd, d)), ("qkv", (hq * hd, d)), ("qkv", (hkv * hd, d)),
                        ("o", (d, hq * hd)), ("gate_up", (f, d)), ("gate_up", (2 * f, d)), ("down", (d, f)),
                        ("lm_head", (cfg.vocab_size, d))):
        table.setdefault(shape, set()).add(name)
    return table


def breakdown(prof, cfg, tokens: int, device: str, dw_first: str = "activation") -> dict:
    """ms of one step per component: per_layer (the layers' total / layers: each linear's GEMM and its
    epilogue as <linear>.<fwd|dx|dw>, attention.<fwd|bwd>, elementwise.<fwd|bwd>, gemm.<phase> when a
    GEMM's linear is unknown), lm_head_loss, optimizer, embedding, other (with any kernel time the
    profiler tied to no op), total; on a GPU also gpu_busy_ms and gpu_idle_ms (common.busy_and_idle). Device kernel
    times on a GPU (each kernel under the op that
    launched it), self CPU times on the CPU. The component of
    a kernel: its module scope (uncompiled models; the backward's through the autograd node's
    sequence number), else its kind and shapes (compiled graphs). dw_first: linear_by_shape's."""
    from torch.autograd import DeviceType

    events = sorted((e for e in prof.events() if e.device_type == DeviceType.CPU), key=lambda e: e.time_range.start)
    forward_scope = {}   # (thread, sequence number) -> the scope of the forward op that made the autograd node
    for e in events:     # ops before it may carry its number too (not yet taken): the last one made it
        if e.sequence_nr >= 0 and not e.name.startswith("autograd::engine"):
            forward_scope[(e.thread, e.sequence_nr)] = _scope_path(_chain(e))
    table = weight_table(cfg)
    layers = {}
    out = {"lm_head_loss": {}, "optimizer": 0.0, "embedding": 0.0, "other": 0.0}
    total = 0.0

    def add(part: dict, key: str, ms: float):
        part[key] = part.get(key, 0.0) + ms

    for e in events:
        if device == "cuda":
            acts = [(k.name, k.duration) for k in e.kernels]
        else:   # the CPU: each op's own time (a scope's own is Python, not work)
            acts = [] if e.name.startswith("bench:") else [(e.name, e.self_cpu_time_total)]
        if not acts:
            continue
        ops = _chain(e)
        names = [o.name for o in ops]
        node = next((o for o in ops if o.name.startswith("autograd::engine::evaluate_function")), None)
        phase = ("optimizer" if "bench:optimizer" in names else "backward" if node is not None
                 else "forward" if "bench:forward" in names else "other")
        path = forward_scope.get((node.fwd_thread, node.sequence_nr)) if node is not None else _scope_path(ops)
        for name, us in acts:
            ms = us / 1e3
            total += ms
            if phase in ("optimizer", "other"):
                out[phase] += ms
                continue
            kind = kind_of(name, ops)
            leaf = path.rsplit(".", 1)[-1] if path else None
            in_layer = path is None or re.search(r"(^|\.)layers\.\d+", path) is not None   # None: compiled
            if kind == "embedding" or (path and "embed_tokens" in path):
                out["embedding"] += ms
            elif kind in ("loss", "loss_gemm") or leaf in ("<root>", "lm_head"):
                add(out["lm_head_loss"], "gemm" if kind in ("gemm", "loss_gemm") else kind, ms)
            elif not in_layer:   # the decoder outside its layers: RoPE tables, masks, the final norm
                out["other"] += ms
            else:
                ph = "fwd" if phase == "forward" else "bwd"
                if kind != "gemm":
                    add(layers, f"{kind}.{ph}", ms)
                    continue
                dims = next((gemm_dims(o) for o in ops if gemm_dims(o)), None)
                guess = linear_by_shape(dims, table, tokens, phase, dw_first) if dims else None
                if leaf in LINEARS:
                    key = f"{LINEARS[leaf]}.{guess.split('.')[-1] if guess else ph}"
                elif guess and guess.startswith("lm_head"):
                    add(out["lm_head_loss"], "gemm", ms)
                    continue
                else:
                    key = guess or coda_linear(ops, table) or f"gemm.{ph}"
                add(layers, key, ms)
    if device == "cuda":   # kernels the profiler tied to no op (none, normally)
        gpu = [e for e in prof.events() if common.is_kernel(e)]
        ran = sum(e.time_range.elapsed_us() for e in gpu) / 1e3
        out["other"] += max(0.0, ran - total)
        total = max(total, ran)
        out["gpu_busy_ms"], out["gpu_idle_ms"] = common.busy_and_idle(gpu)
    n = max(1, cfg.num_hidden_layers)
    out["layers"] = n
    out["per_layer"] = {k: v / n for k, v in sorted(layers.items())}
    out["total"] = total
    return out


CODA_PHASE = {"weight_grad": "dw", "linear_dx": "dx", "rms_norm_backward_linear": "dx",
              "swiglu_backward_linear": "dx", "swiglu_backward_linear_": "dx", "qkv_rope": "fwd",
              "linear_residual_norm": "fwd",
              "linear_swiglu_train": "fwd", "linear_residual": "fwd"}


def coda_linear(ops: list, table: dict) -> str | None:
    """'<linear>.<part>' of a coda_ext op's GEMM: the op names the part, its weight (2nd argument; the
    gradient's and the activation's widths for weight_grad) the linear."""
    op = next((o for o in ops if o.name.startswith("coda_ext::") and o.name != "coda_ext::run_graph"), None)
    if op is None or len(op.input_shapes or []) < 2:
        return None
    short = op.name.split("::")[1].split(".")[0]
    part = CODA_PHASE.get(short)
    first, second = op.input_shapes[:2]
    if short == "weight_grad":
        names = table.get((first[-1], second[-1])) if first and second else None
    else:
        names = table.get(tuple(second))
    return f"{'|'.join(sorted(names))}.{part}" if names and part else None


# --- the cold first step ---------------------------------------------------------------------------------------


def cold_first_step(name: str, args, device: str) -> dict:
    """Seconds from apply_coda_to_llama (prebuild_tokens with --prebuild) to the end of the first
    training step, in this process (run it with empty caches: run_cold)."""
    import torch

    from coda_ext.hf import apply_coda_to_llama

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    cfg = hf_config(name, args.layers.get(name), args.tiny)
    model = base_model(cfg, device, dtype)
    data = batches(cfg, args, 1, seed=1, device=device)
    impl = "auto" if device == "cuda" else "reference"
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.monotonic()
    tokens = args.batch * args.seq if args.prebuild and impl != "reference" else None
    apply_coda_to_llama(model, impl=impl, prebuild_tokens=tokens)
    patched = time.monotonic()
    train_step({"call": model, "opt": make_optimizer(model, device, args.lr)}, data[0])
    if device == "cuda":
        torch.cuda.synchronize()
    end = time.monotonic()
    return {"cold_first_step_s": end - start, "apply_s": patched - start, "first_step_s": end - patched,
            "prebuild": bool(tokens), "cpus": os.cpu_count()}


def run_cold(name: str, argv: list[str]) -> dict:
    """cold_first_step in a child process with empty coda_ext, inductor and triton caches."""
    with tempfile.TemporaryDirectory(prefix="coda-cold-") as tmp:
        env = {**os.environ, "CODA_EXT_CACHE_DIR": f"{tmp}/coda", "TORCHINDUCTOR_CACHE_DIR": f"{tmp}/inductor",
               "TRITON_CACHE_DIR": f"{tmp}/triton"}
        cmd = [sys.executable, "-m", "benchmarks.bench_hf_training", *argv, "--models", name, "--cold-child"]
        proc = subprocess.run(cmd, env=env, cwd=common.ROOT, stdout=subprocess.PIPE, text=True, check=False)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"error": f"exit {proc.returncode}", "stdout": proc.stdout[-2000:]}
    return json.loads(lines[-1])


# --- one model -------------------------------------------------------------------------------------------------


def run_model(name: str, args, device: str, gpu: str | None) -> dict:
    import torch

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    cfg = hf_config(name, args.layers.get(name), args.tiny)
    tokens = args.batch * args.seq
    variants, skipped, info = build_variants(cfg, args, device, dtype)
    entry = {"config": {k: getattr(cfg, k) for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                                     "num_key_value_heads", "head_dim", "vocab_size",
                                                     "num_hidden_layers", "tie_word_embeddings")},
             "batch": args.batch, "seq": args.seq, "tokens": tokens, "steps": args.steps, "optimizer": "AdamW",
             "dtype": str(dtype).split(".")[-1], "variants": {}, "skipped": skipped,
             "commit": common.commit(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}   # models merge across runs
    if "prebuild_s" in info:
        entry["prebuild_s"] = info["prebuild_s"]
    data = batches(cfg, args, args.steps, seed=1, device=device)
    for v, var in list(variants.items()):     # also each variant's warm-up (torch.compile compiles here)
        try:
            entry["variants"][v] = {"loss": loss_curve(var, info["initial"], data)}
        except Exception as e:  # noqa: BLE001  (a variant that fails is recorded; the others go on)
            skipped[v] = f"failed: {type(e).__name__}: {str(e)[:500]}"
            del variants[v]
            print(f"{name} {v}: {skipped[v]}", file=sys.stderr, flush=True)
            continue
        print(f"{name} {v}: loss {entry['variants'][v]['loss'][0]:.4f} -> {entry['variants'][v]['loss'][-1]:.4f}",
              file=sys.stderr, flush=True)
    if getattr(args, "eager_repeat", True) and "eager" in variants:
        # eager again from the same weights on the same batches: its run-to-run spread (attention's backward
        # accumulates with atomics) is the floor under every variant's loss difference
        entry["variants"]["eager"]["loss_repeat"] = loss_curve(variants["eager"], info["initial"], data)
    timing = batches(cfg, args, 2, seed=2, device=device)
    fns = {v: (lambda i, var=var: train_step(var, timing[i])) for v, var in variants.items()}
    times = time_rounds(fns, args.rounds, args.warmup, device)
    flops, peak = step_flops(cfg, args.batch, args.seq), peak_flops(gpu)
    for v in variants:
        ms = statistics.median(times[v])
        row = entry["variants"][v]
        row.update(step_ms=ms, step_ms_rounds=times[v], tokens_per_s=tokens / ms * 1e3,
                   mfu=flops / (ms / 1e3) / peak if peak else None)
        row["peak_gb"] = common.peak_memory_gb(fns[v])[0] if device == "cuda" else None
        row["phases"] = phase_times(variants[v], timing[0], PHASE_REPS, device)
        if device == "cuda":   # the clocks its steps hold back to back (the GPU at its power limit)
            row["clocks"] = common.clocks_while(lambda v=v: fns[v](0), CLOCK_SECONDS)
    order = sorted(variants, key=lambda v: not variants[v]["compiled"])   # compiled first: no hooks seen yet
    for v in order:
        prof = profile_step(variants[v], timing[0], device)
        dw_first = "gradient" if v.startswith("coda") else "activation"   # coda_ext's weight_grad: dzᵀ·x
        entry["variants"][v]["breakdown"] = breakdown(prof, cfg, tokens, device, dw_first)
        if getattr(args, "trace", None):   # the profiled step's timeline, for chrome://tracing or Perfetto
            entry["variants"][v]["trace"] = common.write_trace(prof, pathlib.Path(args.trace) / f"{name}_{v}.json.gz")
    entry["variants"] = {v: entry["variants"][v] for v in variants}
    variants.clear()   # the models and optimizers go before the floor's operands come
    fns.clear()
    gc_device(device)
    optimizer = min((r["breakdown"]["optimizer"] for r in entry["variants"].values()), default=0.0)
    entry["floor"] = floor_entry(measure_floor(cfg, args, device, dtype), optimizer)
    # the same parts back to back at the power limit, as the step runs them (the GPU's clocks: docs/measured.md)
    entry["floor_sustained"] = floor_entry(measure_floor(cfg, args, device, dtype, sustained=True), optimizer)
    entry["model_flops_per_step"] = flops
    return entry


def gc_device(device: str) -> None:
    import gc

    import torch

    torch._dynamo.reset()   # compiled code holds on to the models it was traced from
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


# --- report ----------------------------------------------------------------------------------------------------


def loss_gap(entry: dict, v: str) -> float | None:
    """The largest relative difference of v's loss curve from eager's."""
    rows = entry["variants"]
    if "eager" not in rows or v == "eager":
        return None
    return max(common.relative_gaps(rows[v]["loss"], rows["eager"]["loss"]))


def eager_spread(entry: dict) -> float | None:
    """The largest relative difference of eager's second loss curve from its first (None: not measured)."""
    eager = entry["variants"].get("eager", {})
    return max(common.relative_gaps(eager["loss_repeat"], eager["loss"])) if eager.get("loss_repeat") else None


def report(name: str, entry: dict) -> list[str]:
    rows, floor = entry["variants"], entry["floor"]
    lines = [(f"{name}: {entry['config']['num_hidden_layers']} layers, {entry['tokens']} tokens per step, "
              f"{entry['dtype']}, AdamW"),
             (f"  {'variant':<13}{'step ms':>9}{'tokens/s':>11}{'MFU':>7}{'peak GB':>9}{'loss first→last':>19}"
              f"{'vs eager':>10}")]
    for v, r in rows.items():
        mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "-"
        peak = f"{r['peak_gb']:.2f}" if r["peak_gb"] is not None else "-"
        gap = loss_gap(entry, v)
        lines.append(f"  {v:<13}{r['step_ms']:>9.2f}{r['tokens_per_s']:>11.0f}{mfu:>7}{peak:>9}"
                     f"{r['loss'][0]:>10.4f}→{r['loss'][-1]:<8.4f}{'' if gap is None else f'{gap:.2%}':>10}")
    for label, f in (("floor", floor), ("floor held", entry.get("floor_sustained"))):
        if f:
            lines.append(f"  {label:<13}{f['step_ms']:>9.2f}   (GEMMs {f['gemms_ms']:.2f} + attention "
                         f"{f['attention_ms']:.2f} + optimizer {f['optimizer_ms']:.2f}"
                         + ("; each part alone at boost clocks)" if label == "floor" else
                            "; each part back to back at the power limit)"))
    for v, r in rows.items():
        if "phases" in r:
            g, h = r["phases"]["gpu"], r["phases"]["host"]
            parts = ", ".join(f"{p} {g[p]:.2f} / {h[p]:.2f}" for p in PHASES)
            lines.append(f"  {v} phases (ms, device / host): {parts}; sum {sum(g.values()):.2f}")
    for v, r in rows.items():
        c = r.get("clocks") or {}
        if c.get("busy_samples"):
            lines.append(f"  {v} clocks, steps back to back: {c['mean_sm_mhz']:.0f} MHz at {c['mean_watts']:.0f} W "
                         f"(mean of {c['busy_samples']} samples above {c['min_watts']:.0f} W)")
    for v, r in rows.items():
        b = r["breakdown"]
        layer = ", ".join(f"{k} {ms:.2f}" for k, ms in b["per_layer"].items())
        head = ", ".join(f"{k} {ms:.2f}" for k, ms in b["lm_head_loss"].items())
        lines.append(f"  {v} breakdown (ms): per layer [{layer}]; LM head + loss [{head}]; optimizer "
                     f"{b['optimizer']:.2f}; embedding {b['embedding']:.2f}; other {b['other']:.2f}; "
                     f"total {b['total']:.2f}"
                     + (f"; GPU busy {b['gpu_busy_ms']:.2f}, idle {b['gpu_idle_ms']:.2f} (profiled)"
                        if "gpu_busy_ms" in b else ""))
    for v, why in entry["skipped"].items():
        lines.append(f"  {v}: skipped ({why})")
    return lines + goals(entry)


def goals(entry: dict) -> list[str]:
    rows = entry["variants"]
    out = []
    if "coda" in rows:
        best = [v for v in ("liger", "compile") if v in rows]
        if best:
            ref = min(best, key=lambda v: rows[v]["step_ms"])
            r = rows["coda"]["step_ms"] / rows[ref]["step_ms"]
            out.append(f"  goal coda <= {GOAL_VS_BEST}x the best of Liger and torch.compile ({ref}): {r:.3f}x, "
                       f"{'met' if r <= GOAL_VS_BEST else 'missed'}")
        if "coda_compile" in rows:
            r = rows["coda_compile"]["step_ms"] / rows["coda"]["step_ms"]
            out.append(f"  goal coda + torch.compile <= coda: {r:.3f}x, {'met' if r <= 1 else 'missed'}")
        if "liger" in rows and rows["coda"]["peak_gb"] is not None:
            ok = rows["coda"]["peak_gb"] <= rows["liger"]["peak_gb"]
            out.append(f"  goal peak memory <= Liger's: {rows['coda']['peak_gb']:.2f} vs {rows['liger']['peak_gb']:.2f}"
                       f" GB, {'met' if ok else 'missed'}")
        gap, spread = loss_gap(entry, "coda"), eager_spread(entry)
        if gap is not None:
            verdict = "met" if gap <= GOAL_LOSS_REL else "missed"
            if gap > GOAL_LOSS_REL and spread is not None and gap <= spread:
                verdict += ", within eager's own run-to-run spread"
            out.append(f"  goal loss within {GOAL_LOSS_REL:.1%} of eager's at every step: largest {gap:.3%}, "
                       f"{verdict}" + ("" if spread is None else f" (eager's second run: {spread:.3%})"))
    if "cold" in entry:
        c = entry["cold"]
        if "error" in c:
            out.append(f"  cold first step: failed ({c['error']})")
        else:
            out.append(f"  cold first step ({'prebuild' if c['prebuild'] else 'kernels built on first use'}, "
                       f"{c['cpus']} CPUs): {c['cold_first_step_s']:.1f} s (apply {c['apply_s']:.1f} s + first "
                       f"step {c['first_step_s']:.1f} s)")
    return out


COMPONENTS = (("layers: GEMMs", "#4c72b0"), ("layers: attention", "#bbbbbb"), ("layers: element-wise", "#dd8452"),
              ("LM head + loss", "#55a868"), ("optimizer", "#8172b3"), ("embedding + other", "#937860"))


def stacked(b: dict) -> list[float]:
    """ms of the step per COMPONENTS entry (the layers' totals)."""
    layer, n = b["per_layer"], b["layers"]
    gemm = n * sum(v for k, v in layer.items() if not k.startswith(("attention", "elementwise")))
    att = n * sum(v for k, v in layer.items() if k.startswith("attention"))
    elem = n * sum(v for k, v in layer.items() if k.startswith("elementwise"))
    return [gemm, att, elem, sum(b["lm_head_loss"].values()), b["optimizer"], b["embedding"] + b["other"]]


def plot(doc: dict, path: pathlib.Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(doc["models"])
    fig, axes = plt.subplots(2, len(models), figsize=(6.5 * len(models), 8.5), squeeze=False)
    for col, name in enumerate(models):
        entry = doc["models"][name]
        rows = entry["variants"]
        ax = axes[0][col]
        bottom = [0.0] * len(rows)
        scale = [r["step_ms"] / max(r["breakdown"]["total"], 1e-12) for r in rows.values()]
        for i, (label, color) in enumerate(COMPONENTS):
            vals = [stacked(r["breakdown"])[i] * s for r, s in zip(rows.values(), scale)]
            ax.bar(list(rows), vals, bottom=bottom, color=color, label=label)
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.axhline(entry["floor"]["step_ms"], color="k", ls="--", lw=1, label="floor (GEMMs + attention + optimizer)")
        for i, r in enumerate(rows.values()):
            peak = f"\n{r['peak_gb']:.1f} GB" if r["peak_gb"] is not None else ""
            ax.text(i, r["step_ms"], f"{r['step_ms']:.1f} ms{peak}", ha="center", va="bottom", fontsize=8)
        ax.set_title(f"{name}: {entry['config']['num_hidden_layers']} layers, {entry['tokens']} tokens")
        ax.set_ylabel("ms per training step (median; bars split by the profile)")
        ax.set_ylim(0, max(r["step_ms"] for r in rows.values()) * 1.6)
        ax.legend(fontsize=7, loc="upper left", ncol=2)
        ax = axes[1][col]
        for v, r in rows.items():
            ax.plot(range(1, len(r["loss"]) + 1), r["loss"], label=v, lw=1)
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.legend(fontsize=7)
    fig.suptitle(f"Hugging Face Llama training step ({doc['gpu']}): forward, backward, AdamW", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- command line --------------------------------------------------------------------------------------------


def _layers(values: list[str]) -> dict[str, int]:
    out = {}
    for v in values:
        name, _, n = v.rpartition("=")
        for m in ([name] if name else MODELS):
            if m not in MODELS:
                raise SystemExit(f"--layers: unknown model {m!r}; models: {list(MODELS)}")
            out[m] = int(n)
    return out


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_hf_training", description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--layers", nargs="*", default=[], metavar="[MODEL=]N",
                   help=f"decoder layers (default: llama-1b 16, llama-8b {LAYERS_8B}; a bare N sets both)")
    p.add_argument("--variants", nargs="+", default=list(DEFAULT_VARIANTS), choices=list(VARIANTS))
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--steps", type=int, default=50, help="steps of each loss curve")
    p.add_argument("--no-eager-repeat", dest="eager_repeat", action="store_false",
                   help="skip eager's second loss curve (its run-to-run spread, the floor of the loss goal)")
    p.add_argument("--rounds", type=int, default=10, help="timed interleaved rounds")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--tiny", action="store_true", help="CPU-sized configs (the wiring, not the speed)")
    p.add_argument("--compile-backend", default="inductor", help="torch.compile's backend (tests: aot_eager)")
    p.add_argument("--prebuild", action="store_true", help="build coda's kernels for the step before timing")
    p.add_argument("--cold", action="store_true",
                   help="also measure the cold first step (empty caches, in a child process)")
    p.add_argument("--cold-only", action="store_true",
                   help="measure only the cold first step, added to the model's entry of an earlier run in --out")
    p.add_argument("--cold-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help="results JSON (default: hf_training_<gpu>.json in benchmarks/results/, "
                   "<gpu> the GPU it runs on: h100, h200, …, or cpu); the PNG goes beside it")
    p.add_argument("--trace", default=None, metavar="DIR",
                   help="also write each variant's profiled step as a gzipped Chrome trace into DIR "
                        "(<model>_<variant>.json.gz)")
    p.add_argument("--fresh", action="store_true",
                   help="start --out over (else the models of an earlier run on the same GPU are kept)")
    args = p.parse_args(argv)
    if args.tiny and args.device == "cuda":
        args.batch, args.seq = min(args.batch, 2), min(args.seq, 32)
    if args.device == "cpu":
        args.tiny = True
        args.batch, args.seq = min(args.batch, 2), min(args.seq, 32)
    args.layers = _layers(args.layers)
    return args


def environment(device: str) -> dict:
    import torch

    if device == "cuda":
        return common.gpu_info()
    return {"gpu": None, "device": "cpu", "torch": torch.__version__, "commit": common.commit(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


def _argv_for_child(args) -> list[str]:
    out = ["--device", args.device, "--batch", str(args.batch), "--seq", str(args.seq), "--lr", str(args.lr)]
    out += ["--layers", *[f"{m}={n}" for m, n in args.layers.items()]] if args.layers else []
    return out + (["--tiny"] if args.tiny else []) + (["--prebuild"] if args.prebuild else [])


def main(argv=None) -> int:
    args = parse(argv)
    if args.cold_child:
        print(json.dumps(cold_first_step(args.models[0], args, args.device)), flush=True)
        return 0
    import transformers

    env = environment(args.device)
    gpu = env.get("gpu")
    out = pathlib.Path(args.out or common.results_path("hf_training", gpu=gpu or "cpu"))
    doc = {"gpu": gpu or "cpu", "env": {**env, "transformers": transformers.__version__}, "models": {}}
    earlier = json.loads(out.read_text()) if out.is_file() and not args.fresh else {}
    if earlier.get("gpu") == doc["gpu"]:   # one model per run (a device call's time limit): merged by model
        doc["models"] = {k: v for k, v in earlier.get("models", {}).items()
                         if args.cold_only or k not in args.models}
    for name in args.models:
        cold = run_cold(name, _argv_for_child(args)) if args.cold or args.cold_only else None
        if args.cold_only:
            if name not in doc["models"]:
                raise SystemExit(f"--cold-only: {out} holds no earlier run of {name} on this GPU; run it first")
            doc["models"][name]["cold"] = cold
            common.write_json(out, doc)
            print(f"{name}: cold first step {json.dumps(cold)}", flush=True)
            continue
        entry = run_model(name, args, args.device, gpu)
        if cold is not None:
            entry["cold"] = cold
        doc["models"][name] = entry
        common.write_json(out, doc)   # after every model
        print("\n".join(report(name, entry)), flush=True)
    plot(doc, out.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
