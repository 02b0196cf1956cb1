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
export. A padding mask that is given is still a traced tensor and is kept.

A third question decides a causal LM's training step: with no attention mask and no KV cache
(`use_cache=False`, the setting training wants), transformers looks for packed sequences in the
position ids (a row whose positions restart holds several sequences, each to attend only within itself:
`find_packed_sequence_indices`). Traced, it cannot read them, so it takes every batch for packed and
builds a full (B, 1, S, S) mask: SDPA then runs masked and not causal, with K and V repeated for every
query head — measured on an H200 for a Llama-3.2-1B-like step (2 × 2048 tokens, 16 layers), attention
took 15.4 ms of kernel time under torch.compile against 5.8 in the hand-written patch (eager: cuDNN's
causal kernel over the grouped heads). `plain_masks(unpacked=True)` answers "no packed sequences": what a
caller that passes no `position_ids` means (the model numbers every row 0, 1, ... itself). A caller that
passes them keeps transformers' check (and its mask).

`with_plain_masks(compiled)` runs every call of a compiled module inside it, `unpacked` when the call
passes no position ids (Dynamo guards on the functions it inlined: each answer is one function object at
every call, and a change between calls recompiles); fuse() does so, and the benchmarks give torch.compile
the same.
"""
from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Iterator
from typing import Any
from unittest import mock


@functools.cache
def _patches(mu: Any, unpacked: bool = False) -> tuple[tuple[str, Any], ...]:
    """(name, replacement) for masking_utils `mu`: the same function objects at every call (Dynamo guards on
    the functions it inlined). unpacked: no row holds packed sequences."""
    out = []
    if unpacked and hasattr(mu, "find_packed_sequence_indices"):
        def find_packed_sequence_indices(position_ids: Any) -> None:
            return None

        out.append(("find_packed_sequence_indices", find_packed_sequence_indices))
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
def plain_masks(unpacked: bool = False) -> Iterator[None]:
    """Inside: transformers' mask helpers skip the masks nothing needs while torch.compile traces; unpacked:
    the batch holds no packed sequences (the caller passed no position ids). A no-op where transformers is
    not imported."""
    mu = sys.modules.get("transformers.masking_utils")
    patches = dict(_patches(mu, unpacked)) if mu is not None else {}
    if not patches:
        yield
        return
    with mock.patch.multiple(mu, **patches):
        yield


def unpacked_call(args: tuple, kwargs: dict) -> bool:
    """Whether a model call passes no position ids (keyword, or the third positional argument of a transformers
    model's forward(input_ids, attention_mask, position_ids, ...))."""
    return kwargs.get("position_ids") is None and (len(args) < 3 or args[2] is None)


def with_plain_masks(compiled: Any) -> Any:
    """A compiled module (torch.compile's OptimizedModule) whose every call runs inside plain_masks(), unpacked
    when the call passes no position ids."""
    inner = compiled.forward

    @functools.wraps(inner)
    def forward(*args: Any, **kwargs: Any) -> Any:
        with plain_masks(unpacked_call(args, kwargs)):
            return inner(*args, **kwargs)

    compiled.forward = forward
    return compiled
