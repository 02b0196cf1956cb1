"""Kernel configurations: the tile, cluster and schedule of the fixed SM90 mainloop."""
from __future__ import annotations

import dataclasses

from .errors import UnsupportedError

SCHEDULES = ("cooperative", "pingpong", "streamk", "overlap", "overlap_ordered", "handoff")
#: Schedules of the ping-pong kind (two math warp groups of 64-row MMAs, alternating tiles): "overlap" is
#: ping-pong whose two warp groups' epilogues may run at the same time (csrc/kernels/sm90_pingpong_overlap.cuh:
#: each warp group owns its epilogue's shared memory, so the epilogue takes twice its storage from the
#: mainloop's stages); "overlap_ordered" is the same kernel with the epilogues ordered again, for debugging
#: (its results must be bit-identical to "overlap"'s).
PINGPONG_SCHEDULES = ("pingpong", "overlap", "overlap_ordered")
#: Schedules whose epilogue shared memory is allocated once per math warp group.
OVERLAP_SCHEDULES = ("overlap", "overlap_ordered")
#: The clusters the overlap schedules run in (tests/gpu/test_overlap_gpu.py: 1x1, 2x1 and 1x2).
OVERLAP_CLUSTERS = ((1, 1), (2, 1), (1, 2))
#: "handoff": cooperative MMAs on two warp groups that hand each tile's fp32 accumulators through shared
#: memory (two quarter-tile chunk buffers) to two epilogue warp groups of their own
#: (csrc/kernels/sm90_cooperative_handoff.cuh), so a tile's epilogue runs under the next tile's MMAs. Its math
#: threads keep 96 registers: tiles of 128 x 128 at most.
HANDOFF_TILES = ((128, 128), (128, 64))
#: Operand layouts: which dimension of A (M, K) and of W (N, K) is contiguous. "kk": both K
#: (x @ Wᵀ with W as torch.nn.Linear stores it); "kn": W is a transposed view (the dX GEMM
#: dz @ W reads W (N_out, K_in) as it is stored); "mn": both transposed views (the weight
#: gradient dzᵀ @ x); "mk": A transposed.
MAJORS = ("kk", "kn", "mk", "mn")


_TAG_PREFIX = {"cooperative": "coop", "pingpong": "ping", "streamk": "sk", "overlap": "ppo", "overlap_ordered": "ppoo",
               "handoff": "hoff"}
RASTER_ORDERS = {"heuristic": 0, "along_m": 1, "along_n": 2}
#: The persistent scheduler's grid of tiles (a launch argument; CodaLaunch.raster_order's bit 4): "fitted" (the real
#: tile count along the raster direction; across it, whole bands of `swizzle` clusters: csrc/kernels/fitted_grid.cuh)
#: or "padded" (CUTLASS's own, both counts rounded up to whole bands: the padded tiles run their mainloop for
#: nothing; kept for comparison).
GRIDS = {"fitted": 0, "padded": 4}
#: Where a graph's reductions (row_reduce, col_reduce: fp32 partials per tile) are finished: "launch" (a finalize
#: kernel launched after the GEMM as its programmatic dependent, csrc/kernels/finalize.cuh) or "kernel" (inside the
#: GEMM: the last tile of each row or column of tiles counts itself in and folds them, csrc/epilogues/last_tile.hpp).
#: "kernel" was slower at every shape measured, 1.01-2.4x the launch's time at 128-4096 rows (the tile count's atomic
#: contended where all tiles end together, and fences in every tile's epilogue; H200,
#: benchmarks/results/finish_h200.json): kept as a config for comparison.
FINALIZES = ("launch", "kernel")
#: How the epilogue reads its M x N tile inputs: "tma" (the producer warp's TMA loads into shared memory,
#: read back per subtile) or "direct" (each thread's elements straight from global memory into registers,
#: a subtile ahead; no shared memory: csrc/epilogues/direct_tile_load.hpp).
TILE_LOADS = ("tma", "direct")
#: How the epilogue writes its tile outputs (store and pair_store nodes): "tma" (staged in shared memory, one TMA
#: store per subtile) or "direct" (each thread's fragment written from registers at the end of each subtile; no
#: shared memory, barrier or TMA: csrc/epilogues/variants/direct_store.hpp). The main output D keeps the collective's
#: TMA store.
TILE_STORES = ("tma", "direct")
#: How the epilogue writes the half-width output of a gated pair activation (pair_gated_store: SwiGLU's y): "tma"
#: (staged in shared memory, EPI_M x EPI_N / 2 per store stage, one TMA store per subtile in D's commit group:
#: csrc/epilogues/variants/pair_gated_tma_store.hpp; an output whose base, leading stride or row length is not a
#: multiple of 16 bytes is written from registers: TMA stores write a row's last 16-byte piece whole; where its stages
#: would cost the mainloop one of its first three stages the kernel takes "registers": constraints.fit_gated_store) or
#: "registers" (8-byte global stores after a transpose inside each quad of lanes: csrc/epilogues/pair_gated_store.hpp).
#: The TMA store took the forward SwiGLU from 0.992x to 0.978x cuBLAS (y only) and 1.018x to 1.004x (z and y) at
#: 16384x16384x2048, 0.974x to 0.964x and 0.973x to 0.965x at 16384x28672x4096,
#: the plain GEMM of the same config 0.976x and 0.963x (H200, benchmarks/results/peer_quack_gated_h200.json).
GATED_STORES = ("tma", "registers")
#: How the epilogue's threads access the 32-bit pair tiles and pair stores in shared memory: "vector" (CUTLASS's
#: copy, one 8-byte access per column pair: 2-way bank conflicts under the 128-byte swizzle) or "staggered" (two
#: 4-byte accesses, the halves in opposite orders on rows of opposite parity: conflict-free;
#: csrc/epilogues/staggered_pairs.hpp).
PAIR_SMEM = ("vector", "staggered")
#: The L2 policy of the epilogue's TMA tile loads and stores: "normal", "evict_first" (each line read or
#: written once goes before the mainloop operands' lines: csrc/epilogues/evict_first.hpp; the main output D,
#: stored by CUTLASS's collective, keeps the normal policy) or "prefetch" (the producer warp asks L2 for a
#: whole tile's inputs as it starts the tile, before their shared-memory stages free up:
#: csrc/epilogues/variants/l2_prefetch.hpp; TMA tile loads only).
EPILOGUE_CACHE = ("normal", "evict_first", "prefetch")
#: The most shared-memory stages KernelConfig.epilogue_stages gives the epilogue's loads or stores.
MAX_EPILOGUE_STAGES = 8


def applied_swizzle(swizzle: int, ctas_m: int, ctas_n: int) -> int:
    """The swizzle CUTLASS's SM90 persistent tile scheduler applies for a requested one over ctas_m x ctas_n
    CTAs (each count in whole clusters): lowered to 4, 2, 1 while the smaller count is under 6, 3, 2
    (get_log_swizzle_size), and 16 (csrc/kernels/wide_swizzle.cuh, past CUTLASS's cap) to 8 under 12. The
    count across the raster direction is then rounded up to a multiple of it (tuning.scheduled_tiles)."""
    short = min(ctas_m, ctas_n)
    for applied, need in ((16, 12), (8, 6), (4, 3), (2, 2)):
        if swizzle >= applied and short >= need:
            return applied
    return 1


def applied_raster(raster: str, swizzle: int, ctas_m: int, ctas_n: int, cluster: tuple[int, int]) -> str:
    """The raster order ("along_m" | "along_n") the scheduler walks for a requested one over ctas_m x ctas_n CTAs
    (each rounded up to whole clusters): "heuristic" is along M when there are more N than M CTAs once both are
    rounded up to whole bands of swizzle x cluster, else along N (get_rasterization_order), decided at CUTLASS's
    own swizzle (at most 8; wide_swizzle.cuh keeps the order for 16)."""
    if raster != "heuristic":
        return raster
    s = applied_swizzle(min(swizzle, 8), ctas_m, ctas_n)
    cm, cn = cluster
    return "along_m" if -(-ctas_n // (s * cn)) * s * cn > -(-ctas_m // (s * cm)) * s * cm else "along_n"


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """How the fixed SM90 GEMM runs a graph.

    Compiled into the kernel: tile = (TILE_M, TILE_N, TILE_K); cluster = (CLUSTER_M, CLUSTER_N);
    schedule = cooperative | pingpong | streamk (cooperative with the stream-K tile scheduler: the K
    loop of each output tile is split across CTAs when there are too few tiles to fill the GPU;
    deterministic) | overlap (ping-pong whose two warp groups' epilogues may overlap; its epilogue
    buffers are allocated twice) | overlap_ordered (overlap with the epilogues ordered: debugging) |
    handoff (cooperative MMAs whose epilogue runs on two warp groups of its own, under the next tile's MMAs;
    the accumulators pass through two chunk buffers of a quarter tile each, TILE_M x TILE_N x 2 bytes of
    shared memory; tiles HANDOFF_TILES);
    epilogue_tile = (EPI_M, EPI_N) or None for CUTLASS's choice; epilogue_stages =
    (STAGES_C, STAGES_D), the shared-memory stages of the epilogue's TMA tile loads and of its TMA stores,
    or None for CUTLASS's choice (min(subtiles, 4) and min(subtiles, 2)): deeper load stages let the
    producer warp fetch more of a tile's inputs while the mainloop runs, at the mainloop's expense.
    major = "kk" | "kn" | "mk" | "mn": the contiguous dimension of A (M, K) and of W (N, K) (MAJORS);
    the op reads each operand in that layout, so a transposed view needs no copy. tile_loads = "tma" | "direct":
    how the epilogue reads its tile inputs (TILE_LOADS); tile_stores = "tma" | "direct": how it writes its tile
    outputs (TILE_STORES); gated_store = "tma" | "registers": how it writes the half-width output of a gated pair
    activation (GATED_STORES); timeline: record a per-tile timeline of the epilogue's steps (a diagnostic:
    csrc/epilogues/variants/timeline.hpp, read by benchmarks/epilogue_timeline.py); pair_smem = "vector" |
    "staggered": how it accesses its 32-bit pair tiles and pair stores in shared memory (PAIR_SMEM);
    epilogue_cache = "normal" | "evict_first" | "prefetch": the L2 policy of its TMA tile loads and stores
    (EPILOGUE_CACHE); finalize = "launch" | "kernel": where its reductions are finished (FINALIZES).
    Launch arguments only (no recompile): swizzle (1, 2, 4, 8, 16; 16 is past CUTLASS's own cap,
    csrc/kernels/wide_swizzle.cuh, and not for stream-K), raster (heuristic, along_m, along_n) and grid
    ("fitted" | "padded", GRIDS) of the persistent tile scheduler.
    """

    tile: tuple[int, int, int] = (128, 256, 64)
    cluster: tuple[int, int] = (1, 1)
    schedule: str = "cooperative"
    epilogue_tile: tuple[int, int] | None = None
    swizzle: int = 1
    raster: str = "heuristic"
    grid: str = "fitted"
    major: str = "kk"
    epilogue_stages: tuple[int, int] | None = None
    tile_loads: str = "tma"
    pair_smem: str = "vector"
    epilogue_cache: str = "normal"
    tile_stores: str = "tma"
    gated_store: str = "tma"
    timeline: bool = False
    finalize: str = "launch"

    def __post_init__(self) -> None:
        tm, tn, tk = self.tile
        if self.schedule not in SCHEDULES:
            raise UnsupportedError(f"KernelConfig: schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        min_m = 64 if self.schedule in PINGPONG_SCHEDULES else 128
        if tm not in (64, 128, 256) or tm < min_m:
            raise UnsupportedError(f"KernelConfig: TILE_M={tm} is not supported by the {self.schedule} "
                                   f"schedule; use one of {[m for m in (64, 128, 256) if m >= min_m]}")
        if self.schedule in OVERLAP_SCHEDULES and tuple(self.cluster) not in OVERLAP_CLUSTERS:
            raise UnsupportedError(f"KernelConfig: the {self.schedule} schedule runs in clusters {OVERLAP_CLUSTERS} "
                                   f"(its kernel has been tested on a GPU there only), got cluster={self.cluster}; "
                                   f"use one of those, or schedule='pingpong' for a 2x2 cluster")
        if self.schedule == "handoff" and (tm, tn) not in HANDOFF_TILES:
            raise UnsupportedError(f"KernelConfig: the handoff schedule runs tiles (TILE_M, TILE_N) in {HANDOFF_TILES} "
                                   f"(its math threads hold the accumulators in 96 registers), got tile={self.tile}; "
                                   "use tile=(128, 128, 64), or schedule='cooperative' for larger tiles")
        if self.schedule == "handoff" and tuple(self.cluster) not in OVERLAP_CLUSTERS:
            raise UnsupportedError(f"KernelConfig: the handoff schedule runs in clusters {OVERLAP_CLUSTERS}, got "
                                   f"cluster={self.cluster}")
        if tn not in (64, 128, 192, 256) or tk not in (64, 128):
            raise UnsupportedError(f"KernelConfig: tile {self.tile} unsupported; TILE_N in (64, 128, 192, 256), "
                                   "TILE_K in (64, 128)")
        if self.epilogue_tile is not None:
            em, en = self.epilogue_tile
            if tm % em or tn % en or em not in (64, 128) or en not in (16, 32, 64, 128):
                raise UnsupportedError(f"KernelConfig: epilogue_tile {self.epilogue_tile} must divide the tile "
                                       f"{self.tile} with EPI_M in (64, 128) and EPI_N in (16, 32, 64, 128)")
            want_m = 64 if self.schedule in PINGPONG_SCHEDULES else 128   # CUTLASS's SM90 epilogue builder asserts it
            if em != want_m:
                raise UnsupportedError(f"KernelConfig: the {self.schedule} schedule's epilogue runs subtiles of "
                                       f"{want_m} rows; use epilogue_tile=({want_m}, {en})")
        if self.epilogue_stages is not None:
            sc, sd = self.epilogue_stages
            if not (1 <= sc <= MAX_EPILOGUE_STAGES and 1 <= sd <= MAX_EPILOGUE_STAGES):
                raise UnsupportedError(f"KernelConfig: epilogue_stages {self.epilogue_stages} must be (STAGES_C, "
                                       f"STAGES_D) with each in 1..{MAX_EPILOGUE_STAGES}, or None for CUTLASS's choice")
        if self.swizzle not in (1, 2, 4, 8, 16):
            raise UnsupportedError(f"KernelConfig: swizzle must be 1, 2, 4, 8 or 16, got {self.swizzle}")
        if self.swizzle == 16 and self.schedule == "streamk":
            raise UnsupportedError("KernelConfig: swizzle 16 needs the persistent scheduler (cooperative, pingpong "
                                   "overlap or handoff); the stream-K scheduler swizzles 8 at most: use swizzle=8")
        if self.raster not in RASTER_ORDERS:
            raise UnsupportedError(f"KernelConfig: raster must be one of {list(RASTER_ORDERS)}, got {self.raster!r}")
        if self.grid not in GRIDS:
            raise UnsupportedError(f"KernelConfig: grid must be one of {list(GRIDS)}, got {self.grid!r}")
        if self.finalize not in FINALIZES:
            raise UnsupportedError(f"KernelConfig: finalize must be one of {FINALIZES}, got {self.finalize!r}")
        if self.tile_loads not in TILE_LOADS:
            raise UnsupportedError(f"KernelConfig: tile_loads must be one of {TILE_LOADS}, got {self.tile_loads!r}")
        if not isinstance(self.timeline, bool):
            raise UnsupportedError(f"KernelConfig: timeline must be True or False, got {self.timeline!r}")
        if self.tile_stores not in TILE_STORES:
            raise UnsupportedError(f"KernelConfig: tile_stores must be one of {TILE_STORES}, got {self.tile_stores!r}")
        if self.gated_store not in GATED_STORES:
            raise UnsupportedError(f"KernelConfig: gated_store must be one of {GATED_STORES}, got {self.gated_store!r}")
        if self.pair_smem not in PAIR_SMEM:
            raise UnsupportedError(f"KernelConfig: pair_smem must be one of {PAIR_SMEM}, got {self.pair_smem!r}")
        if self.epilogue_cache not in EPILOGUE_CACHE:
            raise UnsupportedError(f"KernelConfig: epilogue_cache must be one of {EPILOGUE_CACHE}, got "
                                   f"{self.epilogue_cache!r}")
        if self.epilogue_cache == "prefetch" and self.tile_loads == "direct":
            raise UnsupportedError("KernelConfig: epilogue_cache='prefetch' prefetches the epilogue's TMA tile loads; "
                                   "with tile_loads='direct' there are none: use tile_loads='tma' or "
                                   "epilogue_cache='normal'")
        if self.major not in MAJORS:
            raise UnsupportedError(f"KernelConfig: major must be one of {MAJORS} (the contiguous dimension of A "
                                   f"and of W), got {self.major!r}")
        if self.cluster not in ((1, 1), (2, 1), (1, 2), (2, 2)):
            raise UnsupportedError(f"KernelConfig: cluster {self.cluster} unsupported; "
                                   "use (1,1), (2,1), (1,2) or (2,2)")

    @property
    def kernel(self) -> KernelConfig:
        """This config with its launch arguments (swizzle, raster, grid) at their defaults: configs with the same
        kernel build one binary and differ only in how it is launched."""
        return dataclasses.replace(self, swizzle=1, raster="heuristic", grid="fitted")

    @property
    def tag(self) -> str:
        tm, tn, tk = self.tile
        cm, cn = self.cluster
        tag = f"{_TAG_PREFIX[self.schedule]}_{tm}x{tn}x{tk}_c{cm}x{cn}"
        if self.epilogue_tile:
            tag += f"_e{self.epilogue_tile[0]}x{self.epilogue_tile[1]}"
        if self.swizzle != 1:
            tag += f"_s{self.swizzle}"
        if self.raster != "heuristic":
            tag += f"_{self.raster}"
        if self.grid != "fitted":
            tag += f"_{self.grid}"
        if self.finalize != "launch":
            tag += "_fk"
        if self.major != "kk":
            tag += f"_{self.major}"
        if self.epilogue_stages:
            tag += f"_ec{self.epilogue_stages[0]}d{self.epilogue_stages[1]}"
        if self.tile_loads != "tma":
            tag += "_dl"
        if self.pair_smem != "vector":
            tag += "_ps"
        if self.epilogue_cache != "normal":
            tag += {"evict_first": "_ef", "prefetch": "_pf"}[self.epilogue_cache]
        if self.tile_stores != "tma":
            tag += "_ds"
        if self.gated_store != "tma":
            tag += "_gr"
        if self.timeline:
            tag += "_tl"
        return tag


#: The configuration used when the caller gives none: the fastest measured for the design graph
#: (bias + SiLU + tile load + row reduction) at 8192x8192x4096 bf16 on an H100
#: (benchmarks/results/design_h100.json): ping-pong overlaps one warp group's epilogue with the
#: other's tensor-core work.
DEFAULT_CONFIG = KernelConfig(tile=(128, 128, 64), cluster=(1, 1), schedule="pingpong", swizzle=4)
