"""The plain GEMMs of a block's forward and backward, each reading its operands as they are stored:

    linear_residual(x, W, residual) = x @ Wᵀ + residual        (a down/output projection)
    linear_dx(dz, W)                = dz @ W                    (the dX GEMM: W read as stored, (N, K))
    weight_grad(dz, x, accumulate, scale) = [scale ·] dzᵀ @ x [+ accumulate]   (the weight gradient, (N, K))

The backward GEMMs take transposed views (W.t(), dz.t(), x.t()) of the stored tensors: the
kernels are built for those layouts (coda_ext.config.MAJORS), so nothing is copied.
"""
from __future__ import annotations

import torch

from .. import graphs
from . import common

NAME = "linear_grad"


#: The epilogue graph family of the three GEMMs (coda_ext.graphs): graph(residual, scaled=False).
graph = graphs.linear


def reference_linear_residual(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """fp32 reference of linear_residual."""
    return x.float() @ weight.float().t() + residual.float()


def reference_linear_dx(dz: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """fp32 reference of linear_dx."""
    return dz.float() @ weight.float()


def reference_weight_grad(dz: torch.Tensor, x: torch.Tensor, accumulate: torch.Tensor | None = None,
                          scale: float | None = None) -> torch.Tensor:
    """fp32 reference of weight_grad (leading dimensions of dz and x are the summed rows)."""
    out = common.rows(dz).float().t() @ common.rows(x).float()
    if scale is not None:
        out = out * scale
    return out if accumulate is None else out + accumulate.float()


reference = reference_linear_residual


#: (op name, operand layout, what it calls the GEMM's A and W) of each GEMM of the family
_GEMMS = {"linear_residual": ("kk", ("x", "weight")), "linear_dx": ("kn", ("dz", "weight.t()")),
          "weight_grad": ("mn", ("dz.t()", "x.t()"))}


def _gemm(name, A, B, tile, scale=None):
    """GEMM `name` of the family, as common.run_gemm and check_gemm take it."""
    major, operands = _GEMMS[name]
    inputs = {} if tile is None else {"residual": tile}
    if scale is not None:
        inputs["scale"] = scale
    return dict(name=name, build=graph, args=(tile is not None, scale is not None), A=A, W=B, inputs=inputs,
                major=major, operands=operands)


@common.direct
@torch.library.custom_op("coda_ext::linear_residual", mutates_args=())
def _op_residual(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    return common.run_gemm(**_gemm("linear_residual", x, weight, residual)).out


@_op_residual.register_fake
def _fake_residual(x, weight, residual):
    common.check_gemm(**_gemm("linear_residual", x, weight, residual))
    return x.new_empty(x.shape[0], weight.shape[0])


@common.direct
@torch.library.custom_op("coda_ext::linear_dx", mutates_args=())
def _op_dx(dz: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return common.run_gemm(**_gemm("linear_dx", dz, weight.t(), None)).out


@_op_dx.register_fake
def _fake_dx(dz, weight):
    common.check_gemm(**_gemm("linear_dx", dz, weight.t(), None))
    return dz.new_empty(dz.shape[0], weight.shape[1])


@common.direct
@torch.library.custom_op("coda_ext::weight_grad", mutates_args=())
def _op_wgrad(dz: torch.Tensor, x: torch.Tensor, accumulate: torch.Tensor | None,
              scale: float | None = None) -> torch.Tensor:
    return common.run_gemm(**_gemm("weight_grad", dz.t(), x.t(), accumulate, scale)).out


@_op_wgrad.register_fake
def _fake_wgrad(dz, x, accumulate, scale=None):
    common.check_gemm(**_gemm("weight_grad", dz.t(), x.t(), accumulate, scale))
    return dz.new_empty(dz.shape[1], x.shape[1])


def linear_residual(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """x @ weightᵀ + residual in x's dtype. x (..., K), weight (N, K), residual (..., N)."""
    common.check_linear("linear_residual", x, weight)
    lead, N = tuple(x.shape[:-1]), weight.shape[0]
    common.check_rows("linear_residual", "residual", residual, lead, N, x.dtype, x.device)
    return common.call("linear_residual", common.rows(x), weight, common.rows(residual)).reshape(*lead, N)


def linear_dx(dz: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """dz @ weight (..., K) in dz's dtype: the input gradient of x @ weightᵀ. dz (..., N), weight (N, K)
    as torch.nn.Linear stores it (read in place, no transposed copy)."""
    common.check_gradient_linear("linear_dx", dz, "dz", weight)
    lead = tuple(dz.shape[:-1])
    return common.call("linear_dx", common.rows(dz), weight).reshape(*lead, weight.shape[1])


def weight_grad(dz: torch.Tensor, x: torch.Tensor, accumulate: torch.Tensor | None = None,
                scale: float | None = None) -> torch.Tensor:
    """[scale ·] dzᵀ @ x (N, K) in dz's dtype, summed over every leading row of dz (..., N) and x (..., K):
    the weight gradient of x @ Wᵀ (fp32 accumulation, one rounding). scale: a Python number applied to
    the fp32 product in the epilogue (a loss scale, 1/accumulation steps); accumulate (N, K): a gradient
    to add (gradient accumulation), read in the epilogue."""
    op = "weight_grad"
    for name, t in (("dz", dz), ("x", x)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if dz.dtype not in common.DTYPES or x.dtype != dz.dtype:
        raise TypeError(f"{op}: dz and x must share one 16-bit dtype (bfloat16 or float16), got {dz.dtype} and "
                        f"{x.dtype}")
    if dz.dim() < 1 or x.dim() < 1 or dz.shape[:-1] != x.shape[:-1]:
        raise ValueError(f"{op}: dz (..., N) and x (..., K) must have the same leading dimensions (one row per "
                         f"token), got {tuple(dz.shape)} and {tuple(x.shape)}")
    N, K = dz.shape[-1], x.shape[-1]
    if accumulate is not None and (not isinstance(accumulate, torch.Tensor) or tuple(accumulate.shape) != (N, K)
                                   or accumulate.dtype != dz.dtype or accumulate.device != dz.device):
        raise ValueError(f"{op}: accumulate must be a ({N}, {K}) {dz.dtype} tensor on {dz.device}")
    dz2, x2 = common.rows(dz), common.rows(x)
    if not dz2.is_contiguous() or not x2.is_contiguous():
        raise ValueError(f"{op}: dz and x must be contiguous (each is read transposed, along its rows); "
                         "call .contiguous()")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        raise TypeError(f"{op}: scale must be a Python number, got {type(scale).__name__}")
    if x.device != dz.device:
        raise ValueError(f"{op}: dz is on {dz.device} and x on {x.device}; put them on one device")
    return common.call("weight_grad", dz2, x2, accumulate, None if scale is None else float(scale))


BUILDS = [(graph, (True,), "kk"), (graph, (False,), "kn"), (graph, (True,), "kn"), (graph, (False,), "mn"),
          (graph, (True,), "mn"), (graph, (False, True), "mn"), (graph, (True, True), "mn")]
