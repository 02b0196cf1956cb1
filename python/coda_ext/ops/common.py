"""What every ready op shares: argument checks that name the argument and the fix, leading
batch dimensions, and the compiled graph ops (one per graph variant and dtype, built lazily).

A ready op is a torch custom op (torch.library.custom_op) whose real implementation runs a
graph written with coda_ext's public builder, and whose fake gives the output shapes; the
graphs, their fp32 references and the registrations live one op per module beside this one.
"""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import is_fake

from ..graph.builder import dtype_name
from ..runtime.interface import PLAIN_TENSORS

DTYPES = (torch.bfloat16, torch.float16)


# --- calling a ready op's custom op -----------------------------------------------------------------------------
#
# torch's custom-op dispatch (its autograd wrapper, redispatch, the aliasing check of the results, the dynamo
# guard around the implementation) took about 10 of a ready op's 24 us of host time a call on a 2-core CPU
# (launch stubbed). Where the dispatcher has nothing to do for the call, call() runs the implementation itself:
# no gradient is being recorded (inside the Llama layers' autograd Functions, under torch.no_grad()), nothing
# traces (Dynamo, AOTAutograd and FakeTensorMode run as modes), no torch function or dispatch mode, no
# torch.func transform (vmap) and no profiler (whose traces name each op) watch, the tensors are plain. Ops
# that mutate an input go through the dispatcher always (it bumps the input's version counter).

#: {custom op name: its implementation} of the ops call() may run directly (direct())
_DIRECT: dict[str, Callable[..., Any]] = {}
_MODES = all(hasattr(torch._C, n) for n in ("_is_torch_function_mode_enabled", "_len_torch_dispatch_stack")) and \
    hasattr(torch.autograd.profiler, "_is_profiler_enabled") and \
    hasattr(getattr(torch._C, "_functorch", None), "peek_interpreter_stack")


def direct(op: Any) -> Any:
    """Registers a torch.library.custom_op of this package (that mutates nothing) for call(); returns it."""
    fn = getattr(op, "_init_fn", None)
    if fn is not None and _MODES:
        _DIRECT[op._name.split("::")[-1]] = fn
    return op


def dispatch_free() -> bool:
    """Whether a call now needs nothing of torch's dispatcher but the implementation (see above)."""
    return (_MODES and not torch.is_grad_enabled() and not torch.compiler.is_compiling()
            and not torch._C._is_torch_function_mode_enabled() and torch._C._len_torch_dispatch_stack() == 0
            and not torch.autograd.profiler._is_profiler_enabled
            and torch._C._functorch.peek_interpreter_stack() is None)   # no vmap or other torch.func transform


@contextlib.contextmanager
def switched(state: dict, name: str, choices: tuple[str, ...], what: str) -> Iterator[None]:
    """Within the block state["backend"] is `name` (one of `choices`; `what`: the switch's name in the message),
    restored after it: the process-wide backend switches (lm_head_ce.dw_backend, models.weight_grad_backend)."""
    if name not in choices:
        raise ValueError(f"{what}: name must be one of {choices}, got {name!r}")
    before = state["backend"]
    state["backend"] = name
    try:
        yield
    finally:
        state["backend"] = before


def call(name: str, *args: Any) -> Any:
    """torch.ops.coda_ext.<name>(*args), or the op's implementation itself where dispatch_free() and every
    tensor argument is a plain CUDA tensor (the same results, less host time; a kernel registered for another
    device, as the CPU tests register references, is still reached through the dispatcher)."""
    fn = _DIRECT.get(name)
    if fn is not None and dispatch_free() and \
            all(type(a) in PLAIN_TENSORS and a.is_cuda for a in args if isinstance(a, torch.Tensor)):
        return fn(*args)
    return getattr(torch.ops.coda_ext, name)(*args)


def check_linear(op: str, x: torch.Tensor, weight: torch.Tensor) -> None:
    """x (..., K) and weight (N, K) of one 16-bit dtype on one device, as F.linear takes them."""
    for name, t in (("x", x), ("weight", weight)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if x.dtype not in DTYPES:
        raise TypeError(f"{op}: x has dtype {x.dtype}; use torch.bfloat16 or torch.float16 (x.to(torch.bfloat16))")
    if weight.dtype != x.dtype:
        raise TypeError(f"{op}: weight has dtype {weight.dtype} but x has {x.dtype}; convert one of them")
    if weight.dim() != 2:
        raise ValueError(f"{op}: weight must be 2-D (N, K) as torch.nn.Linear stores it, got {tuple(weight.shape)}")
    if x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"{op}: x's last dimension ({x.shape[-1] if x.dim() else None}) must equal weight.shape[1] "
                         f"(K = {weight.shape[1]})")
    if x.device != weight.device:
        raise ValueError(f"{op}: x is on {x.device} and weight on {weight.device}; put them on one device")


def check_gradient_linear(op: str, a: torch.Tensor, a_name: str, w: torch.Tensor, w_name: str = "weight",
                          dim: int = 0) -> None:
    """a (..., w.shape[dim]) and a contiguous 2-D w of one 16-bit dtype on one device: a gradient dz (..., N)
    and the weight (N, K) of the linear it flows back through, read as stored (dim 0)."""
    for name, t in ((a_name, a), (w_name, w)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if a.dtype not in DTYPES or w.dtype != a.dtype:
        raise TypeError(f"{op}: {a_name} and {w_name} must share one 16-bit dtype (bfloat16 or float16), got "
                        f"{a.dtype} and {w.dtype}")
    if w.dim() != 2 or a.dim() < 1 or a.shape[-1] != w.shape[dim]:
        raise ValueError(f"{op}: {a_name} (..., {w.shape[dim] if w.dim() == 2 else 'N'}) must match {w_name} "
                         f"(N, K) as torch.nn.Linear stores it, got {tuple(a.shape)} and {tuple(w.shape)}")
    if not w.is_contiguous():
        raise ValueError(f"{op}: {w_name} must be contiguous (it is read in its stored layout); call .contiguous()")
    if a.device != w.device:
        raise ValueError(f"{op}: {a_name} is on {a.device} and {w_name} on {w.device}; put them on one device")


def check_rows(op: str, name: str, t: Any, lead: tuple[int, ...], width: int | None, dtype: torch.dtype | None,
               device: torch.device) -> None:
    """A per-token tensor: shape lead (+ (width,)), optional dtype, on `device`."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    want = tuple(lead) + ((width,) if width is not None else ())
    if tuple(t.shape) != want:
        raise ValueError(f"{op}: {name} must have shape {want} (one {'row' if width else 'value'} per token of x), "
                         f"got {tuple(t.shape)}")
    if dtype is not None and t.dtype != dtype:
        raise TypeError(f"{op}: {name} has dtype {t.dtype}, expected {dtype}; convert it with .to({dtype})")
    if t.device != device:
        raise ValueError(f"{op}: {name} is on {t.device} but x is on {device}; move it with .to(x.device)")


def check_vector(op: str, name: str, t: Any, length: int, device: torch.device,
                 dtype: torch.dtype | None = None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if tuple(t.shape) != (length,):
        raise ValueError(f"{op}: {name} must have shape ({length},), got {tuple(t.shape)}")
    if dtype is not None and t.dtype != dtype:
        raise TypeError(f"{op}: {name} has dtype {t.dtype}, expected {dtype}; convert it with .to({dtype})")
    if t.device != device:
        raise ValueError(f"{op}: {name} is on {t.device} but x is on {device}; move it with .to(x.device)")


def traced(t: torch.Tensor) -> bool:
    """Whether t has no values to compute with: traced (torch.compile, fake tensors) or on the meta device."""
    return torch.compiler.is_compiling() or is_fake(t) or t.device.type == "meta"


def import_triton(what: str, module: str) -> Any:
    """The module `module` (Triton, or Triton kernels of this package: "coda_ext.ops._rope_triton"), imported;
    where triton does not import, an ImportError that says which op needs it (`what`) and how to install it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:   # CUDA builds of torch on Linux bring triton
        raise ImportError(f"coda_ext {what} on the GPU with a Triton kernel, and triton does not import ({e}); "
                          "install the triton that matches your torch (pip install triton)") from e


def triton_op(name: str, fn: Callable[..., Any]) -> Any:
    """fn (mutating nothing) as the custom op coda_ext::<name> whose Triton kernel a tracing compiler keeps
    (torch.library.triton_op), where triton is installed (CUDA builds of torch); elsewhere None."""
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        return None
    return torch.library.triton_op(f"coda_ext::{name}", mutates_args=())(fn)


def launch_triton(kernel: Any, grid: tuple[int, ...], device: torch.device, *args: Any, **meta: Any) -> None:
    """kernel[grid](*args, **meta) on `device`: on a GPU through torch.library.wrap_triton (so a triton_op's
    implementation traces), on the CPU under Triton's interpreter (the tests)."""
    if device.type != "cuda":
        kernel[grid](*args, **meta)
        return
    with torch.cuda.device(device):
        torch.library.wrap_triton(kernel)[grid](*args, **meta)


def triton_available(op: Any, kernel: Callable[[], Any]) -> bool:
    """Whether a Triton kernel of this package can run here: its custom op `op` registered (None where triton
    is not installed) and kernel() imports it."""
    if op is None:
        return False
    try:
        kernel()
    except ImportError:
        return False
    return True


def graph_kept() -> bool:
    """Whether the running backward keeps its autograd graph for another (retain_graph or create_graph; unknown:
    yes): a backward may overwrite what its Function saved, or hand out saved tensors to scale in place, only when
    not. Ask only when not traced (Dynamo cannot trace the query)."""
    keep = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)
    return True if keep is None else bool(keep())


def readable(t: torch.Tensor) -> bool:
    """Whether t's values can be read now: not while traced (torch.compile, fake tensors), on the meta
    device, or in CUDA-graph capture."""
    return not traced(t) and not (t.is_cuda and torch.cuda.is_current_stream_capturing())


def rows(x: torch.Tensor) -> torch.Tensor:
    """x (..., K) as (M, K)."""
    return x.reshape(-1, x.shape[-1])


@functools.cache
def graph_op(build: Callable[..., Any], dtype: str, config: str, *args: Any, major: str = "kk") -> Any:
    """The compiled op of graph `build(*args)` for `dtype` (one per process; kernels load from the
    cache, or compile on first use). config "auto": a kernel config per shape. major: the operand
    layout (coda_ext.config.MAJORS)."""
    from ..runtime.api import compile as compile_graph

    return compile_graph(build(*args), dtype, config, major=major)


def check_gemm(name: str, build: Callable[..., Any], args: tuple, A: torch.Tensor, W: torch.Tensor,
               inputs: dict[str, Any], major: str = "kk", operands: tuple[str, str] = ("x", "weight")) -> Any:
    """The graph op of build(*args) for A's dtype ("auto" configs), after every check of its run(A, W, inputs)
    but the device's (GraphOp.check_call), each message naming the ready op `name` (operands: what it calls A
    and W). A custom op's fake calls this and its real implementation run_gemm: tracing, FakeTensorMode and
    meta tensors refuse what a launch refuses, with the same message, and a CPU call names the mistake
    before saying the op needs a GPU."""
    try:
        op = graph_op(build, dtype_name(A.dtype), "auto", *args, major=major)
        op.check_call_remembered(A, W, inputs, operands)
    except (TypeError, ValueError) as e:
        raise type(e)(f"{name}: {e}") from None
    return op


def run_gemm(name: str, build: Callable[..., Any], args: tuple, A: torch.Tensor, W: torch.Tensor,
             inputs: dict[str, Any], major: str = "kk", operands: tuple[str, str] = ("x", "weight")) -> Any:
    """check_gemm, then the launch (GraphOp.launch: on a device other than an SM90 GPU, the error that says
    so). Returns the graph's outputs."""
    op = check_gemm(name, build, args, A, W, inputs, major, operands)
    return op.launch(A, W, inputs, {}, A.shape[0], W.shape[0])


def compiled_rows(fn: Callable, backend: Any = "inductor") -> Callable:
    """fn (element-wise math over rows) as kernels generated by torch.compile, built on first call,
    with only the leading dimension of its tensor arguments dynamic: a new row count reuses the
    kernels, while a row's width stays a compile-time constant (dynamic=False: automatic dynamic shapes
    are off, so a new width compiles its own static graph instead of turning every size symbolic).
    Kernels with every size symbolic index within a row by run-time divisions: the RoPE backward ran
    3.2x slower that way on an H100 (1046 vs 331 us at 32768 x 3072). (A dynamo config patch around each
    call did the same for more host time: 47 against 30 us a call at 64 x 256 on a CPU.)"""
    compiled = functools.lru_cache(maxsize=None)(
        lambda: torch.compile(fn, fullgraph=True, backend=backend, dynamic=False))

    @functools.wraps(fn)
    def run(*args):
        for a in args:
            if isinstance(a, torch.Tensor) and a.dim():
                torch._dynamo.maybe_mark_dynamic(a, 0)
        try:
            return compiled()(*args)
        except _RECOMPILE_LIMIT:   # every variant compiled so far still runs its kernels
            _warn_eager(fn)
            return fn(*args)

    return run


#: What torch.compile raises (fullgraph=True) for a variant past Dynamo's recompile limit
_RECOMPILE_LIMIT = tuple(getattr(torch._dynamo.exc, name) for name in ("FailOnRecompileLimitHit", "FailOnCacheLimitHit")
                         if hasattr(torch._dynamo.exc, name))


@functools.cache
def _warn_eager(fn: Callable) -> None:
    import warnings

    warnings.warn(f"coda_ext: {fn.__module__}.{fn.__qualname__} met more input variants (dtype, device, strides, "
                  "gradient mode) than torch.compile recompiles a function for "
                  "(torch._dynamo.config.recompile_limit); further variants run eagerly, the compiled ones keep "
                  "their kernels", RuntimeWarning, stacklevel=3)
