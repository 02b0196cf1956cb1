"""libcoda's kernels of the ready ops, generated from their Python graphs (one source of truth).

    python -m coda_ext libgen csrc/kernels/ops            # (re)writes the files below
    python -m coda_ext libgen csrc/kernels/ops --check    # exit 1 if any file would change

For every kernel of KERNELS and dtype (bf16, fp16) it writes csrc/kernels/ops/<name>_<dtype>.cu:
the translation unit coda_ext emits for the op module's graph (coda_ext.kernel_source), with the
entry points named coda_<name>_<dtype> (CODA_DEFINE_NAMED_ENTRY_POINTS) so that several link into
one libcoda. Each kernel has one fixed config: what coda_ext.tuning.heuristic picks for the op's
large training shape (M = 16384 tokens, N and K of a Llama 3 layer), with a launch default that
suits every M (coda_ext.tuning.for_every_m). It also writes
contract_generated.h: per kernel, that config and the CodaLaunch slot of every operand in the
graph's canonical slot order (inputs sorted by name, then outputs sorted by name), which is
the order the emitted code reads them — so the host code (csrc/lib) never spells a slot number.

rms_linear picks its activation at run time (one kernel for all of them), which a graph cannot
express: its epilogue is the hand-written coda::ops::RmsLinear (fusions.cuh), the tree the
emitted graph(activation) has with coda::ops::SelectActivation in place of the fixed
activation; its config and slots still come from the graph. tests/unit/test_libgen.py checks
that the committed files are what this module writes, and that RmsLinear matches the graphs.

CMake compiles the committed files; it never runs Python.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import pathlib
import re
import sys
from typing import Any

from .. import tuning
from ..config import RASTER_ORDERS, KernelConfig
from ..jit import KernelSource, kernel_source

#: The large training shape whose heuristic config every kernel is compiled with.
TRAINING_M = 16384
#: libcoda's dtypes: file suffix -> coda_ext dtype and the C++ element type.
DTYPES = {"bf16": "bfloat16", "fp16": "float16"}
GENERATOR = "python -m coda_ext libgen csrc/kernels/ops"
HEADER = "contract_generated.h"


@dataclasses.dataclass(frozen=True)
class LibKernel:
    """One libcoda kernel: a graph variant of a ready op."""

    name: str                    # its op in csrc/include/coda/op_list.h; the kernel is <name>_<dtype>
    module: str                  # the coda_ext.ops module whose graph(...) it compiles
    args: tuple[Any, ...]        # graph(*args)
    shape: tuple[int, int]       # (N, K) of the training shape its config is chosen for
    what: str                    # one line for the comments
    fusion: str | None = None    # a hand-written fusion of fusions.cuh instead of the emitted graph
    extra_slots: tuple[str, ...] = ()  # libcoda's own slots after the graph's (the fusion reads them)

    @property
    def enum(self) -> str:
        """Its coda::Op enumerator: 'linear_residual_norm' -> 'kLinearResidualNorm' (op_list.h)."""
        return _const(self.name)

    def graph(self) -> Any:
        from .. import ops

        return getattr(ops, self.module).graph(*self.args)

    def call(self) -> str:
        return f"coda_ext.ops.{self.module}.graph({', '.join(repr(a) for a in self.args)})"


#: Every generated kernel. Optional rstd is not a variant: the kernels always scale by a column
#: vector, and the host passes a vector of ones from the workspace when the caller gives no rstd
#: (x · 1.0f is exact, so the result is the unscaled graph's). Without QK-norm the qkv graph does
#: not depend on head_dim (one kernel serves 64 and 128).
KERNELS: tuple[LibKernel, ...] = (
    LibKernel("linear_residual_norm", "residual_norm", (), (4096, 14336),
              "out = A·Bᵀ + residual, h = out ⊙ norm_weight, sumsq = Σ out² (Llama 3 8B down projection)"),
    LibKernel("rms_linear", "rms_scale", (None,), (14336, 4096),
              "act(rstd ⊙row A·Bᵀ), act chosen at run time (Llama 3 8B up projection)",
              fusion="RmsLinear", extra_slots=("activation",)),
    LibKernel("linear_swiglu", "swiglu", (True, False), (28672, 4096),
              "y = silu(z[:, 2i]) · z[:, 2i+1], z = rstd ⊙row A·Bᵀ, no z written (Llama 3 8B gate/up)"),
    LibKernel("linear_swiglu_train", "swiglu", (True, True), (28672, 4096),
              "z = rstd ⊙row A·Bᵀ written as D, and y = silu(z[:, 2i]) · z[:, 2i+1] (Llama 3 8B gate/up)"),
    LibKernel("qkv_rope", "qkv", (True, False, 128), (6144, 4096),
              "RoPE(rstd ⊙row A·Bᵀ) on Q and K, V passed through (Llama 3 8B QKV)"),
    LibKernel("qkv_rope_qk_norm64", "qkv", (True, True, 64), (3072, 2048),
              "per-head RMSNorm of Q and K (head_dim 64), then RoPE (Llama 3.2 1B-sized QKV)"),
    LibKernel("qkv_rope_qk_norm128", "qkv", (True, True, 128), (6144, 4096),
              "per-head RMSNorm of Q and K (head_dim 128), then RoPE (Llama 3 8B QKV)"),
    LibKernel("lm_head_cross_entropy", "lm_head_ce", (True,), (128256, 4096),
              "lse and the target logit of logits = rstd ⊙row A·Bᵀ, no logits written (Llama 3 LM head)"),
)


@functools.cache
def kernel_config(kernel: LibKernel) -> KernelConfig:
    """What the Python heuristic picks for the kernel's training shape (bf16 and fp16 alike)."""
    first = kernel_source(kernel.graph(), "bfloat16")
    N, K = kernel.shape
    # one config serves every M: not the 128x192 tiles, which pay only at M >= 4096 (1.06-1.13x cuBLAS
    # at M = 1024 against 1.01-1.07x for the heuristic's other configs, sweep_192_h100.json)
    epilogue = dataclasses.replace(tuning.Epilogue.of(first.lowered), tall_192=False)
    return tuning.for_every_m(tuning.heuristic(TRAINING_M, N, K, tuning.DEFAULT_SMS, epilogue))


@functools.cache
def sources(kernel: LibKernel) -> dict[str, KernelSource]:
    """The emitted source of the kernel per libcoda dtype suffix, with its fixed config."""
    config = kernel_config(kernel)
    return {suffix: kernel_source(kernel.graph(), dtype, config) for suffix, dtype in DTYPES.items()}


def slots(source: KernelSource) -> list[tuple[str, str, str | None]]:
    """(name, kind, dtype) of every CodaLaunch slot, in the emitted code's order."""
    g = source.lowered
    return [(g[i].name, g[i].kind, g[i].attr("dtype")) for i in g.slots()]


_ENTRY = re.compile(r"^CODA_DEFINE_ENTRY_POINTS\(", re.M)
_NAMESPACE = re.compile(r"\bcoda_generated\b")
_CFG = re.compile(r"^using Cfg = .*;$", re.M)


def _banner(kernel: LibKernel, suffix: str, config: KernelConfig) -> str:
    N, K = kernel.shape
    return (f"// libcoda kernel {kernel.name}_{suffix}: {kernel.call()} in {DTYPES[suffix]},\n"
            f"// {kernel.what}.\n"
            f"// Config {config.tag}: coda_ext.tuning.heuristic at M = {TRAINING_M}, N = {N}, K = {K}.\n"
            f"// Written by `{GENERATOR}`; do not edit (change the graph and regenerate).\n")


def kernel_file(kernel: LibKernel, suffix: str, source: KernelSource) -> str:
    """The text of csrc/kernels/ops/<name>_<suffix>.cu."""
    prefix = f"coda_{kernel.name}_{suffix}"
    banner = _banner(kernel, suffix, source.config)
    if kernel.fusion is None:
        # Entry points and the namespace of the emitted code (its fusion_arguments has external
        # linkage) are named after the kernel, so that every kernel links into one libcoda.
        text, n = _ENTRY.subn(f"CODA_DEFINE_NAMED_ENTRY_POINTS({prefix}, ", source.source)
        if n != 1:
            raise RuntimeError(f"{kernel.name}: expected one CODA_DEFINE_ENTRY_POINTS( line in the emitted source, "
                               f"found {n}; the codegen's entry-point line changed")
        text, n = _NAMESPACE.subn(prefix, text)
        if n < 2:
            raise RuntimeError(f"{kernel.name}: expected the emitted code in namespace coda_generated; the codegen "
                               "changed it")
        return banner + text
    cfg = _CFG.findall(source.source)
    if len(cfg) != 1:
        raise RuntimeError(f"{kernel.name}: expected one `using Cfg = ...;` line in the emitted source, "
                           f"found {len(cfg)}")
    return (banner +
            f"// The epilogue is coda::ops::{kernel.fusion} (fusions.cuh); the Cfg line is the emitted graph's.\n"
            '#include "kernels/ops/fusions.cuh"\n'
            "\n"
            "namespace {\n"
            f"{cfg[0]}\n"
            f"using Op = coda::ops::{kernel.fusion}<Cfg>;\n"
            "}  // namespace\n"
            "\n"
            f"CODA_DEFINE_NAMED_ENTRY_POINTS({prefix}, Op::Kernel, Op::fusion_arguments, Op::kReductions)\n")


def _const(name: str) -> str:
    """'norm_weight' -> 'kNormWeight'."""
    return "k" + "".join(part[:1].upper() + part[1:] for part in name.split("_"))


def _slot_comment(name: str, kind: str, dtype: str | None) -> str:
    what = {
        "tile": "(M, N) tile, ptr + ld", "store": "(M, N) output tile, ptr + ld",
        "row_vector": "length-N vector, ptr", "col_vector": "length-M vector, ptr",
        "pair_gated_store": "(M, N/2) output, ptr + ld", "row_reduce": "length-M fp32 output, ptr",
        "pair_tile": "(M, 2N) tile of 16-bit pairs, ptr + ld in pairs", "pair_store": "(M, 2N) output of pairs, "
        "ptr + ld in pairs",
        "col_reduce": "length-N fp32 output, ptr", "scalar": "runtime float, value",
    }.get(kind, kind)
    shown = {"bfloat16": "the operands' dtype", "float16": "the operands' dtype"}.get(dtype or "", dtype)
    return f"{kind} '{name}': {what}" + (f" ({shown})" if shown and kind not in ("row_reduce", "scalar") else "")


def contract_header(kernels: tuple[LibKernel, ...] = KERNELS) -> str:
    """The text of contract_generated.h."""
    raster_values = RASTER_ORDERS
    out = [
        f"// coda/kernels/ops/{HEADER} — written by `{GENERATOR}`",
        "// from the graphs of coda_ext.ops; do not edit. What libcoda's host code (csrc/lib) and its kernels",
        "// (csrc/kernels/ops/<kernel>_<dtype>.cu) agree on, per kernel: the fixed mainloop config and",
        "// the CodaLaunch slot of every operand, in the graph's canonical slot order (inputs sorted by",
        "// name, then outputs sorted by name: the order the emitted code reads them). Plain C++.",
        "#pragma once",
        "",
        "namespace coda::ops::gen {",
        "",
        "// Raster orders as CodaLaunch.raster_order numbers them.",
        *(f"inline constexpr int kRaster{_const(k)[1:]} = {v};" for k, v in raster_values.items()),
        "",
    ]
    for k in kernels:
        by_dtype = sources(k)
        order = {suffix: [(n, kind) for n, kind, _ in slots(s)] for suffix, s in by_dtype.items()}
        if len({tuple(v) for v in order.values()}) != 1:
            raise RuntimeError(f"{k.name}: the slot order differs between dtypes: {order}")
        src = by_dtype["bf16"]
        cfg = src.config
        tm, tn, tk = cfg.tile
        cm, cn = cfg.cluster
        em, en = cfg.epilogue_tile or (0, 0)
        N, K = k.shape
        out += [
            f"// {k.name}: {k.call()}",
            f"// {k.what}.",
            f"// Config {cfg.tag}: the heuristic's at M = {TRAINING_M}, N = {N}, K = {K}.",
            f"namespace {k.name} {{",
            f'inline constexpr const char* kName = "{k.name}";',
            f"inline constexpr int kTileM = {tm}, kTileN = {tn}, kTileK = {tk};",
            f"inline constexpr int kClusterM = {cm}, kClusterN = {cn};",
            f'inline constexpr const char* kSchedule = "{cfg.schedule}";',
            f"inline constexpr int kEpilogueTileM = {em}, kEpilogueTileN = {en};  // 0: CUTLASS's choice",
            f"inline constexpr int kSwizzle = {cfg.swizzle};  // launch defaults the config was chosen with",
            f"inline constexpr int kRaster = kRaster{_const(cfg.raster)[1:]};",
            (f"inline constexpr bool kHasD = {'true' if src.lowered.find('output') else 'false'};"
             "  // writes a main output D"),
        ]
        names = slots(src)
        out.append(f"inline constexpr int kNumSlots = {len(names) + len(k.extra_slots)};")
        out.append("namespace slot {")
        width = max(len(_const(n)) for n, _, _ in names + [(e, "", None) for e in k.extra_slots])
        for i, (name, kind, dtype) in enumerate(names):
            comment = _slot_comment(name, kind, dtype)
            out.append(f"inline constexpr int {_const(name).ljust(width)} = {i};  // {comment}")
        for j, name in enumerate(k.extra_slots):
            out.append(f"inline constexpr int {_const(name).ljust(width)} = {len(names) + j};"
                       f"  // libcoda's own (coda::ops::{k.fusion}), after the graph's")
        out += ["}  // namespace slot", f"}}  // namespace {k.name}", ""]
    out += [
        "}  // namespace coda::ops::gen",
        "",
        "// Every generated kernel as X(coda::Op enumerator, namespace above).",
        "#define CODA_GENERATED_KERNELS(X) \\",
        *(f"  X({k.enum}, {k.name})" + (" \\" if i + 1 < len(kernels) else "") for i, k in enumerate(kernels)),
        "",
    ]
    return "\n".join(out)


def generate() -> dict[str, str]:
    """{file name: text} of every file this module writes into csrc/kernels/ops."""
    files = {}
    for k in KERNELS:
        for suffix, src in sources(k).items():
            files[f"{k.name}_{suffix}.cu"] = kernel_file(k, suffix, src)
    files[HEADER] = contract_header()
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m coda_ext libgen", description=__doc__.splitlines()[0])
    parser.add_argument("outdir", nargs="?", default="csrc/kernels/ops", help="where the files go (csrc/kernels/ops)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file differs")
    args = parser.parse_args(argv)
    outdir = pathlib.Path(args.outdir)
    if not outdir.is_dir():
        print(f"{outdir} is not a directory; run from the repository root or pass csrc/kernels/ops", file=sys.stderr)
        return 2
    stale = []
    for name, text in generate().items():
        path = outdir / name
        if path.is_file() and path.read_text() == text:
            continue
        stale.append(name)
        if not args.check:
            path.write_text(text)
    verb = "differ" if args.check else "written"
    print(f"{len(stale)} file(s) {verb}" + (f": {', '.join(stale)}" if stale else " (all up to date)"))
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
