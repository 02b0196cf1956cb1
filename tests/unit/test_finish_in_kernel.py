"""Reductions finished inside the GEMM (csrc/epilogues/last_tile.hpp), on CPU: the launch argument that picks where
(KernelConfig.finalize) and its C++ twin, the emitted fusion (the finishing node at the root of every graph with
reductions, no other), and that the choice never changes the kernel."""
from __future__ import annotations

import dataclasses
import re

import pytest

import coda_ext as ce
from coda_ext.config import FINALIZES, FINISH_IN_KERNEL_MAX_M, GRIDS, RASTER_ORDERS
from coda_ext.errors import UnsupportedError
from coda_ext.graphs import backward, epilogues
from coda_ext.jit import emit_source, paths


def _constant(text: str, name: str) -> int:
    return int(re.search(rf"constexpr \w+ {name} = (\d+);", text).group(1))


def test_the_finalize_bits_and_bound_match_the_kernel_header():
    text = (paths.csrc_dir() / "kernels" / "finalize.cuh").read_text()
    assert FINALIZES == {"auto": _constant(text, "kFinalizeAuto"), "launch": _constant(text, "kFinalizeLaunch"),
                         "kernel": _constant(text, "kFinalizeInKernel")}
    assert _constant(text, "kFinalizeMask") == FINALIZES["launch"] | FINALIZES["kernel"]
    assert FINISH_IN_KERNEL_MAX_M == _constant(text, "kFinishInKernelMaxM")
    other = max(RASTER_ORDERS.values()) | max(GRIDS.values())   # the raster and grid bits are elsewhere
    assert all(v & other == 0 for v in FINALIZES.values())


def test_finalize_is_a_launch_argument():
    cfg = ce.KernelConfig((128, 128, 64), (1, 1), "pingpong")
    kernel = dataclasses.replace(cfg, finalize="kernel")
    assert kernel.kernel == cfg.kernel and kernel.tag == cfg.tag + "_fin_kernel"
    g = epilogues.store_rowsum()
    assert emit_source(g, "bfloat16", kernel) == emit_source(g, "bfloat16", cfg)
    with pytest.raises(UnsupportedError, match="finalize must be one of"):
        ce.KernelConfig(finalize="gpu")


@pytest.mark.parametrize("build,no_d", [(epilogues.store_rowsum, False), (backward.swiglu_backward_linear, True)])
def test_graphs_with_reductions_get_the_finishing_node(build, no_d):
    src = emit_source(build(), "bfloat16", ce.KernelConfig((128, 128, 64), (1, 1), "pingpong"))
    assert "using Fusion = FinishReductions<Cfg, FusionBody>;" in src or \
        "using FusionTree = FinishReductions<Cfg, FusionBody>;" in src
    assert ("WithoutD<FusionTree" in src) == no_d
    assert re.search(r"return Fusion::Arguments\{.*\{\}\};", src, re.S)


def test_graphs_without_reductions_do_not():
    src = emit_source(epilogues.identity(), "bfloat16", ce.KernelConfig((128, 128, 64), (1, 1), "pingpong"))
    assert "FinishReductions" not in src and "using Fusion = " in src
