"""Builds one kernel translation unit into a cached shared library with plain nvcc.

An entry's meta.json records the sha256 of its kernel.so; a process checks it once per entry
before using the library and rebuilds a truncated or altered one (with a one-line warning).
The library is moved into place last, so a kernel.so always has its meta.json.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import subprocess
import sys
import time
import warnings

from ..errors import CompileError
from .cache import NVCC_FLAGS, cache_key, entry_dir, key_fields, locked, writing
from .paths import include_dirs, nvcc_path

LIBRARY = "kernel.so"
META = "meta.json"
_VERIFIED: set[str] = set()   # entries whose checksum matched in this process


def build_command(source_path: str, output_path: str) -> list[str]:
    cmd = [nvcc_path(), *NVCC_FLAGS]
    cmd += [f"-I{d}" for d in include_dirs()]
    cmd += [source_path, "-o", output_path]
    return cmd


def sha256(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_entry(entry: pathlib.Path) -> str | None:
    """None if entry holds a usable library; else why not ("missing" if there is none)."""
    lib = entry / LIBRARY
    if not lib.is_file():
        return "missing"
    if str(entry) in _VERIFIED:
        return None
    try:
        meta = json.loads((entry / META).read_text())
    except FileNotFoundError:
        return f"it has no {META}"
    except (OSError, ValueError) as e:
        return f"its {META} is unreadable ({e.__class__.__name__})"
    want = meta.get("sha256")
    if want is not None and sha256(lib) != want:  # entries from before checksums have none: trusted
        return f"its {LIBRARY} does not match the checksum in {META} (truncated or altered)"
    _VERIFIED.add(str(entry))
    return None


def build(source: str, label: str, quiet: bool = False) -> str:
    """Returns the path of the compiled library of `source`, compiling it on a cache miss."""
    key = cache_key(source)
    entry = entry_dir(key)
    lib = entry / LIBRARY
    if check_entry(entry) is None:
        return str(lib)
    with locked(key):
        problem = check_entry(entry)  # another process may have built it while we waited
        if problem is None:
            return str(lib)
        if problem != "missing":
            warnings.warn(f"coda_ext: the cache entry of {label} ({entry}) is broken: {problem}; rebuilding it",
                          RuntimeWarning, stacklevel=2)
        with writing():
            lib.unlink(missing_ok=True)
            entry.mkdir(parents=True, exist_ok=True)
            src = entry / "kernel.cu"
            log = entry / "build.log"
            src.write_text(source)
        tmp = entry / f"{LIBRARY}.tmp{os.getpid()}"
        cmd = build_command(str(src), str(tmp))
        if not quiet:
            print(f"coda_ext: compiling {label} …", file=sys.stderr, flush=True)
        start = time.monotonic()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        except OSError as e:
            raise CompileError(f"cannot run nvcc ({cmd[0]}) for {label}: {e}", str(src)) from e
        seconds = time.monotonic() - start
        with writing():
            log.write_text(" ".join(cmd) + "\n\n" + proc.stdout + proc.stderr)
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-25:])
            raise CompileError(f"nvcc failed on {label} (exit {proc.returncode})", str(src), str(log), tail)
        meta = {"label": label, "compile_seconds": round(seconds, 1), "sha256": sha256(tmp),
                "key": key_fields(source)}
        with writing():
            (entry / f"{META}.tmp{os.getpid()}").write_text(json.dumps(meta, indent=1))
            os.replace(entry / f"{META}.tmp{os.getpid()}", entry / META)
            os.replace(tmp, lib)
        _VERIFIED.add(str(entry))
        if not quiet:
            print(f"coda_ext: compiling {label} …, done in {seconds:.0f} s", file=sys.stderr, flush=True)
        return str(lib)
