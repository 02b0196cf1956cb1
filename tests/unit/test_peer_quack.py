"""benchmarks/peer_quack.py without the GPU or the peer: its kernels' plan and the message when QuACK is missing."""
from __future__ import annotations

import importlib.util

import pytest

from benchmarks import peer_quack


def test_build_items_are_each_fused_graph_and_its_plain_twin_in_one_config():
    from coda_ext import graphs

    items = peer_quack.build_items()
    rows = peer_quack.rows()
    forward = peer_quack.forward_graphs()
    assert len(rows) == 2 and len(items) == 2 * len(rows) + 2 * 2 * len(forward)
    identity = graphs.identity().build().digest()
    pairs = list(zip(items[0::2], items[1::2]))
    fused_graphs = [g.graph() for g in rows] + [graph for _ in ("1B", "8B") for graph in forward.values()]
    for graph, (fused, plain) in zip(fused_graphs, pairs):
        assert fused[0].build().digest() == graph.build().digest() and plain[0].build().digest() == identity
        assert fused[2] == plain[2] and fused[2].schedule == "pingpong"
    assert peer_quack.forward_shape("8B", 16384) == (16384, 28672, 4096)


@pytest.mark.skipif(importlib.util.find_spec("quack") is not None, reason="QuACK is installed here")
def test_without_quack_the_benchmark_says_how_to_install_it():
    pytest.importorskip("torch")
    with pytest.raises(SystemExit, match="pip install quack-kernels"):
        peer_quack.main(["--models", "1B"])
