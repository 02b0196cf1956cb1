"""The content-addressed kernel cache: keys, entries, and the lock that makes one build per key.

A key hashes everything that changes the binary: the emitted source, the bytes of every
project header a kernel can include (and of the variant headers its source includes), the nvcc
version and flags, the CUTLASS version and the arch. Nothing
machine-specific (no absolute paths) enters it, so an entry built on a machine without a
GPU loads on the GPU machine with the same nvcc.

An entry is kernels/<key>/ with kernel.so, meta.json (the key fields and the library's sha256),
kernel.cu and build.log. A cache that cannot be written raises CompileError naming the
directory and CODA_EXT_CACHE_DIR; reading a complete entry needs no write access.
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import pathlib
import re

from ..errors import CompileError
from .paths import cache_root, csrc_dir, cutlass_version, nvcc_version

ARCH = "sm_90a"
NVCC_FLAGS = (
    "-gencode=arch=compute_90a,code=sm_90a",
    "-std=c++17",
    "--expt-relaxed-constexpr",
    "-DNDEBUG",
    "-O3",
    "-Xcompiler=-fPIC",
    "-shared",
)
#: What a kernel translation unit can include: the C seam, the kernel templates and every
#: epilogue node (the files in epilogues/, not its variants/ folder: variant_digest). libcoda's own
#: sources (kernels/ops/, lib/) are not reachable from a JIT kernel.
HEADER_GLOBS = ("include/coda/abi.h", "kernels/*.cuh", "kernels/*.h", "epilogues/*")


@functools.cache
def headers_digest(root: str | None = None) -> str:
    """sha256 over every header a kernel can include (relative path + bytes)."""
    base = pathlib.Path(root) if root else csrc_dir()
    h = hashlib.sha256()
    for pattern in HEADER_GLOBS:
        for path in sorted(base.glob(pattern)):
            if path.is_file():
                h.update(str(path.relative_to(base)).encode())
                h.update(b"\0")
                h.update(path.read_bytes())
    return h.hexdigest()


#: Headers of kernel-config variants (csrc/epilogues/variants/): included by the emitted source of the kernels
#: that use them (codegen.emit.variant_headers), never by another header, so they are left out of headers_digest
#: and a change to one re-keys only the kernels that include it.
_VARIANT_INCLUDE = re.compile(r'^#include "(epilogues/variants/[A-Za-z0-9_.]+)"', re.M)


def variant_digest(source: str, root: str | None = None) -> str | None:
    """sha256 over the variant headers `source` includes (relative path + bytes), or None if it includes none."""
    names = sorted(set(_VARIANT_INCLUDE.findall(source)))
    if not names:
        return None
    base = pathlib.Path(root) if root else csrc_dir()
    h = hashlib.sha256()
    for name in names:
        path = base / name
        if not path.is_file():
            raise CompileError(f"the kernel source includes {name}, which is not in {base}: reinstall coda_ext")
        h.update(name.encode())
        h.update(b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()


def key_fields(source: str) -> dict:
    fields = {
        "source": hashlib.sha256(source.encode()).hexdigest(),
        "headers": headers_digest(),
        "nvcc": nvcc_version(),
        "flags": list(NVCC_FLAGS),
        "cutlass": cutlass_version(),
        "arch": ARCH,
        "abi": 1,
        # nvcc reads these from the environment; they change the binary
        "nvcc_env": [os.environ.get("NVCC_PREPEND_FLAGS", ""), os.environ.get("NVCC_APPEND_FLAGS", "")],
    }
    variants = variant_digest(source)
    if variants is not None:   # only then: the keys of kernels without a variant stay what they were
        fields["variant_headers"] = variants
    return fields


def cache_key(source: str) -> str:
    return hashlib.sha256(json.dumps(key_fields(source), sort_keys=True).encode()).hexdigest()[:32]


def unwritable(error: OSError) -> CompileError:
    """The error for a cache that cannot be created or written."""
    root = os.environ.get("CODA_EXT_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "coda_ext")
    where = f" ({error.filename})" if error.filename else ""
    return CompileError(f"the coda_ext kernel cache {root} is not writable: {error.strerror or error}{where}; "
                        "set CODA_EXT_CACHE_DIR to a writable directory")


@contextlib.contextmanager
def writing():
    """Turns OSErrors of cache writes into the CompileError that names the directory."""
    try:
        yield
    except OSError as e:
        raise unwritable(e) from e


def entry_dir(key: str) -> pathlib.Path:
    with writing():  # cache_root() creates the root
        return cache_root() / "kernels" / key


@contextlib.contextmanager
def locked(key: str):
    """An exclusive inter-process lock per key (fcntl), so concurrent processes build once."""
    with writing():
        lock_dir = cache_root() / "locks"
        lock_dir.mkdir(parents=True, exist_ok=True)
        f = open(lock_dir / f"{key}.lock", "w")  # noqa: SIM115  (opened under writing(), closed by the with below)
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
