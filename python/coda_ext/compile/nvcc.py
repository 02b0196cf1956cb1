"""Builds one kernel translation unit into a cached shared library with plain nvcc."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from ..errors import CompileError
from .cache import NVCC_FLAGS, cache_key, entry_dir, key_fields, locked
from .paths import include_dirs, nvcc_path

LIBRARY = "kernel.so"


def build_command(source_path: str, output_path: str) -> list[str]:
    cmd = [nvcc_path(), *NVCC_FLAGS]
    cmd += [f"-I{d}" for d in include_dirs()]
    cmd += [source_path, "-o", output_path]
    return cmd


def build(source: str, label: str, quiet: bool = False) -> str:
    """Returns the path of the compiled library of `source`, compiling it on a cache miss."""
    key = cache_key(source)
    entry = entry_dir(key)
    lib = entry / LIBRARY
    if lib.is_file():
        return str(lib)
    with locked(key):
        if lib.is_file():  # another process built it while we waited
            return str(lib)
        entry.mkdir(parents=True, exist_ok=True)
        src = entry / "kernel.cu"
        log = entry / "build.log"
        src.write_text(source)
        tmp = entry / f"{LIBRARY}.tmp{os.getpid()}"
        cmd = build_command(str(src), str(tmp))
        if not quiet:
            print(f"coda_ext: compiling {label} …", file=sys.stderr, flush=True)
        start = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        seconds = time.monotonic() - start
        log.write_text(" ".join(cmd) + "\n\n" + proc.stdout + proc.stderr)
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-25:])
            raise CompileError(f"nvcc failed on {label} (exit {proc.returncode})", str(src), str(log), tail)
        os.replace(tmp, lib)
        meta = {"label": label, "compile_seconds": round(seconds, 1), "key": key_fields(source)}
        (entry / "meta.json").write_text(json.dumps(meta, indent=1))
        if not quiet:
            print(f"coda_ext: compiling {label} …, done in {seconds:.0f} s", file=sys.stderr, flush=True)
        return str(lib)
