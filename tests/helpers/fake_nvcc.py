"""A shell script standing in for nvcc (no compiler runs in the CPU tests): `--version` prints a
version; any other call is logged, then runs a body that fails or writes a dummy library."""
from __future__ import annotations

import pathlib
import stat

FAKE_VERSION = "Build fake_nvcc_99.9/compiler.0"

FAILING_BODY = (
    'i=0; while [ $i -lt 40 ]; do echo "noise line $i"; i=$((i+1)); done\n'
    'echo "kernel.cu(12): error: identifier \\"Bogus\\" is undefined" >&2\n'
    'echo "1 error detected in the compilation of \\"kernel.cu\\"." >&2\n'
    "exit 1\n")

# Writes a dummy library to the path after -o (after a short sleep, to widen race windows).
SUCCEEDING_BODY = (
    "out=''; prev=''\n"
    'for a in "$@"; do if [ "$prev" = "-o" ]; then out="$a"; fi; prev="$a"; done\n'
    "sleep 0.3\n"
    'printf "not really a library" > "$out"\n'
    "exit 0\n")


def write_fake_nvcc(path: pathlib.Path, log: pathlib.Path, body: str) -> pathlib.Path:
    """The script at `path`: `--version` prints FAKE_VERSION; any other call is appended to `log`
    (one line per call), then runs `body`."""
    path.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "--version" ]; then\n'
        '  echo "nvcc: NVIDIA (R) Cuda compiler driver (fake)"\n'
        f'  echo "{FAKE_VERSION}"\n'
        "  exit 0\n"
        "fi\n"
        f'echo "$@" >> "{log}"\n' + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def timed_body(spans: pathlib.Path, seconds: float = 0.3) -> str:
    """SUCCEEDING_BODY that also appends 'start end' (seconds since the epoch) of its run to `spans`."""
    return ('t0=$(date +%s.%N)\n' + SUCCEEDING_BODY.replace("sleep 0.3", f"sleep {seconds}")
            .replace("exit 0\n", f'echo "$t0 $(date +%s.%N)" >> "{spans}"\nexit 0\n'))
