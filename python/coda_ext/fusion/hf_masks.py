"""Hugging Face attention masks under torch.compile: no mask tensor where the model needs none.

transformers (`masking_utils`) skips building the attention mask when nothing is masked (no padding mask,
no local window) and SDPA then runs its flash or cuDNN kernel with no mask (or `is_causal`). While Dynamo
traces it cannot look at a mask's values, and some transformers / torch pairs take "tracing" for "maybe
masked" even when there is no padding mask at all: transformers 5.17 asks `is_tracing(None)`, which is true
under torch.compile; 5.23 asks `is_torchdynamo_exporting()`, which torch < 2.14 answers true under
torch.compile too. The compiled model then builds an all-true (B, 1, S, S) mask and SDPA falls back to its
math path (fp32 matrix products and a separate softmax): measured on an H100 for BERT-base at 32 x 512, that
is why torch.compile's step took 66 ms against eager's 49.

`plain_masks()` answers both questions as they are meant while the model traces: with no tensor to look
at there is nothing data-dependent to guard (`is_tracing(None)` is false), and torch.compile is not an
export. A padding mask that is given is still a traced tensor and is kept. `with_plain_masks(compiled)`
runs every call of a compiled module inside it (Dynamo guards on the functions it inlined, so they must
be the same at every call); fuse() does so, and the benchmarks give torch.compile the same.
"""
from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Iterator
from typing import Any
from unittest import mock


@functools.cache
def _patches(mu: Any) -> tuple[tuple[str, Any], ...]:
    """(name, replacement) for masking_utils `mu`: the same function objects at every call (Dynamo guards on
    the functions it inlined)."""
    out = []
    if hasattr(mu, "is_tracing"):
        original = mu.is_tracing

        def is_tracing(tensor: Any = None) -> bool:
            return tensor is not None and original(tensor)

        out.append(("is_tracing", is_tracing))
    if hasattr(mu, "is_torchdynamo_exporting"):
        def is_torchdynamo_exporting() -> bool:
            return False

        out.append(("is_torchdynamo_exporting", is_torchdynamo_exporting))
    return tuple(out)


@contextlib.contextmanager
def plain_masks() -> Iterator[None]:
    """Inside: transformers' mask helpers skip the masks nothing needs while torch.compile traces. A no-op
    where transformers is not imported."""
    mu = sys.modules.get("transformers.masking_utils")
    patches = dict(_patches(mu)) if mu is not None else {}
    if not patches:
        yield
        return
    with mock.patch.multiple(mu, **patches):
        yield


def with_plain_masks(compiled: Any) -> Any:
    """A compiled module (torch.compile's OptimizedModule) whose every call runs inside plain_masks()."""
    inner = compiled.forward

    @functools.wraps(inner)
    def forward(*args: Any, **kwargs: Any) -> Any:
        with plain_masks():
            return inner(*args, **kwargs)

    compiled.forward = forward
    return compiled
