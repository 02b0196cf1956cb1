"""constraints: what a graph asks of its kernel config, checked (and filled in) before emission.

A segment_reduce reads a whole segment of a row in one visit, so the epilogue subtile must be
exactly one segment wide: (EPI_M, size), with EPI_M the rows one schedule's epilogue visits at
once (64 for ping-pong, TILE_M for cooperative), and a segment must lie inside one N tile.
A config without an epilogue tile gets that one; a config that contradicts it is refused.
"""
from __future__ import annotations

import dataclasses

from ..config import KernelConfig
from ..errors import UnsupportedError
from ..graph import ir


def segment_size(graph: ir.Graph) -> int | None:
    """The segment width of the graph's segment reductions (one per graph), or None."""
    sizes = sorted({n.attr("size") for n in graph.nodes if n.kind == "segment_reduce"})
    if len(sizes) > 1:
        raise UnsupportedError(f"segment_reduce: one graph may use one segment size, got {sizes}")
    return sizes[0] if sizes else None


def fit_config(graph: ir.Graph, config: KernelConfig) -> KernelConfig:
    """`config`, with the epilogue tile the graph needs; raises UnsupportedError naming the fix."""
    size = segment_size(graph)
    if size is None:
        return config
    tm, tn, _ = config.tile
    if tn % size:
        raise UnsupportedError(
            f"segment_reduce(size={size}): a segment (head) must lie inside one N tile, but config {config.tag} "
            f"has TILE_N={tn}; use a TILE_N that is a multiple of {size}")
    em = 64 if config.schedule == "pingpong" else tm
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
