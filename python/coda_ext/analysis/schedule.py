"""How often a GEMM reads its operands from HBM, given the order the tile scheduler walks tiles.

CUTLASS's persistent SM90 scheduler (tile_scheduler_params.h, sm90_tile_scheduler.hpp) walks the
output tiles in bands: with raster along N it takes a band of `swizzle x CLUSTER_M` tile-rows and
sweeps it across all of N before moving to the next band (along M: the transpose). The heuristic
raster is along M when there are more N tiles than M tiles, else along N; the swizzle is cut down
when the smaller tile count is short (8 needs 6 tiles, 4 needs 3, 2 needs 2).

The model: the band's strips of the operand fixed within a band stay in L2, so that operand is read
from HBM once in all; the swept operand is read once per band, unless it fits in half of L2 (then
it stays there and is read once). Against the DRAM reads Nsight Compute recorded on an H100
(benchmarks/results/ncu_epilogue_cost_h100.txt) it is within 3 % with 128x128 ping-pong tiles at
16384x6144x4096 and with 64x128 tiles at M = 128, but 18-43 % low with 128x256 tiles in 2x1
clusters (16384x6144 and 16384x28672), where L2 keeps less of a band than it holds: treat operand
bytes as a floor. benchmarks/validate_io.py measured it again over 64 rows
(benchmarks/results/io_validation_h100.json, docs/explain.md): 0.94-1.01 for 64x128 and 128x128
tiles, 0.80-2.01 for 128x256 tiles in 2x1 clusters.
"""
from __future__ import annotations

import dataclasses

from ..config import KernelConfig, applied_raster, applied_swizzle


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Tile counts, walk order and operand HBM reads of one (M, N, K) problem under one config."""

    tiles_m: int
    tiles_n: int
    raster: str          # "along_m" | "along_n"
    band: int            # tiles per band across the raster direction (swizzle x cluster)
    bands: int
    a_reads: int         # times A (M x K) is read from HBM
    w_reads: int         # times W (N x K) is read from HBM

    @property
    def tiles(self) -> int:
        return self.tiles_m * self.tiles_n

    def describe(self) -> str:
        swept = "W" if self.raster == "along_n" else "A"
        return (f"{self.tiles_m}x{self.tiles_n} tiles, raster along {self.raster[-1].upper()} in {self.bands} "
                f"band(s) of {self.band}; A read {self.a_reads}x, W read {self.w_reads}x "
                f"({swept} is swept once per band unless it fits in half of L2)")


def schedule(M: int, N: int, K: int, config: KernelConfig, dtype_bytes: int, l2_bytes: float) -> Schedule:
    tm, tn, _ = config.tile
    cm, cn = config.cluster
    tiles_m, tiles_n = -(-M // tm), -(-N // tn)
    ctas_m, ctas_n = -(-tiles_m // cm) * cm, -(-tiles_n // cn) * cn
    sw = applied_swizzle(config.swizzle, ctas_m, ctas_n)
    raster = applied_raster(config.raster, config.swizzle, ctas_m, ctas_n, config.cluster)
    def stays(nbytes):
        return nbytes <= l2_bytes / 2
    if raster == "along_n":
        band = sw * cm
        bands = -(-tiles_m // band)
        a_reads, w_reads = 1, 1 if stays(N * K * dtype_bytes) else bands
    else:
        band = sw * cn
        bands = -(-tiles_n // band)
        a_reads, w_reads = 1 if stays(M * K * dtype_bytes) else bands, 1
    return Schedule(tiles_m, tiles_n, raster, band, bands, a_reads, w_reads)
