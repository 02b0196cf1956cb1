"""libcoda's generated kernels (coda_ext.tools.libgen): the committed csrc/kernels/ops files are what the
generator writes from the graphs of coda_ext.ops, the CMake kernel list, the public enums and the
C header name every generated kernel, and the one hand-written epilogue (RmsLinear) is the tree the
JIT emits for rms_scale.graph(activation). CPU only: nothing is compiled."""
from __future__ import annotations

import pathlib
import re

import pytest

from coda_ext import emit_source, kernel_source
from coda_ext.ops import rms_scale
from coda_ext.tools import libgen

ROOT = pathlib.Path(__file__).resolve().parents[2]
OPS_DIR = ROOT / "csrc" / "kernels" / "ops"


@pytest.fixture(scope="module")
def generated() -> dict[str, str]:
    return libgen.generate()


def test_committed_files_are_what_the_generator_writes(generated):
    stale = [name for name, text in generated.items()
             if not (OPS_DIR / name).is_file() or (OPS_DIR / name).read_text() != text]
    assert not stale, (f"{stale} differ from what `python -m coda_ext libgen csrc/kernels/ops` writes: "
                       "regenerate them (and commit the result)")


def test_check_mode_reports_up_to_date(capsys):
    assert libgen.main([str(OPS_DIR), "--check"]) == 0
    assert "0 file(s) differ" in capsys.readouterr().out


def test_check_mode_finds_a_stale_file(tmp_path, generated):
    for name, text in generated.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "qkv_rope_bf16.cu").write_text("// edited by hand\n")
    assert libgen.main([str(tmp_path), "--check"]) == 1
    assert (tmp_path / "qkv_rope_bf16.cu").read_text() == "// edited by hand\n"  # --check writes nothing
    assert libgen.main([str(tmp_path)]) == 0
    assert (tmp_path / "qkv_rope_bf16.cu").read_text() == generated["qkv_rope_bf16.cu"]


def test_every_kernel_has_named_entry_points(generated):
    for k in libgen.KERNELS:
        for suffix in libgen.DTYPES:
            text = generated[f"{k.name}_{suffix}.cu"]
            assert f"CODA_DEFINE_NAMED_ENTRY_POINTS(coda_{k.name}_{suffix}, " in text
            assert "CODA_DEFINE_ENTRY_POINTS(" not in text  # the JIT's prefix would clash between kernels
            # The emitted code's namespace (fusion_arguments has external linkage) is the kernel's own.
            assert "coda_generated" not in text
            assert k.fusion is not None or f"namespace coda_{k.name}_{suffix} {{" in text
            assert ("cutlass::bfloat16_t" in text) == (suffix == "bf16")


def test_slot_constants_follow_the_canonical_order(generated):
    """contract_generated.h numbers slots as the emitted code reads them: inputs by name, then outputs."""
    header = generated[libgen.HEADER]
    for k in libgen.KERNELS:
        src = kernel_source(k.graph(), "bfloat16", libgen.kernel_config(k))
        names = [n for n, _, _ in libgen.slots(src)] + list(k.extra_slots)
        block = header.split(f"namespace {k.name} {{", 1)[1].split(f"}}  // namespace {k.name}", 1)[0]
        got = re.findall(r"inline constexpr int (k\w+)\s*= (\d+);", block.split("namespace slot {", 1)[1])
        assert got == [(libgen._const(n), str(i)) for i, n in enumerate(names)]
        inputs = [n for n, kind, _ in libgen.slots(src) if kind in ("tile", "row_vector", "col_vector", "scalar")]
        assert inputs == sorted(inputs) and names[:len(inputs)] == inputs


def test_configs_are_the_heuristics_at_the_training_shape(generated):
    header = generated[libgen.HEADER]
    by_name = {k.name: libgen.kernel_config(k) for k in libgen.KERNELS}
    assert by_name["lm_head_cross_entropy"].raster == "along_n"     # N = 128256 > 16384, compute only
    assert by_name["linear_residual_norm"].schedule == "cooperative"  # a tile load and K = 14336
    assert "kEpilogueTileM = 64, kEpilogueTileN = 128;" in header    # one head per subtile with QK-norm
    assert "kEpilogueTileM = 64, kEpilogueTileN = 64;" in header


def test_qkv_without_qk_norm_does_not_depend_on_head_dim():
    """One kernel serves head_dim 64 and 128 without QK-norm."""
    from coda_ext.ops import qkv

    cfg = libgen.kernel_config(next(k for k in libgen.KERNELS if k.name == "qkv_rope"))
    assert emit_source(qkv.graph(True, False, 64), "bfloat16", cfg) == emit_source(qkv.graph(True, False, 128),
                                                                                  "bfloat16", cfg)


def test_libcoda_s_op_list_names_every_kernel():
    """csrc/include/coda/op_list.h (which makes the C, C++ and CMake names of every op) has a row for
    every generated kernel, with the enumerator libgen writes into contract_generated.h."""
    rows = re.findall(r'X\(([A-Z0-9_]+), (k\w+), (\d+), "(\w+)"\)',
                      (ROOT / "csrc" / "include" / "coda" / "op_list.h").read_text())
    enum_of = {name: enum for _, enum, _, name in rows}
    for k in libgen.KERNELS:
        assert enum_of.get(k.name) == k.enum, k.name


_ACT_FUNCTORS = {"silu": ("kSilu", "Silu"), "relu": ("kRelu", "Relu"), "gelu": ("kGelu", "GeluErf"),
                 "gelu_tanh": ("kGeluTanh", "GeluTanh")}


def _nodes(source: str) -> list[str]:
    return re.findall(r"^using n\d+ = (.*?);", source, re.M)


def _trees(source: str) -> list[str]:
    return re.findall(r"^using t\d+ = (.*?);", source, re.M)


def test_rms_linear_fusion_is_the_graphs_tree_with_a_runtime_activation():
    k = next(k for k in libgen.KERNELS if k.name == "rms_linear")
    cfg = libgen.kernel_config(k)
    fusions = (OPS_DIR / "fusions.cuh").read_text()
    body = fusions.split("struct RmsLinear {", 1)[1].split("};", 1)[0]
    plain = emit_source(rms_scale.graph(None), "bfloat16", cfg)
    assert _nodes(plain) == ["ColVector<Cfg, float>", "Accumulator", "Compute<Cfg, Mul>"]
    assert _trees(plain) == ["fusion::Sm90EVT<n2::Node, n0::Node, n1::Node>"]
    assert "using n0 = ColVector<Cfg, float>;" in body and "using n1 = Accumulator;" in body
    assert "using n2 = Compute<Cfg, Mul>;" in body and "using n3 = Compute<Cfg, SelectActivation>;" in body
    assert "fusion::Sm90EVT<typename n2::Node, typename n0::Node, n1::Node>" in body
    assert "fusion::Sm90EVT<typename n3::Node, t2>" in body
    cfg_line = re.search(r"^using Cfg = .*;$", plain, re.M).group(0)
    select = fusions.split("struct SelectActivation {", 1)[1].split("};", 1)[0]
    for act, (constant, functor) in _ACT_FUNCTORS.items():
        src = kernel_source(rms_scale.graph(act), "bfloat16", cfg)
        assert _nodes(src.source) == _nodes(plain) + [f"Compute<Cfg, {functor}>"], act
        assert _trees(src.source) == _trees(plain) + ["fusion::Sm90EVT<n3::Node, t2>"], act
        assert re.search(r"^using Cfg = .*;$", src.source, re.M).group(0) == cfg_line  # the same kernel config
        assert libgen.slots(src) == libgen.slots(kernel_source(rms_scale.graph(None), "bfloat16", cfg))
        assert f"case act::{constant}: return MapArrays<scalar::{functor}>{{}}(x);" in select, act
    assert set(_ACT_FUNCTORS) | {None} == set(rms_scale.ACTIVATIONS)


def _rope_tables() -> list[tuple[str, list[tuple[int, int, int]]]]:
    """The (call, [(column, hi bits, lo bits)]) tables of tests/cpp/test_block_ops_host.cpp."""
    text = (ROOT / "tests" / "cpp" / "test_block_ops_host.cpp").read_text()
    tables = []
    for call, body in re.findall(r"// ROPE_TABLE (.*?)\n(.*?)// END ROPE_TABLE", text, re.S):
        rows = [(int(c), int(h, 16), int(lo, 16)) for c, h, lo in
                re.findall(r"\{(\d+), 0x([0-9a-f]+)u, 0x([0-9a-f]+)u\}", body)]
        tables.append((call.strip(), rows))
    return tables


def test_cpp_rope_frequencies_tables_are_pythons():
    """coda::rope_frequencies (C++) is tested against these bit patterns: they must stay
    coda_ext.ops.rope_frequencies' numbers."""
    import struct

    import torch

    from coda_ext.ops import rope_frequencies

    tables = dict(_rope_tables())
    assert set(tables) == {"rope_frequencies(64, 4, 2, theta=500000)",
                           "rope_frequencies(128, 2, 1, inv_freq=[0.01, 0.02, ..., 0.64])"}
    python = {
        "rope_frequencies(64, 4, 2, theta=500000)": rope_frequencies(64, 4, 2, theta=500000.0),
        "rope_frequencies(128, 2, 1, inv_freq=[0.01, 0.02, ..., 0.64])":
            rope_frequencies(128, 2, 1, inv_freq=torch.arange(1, 65, dtype=torch.float64) * 0.01),
    }

    def bits(x: float) -> int:
        return struct.unpack("<I", struct.pack("<f", x))[0]

    for call, rows in tables.items():
        table = python[call]
        assert len(rows) >= 6
        for col, hi, lo in rows:
            assert (bits(float(table[0, col])), bits(float(table[1, col]))) == (hi, lo), (
                f"{call} column {col}: tests/cpp/test_block_ops_host.cpp has ({hi:#x}, {lo:#x}); if "
                "coda_ext.ops.rope_frequencies changed, change csrc/lib/rope.cpp to match and update the table")
