"""The torch custom op every graph op runs through: coda_ext::run_graph.

One generic op serves every compiled graph (as QuACK's gemm_epi does): its first argument is
the key of a registered op (a string constant to Dynamo), the others are A, W and the graph's
runtime inputs in slot order. The fake implementation gives every output's shape and dtype
from the graph, so the op traces under torch.compile(fullgraph=True) without a graph break, after
the same argument checks as the real one (GraphOp.check_call: a mistake is refused while tracing, and
on meta tensors, with the message a launch gives); the real one checks and launches (the kernel
cache is touched only there).
"""
from __future__ import annotations

from typing import Any

import torch

_OPS: dict[str, Any] = {}


def register(key: str, op: Any) -> str:
    """Makes `op` callable through run_graph under `key` (the latest op of a key wins: same graph,
    same dtype and config give the same kernel)."""
    _OPS[key] = op
    return key


def lookup(key: str) -> Any:
    try:
        return _OPS[key]
    except KeyError:
        raise RuntimeError(f"coda_ext::run_graph: no compiled op registered under {key!r} in this process; "
                           "build it with coda_ext.compile(...) first") from None


@torch.library.custom_op("coda_ext::run_graph", mutates_args=())
def run_graph(key: str, A: torch.Tensor, W: torch.Tensor, tensors: list[torch.Tensor | None],
              scalars: list[float]) -> list[torch.Tensor]:
    op = lookup(key)
    outs = op.run(A, W, op.inputs_from_lists(tensors, scalars), {})
    return [outs[n] for n in op.output_names]


@run_graph.register_fake
def _run_graph_fake(key, A, W, tensors, scalars):
    op = lookup(key)
    M, N, _ = op.check_call(A, W, op.inputs_from_lists(tensors, scalars), {})  # what the real one would refuse
    return [op.empty_output(name, M, N, A.device) for name in op.output_names]
