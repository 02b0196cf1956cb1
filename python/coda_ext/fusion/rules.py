"""What a fused kernel accepts: the one home of the kernel's limits as the fusion compiler applies them.

target "cuda": the SM90 kernel (README "Requirements on inputs"): bf16/fp16 GEMM operands of one
dtype, K and N multiples of 8 (and M where A is read M-major: a weight gradient), operands stored
contiguously (read in place through `major`). The kernel itself takes any N where W is read K-major (its
outputs get padded rows), but the fusion compiler leaves such a GEMM plain: GPT-2's LM head over 50257
classes with its cross-entropy's logsumexp and target logit in the epilogue measured slower than cuBLAS and
Inductor's kernels (docs/measured.md: "An LM head over 50257 classes, fused").
target "interpret": the reference interpreter (CPU tests): any float GEMM, any layout.
Both: at most graph.verify.MAX_SLOTS runtime inputs and outputs and MAX_REDUCTIONS reductions per
graph; tiles are float; vectors float or integer (bool vectors are widened to fp32 by the call);
stores are float.

Shared memory ("cuda"): an epilogue's TMA-loaded tiles, stores and row vectors are staged in shared
memory beside the mainloop's pipeline, which needs two stages (codegen.constraints). config="auto"
steps down from its 128x256 and 128x192 configs to ping-pong 128x128 where the epilogue would leave
them fewer than three stages, but launches its ping-pong configs (SKINNY, WAVE_FILL, PINGPONG, WIDE:
tuning.heuristic) whatever the epilogue takes, so the partitioner keeps every epilogue within the
smallest of their budgets (shared_memory(): a linear cost per buffer, as the ILP needs it), and the
lowering checks the graph built against the config "auto" takes at its shape (kernel_problem).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

import torch

from ..graph.verify import MAX_REDUCTIONS, MAX_SLOTS

TARGETS = ("cuda", "interpret")
GEMM_DTYPES = {"cuda": (torch.bfloat16, torch.float16),
               "interpret": (torch.bfloat16, torch.float16, torch.float32)}
FLOAT = (torch.bfloat16, torch.float16, torch.float32)
VECTOR = FLOAT + (torch.int32, torch.int64, torch.bool)
ALIGN = 8   # elements: 16 bytes of a 16-bit dtype

__all__ = ["MAX_REDUCTIONS", "MAX_SLOTS", "TARGETS", "SharedMemory", "anchor_problem", "kernel_problem", "loadable",
           "shared_memory"]


def anchor_problem(a: torch.Tensor, w: torch.Tensor, major: str, target: str) -> str | None:
    """Why a GEMM of stored operands a, w (coda_ext::fusion_gemm) cannot anchor an epilogue, or None."""
    if target not in TARGETS:
        raise ValueError(f"fusion target must be one of {TARGETS}, got {target!r}")
    if a.dtype != w.dtype or a.dtype not in GEMM_DTYPES[target]:
        want = "/".join(str(d).replace("torch.", "") for d in GEMM_DTYPES[target])
        return f"GEMM operands {a.dtype} x {w.dtype}: the {target} kernel takes {want} (one dtype)"
    if a.dim() != 2 or w.dim() != 2:
        return "not a 2-D GEMM"
    if target == "cuda":
        K = a.shape[1] if major[0] == "k" else a.shape[0]
        N = w.shape[0] if major[1] == "k" else w.shape[1]
        if K % ALIGN or N % ALIGN:
            return (f"K = {K} and N = {N} must be multiples of {ALIGN} (16-byte rows; the fusion compiler leaves an "
                    "odd N plain)")
        if major[0] == "m" and a.shape[1] % ALIGN:   # A read M-major: its stored rows are M long
            return f"M = {a.shape[1]} must be a multiple of {ALIGN} where A is read M-major (16-byte rows)"
        if not (a.is_contiguous() and w.is_contiguous()):
            return "an operand is not stored contiguously (the kernel reads it in place; a copy would cost a pass)"
    return None


def loadable(role: str, dtype: torch.dtype) -> bool:
    """Whether an epilogue can read a tensor of `dtype` in `role` (tile, row, col, scalar)."""
    if role == "tile":
        return dtype in FLOAT
    return dtype in VECTOR


@dataclasses.dataclass(frozen=True)
class SharedMemory:
    """An epilogue's shared-memory budget and what each buffer costs, in bytes: a TMA-loaded tile or a
    store costs `tile` or `store` times its element size; a row vector `row`."""

    budget: int
    tile: int
    store: int
    row: int

    def cost(self, kind: str, itemsize: int) -> int:
        return {"tile": self.tile * itemsize, "store": self.store * itemsize, "row": self.row}.get(kind, 0)


def _buffers(graph: Any, config: Any) -> int:
    from ..codegen.constraints import epilogue_buffers

    return sum(epilogue_buffers(graph.build(), "bfloat16", config).values())


@functools.cache
def shared_memory() -> SharedMemory:
    """The "cuda" target's budget: the smallest over the configs config="auto" launches whatever the
    epilogue takes (see the module docstring); each buffer at its largest cost over them, measured as
    what one bf16 tile, store or row vector adds to a library graph's buffers."""
    from .. import graphs, tuning
    from ..codegen.constraints import MIN_MAINLOOP_STAGES, SMEM_BYTES, STAGE_BARRIERS

    budgets, tiles, stores, rows = [], [], [], []
    for config in (tuning.SKINNY, tuning.WAVE_FILL, tuning.PINGPONG, tuning.WIDE):
        tm, tn, tk = config.tile
        stage = (tm + tn) * tk * 2 + STAGE_BARRIERS          # as constraints.mainloop_stages counts a bf16 stage
        empty = _buffers(graphs.identity(), config)
        budgets.append(SMEM_BYTES - MIN_MAINLOOP_STAGES * stage - empty)
        tiles.append((_buffers(graphs.acc_aux(), config) - empty) // 2)                       # D = acc * aux
        stores.append((_buffers(graphs.example(), config) - _buffers(graphs.silu_aux_bias(), config)) // 2)
        rows.append(_buffers(graphs.acc_bias(), config) - empty)                             # D = acc + bias
    return SharedMemory(min(budgets), max(tiles), max(stores), max(rows))


def kernel_problem(graph: Any, dtype: str, major: str, mnk: tuple[int, int, int], sms: int | None = None
                   ) -> str | None:
    """Why the kernel config="auto" launches for this epilogue at GEMM shape mnk cannot be built (its
    shared memory, a column reduction's partials, ...), or None."""
    from ..errors import CodaError
    from ..jit import kernel_source
    from ..runtime.tuned import TunedOp

    try:
        op = TunedOp(graph, dtype, tune=False, major=major)
        kernel_source(graph, dtype, op.config_for(*mnk, **({} if sms is None else {"sms": sms})))
    except CodaError as e:
        return f"{type(e).__name__}: {e}"
    return None
