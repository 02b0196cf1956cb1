"""emit: a lowered graph + kernel config -> the C++ of one kernel translation unit.

The source only instantiates project templates (csrc/kernels, csrc/epilogues): one alias
per visitor node, the fusion type (a tree of Sm90EVT or one Sm90TopologicalVisitor), a
function building the fusion arguments bottom-up (one typed variable per subtree) from a
CodaLaunch, and the reduction list. All text comes from kernel.cu.tmpl and the small
tables below; the C++ name of each node kind comes from the registry (graph/kinds.py).
"""
from __future__ import annotations

import math
import pathlib
import string

from ..config import KernelConfig
from ..graph import ir
from ..graph.kinds import KINDS
from .oob import reduction_needs_bounds_check
from .plan import Op, Plan, plan

_TEMPLATE = string.Template((pathlib.Path(__file__).parent / "kernel.cu.tmpl").read_text())

CPP_TYPES = {"bfloat16": "cutlass::bfloat16_t", "float16": "cutlass::half_t", "float32": "float", "uint8": "uint8_t"}
#: The functor of every element-wise kind (emitted as Compute<Cfg, functor>).
FUNCTORS = {k.name: k.cpp for k in KINDS.values() if "compute" in k.flags}
#: Integer vectors reach the kernel as int32 (CUTLASS's broadcast partitioning takes 32-bit or
#: narrower elements; the runtime narrows int64 vectors, whose values are exact in fp32 only
#: below 2**24 anyway).
CPP_TYPES_INT = {"int32": "int32_t", "int64": "int32_t"}
REDUCE_RULES = {"sum": "ReduceSum", "max": "ReduceMax", "sumsq": "ReduceSumSq"}
REDUCE_COMBINE = {"sum": "Sum", "max": "Max", "sumsq": "Sum", "logsumexp": "LogSumExp"}
REDUCE_IDENTITY = {"sum": "0.0f", "max": "-INFINITY", "sumsq": "0.0f", "logsumexp": "-INFINITY"}
SCHEDULES = {"cooperative": "Cooperative", "pingpong": "Pingpong", "streamk": "CooperativeStreamK",
             "overlap": "PingpongOverlap", "overlap_ordered": "PingpongOverlapOrdered",
             "handoff": "CooperativeHandoff"}
#: Schedules whose kernels are built without CUTLASS's programmatic-dependent-launch hooks:
#: CUTLASS 4.2's stream-K scheduler does not compile with them (is_last_tile binds a const member).
NO_PDL_SCHEDULES = ("streamk",)
NO_PDL_PRELUDE = "#define CODA_NO_PDL 1  // this schedule does not compile with CUTLASS's PDL hooks\n"


def float_literal(x: float) -> str:
    if not math.isfinite(x):
        raise ValueError(f"constant {x!r} is not finite")
    return f"{x!r}f" if "e" in repr(x) or "." in repr(x) else f"{x!r}.0f"


def node_alias(node: ir.Node, check_oob: bool = True, direct_loads: bool = False, staggered_pairs: bool = False,
               epilogue_cache: str = "normal", direct_stores: bool = False, gated_tma: bool = False) -> str:
    """The wrapper type (nodes.hpp) implementing one IR node: its kind's C++ name (kinds.py) with the
    template arguments its attributes give; tile inputs read straight into registers with direct_loads
    (KernelConfig.tile_loads), tile outputs written from registers with direct_stores (KernelConfig.tile_stores,
    csrc/epilogues/variants/direct_store.hpp), pair tiles and pair stores through staggered shared-memory
    accesses with staggered_pairs (KernelConfig.pair_smem); TMA tile loads and stores with the L2 evict-first
    hint, or tile loads prefetched into L2 (csrc/epilogues/variants/l2_prefetch.hpp), by epilogue_cache
    (KernelConfig.epilogue_cache); the gated pair output staged in shared memory and TMA-stored with gated_tma
    (KernelConfig.gated_store, csrc/epilogues/variants/pair_gated_tma_store.hpp)."""
    if direct_stores and node.kind in ("store", "pair_store"):   # 32-bit elements for the pairs
        return f"TileStoreDirect<Cfg, {'float' if node.kind == 'pair_store' else CPP_TYPES[node.attr('dtype')]}>"
    alias = _node_alias(node, check_oob, direct_loads, staggered_pairs)
    if gated_tma and node.kind == "pair_gated_store":
        return alias.replace("PairGatedStore<", "PairGatedStoreTma<", 1)
    tma_load = node.kind in ("tile", "pair_tile") and not direct_loads
    if epilogue_cache == "evict_first" and tma_load:
        return f"EvictFirstLoad<{alias}>"
    if epilogue_cache == "evict_first" and node.kind in ("store", "pair_store"):
        return f"EvictFirstStore<{alias}>"
    if epilogue_cache == "prefetch" and tma_load:
        return f"L2PrefetchLoad<{alias}>"
    return alias


def variant_headers(config: KernelConfig, graph: ir.GraphIR) -> list[str]:
    """The variant headers (csrc/epilogues/variants/) the kernel of `graph` in `config` needs, included by the emitted
    source after the kernel templates (their bytes enter the keys of the kernels that include them only). The gated
    TMA store's only where the graph has a gated pair output, so the config leaves other graphs' kernels as they are."""
    gated = config.gated_store == "tma" and bool(graph.find("pair_gated_store"))
    return ((["epilogues/variants/direct_store.hpp"] if config.tile_stores == "direct" else []) +
            (["epilogues/variants/l2_prefetch.hpp"] if config.epilogue_cache == "prefetch" else []) +
            (["epilogues/variants/pair_gated_tma_store.hpp"] if gated else []) +
            (["epilogues/variants/timeline.hpp"] if config.timeline else []))


def _node_alias(node: ir.Node, check_oob: bool, direct_loads: bool, staggered_pairs: bool) -> str:
    k = node.kind
    kind = KINDS.get(k)
    if kind is None or kind.cpp is None:
        raise NotImplementedError(f"emit: no visitor for node kind {k!r}")
    c = kind.cpp
    if direct_loads and k in ("tile", "pair_tile"):
        c += "Direct"
    elif staggered_pairs and k in ("pair_tile", "pair_store"):
        c += "Staggered"
    if "compute" in kind.flags:
        return f"Compute<Cfg, {c}>"
    no_check = "" if check_oob else ", /*CheckOOB=*/false"
    t = {**CPP_TYPES, **CPP_TYPES_INT}.get(node.attr("dtype") or "", "")
    if k in ("accumulator", "col_index"):
        return c
    if k == "scalar":
        return f"{c}<Cfg>"
    if k in ("row_vector", "col_vector", "tile", "store", "cast", "pack"):
        return f"{c}<Cfg, {t}>"
    if k in ("pair_tile", "pair_store"):   # (M, 2N) 16-bit pairs moved as (M, N) 32-bit elements
        return f"{c}<Cfg, float>"
    if k == "unpack":
        return f"{c}<Cfg, {t}, {node.attr('half')}>"
    if k == "segment_reduce":
        return f"{c}<Cfg, {REDUCE_RULES[node.attr('op')]}, {node.attr('size')}>"
    if k == "row_reduce" and node.attr("op") == "logsumexp":
        return f"RowLogSumExp<Cfg{no_check}>"
    if k in ("row_reduce", "col_reduce"):
        return f"{c}<Cfg, {REDUCE_RULES[node.attr('op')]}{no_check}>"
    if k == "pair_gated_store":
        return f"{c}<Cfg, {t}, scalar::{FUNCTORS[node.attr('act')]}>"
    raise NotImplementedError(f"emit: no template arguments for node kind {k!r} (codegen/emit.py node_alias)")


def node_arguments(alias: str, node: ir.Node, slot: dict[int, int], reduction: dict[int, int], index: int) -> str:
    """The C++ expression building one node's own arguments."""
    k = node.kind
    if k == "scalar":
        mode = node.attr("mode")
        if mode == "constant":
            return f"{alias}::constant({float_literal(node.attr('value'))})"
        return f"{alias}::{mode}(L.slots[{slot[index]}])"
    if k in ir.INPUT_KINDS or k in ("store", "pair_gated_store", "pair_store"):
        return f"{alias}::args(L.slots[{slot[index]}])"
    if k in ("row_reduce", "col_reduce"):
        return f"{alias}::args(partials[{reduction[index]}], {REDUCE_IDENTITY[node.attr('op')]})"
    if k == "segment_reduce":
        return f"{alias}::args({REDUCE_IDENTITY[node.attr('op')]})"
    return f"{alias}::args()"


def emit(graph: ir.GraphIR, dtype: str, config: KernelConfig) -> str:
    """C++ source of the kernel of `graph` (already lowered) for operands of `dtype`."""
    p = plan(graph)
    slots = {node: s for s, node in enumerate(graph.slots())}
    reductions = [i for i in graph.slots() if graph[i].kind in ("row_reduce", "col_reduce")]
    reduction_index = {node: r for r, node in enumerate(reductions)}

    aliases = []
    timeline_done = False
    for o, op in enumerate(p.ops):
        node = graph[op.node] if op.node >= 0 else ir.Node("keep_first")
        what = f"%{op.node} {op.kind}" if op.node >= 0 else "root: D, then side outputs"
        if node.name:
            what += f" {node.name!r}"
        check = op.node < 0 or node.kind not in ("row_reduce", "col_reduce") or \
            reduction_needs_bounds_check(graph, op.node)
        alias = node_alias(node, check, config.tile_loads == "direct", config.pair_smem == "staggered",
                           config.epilogue_cache, config.tile_stores == "direct", config.gated_store == "tma")
        if config.timeline and node.kind == "accumulator" and not timeline_done:   # the first one records
            alias, timeline_done = "TimelineAccumulator", True
        aliases.append((f"using n{o} = {alias};", what))
    width = max(len(a) for a, _ in aliases)
    alias_lines = [f"{a.ljust(width)}  // {w}" for a, w in aliases]

    def own_args(o: int, op: Op) -> str:
        node = graph[op.node] if op.node >= 0 else ir.Node("keep_first")
        return node_arguments(f"n{o}", node, slots, reduction_index, op.node)

    if p.is_tree:
        fusion, arg_lines = _tree(p, own_args)
    else:
        fusion, arg_lines = _topological(p, own_args)
    if reductions and config.finalize == "kernel":   # finished by the kernel itself: csrc/epilogues/last_tile.hpp
        fusion, arg_lines = _finishing(fusion, arg_lines)
    has_d = bool(graph.find("output"))
    if not has_d:  # no main output: D is void, its staging buffer takes the operands' type
        fusion[-1] = fusion[-1].replace("using Fusion = ", "using FusionTree = ")
        fusion.append(f"using Fusion = WithoutD<FusionTree, {CPP_TYPES[dtype]}>;  // no main output D")

    red_specs = []
    for node in reductions:
        n = graph[node]
        axis = "Rows" if n.kind == "row_reduce" else "Cols"
        red_specs.append(f"{{{slots[node]}, ReduceAxis::{axis}, ReduceCombine::{REDUCE_COMBINE[n.attr('op')]}}}")

    tm, tn, tk = config.tile
    cm, cn = config.cluster
    em, en = config.epilogue_tile or (0, 0)
    epi = f", {em}, {en}" if config.epilogue_tile else ""
    if config.major != "kk" or config.epilogue_stages:   # operand layouts: A's M / W's N contiguous
        epi = f", {em}, {en}, {str(config.major[0] == 'm').lower()}, {str(config.major[1] == 'n').lower()}"
    if config.epilogue_stages:   # the epilogue's load and store stages (0, 0: CUTLASS's choice)
        epi += ", {}, {}".format(*config.epilogue_stages)
    return _TEMPLATE.substitute(
        prelude=NO_PDL_PRELUDE if config.schedule in NO_PDL_SCHEDULES else "",
        variants="\n".join(f'#include "{h}"' for h in variant_headers(config, graph)),
        digest=graph.digest(),
        mode="tree" if p.is_tree else "topological",
        listing="\n".join(f"//   {line}" for line in graph.text().splitlines()),
        element_ab=CPP_TYPES[dtype], element_d=CPP_TYPES[dtype] if has_d else "void",
        tile_m=tm, tile_n=tn, tile_k=tk, cluster_m=cm, cluster_n=cn, schedule=SCHEDULES[config.schedule] + epi,
        node_aliases="\n".join(alias_lines),
        fusion_types="\n".join(fusion),
        argument_lines="\n".join("  " + line for line in arg_lines),
        num_reductions=len(red_specs),
        reductions=", ".join(red_specs),
    )


def _tree(p: Plan, own_args) -> tuple[list[str], list[str]]:
    """Sm90EVT types and arguments, bottom-up, one variable per subtree."""
    types, args = [], []
    expr: dict[int, tuple[str, str]] = {}  # op -> (type, argument expression)
    for o, op in enumerate(p.ops):
        if not op.children:
            expr[o] = (f"n{o}::Node", own_args(o, op))
            continue
        kid_types = ", ".join(expr[c][0] for c in op.children)
        kid_args = ", ".join(expr[c][1] for c in op.children)
        types.append(f"using t{o} = fusion::Sm90EVT<n{o}::Node, {kid_types}>;")
        args.append(f"t{o}::Arguments a{o}{{{kid_args}, {own_args(o, op)}}};")
        expr[o] = (f"t{o}", f"a{o}")
    root = len(p.ops) - 1
    types.append(f"using Fusion = {expr[root][0]};")
    if p.ops[root].children:
        args.append(f"return a{root};")
    else:
        args.append(f"return {expr[root][1]};")
    return types, args


def _finishing(types: list[str], args: list[str]) -> tuple[list[str], list[str]]:
    """The fusion with the node that finishes its reductions in the kernel at the root (FinishReductions), its
    arguments the body's and that node's (left empty here: EpilogueGemm::run fills them in)."""
    finishing = "using Fusion = FinishReductions<Cfg, FusionBody>;  // reductions finished in the kernel"
    types = types[:-1] + [types[-1].replace("using Fusion = ", "using FusionBody = "), finishing]
    if args[-1].startswith("return ") and args[-1] != "};":   # a tree: `return a<root>;`
        return types, args[:-1] + [f"return Fusion::Arguments{{{args[-1][len('return '):-1]}, {{}}}};"]
    assert args[0] == "return Fusion::Arguments{" and args[-1] == "};", args   # one topological visitor
    return types, ["return Fusion::Arguments{FusionBody::Arguments{"] + args[1:-1] + ["}, {}};"]


def _topological(p: Plan, own_args) -> tuple[list[str], list[str]]:
    """One Sm90TopologicalVisitor: op i reads the ops listed in its edge sequence."""
    edges = ", ".join(f"cute::seq<{', '.join(str(c) for c in op.children)}>" for op in p.ops)
    ops = ", ".join(f"n{o}::Node" for o in range(len(p.ops)))
    types = [
        f"using Edges = cute::tuple<{edges}>;",
        f"using Fusion = fusion::Sm90TopologicalVisitor<float, Edges, {ops}>;",
    ]
    lines = ["return Fusion::Arguments{"]
    lines += [f"    {own_args(o, op)}," for o, op in enumerate(p.ops)]
    lines[-1] = lines[-1].rstrip(",")
    lines.append("};")
    return types, lines
