"""Builds one kernel translation unit into a cached shared library with plain nvcc.

An entry's meta.json records the sha256 of its kernel.so; a process checks it once per entry
before using the library and rebuilds a truncated or altered one (with a one-line warning).
The library is moved into place last, so a kernel.so always has its meta.json.

While nvcc runs (a minute or more per kernel), stderr shows the elapsed time: one status line
that updates every TTY_EVERY_S seconds on a terminal, else a line every LOG_EVERY_S seconds. A
batch of parallel builds (Progress.batch) shows one line for all of them: how many are done.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import threading
import time
import warnings

from ..errors import CompileError
from .cache import NVCC_FLAGS, cache_key, entry_dir, key_fields, locked, writing
from .paths import cache_root, include_dirs, nvcc_path

LIBRARY = "kernel.so"
META = "meta.json"
_VERIFIED: set[str] = set()   # entries whose checksum matched in this process


TTY_EVERY_S = 1.0    # a terminal: the status line is rewritten this often
LOG_EVERY_S = 30.0   # not a terminal (a log, CI): one line this often


class Progress:
    """The elapsed time of every nvcc running in this process, on stderr, from one ticker thread
    (parallel builds share one status line; a batch shows its count of builds done instead of
    a line per build)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._running: dict[int, tuple[str, float]] = {}   # token -> (label, start)
        self._next = 0
        self._ticker: threading.Thread | None = None
        self._wake = threading.Event()
        self._shown = False   # a status line is on the terminal (to clear before other output)
        self._batch: list | None = None   # [what, total, done, start] while a batch runs

    def start(self, label: str) -> int:
        with self._lock:
            self._clear()
            if self._batch is None:
                print(f"coda_ext: compiling {label} with nvcc …", file=sys.stderr, flush=True)
            self._next += 1
            self._running[self._next] = (label, time.monotonic())
            self._start_ticker()
            return self._next

    def stop(self, token: int, line: str | None = None) -> None:
        """Ends `token`'s timing; prints `line` (on a line of its own) if given, except in a batch."""
        with self._lock:
            self._running.pop(token, None)
            self._clear()
            if line is not None and self._batch is None:
                print(line, file=sys.stderr, flush=True)
            if not self._running and self._batch is None:
                self._wake.set()

    def note(self, line: str) -> None:
        """Prints `line` on a line of its own (a build outside nvcc, e.g. the torch binding), except in a
        batch, whose status line counts it."""
        with self._lock:
            if self._batch is None:
                self._clear()
                print(line, file=sys.stderr, flush=True)

    @contextlib.contextmanager
    def batch(self, what: str, total: int):
        """`total` builds (`what`, e.g. "12 kernels") share one status line with how many are done
        (advance() after each) and the elapsed time; the lines of each build are left out. Ends
        with one line: what was built and how long it took."""
        with self._lock:
            self._clear()
            print(f"coda_ext: building {what} …", file=sys.stderr, flush=True)
            self._batch = [what, total, 0, time.monotonic()]
            self._start_ticker()
        ok = False
        try:
            yield
            ok = True
        finally:
            with self._lock:
                what, _, _, start = self._batch
                self._batch = None
                self._clear()
                if ok:
                    print(f"coda_ext: built {what} in {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)
                self._wake.set()

    def advance(self) -> None:
        """One build of the batch is done."""
        with self._lock:
            if self._batch is not None:
                self._batch[2] += 1

    def _start_ticker(self) -> None:
        if self._ticker is None:
            self._ticker = threading.Thread(target=self._tick, name="coda_ext nvcc progress", daemon=True)
            self._ticker.start()

    def status(self, now: float) -> str:
        """The status line: the kernel's label and seconds, or the count and the longest time; in a
        batch, how many of its builds are done and its time."""
        if self._batch is not None:
            what, total, done, start = self._batch
            return f"coda_ext: building {what}: {done}/{total} done … {now - start:.0f} s"
        spans = sorted(((now - start, label) for label, start in self._running.values()), reverse=True)
        if len(spans) == 1:
            return f"coda_ext: compiling {spans[0][1]} … {spans[0][0]:.0f} s (nvcc)"
        return f"coda_ext: compiling {len(spans)} kernels … {spans[0][0]:.0f} s (nvcc, longest)"

    def _clear(self) -> None:
        if self._shown:
            sys.stderr.write("\r\x1b[K")
            self._shown = False

    def _tick(self) -> None:
        while True:
            tty = sys.stderr.isatty()
            self._wake.wait(TTY_EVERY_S if tty else LOG_EVERY_S)
            with self._lock:
                self._wake.clear()
                if not self._running and self._batch is None:
                    self._clear()
                    sys.stderr.flush()
                    self._ticker = None
                    return
                line = self.status(time.monotonic())
                if tty:
                    sys.stderr.write("\r\x1b[K" + line)
                    self._shown = True
                else:
                    sys.stderr.write(line + "\n")
                sys.stderr.flush()


PROGRESS = Progress()


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


def measured_seconds(limit: int = 200) -> list[float]:
    """nvcc seconds of up to `limit` kernels built into this cache (from their meta.json)."""
    with writing():
        metas = sorted((cache_root() / "kernels").glob(f"*/{META}"))[:limit]
    seconds = []
    for path in metas:
        try:
            value = json.loads(path.read_text()).get("compile_seconds")
        except (OSError, ValueError):
            continue
        if isinstance(value, (int, float)) and value > 0:
            seconds.append(float(value))
    return seconds


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
        token = None if quiet else PROGRESS.start(label)
        start, proc = time.monotonic(), None
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        except OSError as e:
            raise CompileError(f"cannot run nvcc ({cmd[0]}) for {label}: {e}", str(src)) from e
        finally:
            seconds = time.monotonic() - start
            if token is not None:
                done = proc is not None and proc.returncode == 0
                PROGRESS.stop(token, f"coda_ext: compiled {label} in {seconds:.0f} s" if done else None)
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
        return str(lib)
