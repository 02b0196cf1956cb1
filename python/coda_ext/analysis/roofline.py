"""The roofline: GPUs, kernels as (HBM accesses, flops), and the time lower bound they set.

A kernel's time is bounded below by max(compute, memory) plus a launch cost: compute is its GEMM's
tensor-core work at the achievable rate, quantized to waves of tiles over the SMs, or its
element-wise math at the CUDA-core rate where that is longer (the two units run concurrently);
memory is its HBM bytes at the achievable bandwidth.
A sequence of kernels (a Variant) takes the sum of its kernels' bounds.
"""
from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class GPU:
    """Ceilings of one GPU. 'Achievable' rates are what a large bf16 GEMM and a device-to-device copy
    reach in practice (docs/design.md, "The bars"), not the datasheet peaks."""

    name: str
    peak_tflops: float       # dense bf16/fp16 tensor-core peak (datasheet)
    tflops: float            # achievable on a large GEMM
    peak_tbps: float         # HBM bandwidth (datasheet)
    tbps: float              # achievable (copy: read + write)
    sms: int
    l2_mb: float
    vector_tflops: float = 60.0   # fp32 CUDA-core math, achievable (67 datasheet)
    launch_us: float = 2.0        # per kernel launched back to back in a stream (no CUDA graph)

    @property
    def l2_bytes(self) -> float:
        return self.l2_mb * 1e6


GPUS: dict[str, GPU] = {
    "H100 SXM": GPU("H100 SXM", peak_tflops=989, tflops=790, peak_tbps=3.35, tbps=3.0, sms=132, l2_mb=50),
    "H200": GPU("H200", peak_tflops=989, tflops=790, peak_tbps=4.8, tbps=4.3, sms=132, l2_mb=60),
}


def gpu_spec(gpu: str | GPU) -> GPU:
    """A GPU's model by its name here ("H100 SXM", "H200") or as the device reports it ("NVIDIA H200",
    "NVIDIA H100 80GB HBM3")."""
    if isinstance(gpu, GPU):
        return gpu
    for name, spec in GPUS.items():
        if str(gpu).lower() == name.lower():
            return spec
    for name, spec in GPUS.items():   # a device name: its model's token ("H200") within it
        if name.split()[0].lower() in str(gpu).lower().split():
            return spec
    raise ValueError(f"unknown GPU {gpu!r}; known: {list(GPUS)} (or pass a coda_ext.analysis.GPU)")


def current_gpu(default: str = "H100 SXM") -> str:
    """The model name (a key of GPUS) of the CUDA device in use, else `default` (no GPU, or one not modelled)."""
    try:
        import torch
        if not torch.cuda.is_available():
            return default
        return gpu_spec(torch.cuda.get_device_name()).name
    except (ImportError, ValueError, RuntimeError):
        return default


@dataclasses.dataclass(frozen=True)
class Access:
    """HBM bytes a kernel reads from and writes to one tensor."""

    tensor: str
    read: int = 0
    write: int = 0


@dataclasses.dataclass(frozen=True)
class GemmWork:
    """The tensor-core work of a GEMM run as tiles over a persistent grid.

    Each SM computes one tile at a time at 1/sms of the achievable rate; the grid runs
    ceil(tiles / sms) waves of whole (padded) tiles. Stream-K splits the K loop of the last wave's
    tiles across SMs, so its waves are fractional."""

    M: int
    N: int
    K: int
    tile_m: int
    tile_n: int
    streamk: bool = False

    @property
    def flops(self) -> float:
        return 2.0 * self.M * self.N * self.K

    @property
    def tiles(self) -> int:
        return -(-self.M // self.tile_m) * -(-self.N // self.tile_n)

    def waves(self, sms: int) -> float:
        return self.tiles / sms if self.streamk else math.ceil(self.tiles / sms)

    def seconds(self, gpu: GPU) -> float:
        tile_flops = 2.0 * self.tile_m * self.tile_n * self.K
        return self.waves(gpu.sms) * gpu.sms * tile_flops / (gpu.tflops * 1e12)


@dataclasses.dataclass(frozen=True)
class Timing:
    compute_s: float
    memory_s: float
    launch_s: float

    @property
    def seconds(self) -> float:
        return max(self.compute_s, self.memory_s) + self.launch_s

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s >= self.memory_s else "memory"


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One launch: what it reads and writes in HBM, its GEMM (if any) and its element-wise flops."""

    name: str
    accesses: tuple[Access, ...]
    gemm: GemmWork | None = None
    vector_flops: float = 0.0

    @property
    def read(self) -> int:
        return sum(a.read for a in self.accesses)

    @property
    def written(self) -> int:
        return sum(a.write for a in self.accesses)

    @property
    def bytes(self) -> int:
        return self.read + self.written

    @property
    def flops(self) -> float:
        return (self.gemm.flops if self.gemm else 0.0) + self.vector_flops

    def timing(self, gpu: GPU) -> Timing:
        tensor = self.gemm.seconds(gpu) if self.gemm else 0.0
        vector = self.vector_flops / (gpu.vector_tflops * 1e12)   # CUDA cores: overlaps the tensor cores
        return Timing(max(tensor, vector), self.bytes / (gpu.tbps * 1e12), gpu.launch_us * 1e-6)


@dataclasses.dataclass(frozen=True)
class Variant:
    """One way to run a computation: a sequence of kernels."""

    name: str
    kernels: tuple[Kernel, ...]

    @property
    def bytes(self) -> int:
        return sum(k.bytes for k in self.kernels)

    @property
    def read(self) -> int:
        return sum(k.read for k in self.kernels)

    @property
    def written(self) -> int:
        return sum(k.written for k in self.kernels)

    @property
    def flops(self) -> float:
        return sum(k.flops for k in self.kernels)

    def seconds(self, gpu: GPU) -> float:
        return sum(k.timing(gpu).seconds for k in self.kernels)

    def bound(self, gpu: GPU) -> tuple[str, float]:
        """The bound of the kernels that take most of the time, and their share of it."""
        spent = {"compute": 0.0, "memory": 0.0}
        for k in self.kernels:
            t = k.timing(gpu)
            spent[t.bound] += t.seconds
        which = max(spent, key=spent.get)
        total = sum(spent.values())
        return which, (spent[which] / total if total else 1.0)

    def per_tensor(self) -> dict[str, int]:
        """HBM bytes (read + written) per tensor over all kernels."""
        out: dict[str, int] = {}
        for k in self.kernels:
            for a in k.accesses:
                out[a.tensor] = out.get(a.tensor, 0) + a.read + a.write
        return out

    def to_dict(self, gpu: GPU) -> dict:
        kernels = []
        for k in self.kernels:
            t = k.timing(gpu)
            kernels.append({"name": k.name, "read_bytes": k.read, "write_bytes": k.written, "flops": k.flops,
                            "compute_s": t.compute_s, "memory_s": t.memory_s, "time_s": t.seconds,
                            "bound": t.bound, "tensors": {a.tensor: [a.read, a.write] for a in k.accesses}})
        bound, share = self.bound(gpu)
        return {"kernels": kernels, "launches": len(self.kernels), "read_bytes": self.read,
                "write_bytes": self.written, "bytes": self.bytes, "flops": self.flops,
                "intensity_flop_per_byte": self.flops / self.bytes if self.bytes else None,
                "time_s": self.seconds(gpu), "bound": bound, "bound_share": share, "tensors": self.per_tensor()}
