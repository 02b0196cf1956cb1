"""Train a small Llama on coda_ext's fused layers next to an eager PyTorch Llama with the same weights.

    python -m coda_ext train_demo                      # on an H100: fused bf16, 300 steps, d 1024, 4 layers
    python -m coda_ext train_demo --device cpu --impl reference --steps 5       # the CPU smoke run

No downloads: the model is built from a config and the data is generated here, a learnable
synthetic task (each token follows a fixed random successor of the previous one with probability
0.9, else a uniformly random token: the best loss is the printed entropy floor). Both models
train on the same batches with AdamW from the same initial weights; printed per model: median step
time, tokens/s and peak memory (CUDA), and whether the two loss curves match.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

import torch

from ..models import CodaLlamaForCausalLM, EagerLlamaForCausalLM, LlamaConfig, training_kernels
from ..models.functions import resolve_impl

P_FOLLOW = 0.9   # probability that a token is its predecessor's successor
# Loss-curve agreement, relative to the eager loss: (first 10 steps, mean of the last 10 % of steps). bf16/fp16
# losses of two correct implementations differ by a few roundings of 2^-8 per step and drift apart
# during training; fp32 ones by accumulation order only.
TOLERANCE = {torch.float32: (1e-4, 0.01), torch.bfloat16: (0.03, 0.05), torch.float16: (0.01, 0.05)}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_args(argv=None) -> argparse.Namespace:
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(prog="python -m coda_ext train_demo", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--device", default="cuda" if cuda else "cpu")
    p.add_argument("--dtype", choices=DTYPES, default=None, help="default: bfloat16 on CUDA, float32 elsewhere")
    p.add_argument("--impl", choices=("auto", "fused", "reference"), default="auto",
                   help="coda layers: fused kernels (SM90 GPU), fp32 references, or auto (fused on CUDA)")
    p.add_argument("--batch", type=int, default=None, help="default: 8 on CUDA, 4 elsewhere")
    p.add_argument("--seq", type=int, default=None, help="default: 1024 on CUDA, 128 elsewhere")
    p.add_argument("--compare-eager", action=argparse.BooleanOptionalAction, default=True,
                   help="also train the eager PyTorch Llama and compare (default: on)")
    p.add_argument("--hidden", type=int, default=None, help="default: 1024 on CUDA, 256 elsewhere")
    p.add_argument("--layers", type=int, default=None, help="default: 4 on CUDA, 2 elsewhere")
    p.add_argument("--heads", type=int, default=None, help="query heads, default hidden / 64 (head_dim 64)")
    p.add_argument("--kv-heads", type=int, default=None, help="default: heads / 4, at least 1")
    p.add_argument("--ffn", type=int, default=None, help="default: 3 × hidden")
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    on_gpu = args.device.startswith("cuda")
    for name, gpu, cpu in (("batch", 8, 4), ("seq", 1024, 128), ("hidden", 1024, 256), ("layers", 4, 2)):
        if getattr(args, name) is None:
            setattr(args, name, gpu if on_gpu else cpu)
    args.heads = args.heads or max(1, args.hidden // 64)
    args.kv_heads = args.kv_heads or max(1, args.heads // 4)
    args.dtype = DTYPES[args.dtype or ("bfloat16" if on_gpu else "float32")]
    return args


def model_config(args) -> LlamaConfig:
    return LlamaConfig(hidden_size=args.hidden, intermediate_size=args.ffn or 3 * args.hidden,
                       num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                       num_hidden_layers=args.layers, vocab_size=args.vocab, rope_theta=10000.0, rms_norm_eps=1e-5)


def make_batches(steps: int, batch: int, seq: int, vocab: int, seed: int) -> torch.Tensor:
    """(steps, batch, seq) token ids of the synthetic task."""
    gen = torch.Generator().manual_seed(seed)
    successor = torch.randperm(vocab, generator=gen)
    ids = torch.empty(steps, batch, seq, dtype=torch.long)
    ids[..., 0] = torch.randint(vocab, (steps, batch), generator=gen)
    follow = torch.rand(steps, batch, seq, generator=gen) < P_FOLLOW
    noise = torch.randint(vocab, (steps, batch, seq), generator=gen)
    for t in range(1, seq):
        ids[..., t] = torch.where(follow[..., t], successor[ids[..., t - 1]], noise[..., t])
    return ids


def entropy_floor(vocab: int) -> float:
    """The task's best mean loss per predicted token (nats)."""
    p_hit = P_FOLLOW + (1 - P_FOLLOW) / vocab
    p_miss = (1 - P_FOLLOW) / vocab
    return -(p_hit * math.log(p_hit) + (vocab - 1) * p_miss * math.log(p_miss))


class Progress:
    """A plain-text progress bar: redrawn in place on a terminal, a line per 10 % otherwise."""

    def __init__(self, total: int, label: str, width: int = 30, stream=sys.stdout):
        self.total, self.label, self.width, self.stream = total, label, width, stream
        self.tty = stream.isatty()
        self.last_decile = -1

    def update(self, done: int, note: str) -> None:
        decile = 10 * done // self.total
        if not self.tty and decile == self.last_decile and done != self.total:
            return
        self.last_decile = decile
        filled = self.width * done // self.total
        line = f"{self.label:>6} [{'#' * filled}{'.' * (self.width - filled)}] {done}/{self.total} {note}"
        self.stream.write(("\r" + line) if self.tty else line + "\n")
        if self.tty and done == self.total:
            self.stream.write("\n")
        self.stream.flush()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train(model: torch.nn.Module, batches: torch.Tensor, args, label: str) -> dict:
    """Trains model on every batch; returns losses, step times (s) and the step's peak memory (bytes)."""
    device = torch.device(args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    model.train()
    progress = Progress(len(batches), label)
    losses, times = [], []
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    for i, ids in enumerate(batches):
        ids = ids.to(device, non_blocking=True)
        _sync(device)
        t0 = time.perf_counter()
        loss = model(ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        times.append(time.perf_counter() - t0)
        progress.update(i + 1, f"loss {losses[-1]:.4f}  {1e3 * times[-1]:.1f} ms/step")
    peak = torch.cuda.max_memory_allocated(device) - base if device.type == "cuda" else None
    return {"losses": losses, "times": times, "peak": peak}


def compare(coda: list[float], eager: list[float], dtype: torch.dtype) -> tuple[bool, str]:
    """Whether the loss curves match (TOLERANCE), and the figures."""
    early_tol, late_tol = TOLERANCE[dtype]
    n = min(10, len(coda))
    early = max(abs(a - b) / max(abs(b), 1e-6) for a, b in zip(coda[:n], eager[:n]))
    k = max(1, len(coda) // 10)
    late_c, late_e = statistics.fmean(coda[-k:]), statistics.fmean(eager[-k:])
    late = abs(late_c - late_e) / max(abs(late_e), 1e-6)
    ok = early <= early_tol and late <= late_tol
    return ok, (f"first {n} steps: max relative difference {early:.2e} (tolerance {early_tol:g}); "
                f"mean of the last {k}: {late_c:.4f} vs {late_e:.4f}, {100 * late:.2f} % (tolerance "
                f"{100 * late_tol:g} %)")


def summary(results: dict, tokens: int) -> str:
    warm = 3   # first steps: kernel loads, allocator warm-up
    rows = [("", *results), ("median step (ms)",), ("tokens/s",), ("peak memory",), ("final loss",)]
    for r in results.values():
        t = statistics.median(r["times"][warm:] or r["times"])
        rows[1] += (f"{1e3 * t:.2f}",)
        rows[2] += (f"{tokens / t:,.0f}",)
        rows[3] += ("n/a (CPU)" if r["peak"] is None else f"{r['peak'] / 2**20:.1f} MiB",)
        rows[4] += (f"{r['losses'][-1]:.4f}",)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths)))
                     for row in rows)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    cfg = model_config(args)
    coda = CodaLlamaForCausalLM(cfg, impl=args.impl).to(device=device, dtype=args.dtype)
    impl = resolve_impl(args.impl, torch.empty(0, device=device))
    tokens = args.batch * args.seq
    print(f"Llama: d {cfg.hidden_size}, {cfg.num_hidden_layers} layers, {cfg.num_attention_heads}/"
          f"{cfg.num_key_value_heads} heads of {cfg.head_dim}, ffn {cfg.intermediate_size}, vocab {cfg.vocab_size}; "
          f"batch {args.batch} x seq {args.seq}; {args.dtype} on {device}; coda impl {impl}")
    if impl == "fused":
        from ..runtime import prebuild

        items = training_kernels(cfg, tokens, str(args.dtype).removeprefix("torch."))
        print(f"building {len(items)} kernels in parallel (cached after the first run) ...", flush=True)
        prebuild(items, jobs=os.cpu_count())
    batches = make_batches(args.steps, args.batch, args.seq, args.vocab, args.seed)
    print(f"task: best possible loss {entropy_floor(args.vocab):.4f} (uniform guess {math.log(args.vocab):.4f})")
    results = {}
    if args.compare_eager:
        eager = EagerLlamaForCausalLM(cfg).to(device=device, dtype=args.dtype)
        eager.load_state_dict(coda.state_dict())   # the same weights, through Hugging Face names
    results[f"coda ({impl})"] = train(coda, batches, args, "coda")
    if args.compare_eager:
        results["eager"] = train(eager, batches, args, "eager")
    print(summary(results, tokens))
    if impl == "reference":
        print("(impl reference runs the fp32 references of the fused ops: it checks the wiring, not the speed)")
    if not args.compare_eager:
        return 0
    ok, detail = compare(results[f"coda ({impl})"]["losses"], results["eager"]["losses"], args.dtype)
    print(f"loss curves {'match' if ok else 'DIFFER'}: {detail}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
