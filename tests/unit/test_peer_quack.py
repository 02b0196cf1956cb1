"""benchmarks/peer_quack.py without the GPU or the peer: its kernels' plan and the message when QuACK is missing."""
from __future__ import annotations

import importlib.util

import pytest

from benchmarks import peer_quack


def test_build_items_are_each_fused_graph_and_its_plain_twin_in_one_config():
    from coda_ext import graphs

    plain = peer_quack.plain_items()
    items = peer_quack.build_items()
    rows = peer_quack.rows()
    forward = peer_quack.forward_graphs()
    assert len(rows) == 2 and len(items) == 2 * len(rows) + 2 * 2 * len(forward) + len(plain)
    assert [(i[1], i[2]) for i in items[-len(plain):]] == [(i[1], i[2]) for i in plain]
    identity = graphs.identity().build().digest()
    pairs = list(zip(items[:-len(plain)][0::2], items[:-len(plain)][1::2]))
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


def test_plain_items_are_the_identity_in_each_plain_config_and_the_heuristics():
    from coda_ext import graphs

    plain = peer_quack.plain_items()
    shapes = peer_quack.plain_shapes(("1B", "8B"), 16384)
    assert [s[1:] for s in shapes] == [(16384, 16384, 2048), (16384, 8192, 2048), (16384, 28672, 4096),
                                       (16384, 14336, 4096)]
    assert len(plain) == len(shapes) * (1 + len(peer_quack.PLAIN_CONFIGS))
    identity = graphs.identity().build().digest()
    assert all(g.build().digest() == identity and c.schedule == "pingpong" for g, _, c in plain)
