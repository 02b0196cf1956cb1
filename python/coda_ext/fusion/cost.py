"""The cost model of the partitioner and the report: the IO model of coda_ext.analysis.

gain(nbytes): what keeping a tensor's bytes on chip is worth to the partition objective — the HBM
bytes themselves (a byte written or read once less), as the IO model counts them (costs.DTYPE_BYTES).
seconds(nbytes): those bytes at the GPU's achievable HBM bandwidth (roofline.GPU.tbps).
fold_pays(activation, weight bytes): whether a layer norm folded into the GEMMs that read it saves bytes.
kernel(graph, dtype, (M, N, K)): the IO model's time lower bound of the fused kernel, of a
torch.compile-style GEMM + fused element-wise kernel, and of eager PyTorch (analysis.io_model).
"""
from __future__ import annotations

import dataclasses
from typing import Any

from ..analysis.model import io_model
from ..analysis.roofline import current_gpu, gpu_spec


@dataclasses.dataclass(frozen=True)
class KernelCost:
    fused_s: float
    compile_s: float
    unfused_s: float
    fused_bytes: int
    unfused_bytes: int
    config: str
    gpu: str = "H100 SXM"   # the GPU whose model priced it


@dataclasses.dataclass(frozen=True)
class CostModel:
    #: The GPU whose bandwidth prices bytes: the CUDA device in use where there is one.
    gpu: str = dataclasses.field(default_factory=current_gpu)
    #: What adding one node to an epilogue costs the objective when it keeps nothing on chip (a tie
    #: breaker in bytes: prefer the smaller kernel).
    member_cost: float = 1.0
    #: Passes over a folded GEMM's weight each step (passes/norm_fold.py): W ⊙ γ written, then read
    #: again for its column sums s and W β.
    fold_weight_passes: float = 2.0

    def fold_pays(self, activation_bytes: int, weight_bytes: int) -> bool:
        """Whether folding a layer norm of output y (activation_bytes) into the GEMMs that read it (their
        weights: weight_bytes) pays in a training step: the forward no longer reads x and writes y, the
        backward writes y once (the dX epilogue that takes the layer norm's backward stores it for the
        weight gradients), and each weight costs fold_weight_passes passes."""
        return self.fold_weight_passes * weight_bytes < activation_bytes

    def gain(self, nbytes: int) -> float:
        return float(nbytes)

    def seconds(self, nbytes: float) -> float:
        return nbytes / (gpu_spec(self.gpu).tbps * 1e12)

    def kernel(self, graph: Any, dtype: str, mnk: tuple[int, int, int], config: Any = "auto") -> KernelCost:
        """The IO model of one fused kernel. GEMMs the GPU kernel cannot run (fp32 on the CPU
        interpreter) are modelled in bf16."""
        d = dtype if dtype in ("bfloat16", "float16") else "bfloat16"
        m = io_model(graph, d, mnk, config=config, gpu=self.gpu)
        v = m.variants
        spec = m.gpu
        return KernelCost(v["fused"].seconds(spec), v["compile"].seconds(spec), v["unfused"].seconds(spec),
                          v["fused"].bytes, v["unfused"].bytes, m.config.tag, spec.name)
