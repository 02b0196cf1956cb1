"""A Hugging Face Llama's training step on several GPUs under FSDP2: eager, torch.compile, Liger and
coda_ext, each sharded by fully_shard, launched by torchrun.

    torchrun --nproc-per-node 8 -m benchmarks.bench_distributed                    # both models, every variant
    torchrun --nproc-per-node 2 -m benchmarks.bench_distributed --models llama-8b --layers llama-8b=8
    python -m benchmarks.bench_distributed                                           # one GPU (the scaling base)
    torchrun --nproc-per-node 2 -m benchmarks.bench_distributed --device cpu --backend gloo --steps 3
                                                                                     # the wiring on CPUs (tiny)

Models: bench_hf_training's (transformers LlamaForCausalLM from a config, random weights, no
downloads): Llama-3.2-1B-like (16 layers) and Llama-3.1-8B-like (LAYERS_8B layers by default, as many
as `--layers` asks and fit). Every rank builds the same weights (seed 0, fp32), then the variant's
change, then FSDP2: fully_shard on every decoder layer and the root, MixedPrecisionPolicy with bf16
parameters and fp32 gradient reduction (fp32 throughout on CPUs). `--batch` sequences of `--seq`
tokens per GPU (global batch = batch x GPUs, the rows of one synthetic batch split by rank), AdamW.

Variants: eager; compile (torch.compile per decoder layer before sharding, as torchtitan does);
liger (liger_kernel's apply_liger_kernel_to_llama; skipped with the reason when it does not import;
its module-level patches of transformers are undone after its run); coda (coda_ext.hf.apply_coda_to_llama);
coda_compile (coda, then torch.compile per layer). `--checkpointing`: activation checkpointing of
every layer (transformers' gradient_checkpointing_enable, non-reentrant) in every variant.

Variants run one after another (each holds its own sharded model and optimizer state; one at a time
leaves the GPU's memory to the model): the --steps steps of the loss curve (also the warm-up and
torch.compile's compilation), then --rounds timed steps. Per model and variant: the loss of each step
(the mean over the global batch); the step time (each round the slowest rank's, between a barrier
and the synchronized end of the optimizer step; the median over rounds); tokens/s per GPU; MFU (model
FLOPs of a rank's tokens as bench_hf_training counts them, over the GPU's dense bf16 peak); peak
memory per GPU (the largest over ranks of torch.cuda.max_memory_allocated in the timed steps: the
sharded weights, gradients, optimizer state, gathered layers and activations).

Results: --out (default: the distributed_<gpu> JSON in benchmarks/results/, <gpu> as h100 or h200), one
entry per GPU count under "runs" (runs with other GPU counts are kept: scaling from 1 to 2, 4, 8 GPUs
is several runs into one file; --fresh starts over) and a PNG beside it: tokens/s per GPU and peak
memory per GPU against the GPU count, and the loss curves. The report prints the goals of issue
"Beyond one GPU": coda's tokens/s per GPU against Liger's and torch.compile's, its scaling
efficiency against its own single-GPU run, peak memory against Liger's, and the loss curve against
the single-GPU run with the same global batch.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import pathlib
import statistics
import sys
import time

from benchmarks import bench_hf_training as hf
from benchmarks import common

VARIANTS = ("eager", "compile", "liger", "coda", "coda_compile")
LAYERS_8B = 8
GOAL_VS_LIGER = 1.10
GOAL_SCALING = 0.90
GOAL_LOSS_REL = 0.005


# --- process group -------------------------------------------------------------------------------------------


def init(backend: str, device: str):
    """The process group (torchrun's environment, or a group of one when run without torchrun) and
    this rank's device."""
    import torch
    import torch.distributed as dist

    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device == "cuda":
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
        dist.init_process_group(backend, device_id=dev, timeout=datetime.timedelta(minutes=10))
    else:
        dev = torch.device("cpu")
        dist.init_process_group(backend, timeout=datetime.timedelta(minutes=5))
    return dev


gpu_tag = common.gpu_tag   # moved to benchmarks.common (results_path); kept here for its callers


# --- one variant -----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def variant_patches(variant: str):
    """Liger's module-level patches of transformers' modeling_llama, undone when its run ends."""
    if variant != "liger":
        yield
        return
    from transformers.models.llama import modeling_llama

    before = dict(vars(modeling_llama))
    try:
        yield
    finally:
        for k, v in list(vars(modeling_llama).items()):
            if before.get(k, object()) is not v:
                if k in before:
                    setattr(modeling_llama, k, before[k])
                else:
                    delattr(modeling_llama, k)


def build(name: str, variant: str, cfg, args, dev, dtype):
    """The variant's model, sharded (FSDP2), and its optimizer."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model = hf.base_model(cfg, dev, torch.float32)   # seed 0: the same weights on every rank and in every variant
    if variant == "liger":
        from liger_kernel.transformers import apply_liger_kernel_to_llama

        apply_liger_kernel_to_llama(model=model)
    if variant.startswith("coda"):
        from coda_ext.hf import apply_coda_to_llama

        apply_coda_to_llama(model, impl="auto" if dev.type == "cuda" else "reference")
    if args.checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if variant.endswith("compile"):   # each layer wrapped, then sharded: torchtitan's order
        layers = model.model.layers
        for i, layer in enumerate(layers):
            layers[i] = torch.compile(layer, backend=args.compile_backend)
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=dev.type == "cuda")
    return model, opt


def rank_batches(cfg, args, steps: int, seed: int, dev) -> list:
    """This rank's rows of `steps` global batches (batch x world sequences each)."""
    import torch.distributed as dist

    from coda_ext.tools.train_demo import make_batches

    world, rank = dist.get_world_size(), dist.get_rank()
    ids = make_batches(steps, args.batch * world, args.seq, cfg.vocab_size, seed)
    return [t[rank * args.batch:(rank + 1) * args.batch].to(dev) for t in ids]


def step(model, opt, ids):
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def global_mean(value: float, dev) -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64, device=dev)
    dist.all_reduce(t)
    return t.item() / dist.get_world_size()


def slowest(value: float, dev) -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def run_variant(name: str, variant: str, cfg, args, dev, dtype) -> dict:
    import torch
    import torch.distributed as dist

    cuda = dev.type == "cuda"
    with variant_patches(variant):
        model, opt = build(name, variant, cfg, args, dev, dtype)
        losses = [global_mean(float(step(model, opt, ids)), dev) for ids in rank_batches(cfg, args, args.steps, 1, dev)]
        timing = rank_batches(cfg, args, 2, 2, dev)
        for i in range(args.warmup):
            step(model, opt, timing[i % 2])
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        rounds = []
        for i in range(args.rounds):
            dist.barrier()
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            step(model, opt, timing[i % 2])
            if cuda:
                torch.cuda.synchronize()
            rounds.append(slowest((time.perf_counter() - start) * 1e3, dev))
        peak = slowest(torch.cuda.max_memory_allocated() / 1e9, dev) if cuda else None
    del model, opt
    hf.gc_device(dev.type)
    ms = statistics.median(rounds)
    tokens = args.batch * args.seq
    flops, top = hf.step_flops(cfg, args.batch, args.seq), hf.peak_flops(args.gpu)
    return {"loss": losses, "step_ms": ms, "step_ms_rounds": rounds, "tokens_per_s_per_gpu": tokens / ms * 1e3,
            "mfu": flops / (ms / 1e3) / top if top else None, "peak_gb_per_gpu": peak}


def run_model(name: str, args, dev) -> dict:
    import torch
    import torch.distributed as dist

    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    layers = args.layers.get(name) or (LAYERS_8B if name == "llama-8b" and not args.tiny else None)
    cfg = hf.hf_config(name, layers, args.tiny)
    world = dist.get_world_size()
    entry = {"config": {k: getattr(cfg, k) for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                                     "num_key_value_heads", "head_dim", "vocab_size",
                                                     "num_hidden_layers", "tie_word_embeddings")},
             "batch_per_gpu": args.batch, "seq": args.seq, "global_batch": args.batch * world,
             "tokens_per_gpu": args.batch * args.seq, "steps": args.steps, "optimizer": "AdamW",
             "param_dtype": str(dtype).split(".")[-1], "reduce_dtype": "float32",
             "checkpointing": args.checkpointing, "variants": {}, "skipped": {}}
    for v in args.variants:
        why = hf.skip_reason(v)
        if why:
            entry["skipped"][v] = why
            continue
        entry["variants"][v] = run_variant(name, v, cfg, args, dev, dtype)
        row = entry["variants"][v]
        if dist.get_rank() == 0:
            print(f"{name} {v} on {world}: loss {row['loss'][0]:.4f} -> {row['loss'][-1]:.4f}, "
                  f"{row['step_ms']:.1f} ms", file=sys.stderr, flush=True)
    return entry


# --- results, report, plot -----------------------------------------------------------------------------------------


def merge(earlier: dict, doc: dict, world: int, run: dict) -> dict:
    """doc with earlier's runs of the same GPU kept, this run's models replacing theirs at `world` GPUs."""
    if earlier.get("gpu") == doc["gpu"]:
        doc["runs"] = earlier.get("runs", {})
    old = doc["runs"].get(str(world), {}).get("models", {})
    doc["runs"][str(world)] = {**run, "models": {**old, **run["models"]}}
    return doc


def goals(doc: dict, world: int, name: str) -> list[str]:
    """The issue's goals for model `name` at `world` GPUs, from the runs in doc."""
    runs = doc["runs"]
    rows = runs[str(world)]["models"][name]["variants"]
    out = []
    if "coda" not in rows:
        return out
    coda = rows["coda"]
    for ref, goal in (("liger", GOAL_VS_LIGER), ("compile", 1.0)):
        if ref in rows:
            r = coda["tokens_per_s_per_gpu"] / rows[ref]["tokens_per_s_per_gpu"]
            out.append(f"  goal coda tokens/s per GPU >= {goal:.2f}x {ref}'s: {r:.3f}x, "
                       f"{'met' if r >= goal else 'missed'}")
    one = runs.get("1", {}).get("models", {}).get(name, {})
    if world > 1 and "coda" in one.get("variants", {}):
        e = coda["tokens_per_s_per_gpu"] / one["variants"]["coda"]["tokens_per_s_per_gpu"]
        out.append(f"  goal coda scaling efficiency (tokens/s per GPU vs 1 GPU) >= {GOAL_SCALING:.0%}: {e:.1%}, "
                   f"{'met' if e >= GOAL_SCALING else 'missed'}")
    if "liger" in rows and coda["peak_gb_per_gpu"] is not None:
        ok = coda["peak_gb_per_gpu"] <= rows["liger"]["peak_gb_per_gpu"]
        out.append(f"  goal peak memory per GPU <= Liger's: {coda['peak_gb_per_gpu']:.2f} vs "
                   f"{rows['liger']['peak_gb_per_gpu']:.2f} GB, {'met' if ok else 'missed'}")
    this = runs[str(world)]["models"][name]
    if world > 1 and "coda" in one.get("variants", {}) and one.get("global_batch") == this["global_batch"]:
        base = one["variants"]["coda"]["loss"]
        gap = max(abs(a - b) / abs(b) for a, b in zip(coda["loss"], base))
        out.append(f"  goal loss within {GOAL_LOSS_REL:.1%} of the 1-GPU run (global batch {this['global_batch']}): "
                   f"largest {gap:.3%} over {min(len(base), len(coda['loss']))} steps, "
                   f"{'met' if gap <= GOAL_LOSS_REL else 'missed'}")
    return out


def report(doc: dict, world: int, name: str) -> list[str]:
    entry = doc["runs"][str(world)]["models"][name]
    lines = [(f"{name}: {entry['config']['num_hidden_layers']} layers on {world} x {doc['gpu']}, FSDP2 "
              f"({entry['param_dtype']} params, fp32 reduce), {entry['tokens_per_gpu']} tokens per GPU"),
             f"  {'variant':<13}{'step ms':>9}{'tokens/s/GPU':>14}{'MFU':>7}{'peak GB/GPU':>13}{'loss first→last':>19}"]
    for v, r in entry["variants"].items():
        mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "-"
        peak = f"{r['peak_gb_per_gpu']:.2f}" if r["peak_gb_per_gpu"] is not None else "-"
        lines.append(f"  {v:<13}{r['step_ms']:>9.2f}{r['tokens_per_s_per_gpu']:>14.0f}{mfu:>7}{peak:>13}"
                     f"{r['loss'][0]:>10.4f}→{r['loss'][-1]:<8.4f}")
    lines += [f"  {v}: skipped ({why})" for v, why in entry["skipped"].items()]
    return lines + goals(doc, world, name)


def plot(doc: dict, path: pathlib.Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    worlds = sorted(int(w) for w in doc["runs"])
    models = sorted({m for r in doc["runs"].values() for m in r["models"]})
    fig, axes = plt.subplots(3, len(models), figsize=(6 * len(models), 11), squeeze=False)
    for col, name in enumerate(models):
        have = [w for w in worlds if name in doc["runs"][str(w)]["models"]]
        variants = sorted({v for w in have for v in doc["runs"][str(w)]["models"][name]["variants"]},
                          key=VARIANTS.index)
        for row, key, label in ((0, "tokens_per_s_per_gpu", "tokens/s per GPU"),
                                (1, "peak_gb_per_gpu", "peak GB per GPU (not measured on CPUs)")):
            ax = axes[row][col]
            for v in variants:
                pts = [(w, doc["runs"][str(w)]["models"][name]["variants"][v][key]) for w in have
                       if v in doc["runs"][str(w)]["models"][name]["variants"]]
                pts = [(w, y) for w, y in pts if y is not None]
                if pts:
                    ax.plot(*zip(*pts), marker="o", label=v)
            ax.set_xscale("log", base=2)
            ax.set_xticks(have, [str(w) for w in have])
            ax.set_xlabel("GPUs")
            ax.set_ylabel(label)
            if ax.lines:
                ax.legend(fontsize=7)
        ax = axes[2][col]
        top = have[-1]
        for v, r in doc["runs"][str(top)]["models"][name]["variants"].items():
            ax.plot(range(1, len(r["loss"]) + 1), r["loss"], label=f"{v}, {top} GPUs", lw=1)
        first, last = (doc["runs"][str(w)]["models"][name] for w in (have[0], top))
        if top != have[0] and "coda" in first["variants"] and first["global_batch"] == last["global_batch"]:
            base = first["variants"]["coda"]["loss"]
            ax.plot(range(1, len(base) + 1), base, "k--", lw=1, label=f"coda, {have[0]} GPU(s), same global batch")
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.legend(fontsize=7)
        axes[0][col].set_title(name)
    fig.suptitle(f"Llama training step under FSDP2 ({doc['gpu']}): forward, backward, AdamW", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- command line -------------------------------------------------------------------------------------------------


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="torchrun --nproc-per-node N -m benchmarks.bench_distributed",
                                description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(hf.MODELS), choices=list(hf.MODELS))
    p.add_argument("--layers", nargs="*", default=[], metavar="[MODEL=]N",
                   help=f"decoder layers (default: llama-1b 16, llama-8b {LAYERS_8B}; a bare N sets both)")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--batch", type=int, default=8, help="sequences per GPU")
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--steps", type=int, default=50, help="steps of each loss curve")
    p.add_argument("--rounds", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--checkpointing", action="store_true", help="activation checkpointing of every layer")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--backend", default=None, help="torch.distributed backend (default: nccl on cuda, gloo on cpu)")
    p.add_argument("--tiny", action="store_true", help="CPU-sized configs (the wiring, not the speed)")
    p.add_argument("--compile-backend", default="inductor", help="torch.compile's backend (tests: aot_eager)")
    p.add_argument("--out", default=None, help="results JSON (default: distributed_<gpu>.json in benchmarks/results/)")
    p.add_argument("--fresh", action="store_true", help="start --out over (else runs of other GPU counts are kept)")
    args = p.parse_args(argv)
    args.backend = args.backend or ("nccl" if args.device == "cuda" else "gloo")
    if args.device == "cpu":
        args.tiny = True
    if args.tiny:
        args.batch, args.seq = min(args.batch, 2), min(args.seq, 32)
    args.layers = hf._layers(args.layers)
    return args


def main(argv=None) -> int:
    args = parse(argv)
    import torch.distributed as dist
    import transformers

    dev = init(args.backend, args.device)
    rank, world = dist.get_rank(), dist.get_world_size()
    env = hf.environment(args.device)
    args.gpu = env.get("gpu")
    run = {"world_size": world, "backend": args.backend, "models": {}}
    for name in args.models:
        run["models"][name] = run_model(name, args, dev)
    if rank == 0:
        out = pathlib.Path(args.out or common.results_path("distributed", gpu=args.gpu or "cpu"))
        doc = {"gpu": args.gpu or "cpu", "env": {**env, "transformers": transformers.__version__}, "runs": {}}
        earlier = json.loads(out.read_text()) if out.is_file() and not args.fresh else {}
        doc = merge(earlier, doc, world, run)
        common.write_json(out, doc)
        for name in args.models:
            print("\n".join(report(doc, world, name)), flush=True)
        plot(doc, out.with_suffix(".png"))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
