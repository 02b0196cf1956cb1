"""benchmarks/peer_quack.py without the GPU or the peer: its kernels' plan and the message when QuACK is missing."""
from __future__ import annotations

import importlib.util

import pytest

from benchmarks import peer_quack


def test_build_items_are_the_fused_dswiglu_and_its_plain_twin_per_row():
    from coda_ext import graphs

    items = peer_quack.build_items()
    rows = peer_quack.rows()
    assert len(items) == 2 * len(rows) and len(rows) == 2
    identity = graphs.identity().build().digest()
    for g, (fused, plain) in zip(rows, zip(items[0::2], items[1::2])):
        assert fused[0].build().digest() == g.graph().build().digest() and plain[0].build().digest() == identity
        assert fused[2] == plain[2] and fused[2].schedule == "pingpong"


@pytest.mark.skipif(importlib.util.find_spec("quack") is not None, reason="QuACK is installed here")
def test_without_quack_the_benchmark_says_how_to_install_it():
    pytest.importorskip("torch")
    with pytest.raises(SystemExit, match="pip install quack-kernels"):
        peer_quack.main(["--models", "1B"])
