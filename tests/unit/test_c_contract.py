"""libcoda's enums have one home each: the status codes are coda/abi.h's CODA_STATUS_LIST, the ops
coda/op_list.h's CODA_OP_LIST. The C constants, the C++ enums and the names are expanded from them,
CMake reads the op list, and the Python side's copies of ABI limits match abi.h. CPU only: the
headers are read as text (cmake, where installed, runs in script mode)."""
from __future__ import annotations

import pathlib
import re
import shutil
import subprocess

import pytest

from coda_ext.graph.verify import MAX_SLOTS
from coda_ext.tools import libgen

ROOT = pathlib.Path(__file__).resolve().parents[2]
INCLUDE = ROOT / "csrc" / "include" / "coda"


def _op_rows() -> list[tuple[str, str, int, str]]:
    rows = re.findall(r'^  X\(([A-Z0-9_]+), (k\w+), (\d+), "(\w+)"\)', (INCLUDE / "op_list.h").read_text(),
                      re.MULTILINE)
    return [(c, e, int(v), n) for c, e, v, n in rows]


def _status_rows() -> list[tuple[str, str, int, str]]:
    rows = re.findall(r'^  X\((CODA_\w+), (k\w+), (\d+), "([^"]+)"\)', (INCLUDE / "abi.h").read_text(), re.MULTILINE)
    return [(c, e, int(v), n) for c, e, v, n in rows]


def test_op_list_is_well_formed():
    rows = _op_rows()
    assert [v for _, _, v, _ in rows] == list(range(len(rows)))   # the kernel table is indexed by value
    assert all(c == n.upper() for c, _, _, n in rows)             # CODA_OP_<NAME> spells "name"
    assert len({e for _, e, _, _ in rows}) == len(rows)
    assert [n for _, _, _, n in rows][:5] == ["gemm", "gemm_bias_act", "gemm_residual", "gemm_swiglu",
                                              "gemm_row_sumsq"]


def test_every_op_has_its_kernel_files_and_libgen_s_kernels_are_ops():
    names = [n for _, _, _, n in _op_rows()]
    ops_dir = ROOT / "csrc" / "kernels" / "ops"
    missing = [f"{n}_{d}.cu" for n in names for d in libgen.DTYPES if not (ops_dir / f"{n}_{d}.cu").is_file()]
    assert not missing, f"ops without a kernel translation unit: {missing}"
    enum_of = {n: e for _, e, _, n in _op_rows()}
    assert {k.name: k.enum for k in libgen.KERNELS} == {n: enum_of[n] for n in names[5:]}


def test_headers_spell_no_op_or_status_value_of_their_own():
    """coda.h, types.hpp and names.cpp expand the lists; none lists values or names again."""
    c_header = (INCLUDE / "coda.h").read_text()
    types = (INCLUDE / "types.hpp").read_text()
    names = (ROOT / "csrc" / "lib" / "names.cpp").read_text()
    assert not re.search(r"#define CODA_(OP|ERROR)_\w+ \d", c_header)
    assert "enum { CODA_OP_LIST(CODA_OP_CONSTANT) };" in c_header
    for enum in ("StatusCode", "Op"):
        body = types.split(f"enum class {enum} : int32_t {{", 1)[1].split("};", 1)[0]
        assert not re.search(r"\bk\w+ = \d", body), enum
    assert "CODA_OP_LIST(CODA_OP_NAME)" in names and "CODA_STATUS_LIST(CODA_STATUS_NAME)" in names
    assert "case Op::k" not in names and "case StatusCode::k" not in names


def test_status_list_keeps_the_abi_s_codes():
    rows = _status_rows()
    assert [(c, v) for c, _, v, _ in rows[:6]] == [
        ("CODA_OK", 0), ("CODA_ERROR_INVALID_ARGUMENT", 1), ("CODA_ERROR_CAN_IMPLEMENT", 2),
        ("CODA_ERROR_WORKSPACE", 3), ("CODA_ERROR_INITIALIZE", 4), ("CODA_ERROR_LAUNCH", 5)]
    assert [(c, v) for c, _, v, _ in rows[6:]] == [
        ("CODA_ERROR_NOT_BUILT", 16), ("CODA_ERROR_UNSUPPORTED_DEVICE", 17), ("CODA_ERROR_CUDA", 18)]
    assert len({e for _, e, _, _ in rows}) == len({n for _, _, _, n in rows}) == len(rows)
    # the kernels return the ABI's codes by their C names
    used = set(re.findall(r"\bCODA_(?:OK|ERROR_\w+)\b", (ROOT / "csrc" / "kernels" / "epilogue_gemm.cuh").read_text()))
    assert used <= {c for c, _, _, _ in rows[:6]}


def test_python_limits_match_abi_h():
    abi = (INCLUDE / "abi.h").read_text()
    assert int(re.search(r"#define CODA_MAX_SLOTS (\d+)", abi).group(1)) == MAX_SLOTS


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")
def test_cmake_reads_the_op_list(tmp_path):
    script = tmp_path / "ops.cmake"
    script.write_text(f'include("{ROOT / "cmake" / "CodaKernels.cmake"}")\n'
                      'foreach(op IN LISTS CODA_ALL_OPS)\n  message("${op} ${CODA_OP_ENUM_${op}}")\nendforeach()\n')
    out = subprocess.run(["cmake", "-P", str(script)], capture_output=True, text=True, check=True)
    got = [tuple(line.split()) for line in out.stderr.splitlines()]
    assert got == [(n, e) for _, e, _, n in _op_rows()]
