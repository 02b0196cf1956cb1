"""SwiGLU backward in the epilogue of the down projection's dX GEMM (CODA):

    acc = dy @ W_down                             (M, F): dL/d(silu(g)·u)
    (g, u) = z[:, 2i], z[:, 2i+1]                 the saved interleaved pre-activation, read as pairs
    dg  = acc · u · σ(g) · (1 + g (1 − σ(g)))     du = acc · silu(g)
    dz  = (dg, du) interleaved (M, 2F)            the gate/up GEMM's output gradient
    y   = silu(g) · u                             recomputed: dW_down = weight_grad(dy, y)
    zdz = Σ_i (g·dg + u·du)                       fp32 per row: the ZdZ of the gate/up GEMM, for the
                                                  RMSNorm backward in its dX GEMM (norm_backward)

z is read and dz written as 32-bit pairs (Graph.pair_tile / store_pairs), so the tile stays F wide.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import graphs
from . import common

NAME = "swiglu_backward_linear"


#: The op's epilogue graph (coda_ext.graphs).
graph = graphs.swiglu_backward_linear


def reference(dy: torch.Tensor, weight: torch.Tensor, z: torch.Tensor):
    """fp32 reference: (dz, y, zdz) (autograd of silu(g)·u)."""
    acc = dy.float() @ weight.float()
    gate, up = z.float()[..., 0::2], z.float()[..., 1::2]
    sig = torch.sigmoid(gate)
    dg = acc * up * sig * (1 + gate * (1 - sig))
    du = acc * F.silu(gate)
    dz = torch.stack([dg, du], dim=-1).flatten(-2)
    return dz, F.silu(gate) * up, (gate * dg + up * du).sum(-1)


@common.direct
@torch.library.custom_op("coda_ext::swiglu_backward_linear", mutates_args=())
def _op(dy: torch.Tensor, weight: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r = common.run_gemm(NAME, **_gemm(dy, weight, z))
    return r.dz, r.y, r.zdz


@torch.library.custom_op("coda_ext::swiglu_backward_linear_", mutates_args=("z",))
def _op_overwrite(dy: torch.Tensor, weight: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """_op with dz written over z (the epilogue reads each pair of z before it writes dz's pair there, in the same
    tile): (y, zdz); z holds dz after it."""
    op = common.check_gemm(NAME, **_gemm(dy, weight, z))
    r = op.launch(dy, weight.t(), {"z": z}, {"dz": z}, dy.shape[0], weight.shape[1], aliases={"dz": "z"})
    return r.y, r.zdz


@_op_overwrite.register_fake
def _fake_overwrite(dy, weight, z):
    common.check_gemm(NAME, **_gemm(dy, weight, z))
    return dy.new_empty(dy.shape[0], weight.shape[1]), dy.new_empty(dy.shape[0], dtype=torch.float32)


def _gemm(dy, weight, z):
    """The op's GEMM (weight read as stored: a transposed view), as common.run_gemm and check_gemm take it."""
    return dict(build=graph, args=(), A=dy, W=weight.t(), inputs={"z": z}, major="kn", operands=("dy", "weight.t()"))


@_op.register_fake
def _fake(dy, weight, z):
    common.check_gemm(NAME, **_gemm(dy, weight, z))
    M, F_ = dy.shape[0], weight.shape[1]
    return dy.new_empty(M, 2 * F_), dy.new_empty(M, F_), dy.new_empty(M, dtype=torch.float32)


def swiglu_backward_linear(dy: torch.Tensor, weight: torch.Tensor, z: torch.Tensor, overwrite_z: bool = False):
    """(dz, y, zdz) from dy (..., d), the gradient of the down projection's output, its weight (d, F) as
    stored, and z (..., 2F) the interleaved pre-activation linear_swiglu_train saved. dz (..., 2F) and
    y (..., F) in dy's dtype, zdz (...) fp32. F must be a multiple of 4 (z's rows 16-byte aligned).
    overwrite_z: dz is written over z (a contiguous z; dz is then z itself): no second M × 2F tensor, for a
    backward that needs z no more (the layer's memory peak is there)."""
    common.check_gradient_linear(NAME, dy, "dy", weight)
    lead, F_ = tuple(dy.shape[:-1]), weight.shape[1]
    common.check_rows(NAME, "z", z, lead, 2 * F_, dy.dtype, dy.device)
    if overwrite_z:
        if not z.is_contiguous():
            raise ValueError(f"{NAME}: overwrite_z needs a contiguous z, got strides {z.stride()}; pass "
                             "z.contiguous() or overwrite_z=False")
        y, zdz = torch.ops.coda_ext.swiglu_backward_linear_(common.rows(dy), weight, common.rows(z))
        return z, y.reshape(*lead, F_), zdz.reshape(lead)
    dz, y, zdz = common.call("swiglu_backward_linear", common.rows(dy), weight, common.rows(z))
    return dz.reshape(*lead, 2 * F_), y.reshape(*lead, F_), zdz.reshape(lead)


BUILDS = [(graph, (), "kn")]
