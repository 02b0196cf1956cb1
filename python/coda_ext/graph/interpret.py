"""The reference interpreter: evaluates an epilogue graph with PyTorch.

It runs the semantic definition of every node kind (kinds.py points each kind at its function
in semantics.py), is the oracle of the tests, and is what users run where there is no SM90 GPU.
Math runs in `compute_dtype` (fp32 by default, fp64 for a tighter reference; a 16-bit dtype
gives the "same math in PyTorch at that precision" baseline of the tolerance rule). Results are
returned unrounded in `compute_dtype`.
"""
from __future__ import annotations

from typing import Any

import torch

from . import ir, signature
from .canonical import as_ir
from .kinds import KINDS
from .semantics import Env, torch_dtype

__all__ = ["Outputs", "interpret", "torch_dtype"]


class Outputs(dict):
    """Named results of a graph: `outs["sqsum"]` or `outs.sqsum`; the main output under its name."""

    def __getattr__(self, name: str) -> torch.Tensor:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"no output named {name!r}; outputs are {sorted(self)}") from None


def interpret(graph: Any, A: torch.Tensor, W: torch.Tensor, *args: Any, compute_dtype: torch.dtype = torch.float32,
              **inputs: Any) -> Outputs:
    """Evaluates `graph` on A (M, K) and W (N, K): returns every output by name, unrounded.

    It takes what the compiled op takes (coda_ext.graph.signature's rules, with the op's messages):
    inputs by name; A (..., K) with leading batch dimensions, per-token inputs (..., N) and (...) and
    outputs shaped alike; with bf16 or fp16 operands (the op's dtype) W and every input in the dtype
    the op takes. fp32 and fp64 operands (a reference at higher precision) take inputs of any dtype."""
    g = as_ir(graph)
    A, inputs, lead = _check_call(g, A, W, args, inputs)

    env = Env(A, W, inputs, compute_dtype, g, KINDS, outs=Outputs())
    vals: list[Any] = [None] * len(g)
    for i, n in enumerate(g.nodes):
        kind = KINDS.get(n.kind)
        if kind is None:
            raise NotImplementedError(f"interpret: node kind {n.kind!r} is not in the registry (graph/kinds.py)")
        vals[i] = kind.interpret(env, n, *(vals[j] for j in n.inputs))
    return _batched(g, env.outs, lead)


def _check_call(g: ir.GraphIR, A: Any, W: Any, args: tuple, inputs: dict[str, Any]):
    """(A as (M, K), the inputs with per-token ones flattened alike, A's leading dimensions), once the call
    passes the checks a compiled op makes of it (those of its signature: a kernel's strides, alignment
    and device are not the interpreter's business)."""
    names = [g[i].name for i in g.input_nodes()]
    signature.by_name(args, names, "interpret(graph, A, W")
    signature.check_names(inputs, names, takes="the graph's inputs are")
    if not isinstance(A, torch.Tensor) or not isinstance(W, torch.Tensor):
        signature.check_operands(A, W)
    lead = tuple(A.shape[:-1])
    if A.dim() > 2:  # (B, S, K) as F.linear takes it: rows are tokens
        A = A.reshape(-1, A.shape[-1])
        kinds = {g[i].name: g[i].kind for i in g.input_nodes()}
        inputs = {k: signature.flatten_input(kinds[k], v) for k, v in inputs.items()}
    M, N, _ = signature.check_operands(A, W)
    dtype = A.dtype if A.dtype in (torch.bfloat16, torch.float16) else None   # the op's, if an op could take A
    if dtype is not None:
        signature.check_dtype("W", W, dtype)
    signature.check_columns(N, *signature.columns(g))
    for i in g.input_nodes():
        n = g[i]
        if n.kind == "scalar":
            if dtype is not None:
                signature.check_scalar(n.name, inputs[n.name], pointer=n.attr("mode") == "pointer")
            continue
        want = None if dtype is None else torch_dtype(n.attr("dtype")) if n.attr("dtype") else dtype
        signature.check_input(n.name, inputs[n.name], want, signature.input_shape(n.kind, M, N))
    return A, inputs, lead


def _batched(g: ir.GraphIR, outs: Outputs, lead: tuple[int, ...]) -> Outputs:
    """Per-token outputs with A's leading dimensions (none to restore for a 2-D A)."""
    if len(lead) < 2:
        return outs
    kinds = {n.name: n.kind for n in g.nodes if n.is_sink}
    return Outputs({k: signature.unflatten_output(kinds[k], v, lead) for k, v in outs.items()})
