"""The graphs the GPU suite compiles: every node kind appears in at least one of them (each from
coda_ext.graphs, the one home of the project's graphs).

Shared by tests/gpu (numerics) and `python -m coda_ext prebuild tests/gpu/cases.py` (builds
them all in parallel ahead of the tests). Each case: a builder function and its dtypes.
Inputs are described so the tests can make fresh random tensors for any (M, N).
"""
from __future__ import annotations

from coda_ext.graphs import binary, design, example, identity, reductions, unary_a, unary_b
from coda_ext.graphs import pair_gates as swiglu  # the suite's name of the gated-pairs case

#: name -> (builder, dtypes the GPU suite runs it in)
CASES = {
    "design": (design, ("bfloat16", "float16")),
    "example": (example, ("bfloat16", "float16")),
    "unary_a": (unary_a, ("bfloat16",)),
    "unary_b": (unary_b, ("float16",)),
    "binary": (binary, ("bfloat16", "float16")),
    "reductions": (reductions, ("bfloat16",)),
    "swiglu": (swiglu, ("bfloat16", "float16")),
    "identity": (identity, ("bfloat16",)),
}


def config_cases():
    """(case, dtype, config) run at configs other than the default: every config the "auto"
    heuristic picks, with a tile load and a reduction, and stream-K with those, the pair node
    and an aux store; the tile load with deeper epilogue stages (KernelConfig.epilogue_stages); the overlap
    schedule (heuristic's OVERLAP) with row and column reductions, the pair node and an aux store too."""
    from coda_ext import KernelConfig, tuning

    return ([("design", "bfloat16", c) for c in tuning.HEURISTIC_CONFIGS]
            + [("reductions", "bfloat16", tuning.COOP_SMALL), ("reductions", "bfloat16", tuning.LARGE),
               ("design", "bfloat16", tuning.STREAMK), ("swiglu", "float16", tuning.STREAMK),
               ("swiglu", "bfloat16", tuning.WIDE), ("swiglu", "bfloat16", tuning.TALL_192_PAIRS),
               ("swiglu", "float16", tuning.TALL_192), ("reductions", "bfloat16", tuning.TALL_192),
               ("example", "bfloat16", tuning.STREAMK),
               ("reductions", "bfloat16", tuning.OVERLAP), ("swiglu", "bfloat16", tuning.OVERLAP),
               ("example", "bfloat16", tuning.OVERLAP),
               ("design", "bfloat16", KernelConfig((128, 128, 64), (1, 1), "pingpong", epilogue_stages=(8, 2)))])


#: The cases test_numerics runs with config="auto" (every config the heuristic may pick for them).
AUTO_CASES = ("design", "swiglu")


def build_items():
    """(graph, dtype, config) for coda_ext.prebuild: the cases, their config cases, and every config "auto"
    may pick for AUTO_CASES in bf16 (test_numerics.test_auto_dispatches_by_shape launches them)."""
    return ([(fn(), dtype, None) for fn, dtypes in CASES.values() for dtype in dtypes]
            + [(CASES[name][0](), dtype, cfg) for name, dtype, cfg in config_cases()]
            + [(CASES[name][0](), "bfloat16", "auto") for name in AUTO_CASES])
