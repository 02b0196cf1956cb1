"""Times the element-wise passes torch.compile generates for the ready ops (the RoPE backward +
ZdZ, the input RMSNorm) at the Llama 1B-like and 8B training shapes, against the same math compiled
with every size dynamic (dynamic=True) and against a copy of the input (the HBM floor's scale):

    python -m benchmarks.bench_elementwise [--shapes 1B 8B]

Prints one line per pass and shape with the max errors against the fp32 references. Medians of 30
launches, each after a 1 ms GPU wait (host overhead stays out of the timed span). Needs a GPU.
"""
from __future__ import annotations

import argparse
import statistics

from benchmarks import common
from tests.helpers import rand

SHAPES = {"1B": (32768, 32, 8, 64, 2048), "8B": (8192, 32, 8, 128, 4096)}   # M, heads, kv heads, head_dim, d


def bench(fn, reps: int = 30) -> float:
    """Median microseconds of fn (L2 warm, a queued GPU wait before each launch: common.time_interleaved)."""
    times = common.time_interleaved({"fn": lambda i: fn()}, reps, warmup=3, flush_l2=False)["fn"]
    return statistics.median(times) * 1e3


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    args = p.parse_args(argv)
    import torch

    import coda_ext.ops as ops
    from coda_ext.ops import norm_input, rope_backward

    all_dynamic = {"rope": torch.compile(rope_backward._math, dynamic=True, fullgraph=True),
                   "norm": torch.compile(norm_input._math, dynamic=True, fullgraph=True)}
    for name in args.shapes:
        M, H, KV, hd, d = SHAPES[name]
        N = (H + 2 * KV) * hd
        g = rand.generator(name, device="cuda")
        def r(*s):
            return rand.randn(g, *s, dtype=torch.bfloat16)
        dqkv, qkv, x, w = r(M, N), r(M, N), r(M, d), r(d)
        pos = torch.arange(M, device="cuda") % 8192
        freqs = ops.rope_frequencies(hd, H, KV, device="cuda")
        ref_dz, ref_zdz = rope_backward.reference(dqkv, qkv, pos, freqs, H, KV)
        dz, zdz = ops.qkv_rope_backward(dqkv, qkv, pos, freqs, H, KV)
        err = ((dz.float() - ref_dz).abs().max().item(), ((zdz - ref_zdz).abs().max() / ref_zdz.abs().max()).item())
        cos, sin = rope_backward._cos_sin(pos, freqs, hd)
        n_rot = (H + KV) * hd
        t = (bench(lambda: ops.qkv_rope_backward(dqkv, qkv, pos, freqs, H, KV)),
             bench(lambda: (rope_backward._cos_sin(pos, freqs, hd), all_dynamic["rope"](dqkv, qkv, cos, sin, n_rot))),
             bench(lambda: dqkv.clone()))
        print(f"{name} {M}x{N} qkv_rope_backward: {t[0]:.1f} us (every size dynamic: {t[1]:.1f} us; a copy of dqkv "
              f"{t[2]:.1f} us); max err dz {err[0]:.2e}, zdz (relative) {err[1]:.2e}", flush=True)
        h, rstd = ops.rms_norm_input(x, w, 1e-6)
        ref_h, ref_rstd = norm_input.reference(x, w, 1e-6)
        err = ((h.float() - ref_h).abs().max().item(), ((rstd - ref_rstd).abs() / ref_rstd).max().item())
        t = (bench(lambda: ops.rms_norm_input(x, w, 1e-6)), bench(lambda: all_dynamic["norm"](x, w, 1e-6)),
             bench(lambda: x.clone()))
        print(f"{name} {M}x{d} rms_norm_input: {t[0]:.1f} us (every size dynamic: {t[1]:.1f} us; a copy of x "
              f"{t[2]:.1f} us); max err h {err[0]:.2e}, rstd (relative) {err[1]:.2e}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
