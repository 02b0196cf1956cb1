"""The entry points: torch.compile(model, backend="coda") and fuse(model).

Dynamo captures the model's graph; AOTAutograd traces its joint forward + backward graph and hands it
to our partition_fn before splitting it: the passes, the partitioner and the lowering run on the
joint graph, so a fusion decision sees both directions and the activations saved between them (an
epilogue of a forward GEMM may compute, and save, what only the backward reads). Before AOTAutograd
traces Dynamo's graph, a GELU written out there in its tanh form (GPT-2's) becomes one gelu call
(passes.gelu_tanh_form), which AOTAutograd differentiates as one aten.gelu_backward rather than op by op.
AOTAutograd's default partition then splits the fused graph into forward and backward; the fused kernels
are calls of coda_ext::fusion_kernel in either. An inference graph (nothing requires grad) is fused alone.

What is not fused goes to the fallback compiler: "inductor" (torch.compile's default compiler; the
fused kernels are extern calls to it) or "eager" (the FX graphs run op by op). "auto" takes Inductor
when the inputs are on CUDA and eager elsewhere (on CPU the kernels run in the reference interpreter,
for tests: Inductor would only add compile time there).

A graph Dynamo compiles with symbolic sizes (its automatic dynamic shapes: a call at other sizes) is compiled
as it is, unfused, and fused at the sizes of each shape it is called at again (PerShape): the second call at a
shape traces the graph with those sizes, fuses and compiles it as above, and later calls at that shape reuse
it, for up to MAX_SPECIALIZATIONS shapes of one graph; the report says which graphs are which.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import time
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import fx

from ..errors import CodaError
from . import fx_util, passes, timing
from .analyze import analyze
from .cost import CostModel
from .lowering import Lowered, lower, missed_folds
from .partition import METHODS, Limits, partition
from .passes.norm_fold import META as NORM_FOLDS
from .report import FusionReport, GraphReport, graph_report

FALLBACKS = ("auto", "inductor", "eager")
#: Rounds of folding layer norms again without those whose fold math no kernel took, before none is folded.
MAX_FOLD_ROUNDS = 3

REPORT_ENV = "CODA_FUSION_REPORT"
#: Shapes a graph with symbolic sizes is fused at (each a trace, a partition and the fallback's compile on its second
#: call, as a static recompilation would cost); further shapes run that graph as compiled with symbolic sizes, unfused.
MAX_SPECIALIZATIONS = 8
#: Seconds a round that builds may spend planning the partitions its vetoes may lead to (_with_spares) before its
#: build starts: less than the minute a round's own build of one kernel would take.
SPARE_PLANNING_S = 30.0


@dataclasses.dataclass
class Options:
    """fallback: "auto", "inductor" or "eager" (see the module docstring).
    target: "auto" ("cuda" for CUDA inputs, else "interpret"), "cuda" or "interpret": whose kernel
        limits the partition respects (rules.py).
    execute: "auto" (the compiled kernel on CUDA, the interpreter elsewhere) or "interpret".
    method: "ilp" or "greedy"; time_limit: seconds for the ILP before the greedy fallback.
    report: print each graph's report when it is compiled (also with CODA_FUSION_REPORT=1).
    prebuild: build every kernel of a graph in parallel (coda_ext.prebuild) before it first runs (CUDA inputs
        only: on the CPU the kernels run in the interpreter, target="cuda" or not).
    cudagraphs: record the Inductor fallback's graphs, fused kernels included, into CUDA graphs and replay
        them (Inductor's cudagraph trees, as torch.compile's mode="reduce-overhead"; cudagraphs.py): the
        host launches one graph instead of each kernel. Needs the Inductor fallback ("auto" on CUDA);
        Inductor records only what it can (CUDA, static shapes) and runs the rest as without it.
    merge: GEMMs of one input left without an epilogue (a layer's q, k and v projections) become one GEMM of
        their concatenated weights, and their dX and weight-gradient GEMMs one each (passes.hmerge).
    measure: time each fused kernel against its bare GEMM and leave to the fallback the epilogues whose kernel
        is slower than that GEMM plus the fallback's kernel for the same work, then partition again (timing.py).
        "auto": where the kernels run on this process's GPU (target "cuda", execute "auto"); True also needs
        them to. timer: what measures a kernel, timing.gpu_timer by default (tests give their own).
    narrow_stores: the fallback may compute a value again from a narrower value the kernel stores in its place
        (a layer-norm backward's fp32 g = γ·dy from the bf16 dy: partition.outside); False: only from what the
        epilogue loads (an A/B of the two: bench_autofusion's coda_cudagraphs_wide_stores)."""

    fallback: str = "auto"
    target: str = "auto"
    execute: str = "auto"
    method: str = "ilp"
    time_limit: float = 10.0
    report: bool = False
    prebuild: bool = True
    cudagraphs: bool = False
    merge: bool = True
    measure: bool | str = "auto"
    timer: Callable | None = None
    narrow_stores: bool = True
    cost: CostModel = dataclasses.field(default_factory=CostModel)

    def __post_init__(self) -> None:
        if self.fallback not in FALLBACKS:
            raise ValueError(f"fallback must be one of {FALLBACKS}, got {self.fallback!r}")
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        if self.target not in ("auto", "cuda", "interpret"):
            raise ValueError(f"target must be 'auto', 'cuda' or 'interpret', got {self.target!r}")
        if self.cudagraphs and self.fallback == "eager":
            raise ValueError("cudagraphs=True records the Inductor fallback's graphs: use fallback='inductor' or "
                             "'auto' (on CUDA), or cudagraphs=False")
        if self.execute not in ("auto", "interpret"):
            raise ValueError(f"execute must be 'auto' or 'interpret', got {self.execute!r}")
        if self.measure not in (True, False, "auto"):
            raise ValueError(f"measure must be True, False or 'auto', got {self.measure!r}")
        if not isinstance(self.narrow_stores, bool):
            raise ValueError(f"narrow_stores must be True or False, got {self.narrow_stores!r}")

    def timer_for(self, target: str) -> Callable | None:
        """What times the fused kernels of a graph compiled for `target`, or None where nothing is measured."""
        if self.timer is not None:
            return self.timer if self.measure is not False else None
        runs = target == "cuda" and self.execute == "auto" and torch.cuda.is_available()
        if self.measure is True and not runs:
            raise ValueError("measure=True times the fused kernels on this process's GPU: it needs CUDA, target "
                             "'cuda' (or 'auto' with CUDA inputs) and execute='auto'; or give a timer")
        return timing.gpu_timer if self.measure and runs else None


def fuse_graph(gm: fx.GraphModule, options: Options, target: str, name: str, forward_outputs: int | None = None,
               spares: list[Lowered] | None = None) -> tuple[fx.GraphModule, GraphReport, tuple[Lowered, ...]]:
    """passes -> analysis -> partition -> lowering of one graph, and its report. forward_outputs: how many
    outputs of a joint graph are the forward's. spares: where nothing is timed, a list that receives the lowered
    epilogues of the partitions a measured veto of each kernel would lead to (plan(spares=True))."""
    if not all(fx_util.is_static(n) for n in gm.graph.nodes):
        from .partition import Partition

        an = analyze(fx_util.clone(gm), target)
        empty = Partition((), {}, "none", "symbolic shapes: not fused", 0.0, 0.0)
        rep = graph_report(name, an, empty, (), options.cost, predict=False)
        rep.note = "the graph has symbolic shapes (a dynamic recompilation); it runs unfused"
        return gm, rep, ()
    unfolded: set[str] = set()
    excluded: set[str] = set()                # GEMMs (fx_util.GEMM_ID) whose fused kernel measured slower
    vetoes: list[timing.Verdict] = []         # each with what was done
    by_veto: set[str] = set()                 # layer norms unfolded by a veto
    measured: list[timing.Verdict] = []
    solve_s = 0.0
    timer = options.timer_for(target)
    timed: dict[Any, Any] = {}                # each kernel and shape timed once across the rounds

    def partitioned(g: fx.GraphModule, counted: bool, exclude: set[str]) -> tuple[Any, Any]:
        nonlocal solve_s
        an = analyze(g, target, forward_outputs)
        pg = an.pgraph
        part = partition(pg, options.cost, method=options.method, time_limit=options.time_limit,
                         limits=Limits.of(target), narrow_stores=options.narrow_stores,
                         exclude=[i for i in pg.anchors() if fx_util.gemm_id(an.fx_nodes[i]) in exclude])
        solve_s += part.solve_s if counted else 0.0
        return an, part

    def planned(norms: set[str], counted: bool = True, exclude: set[str] | None = None) -> tuple[Any, ...]:
        """(graph, analysis, partition, fused graph, lowered epilogues) with the layer norms `norms` left unfolded,
        and any other whose folded math no kernel took (added to `norms`: norm_fold), the GEMMs `exclude` (default:
        those vetoed so far) without an epilogue."""
        exclude = excluded if exclude is None else exclude
        rounds = 0
        while True:
            g = passes.run(gm, target, norms, options.cost)
            an, part = partitioned(g, counted, exclude)
            plain = plain_gemms(an, part) if options.merge else set()
            if plain and passes.hmerge.groups(g, plain):   # merged, the partition runs again on the merged graph
                g = passes.merge_gemms(g, plain)
                an, part = partitioned(g, counted, exclude)
            fused, lowered = lower(g, an, part, options.execute, target)
            missed = missed_folds(g, an, lowered)
            if not missed:
                return g, an, part, fused, lowered
            rounds += 1
            norms |= missed if rounds < MAX_FOLD_ROUNDS else {f.norm for f in g.meta[NORM_FOLDS]}

    def veto_plans(g: fx.GraphModule, an: Any, lowered: tuple[Lowered, ...], folded: dict[str, str]
                   ) -> list[Callable[[], tuple]]:
        """Plans of the partitions a veto of this round's kernels may lead to, each returning its lowered epilogues
        (built beside the round's kernels where they fit in its batch: _with_spares). A kernel may be vetoed where
        it is 16-bit and not timed yet at its shape, or timed slower (its epilogue moved to another GEMM and made
        the same kernel there). Where a folded GEMM's kernel may be, the partition with every fold undone (what a
        veto of folded GEMMs leads to); then, for each other such kernel and shape, the partition with its GEMMs
        there without an epilogue (the next round's where it alone is vetoed). folded: each folded GEMM's layer
        norm."""
        def may_veto(low: Lowered) -> bool:
            if low.site is None or low.mnk is None or low.site.dtype not in timing.KERNEL_DTYPES:
                return False
            key = (low.site.kernel_key, tuple(low.mnk))
            return key not in timed or (timed[key] is not None and options.cost.slower(*timed[key]))

        candidates = [(an.fx_nodes[low.group.anchor], low) for low in lowered if may_veto(low)]
        plans: list[Callable[[], tuple]] = []
        if any(node.name in folded for node, _ in candidates):
            norms = frozenset(unfolded) | set(folded.values())
            plans.append(lambda: planned(set(norms), counted=False)[4])
        by_kernel: dict[Any, set[str]] = {}
        for node, low in candidates:
            if node.name not in folded:
                by_kernel.setdefault((low.site.kernel_key, tuple(low.mnk)), set()).add(fx_util.gemm_id(node))
        now = frozenset(unfolded)
        plans.extend(functools.partial(lambda ex: planned(set(now), False, ex)[4], excluded | gemms)
                     for gemms in by_kernel.values())
        return plans

    timing_rounds = 0                         # partitions that timed a kernel not timed before
    for veto_round in range(timing.MAX_PARTITIONS):
        g, an, part, fused, lowered = planned(unfolded)
        folded = {gemm: f.norm for f in g.meta[NORM_FOLDS] for gemm, _ in f.gemms}
        if spares is not None and veto_round == 0:   # plan(spares=True): the first round's veto plans, listed
            for plan_fn in veto_plans(g, an, lowered, folded):
                spares.extend(_run_plan(plan_fn))
        if timer is None:
            break
        known = len(timed)
        # a round whose vetoes no later round could follow plans no spares
        followed = veto_round < timing.MAX_PARTITIONS - 1 and timing_rounds < timing.MAX_ROUNDS
        measured = _measure(an, lowered, options, timer, timed, veto_round,
                            veto_plans(g, an, lowered, folded) if followed else ())
        timing_rounds += len(timed) > known
        slow = [v for v in measured if v.slow]
        if not slow or timing_rounds > timing.MAX_ROUNDS or veto_round == timing.MAX_PARTITIONS - 1:
            break
        for v in slow:   # a folded layer norm's GEMM first loses the fold; any other GEMM its epilogue
            if v.anchor in folded:
                unfolded.add(folded[v.anchor])
                by_veto.add(folded[v.anchor])
                vetoes.append(dataclasses.replace(v, action=f"the fold of layer norm {folded[v.anchor]} undone"))
            else:
                excluded.add(v.gemm)
                vetoes.append(dataclasses.replace(v, action="no epilogue"))
    rep = graph_report(name, an, part, lowered, options.cost)
    rep.solve_s = solve_s
    if timer is not None:
        rep.measured = tuple(measured)
        rep.vetoed = tuple(vetoes)
    rep.folded = tuple(f"{f.norm} into {', '.join(gemm for gemm, _ in f.gemms)}" for f in g.meta[NORM_FOLDS])
    rep.merged = g.meta.get(passes.hmerge.META, ())
    if unfolded - by_veto:
        rep.add_note("layer norms not folded, as their GEMM's kernel did not take the fold's math: "
                     f"{', '.join(sorted(unfolded - by_veto))}")
    if by_veto:
        rep.add_note(f"layer norms not folded, as their folded GEMM's kernel measured slower (a veto): "
                     f"{', '.join(sorted(by_veto))}")
    return fused, rep, lowered


def _measure(an: Any, lowered: tuple[Lowered, ...], options: Options, timer: Callable, timed: dict,
             veto_round: int, plans: Iterable[Callable[[], tuple[Lowered, ...]]] = ()) -> list[timing.Verdict]:
    """The verdicts of a partition's fused GEMMs. With the GPU timer: on the GPU of their operands, their kernels
    built first, in parallel, with the kernels of the later rounds' `plans` that fit in the same batch
    (_with_spares); nothing is timed while a CUDA graph is being captured (a warning says so)."""
    from ..runtime import prebuild

    fused = [(an.fx_nodes[low.group.anchor], low) for low in lowered if low.site is not None and low.mnk is not None]
    if timer is timing.gpu_timer and fused:
        device = fx_util.val(fused[0][0].args[0]).device
        if device.type != "cuda":
            return []
        if torch.cuda.is_current_stream_capturing():
            warnings.warn("coda fusion: a graph compiled during CUDA graph capture: its fused kernels are not timed "
                          "(measure)", stacklevel=2)
            return []
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        try:
            prebuild(_with_spares(kernel_items([low for _, low in fused], sms=sms), plans, sms))
        except CodaError as e:   # what did not build is not timed (verdicts says so) and stays fused
            warnings.warn(f"coda fusion: a kernel to time, or one a later round may need, did not build: {e}",
                          stacklevel=2)
        timer = functools.partial(timing.gpu_timer, device=device)
    return timing.verdicts([(n.name, fx_util.gemm_id(n), low.site, tuple(low.mnk)) for n, low in fused],
                           options.cost, timer, timed, veto_round)


def _with_spares(items: list, plans: Iterable[Callable[[], tuple[Lowered, ...]]], sms: int | None,
                 jobs: int | None = None) -> list:
    """`items` and, where some of them must be built anyway (a kernel not in the cache), the kernels of the
    epilogues each of `plans` returns (a later round's partition, after a veto) that are not built yet, a plan's
    kernels all or none, in order, while they fit in the same parallel batch (jobs: coda_ext.jit.default_jobs()):
    a veto round that needs them then builds nothing (each such round built its kernels alone, about a minute:
    BERT-base's fold undone, ViT-B/16's epilogues moved to another GEMM). A warm cache plans nothing; a plan that
    fails is skipped, with a warning; no plan starts after SPARE_PLANNING_S seconds of them (each is a partition of
    the whole graph: a few seconds on a large one, while the round's build waits)."""
    from ..jit import cached, default_jobs, kernel_source

    sources = [kernel_source(*i) for i in items]
    todo = {s.source for s in sources if not cached(s)}
    if not todo:
        return items
    room = (jobs or default_jobs()) - len(todo)
    known = {s.source for s in sources}
    extra: dict[str, tuple] = {}
    start = time.perf_counter()
    for plan_fn in plans:
        if len(extra) >= room or time.perf_counter() - start > SPARE_PLANNING_S:
            break
        new: dict[str, tuple] = {}
        for item in kernel_items(_run_plan(plan_fn), sms=sms):
            ks = kernel_source(*item)
            if ks.source not in known and ks.source not in extra and not cached(ks):
                new.setdefault(ks.source, item)
        if len(extra) + len(new) <= room:
            extra.update(new)
    return items + list(extra.values())


def _run_plan(plan_fn: Callable[[], tuple[Lowered, ...]]) -> tuple[Lowered, ...]:
    """The lowered epilogues a veto plan returns; none where it fails, with a warning (spares only save a later round's
    build: never a reason to fail)."""
    try:
        return plan_fn()
    except Exception as e:  # noqa: BLE001
        warnings.warn(f"coda fusion: the kernels a veto round may need were not planned ({type(e).__name__}: {e})",
                      stacklevel=3)
        return ()


def plain_gemms(an: Any, part: Any) -> set[str]:
    """The names of the GEMMs the partition left without an epilogue."""
    fused = {g.anchor for g in part.groups}
    return {an.pgraph[i].name for i in an.pgraph.anchors() if i not in fused}


def kernel_items(source: Any, sms: int | None = None, every_config: bool = False, spares: bool = False
                 ) -> list[tuple[Any, str, Any]]:
    """(graph, dtype, KernelConfig) of the kernels the fused epilogues of `source` — a model returned by
    fuse(), a CodaBackend, or lowered epilogues — launch, each once: what coda_ext.prebuild builds in
    parallel (the backend does so itself on CUDA, before the first step runs). By default the config
    config="auto" takes at each epilogue's GEMM shape on a GPU of `sms` SMs (this machine's GPU, else an
    H100's); every_config=True: every config "auto" may take, at any shape. spares=True: with those of the
    partitions the measured vetoes may lead to (a backend from plan(..., spares=True)). 16-bit GEMMs only (fp32
    ones run in the interpreter)."""
    from ..runtime.tuned import TunedOp

    if hasattr(source, "coda_backend"):
        source = source.coda_backend
    lowered = source.lowered if isinstance(source, CodaBackend) else source
    if spares:
        if not isinstance(source, CodaBackend) or source.spares is None:
            raise ValueError("kernel_items(source, spares=True) lists what plan(..., spares=True) planned: give "
                             "the backend it returned")
        lowered = [*lowered, *source.spares]
    if sms is None:
        sms = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else None
    items: dict[Any, tuple[Any, str, Any]] = {}
    ops: dict[Any, TunedOp] = {}
    for low in lowered:
        site = low.site
        if site is None or site.dtype not in timing.KERNEL_DTYPES:
            continue
        if site.kernel_key not in ops:
            ops[site.kernel_key] = TunedOp(site.graph, site.dtype, tune=False, major=site.major)
        op = ops[site.kernel_key]
        configs = op.prebuild_items() if every_config or low.mnk is None else \
            [(site.graph, op.dtype_name, op.config_for(*low.mnk, **({} if sms is None else {"sms": sms})))]
        for item in configs:
            items.setdefault((site.kernel_key, item[2].tag), item)
    return list(items.values())


def _eager(gm: fx.GraphModule, example_inputs: Any) -> Callable:
    from torch._functorch.aot_autograd import make_boxed_func

    return make_boxed_func(gm.forward)


def _inductor(gm: fx.GraphModule, example_inputs: Any) -> Callable:
    """Inductor on a graph after fusion: its decompositions first (torch.compile applies them while
    AOTAutograd traces; the fusion passes run on the undecomposed ops), its joint-graph passes (which
    torch.compile runs in its own partitioner, so without them the GEMMs left to the fallback would miss,
    among others, the padding of unaligned GEMM dimensions: GPT-2's 50257-wide head ran in align-1
    kernels), then its inner compiler."""
    return _inductor_inner(_decomposed(gm, example_inputs), example_inputs)


def _decomposed(gm: fx.GraphModule, example_inputs: Any) -> fx.GraphModule:
    """gm retraced through Inductor's decomposition table (under the inputs' fake mode, if any)."""
    import contextlib

    from torch._guards import detect_fake_mode
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    mode = detect_fake_mode(example_inputs)
    with mode if mode is not None else contextlib.nullcontext():
        out = make_fx(gm, decomposition_table=select_decomp_table())(*example_inputs)
    return _keep_names(gm, out)


def _keep_names(src: fx.GraphModule, dst: fx.GraphModule) -> fx.GraphModule:
    """dst (src retraced) with src's placeholder names and output meta: Inductor reads roles from the names
    (primals_*, tangents_*: the static inputs of a CUDA-graph-recorded backward) and output annotations from
    the output node; make_fx names its placeholders arg0_1, ..."""
    old = [n for n in src.graph.nodes if n.op == "placeholder"]
    new = [n for n in dst.graph.nodes if n.op == "placeholder"]
    for a, b in zip(old, new, strict=True):
        if b.name != a.name:
            b._rename(a.name)
        b.target = a.target
    dst_out, src_out = (next(n for n in reversed(g.graph.nodes) if n.op == "output") for g in (dst, src))
    for k, v in src_out.meta.items():
        dst_out.meta.setdefault(k, v)
    dst.recompile()
    return dst


def _inductor_inner(gm: fx.GraphModule, example_inputs: Any, **kwargs: Any) -> Callable:
    """Inductor's joint-graph passes (not again on an inference graph that compile_fx_forward has passed
    through them: kwargs is_inference), then compile_fx_inner with Inductor's keyword arguments."""
    from torch._inductor.compile_fx import compile_fx_inner

    return compile_fx_inner(gm if kwargs.get("is_inference") else inductor_joint_passes(gm), example_inputs,
                            **kwargs)


def inductor_joint_passes(gm: fx.GraphModule) -> fx.GraphModule:
    """Inductor's joint-graph passes (pattern rewrites such as pad_mm, constant folding, no-op removal) on
    one graph, as torch.compile runs them on an inference graph; where this torch has no such entry point
    or they fail, the graph as it is, with a warning."""
    try:
        from torch._inductor.compile_fx import _recursive_joint_graph_passes as passes
    except ImportError:
        try:
            from torch._inductor.fx_passes.joint_graph import joint_graph_passes as passes
        except ImportError:
            warnings.warn("coda fusion: this torch has no Inductor joint-graph passes; the fallback's GEMMs "
                          "are not padded", stacklevel=2)
            return gm
    try:
        out = passes(gm)
    except Exception as e:  # noqa: BLE001  (an optimisation of the fallback: the graph runs without it, said)
        warnings.warn(f"coda fusion: Inductor's joint-graph passes failed on a fallback graph ({type(e).__name__}: "
                      f"{e}); it compiles without them", stacklevel=2)
        return gm
    return out if isinstance(out, fx.GraphModule) else gm


class Planned(Exception):
    """Raised where plan() stops: the graph is fused and reported; nothing compiles or runs."""


def _stop(gm: fx.GraphModule, example_inputs: Any) -> Callable:
    raise Planned


class CodaBackend:
    """A torch.compile backend: torch.compile(model, backend=CodaBackend(fallback="eager")). The registered
    backend "coda" is CodaBackend() with the default options."""

    def __init__(self, **options: Any) -> None:
        self.options = Options(**options)
        self.report = FusionReport()
        self.lowered: list[Lowered] = []
        self.plan_only = False      # plan(): stop once the graph is fused (nothing compiles or runs)
        self.spares: list[Lowered] | None = None   # plan(spares=True): the epilogues the vetoes' rounds may launch
        self.mode_said = False      # a torch.compile mode it does not apply has been warned of

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Callable:
        if not self.plan_only and symbolic(example_inputs):
            return PerShape(self, gm, example_inputs, kwargs)
        return self.compile(gm, example_inputs, **kwargs)

    def compile(self, gm: fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Callable:
        """The graph fused (where its sizes are concrete) and compiled: AOTAutograd with the fusion in its
        partition_fn, the fallback compiler on what is left."""
        from torch._functorch.aot_autograd import aot_module_simplified
        from torch._functorch.partitioners import default_partition

        opts = self.options
        if kwargs.get("options"):
            opts = dataclasses.replace(opts, **kwargs["options"])
        on_cuda = any(isinstance(x, torch.Tensor) and x.is_cuda for x in example_inputs)
        target = opts.target if opts.target != "auto" else ("cuda" if on_cuda else "interpret")
        fallback = opts.fallback if opts.fallback != "auto" else ("inductor" if on_cuda else "eager")
        opts, unapplied = _with_mode(opts, kwargs.get("mode"), fallback)
        if unapplied and not self.mode_said:   # once a backend, not at each graph it compiles
            self.mode_said = True
            warnings.warn(unapplied, stacklevel=2)
        compile_fn = _stop if self.plan_only else _inductor if fallback == "inductor" else _eager
        gm = passes.gelu_tanh_form(gm)

        def run(graph: fx.GraphModule, name: str, forward_outputs: int | None = None) -> fx.GraphModule:
            fused, rep, lowered = fuse_graph(graph, opts, target, f"{name} {len(self.report.graphs)}",
                                             forward_outputs, self.spares)
            self.report.add(rep)
            self.lowered += lowered
            if opts.prebuild and on_cuda and target == "cuda" and opts.execute == "auto" and not self.plan_only:
                self._prebuild(lowered, rep)
            if opts.report or os.environ.get(REPORT_ENV, "") not in ("", "0"):
                print(rep)
            return fused

        def partition_fn(joint: fx.GraphModule, joint_inputs: Any, **kw: Any):
            return default_partition(run(joint, "joint graph", kw.get("num_fwd_outputs")), joint_inputs, **kw)

        def inference(graph: fx.GraphModule, inputs: Any) -> Callable:
            return compile_fn(run(graph, "inference graph"), inputs)

        if opts.cudagraphs and fallback == "inductor" and not self.plan_only:
            from . import cudagraphs

            forward, backward, infer = cudagraphs.compilers(gm, example_inputs, _decomposed, _inductor_inner)
            return aot_module_simplified(gm, example_inputs, fw_compiler=forward, bw_compiler=backward,
                                         partition_fn=partition_fn,
                                         inference_compiler=lambda g, i: infer(run(g, "inference graph"), i))
        return aot_module_simplified(gm, example_inputs, fw_compiler=compile_fn, bw_compiler=compile_fn,
                                     partition_fn=partition_fn, inference_compiler=inference)

    @staticmethod
    def _prebuild(lowered: tuple[Lowered, ...], rep: GraphReport) -> None:
        from ..runtime import prebuild

        try:
            items = kernel_items(lowered)
            if items:
                prebuild(items)
        except CodaError as e:   # they build on first use instead (and say why there if they cannot)
            rep.add_note(f"prebuild failed: {e}")


def _with_mode(opts: Options, mode: str | None, fallback: str) -> tuple[Options, str | None]:
    """torch.compile's `mode` as the backend takes it: "reduce-overhead" (CUDA graphs) is Options(cudagraphs=True)
    where the fallback is Inductor; any other mode but "default" is not applied: (the options, why not) then."""
    if mode in (None, "default") or (mode == "reduce-overhead" and opts.cudagraphs):
        return opts, None
    if mode == "reduce-overhead" and fallback == "inductor":
        return dataclasses.replace(opts, cudagraphs=True), None
    why = "the fallback compiles in Inductor's default mode" if fallback == "inductor" else "the fallback is eager"
    return opts, f"coda fusion: torch.compile's mode={mode!r} is not applied ({why})"


def symbolic(example_inputs: list[Any]) -> bool:
    """Whether Dynamo compiled the graph with symbolic sizes: a size among its inputs, or a tensor of symbolic
    shape."""
    return any(isinstance(x, torch.SymInt) or
               (isinstance(x, torch.Tensor) and not all(isinstance(s, int) for s in x.shape))
               for x in example_inputs)


class PerShape:
    """A graph Dynamo compiled with symbolic sizes, fused at the concrete sizes of the shapes it is called at
    again. Made inside Dynamo's compilation, it compiles the graph as it is (unfused: fuse_graph leaves a graph
    of symbolic sizes to the fallback, under Dynamo's guards), which runs a shape's first call; the second call
    at a shape (its symbolic inputs' sizes and strides, its size arguments) compiles the graph traced at those
    sizes (CodaBackend.compile with the call's inputs, under a tracing context of static sizes, as Dynamo's own
    runtime specializations do), which runs that shape from then on. A shape seen once (sequence lengths that
    never recur) thus costs no compile; past MAX_SPECIALIZATIONS fused shapes the others keep the unfused graph.
    A shape is the graph's symbolic inputs: the size arguments Dynamo passes (it makes sizes, and strides that
    vary, into such arguments and guards the rest), and any other Python int among them, which a trace would
    bake in (a graph whose int argument changes at every call is never fused)."""

    def __init__(self, backend: CodaBackend, gm: fx.GraphModule, example_inputs: list[Any], kwargs: dict):
        self.backend, self.gm, self.kwargs = backend, gm, kwargs
        first = len(backend.report.graphs)
        self.generic = backend.compile(gm, example_inputs, **kwargs)
        for rep in backend.report.graphs[first:]:
            rep.add_note(f"a shape's first call runs it, its second call fuses the graph at that shape (at most "
                         f"{MAX_SPECIALIZATIONS} shapes)")
        #: the symbolic inputs, whose values key a shape (size arguments; a tensor of symbolic sizes would key by
        #: its sizes and strides)
        self.varying = tuple(i for i, x in enumerate(example_inputs) if symbolic([x]))
        self.compiled: dict[tuple, Callable] = {}
        self.seen: set[tuple] = set()

    def key(self, args: tuple) -> tuple:
        return tuple((tuple(a.shape), a.stride()) if isinstance(a, torch.Tensor) else a
                     for a in (args[i] for i in self.varying))

    def __call__(self, *args: Any) -> Any:
        key = self.key(args)
        fn = self.compiled.get(key)
        if fn is None:
            fn = self._specialize(key, args)
        return fn(*args)

    def _specialize(self, key: tuple, args: tuple) -> Callable:
        from torch._dynamo.convert_frame import compile_lock
        from torch._guards import TracingContext, tracing
        from torch._subclasses.fake_tensor import FakeTensorMode

        if len(self.compiled) >= MAX_SPECIALIZATIONS:
            return self.generic
        if key not in self.seen:
            self.seen.add(key)
            return self.generic
        with compile_lock:   # one compilation at a time, as Dynamo's
            if key in self.compiled:
                return self.compiled[key]
            reports = self.backend.report.graphs
            first = len(reports)
            with tracing(TracingContext(FakeTensorMode())):
                fn = self.backend.compile(self.gm, list(args), **self.kwargs)
            self.compiled[key] = fn
            for rep in reports[first:]:
                rep.add_note(
                    f"fused at one shape ({len(self.compiled)} of at most {MAX_SPECIALIZATIONS}) of a graph Dynamo "
                    "compiled with symbolic sizes")
        return fn


def coda_backend(gm: fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Callable:
    """The backend registered as "coda": CodaBackend() with the default options."""
    return CodaBackend()(gm, example_inputs, **kwargs)


def fuse(model: Any, report: bool = False, **options: Any) -> Any:
    """torch.compile(model, backend=CodaBackend(report=report, **options)), static shapes.

    The model compiles on its first call; the compiled model's `coda_report` (a FusionReport, also
    report_of(model)) then says what was fused, and with report=True each graph's report is printed
    as it is compiled. A Hugging Face model traces with no attention mask where it needs none
    (hf_masks.plain_masks: SDPA keeps its flash kernel)."""
    from .hf_masks import with_plain_masks

    backend = CodaBackend(report=report, **options)
    compiled = with_plain_masks(torch.compile(model, backend=backend, dynamic=False))
    compiled.coda_report = backend.report
    compiled.coda_backend = backend
    return compiled


def plan(model: Any, args: tuple = (), kwargs: dict | None = None, target: str = "cuda", spares: bool = False,
         **options: Any) -> CodaBackend:
    """What fuse(model) would fuse, without running anything (nor the measured vetoes: Options.measure, which time
    the kernels on a GPU and may change the partition there): traces model(*args, **kwargs) — its training
    graph, forward and backward, as the first call would — through the backend, under `target`'s kernel
    rules ("cuda": the GPU kernel's, on any machine), and stops before anything compiles or runs. The
    returned backend's `report` says what was fused and kernel_items(backend) lists the kernels to
    prebuild. Inputs are tensors of the real shapes on any device (the CPU: attention and other
    device-specific ops differ, and they are left to the fallback anyway); the parameters' values are
    never read (torch.nn.Module.to_empty gives uninitialised ones). A model with a graph break is planned
    up to its first graph. spares=True also plans the partitions the first round's measured vetoes may lead to
    (every fold undone; each fused kernel's GEMMs at a shape without an epilogue): kernel_items(backend,
    spares=True) then lists their kernels too, a prebuild ahead of a GPU run whose veto rounds then build nothing
    where their vetoes were among those planned (on the GPU each round that builds anyway plans and builds such
    spares itself, where they fit in its batch)."""
    from .hf_masks import plain_masks, unpacked_call

    options.pop("cudagraphs", None)   # nothing compiles or runs: no graph to record, no kernel to time
    options.pop("measure", None)
    backend = CodaBackend(target=target, fallback="eager", execute="interpret", prebuild=False, **options)
    backend.plan_only = True
    backend.spares = [] if spares else None
    try:
        with plain_masks(unpacked_call(args, kwargs or {})):
            torch.compile(model, backend=backend, dynamic=False)(*args, **(kwargs or {}))
    except Exception as e:   # Dynamo wraps what the backend raises
        if not isinstance(getattr(e, "inner_exception", e), Planned):
            raise
    return backend


def report_of(compiled: Any) -> FusionReport:
    """The FusionReport of a model returned by fuse()."""
    try:
        return compiled.coda_report
    except AttributeError:
        raise TypeError("report_of takes a model returned by coda_ext.fusion.fuse(model)") from None


def register() -> None:
    """Registers the "coda" backend with torch._dynamo (once; a torch_dynamo_backends entry point that
    names coda_backend registers it itself)."""
    from torch._dynamo.backends import registry

    if "coda" in registry._COMPILER_FNS or registry._BACKENDS.get("coda") is not None:
        return
    registry.register_backend(coda_backend, name="coda")
