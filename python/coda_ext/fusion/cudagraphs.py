"""The fallback compiler with CUDA graphs (Options(cudagraphs=True)): Inductor's own forward and backward
compilers — those torch.compile(mode="reduce-overhead") runs, which record each compiled graph, fused
kernels included, into a CUDA graph (Inductor's cudagraph trees) and replay it — over the graphs the
fusion leaves, so a step's hundreds of launches cost the host one replay per graph.

They take the fallback's own inner compiler (Inductor's decompositions and joint-graph passes, then
compile_fx_inner: frontend._inductor's steps), and share one CompilerConfigExtra per Dynamo graph, as
torch.compile's forward and backward do. Inductor decides per graph whether it can record it (CUDA
inputs, no CPU work, static shapes); where it cannot, the graph runs as without the option.
"""
from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from ..errors import UnsupportedError

#: Inductor's entry points this needs (torch._inductor.compile_fx; present since torch 2.8 or so)
ENTRY_POINTS = ("create_compiler_config_extra", "compile_fx_forward", "compile_fx_backward",
                "get_num_model_outputs")


def _module():
    from torch._inductor import compile_fx

    missing = [n for n in ENTRY_POINTS if not hasattr(compile_fx, n)]
    if missing:
        raise UnsupportedError(f"coda fusion: cudagraphs=True needs Inductor's {missing}, which torch "
                               f"{torch.__version__} does not have; use cudagraphs=False (the default)")
    return compile_fx


def _on() -> contextlib.AbstractContextManager:
    from torch._inductor import config

    return config.patch({"triton.cudagraphs": True})


def compilers(dynamo_gm: fx.GraphModule, example_inputs: list[Any],
              prepare: Callable[[fx.GraphModule, Any], fx.GraphModule],
              inner: Callable[..., Any]) -> tuple[Callable, Callable, Callable]:
    """(forward, backward, inference) compilers for aot_module_simplified. prepare(gm, inputs): a fused
    graph as Inductor takes it (decomposed); inner(gm, inputs, **kwargs): Inductor's inner compile over it
    (its joint-graph passes, then compile_fx_inner with Inductor's keyword arguments: cudagraphs, the
    static inputs, the graph id)."""
    cfx = _module()
    with _on():
        first = next(iter(inspect.signature(cfx.create_compiler_config_extra).parameters))
        if first == "gm":
            extra = cfx.create_compiler_config_extra(dynamo_gm)
        else:   # older torch: it reads the config module
            from torch._inductor import config

            extra = cfx.create_compiler_config_extra(config)
    outputs, inputs = cfx.get_num_model_outputs(dynamo_gm), len(example_inputs)

    def forward(gm: fx.GraphModule, example: Any, is_inference: bool = False) -> Any:
        with _on():
            return cfx.compile_fx_forward(prepare(gm, example), example, num_orig_model_outputs=outputs,
                                          num_example_inputs=inputs, compiler_config_extra=extra,
                                          inner_compile=inner, is_inference=is_inference)

    def backward(gm: fx.GraphModule, example: Any) -> Any:
        with _on():
            return cfx.compile_fx_backward(prepare(gm, example), example, compiler_config_extra=extra,
                                           inner_compile=inner)

    def inference(gm: fx.GraphModule, example: Any) -> Any:
        return forward(gm, example, is_inference=True)

    return forward, backward, inference
