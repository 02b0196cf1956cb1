"""benchmarks/peer_quack.py without the GPU or the peer: its kernels' plan and the message when QuACK is missing."""
from __future__ import annotations

import importlib.util

import pytest

from benchmarks import peer_quack


def test_build_items_are_each_fused_graph_and_its_plain_twin_in_one_config():
    """The dSwiGLU rows: the fused graph and its plain twin in one config; the forward rows: the fused graph, the same
    with its gated output written the other way (gated_store), and the plain twin; then the plain rows."""
    import dataclasses

    from coda_ext import graphs

    plain = peer_quack.plain_items()
    items = peer_quack.build_items()
    rows = peer_quack.rows()
    forward = peer_quack.forward_graphs()
    n_back = 2 * len(rows)
    assert len(rows) == 2 and len(items) == n_back + 3 * 2 * len(forward) + len(plain)
    assert [(i[1], i[2]) for i in items[-len(plain):]] == [(i[1], i[2]) for i in plain]
    identity = graphs.identity().build().digest()
    for g, fused, twin in zip(rows, items[:n_back:2], items[1:n_back:2]):
        assert fused[0].build().digest() == g.graph().build().digest() and twin[0].build().digest() == identity
        assert fused[2] == twin[2] and fused[2].schedule == "pingpong"
    fwd = items[n_back:-len(plain)]
    for graph, (fused, other, twin) in zip([gr for _ in ("1B", "8B") for gr in forward.values()],
                                           zip(fwd[0::3], fwd[1::3], fwd[2::3])):
        assert fused[0].build().digest() == graph.build().digest() == other[0].build().digest()
        assert twin[0].build().digest() == identity and fused[2] == twin[2] and fused[2].schedule == "pingpong"
        assert other[2] == dataclasses.replace(fused[2], gated_store={"tma": "registers", "registers": "tma"}[
            fused[2].gated_store])
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


def test_no_peer_times_the_forward_rows_only():
    """--no-peer (no QuACK needed) runs the forward rows alone: with --plain or --no-forward it says so before any GPU
    work."""
    for extra in (["--plain"], ["--no-forward"]):
        with pytest.raises(SystemExit):
            peer_quack.main(["--no-peer", *extra])
