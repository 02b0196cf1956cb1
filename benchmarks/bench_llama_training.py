"""A Llama layer's training step on one GPU (H100, H200): coda_ext against eager PyTorch, torch.compile and
Liger-Kernel, with the floor the non-attention part cannot beat.

    python -m benchmarks.bench_llama_training [--cases layer-1b layer-8b lm-head] [--reps 20]

Cases: one forward + backward of a Llama-3-1B-like layer (d 2048, 32 Q / 8 KV heads, head_dim 64,
F 8192, batch 4 x seq 8192) and of a Llama-3-8B layer (d 4096, head_dim 128, F 14336, 1 x 8192);
the LM head + cross-entropy forward + backward (M 8192, d 4096, V 128256).
Per case and variant: step time (median of interleaved rounds, L2 flushed, common.py), peak memory
of one step beyond what was allocated before it (with and without the gradients it returns); per
layer also attention alone (SDPA forward + backward at the layer's shape, the same call in every
variant), the non-attention part (step − attention) and the GEMM floor (the bare cuBLAS GEMMs of the
layer's linears: forward, dX and dW of each, timed the same way and summed). Writes
results/llama_training_<gpu>.json (--out; <gpu> the GPU it runs on: h100, h200, …) and the .png beside it.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import statistics
import sys

from benchmarks import common
from tests.helpers import rand


@dataclasses.dataclass(frozen=True)
class Shape:
    d: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    batch: int
    seq: int
    theta: float = 500000.0
    eps: float = 1e-5


LAYERS = {
    "layer-1b": Shape(2048, 32, 8, 64, 8192, 4, 8192),
    "layer-8b": Shape(4096, 32, 8, 128, 14336, 1, 8192),
}
LM_HEAD = (8192, 4096, 128256)   # M, d, V


# --- the eager PyTorch layer (Hugging Face Llama conventions), also compiled and Liger-patched ------------


def attention(q, k, v):
    """q (B, H, S, hd), k/v (B, KV, S, hd): causal SDPA with grouped KV heads (every variant)."""
    import torch.nn.functional as F

    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def eager_layer(s: Shape, device, dtype, liger: bool = False):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(s.d))

        def forward(self, x):
            h = x.float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + s.eps)
            return self.weight * h.to(x.dtype)

    def rotate_half(t):
        a, b = t.chunk(2, dim=-1)
        return torch.cat([-b, a], dim=-1)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            if liger:
                from liger_kernel.transformers.rms_norm import LigerRMSNorm
                self.input_layernorm, self.post_attention_layernorm = LigerRMSNorm(s.d, s.eps), LigerRMSNorm(s.d, s.eps)
            else:
                self.input_layernorm, self.post_attention_layernorm = RMSNorm(), RMSNorm()
            hd = s.head_dim
            self.q_proj = nn.Linear(s.d, s.n_heads * hd, bias=False)
            self.k_proj = nn.Linear(s.d, s.n_kv_heads * hd, bias=False)
            self.v_proj = nn.Linear(s.d, s.n_kv_heads * hd, bias=False)
            self.o_proj = nn.Linear(s.n_heads * hd, s.d, bias=False)
            self.gate_proj = nn.Linear(s.d, s.ffn, bias=False)
            self.up_proj = nn.Linear(s.d, s.ffn, bias=False)
            self.down_proj = nn.Linear(s.ffn, s.d, bias=False)

        def forward(self, x, cos, sin):
            B, S, _ = x.shape
            hd = s.head_dim
            h = self.input_layernorm(x)
            q = self.q_proj(h).view(B, S, s.n_heads, hd).transpose(1, 2)
            k = self.k_proj(h).view(B, S, s.n_kv_heads, hd).transpose(1, 2)
            v = self.v_proj(h).view(B, S, s.n_kv_heads, hd).transpose(1, 2)
            if liger:
                from liger_kernel.transformers.rope import liger_rotary_pos_emb
                q, k = liger_rotary_pos_emb(q, k, cos, sin)
            else:
                c, sn = cos[:, None], sin[:, None]
                q, k = q * c + rotate_half(q) * sn, k * c + rotate_half(k) * sn
            a = attention(q, k, v).transpose(1, 2).reshape(B, S, s.n_heads * hd)
            x = x + self.o_proj(a)
            h = self.post_attention_layernorm(x)
            if liger:
                from liger_kernel.ops import LigerSiLUMulFunction
                m = LigerSiLUMulFunction.apply(self.gate_proj(h), self.up_proj(h), 1.0, 1.0)
            else:
                m = F.silu(self.gate_proj(h)) * self.up_proj(h)
            return x + self.down_proj(m)

    layer = Layer().to(device=device, dtype=dtype)
    for p in layer.parameters():
        if p.dim() == 2:
            nn.init.normal_(p, std=p.shape[1] ** -0.5)
    return layer


def rope_tables(s: Shape, device, dtype):
    import torch

    inv = 1.0 / s.theta ** (torch.arange(0, s.head_dim, 2, dtype=torch.float64, device=device) / s.head_dim)
    ang = torch.arange(s.seq, dtype=torch.float64, device=device)[:, None] * inv
    emb = torch.cat([ang, ang], dim=-1)
    return emb.cos().to(dtype)[None], emb.sin().to(dtype)[None]


def config_of(s: Shape, vocab: int = 128256):
    from coda_ext.models import LlamaConfig

    return LlamaConfig(hidden_size=s.d, intermediate_size=s.ffn, num_attention_heads=s.n_heads,
                       num_key_value_heads=s.n_kv_heads, head_dim=s.head_dim, rms_norm_eps=s.eps,
                       rope_theta=s.theta, vocab_size=vocab, num_hidden_layers=1)


def coda_layer(s: Shape, eager, device, dtype):
    """The coda_ext layer with the eager layer's weights (loaded through its Hugging Face names)."""
    from coda_ext.models import CodaLlamaDecoderLayer

    layer = CodaLlamaDecoderLayer(config_of(s), impl="fused").to(device=device, dtype=dtype)
    layer.load_state_dict(eager_state_dict(eager))
    return layer


def build_items() -> list:
    """Every kernel the coda variants launch (python -m coda_ext prebuild benchmarks/bench_llama_training.py)."""
    from coda_ext import tuning
    from coda_ext.models.functions import training_kernels
    from coda_ext.ops import lm_head_ce
    from coda_ext.runtime import auto_items

    items = [i for s in LAYERS.values()
             for i in training_kernels(config_of(s), s.batch * s.seq, lm_head=False, sms=tuning.DEFAULT_SMS)]
    M, d, V = LM_HEAD
    items += auto_items(lm_head_ce.gemms(M, V, d, scaled=False), "bfloat16", tuning.DEFAULT_SMS)
    return list({(g.build().digest(), dt, c.tag): (g, dt, c) for g, dt, c in items}.values())


def eager_state_dict(eager) -> dict:
    """The eager layer's weights under Hugging Face's per-layer names."""
    names = {"q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj",
             "o_proj": "self_attn.o_proj", "gate_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj",
             "down_proj": "mlp.down_proj"}
    out = {}
    for k, v in eager.state_dict().items():
        mod = k.split(".")[0]
        out[k.replace(mod, names[mod], 1) if mod in names else k] = v
    return out


# --- timing -----------------------------------------------------------------------------------------------


def step_fn(module_call, inputs, params):
    """fn(i): one forward + backward on input set i; gradients returned, never accumulated."""
    import torch

    def fn(i):
        x, g = inputs[i]
        out = module_call(x)
        return torch.autograd.grad(out, [x] + params, g)
    return fn


def gemm_floor_fns(s: Shape, device, dtype) -> dict:
    """The bare cuBLAS GEMMs of one layer's linears: forward, dX and dW of each."""
    M = s.batch * s.seq
    hd = s.head_dim
    linears = {"qkv": ((s.n_heads + 2 * s.n_kv_heads) * hd, s.d), "o": (s.d, s.n_heads * hd),
               "gate_up": (2 * s.ffn, s.d), "down": (s.d, s.ffn)}
    fns = {}
    gen = rand.generator("gemm floor", M, device=device)
    for name, (N, K) in linears.items():
        sets = [(rand.randn(gen, M, K, dtype=dtype), rand.randn(gen, N, K, dtype=dtype),
                 rand.randn(gen, M, N, dtype=dtype)) for _ in range(2)]
        fns[f"{name}.fwd"] = lambda i, t=sets: t[i][0] @ t[i][1].t()
        fns[f"{name}.dx"] = lambda i, t=sets: t[i][2] @ t[i][1]
        fns[f"{name}.dw"] = lambda i, t=sets: t[i][2].t() @ t[i][0]
    return fns


def breakdown_fns(s: Shape, device, dtype) -> dict:
    """Each kernel of the coda layer's training step alone, on inputs of its real shape, keyed
    'op (its GEMM)': the GEMM is the bare cuBLAS GEMM of gemm_floor_fns it replaces ('-' for the
    element-wise passes outside GEMMs)."""
    import torch

    from coda_ext import ops

    M, d, F_, hd = s.batch * s.seq, s.d, s.ffn, s.head_dim
    Nq, Do = (s.n_heads + 2 * s.n_kv_heads) * hd, s.n_heads * hd
    freqs = ops.rope_frequencies(hd, s.n_heads, s.n_kv_heads, s.theta, device=device)
    pos = torch.arange(s.seq, device=device).repeat(s.batch)

    gen = rand.generator("breakdown", M, d, device=device)

    def r(*shape, scale=1.0):
        return rand.randn(gen, *shape, dtype=dtype, scale=scale)

    def one():
        return {"x": r(M, d), "h": r(M, d), "w_qkv": r(Nq, d, scale=d ** -0.5), "rstd": rand.positive(gen, M),
             "y0": r(M, Do), "w_o": r(d, Do, scale=Do ** -0.5), "g": r(d), "w_gu": r(2 * F_, d, scale=d ** -0.5),
             "w_d": r(d, F_, scale=F_ ** -0.5), "z1": r(M, 2 * F_), "dx2": r(M, d), "y1": r(M, F_),
             "dz1": r(M, 2 * F_), "zdz": rand.randn(gen, M), "dqkv": r(M, Nq), "qkv": r(M, Nq),
             "dz": r(M, Nq)}

    sets = [one(), one()]
    S = sets.__getitem__
    eps = s.eps
    return {
        "rms_norm_input (-)": lambda i: ops.rms_norm_input(S(i)["x"], S(i)["g"], eps),
        "qkv_rope (qkv.fwd)": lambda i: ops.qkv_rope(S(i)["h"], S(i)["w_qkv"], pos, freqs, s.n_heads, s.n_kv_heads,
                                                     rstd=S(i)["rstd"]),
        "linear_residual_norm (o.fwd)": lambda i: ops.linear_residual_norm(S(i)["y0"], S(i)["w_o"], S(i)["x"],
                                                                           S(i)["g"]),
        "linear_swiglu_train (gate_up.fwd)": lambda i: ops.linear_swiglu_train(S(i)["h"], S(i)["w_gu"], S(i)["rstd"]),
        "linear_residual (down.fwd)": lambda i: ops.linear_residual(S(i)["y1"], S(i)["w_d"], S(i)["x"]),
        "swiglu_backward_linear (down.dx)": lambda i: ops.swiglu_backward_linear(S(i)["dx2"], S(i)["w_d"], S(i)["z1"]),
        "weight_grad (down.dw)": lambda i: ops.weight_grad(S(i)["dx2"], S(i)["y1"]),
        "rms_norm_backward_linear (gate_up.dx)": lambda i: ops.rms_norm_backward_linear(
            S(i)["dz1"], S(i)["w_gu"], S(i)["x"], S(i)["rstd"], S(i)["g"], S(i)["zdz"], dx_in=S(i)["dx2"]),
        "weight_grad (gate_up.dw)": lambda i: ops.weight_grad(S(i)["dz1"], S(i)["h"]),
        "linear_dx (o.dx)": lambda i: ops.linear_dx(S(i)["dx2"], S(i)["w_o"]),
        "weight_grad (o.dw)": lambda i: ops.weight_grad(S(i)["dx2"], S(i)["y0"]),
        "qkv_rope_backward (-)": lambda i: ops.qkv_rope_backward(S(i)["dqkv"], S(i)["qkv"], pos, freqs, s.n_heads,
                                                                 s.n_kv_heads),
        "rms_norm_backward_linear (qkv.dx)": lambda i: ops.rms_norm_backward_linear(
            S(i)["dz"], S(i)["w_qkv"], S(i)["x"], S(i)["rstd"], S(i)["g"], S(i)["zdz"], dx_in=S(i)["dx2"]),
        "weight_grad (qkv.dw)": lambda i: ops.weight_grad(S(i)["dz"], S(i)["h"]),
    }


def run_layer(name: str, s: Shape, reps: int, variants_wanted) -> dict:
    import torch

    device, dtype = "cuda", torch.bfloat16
    torch.manual_seed(0)
    M = s.batch * s.seq
    eager = eager_layer(s, device, dtype)
    cos, sin = rope_tables(s, device, dtype)
    pos = torch.arange(s.seq, device=device).expand(s.batch, s.seq)
    gen = rand.generator(name, device=device)
    inputs = [(rand.randn(gen, s.batch, s.seq, s.d, dtype=dtype).requires_grad_(),
               rand.randn(gen, s.batch, s.seq, s.d, dtype=dtype)) for _ in range(2)]
    variants = {}
    if "eager" in variants_wanted:
        variants["eager"] = step_fn(lambda x: eager(x, cos, sin), inputs, list(eager.parameters()))
    if "torch.compile" in variants_wanted:
        compiled = common.compile_for_one_shape(eager)
        variants["torch.compile"] = step_fn(lambda x: compiled(x, cos, sin), inputs, list(eager.parameters()))
    if "liger" in variants_wanted:
        try:
            lig = eager_layer(s, device, dtype, liger=True)
            lig.load_state_dict(eager.state_dict())
            variants["liger"] = step_fn(lambda x: lig(x, cos, sin), inputs, list(lig.parameters()))
        except ImportError as e:
            print(f"liger-kernel not available: {e}", file=sys.stderr)
    if "coda" in variants_wanted:
        coda = coda_layer(s, eager, device, dtype)
        variants["coda"] = step_fn(lambda x: coda(x, pos), inputs, list(coda.parameters()))
    hd = s.head_dim
    att = [tuple(rand.randn(gen, s.batch, h, s.seq, hd, dtype=dtype).requires_grad_()
                 for h in (s.n_heads, s.n_kv_heads, s.n_kv_heads)) for _ in range(2)]
    att_g = [rand.randn(gen, s.batch, s.n_heads, s.seq, hd, dtype=dtype) for _ in range(2)]
    variants["attention"] = lambda i: torch.autograd.grad(attention(*att[i]), att[i], att_g[i])
    gemms = gemm_floor_fns(s, device, dtype)
    variants.update(gemms)
    parts = breakdown_fns(s, device, dtype) if "coda" in variants_wanted else {}
    variants.update(parts)
    for fn in variants.values():   # warm up: kernels, torch.compile, autotuning
        fn(0)
        fn(1)
    times = common.time_interleaved(variants, reps)
    med = {k: statistics.median(v) for k, v in times.items()}
    floor = sum(med[k] for k in gemms)
    floor_rounds = [sum(r) for r in zip(*(times[k] for k in gemms))]
    row = {"case": name, "shape": dataclasses.asdict(s), "tokens": M, "gemm_floor_ms": floor,
           "attention_ms": med["attention"], "gemms_ms": {k: med[k] for k in gemms}, "variants": {}}
    row["coda_breakdown"] = []
    for k in parts:
        gemm = med.get(k[k.index("(") + 1:-1])       # None for the element-wise passes ("(-)")
        row["coda_breakdown"].append({"kernel": k, "ms": med[k], "gemm_ms": gemm,
                                      "ratio": med[k] / gemm if gemm else None})
    for v in [k for k in variants if k not in gemms and k not in parts and k != "attention"]:
        non_att = [t - a for t, a in zip(times[v], times["attention"])]
        ratios = sorted(n / f for n, f in zip(non_att, floor_rounds))
        row["variants"][v] = {
            "step_ms": med[v], "non_attention_ms": statistics.median(non_att),
            "non_attention_over_floor": statistics.median(ratios),
            "ratio_iqr": [ratios[len(ratios) // 4], ratios[-len(ratios) // 4 - 1]],
        }
        peak = common.peak_memory_gb(variants[v])
        row["variants"][v]["peak_gb"], row["variants"][v]["peak_without_grads_gb"] = peak
    return row


def run_lm_head(reps: int, variants_wanted, chunk_note: str = "") -> dict:
    import torch
    import torch.nn.functional as F

    device, dtype = "cuda", torch.bfloat16
    M, d, V = LM_HEAD
    gen = rand.generator("lm-head", device=device)
    W = rand.randn(gen, V, d, dtype=dtype, scale=d ** -0.5).requires_grad_()
    sets = [(rand.randn(gen, M, d, dtype=dtype).requires_grad_(), rand.indices(gen, M, high=V)) for _ in range(2)]

    def eager_loss(x, t):
        return F.cross_entropy((x @ W.t()).float(), t)

    def wrap(loss_fn):
        def fn(i):
            x, t = sets[i]
            loss = loss_fn(x, t)
            return torch.autograd.grad(loss, [x, W])
        return fn

    variants = {}
    if "eager" in variants_wanted:
        variants["eager"] = wrap(eager_loss)
    if "torch.compile" in variants_wanted:
        compiled = common.compile_for_one_shape(eager_loss)
        variants["torch.compile"] = wrap(compiled)
    if "liger" in variants_wanted:
        try:
            from liger_kernel.transformers.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyLoss
            lce = LigerFusedLinearCrossEntropyLoss()
            variants["liger"] = wrap(lambda x, t: lce(W, x, t))
        except ImportError as e:
            print(f"liger-kernel not available: {e}", file=sys.stderr)
    if "coda" in variants_wanted:
        from coda_ext import ops
        variants["coda"] = wrap(lambda x, t: ops.lm_head_cross_entropy(x, W, t)[0])
    g = [(rand.randn(gen, M, d, dtype=dtype), rand.randn(gen, M, V, dtype=dtype)) for _ in range(2)]
    gemms = {"fwd": lambda i: sets[i][0] @ W.t(), "dx": lambda i: g[i][1] @ W,
             "dw": lambda i: g[i][1].t() @ sets[i][0]}
    variants.update({f"gemm.{k}": f for k, f in gemms.items()})
    for fn in variants.values():
        fn(0)
        fn(1)
    times = common.time_interleaved(variants, max(5, reps // 3))
    med = {k: statistics.median(v) for k, v in times.items()}
    floor_rounds = [sum(r) for r in zip(*(times[f"gemm.{k}"] for k in gemms))]
    row = {"case": "lm-head", "shape": {"M": M, "d": d, "V": V}, "gemm_floor_ms": statistics.median(floor_rounds),
           "gemms_ms": {k: med[f"gemm.{k}"] for k in gemms}, "variants": {}}
    for v in [k for k in variants if not k.startswith("gemm.")]:
        ratios = sorted(t / f for t, f in zip(times[v], floor_rounds))
        row["variants"][v] = {"step_ms": med[v], "over_floor": statistics.median(ratios),
                              "ratio_iqr": [ratios[len(ratios) // 4], ratios[-len(ratios) // 4 - 1]]}
        peak = common.peak_memory_gb(variants[v])
        row["variants"][v]["peak_gb"], row["variants"][v]["peak_without_grads_gb"] = peak
    return row


GOAL_NON_ATTENTION = 1.05
GOAL_LM_PEAK_GB = 0.3


def goals(rows) -> list[str]:
    lines = []
    for row in rows:
        v = row["variants"]
        if "coda" not in v:
            continue
        c = v["coda"]
        if row["case"].startswith("layer"):
            r = c["non_attention_over_floor"]
            lines.append(f"{row['case']}: non-attention {r:.3f}x its GEMM floor (goal <= {GOAL_NON_ATTENTION}: "
                         f"{'met' if r <= GOAL_NON_ATTENTION else 'missed'}); step {c['step_ms']:.2f} ms vs " +
                         ", ".join(f"{k} {x['step_ms']:.2f} ms" for k, x in v.items() if k != "coda") +
                         f"; peak {c['peak_gb']:.2f} GB vs " +
                         ", ".join(f"{k} {x['peak_gb']:.2f} GB" for k, x in v.items() if k != "coda"))
        else:
            faster = all(c["step_ms"] <= x["step_ms"] for k, x in v.items() if k == "torch.compile")
            lean = c["peak_without_grads_gb"]
            if lean < 0:   # the step freed memory allocated before it: the figure says nothing
                lean = float("nan")
            lines.append(f"lm-head: {c['step_ms']:.2f} ms ({c['over_floor']:.3f}x the 3-GEMM floor) vs " +
                         ", ".join(f"{k} {x['step_ms']:.2f} ms" for k, x in v.items() if k != "coda") +
                         f"; no slower than torch.compile: {'met' if faster else 'missed'}; peak without the "
                         f"returned gradients {lean:.2f} GB (goal <= {GOAL_LM_PEAK_GB}: "
                         f"{'met' if lean <= GOAL_LM_PEAK_GB else 'missed or unmeasured'}) vs " +
                         ", ".join(f"{k} {x['peak_without_grads_gb']:.2f} GB" for k, x in v.items() if k != "coda"))
        for item in row.get("coda_breakdown", []):
            ratio = f"{item['ratio']:.3f}x its cuBLAS GEMM" if item["ratio"] else "no GEMM"
            lines.append(f"    {row['case']} {item['kernel']}: {item['ms']:.3f} ms, {ratio}")
    return lines


def plot(rows, path, gpu: str | None = None) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(rows), figsize=(5.2 * len(rows), 4.6), squeeze=False)
    for ax, row in zip(axes[0], rows):
        names = list(row["variants"])
        if row["case"].startswith("layer"):
            att = row["attention_ms"]
            non = [row["variants"][n]["non_attention_ms"] for n in names]
            ax.bar(names, [att] * len(names), color="#bbbbbb", label="attention (SDPA)")
            ax.bar(names, non, bottom=[att] * len(names), color="#4c72b0", label="non-attention")
            ax.axhline(att + row["gemm_floor_ms"], color="k", ls="--", lw=1, label="attention + GEMM floor")
        else:
            ax.bar(names, [row["variants"][n]["step_ms"] for n in names], color="#4c72b0", label="forward + backward")
            ax.axhline(row["gemm_floor_ms"], color="k", ls="--", lw=1, label="3-GEMM floor")
        for i, n in enumerate(names):
            v = row["variants"][n]
            ax.text(i, v["step_ms"], f"{v['step_ms']:.1f} ms\n{v['peak_without_grads_gb']:.2f} GB", ha="center",
                    va="bottom", fontsize=8)
        ax.set_title(row["case"])
        ax.set_ylabel("ms per step (median)")
        ax.set_ylim(0, max(v["step_ms"] for v in row["variants"].values()) * 1.25)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"Llama training step on {gpu or 'the GPU'}: time (bar); label: peak memory of the step beyond "
                 "what was allocated before it, without the gradients it returns",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cases", nargs="+", default=list(LAYERS) + ["lm-head"])
    p.add_argument("--variants", nargs="+", default=["eager", "torch.compile", "liger", "coda"])
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--out", default=None, help="results JSON (default: llama_training_<gpu>.json in "
                   "benchmarks/results/, <gpu> the GPU it runs on: h100, h200, …); the PNG goes beside it")
    args = p.parse_args(argv)
    out = pathlib.Path(args.out) if args.out else common.results_path("llama_training")
    env, rows = common.gpu_info(), []
    for case in args.cases:
        row = run_lm_head(args.reps, args.variants) if case == "lm-head" else \
            run_layer(case, LAYERS[case], args.reps, args.variants)
        rows.append(row)
        print(json.dumps(row), flush=True)
        common.write_json(out, {"env": env, "rows": rows, "goals": goals(rows)})  # after every case
    plot(rows, out.with_suffix(".png"), env.get("gpu"))
    print("\n".join(goals(rows)))


if __name__ == "__main__":
    main()
