"""Where things are: the project's C++ sources, CUTLASS, nvcc and the on-disk cache."""
from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
import pathlib
import shutil
import subprocess

from ..errors import CompileError

_PKG = pathlib.Path(__file__).resolve().parent.parent


def csrc_dir() -> pathlib.Path:
    """The project's C++ tree (csrc/): packaged with the wheel, or the source checkout."""
    env = os.environ.get("CODA_EXT_CSRC")
    candidates = [pathlib.Path(env)] if env else []
    candidates += [_PKG / "csrc", _PKG.parent.parent / "csrc"]
    for c in candidates:
        if (c / "include" / "coda" / "abi.h").is_file():
            return c
    raise CompileError("cannot find coda_ext's C++ sources (csrc/); reinstall coda_ext or set CODA_EXT_CSRC")


def include_dirs() -> list[pathlib.Path]:
    """-I directories of a kernel translation unit: csrc/, csrc/include/ and CUTLASS's."""
    root = csrc_dir()
    return [root, root / "include"] + cutlass_include_dirs()


@functools.cache
def cutlass_include_dirs() -> list[pathlib.Path]:
    env = os.environ.get("CODA_CUTLASS_DIR")
    if env:
        base = pathlib.Path(env)
    else:
        spec = importlib.util.find_spec("cutlass_library")
        if spec is None or not spec.submodule_search_locations:
            raise CompileError("CUTLASS headers not found: pip install nvidia-cutlass==4.2.0.0, "
                               "or set CODA_CUTLASS_DIR to a CUTLASS checkout")
        base = pathlib.Path(next(iter(spec.submodule_search_locations))) / "source"
    dirs = [base / "include", base / "tools" / "util" / "include"]
    if not (dirs[0] / "cutlass" / "cutlass.h").is_file():
        raise CompileError(f"no cutlass/cutlass.h under {dirs[0]}: set CODA_CUTLASS_DIR to a CUTLASS checkout")
    return dirs


@functools.cache
def cutlass_version() -> str:
    if os.environ.get("CODA_CUTLASS_DIR"):
        header = cutlass_include_dirs()[0] / "cutlass" / "version.h"
        fields = {}
        for line in header.read_text().splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0] == "#define" and parts[1].startswith("CUTLASS_VERSION_"):
                fields[parts[1]] = parts[2]
        return "{}.{}.{}".format(fields.get("CUTLASS_VERSION_MAJOR"), fields.get("CUTLASS_VERSION_MINOR"),
                                 fields.get("CUTLASS_VERSION_PATCH"))
    return importlib.metadata.version("nvidia-cutlass")


def nvcc_path() -> str:
    env = os.environ.get("CODA_EXT_NVCC")
    if env:
        if not (os.path.isfile(env) and os.access(env, os.X_OK)):
            raise CompileError(f"CODA_EXT_NVCC={env!r} is not an executable file; point it at nvcc or unset it")
        return env
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")):
        if home and (pathlib.Path(home) / "bin" / "nvcc").is_file():
            return str(pathlib.Path(home) / "bin" / "nvcc")
    found = shutil.which("nvcc")
    if not found:
        raise CompileError("nvcc not found: install the CUDA toolkit (12.8+ / 13.x), put nvcc on PATH, "
                           "or set CUDA_HOME or CODA_EXT_NVCC")
    return found


@functools.cache
def nvcc_version() -> str:
    try:
        out = subprocess.run([nvcc_path(), "--version"], capture_output=True, text=True, check=False).stdout
    except OSError as e:  # not executable, wrong architecture, ...
        raise CompileError(f"cannot run {nvcc_path()} --version ({e}); point CUDA_HOME or CODA_EXT_NVCC at a "
                           "working nvcc") from e
    lines = [line for line in out.splitlines() if line.strip()]
    if not lines:
        raise CompileError(f"{nvcc_path()} --version printed nothing; is it a working nvcc?")
    return lines[-1].strip()  # e.g. "Build cuda_13.0.r13.0/compiler.36424714_0"


def cache_root() -> pathlib.Path:
    """CODA_EXT_CACHE_DIR, else $XDG_CACHE_HOME/coda_ext, else ~/.cache/coda_ext."""
    env = os.environ.get("CODA_EXT_CACHE_DIR")
    if env:
        root = pathlib.Path(env)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = (pathlib.Path(xdg) if xdg else pathlib.Path.home() / ".cache") / "coda_ext"
    root.mkdir(parents=True, exist_ok=True)
    return root
