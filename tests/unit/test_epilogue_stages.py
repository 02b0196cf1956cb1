"""KernelConfig.epilogue_stages: the epilogue's load and store pipeline stages, from the config to the
emitted Config<> template arguments, the tag (a kernel per stage count) and the shared-memory model."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import coda_ext as ce
from coda_ext import graphs
from coda_ext.codegen import constraints
from coda_ext.config import MAX_EPILOGUE_STAGES


def _cfg(**kw):
    return ce.KernelConfig((128, 128, 64), (1, 1), "pingpong", swizzle=4, major="kn", **kw)


def _cfg_line(source: str) -> str:
    return next(x for x in source.splitlines() if x.startswith("using Cfg = "))


def test_tag_and_template_arguments():
    base, staged = _cfg(), _cfg(epilogue_stages=(6, 3))
    assert staged.tag == base.tag + "_ec6d3"
    line = _cfg_line(ce.kernel_source(graphs.swiglu_backward_linear(), torch.bfloat16, staged).source)
    assert line.endswith("coda::kernels::Pingpong, 0, 0, false, true, 6, 3>;"), line
    kk = dataclasses.replace(staged, major="kk")   # the short form grows the layout flags to reach the stages
    assert _cfg_line(ce.kernel_source(graphs.swiglu_backward_linear(), torch.bfloat16, kk).source).endswith(
        "coda::kernels::Pingpong, 0, 0, false, false, 6, 3>;")
    assert _cfg_line(ce.kernel_source(graphs.swiglu_backward_linear(), torch.bfloat16, base).source).endswith(
        "coda::kernels::Pingpong, 0, 0, false, true>;")


def test_each_stage_count_is_its_own_kernel():
    sources = {s: ce.kernel_source(graphs.swiglu_backward_linear(), "bfloat16", _cfg(epilogue_stages=s)).source
               for s in (None, (4, 2), (8, 2))}
    assert len(set(sources.values())) == 3


def test_shared_memory_model_counts_the_stages():
    """A pair tile's buffers grow with STAGES_C, stores with STAGES_D; the default is CUTLASS's (4, 2)."""
    ir = graphs.swiglu_backward_linear().build()
    auto = constraints.epilogue_buffers(ir, "bfloat16", _cfg())
    same = constraints.epilogue_buffers(ir, "bfloat16", _cfg(epilogue_stages=(4, 2)))
    deep = constraints.epilogue_buffers(ir, "bfloat16", _cfg(epilogue_stages=(8, 4)))
    assert auto == same
    assert deep["D staging"] == 2 * auto["D staging"]
    tiles = [k for k in auto if k.startswith(("pair tile", "tile"))]
    assert tiles and all(deep[k] == 2 * auto[k] for k in tiles)
    assert constraints.mainloop_stages(ir, "bfloat16", _cfg(epilogue_stages=(8, 4))) < \
        constraints.mainloop_stages(ir, "bfloat16", _cfg())


def test_too_deep_is_refused_before_nvcc():
    g = graphs.swiglu_backward_linear()
    with pytest.raises(ce.UnsupportedError, match="shared memory"):
        ce.kernel_source(g, "bfloat16", ce.KernelConfig((128, 256, 64), (1, 1), "pingpong",
                                                        epilogue_stages=(MAX_EPILOGUE_STAGES, MAX_EPILOGUE_STAGES)))


@pytest.mark.parametrize("stages", [(0, 2), (4, 0), (MAX_EPILOGUE_STAGES + 1, 2), (2, MAX_EPILOGUE_STAGES + 1)])
def test_bad_stage_counts(stages):
    with pytest.raises(ce.UnsupportedError, match="epilogue_stages"):
        _cfg(epilogue_stages=stages)
