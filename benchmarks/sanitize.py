"""compute-sanitizer (memcheck, racecheck, initcheck) over every kernel family, at tile-ragged shapes.

    python -m coda_ext prebuild benchmarks/sanitize.py -j 16    # the families' kernels, in parallel
    python -m benchmarks.sanitize                               # H100: expected 1-3 minutes (racecheck)
        [--tools memcheck racecheck initcheck] [--families plain ...] [--sanitizer PATH] [--out-dir DIR]

One process per tool runs every family (FAMILIES: plain GEMM, every node kind, reductions and their
finalize, the pair ops with the packed pair tiles, operand layouts kn/mn, the cooperative, ping-pong,
stream-K and overlap (both orders) schedules, a graph without D), each a small launch at M, N, K none a tile multiple,
under `compute-sanitizer --tool T` (the three tools run side by side). Outputs come from PyTorch's
allocator with its cache off (PYTORCH_NO_CUDA_MEMORY_CACHING=1: every tensor its own cudaMalloc, so
memcheck sees each tensor's bounds and initcheck starts each output uninitialized). Under memcheck
and racecheck the outputs are NaN-poisoned first and checked for unwritten elements; under initcheck
they are left unwritten and only read back by cudaMemcpy (x.cpu()), so every report names an address,
and the child's manifest (each tensor's address, size and writer: TMA store or st.global) attributes it.

The initcheck question (do its reports on TMA-stored outputs mean unwritten memory, or does initcheck
not see TMA stores?) is settled by benchmarks/initcheck_probe.cu, built here with nvcc and run plain and
under initcheck: buffers written by st.global, by a 1-D bulk copy, by 2-D and CUTLASS-like 3-D TMA
tensor stores, an unwritten control and a TMA load of unwritten memory. The verdict line combines the
probe with the attribution of the coda_ext reports.

Writes sanitizer_<gpu>.log (each tool's output, trimmed) and sanitizer_<gpu>.json into --out-dir (default
benchmarks/results/), <gpu> the GPU it runs on: h100, h200, ….
"""
# No `from __future__ import annotations`: `python -m coda_ext prebuild` loads this file outside sys.modules,
# where dataclasses cannot resolve string annotations.
import argparse
import bisect
import concurrent.futures
import dataclasses
import glob
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

import coda_ext as ce
from benchmarks import common
from benchmarks import numerics_table as nt
from coda_ext import graphs, tuning
from tests.helpers import checks, rand

HERE, ROOT = common.HERE, common.ROOT

TOOLS = ("memcheck", "racecheck", "initcheck")
PROBE_SOURCE = HERE / "initcheck_probe.cu"
PROBE_MODES = ("st_global", "bulk_store", "tma_store", "tma_store_3d", "unwritten", "tma_load")
PROBE_READERS = {"st_global": "read_after_st_global", "bulk_store": "read_after_bulk_store",
                 "tma_store": "read_after_tma_store", "tma_store_3d": "read_after_tma_store_3d",
                 "unwritten": "read_after_unwritten", "tma_load": "tma_load_from_unwritten"}
DEFAULT = ce.DEFAULT_CONFIG


# --- the kernel families ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    covers: str
    build: Callable[[], Any]
    dtype: str
    config: ce.KernelConfig
    shapes: tuple[tuple[int, int, int], ...]


def _weight_grad_split():
    return graphs.weight_grad_split(True, False)


def _kind(name: str, dtype: str = "bfloat16") -> Callable[[], Any]:
    return lambda: nt.kind_graph(name, dtype)


RAGGED = (333, 264, 72)   # M, N, K: none a multiple of any tile (N 2 x 128 + 8, K 64 + 8)
FAMILIES: tuple[Family, ...] = (
    Family("plain", "plain GEMM, D = acc (TMA store), ping-pong 128x128", graphs.identity, "bfloat16", DEFAULT,
           (RAGGED, (333, 8, 72))),
    Family("unary", "exp log sqrt rsqrt square tanh sigmoid silu gelu(erf, tanh) gelu_grad(erf, tanh): D and 12 TMA "
           "stores",
           _kind("unary"), "bfloat16", DEFAULT, (RAGGED,)),
    Family("select", "neg abs relu max min cast lt/gt/ge/le/ne/eq where col_index, int32 and fp32 vectors, "
           "tile, pair_swap; no D", _kind("select"), "bfloat16", DEFAULT, (RAGGED,)),
    Family("binary", "add sub mul div fma, value/pointer/constant scalars, turns cos_turns sin_turns rotate_pairs",
           _kind("binary"), "bfloat16", DEFAULT, (RAGGED,)),
    Family("segments_pairs", "segment_reduce sum/sumsq/max (32), pair_gate x5 (st.global half-width stores), "
           "pair_tile + store_pairs (32-bit packed TMA)", _kind("segments"), "bfloat16", DEFAULT, ((333, 288, 72),)),
    Family("reductions", "row sum/max/sumsq/logsumexp, col sum/max/sumsq, partials + finalize (ping-pong)",
           _kind("reductions"), "bfloat16", DEFAULT, (RAGGED,)),
    Family("cooperative", "the reductions graph, cooperative 128x256 in 2x1 clusters", _kind("reductions"),
           "bfloat16", tuning.LARGE, (RAGGED,)),
    Family("streamk", "README example (row vector, SiLU, tile load, store, row reduction), fp16, stream-K (K split)",
           graphs.example, "float16", tuning.STREAMK, ((333, 264, 520),)),
    Family("major_kn", "swiglu_backward_linear: pair_tile z read straight into registers (tile_loads='direct': "
           "predicated ld.global), store_pairs dz, store y, row reduction; W transposed (kn)",
           graphs.swiglu_backward_linear, "bfloat16", dataclasses.replace(DEFAULT, major="kn", tile_loads="direct"),
           (RAGGED,)),
    Family("major_mn", "weight_grad_split with accumulate: acc + join24 of a bf16 and a uint8 tile (TMA loads), "
           "hi16 and lo8 stored as bf16 and uint8 (TMA stores); A and W transposed (mn); ping-pong 64x128",
           _weight_grad_split, "bfloat16", dataclasses.replace(tuning.SKINNY, major="mn"), ((336, 272, 72),)),
    Family("overlap", "the reductions graph, ping-pong 128x128 with overlapping epilogues (per-warp-group smem, "
           "named barriers 1 and 8); 323 tiles: two or three a CTA", _kind("reductions"), "bfloat16",
           dataclasses.replace(DEFAULT, schedule="overlap"), ((2333, 2056, 136),)),
    Family("overlap_ordered", "README example (row vector, SiLU, tile load, store, row reduction), the overlap "
           "kernel with its epilogues ordered (debugging switch); W transposed (kn)", graphs.example, "bfloat16",
           dataclasses.replace(DEFAULT, schedule="overlap_ordered", major="kn"), (RAGGED,)),
    Family("handoff", "swiglu_backward_linear (pair tile, pair store, y, row reduction) in cooperative 128x128 whose "
           "epilogue runs on warp groups of its own (accumulators through shared memory, named barriers 1, 8 and 9), "
           "2x1 clusters, W transposed (kn); 323 tiles: two or three a cluster", graphs.swiglu_backward_linear,
           "bfloat16",
           ce.KernelConfig((128, 128, 64), (2, 1), "handoff", swizzle=8, major="kn", epilogue_stages=(2, 1)),
           ((2333, 2056, 136),)),
)
FAMILY_NAMES = tuple(f.name for f in FAMILIES)


def build_items() -> list:
    """(graph, dtype, config) of the families' kernels, for coda_ext.prebuild."""
    return [(f.build(), f.dtype, f.config) for f in FAMILIES]


# --- the child: every family once, under one tool ----------------------------------------------------

#: Which engine writes each kind of output: TMA stores through shared memory, or st.global.
WRITERS = {"output": "tma_store", "store": "tma_store", "pair_store": "tma_store",
           "pair_gated_store": "st_global", "row_reduce": "st_global (finalize)",
           "col_reduce": "st_global (finalize)"}


def _tensor_record(name: str, role: str, writer: str | None, t) -> dict:
    return {"name": name, "role": role, "writer": writer, "ptr": t.data_ptr(),
            "nbytes": t.untyped_storage().nbytes(), "shape": list(t.shape), "dtype": str(t.dtype)}


def run_child(tool: str, manifest_path: str, names: list[str]) -> int:
    """Runs each named family once per shape (inside compute-sanitizer) and writes the manifest: per family
    its tensors (address, size, role, writer), launches, errors and (memcheck) the elements left unwritten
    (NaN where the interpreter's fp32 result is finite) and max_rel_diff, the largest difference from the
    interpreter over 1 + max |result| (information only: a comparison may flip, and outputs are 16-bit)."""
    import torch

    keep: list = []    # every tensor stays alive, so no address is reused and each report maps to one tensor
    manifest: dict[str, Any] = {"tool": tool, "families": {}}
    for fam in (f for f in FAMILIES if f.name in names):
        rec: dict[str, Any] = {"tensors": [], "launches": 0, "unwritten": 0, "max_rel_diff": 0.0, "error": None}
        start = time.monotonic()
        try:
            g = fam.build()
            op = ce.compile(g, fam.dtype, fam.config)
            writers = {s.name: WRITERS.get(s.kind) for s in op.slots}
            if op.output_name:
                writers[op.output_name] = WRITERS["output"]
            for i, (M, N, K) in enumerate(fam.shapes):
                gen = torch.Generator(device="cuda").manual_seed(1000 * i + len(fam.name))
                A, W, inputs = rand.op_inputs(op, M, N, K, gen)   # A, W in the family's layout
                if tool == "initcheck":
                    got = op(A, W, **inputs)                       # fresh, never-written outputs
                else:
                    got = op(A, W, out=checks.nan_outputs(op, M, N), **inputs)
                keep += [A, W, inputs, got]
                tag = f"{M}x{N}x{K}"   # the addresses, before anything can fail
                rec["tensors"] += [_tensor_record(f"{k}@{tag}", "output", writers.get(k), v) for k, v in got.items()]
                rec["tensors"] += [_tensor_record(f"{k}@{tag}", "input", None, v) for k, v in inputs.items()
                                   if isinstance(v, torch.Tensor)]
                rec["tensors"] += [_tensor_record(f"{k}@{tag}", "operand", None, v) for k, v in (("A", A), ("W", W))]
                torch.cuda.synchronize()
                rec["launches"] += 1
                if tool == "initcheck":
                    for v in got.values():
                        v.cpu()                                    # read back by cudaMemcpy: one report per copy
                elif tool == "memcheck":
                    ref = ce.interpret(g, A, W, **inputs)
                    for k, v in got.items():
                        r = ref[k].float()
                        rec["unwritten"] += int((v.isnan() & r.isfinite()).sum())
                        finite = r.isfinite() & v.isfinite()
                        if finite.any():
                            diff = (v.float() - r)[finite].abs().max().item() / (1 + r[finite].abs().max().item())
                            rec["max_rel_diff"] = max(rec["max_rel_diff"], diff)
                    del ref
        except Exception as e:  # noqa: BLE001 - recorded per family; the others still run
            rec["error"] = f"{type(e).__name__}: {e}"[:400]
            traceback.print_exc()
        rec["seconds"] = round(time.monotonic() - start, 2)
        manifest["families"][fam.name] = rec
        pathlib.Path(manifest_path).write_text(json.dumps(manifest))   # after each family: a crash keeps the rest
        print(f"[sanitize] {tool} {fam.name}: {rec['launches']} launch(es), unwritten {rec['unwritten']}, "
              f"error {rec['error']}, {rec['seconds']} s", flush=True)
    pathlib.Path(manifest_path).write_text(json.dumps(manifest))
    return 1 if any(r["error"] for r in manifest["families"].values()) else 0


# --- parsing compute-sanitizer's output --------------------------------------------------------------

_PREFIX = re.compile(r"^=+ ?")
#: the summary line alone: past the print limit a second line reads "ERROR SUMMARY: N errors were not printed"
_SUMMARY = re.compile(r"ERROR SUMMARY:\s*(\d+)\s+errors?\s*$")
_RACE_SUMMARY = re.compile(r"RACECHECK SUMMARY:\s*(\d+)\s+hazards?\s+displayed\s*"
                           r"\((\d+)\s+errors?,\s*(\d+)\s+warnings?\)")
_ADDRESS = re.compile(r"(?:Address|access to|allocation at|address)\s+(0x[0-9a-fA-F]+)")
_BANNER = ("COMPUTE-SANITIZER", "ERROR SUMMARY", "RACECHECK SUMMARY", "LEAK SUMMARY")


def _strip(line: str) -> tuple[bool, str] | None:
    """(is a continuation line, text) of a sanitizer line, None for other lines (the application's)."""
    m = _PREFIX.match(line)
    if not m or not line.startswith("="):
        return None
    rest = line[m.end():]
    return rest.startswith((" ", "\t")), rest.strip()


def _kernel(text: str) -> str | None:
    """The kernel a record names ("at foo(float*)+0x70", "at 0x88 in foo(float *)", "... in foo")."""
    m = re.match(r"at\s+(?:0x[0-9a-fA-F]+\s+in\s+)?(.+?)(?:\+0x[0-9a-fA-F]+)?(?:\s+in\s+\S+:\d+)?$", text)
    return m.group(1).strip() if m else None


def _race_kernel(text: str) -> str | None:
    """The kernel of a racecheck line ("... Write access at foo(float*)+0x50 [in file:line] and Read access ...",
    "... access at 0x50 in foo(float *)")."""
    m = re.search(r"access at (.*)", text)
    if not m:
        return None
    rest = re.split(r" and (?:Read|Write) access", m.group(1))[0]
    rest = re.sub(r"\s*\[\d+ hazards?\]$", "", rest)
    rest = re.sub(r"\s+in\s+\S+:\d+$", "", rest)
    if mm := re.match(r"0x[0-9a-fA-F]+ in (.+)", rest):
        rest = mm.group(1)
    return re.sub(r"\+0x[0-9a-fA-F]+$", "", rest).strip() or None


def _signature(kind: str) -> str:
    return re.sub(r"\d+", "N", re.sub(r"0x[0-9a-fA-F]+", "ADDR", kind))


def parse_report(text: str) -> dict:
    """compute-sanitizer output -> {errors (ERROR SUMMARY, None if absent), racecheck {hazards, errors,
    warnings} or None, records [{kind, signature, kernel, addresses, lines}], target_error, banner}."""
    records: list[dict] = []
    summary = race = None
    target_error = False
    banner = False
    for line in text.splitlines():
        s = _strip(line)
        if s is None:
            continue
        cont, body = s
        if not body:
            continue
        if m := _SUMMARY.search(body):
            summary = int(m.group(1))
            continue
        if m := _RACE_SUMMARY.search(body):
            race = {"hazards": int(m.group(1)), "errors": int(m.group(2)), "warnings": int(m.group(3))}
            continue
        if body.startswith("COMPUTE-SANITIZER"):
            banner = True
            continue
        if cont and records:
            rec = records[-1]
            rec["lines"].append(body)
            if rec["kernel"] is None and body.startswith("at "):
                rec["kernel"] = _kernel(body)
            rec["addresses"] += [int(a, 16) for a in _ADDRESS.findall(body)]
            if rec["kernel"] is None and body.startswith("and "):
                rec["kernel"] = _race_kernel(body)
            continue
        if cont:
            continue
        if body.startswith(("Target application returned an error", "Error: process didn't")):
            target_error = True
            continue
        kernel = _race_kernel(body) if body.startswith(("Error:", "Warning:")) else None
        records.append({"kind": body, "signature": _signature(body), "kernel": kernel,
                        "addresses": [int(a, 16) for a in _ADDRESS.findall(body)], "lines": [body]})
    return {"errors": summary, "racecheck": race, "records": records, "target_error": target_error,
            "banner": banner}


def kernel_class(name: str | None) -> str:
    """coda_gemm / coda_finalize / probe:<mode> / torch / other / unknown."""
    if not name:
        return "unknown"
    for mode, reader in sorted(PROBE_READERS.items(), key=lambda kv: -len(kv[1])):   # longest name first
        if reader in name:
            return f"probe:{mode}"
    if "finalize_partials" in name:
        return "coda_finalize"
    if "GemmUniversal" in name or "cutlass" in name or "coda" in name:
        return "coda_gemm"
    if "at::" in name or "at_cuda_detail" in name or "c10::" in name or "native" in name:
        return "torch"
    return "other"


class AddressMap:
    """Address -> (family, tensor record) for the tensors of a child's manifest."""

    def __init__(self, manifest: dict):
        spans = [(t["ptr"], t["ptr"] + max(t["nbytes"], 1), fam, t)
                 for fam, rec in manifest.get("families", {}).items() for t in rec.get("tensors", [])]
        spans.sort(key=lambda s: s[0])
        self._starts = [s[0] for s in spans]
        self._spans = spans

    def find(self, address: int):
        i = bisect.bisect_right(self._starts, address) - 1
        if i >= 0 and address < self._spans[i][1]:
            return self._spans[i][2], self._spans[i][3]
        return None


def attribute(parsed: dict, manifest: dict) -> dict:
    """Counts a tool's records by family, tensor, writer and kernel class; each record is matched by the
    first address of it that falls inside a tensor of the manifest."""
    amap = AddressMap(manifest)
    by_family: dict[str, int] = {}
    by_writer: dict[str, int] = {}
    by_kernel: dict[str, int] = {}
    by_signature: dict[str, int] = {}
    flagged: dict[str, set] = {}
    unattributed = 0
    unattributed_by_kernel: dict[str, int] = {}
    for rec in parsed["records"]:
        by_signature[rec["signature"]] = by_signature.get(rec["signature"], 0) + 1
        cls = kernel_class(rec["kernel"])
        by_kernel[cls] = by_kernel.get(cls, 0) + 1
        hit = next((h for h in (amap.find(a) for a in rec["addresses"]) if h), None)
        if hit is None:
            unattributed += 1
            unattributed_by_kernel[cls] = unattributed_by_kernel.get(cls, 0) + 1
            continue
        fam, t = hit
        by_family[fam] = by_family.get(fam, 0) + 1
        writer = t["writer"] or t["role"]
        by_writer[writer] = by_writer.get(writer, 0) + 1
        flagged.setdefault(writer, set()).add(f"{fam}/{t['name']}")
    totals: dict[str, int] = {}
    for rec in manifest.get("families", {}).values():
        for t in rec.get("tensors", []):
            if t["role"] == "output":
                totals[t["writer"] or "output"] = totals.get(t["writer"] or "output", 0) + 1
    return {"by_family": by_family, "by_writer": by_writer, "by_kernel_class": by_kernel,
            "by_signature": by_signature, "unattributed_records": unattributed,
            "unattributed_by_kernel_class": unattributed_by_kernel,
            "outputs_flagged": {w: sorted(v) for w, v in flagged.items()}, "outputs_total": totals}


def trim_log(text: str, per_signature: int = 3, max_lines: int = 4000, record_lines: int = 12) -> str:
    """Keeps summaries, banners and the application's lines, the first `per_signature` records of each kind of
    report (`record_lines` lines each at most), and says how many records it left out."""
    out: list[str] = []
    seen: dict[str, int] = {}
    keep_record = True
    kept_lines = 0
    for line in text.splitlines():
        s = _strip(line)
        if s is None:
            out.append(line)
            continue
        cont, body = s
        if cont:
            if keep_record and kept_lines < record_lines:
                out.append(line)
                kept_lines += 1
            continue
        if not body or any(body.startswith(b) for b in _BANNER):
            out.append(line)
            keep_record, kept_lines = False, record_lines
            continue
        sig = _signature(body)
        seen[sig] = seen.get(sig, 0) + 1
        keep_record, kept_lines = seen[sig] <= per_signature, 0
        if keep_record:
            out.append(line)
    for sig, n in seen.items():
        if n > per_signature:
            out.append(f"[trimmed: {n - per_signature} more record(s) like: {sig}]")
    if len(out) > max_lines:
        dropped = len(out) - max_lines
        out = out[: max_lines // 2] + [f"[trimmed: {dropped} lines]"] + out[-(max_lines - max_lines // 2):]
    return "\n".join(out)


# --- the initcheck probe ------------------------------------------------------------------------------

_PROBE_LINE = re.compile(r"^probe (\S+) buffer (0x[0-9a-fA-F]+|\(nil\)) bytes (\d+) values (\S+)")


def parse_probe_stdout(text: str) -> dict:
    """{mode: {address, bytes, values}} and "done"/"errors" from the probe's own output."""
    out: dict[str, Any] = {"buffers": {}, "done": False, "errors": []}
    for line in text.splitlines():
        if m := _PROBE_LINE.match(line.strip()):
            addr = int(m.group(2), 16) if m.group(2).startswith("0x") else 0
            out["buffers"][m.group(1)] = {"address": addr, "bytes": int(m.group(3)), "values": m.group(4)}
        elif line.startswith("probe done"):
            out["done"] = True
        elif line.startswith("probe error"):
            out["errors"].append(line.strip())
    return out


def probe_counts(parsed: dict, probe_out: dict) -> dict:
    """Per probe mode: reports by its device reader (kernel name or address) and host copies (address)."""
    counts = {m: {"device": 0, "host": 0} for m in PROBE_MODES}
    spans = [(b["address"], b["address"] + b["bytes"], mode) for mode, b in probe_out["buffers"].items()]
    for rec in parsed["records"]:
        mode = None
        cls = kernel_class(rec["kernel"])
        if cls.startswith("probe:"):
            mode = cls.split(":", 1)[1]
        for a in rec["addresses"]:
            hit = next((m for lo, hi, m in spans if lo <= a < hi), None)
            if hit:
                mode = mode or hit
                break
        if mode is None or mode not in counts:
            continue
        host = "host api" in rec["kind"].lower() or any("cudaMemcpy" in x for x in rec["lines"])
        counts[mode]["host" if host else "device"] += 1
    return counts


def probe_verdict(counts: dict | None, values: dict | None, why_not: str | None = None) -> dict:
    """What the probe says about initcheck and bulk-copy (TMA) writes."""
    if counts is None:
        return {"conclusive": False, "line": f"initcheck probe: not run ({why_not or 'no result'})"}
    flagged = {m: counts[m]["device"] + counts[m]["host"] for m in counts}
    values = values or {}
    if flagged["unwritten"] == 0:
        return {"conclusive": False, "flagged": flagged,
                "line": "initcheck probe: inconclusive - not even the never-written control buffer was reported"}
    if flagged["st_global"]:
        return {"conclusive": False, "flagged": flagged,
                "line": "initcheck probe: inconclusive - the buffer written by plain st.global was reported too"}
    seen = {m: flagged[m] == 0 for m in ("bulk_store", "tma_store", "tma_store_3d")}
    right = {m: values.get(m) == "ok" for m in seen}
    parts = [f"{m}: {'seen' if seen[m] else f'NOT seen ({flagged[m]} reports)'}"
             f"{'' if right[m] else ' (values wrong!)'}" for m in seen]
    load_seen = counts["tma_load"]["device"] > 0   # its host copy reads unwritten memory either way
    load = ("a TMA load of unwritten memory is reported" if load_seen
            else "a TMA load of unwritten memory is not reported")
    tma_blind = not seen["tma_store"] or not seen["tma_store_3d"]
    return {"conclusive": True, "flagged": flagged, "tma_store_seen": not tma_blind,
            "bulk_store_seen": seen["bulk_store"], "tma_load_checked": load_seen,
            "line": ("initcheck probe: control OK (unwritten reported, st.global not); " + "; ".join(parts) + "; "
                     + load)}


def initcheck_verdict(probe: dict, attribution: dict, errors: int | None, families_failed: list[str]) -> dict:
    """The answer to the issue's question: a tool limitation, or a real gap in coda_ext. A real gap: an output
    coda_ext writes with st.global reported, or a coda_ext kernel reading uninitialized memory. Reports on the
    test's own inputs (the harness) or in no coda_ext tensor nor kernel (PyTorch's internals) are listed apart."""
    flagged = attribution.get("outputs_flagged", {})
    totals = attribution.get("outputs_total", {})
    tma_flagged = len(flagged.get("tma_store", []))
    st_flagged = sum(len(v) for k, v in flagged.items() if k.startswith("st_global"))
    inputs_flagged = sum(len(v) for k, v in flagged.items() if not k.startswith(("st_global", "tma_store")))
    coda_reads = sum(n for k, n in attribution.get("by_kernel_class", {}).items() if k.startswith("coda"))
    outside = sum(n for k, n in attribution.get("unattributed_by_kernel_class", {}).items()
                  if not k.startswith("coda"))
    real = st_flagged + coda_reads
    summary = (f"coda_ext outputs reported: TMA-stored {tma_flagged} of {totals.get('tma_store', 0)}, "
               f"st.global-written {st_flagged} of {sum(v for k, v in totals.items() if k.startswith('st_global'))}; "
               f"reads by coda_ext kernels {coda_reads}; the harness's inputs {inputs_flagged}; "
               f"reports outside coda_ext's tensors and kernels {outside}")
    if errors is None or families_failed:
        line = (f"initcheck: INCOMPLETE ({'no error summary' if errors is None else f'{errors} error(s)'}; families "
                f"failed or missing: {families_failed or 'none'}); {summary}")
        kind = "incomplete"
    elif errors == 0:
        line = "initcheck: clean, 0 errors (initcheck saw every output written); " + summary
        kind = "clean"
    elif real:
        line = "initcheck: REAL GAP suspected - st.global outputs or coda_ext kernel reads reported; " + summary
        kind = "real_gap"
    elif tma_flagged and probe.get("conclusive") and not probe.get("tma_store_seen", True):
        line = ("initcheck: TOOL LIMITATION, not a gap in coda_ext - the coda_ext reports are TMA-stored outputs read "
                "back after the launch that wrote them, and the probe shows initcheck does not see TMA tensor stores "
                "in a minimal program either; " + summary)
        kind = "tool_limitation"
    elif tma_flagged:
        line = ("initcheck: UNSETTLED - only TMA-stored outputs are reported, but the probe "
                f"{'saw TMA stores' if probe.get('conclusive') else 'was inconclusive'}; " + summary)
        kind = "unsettled"
    else:
        line = "initcheck: no coda_ext output or kernel reported; the reports are elsewhere - " + summary
        kind = "outside_coda_ext"
    return {"verdict": kind, "line": line, "tma_flagged": tma_flagged, "st_global_flagged": st_flagged,
            "coda_kernel_reads": coda_reads, "inputs_flagged": inputs_flagged, "outside": outside}


# --- the parent ---------------------------------------------------------------------------------------


def find_sanitizer(explicit: str | None = None) -> str | None:
    candidates = [explicit, os.environ.get("COMPUTE_SANITIZER"), shutil.which("compute-sanitizer")]
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            candidates += [f"{home}/compute-sanitizer/compute-sanitizer", f"{home}/bin/compute-sanitizer"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        base = pathlib.Path(os.path.realpath(nvcc)).parent.parent
        candidates += [str(base / "compute-sanitizer" / "compute-sanitizer"), str(base / "bin" / "compute-sanitizer")]
    candidates += sorted(glob.glob("/usr/local/cuda*/compute-sanitizer/compute-sanitizer"), reverse=True)
    candidates += sorted(glob.glob("/opt/nvidia/*/compute-sanitizer/compute-sanitizer"), reverse=True)
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def shown(cmd: list[str]) -> str:
    """A command line as the log records it: the checkout, the Python and the scratch folder by name,
    not by this machine's paths."""
    text = " ".join(cmd).replace(sys.executable, "python").replace(str(ROOT) + os.sep, "")
    return re.sub(r"\S*/coda_sanitize_\w+/", "$TMP/", text)


def _run(cmd: list[str], timeout: float, env: dict | None = None, log: str | None = None) -> dict:
    """Runs cmd in its own process group (killed whole at the timeout): {rc, stdout, seconds, timed_out}."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True, cwd=ROOT)
    try:
        out, _ = proc.communicate(timeout=max(timeout, 1))
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        timed_out = True
    return {"rc": proc.returncode, "stdout": out or "", "seconds": round(time.monotonic() - start, 1),
            "timed_out": timed_out, "cmd": shown(cmd)}


def sanitizer_cmd(sanitizer: str, tool: str, log_file: str, port: int, print_limit: int = 2000) -> list[str]:
    cmd = [sanitizer, "--tool", tool, "--target-processes", "application-only", "--log-file", log_file,
           "--print-limit", str(print_limit), "--show-backtrace", "device", "--port", str(port)]
    if tool == "memcheck":   # an overrun lands in padding, not in the next allocation; an error ends its kernel only
        cmd += ["--padding", "1024", "--destroy-on-device-error", "kernel"]
    return cmd


def run_tool(sanitizer: str, tool: str, families: list[str], tmp: pathlib.Path, port: int, timeout: float) -> dict:
    log = tmp / f"{tool}.log"
    manifest = tmp / f"{tool}.manifest.json"
    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1", PYTHONUNBUFFERED="1")
    cmd = sanitizer_cmd(sanitizer, tool, str(log), port) + [
        sys.executable, "-m", "benchmarks.sanitize", "--child", tool, "--manifest", str(manifest),
        "--families", *families]
    try:
        res = _run(cmd, timeout, env)
    except OSError as e:
        res = {"rc": None, "stdout": f"could not start: {e}", "seconds": 0.0, "timed_out": False, "cmd": shown(cmd)}
    res["log"] = log.read_text(errors="replace") if log.is_file() else ""
    try:
        res["manifest"] = json.loads(manifest.read_text())
    except (OSError, ValueError):
        res["manifest"] = {"families": {}}
    return res


def rerun_by_family(sanitizer: str, tool: str, families: list[str], tmp: pathlib.Path, budget: float) -> dict:
    """{family: error count} from one run of `tool` per family (four at a time), within `budget` seconds."""
    def one(i_name):
        i, name = i_name
        sub = tmp / f"{tool}-{name}"
        sub.mkdir(exist_ok=True)
        res = run_tool(sanitizer, tool, [name], sub, 50200 + 20 * i, budget)
        parsed = parse_report(res["log"])
        if tool == "racecheck" and parsed["racecheck"] is not None:
            return name, parsed["racecheck"]["errors"] + parsed["racecheck"]["warnings"]
        return name, parsed["errors"]

    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        return dict(pool.map(one, enumerate(families)))


def build_probe(tmp: pathlib.Path) -> tuple[str | None, str]:
    from coda_ext.jit.paths import nvcc_path

    exe = tmp / "initcheck_probe"
    cmd = [nvcc_path(), "-gencode=arch=compute_90a,code=sm_90a", "-O2", "-lineinfo", "-o", str(exe), str(PROBE_SOURCE)]
    res = _run(cmd, 180)
    return (str(exe) if res["rc"] == 0 and exe.is_file() else None), res["stdout"]


def summarize_tool(tool: str, res: dict) -> dict:
    parsed = parse_report(res["log"])
    manifest = res["manifest"]
    fams = manifest.get("families", {})
    errors = parsed["errors"]
    if tool == "racecheck" and parsed["racecheck"] is not None:   # hazards: errors and warnings both count
        errors = parsed["racecheck"]["errors"] + parsed["racecheck"]["warnings"]
    return {"errors": errors, "error_summary": parsed["errors"], "racecheck_summary": parsed["racecheck"],
            "records_printed": len(parsed["records"]), "exit_code": res["rc"], "timed_out": res["timed_out"],
            "seconds": res["seconds"], "target_error": parsed["target_error"],
            "families": {name: {k: v for k, v in rec.items() if k != "tensors"} for name, rec in fams.items()},
            "families_failed": sorted(n for n, r in fams.items() if r.get("error")),
            "families_missing": [], "attribution": attribute(parsed, manifest)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tools", nargs="+", default=list(TOOLS), choices=TOOLS)
    parser.add_argument("--families", nargs="+", default=list(FAMILY_NAMES), choices=FAMILY_NAMES)
    parser.add_argument("--sanitizer", default=None, help="compute-sanitizer's path (default: found on PATH / CUDA)")
    parser.add_argument("--out-dir", default=str(common.RESULTS),
                        help="where sanitizer_<gpu>.log and .json go (<gpu>: h100, h200, …; "
                             "default: benchmarks/results)")
    parser.add_argument("--timeout", type=float, default=180, help="seconds per tool process")
    parser.add_argument("--budget", type=float, default=220,
                        help="seconds in all: reruns family by family (to attribute errors) only within it")
    parser.add_argument("--serial", action="store_true", help="one tool at a time (default: side by side)")
    parser.add_argument("--no-probe", action="store_true", help="skip the initcheck probe")
    parser.add_argument("--child", choices=TOOLS, help=argparse.SUPPRESS)
    parser.add_argument("--manifest", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return run_child(args.child, args.manifest, args.families)

    import torch

    from coda_ext.jit.binding import load_binding
    from coda_ext.runtime import prebuild

    start = time.monotonic()
    out_dir = pathlib.Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    sanitizer = find_sanitizer(args.sanitizer)
    if sanitizer is None:
        print("sanitize: compute-sanitizer not found (PATH, $CUDA_HOME, /usr/local/cuda*); pass --sanitizer PATH",
              file=sys.stderr)
        return 2
    version = _run([sanitizer, "--version"], 60)["stdout"]
    version = next((ln.strip() for ln in version.splitlines() if ln.strip().startswith("Version")), version.strip())
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="coda_sanitize_"))
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    fams = [f for f in FAMILIES if f.name in args.families]
    build_failed = {}
    workers = max(2, os.cpu_count() or 1)
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:   # nvcc the probe beside the kernels
        probe_build = pool.submit(build_probe, tmp) if not args.no_probe and "initcheck" in args.tools else None
        binding = pool.submit(load_binding)
        builds = {f.name: pool.submit(prebuild, [(f.build(), f.dtype, f.config)], 1) for f in fams}
        for name, fut in builds.items():   # one family's kernel that does not build fails that family only
            try:
                fut.result()
            except Exception as e:  # noqa: BLE001 - recorded: that family fails alone
                build_failed[name] = f"{type(e).__name__}: {e}"[:400]
        binding.result()
        probe_exe, probe_build_log = probe_build.result() if probe_build else (None, "skipped")
    runnable = [f.name for f in fams if f.name not in build_failed]
    print(f"sanitize: {sanitizer} ({version}), {len(runnable)} families, tools {args.tools}; kernels ready after "
          f"{time.monotonic() - start:.0f} s" + (f"; NOT BUILT: {sorted(build_failed)}" if build_failed else ""),
          flush=True)

    jobs = []
    for i, tool in enumerate(args.tools):
        jobs.append((tool, lambda tool=tool, i=i: run_tool(sanitizer, tool, runnable, tmp, 49152 + 100 * i,
                                                          args.timeout)))
    probe_runs = {}
    if probe_exe:
        jobs.append(("probe", lambda: {
            "plain": _run([probe_exe], 60),
            "initcheck": _run(sanitizer_cmd(sanitizer, "initcheck", str(tmp / "probe.log"), 49152 + 500, 0)
                              + [probe_exe], 120)}))
    results: dict[str, dict] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=1 if args.serial else len(jobs)) as pool:
        futures = {name: pool.submit(fn) for name, fn in jobs}
        for name, fut in futures.items():
            results[name] = fut.result()
            print(f"sanitize: {name} done ({time.monotonic() - start:.0f} s)", flush=True)
    if "probe" in results:
        probe_runs = results.pop("probe")
        probe_runs["initcheck"]["log"] = (tmp / "probe.log").read_text(errors="replace") \
            if (tmp / "probe.log").is_file() else ""

    summary: dict[str, Any] = {
        "gpu": gpu, "sanitizer": sanitizer, "sanitizer_version": version, "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"), "commit": common.commit(), "build_failed": build_failed,
        "allocator": "PYTORCH_NO_CUDA_MEMORY_CACHING=1 (one cudaMalloc per tensor)",
        "families": [{"name": f.name, "covers": f.covers, "dtype": f.dtype, "config": f.config.tag,
                      "shapes": ["x".join(map(str, s)) for s in f.shapes],
                      "graph": ce.kernel_source(f.build(), f.dtype, f.config).graph.digest()} for f in fams],
        "tools": {}}
    for tool, res in results.items():
        s = summarize_tool(tool, res)
        s["families_missing"] = sorted(set(args.families) - set(res["manifest"].get("families", {})))
        s.update(gpu=gpu, sanitizer_version=version)
        summary["tools"][tool] = s

    # errors no address ties to a family (racecheck's always): run that tool again one family at a time
    deadline = start + args.budget
    for tool, s in summary["tools"].items():
        if tool == "initcheck" or not s["errors"] or not s["attribution"]["unattributed_records"]:
            continue
        left = deadline - time.monotonic()
        if left < 30:
            s["by_family_rerun"] = "skipped: no time left (--budget)"
            continue
        s["by_family_rerun"] = rerun_by_family(sanitizer, tool, runnable, tmp, left)
        print(f"sanitize: {tool} again family by family: {s['by_family_rerun']} "
              f"({time.monotonic() - start:.0f} s)", flush=True)

    # the probe and the verdict
    probe: dict[str, Any] = {"built": probe_exe is not None}
    if probe_runs:
        plain = parse_probe_stdout(probe_runs["plain"]["stdout"])
        sanitized = parse_probe_stdout(probe_runs["initcheck"]["stdout"])
        parsed = parse_report(probe_runs["initcheck"]["log"])
        counts = probe_counts(parsed, sanitized) if sanitized["buffers"] else None
        values = {m: b["values"] for m, b in plain["buffers"].items()}
        why = None if counts else ("the probe printed no buffers under initcheck: "
                                   + (sanitized["errors"] or [probe_runs["initcheck"]["stdout"][-300:]])[0])
        probe.update(values=values, values_under_initcheck={m: b["values"] for m, b in sanitized["buffers"].items()},
                     reports=counts, error_summary=parsed["errors"], plain_errors=plain["errors"],
                     verdict=probe_verdict(counts, values, why))
    elif not args.no_probe and "initcheck" in args.tools:
        probe["verdict"] = probe_verdict(None, None, "nvcc failed: " + probe_build_log[-400:])
    summary["initcheck_probe"] = probe
    if "initcheck" in summary["tools"]:
        t = summary["tools"]["initcheck"]
        t["verdict"] = initcheck_verdict(probe.get("verdict", {}), t["attribution"], t["error_summary"],
                                         t["families_failed"] + t["families_missing"])
    summary["clean"] = {tool: (s["errors"] == 0 and not s["families_failed"] and not s["families_missing"]
                               and all(r.get("unwritten", 0) == 0 for r in s["families"].values()))
                        for tool, s in summary["tools"].items()}
    if "initcheck" in summary["tools"]:   # clean but for what initcheck cannot see
        summary["initcheck_ok"] = summary["tools"]["initcheck"]["verdict"]["verdict"] in ("clean", "tool_limitation")
    summary["seconds"] = round(time.monotonic() - start, 1)

    def shape_text(f):
        return " ".join("x".join(map(str, s)) for s in f.shapes)

    log_parts = [f"# compute-sanitizer over coda_ext's kernel families - {summary['date']}, {gpu}, {version}",
                 f"# commit {summary['commit']}, torch {torch.__version__}; {len(fams)} families: "
                 + ", ".join(f"{f.name} ({f.dtype}, {f.config.tag}, {shape_text(f)})" for f in fams)]
    for tool, res in results.items():
        log_parts += [f"\n## {tool}: {res['cmd']}", f"## exit {res['rc']}, {res['seconds']} s"
                      + (" (TIMED OUT)" if res["timed_out"] else ""),
                      trim_log(res["log"]), f"## {tool}: the application's output", trim_log(res["stdout"])]
    if probe_runs:
        log_parts += ["\n## initcheck probe (benchmarks/initcheck_probe.cu), plain run:", probe_runs["plain"]["stdout"],
                      f"## initcheck probe under initcheck: {probe_runs['initcheck']['cmd']}",
                      trim_log(probe_runs["initcheck"]["log"], per_signature=200, record_lines=4),
                      probe_runs["initcheck"]["stdout"]]
    lines = _result_lines(summary)
    log_parts += ["\n## result"] + lines
    stem = f"sanitizer_{common.gpu_tag(gpu)}"   # named by the GPU it ran on: sanitizer_h100, sanitizer_h200, …
    (out_dir / f"{stem}.log").write_text("\n".join(log_parts) + "\n")
    (out_dir / f"{stem}.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    print("\n".join(lines))
    print(f"sanitize: wrote {out_dir / f'{stem}.log'} and {out_dir / f'{stem}.json'} ({summary['seconds']} s)")
    shutil.rmtree(tmp, ignore_errors=True)
    hard = [t for t in ("memcheck", "racecheck") if t in summary["clean"] and not summary["clean"][t]]
    gap = summary["tools"].get("initcheck", {}).get("verdict", {}).get("verdict") in ("real_gap", "incomplete",
                                                                                     "unsettled")
    return 1 if hard or gap else 0


def _result_lines(summary: dict) -> list[str]:
    lines = []
    for tool, s in summary["tools"].items():
        fams = s["families"]
        lines.append(f"{tool}: {s['errors'] if s['errors'] is not None else 'NO SUMMARY'} error(s) over "
                     f"{len(fams)} families ({sum(r.get('launches', 0) for r in fams.values())} launches), "
                     f"{s['seconds']} s; failed: {s['families_failed'] or 'none'}; missing: "
                     f"{s['families_missing'] or 'none'}; unwritten elements: "
                     f"{sum(r.get('unwritten', 0) for r in fams.values())}"
                     + (f"; by family: {s['attribution']['by_family']}" if s['attribution']['by_family'] else "")
                     + (f"; family by family: {s['by_family_rerun']}" if s.get("by_family_rerun") else ""))
    if summary.get("build_failed"):
        lines.append(f"NOT BUILT (nvcc failed; those families did not run): {summary['build_failed']}")
    verdict = summary.get("initcheck_probe", {}).get("verdict")
    if verdict:
        lines.append(verdict["line"])
    if "initcheck" in summary["tools"]:
        lines.append(summary["tools"]["initcheck"]["verdict"]["line"])
    return lines


if __name__ == "__main__":
    sys.exit(main())
