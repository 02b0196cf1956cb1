"""Kernel cache: keys (everything that changes the binary, nothing machine-specific), the cache
root, the per-key lock, and the nvcc driver's error and warm paths -- with a fake nvcc script,
so no compiler runs here."""
from __future__ import annotations

import hashlib
import io
import json
import multiprocessing
import os
import pathlib
import re
import shutil
import sys
import threading
import time
import warnings

import pytest

import coda_ext as ce
from coda_ext.jit import cache, nvcc, paths
from tests.helpers.fake_nvcc import FAILING_BODY, FAKE_VERSION, SUCCEEDING_BODY
from tests.helpers.fake_nvcc import write_fake_nvcc as _write_fake_nvcc


def _source(const: float = 2.0) -> str:
    g = ce.Graph()
    acc = g.accumulator()
    g.output(ce.silu(acc * const + g.row_vector("bias")))
    return ce.emit_source(g, "bfloat16")


_LRU_CACHED = (cache.headers_digest, paths.nvcc_version, paths.cutlass_version)  # before any monkeypatch


def _clear_lru_caches() -> None:
    for fn in _LRU_CACHED:
        fn.cache_clear()


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """Every test: its own cache root, a fake nvcc that fails, fresh lru caches."""
    monkeypatch.setenv("CODA_EXT_CACHE_DIR", str(tmp_path / "cache"))
    calls = tmp_path / "nvcc_calls.txt"
    monkeypatch.setenv("CODA_EXT_NVCC", str(_write_fake_nvcc(tmp_path / "nvcc", calls, FAILING_BODY)))
    monkeypatch.delenv("CODA_EXT_CSRC", raising=False)
    monkeypatch.delenv("NVCC_APPEND_FLAGS", raising=False)
    monkeypatch.delenv("NVCC_PREPEND_FLAGS", raising=False)
    monkeypatch.setattr(nvcc, "_VERIFIED", set())  # a fresh process: no entry verified yet
    # the include dirs (CUTLASS) do not matter to a fake nvcc; keep these tests independent of them
    monkeypatch.setattr(nvcc, "include_dirs", lambda: [paths.csrc_dir(), paths.csrc_dir() / "include"])
    _clear_lru_caches()
    yield calls
    _clear_lru_caches()


def _compile_calls(calls: pathlib.Path) -> list[str]:
    return calls.read_text().splitlines() if calls.exists() else []


# --- keys ------------------------------------------------------------------------------------


def test_same_source_same_key():
    k1, k2 = cache.cache_key(_source()), cache.cache_key(_source())
    assert k1 == k2
    assert len(k1) == 32 and int(k1, 16) >= 0


def test_source_change_changes_key():
    assert cache.cache_key(_source(2.0)) != cache.cache_key(_source(3.0))
    assert cache.cache_key(_source()) != cache.cache_key(_source() + "\n")


def test_key_fields_record_everything():
    fields = cache.key_fields(_source())
    assert set(fields) == {"source", "headers", "nvcc", "flags", "cutlass", "arch", "abi", "nvcc_env"}
    assert fields["nvcc"] == FAKE_VERSION
    assert fields["arch"] == "sm_90a"
    assert "-gencode=arch=compute_90a,code=sm_90a" in fields["flags"]
    assert fields["cutlass"] == paths.cutlass_version()


@pytest.fixture
def csrc_copy(tmp_path, monkeypatch):
    """A private copy of csrc/, selected through CODA_EXT_CSRC."""
    copy = tmp_path / "csrc_copy"
    shutil.copytree(paths.csrc_dir(), copy)
    monkeypatch.setenv("CODA_EXT_CSRC", str(copy))
    cache.headers_digest.cache_clear()
    return copy


def test_key_does_not_depend_on_where_csrc_lives(csrc_copy, monkeypatch):
    src = _source()
    k_copy = cache.cache_key(src)
    monkeypatch.delenv("CODA_EXT_CSRC")
    cache.headers_digest.cache_clear()
    assert paths.csrc_dir() != csrc_copy
    assert cache.cache_key(src) == k_copy


@pytest.mark.parametrize("header", ["epilogues/functors.hpp", "kernels/config.cuh", "include/coda/abi.h"])
def test_header_edit_changes_key(csrc_copy, header):
    src = _source()
    before = cache.cache_key(src)
    path = csrc_copy / header
    assert path.is_file()
    path.write_text(path.read_text() + "\n// an edit\n")
    assert cache.cache_key(src) == before            # lru_cached until cleared ...
    cache.headers_digest.cache_clear()
    assert cache.cache_key(src) != before            # ... then the edit is seen


def test_new_header_changes_key(csrc_copy):
    src = _source()
    before = cache.cache_key(src)
    (csrc_copy / "epilogues" / "new_node.hpp").write_text("#pragma once\n")
    cache.headers_digest.cache_clear()
    assert cache.cache_key(src) != before


def test_renamed_header_changes_digest(csrc_copy, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(csrc_copy, other)
    (other / "epilogues" / "functors.hpp").rename(other / "epilogues" / "functors2.hpp")
    assert cache.headers_digest(str(other)) != cache.headers_digest(str(csrc_copy))


def test_non_header_dirs_do_not_change_key(csrc_copy):
    src = _source()
    before = cache.cache_key(src)
    binding = csrc_copy / "torch" / "binding.cpp"
    binding.write_text(binding.read_text() + "\n// not part of a kernel\n")
    cache.headers_digest.cache_clear()
    assert cache.cache_key(src) == before


VARIANT = '#include "epilogues/variants/l2_prefetch.hpp"'


def test_variant_header_enters_only_the_keys_of_sources_that_include_it(csrc_copy):
    """A variant header (csrc/epilogues/variants/) is digested into the key of a source that includes it, and
    an edit to it leaves every other kernel's key (and headers_digest) as it was."""
    plain, variant = _source(), _source() + VARIANT + "\n"
    assert "variant_headers" not in cache.key_fields(plain)
    assert cache.key_fields(variant)["variant_headers"] == cache.variant_digest(variant)
    before = cache.cache_key(plain), cache.cache_key(variant), cache.headers_digest()
    header = csrc_copy / "epilogues" / "variants" / "l2_prefetch.hpp"
    header.write_text(header.read_text() + "\n// an edit\n")
    cache.headers_digest.cache_clear()
    assert cache.headers_digest() == before[2] and cache.cache_key(plain) == before[0]
    assert cache.cache_key(variant) != before[1]


def test_missing_variant_header_names_it(csrc_copy):
    (csrc_copy / "epilogues" / "variants" / "l2_prefetch.hpp").unlink()
    with pytest.raises(ce.CompileError, match=r"includes epilogues/variants/l2_prefetch.hpp, which is not in"):
        cache.key_fields(_source() + VARIANT + "\n")


def test_monkeypatched_headers_digest_changes_key(monkeypatch):
    src = _source()
    before = cache.cache_key(src)
    monkeypatch.setattr(cache, "headers_digest", lambda root=None: "0" * 64)
    assert cache.cache_key(src) != before


def test_nvcc_version_changes_key(monkeypatch):
    src = _source()
    before = cache.cache_key(src)
    monkeypatch.setattr(cache, "nvcc_version", lambda: "Build cuda_12.8.r12.8/compiler.35404655_0")
    after = cache.cache_key(src)
    monkeypatch.setattr(cache, "nvcc_version", lambda: "Build cuda_13.0.r13.0/compiler.36424714_0")
    assert len({before, after, cache.cache_key(src)}) == 3


def test_cutlass_version_changes_key(monkeypatch):
    src = _source()
    before = cache.cache_key(src)
    monkeypatch.setattr(cache, "cutlass_version", lambda: "4.1.0")
    assert cache.cache_key(src) != before


def test_flags_change_key(monkeypatch):
    src = _source()
    before = cache.cache_key(src)
    monkeypatch.setattr(cache, "NVCC_FLAGS", cache.NVCC_FLAGS + ("-lineinfo",))
    with_lineinfo = cache.cache_key(src)
    monkeypatch.setattr(cache, "NVCC_FLAGS", tuple(f.replace("-O3", "-O2") for f in cache.NVCC_FLAGS))
    assert len({before, with_lineinfo, cache.cache_key(src)}) == 3


def test_key_has_no_absolute_paths(monkeypatch, tmp_path):
    if shutil.which("nvcc"):  # the real version string, where there is one
        monkeypatch.delenv("CODA_EXT_NVCC")
        paths.nvcc_version.cache_clear()
    text = json.dumps(cache.key_fields(_source()))
    for path in (paths.csrc_dir(), paths.cache_root(), pathlib.Path.home(), tmp_path, pathlib.Path.cwd(),
                 *paths.cutlass_include_dirs()):
        assert str(path) not in text
    assert '"/' not in text and " /" not in text


def test_key_does_not_depend_on_cache_root(monkeypatch, tmp_path):
    src = _source()
    k1 = cache.cache_key(src)
    monkeypatch.setenv("CODA_EXT_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert cache.cache_key(src) == k1


def test_nvcc_environment_flags_change_key(monkeypatch):
    src = _source()
    before = cache.cache_key(src)
    monkeypatch.setenv("NVCC_APPEND_FLAGS", "-G")
    assert cache.cache_key(src) != before


# --- cache root and entries ------------------------------------------------------------------------


def test_cache_dir_env_overrides_root(tmp_path, monkeypatch):
    root = tmp_path / "my" / "cache"
    monkeypatch.setenv("CODA_EXT_CACHE_DIR", str(root))
    assert paths.cache_root() == root and root.is_dir()
    key = cache.cache_key(_source())
    assert cache.entry_dir(key) == root / "kernels" / key


def test_cache_root_falls_back_to_xdg(tmp_path, monkeypatch):
    monkeypatch.delenv("CODA_EXT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert paths.cache_root() == tmp_path / "xdg" / "coda_ext"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert paths.cache_root() == tmp_path / "home" / ".cache" / "coda_ext"


def _ok_nvcc(tmp_path, monkeypatch) -> pathlib.Path:
    """Switches to the fake nvcc that succeeds; returns its call log."""
    calls = tmp_path / "ok_calls.txt"
    monkeypatch.setenv("CODA_EXT_NVCC", str(_write_fake_nvcc(tmp_path / "nvcc_ok", calls, SUCCEEDING_BODY)))
    return calls


def test_lock_is_exclusive(tmp_path):
    events: list[str] = []
    first_holds = threading.Event()

    def first():
        with cache.locked("k"):
            events.append("first acquired")
            first_holds.set()
            time.sleep(0.4)
            events.append("first released")

    def second():
        first_holds.wait(5)
        with cache.locked("k"):
            events.append("second acquired")

    t1, t2 = threading.Thread(target=first), threading.Thread(target=second)
    t1.start()
    t2.start()
    t1.join(10)
    t2.join(10)
    assert events == ["first acquired", "first released", "second acquired"]
    assert (tmp_path / "cache" / "locks" / "k.lock").is_file()


def test_locks_of_different_keys_do_not_block():
    with cache.locked("a"):
        done = threading.Event()

        def other():
            with cache.locked("b"):
                done.set()

        t = threading.Thread(target=other)
        t.start()
        assert done.wait(5)
        t.join()


# --- the nvcc driver ---------------------------------------------------------------------------------


def test_nvcc_failure_raises_compile_error(isolated):
    src = _source()
    with pytest.raises(ce.CompileError) as info:
        nvcc.build(src, "test-kernel", quiet=True)
    e = info.value
    entry = cache.entry_dir(cache.cache_key(src))
    assert e.source_path == str(entry / "kernel.cu")
    assert e.log_path == str(entry / "build.log")
    assert pathlib.Path(e.source_path).read_text() == src
    log = pathlib.Path(e.log_path).read_text()
    assert "error: identifier \"Bogus\" is undefined" in log and "noise line 0" in log
    assert "-gencode=arch=compute_90a,code=sm_90a" in log.splitlines()[0]       # the command line
    assert "identifier \"Bogus\" is undefined" in e.log_tail
    assert "noise line 0\n" not in e.log_tail + "\n"                           # only the tail
    assert len(e.log_tail.splitlines()) == 25
    message = str(e)
    assert "nvcc failed on test-kernel (exit 1)" in message
    assert e.source_path in message and e.log_path in message and "Bogus" in message
    assert sorted(p.name for p in entry.iterdir()) == ["build.log", "kernel.cu"]   # no library, no temp file
    calls = _compile_calls(isolated)
    assert len(calls) == 1 and f"-o {entry}/kernel.so.tmp" in calls[0]


def _prebuilt_entry(src: str, content: bytes = b"prebuilt", meta: dict | None = None) -> pathlib.Path:
    """A cache entry as a build leaves it: kernel.so and a meta.json with its checksum."""
    entry = cache.entry_dir(cache.cache_key(src))
    entry.mkdir(parents=True)
    (entry / "kernel.so").write_bytes(content)
    if meta is None:
        meta = {"label": "prebuilt", "sha256": hashlib.sha256(content).hexdigest()}
    (entry / "meta.json").write_text(json.dumps(meta))
    return entry


def test_warm_entry_does_not_invoke_nvcc(isolated):
    src = _source()
    entry = _prebuilt_entry(src)
    assert nvcc.build(src, "warm", quiet=True) == str(entry / "kernel.so")
    assert _compile_calls(isolated) == []           # the failing fake compiler never ran
    # and a different source is a miss, which does reach the (failing) compiler
    with pytest.raises(ce.CompileError):
        nvcc.build(_source(5.0), "cold", quiet=True)
    assert len(_compile_calls(isolated)) == 1


def test_successful_build_then_cache_hit(tmp_path, monkeypatch):
    calls = tmp_path / "ok_calls.txt"
    monkeypatch.setenv("CODA_EXT_NVCC", str(_write_fake_nvcc(tmp_path / "nvcc_ok", calls, SUCCEEDING_BODY)))
    src = _source()
    lib = nvcc.build(src, "ok", quiet=True)
    entry = cache.entry_dir(cache.cache_key(src))
    assert lib == str(entry / "kernel.so")
    assert pathlib.Path(lib).read_text() == "not really a library"
    meta = json.loads((entry / "meta.json").read_text())
    assert meta["label"] == "ok" and meta["key"] == cache.key_fields(src)
    assert sorted(p.name for p in entry.iterdir()) == ["build.log", "kernel.cu", "kernel.so", "meta.json"]
    assert nvcc.build(src, "ok", quiet=True) == lib
    assert len(_compile_calls(calls)) == 1


def test_concurrent_builds_compile_once(tmp_path, monkeypatch):
    calls = tmp_path / "ok_calls.txt"
    monkeypatch.setenv("CODA_EXT_NVCC", str(_write_fake_nvcc(tmp_path / "nvcc_ok", calls, SUCCEEDING_BODY)))
    src = _source()
    cache.cache_key(src)  # warm the lru caches outside the threads
    results: list[str] = []
    threads = [threading.Thread(target=lambda: results.append(nvcc.build(src, "race", quiet=True)))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(results) == 3 and len(set(results)) == 1
    assert len(_compile_calls(calls)) == 1


def test_build_command():
    cmd = nvcc.build_command("/x/kernel.cu", "/x/kernel.so")
    assert cmd[0] == os.environ["CODA_EXT_NVCC"]
    assert list(cmd[1:1 + len(cache.NVCC_FLAGS)]) == list(cache.NVCC_FLAGS)
    assert f"-I{paths.csrc_dir()}" in cmd and f"-I{paths.csrc_dir() / 'include'}" in cmd
    assert cmd[-3:] == ["/x/kernel.cu", "-o", "/x/kernel.so"]


def test_nvcc_that_prints_no_version(tmp_path, monkeypatch):
    silent = tmp_path / "silent_nvcc"
    silent.write_text("#!/bin/sh\nexit 0\n")
    silent.chmod(0o755)
    monkeypatch.setenv("CODA_EXT_NVCC", str(silent))
    with pytest.raises(ce.CompileError, match=r"--version printed nothing; is it a working nvcc\?"):
        cache.cache_key(_source())


def test_missing_nvcc_raises_compile_error(tmp_path, monkeypatch):
    monkeypatch.setenv("CODA_EXT_NVCC", str(tmp_path / "no" / "nvcc"))
    with pytest.raises(ce.CompileError, match="CODA_EXT_NVCC"):
        nvcc.build(_source(), "missing", quiet=True)


def test_missing_nvcc_on_path_raises_compile_error(monkeypatch, tmp_path):
    monkeypatch.delenv("CODA_EXT_NVCC")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty_bin"))
    with pytest.raises(ce.CompileError, match=r"nvcc not found: .*CUDA_HOME or CODA_EXT_NVCC"):
        paths.nvcc_path()


def test_libcoda_sources_do_not_enter_the_key(tmp_path, monkeypatch):
    """Only headers a JIT kernel can include are hashed: editing libcoda's own sources
    (csrc/kernels/ops, csrc/lib) keeps every JIT cache entry valid."""
    import shutil

    from coda_ext.jit.paths import csrc_dir

    copy = tmp_path / "csrc"
    shutil.copytree(csrc_dir(), copy)
    before = cache.headers_digest(str(copy))
    (copy / "kernels" / "ops").mkdir(exist_ok=True)
    (copy / "kernels" / "ops" / "extra_op.cu").write_text("// a libcoda op\n")
    (copy / "lib").mkdir(exist_ok=True)
    (copy / "lib" / "extra.cpp").write_text("// libcoda host code\n")
    cache.headers_digest.cache_clear()
    assert cache.headers_digest(str(copy)) == before
    (copy / "epilogues" / "new_node.hpp").write_text("// a new project node\n")
    cache.headers_digest.cache_clear()
    assert cache.headers_digest(str(copy)) != before


def test_prebuild_cli_reports_cache_hits(tmp_path, monkeypatch, capsys):
    """`python -m coda_ext prebuild FILE` builds the listed kernels in parallel and says how many
    came from the cache (e.g. a cache built on a machine without a GPU and copied over)."""
    import importlib

    cli = importlib.import_module("coda_ext.tools.prebuild")  # the module (coda_ext.prebuild is the function)

    calls = tmp_path / "ok_calls.txt"
    monkeypatch.setenv("CODA_EXT_NVCC", str(_write_fake_nvcc(tmp_path / "nvcc_ok", calls, SUCCEEDING_BODY)))
    items = _items_file(tmp_path, third_config="None")
    assert cli.main([str(items), "-j", "2"]) == 0
    assert "2 kernels ready" in capsys.readouterr().err and len(_compile_calls(calls)) == 2
    assert cli.main([str(items)]) == 0
    assert "(2 already in the cache, 0 compiled)" in capsys.readouterr().err
    assert len(_compile_calls(calls)) == 2


# --- the cache under stress: concurrent processes, broken entries, unwritable directories ------------


def _build_in_child(src: str, start, results) -> None:
    start.wait(30)
    try:
        results.put(nvcc.build(src, "race", quiet=True))
    except Exception as e:  # noqa: BLE001 - reported to the parent
        results.put(f"error: {e!r}")


def test_eight_processes_build_once(tmp_path, monkeypatch):
    """8 processes ask for the same kernel at the same moment: one nvcc run, every process gets the
    same complete library (the others wait on the lock, then find the entry)."""
    calls = _ok_nvcc(tmp_path, monkeypatch)
    src = _source()
    cache.cache_key(src)  # warm the lru caches before forking
    ctx = multiprocessing.get_context("fork")
    start, results = ctx.Barrier(8), ctx.Queue()
    with warnings.catch_warnings():  # fork() with torch's threads alive: harmless here (no torch in the children)
        warnings.simplefilter("ignore", DeprecationWarning)
        procs = [ctx.Process(target=_build_in_child, args=(src, start, results)) for _ in range(8)]
        for p in procs:
            p.start()
    got = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    entry = cache.entry_dir(cache.cache_key(src))
    assert got == [str(entry / "kernel.so")] * 8
    assert len(_compile_calls(calls)) == 1
    assert (entry / "kernel.so").read_bytes() == b"not really a library"
    meta = json.loads((entry / "meta.json").read_text())
    assert meta["sha256"] == hashlib.sha256(b"not really a library").hexdigest()
    assert sorted(p.name for p in entry.iterdir()) == ["build.log", "kernel.cu", "kernel.so", "meta.json"]


@pytest.mark.parametrize("damage,why", [
    ("truncate", "does not match the checksum"),
    ("flip a byte", "does not match the checksum"),
    ("garbage meta", "meta.json is unreadable"),
    ("no meta", "has no meta.json"),
])
def test_broken_entry_is_rebuilt_with_a_warning(tmp_path, monkeypatch, damage, why):
    calls = _ok_nvcc(tmp_path, monkeypatch)
    src = _source()
    lib = pathlib.Path(nvcc.build(src, "victim", quiet=True))
    entry = lib.parent
    if damage == "truncate":
        lib.write_bytes(lib.read_bytes()[:5])
    elif damage == "flip a byte":
        lib.write_bytes(b"N" + lib.read_bytes()[1:])
    elif damage == "garbage meta":
        (entry / "meta.json").write_text("{not json")
    else:
        (entry / "meta.json").unlink()
    monkeypatch.setattr(nvcc, "_VERIFIED", set())  # another process
    with pytest.warns(RuntimeWarning) as warned:
        assert nvcc.build(src, "victim", quiet=True) == str(lib)
    assert len(warned) == 1
    message = str(warned[0].message)
    assert "\n" not in message and why in message and "victim" in message and str(entry) in message
    assert message.endswith("rebuilding it")
    assert len(_compile_calls(calls)) == 2
    assert lib.read_bytes() == b"not really a library"
    assert json.loads((entry / "meta.json").read_text())["sha256"] == hashlib.sha256(lib.read_bytes()).hexdigest()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nvcc.build(src, "victim", quiet=True)  # healthy again: no warning, no build
    assert len(_compile_calls(calls)) == 2


def test_entry_without_checksum_is_trusted(isolated):
    """Entries built before checksums (meta.json without sha256) load as before."""
    src = _source()
    entry = _prebuilt_entry(src, meta={"label": "old"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert nvcc.build(src, "old", quiet=True) == str(entry / "kernel.so")
    assert _compile_calls(isolated) == []


def test_checksum_is_verified_once_per_process(tmp_path, monkeypatch):
    _ok_nvcc(tmp_path, monkeypatch)
    src = _source()
    entry = _prebuilt_entry(src)
    hashed = []
    real = nvcc.sha256
    monkeypatch.setattr(nvcc, "sha256", lambda path: hashed.append(path) or real(path))
    for _ in range(3):
        assert nvcc.build(src, "hot", quiet=True) == str(entry / "kernel.so")
    assert hashed == [entry / "kernel.so"]


def test_corruption_after_verification_needs_a_new_process(tmp_path, monkeypatch):
    """The check is per process: a library corrupted after it was verified is caught by the next process."""
    calls = _ok_nvcc(tmp_path, monkeypatch)
    src = _source()
    lib = pathlib.Path(nvcc.build(src, "k", quiet=True))
    lib.write_bytes(b"")
    assert nvcc.build(src, "k", quiet=True) == str(lib) and len(_compile_calls(calls)) == 1
    monkeypatch.setattr(nvcc, "_VERIFIED", set())
    with pytest.warns(RuntimeWarning, match="checksum"):
        nvcc.build(src, "k", quiet=True)
    assert len(_compile_calls(calls)) == 2


@pytest.mark.parametrize("blocked", ["root", "kernels", "locks"])
def test_unwritable_cache_names_the_directory_and_the_variable(tmp_path, monkeypatch, blocked):
    """A regular file where the cache (or one of its directories) should be: the error says which
    directory and how to choose another (running as root, file modes would not stop us)."""
    root = tmp_path / "cache"
    if blocked == "root":
        tmp_path.joinpath("file").write_text("")
        root = tmp_path / "file" / "cache"
    else:
        root.mkdir()
        (root / blocked).write_text("")
    monkeypatch.setenv("CODA_EXT_CACHE_DIR", str(root))
    with pytest.raises(ce.CompileError) as info:
        nvcc.build(_source(), "k", quiet=True)
    message = str(info.value)
    assert str(root) in message and "CODA_EXT_CACHE_DIR" in message and "not writable" in message


def test_complete_entry_loads_from_a_cache_that_cannot_be_written(isolated):
    """Reading needs no lock and no writes: a copied, read-only cache serves its kernels."""
    src = _source()
    entry = _prebuilt_entry(src)
    (entry.parent.parent / "locks").write_text("")  # no lock could be taken
    assert nvcc.build(src, "ro", quiet=True) == str(entry / "kernel.so")
    assert _compile_calls(isolated) == []


def test_compile_failure_names_the_graph_and_the_log(isolated):
    """ce.compile with a failing nvcc: CompileError with the graph digest, dtype, config and both paths."""
    from coda_ext.graphs import bias_silu

    g = bias_silu()
    with pytest.raises(ce.CompileError) as info:
        ce.compile(g, "float16")
    e = info.value
    message = str(e)
    assert g.build().digest() in message and "float16" in message and ce.DEFAULT_CONFIG.tag in message
    assert e.log_path and e.log_path in message and pathlib.Path(e.log_path).is_file()
    assert e.source_path and e.source_path in message
    assert "Bogus" in e.log_tail


def test_prebuild_failure_names_the_graph(isolated):
    from coda_ext.runtime import prebuild  # not ce.prebuild: see the regression test below

    g = ce.Graph()
    g.output(g.accumulator() * 3.0)
    with pytest.raises(ce.CompileError, match=g.build().digest()):
        prebuild([(g, "bfloat16", None)], jobs=1)


def test_regression_prebuild_function_survives_importing_the_cli():
    import importlib

    importlib.import_module("coda_ext.tools.prebuild")
    assert callable(ce.prebuild), f"coda_ext.prebuild is {ce.prebuild!r}"


def test_cached_says_no_for_a_corrupt_entry(tmp_path, monkeypatch):
    """Regression: cached() looked only for the file, so prebuild counted a broken entry as a hit."""
    import json

    from coda_ext.graphs import identity
    from coda_ext.jit import cached, kernel_source
    from coda_ext.jit.cache import cache_key, entry_dir

    monkeypatch.setenv("CODA_EXT_CACHE_DIR", str(tmp_path / "cache"))
    ks = kernel_source(identity(), "bfloat16")
    entry = entry_dir(cache_key(ks.source))
    entry.mkdir(parents=True)
    (entry / nvcc.LIBRARY).write_bytes(b"not a library")
    (entry / "meta.json").write_text(json.dumps({"sha256": "0" * 64}))
    assert not cached(ks)
    (entry / "meta.json").write_text(json.dumps({"sha256": nvcc.sha256(entry / nvcc.LIBRARY)}))
    assert cached(ks)


def test_an_nvcc_that_cannot_run_is_a_compile_error(tmp_path, monkeypatch):
    fake = tmp_path / "nvcc"
    fake.write_bytes(b"\x7fELF-not-really")  # executable bit, but not a program this machine runs
    fake.chmod(0o755)
    monkeypatch.setenv("CODA_EXT_NVCC", str(fake))
    paths.nvcc_version.cache_clear()
    try:
        with pytest.raises(ce.CompileError, match=r"cannot run .*--version"):
            paths.nvcc_version()
    finally:
        paths.nvcc_version.cache_clear()


# --- what a user sees: nvcc progress, prebuild's count and estimate, parallel jobs -----------------


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _slow_nvcc(tmp_path, monkeypatch, seconds: float = 0.6) -> pathlib.Path:
    calls = tmp_path / "slow_calls.txt"
    body = SUCCEEDING_BODY.replace("sleep 0.3", f"sleep {seconds}")
    monkeypatch.setenv("CODA_EXT_NVCC", str(_write_fake_nvcc(tmp_path / "nvcc_slow", calls, body)))
    return calls


def test_nvcc_progress_lines_without_a_terminal(tmp_path, monkeypatch, capsys):
    """Regression: nvcc ran for minutes with no sign of life. Not on a terminal, a line with the
    elapsed time comes every LOG_EVERY_S seconds, and the build ends with its time."""
    _slow_nvcc(tmp_path, monkeypatch)
    monkeypatch.setattr(nvcc, "LOG_EVERY_S", 0.1)
    nvcc.build(_source(6.0), "slow-kernel")
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "coda_ext: compiling slow-kernel with nvcc …"
    ticks = [line for line in err if re.fullmatch(r"coda_ext: compiling slow-kernel … \d+ s \(nvcc\)", line)]
    assert len(ticks) >= 2, err
    assert re.fullmatch(r"coda_ext: compiled slow-kernel in \d+ s", err[-1]), err
    assert "\r" not in "".join(err)


def test_nvcc_progress_updates_one_line_on_a_terminal(tmp_path, monkeypatch):
    _slow_nvcc(tmp_path, monkeypatch)
    monkeypatch.setattr(nvcc, "TTY_EVERY_S", 0.1)
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    nvcc.build(_source(7.0), "tty-kernel")
    out = terminal.getvalue()
    updates = out.count("\r\x1b[Kcoda_ext: compiling tty-kernel … ")
    assert updates >= 2, out
    # the status line is cleared before the final line, which ends the output
    assert re.search(r"\r\x1b\[Kcoda_ext: compiled tty-kernel in \d+ s\n$", out), out


def test_nvcc_progress_status_of_parallel_builds():
    progress = nvcc.Progress()
    progress._running = {1: ("a", 100.0), 2: ("b", 90.0)}
    assert progress.status(130.0) == "coda_ext: compiling 2 kernels … 40 s (nvcc, longest)"
    progress._running = {1: ("a", 100.0)}
    assert progress.status(130.0) == "coda_ext: compiling a … 30 s (nvcc)"


def test_quiet_build_shows_no_progress(tmp_path, monkeypatch, capsys):
    _slow_nvcc(tmp_path, monkeypatch, 0.3)
    monkeypatch.setattr(nvcc, "LOG_EVERY_S", 0.05)
    nvcc.build(_source(8.0), "quiet-kernel", quiet=True)
    assert capsys.readouterr().err == ""


def _items_file(tmp_path, third_config: str = "'auto'") -> pathlib.Path:
    """A prebuild items file: two graphs, the first again with `third_config` (a Python expression)."""
    items = tmp_path / "items.py"
    items.write_text(
        "import coda_ext as ce\n"
        "def build_items():\n"
        "    g = ce.Graph(); g.output(g.accumulator())\n"
        "    h = ce.Graph(); h.output(ce.silu(h.accumulator()))\n"
        f"    return [(g, 'bfloat16', None), (h, 'bfloat16', None), (g, 'bfloat16', {third_config})]\n")
    return items


def test_prebuild_dry_run_lists_counts_and_builds_nothing(tmp_path, monkeypatch, capsys, isolated):
    """Regression: `prebuild --ops` started hours of nvcc without saying how many kernels or how long."""
    import importlib

    cli = importlib.import_module("coda_ext.tools.prebuild")
    monkeypatch.setattr(cli, "default_jobs", lambda: 2)
    assert cli.main([str(_items_file(tmp_path)), "--dry-run"]) == 0
    captured = capsys.readouterr()
    listed = captured.out.splitlines()
    n = len(listed)
    assert n >= 3 and all(line.startswith("build ") for line in listed)
    assert f"coda_ext: {n} kernels, 0 already in the cache, {n} to build with -j 2: about " in captured.err
    assert _compile_calls(isolated) == []   # nothing compiled
    seconds, _ = cli.estimate(n, 2, [], cpus=2)
    assert f"about {cli._duration(seconds)} (about 60 s per kernel, a typical figure" in captured.err


def test_prebuild_estimate_uses_measured_times_and_parallel_jobs():
    from coda_ext.tools.prebuild import TYPICAL_KERNEL_S, _duration, estimate

    assert estimate(300, 2, [], cpus=2)[0] == 150 * TYPICAL_KERNEL_S
    seconds, how = estimate(10, 4, [30.0, 40.0, 50.0], cpus=16)
    assert seconds == 3 * 40.0 and "median of 3 builds" in how
    assert estimate(10, 16, [40.0], cpus=2)[0] == 5 * 40.0   # no more at once than there are CPUs
    assert _duration(9000) == "2 h 30 min" and _duration(45) == "45 s" and _duration(600) == "10 min"


def test_prebuild_estimate_reads_this_caches_build_times(tmp_path, monkeypatch):
    _slow_nvcc(tmp_path, monkeypatch, 0.1)
    nvcc.build(_source(9.0), "timed", quiet=True)
    (seconds,) = nvcc.measured_seconds()
    assert 0 < seconds < 30


def test_default_jobs_capped_by_memory(monkeypatch):
    """Regression: -j defaulted to every core with ~4 GB per nvcc; now at most one per 4 GB available."""
    from coda_ext import jit

    assert jit.available_memory() > 0   # read from this machine
    monkeypatch.setattr(jit.os, "cpu_count", lambda: 16)
    monkeypatch.setattr(jit, "available_memory", lambda: 9 * 2**30)
    assert jit.default_jobs() == 2
    monkeypatch.setattr(jit, "available_memory", lambda: 2 * 2**30)
    assert jit.default_jobs() == 1
    monkeypatch.setattr(jit, "available_memory", lambda: None)
    assert jit.default_jobs() == 16
