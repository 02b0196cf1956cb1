"""constraints: what a graph asks of its kernel config, checked (and filled in) before emission.

A segment_reduce reads a whole segment of a row in one visit, so the epilogue subtile must be
exactly one segment wide: (EPI_M, size), with EPI_M the rows one schedule's epilogue visits at
once (64 for ping-pong, TILE_M for cooperative), and a segment must lie inside one N tile.
A config without an epilogue tile gets that one; a config that contradicts it is refused.

The epilogue's shared memory (D's staging buffer, TMA-loaded tiles, TMA-stored outputs, each a few
stages of one epilogue subtile, and one TILE_N slice per row vector) is carved out of what the
mainloop's pipeline gets. A graph whose epilogue leaves the mainloop fewer than two stages would stop
nvcc at one of CUTLASS's static_asserts; it is refused here instead, with the fix. The buffers are
counted at the fewest stages CUTLASS gives them, each row-vector slice rounded up to the 1 KB
alignment of the swizzled buffers that may follow it, plus 1 KB for the epilogue's pipeline barriers
and padding: slightly more than CUTLASS may allocate, so a graph that passes always compiles (a
graph within 1–2 KB of the limit may be refused; it would have run with two stages, far from its
best speed, anyway).
"""
from __future__ import annotations

import dataclasses

from ..config import OVERLAP_SCHEDULES, PINGPONG_SCHEDULES, KernelConfig
from ..errors import UnsupportedError
from ..graph import ir

SMEM_BYTES = 232448       # shared memory per CTA on SM90 (227 KB)
MIN_MAINLOOP_STAGES = 2   # CUTLASS's SM90 mainloops need at least two stages
SMEM_ALIGN = 1024         # alignment of a 128-byte-swizzled TMA buffer
STAGE_BARRIERS = 16       # bytes of pipeline barriers per mainloop stage (full + empty)
#: Bytes an element in the kernel (int64 vectors are narrowed to int32).
_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "uint8": 1, "int32": 4, "int64": 4}


def segment_size(graph: ir.GraphIR) -> int | None:
    """The segment width of the graph's segment reductions (one per graph), or None."""
    sizes = sorted({n.attr("size") for n in graph.nodes if n.kind == "segment_reduce"})
    if len(sizes) > 1:
        raise UnsupportedError(f"segment_reduce: one graph may use one segment size, got {sizes}")
    return sizes[0] if sizes else None


def fit_config(graph: ir.GraphIR, config: KernelConfig) -> KernelConfig:
    """`config`, with the epilogue tile the graph needs; raises UnsupportedError naming the fix."""
    size = segment_size(graph)
    if size is None:
        return config
    tm, tn, _ = config.tile
    if tn % size:
        raise UnsupportedError(
            f"segment_reduce(size={size}): a segment (head) must lie inside one N tile, but config {config.tag} "
            f"has TILE_N={tn}; use a TILE_N that is a multiple of {size}")
    em = 64 if config.schedule in PINGPONG_SCHEDULES else tm
    if em not in (64, 128):
        raise UnsupportedError(f"segment_reduce: config {config.tag} has TILE_M={tm}; with the {config.schedule} "
                               "schedule use TILE_M 128 (the epilogue subtile must hold whole rows of 128 or fewer)")
    want = (em, size)
    if config.epilogue_tile is None:
        return dataclasses.replace(config, epilogue_tile=want)
    if tuple(config.epilogue_tile) != want:
        raise UnsupportedError(
            f"segment_reduce(size={size}) needs the epilogue tile {want} (one segment per subtile) with config "
            f"{config.tag}; pass epilogue_tile={want} or leave it None")
    return config


#: The mainloop stages below which a gated output's TMA stage (gated_store="tma") gives way to register stores
#: where those leave more (tuning.heuristic's floor: the RMSNorm backward's epilogue with a 2-stage mainloop ran at
#: 1.65x cuBLAS, with 5 stages at 1.13-1.19x)
GATED_STAGE_FLOOR = 3


def fit_gated_store(graph: ir.GraphIR, dtype: str, config: KernelConfig) -> KernelConfig:
    """`config`, its gated pair outputs written from registers (gated_store="registers") where staging them for TMA
    (the default) would leave the mainloop fewer than GATED_STAGE_FLOOR stages and registers leave it more (the
    stage saves about a point of the store, a third mainloop stage far more): a graph that compiled beside register
    stores keeps compiling, and the op's config says which store it runs."""
    if config.gated_store != "tma" or not graph.find("pair_gated_store"):
        return config
    tma = mainloop_stages(graph, dtype, config)
    registers = dataclasses.replace(config, gated_store="registers")
    if tma >= GATED_STAGE_FLOOR or mainloop_stages(graph, dtype, registers) <= tma:
        return config
    return registers


def epilogue_tile(config: KernelConfig) -> tuple[int, int]:
    """The epilogue subtile CUTLASS uses: the config's, else its choice for 16-bit D (N 32;
    M the schedule's: TILE_M for cooperative, 64 for ping-pong)."""
    if config.epilogue_tile is not None:
        return tuple(config.epilogue_tile)
    tm = config.tile[0]
    return (tm if config.schedule not in PINGPONG_SCHEDULES else min(tm, 64), 32)


def _align(n: int) -> int:
    return -(-n // SMEM_ALIGN) * SMEM_ALIGN


def epilogue_buffers(graph: ir.GraphIR, dtype: str, config: KernelConfig) -> dict[str, int]:
    """Bytes of the epilogue's shared memory at the stages CUTLASS gives its buffers (or the config's
    epilogue_stages): D's staging buffer, TMA-loaded tiles, TMA-stored outputs (pair tiles and pair stores:
    32-bit), each row vector's TILE_N slice (rounded up to SMEM_ALIGN), and SMEM_ALIGN for barriers and
    padding; the gated pair output's half-width stages with KernelConfig.gated_store="tma". Tiles read directly
    (KernelConfig.tile_loads="direct") and tiles written directly (KernelConfig.tile_stores="direct") take none."""
    tm, tn, _ = config.tile
    em, en = epilogue_tile(config)
    subtiles = (tm // em) * (tn // en)
    stages_c, stages_d = config.epilogue_stages or (min(subtiles, 4), min(subtiles, 2))
    sub = em * en
    parts = {"D staging": stages_d * sub * _BYTES[dtype]}
    direct = config.tile_loads == "direct"
    direct_stores = config.tile_stores == "direct"
    for n in graph.nodes:
        if (n.kind in ("tile", "pair_tile") and direct) or (n.kind in ("store", "pair_store") and direct_stores):
            continue
        if n.kind == "tile":
            parts[f"tile {n.name!r}"] = stages_c * sub * _BYTES[n.attr("dtype") or dtype]
        elif n.kind == "store":
            parts[f"store {n.name!r}"] = stages_d * sub * _BYTES[n.attr("dtype") or dtype]
        elif n.kind == "pair_tile":   # 32-bit elements: two 16-bit values per column
            parts[f"pair tile {n.name!r}"] = stages_c * sub * 4
        elif n.kind == "pair_store":
            parts[f"pair store {n.name!r}"] = stages_d * sub * 4
        elif n.kind == "pair_gated_store" and config.gated_store == "tma":   # half width
            parts[f"gated store {n.name!r}"] = stages_d * sub // 2 * _BYTES[n.attr("dtype") or dtype]
        elif n.kind == "row_vector":  # CUTLASS's row broadcast stages its CTA_N slice in shared memory
            parts[f"row vector {n.name!r}"] = _align(tn * _BYTES[n.attr("dtype") or dtype])
    parts["barriers and padding"] = SMEM_ALIGN
    return parts


def epilogue_copies(config: KernelConfig) -> int:
    """How many copies of the epilogue's buffers the kernel holds: one per math warp group where their
    epilogues overlap (the "overlap" schedules), else one."""
    return 2 if config.schedule in OVERLAP_SCHEDULES else 1


def handoff_bytes(config: KernelConfig) -> int:
    """The shared memory the "handoff" schedule passes a tile's fp32 accumulators through (else 0): two chunk
    buffers of a quarter tile each (csrc/kernels/sm90_cooperative_handoff.cuh)."""
    return config.tile[0] * config.tile[1] * 4 // 4 * 2 if config.schedule == "handoff" else 0


def mainloop_stages(graph: ir.GraphIR, dtype: str, config: KernelConfig) -> int:
    """An upper bound of the mainloop pipeline stages left beside the epilogue's buffers (all copies) and
    the accumulator handoff."""
    tm, tn, tk = config.tile
    stage = (tm + tn) * tk * _BYTES[dtype] + STAGE_BARRIERS
    epilogue = epilogue_copies(config) * sum(epilogue_buffers(graph, dtype, config).values()) + handoff_bytes(config)
    return (SMEM_BYTES - epilogue) // stage


def check_shared_memory(graph: ir.GraphIR, dtype: str, config: KernelConfig) -> None:
    """Raises UnsupportedError if the epilogue's buffers leave the mainloop fewer than two stages."""
    if mainloop_stages(graph, dtype, config) >= MIN_MAINLOOP_STAGES:
        return
    tm, tn, tk = config.tile
    em, en = epilogue_tile(config)
    parts = epilogue_buffers(graph, dtype, config)
    copies = epilogue_copies(config)
    epilogue = copies * sum(parts.values()) + handoff_bytes(config)
    stage = (tm + tn) * tk * _BYTES[dtype]
    listing = ", ".join(f"{k} {v // 1024} KB" for k, v in parts.items())
    if handoff_bytes(config):
        listing += f", the accumulator handoff {handoff_bytes(config) // 1024} KB"
    raise UnsupportedError(
        f"the epilogue needs at least {epilogue // 1024} KB of shared memory ({listing}"
        f"{', once per math warp group' if copies > 1 else ''}) with config {config.tag} "
        f"(epilogue subtile {em}x{en}), leaving the mainloop fewer than {MIN_MAINLOOP_STAGES} stages of "
        f"{stage // 1024} KB: use 16-bit tiles and stores instead of float32, fewer of them, a smaller epilogue tile "
        "or a smaller TILE_N")


def check_column_partials(graph: ir.GraphIR, dtype: str, config: KernelConfig) -> None:
    """A column reduction gathers its per-warp partials of a whole N tile (one fp32 row per warp) in the
    staging buffer of one epilogue subtile: refuse an epilogue tile too small for that (csrc
    column_partials.hpp would stop nvcc with a static_assert)."""
    if not graph.find("col_reduce"):
        return
    em, en = epilogue_tile(config)
    warps = 4 if config.schedule in PINGPONG_SCHEDULES else 8
    need = 4 * warps * config.tile[1]
    if em * en * _BYTES[dtype] < need:
        raise UnsupportedError(
            f"a column reduction needs an epilogue subtile of at least {need} bytes ({warps} warps x TILE_N "
            f"{config.tile[1]} fp32 partials) with config {config.tag}; the subtile {em}x{en} has "
            f"{em * en * _BYTES[dtype]}: use a larger epilogue tile (or None for CUTLASS's choice) or a smaller TILE_N")
