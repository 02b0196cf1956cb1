"""A fresh Dynamo for each test that compiles: caches reset and counters (graph breaks) cleared before,
caches reset after, so one test's compiled graphs and counts never leak into the next."""
from __future__ import annotations

import pytest


@pytest.fixture
def fresh_dynamo():
    import torch
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()
