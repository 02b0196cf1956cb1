"""The torch binding (csrc/torch/binding.cpp), built once per torch/Python with cpp_extension.

It is pure C++ (no CUDA code), so it builds wherever torch does; the build is cached next to
the kernels, keyed by torch version, Python version and the binding's sources.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.machinery
import importlib.util
import platform
import sys
import time

from ..errors import CompileError
from .cache import locked
from .nvcc import PROGRESS
from .paths import cache_root, csrc_dir


def _key() -> str:
    import torch

    root = csrc_dir()
    h = hashlib.sha256()
    for p in (root / "torch" / "binding.cpp", root / "include" / "coda" / "abi.h"):
        h.update(p.read_bytes())
    h.update(f"{torch.__version__}|{sys.version_info[:2]}|{platform.machine()}".encode())
    return h.hexdigest()[:16]


def _import(name: str, path: str):
    loader = importlib.machinery.ExtensionFileLoader(name, path)
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _where():
    """(module name, build directory, library path) of this torch/Python's binding."""
    key = _key()
    name = f"coda_ext_binding_{key}"
    build_dir = cache_root() / "binding" / key
    return name, build_dir, build_dir / f"{name}.so"


def built() -> bool:
    """Whether the binding is in the cache (load_binding() then loads it in milliseconds)."""
    return _where()[2].is_file()


@functools.cache
def load_binding():
    """The binding module (compiled on first use, then loaded from the cache in milliseconds)."""
    key = _key()
    name, build_dir, lib = _where()
    if lib.is_file():
        return _import(name, str(lib))
    with locked(f"binding-{key}"):
        if not lib.is_file():
            from torch.utils import cpp_extension

            build_dir.mkdir(parents=True, exist_ok=True)
            PROGRESS.note("coda_ext: compiling the torch binding (once per torch version) …")
            start = time.monotonic()
            try:
                module = cpp_extension.load(
                    name=name,
                    sources=[str(csrc_dir() / "torch" / "binding.cpp")],
                    extra_include_paths=[str(csrc_dir() / "include")],
                    extra_cflags=["-O2"],
                    build_directory=str(build_dir),
                    with_cuda=False,
                    verbose=False,
                )
            except Exception as e:  # cpp_extension raises RuntimeError/CalledProcessError
                raise CompileError(f"building the coda_ext torch binding failed: {e}",
                                   str(csrc_dir() / "torch" / "binding.cpp"), str(build_dir)) from e
            PROGRESS.note(f"coda_ext: compiling the torch binding …, done in {time.monotonic() - start:.0f} s")
            return module
    return _import(name, str(lib))
