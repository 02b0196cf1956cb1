"""Kernel configurations: the tile, cluster and schedule of the fixed SM90 mainloop."""
from __future__ import annotations

import dataclasses

from .errors import UnsupportedError

SCHEDULES = ("cooperative", "pingpong")


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """tile = (TILE_M, TILE_N, TILE_K); cluster = (CLUSTER_M, CLUSTER_N); schedule = cooperative|pingpong."""

    tile: tuple[int, int, int] = (128, 256, 64)
    cluster: tuple[int, int] = (1, 1)
    schedule: str = "cooperative"

    def __post_init__(self) -> None:
        tm, tn, tk = self.tile
        if self.schedule not in SCHEDULES:
            raise UnsupportedError(f"KernelConfig: schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        min_m = 128 if self.schedule == "cooperative" else 64
        if tm not in (64, 128, 256) or tm < min_m:
            raise UnsupportedError(f"KernelConfig: TILE_M={tm} is not supported by the {self.schedule} "
                                   f"schedule; use one of {[m for m in (64, 128, 256) if m >= min_m]}")
        if tn not in (64, 128, 192, 256) or tk not in (64, 128):
            raise UnsupportedError(f"KernelConfig: tile {self.tile} unsupported; TILE_N in (64, 128, 192, 256), "
                                   "TILE_K in (64, 128)")
        if self.cluster not in ((1, 1), (2, 1), (1, 2), (2, 2)):
            raise UnsupportedError(f"KernelConfig: cluster {self.cluster} unsupported; use (1,1), (2,1), (1,2) or (2,2)")

    @property
    def tag(self) -> str:
        tm, tn, tk = self.tile
        cm, cn = self.cluster
        return f"{self.schedule[:4]}_{tm}x{tn}x{tk}_c{cm}x{cn}"


#: The configuration used when the caller gives none.
DEFAULT_CONFIG = KernelConfig()
