"""Reductions finished inside the GEMM (KernelConfig(finalize="kernel"), csrc/epilogues/last_tile.hpp), on CPU: the
option's validation and tag, and the emitted fusion: the finishing node at the root of a graph with reductions in
that config only (with and without a main output, tree and topological), never in the default."""
from __future__ import annotations

import dataclasses
import re

import pytest

import coda_ext as ce
from coda_ext.errors import UnsupportedError
from coda_ext.graphs import backward, epilogues
from coda_ext.jit import emit_source

PING = ce.KernelConfig((128, 128, 64), (1, 1), "pingpong")
IN_KERNEL = dataclasses.replace(PING, finalize="kernel")


def test_finalize_is_a_compiled_option():
    assert PING.finalize == "launch" and IN_KERNEL.tag == PING.tag + "_fk" and IN_KERNEL.kernel != PING.kernel
    with pytest.raises(UnsupportedError, match="finalize must be one of"):
        ce.KernelConfig(finalize="auto")


@pytest.mark.parametrize("build,no_d", [(epilogues.store_rowsum, False), (backward.swiglu_backward_linear, True)])
def test_graphs_with_reductions_get_the_finishing_node_in_that_config(build, no_d):
    src = emit_source(build(), "bfloat16", IN_KERNEL)
    fusion = "FusionTree" if no_d else "Fusion"
    assert f"using {fusion} = FinishReductions<Cfg, FusionBody>;" in src
    assert ("WithoutD<FusionTree" in src) == no_d
    assert re.search(r"return Fusion::Arguments\{.*\{\}\};", src, re.S)
    assert "FinishReductions" not in emit_source(build(), "bfloat16", PING)


def test_graphs_without_reductions_never_do():
    assert "FinishReductions" not in emit_source(epilogues.identity(), "bfloat16", IN_KERNEL)
