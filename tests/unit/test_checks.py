"""Call-time input validation (coda_ext.runtime.checks) on CPU tensors, and KernelConfig's
own checks. Every failure names the argument and happens before anything reaches a kernel."""
from __future__ import annotations

import pytest
import torch

import coda_ext as ce
from coda_ext.runtime import checks

BF16 = torch.bfloat16


def _check(t, name="res", dtype=BF16, shape=(37, 72), device=None):
    return checks.check_tensor(name, t, dtype=dtype, device=device, shape=shape)


# --- check_operands ------------------------------------------------------------------------------


def test_operands_on_cpu_are_rejected_last():
    """check_operands takes CPU operands (their mistakes are named as themselves); require_gpu, the last
    check, refuses them."""
    A, W = torch.randn(37, 64, dtype=BF16), torch.randn(72, 64, dtype=BF16)
    assert checks.check_operands(A, W, BF16) == (37, 72, 64)
    with pytest.raises(ValueError, match=r"A is on cpu; coda_ext kernels run on a CUDA device: .*\.cuda\(\)"):
        checks.require_gpu(A)


def test_operands_type_and_rank():
    W = torch.randn(72, 64, dtype=BF16)
    with pytest.raises(TypeError, match=r"A and W must be torch.Tensors, got list and Tensor"):
        checks.check_operands([[1.0]], W, BF16)
    with pytest.raises(TypeError, match=r"A and W must be torch.Tensors, got Tensor and ndarray"):
        checks.check_operands(W, W.float().numpy(), BF16)
    with pytest.raises(ValueError, match=r"A must be 2-D, got shape \(2, 37, 64\)"):
        checks.check_operands(torch.randn(2, 37, 64, dtype=BF16), W, BF16)
    with pytest.raises(ValueError, match=r"W must be 2-D, got shape \(72,\)"):
        checks.check_operands(torch.randn(37, 64, dtype=BF16), torch.randn(72, dtype=BF16), BF16)


# --- check_tensor ----------------------------------------------------------------------------------


def test_good_tensors_pass_unchanged():
    t = torch.randn(37, 72, dtype=BF16)
    assert _check(t) is t
    v = torch.randn(72, dtype=torch.float32)
    assert checks.check_tensor("bias", v, dtype=torch.float32, device=None, shape=(72,)) is v
    # padded rows are fine when the row stride is a multiple of 16 bytes
    padded = torch.randn(37, 80, dtype=BF16)[:, :72]
    assert _check(padded) is padded


@pytest.mark.parametrize("bad,type_name", [([1.0], "list"), (3.0, "float"), (None, "NoneType")])
def test_wrong_type(bad, type_name):
    with pytest.raises(TypeError, match=rf"res must be a torch.Tensor, got {type_name}"):
        _check(bad)


def test_wrong_dtype():
    with pytest.raises(TypeError, match=r"res has dtype torch.float16, expected torch.bfloat16; convert it with"):
        _check(torch.randn(37, 72, dtype=torch.float16))


def test_wrong_device():
    with pytest.raises(ValueError,
                       match=r"res is on cpu but the GEMM operands are on cuda:0; move it with \.to\('cuda:0'\)"):
        _check(torch.randn(37, 72, dtype=BF16), device=torch.device("cuda", 0))


def test_wrong_rank():
    with pytest.raises(ValueError, match=r"bias must have 1 dimension\(s\) \(72,\), got shape \(1, 72\)"):
        checks.check_tensor("bias", torch.randn(1, 72, dtype=BF16), dtype=BF16, device=None, shape=(72,))


def test_wrong_shape():
    with pytest.raises(ValueError, match=r"res must have shape \(37, 72\), got \(72, 37\)"):
        _check(torch.randn(72, 37, dtype=BF16))
    with pytest.raises(ValueError, match=r"rstd must have shape \(37,\), got \(36,\)"):
        checks.check_tensor("rstd", torch.randn(36), dtype=torch.float32, device=None, shape=(37,))


def test_non_unit_inner_stride():
    transposed = torch.randn(72, 37, dtype=BF16).t()
    assert transposed.shape == (37, 72)
    with pytest.raises(ValueError,
                       match=r"res must have a contiguous last dimension \(stride 1\), got strides \(1, 37\)"):
        _check(transposed)
    strided = torch.randn(144, dtype=torch.float32)[::2]
    with pytest.raises(ValueError, match=r"bias must have a contiguous last dimension"):
        checks.check_tensor("bias", strided, dtype=torch.float32, device=None, shape=(72,))


def test_unaligned_data_pointer():
    base = torch.randn(37 * 72 + 1, dtype=BF16)
    assert base.data_ptr() % 16 == 0
    shifted = base[1:].view(37, 72)                  # one element (2 bytes) past an aligned base
    with pytest.raises(ValueError, match=r"res's data pointer is not 16-byte aligned"):
        _check(shifted)
    vec = torch.randn(73)[1:]
    with pytest.raises(ValueError, match=r"bias's data pointer is not 16-byte aligned"):
        checks.check_tensor("bias", vec, dtype=torch.float32, device=None, shape=(72,))


def test_row_stride_not_multiple_of_16_bytes():
    t = torch.randn(37, 76, dtype=BF16)[:, :72]      # rows 152 bytes apart
    with pytest.raises(ValueError, match=r"res's rows are 152 bytes apart; they must be a multiple of 16 bytes "
                                         r"\(pad the last dimension to a multiple of 8\)"):
        _check(t)
    f = torch.randn(37, 74, dtype=torch.float32)[:, :72]
    with pytest.raises(ValueError, match=r"multiple of 4\)"):
        _check(f, dtype=torch.float32)


def test_overlapping_rows():
    t = torch.randn(72 + 36 * 8, dtype=BF16).as_strided((37, 72), (8, 1))
    with pytest.raises(ValueError, match=r"res has row stride 8 < 72 columns \(overlapping rows\)"):
        _check(t)


# --- scalars -------------------------------------------------------------------------------------


def test_check_scalar_value():
    assert checks.check_scalar_value("alpha", 2) == 2.0
    assert isinstance(checks.check_scalar_value("alpha", 2), float)
    assert checks.check_scalar_value("alpha", -0.5) == -0.5
    for bad, tname in [(True, "bool"), (torch.tensor(1.0), "Tensor"), ("1", "str"), (None, "NoneType")]:
        with pytest.raises(TypeError,
                           match=rf"alpha is a runtime scalar and must be a Python int or float, got {tname}"):
            checks.check_scalar_value("alpha", bad)


def test_check_scalar_pointer():
    cpu = torch.device("cpu")
    t = torch.tensor([1.5])
    assert checks.check_scalar_pointer("scale", t, cpu) is t
    zero_dim = torch.tensor(1.5)
    assert checks.check_scalar_pointer("scale", zero_dim, cpu) is zero_dim
    with pytest.raises(TypeError,
                       match=r"scale is a device-pointer scalar and must be a one-element torch.Tensor, got float"):
        checks.check_scalar_pointer("scale", 1.5, cpu)
    with pytest.raises(ValueError, match=r"scale is on cpu; it must be on cuda:0"):
        checks.check_scalar_pointer("scale", t, torch.device("cuda", 0))
    with pytest.raises(TypeError,
                       match=r"scale must be a one-element float32 tensor, got torch.float64 with 1 elements"):
        checks.check_scalar_pointer("scale", t.double(), cpu)
    with pytest.raises(TypeError, match=r"got torch.float32 with 2 elements"):
        checks.check_scalar_pointer("scale", torch.ones(2), cpu)


# --- overlap ---------------------------------------------------------------------------------------


def test_two_views_of_one_buffer_overlap():
    buf = torch.empty(2 * 37 * 72, dtype=BF16)
    a = buf[: 37 * 72].view(37, 72)
    b = buf[37 * 36: 37 * 36 + 37 * 72].view(37, 72)
    with pytest.raises(ValueError, match=r"output 'out' overlaps 'pre' in memory"):
        checks.check_no_overlap({"out": a, "pre": b}, {})


def test_output_overlapping_an_input():
    buf = torch.empty(100)
    with pytest.raises(ValueError, match=r"output 'rowsum' overlaps 'bias'"):
        checks.check_no_overlap({"out": torch.empty(8), "rowsum": buf[10:20]}, {"bias": buf[15:30]})


def test_adjacent_and_separate_buffers_do_not_overlap():
    buf = torch.empty(2 * 37 * 72, dtype=BF16)
    a = buf[: 37 * 72].view(37, 72)
    b = buf[37 * 72:].view(37, 72)                     # starts right where a ends
    checks.check_no_overlap({"out": a, "pre": b}, {"A": torch.empty(3, 3), "res": torch.empty(37, 72)})
    # inputs may alias each other
    x = torch.empty(64)
    checks.check_no_overlap({"out": torch.empty(4)}, {"a": x, "b": x[8:]})


def test_an_allowed_alias_is_the_input_itself():
    """aliases={output: input}: that output may be the input's tensor itself (an epilogue that reads each element
    before it writes it there); a partial overlap, another shape or another output's overlap is refused."""
    z = torch.empty(37, 72, dtype=BF16)
    checks.check_no_overlap({"dz": z, "y": torch.empty(37, 36)}, {"z": z}, aliases={"dz": "z"})
    with pytest.raises(ValueError, match=r"output 'dz' may alias input 'z' only as the same tensor"):
        checks.check_no_overlap({"dz": z[1:]}, {"z": z}, aliases={"dz": "z"})
    with pytest.raises(ValueError, match=r"output 'dz' may alias input 'z' only as the same tensor"):
        checks.check_no_overlap({"dz": z.view(72, 37)}, {"z": z}, aliases={"dz": "z"})
    with pytest.raises(ValueError, match=r"output '(dz|y)' overlaps '(y|z)'"):
        checks.check_no_overlap({"dz": z, "y": z[:, :36]}, {"z": z}, aliases={"dz": "z"})
    with pytest.raises(ValueError, match=r"output 'dz' overlaps 'z'"):
        checks.check_no_overlap({"dz": z}, {"z": z})
    # the same bytes in another dtype of the same size (the LM head's fp16 weight gradient over its bfloat16 part)
    checks.check_no_overlap({"dw": z.view(torch.float16)}, {"z": z}, aliases={"dw": "z"})
    with pytest.raises(ValueError, match=r"output 'dw' may alias input 'z' only as the same tensor"):
        checks.check_no_overlap({"dw": z.view(torch.uint8)}, {"z": z}, aliases={"dw": "z"})


def test_strided_view_extent_counts_its_last_element():
    buf = torch.empty(37, 80, dtype=BF16)
    padded = buf[:, :72]
    tail = buf[36, 71:]                                  # overlaps only padded's last element
    with pytest.raises(ValueError, match=r"output 'out' overlaps 'tail'"):
        checks.check_no_overlap({"out": padded, "tail": tail}, {})
    after = buf[36, 72:]                                 # padding after the last element: fine
    checks.check_no_overlap({"out": padded, "after": after}, {})


# --- KernelConfig ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs,pattern", [
    (dict(schedule="warpspecialized"),
     (r"schedule must be one of \('cooperative', 'pingpong', 'streamk', 'overlap', 'overlap_ordered', 'handoff'\), "
      r"got 'warpspecialized'")),
    (dict(tile=(64, 128, 64)), r"TILE_M=64 is not supported by the cooperative schedule; use one of \[128, 256\]"),
    (dict(tile=(32, 128, 64), schedule="pingpong"), r"TILE_M=32 is not supported by the pingpong schedule"),
    (dict(tile=(64, 128, 64), schedule="streamk"), r"TILE_M=64 is not supported by the streamk schedule"),
    (dict(tile=(128, 96, 64)), r"tile \(128, 96, 64\) unsupported"),
    (dict(tile=(128, 128, 32)), r"tile \(128, 128, 32\) unsupported"),
    (dict(cluster=(4, 1)), r"cluster \(4, 1\) unsupported"),
    (dict(cluster=(1, 3)), r"cluster \(1, 3\) unsupported"),
    # regression: CUTLASS's epilogue builder asserts 64-row subtiles in ping-pong, 128 in cooperative (nvcc failed)
    (dict(tile=(128, 128, 64), schedule="pingpong", epilogue_tile=(128, 64)),
     r"pingpong schedule's epilogue runs subtiles of 64 rows; use epilogue_tile=\(64, 64\)"),
    (dict(tile=(128, 128, 64), epilogue_tile=(64, 64)),
     r"cooperative schedule's epilogue runs subtiles of 128 rows; use epilogue_tile=\(128, 64\)"),
    (dict(tile=(128, 128, 64), schedule="streamk", epilogue_tile=(64, 32)), r"subtiles of 128 rows"),
])
def test_kernel_config_rejects(kwargs, pattern):
    with pytest.raises(ce.UnsupportedError, match=pattern):
        ce.KernelConfig(**kwargs)


@pytest.mark.parametrize("kwargs,tag", [
    (dict(), "coop_128x256x64_c1x1"),
    (dict(tile=(64, 128, 64), schedule="pingpong"), "ping_64x128x64_c1x1"),
    (dict(tile=(256, 192, 128), cluster=(2, 2)), "coop_256x192x128_c2x2"),
    (dict(tile=(128, 64, 64), cluster=(1, 2), schedule="pingpong"), "ping_128x64x64_c1x2"),
    (dict(tile=(128, 128, 64), cluster=(2, 1), schedule="streamk"), "sk_128x128x64_c2x1"),
])
def test_kernel_config_accepts(kwargs, tag):
    cfg = ce.KernelConfig(**kwargs)
    assert cfg.tag == tag
    assert hash(cfg) == hash(ce.KernelConfig(**kwargs)) and cfg == ce.KernelConfig(**kwargs)


def test_default_config():
    assert ce.DEFAULT_CONFIG == ce.KernelConfig(tile=(128, 128, 64), cluster=(1, 1), schedule="pingpong",
                                                swizzle=4)
    assert ce.DEFAULT_CONFIG.tag == "ping_128x128x64_c1x1_s4"
    # swizzle is a launch argument: it does not enter the emitted source
    import dataclasses

    from coda_ext.graphs import identity

    g = identity()
    other = dataclasses.replace(ce.DEFAULT_CONFIG, swizzle=1)
    assert ce.emit_source(g, "bfloat16") == ce.emit_source(g, "bfloat16", other)


def test_row_align_relaxed_for_element_stores():
    """Regression: half-width pair-store outputs (M, N/2) are written element by element, so
    their rows need only element alignment (N/2 = 196 fp16 columns = 392-byte rows)."""
    t = torch.empty(513, 196, dtype=torch.float16)
    with pytest.raises(ValueError, match="multiple of 16 bytes"):
        checks.check_tensor("y", t, dtype=torch.float16, device=None, shape=(513, 196))
    assert checks.check_tensor("y", t, dtype=torch.float16, device=None, shape=(513, 196), row_align=2) is t
