"""The ready ops' GPU cases, in one place: tests/gpu/test_ops_gpu.py runs them, and

    python -m coda_ext prebuild tests/gpu/ops_cases.py -j 16

builds exactly the kernels they use, in parallel: (graph variant, dtype, the config that
config="auto" picks for the case's shape). `python tests/gpu/ops_cases.py` prints the count.

Shapes of Llama-3-1B-like and Llama-3-8B models, x of (1, d), (333, d) (not a tile multiple) and
(2, 77, d). Every graph variant of every op runs in bf16 on the 3-D x; each op's main variant also
at M = 1 and 333, and in fp16 at M = 333 (every (variant, dtype, config) is a ~90 s nvcc build).
The LM head runs at smaller vocabularies, plus one Llama-3 sized case (M = 8192, K = 4096,
V = 128256) that checks the loss and the memory the op takes.
"""
from __future__ import annotations

import dataclasses
import math
import sys

from coda_ext import ops, tuning
from coda_ext.jit import kernel_source
from coda_ext.runtime import TunedOp


@dataclasses.dataclass(frozen=True)
class Model:
    d: int
    F: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab: int   # of the LM-head cases (Llama 3's is 128256: LM_HEAD_LARGE)


MODELS = {
    "1b": Model(d=2048, F=8192, n_heads=32, n_kv_heads=8, head_dim=64, vocab=32000),
    "8b": Model(d=4096, F=14336, n_heads=32, n_kv_heads=8, head_dim=128, vocab=5000),
}
LEADS = ((1,), (333,), (2, 77))
MODULES = {m.NAME: m for m in ops.MODULES}


def shape(op: str, m: Model) -> tuple[int, int]:
    """(N, K) of op's weight in model m."""
    return {
        "linear_residual_norm": (m.d, m.F),                                   # down projection
        "rms_linear": (m.F, m.d),
        "linear_swiglu": (2 * m.F, m.d),                                      # interleaved gate/up
        "qkv_rope": ((m.n_heads + 2 * m.n_kv_heads) * m.head_dim, m.d),
        "lm_head_cross_entropy": (m.vocab, m.d),
    }[op]


def main_variant(op: str, m: Model) -> tuple:
    """The graph arguments of each op's main variant (its module's graph(*args))."""
    return {
        "linear_residual_norm": (),
        "rms_linear": (None,),                 # no activation
        "linear_swiglu": (True, False),        # rstd-scaled, y only
        "qkv_rope": (True, True, m.head_dim),  # rstd-scaled, QK-norm
        "lm_head_cross_entropy": (True,),      # rstd-scaled
    }[op]


def variants(op: str, m: Model) -> list[tuple]:
    """Every graph variant of op (its BUILDS) that the model's shapes take."""
    return [args for _, args, _ in MODULES[op].BUILDS if op != "qkv_rope" or args[2] == m.head_dim]


@dataclasses.dataclass(frozen=True)
class Case:
    op: str          # the module's NAME
    variant: tuple   # its graph(*variant)
    dtype: str
    model: str
    lead: tuple      # x's leading dimensions
    N: int
    K: int

    @property
    def M(self) -> int:
        return math.prod(self.lead)

    @property
    def function(self) -> str:
        """The public function of coda_ext.ops this case calls."""
        return "linear_swiglu_train" if self.op == "linear_swiglu" and self.variant[1] else self.op

    @property
    def main(self) -> bool:
        return self.variant == main_variant(self.op, MODELS[self.model])

    @property
    def label(self) -> str:
        """'op[variant] dtype shape', e.g. 'qkv_rope[True-True-64] bfloat16 1b:2x77x2048->3072'."""
        var = "-".join(str(a) for a in self.variant)
        return f"{self.function}[{var}] {self.dtype} {self.model}:{'x'.join(map(str, (*self.lead, self.K)))}->{self.N}"

    @property
    def id(self) -> str:
        var = "-".join(str(a) for a in self.variant)
        return f"{self.function}[{var}]-{self.dtype}-{self.model}-{'x'.join(map(str, (*self.lead, self.K)))}-N{self.N}"

    def graph(self):
        return MODULES[self.op].graph(*self.variant)

    def config(self, sms: int = tuning.DEFAULT_SMS):
        """The kernel config the op's config="auto" dispatch picks for this shape."""
        return TunedOp(self.graph(), self.dtype, tune=False).config_for(self.M, self.N, self.K, sms)


def _cases() -> list[Case]:
    cases = []
    for name, m in MODELS.items():
        for op in MODULES:
            N, K = shape(op, m)
            for v in variants(op, m):
                leads = LEADS if v == main_variant(op, m) else ((2, 77),)
                cases += [Case(op, v, "bfloat16", name, lead, N, K) for lead in leads]
            cases.append(Case(op, main_variant(op, m), "float16", name, (333,), N, K))
    return cases


CASES = _cases()
LM_HEAD_LARGE = Case("lm_head_cross_entropy", (True,), "bfloat16", "8b", (8192,), 128256, 4096)


def feature_cases() -> list[Case]:
    """One case of each custom op (bf16, 1B model, the 3-D x) for opcheck, torch.compile and CUDA graphs."""
    def pick(c: Case) -> bool:
        return c.dtype == "bfloat16" and c.model == "1b" and c.lead == (2, 77) and (
            c.main or (c.function == "linear_swiglu_train" and c.variant[0]))
    return [c for c in CASES if pick(c)]


def gpu_sms() -> int:
    """The SMs the ops' dispatch sees: this machine's GPU, else an H100 SXM's."""
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_properties(0).multi_processor_count
    except Exception:  # noqa: BLE001  (no usable GPU or torch: an H100's count)
        pass
    return tuning.DEFAULT_SMS


def build_items() -> list:
    """(graph, dtype, config) of every distinct kernel the cases run."""
    sms = gpu_sms()
    items = {}
    for c in CASES + [LM_HEAD_LARGE]:
        graph, config = c.graph(), c.config(sms)
        items.setdefault(kernel_source(graph, c.dtype, config).source, (graph, c.dtype, config))
    return list(items.values())


if __name__ == "__main__":
    print(f"{len(CASES) + 1} cases, {len(build_items())} distinct kernels", file=sys.stderr)
