"""LM head + cross-entropy forward without logits: the M × V logits exist only as accumulator
tiles. Per (row, vocabulary tile) the epilogue keeps an online log-sum-exp (running max and
rescaled sum) and picks the target logit by its column index; only per-tile partials reach
memory (2 · 4 bytes per row and tile: about 0.8 % of the bf16 logits at V = 128256 with
256-column tiles), finished in a fixed order:

    logits = [rstd ⊙row] (x @ weightᵀ)       (fp32, never stored)
    lse    = logsumexp(logits, -1)
    loss   = lse − logits[m, target[m]]     (0 where target == ignore_index)

Backward (autograd): the logits are recomputed one vocabulary chunk at a time; the epilogue turns
them straight into dlogits = softmax · c − onehot(target) · g (c, g: per-row loss gradients, lse
from the forward), scaled by rstd and with the row statistic Σ acc·dlogits for rstd's gradient;
then dx += dlogits_chunk @ W_chunk and dW_chunk = dlogits_chunkᵀ @ x. Memory: one M × chunk
tensor (chunk_bytes), never the M × V logits.
"""
from __future__ import annotations

import warnings

import torch

from .. import graphs
from . import common, linear_grad, scale

NAME = "lm_head_cross_entropy"
REDUCTIONS = ("none", "sum", "mean")
#: Bytes of the one dlogits chunk the backward holds (M × chunk columns, 16-bit).
CHUNK_BYTES = 256 * 2**20


#: The op's epilogue graphs (coda_ext.graphs): graph(scaled) the forward, backward_graph(scaled) the
#: dlogits of one vocabulary chunk.
graph = graphs.lm_head_cross_entropy
backward_graph = graphs.lm_head_cross_entropy_backward


def reference(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, rstd: torch.Tensor | None = None,
              ignore_index: int = -100, reduction: str = "mean") -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 reference: (loss, lse), with torch's cross_entropy on fp32 logits."""
    logits = x.float() @ weight.float().t()
    if rstd is not None:
        logits = rstd.float()[..., None] * logits
    flat = logits.reshape(-1, logits.shape[-1])
    loss = torch.nn.functional.cross_entropy(flat, target.reshape(-1).long(), ignore_index=ignore_index,
                                             reduction=reduction)
    lse = torch.logsumexp(flat, -1).reshape(target.shape)
    return (loss.reshape(target.shape) if reduction == "none" else loss), lse


def finish(lse: torch.Tensor, target_logit: torch.Tensor, target: torch.Tensor, ignore_index: int,
           reduction: str) -> torch.Tensor:
    """Per-token losses from the two row statistics, masked and reduced as torch's cross_entropy."""
    valid = target != ignore_index
    loss = torch.where(valid, lse - target_logit, torch.zeros_like(lse))
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / valid.sum()  # mean over the tokens that count (NaN if none, as torch)


@torch.library.custom_op("coda_ext::lm_head_cross_entropy", mutates_args=())
def _op(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, rstd: torch.Tensor | None,
        ignore_index: int, reduction: str) -> tuple[torch.Tensor, torch.Tensor]:
    r = common.run_gemm(NAME, **_gemm(x, weight, target, rstd, reduction))
    return finish(r.lse, r.target_logit, target, ignore_index, reduction), r.lse


def _gemm(x, weight, target, rstd, reduction):
    """The op's GEMM, as common.run_gemm and check_gemm take it, once its other arguments are checked."""
    _check_head(weight, target, reduction)
    inputs = {"target": target.to(torch.int32)}
    if rstd is not None:
        inputs["rstd"] = rstd
    return dict(build=graph, args=(rstd is not None,), A=x, W=weight, inputs=inputs)


def _check_head(weight, target, reduction):
    """What the op asks beyond its GEMM's inputs: a reduction it knows, integer targets, a vocabulary whose
    column indices are exact in fp32."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"{NAME}: reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if target.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{NAME}: target has dtype {target.dtype}; use integer class indices (torch.int64)")
    if weight.shape[0] >= 2**24:
        raise ValueError(f"{NAME}: a vocabulary of {weight.shape[0]} is not supported (column indices are exact in "
                         "fp32 below 2**24)")


@_op.register_fake
def _fake(x, weight, target, rstd, ignore_index, reduction):
    common.check_gemm(NAME, **_gemm(x, weight, target, rstd, reduction))
    M = x.shape[0]
    loss = x.new_empty(M, dtype=torch.float32) if reduction == "none" else x.new_empty((), dtype=torch.float32)
    return loss, x.new_empty(M, dtype=torch.float32)


def _check_call(x, weight, target, rstd, reduction) -> tuple[tuple[int, ...], torch.Tensor | None]:
    """The public functions' checks of their arguments (x (..., d), target and rstd per row); returns the
    leading shape and rstd as one row of values."""
    common.check_linear(NAME, x, weight)
    lead = tuple(x.shape[:-1])
    common.check_rows(NAME, "target", target, lead, None, None, x.device)
    _check_head(weight, target, reduction)
    if rstd is not None:
        common.check_rows(NAME, "rstd", rstd, lead, None, torch.float32, x.device)
        rstd = rstd.reshape(-1)
    return lead, rstd


def lm_head_cross_entropy(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                          rstd: torch.Tensor | None = None, ignore_index: int = -100,
                          reduction: str = "mean") -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, lse): the cross-entropy of logits = [rstd ⊙row] x @ weightᵀ against target, and the
    per-token log-sum-exp (fp32, for the backward pass). x (..., d), weight (V, d), target (...) int32/int64
    with ignore_index for tokens that do not count; reduction 'none' (per token), 'sum' or 'mean'."""
    lead, rstd = _check_call(x, weight, target, rstd, reduction)
    loss, lse = torch.ops.coda_ext.lm_head_cross_entropy(common.rows(x), weight, target.reshape(-1), rstd,
                                                         int(ignore_index), reduction)
    return (loss.reshape(lead) if reduction == "none" else loss), lse.reshape(lead)


def row_gradients(dloss: torch.Tensor, dlse: torch.Tensor | None, target: torch.Tensor, ignore_index: int,
                  reduction: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(coef, g) fp32 per row: dlogits = softmax · coef − onehot(target) · g."""
    valid = (target != ignore_index).float()
    g = dloss.float() * valid if reduction in ("none", "sum") else dloss.float() / valid.sum() * valid
    coef = g if dlse is None else g + dlse.float()
    return coef, g


def chunk_columns(M: int, V: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Vocabulary columns per backward chunk: the M × chunk dlogits fit chunk_bytes (multiple of 256)."""
    cols = max(256, chunk_bytes // max(1, 2 * M) // 256 * 256)
    return min(cols, (V + 7) // 8 * 8)


def chunk_sizes(total: int, step: int) -> list[int]:
    """The distinct sizes of the chunks `total` splits into, `step` at a time (step <= total): step, and the
    partial last chunk's if any (each size its own launch shape)."""
    return sorted({step, total % step} - {0})


def gemms(M: int, V: int, d: int, scaled: bool, chunk_bytes: int | None = None, train: bool = False,
          train_chunk_bytes: int | None = None) -> list:
    """(graph, major, (M, N, K) as launched) of every GEMM a forward + backward of M tokens launches
    (for prebuild: coda_ext.runtime.auto_items). chunk_bytes: the backward's chunk budget (CHUNK_BYTES).
    train: lm_head_cross_entropy_loss's training path (bf16, 'mean'/'sum'; chunk budget train_chunk_bytes,
    default TRAIN_CHUNK_BYTES): its coda_ext GEMM per chunk of rows (the other two are cuBLAS's, the weight
    gradient's coda_ext's too under dw_backend("coda")); the exact
    path it falls back to on out-of-range logits builds on use."""
    if train:
        rows = train_chunk_rows(M, V, train_chunk_bytes)
        dw = dw_gemms(M, V, d, train_chunk_bytes)   # none under "cublas"
        return [(train_graph(scaled), "kk", (m, V, d)) for m in chunk_sizes(M, rows)] + dw
    c = chunk_columns(M, V, CHUNK_BYTES if chunk_bytes is None else chunk_bytes)
    out = [(graph(scaled), "kk", (M, V, d))]
    for cols in chunk_sizes(V, c):   # per chunk width: dlogits, dx, dx accumulated, dW
        accumulate = [(linear_grad.graph(True), "kn", (M, d, cols))] if V > c else []   # from the second chunk on
        out += [(backward_graph(scaled), "kk", (M, cols, d)), (linear_grad.graph(False), "kn", (M, d, cols)),
                *accumulate, (linear_grad.graph(False), "mn", (cols, d, M))]
    return out


@torch.library.custom_op("coda_ext::lm_head_cross_entropy_backward", mutates_args=())
def _op_backward(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, rstd: torch.Tensor | None,
                 lse: torch.Tensor, coef: torch.Tensor, g: torch.Tensor,
                 chunk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _recompute_gradients(x, weight, target, rstd, lse, coef, g, chunk)


def _recompute_gradients(x, weight, target, rstd, lse, coef, g, chunk):
    """(dx, dW, drstd) with the logits recomputed one vocabulary chunk at a time (the backward's four-GEMM path)."""
    dtype = common.dtype_name(x.dtype)
    M, V = x.shape[0], weight.shape[0]
    scaled = rstd is not None
    op_d = common.graph_op(backward_graph, dtype, "auto", scaled)
    op_dx = common.graph_op(linear_grad.graph, dtype, "auto", False, major="kn")
    op_dx_acc = common.graph_op(linear_grad.graph, dtype, "auto", True, major="kn")
    op_dw = common.graph_op(linear_grad.graph, dtype, "auto", False, major="mn")
    dW = torch.empty_like(weight)
    drstd = torch.zeros(M, dtype=torch.float32, device=x.device)
    target32 = target.to(torch.int32)
    inputs = {"lse": lse, "coef": coef, "g_target": g}
    if scaled:
        inputs["rstd"] = rstd
    dx = None
    for v0 in range(0, V, chunk):
        w = weight[v0:v0 + chunk]
        r = op_d.run(x, w, {**inputs, "target": target32 - v0}, {})
        if scaled:
            drstd += r.drstd
        dx = op_dx.run(r.dacc, w.t(), {}, {}).out if dx is None else \
            op_dx_acc.run(r.dacc, w.t(), {"residual": dx}, {}).out
        op_dw.run(r.dacc.t(), x.t(), {}, {"out": dW[v0:v0 + chunk]})
    return dx, dW, drstd


@_op_backward.register_fake
def _fake_backward(x, weight, target, rstd, lse, coef, g, chunk):
    return torch.empty_like(x), torch.empty_like(weight), x.new_empty(x.shape[0], dtype=torch.float32)


def _setup_context(ctx, inputs, output):
    x, weight, target, rstd, ignore_index, reduction = inputs
    ctx.save_for_backward(x, weight, target, rstd, output[1])
    ctx.ignore_index, ctx.reduction = ignore_index, reduction


def _backward(ctx, dloss, dlse):
    x, weight, target, rstd, lse = ctx.saved_tensors
    V = weight.shape[0]
    if V % 8:
        raise ValueError(f"{NAME}: the backward pass needs a vocabulary that is a multiple of 8 (got {V}); pad the "
                         "LM head's rows")
    coef, g = row_gradients(dloss, dlse, target, ctx.ignore_index, ctx.reduction)
    dx, dW, drstd = torch.ops.coda_ext.lm_head_cross_entropy_backward(
        x, weight, target, rstd, lse, coef, g, chunk_columns(x.shape[0], V))
    return dx, dW, None, (drstd if rstd is not None else None), None, None


_op.register_autograd(_backward, setup_context=_setup_context)


# ---- Training: the gradients in the forward pass, three GEMMs in all -------------------------------------------
#
# lm_head_cross_entropy + its backward launch four GEMMs: the backward recomputes the logits. In training the
# gradients can come with the loss instead, rows chunk by chunk (a chunk's rows see the whole vocabulary, so
# their lse is final when the chunk's GEMM ends):
#
#     GEMM 1 (coda_ext, train_graph)  e = exp(logits) (16-bit, C × V), Σ_n e (lse = its log); the target logits
#                                     as M dot products beside it
#     M-element fix-up                e[m, target[m]] = (p_target − 1) · exp(lse)      (p = softmax)
#                                     so that dlogits = g · exp(−lse) ⊙row e, with no pass over e
#     GEMM 2 (cuBLAS, fp32 out)       dx = a ⊙row (e @ W),            a = g · exp(−lse) [· rstd]
#     GEMM 3 (coda_ext)               dW += eᵀ @ (a ⊙row x)           (kept across chunks rounded to 24 bits in a
#                                     bfloat16 and a uint8 tensor, the last chunk writing dW in the weight's
#                                     dtype: graphs.weight_grad_split; an fp32 accumulator under dw_backend
#                                     "coda_f32" or "cublas")
#                                     drstd = g · exp(−lse) · Σ_k x ⊙ (e @ W)
#
# g is each row's loss gradient for dloss = 1 (1/n_valid for 'mean'); the backward scales the gradients by dloss
# in place (ops.scale: on a GPU without reading dloss on the host, and writing nothing when it is 1), or as fresh
# tensors when the graph is kept for another backward (retain_graph). exp(logits)
# is not normalized, so it needs |lse| ≤ LSE_RANGE (logits of a trained LM are far inside). The range check is
# queued before the last chunk's two GEMMs and read once they are queued too: the host waits while the GPU still
# has those GEMMs to run (a read at the end of the forward, or at the start of the backward, left the GPU idle
# while the host launched what followed: 2.3 ms a step on an H200). A row outside: a RuntimeWarning, and the
# exact path's loss and gradients (the loss is exact up to |lse| ≈ 76, where fp32 Σ exp overflows to inf). A call
# under CUDA-graph capture (no read possible) runs the exact four-GEMM path. Traced by torch.compile the op runs
# the same (its check inside it); the traced backward scales by dloss as fresh tensors (a pass over them).

train_graph = graphs.lm_head_cross_entropy_train
#: Bytes of the one exp(logits) chunk the training forward holds (chunk rows × V, 16-bit): 4096 rows at
#: V = 128256. Each chunk after the first reads and writes the dW accumulator (6·V·d bytes; 8 in fp32) beside its
#: three GEMMs (6·C·V·d FLOPs), so that pass costs about 1.3·(FLOP/s ÷ bytes/s) ÷ C of the GEMMs' time
#: whatever V and d: 2048 rows made the head 1.18x its three bare GEMMs at 16384 tokens (Llama-3.2-1B-like
#: on an H200), 4096 rows 1.056x (+0.56 GB), 8192 rows 1.070x (benchmarks/results/lm_head_h200.json).
TRAIN_CHUNK_BYTES = 1024 * 2**20
#: The training forward's exp(logits) path needs every counted row's |lse| ≤ this (bf16: e ≤ exp(lse) and
#: the row scale exp(−lse) · g stay normal floats, and e @ W stays finite in fp32).
LSE_RANGE = 60.0


def train_chunk_rows(M: int, V: int, chunk_bytes: int | None = None) -> int:
    """Rows per chunk of the training forward: the chunk × V exp(logits) fit chunk_bytes (multiple of 128)."""
    budget = TRAIN_CHUNK_BYTES if chunk_bytes is None else chunk_bytes
    return min(M, max(128, budget // max(1, 2 * V) // 128 * 128))


def check_chunk_bytes(op: str, chunk_bytes, name: str = "chunk_bytes") -> None:
    """A chunk budget: None (the default, TRAIN_CHUNK_BYTES) or a positive int; `name`: the caller's argument."""
    if chunk_bytes is not None and (isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int)
                                    or chunk_bytes <= 0):
        raise ValueError(f"{op}: {name} must be a positive int (bytes of one exp(logits) chunk) or None for "
                         f"the default ({TRAIN_CHUNK_BYTES >> 20} MiB), got {chunk_bytes!r}")


def train_eligible(x: torch.Tensor, weight: torch.Tensor, reduction: str) -> bool:
    """Whether lm_head_cross_entropy_loss takes the three-GEMM training path: bf16 (exp(logits) needs its
    range), a reduced loss (the per-row gradient is known before the backward), V a multiple of 8."""
    return x.dtype == torch.bfloat16 and reduction in ("sum", "mean") and weight.shape[0] % 8 == 0


def _mm_f32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b in fp32 from 16-bit operands (cuBLAS with an fp32 output on a GPU)."""
    if a.is_cuda:
        return torch.mm(a, b, out_dtype=torch.float32)
    return a.float() @ b.float()


def _addmm_f32_(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """acc += a @ b, acc fp32, a and b 16-bit (cuBLAS accumulating in place on a GPU)."""
    if acc.is_cuda:
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
    else:
        acc += a.float() @ b.float()


#: Who runs the training path's weight-gradient GEMMs (dW += eᵀ @ y per chunk):
#: "coda" (the default: graphs.weight_grad_split, the sum kept in 3 bytes an element between chunks, a bfloat16
#: and a uint8 tensor read and written in the epilogue over themselves, the last chunk writing the gradient in
#: the weight's dtype over the bfloat16 part: V · d bytes less at the op's peak than an fp32 accumulator, and
#: no conversion pass), "coda_f32" (graphs.weight_grad_f32: the same kernel with an fp32 accumulator, converted
#: at the end) or "cublas" (torch.mm / torch.addmm with an fp32 output: its epilogue's pass over the accumulator
#: adds to the GEMM). With fp32 accumulators the Llama-3 heads at 16384 tokens, 4096-row chunks, H200: "coda_f32"
#: 1.024x the three bare GEMMs against "cublas" 1.071x (d 2048), 1.030x against 1.053x (d 4096)
#: (benchmarks/results/lm_head_dw_h200.json). dw_backend() sets it for a block.
DW_BACKENDS = ("cublas", "coda_f32", "coda")
_dw = {"backend": "coda"}


def dw_backend(name: str):
    """Within the block (a context manager), the training path's weight-gradient GEMMs run on `name`
    (DW_BACKENDS)."""
    return common.switched(_dw, name, DW_BACKENDS, "dw_backend")


def _dw_gemm(a: torch.Tensor, b: torch.Tensor, acc: torch.Tensor | None, backend: str) -> torch.Tensor:
    """a @ b [+ acc] in fp32 (a = eᵀ rows (R, C) read along R, b = y (C, d)), written over acc when given: the
    training path's weight-gradient GEMM of one chunk on `backend` ("cublas" or "coda_f32")."""
    if backend == "cublas":
        if acc is None:
            return _mm_f32(a, b)
        _addmm_f32_(acc, a, b)
        return acc
    inputs = {} if acc is None else {"acc": acc}
    op = common.check_gemm(NAME, graphs.weight_grad_f32, (acc is not None,), a, b.t(), inputs, "mn",
                           ("e.t()", "y.t()"))
    return op.launch(a, b.t(), inputs, {} if acc is None else {"out": acc}, a.shape[0], b.shape[1],
                     aliases={"out": "acc"}).out


def _dw_split(a: torch.Tensor, b: torch.Tensor, acc: tuple[torch.Tensor, torch.Tensor] | None, final: bool):
    """The weight-gradient GEMM of one chunk on backend "coda" (a = eᵀ (V, C), b = y (C, d)): a @ b [+ the sum so
    far, acc = (hi, lo)], as the next (hi, lo) written over acc, or where `final` as the gradient in b's dtype
    written over hi (graphs.weight_grad_split)."""
    inputs = {} if acc is None else {"hi_in": acc[0], "lo_in": acc[1]}
    op = common.check_gemm(NAME, graphs.weight_grad_split, (acc is not None, final), a, b.t(), inputs, "mn",
                           ("e.t()", "y.t()"))
    out, aliases = {}, {}
    if acc is not None and final:
        out, aliases = {"dw": acc[0].view(b.dtype)}, {"dw": "hi_in"}
    elif acc is not None:
        out, aliases = {"hi": acc[0], "lo": acc[1]}, {"hi": "hi_in", "lo": "lo_in"}
    r = op.launch(a, b.t(), inputs, out, a.shape[0], b.shape[1], aliases=aliases)
    return r.dw if final else (r.hi, r.lo)


def dw_kernel_fits(V: int, d: int, dtype: torch.dtype = torch.bfloat16, backend: str | None = None) -> bool:
    """Whether the weight gradient's kernel on `backend` (default: the current dw_backend) takes this head (16-bit
    values). Both read exp(logits)ᵀ along the vocabulary (its M) and y along d (its N): V and d multiples of 8.
    "coda" also writes rows of d bytes (the uint8 part): d a multiple of 16. "coda_f32" reads each accumulator
    half's rows, so each half must start and end on 16 bytes: V/2 a multiple of 8 too."""
    backend = _dw["backend"] if backend is None else backend
    if backend == "cublas" or dtype.itemsize != 2:
        return False
    per16 = 16 // dtype.itemsize
    if backend == "coda":
        return V % per16 == 0 and d % 16 == 0
    return d % per16 == 0 and all(r.start % per16 == 0 and (r.stop - r.start) % per16 == 0
                                  for r in accumulator_halves(V, dtype))


def dw_runs_on(V: int, d: int, dtype: torch.dtype = torch.bfloat16) -> str:
    """The backend this head's weight gradient runs on under the current dw_backend: that one where its kernel
    takes the head, else the fp32 accumulator's kernel ("coda" → "coda_f32") where that one does, else cuBLAS."""
    backend = _dw["backend"]
    for b in (backend, "coda_f32") if backend == "coda" else (backend,):
        if dw_kernel_fits(V, d, dtype, b):
            return b
    return "cublas"


def split_flags(m0: int, rows: int, M: int) -> tuple[bool, bool]:
    """(accumulate, final) of graphs.weight_grad_split for the chunk of `rows` rows starting at row m0 of M: every
    chunk but the first adds to the sum so far, the last writes the gradient (train_gradients launches them so,
    dw_gemms lists them so)."""
    return m0 > 0, m0 + rows >= M


def dw_gemms(M: int, V: int, d: int, chunk_bytes: int | None = None) -> list:
    """(graph, major, (M, N, K)) of the training path's weight-gradient kernels at M tokens (bf16), as
    train_gradients launches them: none where dw_runs_on says cuBLAS."""
    backend = dw_runs_on(V, d)
    if backend == "cublas":
        return []
    rows = train_chunk_rows(M, V, chunk_bytes)
    if backend == "coda":   # each chunk's (accumulate, final) and height, first to last, without repeats
        chunks = [(*split_flags(m0, rows, M), min(rows, M - m0)) for m0 in range(0, M, rows)]
        return [(graphs.weight_grad_split(a, f), "mn", (V, d, c)) for a, f, c in dict.fromkeys(chunks)]
    heights = sorted({r.stop - r.start for r in accumulator_halves(V, torch.bfloat16)})
    return [(graphs.weight_grad_f32(accumulate), "mn", (h, d, c)) for c in chunk_sizes(M, rows)
            for h in heights for accumulate in ((False, True) if M > rows else (False,))]


def _train_gemm(x, weight, target, rstd, reduction):
    """The training forward's GEMM as common.check_gemm takes it (the whole rows; chunks are slices of them)."""
    _check_head(weight, target, reduction)
    inputs = {} if rstd is None else {"rstd": rstd}
    return dict(build=train_graph, args=(rstd is not None,), A=x, W=weight, inputs=inputs)


def _row_dots(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Σ_k x · w per row, fp32, of two (C, d) 16-bit tensors."""
    return (x.float() * w.float()).sum(-1)


def _chunk_gradients(ew: torch.Tensor, x: torch.Tensor, a: torch.Tensor, gs: torch.Tensor):
    """A chunk's rows after the e @ W GEMM (ew, fp32): dx = a ⊙row ew and y = a ⊙row x in x's dtype, and the
    rstd gradient gs · Σ_k x ⊙ ew (fp32)."""
    xf = x.float()
    return (a[:, None] * ew).to(x.dtype), (a[:, None] * xf).to(x.dtype), gs * (xf * ew).sum(-1)


#: On a GPU the two as kernels torch.compile generates (one pass each, where the eager math made about a dozen
#: over the chunk's C × d rows with fp32 temporaries)
_row_dots_fused, _chunk_gradients_fused = common.compiled_rows(_row_dots), common.compiled_rows(_chunk_gradients)


def _logits_chunk(x, weight, target, rstd):
    """(e, lse, target_logit) of one chunk of rows: the train_graph GEMM, and the target logits as dot products
    of the rows with their target's weight row (fp32; any value where the target is ignored)."""
    inputs = {} if rstd is None else {"rstd": rstd}
    r = common.graph_op(train_graph, common.dtype_name(x.dtype), "auto", rstd is not None).run(x, weight, inputs, {})
    picked = weight[target.clamp(0, weight.shape[0] - 1)]
    tl = (_row_dots_fused if x.is_cuda else _row_dots)(x, picked)
    return r.e, torch.log(r.sumexp), tl if rstd is None else tl * rstd


def train_gradients(x, weight, target, rstd, ignore_index: int, reduction: str, chunk: int, logits_chunk=None):
    """(loss, lse, dx, dW, drstd, in_range) for dloss = 1, rows `chunk` at a time (the algorithm above); dW
    accumulates across chunks as dw_backend says (24 bits in 3 bytes an element, or fp32) and is returned in the
    weight's dtype; in_range (a bool read on the host
    after every kernel is queued): whether every counted row's |lse| ≤ LSE_RANGE, which the result needs.
    logits_chunk(x_c, weight, target_c, rstd_c) -> (e, lse, target_logit): the GEMM (default the kernel;
    the CPU tests pass a reference, which also keeps the weight gradient's GEMMs in torch)."""
    step = logits_chunk or _logits_chunk
    # a reference step (logits_chunk given): torch's GEMMs throughout
    dw = "cublas" if logits_chunk is not None else dw_runs_on(*weight.shape, weight.dtype)
    M = x.shape[0]
    check = None
    _, g = row_gradients(torch.ones((), device=x.device), None, target, ignore_index, reduction)
    valid = target != ignore_index
    lse, tl = (torch.empty(M, dtype=torch.float32, device=x.device) for _ in range(2))
    dx, drstd = torch.empty_like(x), torch.zeros(M, dtype=torch.float32, device=x.device)
    dW = None
    halves = accumulator_halves(weight.shape[0], weight.dtype)
    for m0 in range(0, M, chunk):
        rows = slice(m0, m0 + chunk)
        xc, tc, vc = x[rows], target[rows], valid[rows]
        rc = rstd[rows] if rstd is not None else None
        e, lse[rows], tl[rows] = step(xc, weight, tc, rc)
        if m0 + chunk >= M:   # every row's lse is known: the check is queued ahead of this chunk's two GEMMs
            check = _RangeCheck(lse, target, ignore_index)
        lc, tlc = lse[rows], tl[rows]
        # dlogits = g · (p − onehot) = g · exp(−lse) · e once e's target entry is (p_t − 1) · exp(lse)
        idx = torch.arange(xc.shape[0], device=x.device)
        col = torch.where(vc, tc, torch.zeros_like(tc)).long()
        fixed = torch.expm1(tlc - lc) * torch.exp(lc)
        e[idx, col] = torch.where(vc, fixed, e[idx, col].float()).to(e.dtype)
        gs = g[rows] * torch.exp(-lc)
        a = gs if rc is None else gs * rc
        ew = _mm_f32(e, weight)
        dx[rows], y, dr = (_chunk_gradients_fused if x.is_cuda else _chunk_gradients)(ew, xc, a, gs)
        if rc is not None:
            drstd[rows] = dr
        et = e.t()
        if dw == "coda":   # the sum in 3 bytes an element; the last chunk writes the gradient itself
            accumulate, final = split_flags(m0, chunk, M)
            dW = _dw_split(et, y, dW if accumulate else None, final)
        else:
            dW = [_dw_gemm(et[r], y, None if dW is None else dW[i], dw) for i, r in enumerate(halves)]
        del e, et, ew, y   # the last chunk's buffers go before dW is converted (the op's peak)
    if dw != "coda":
        dW = weight_gradient(*dW, weight.dtype) if len(dW) == 2 else dW[0].to(weight.dtype)
    return finish(lse, tl, target, ignore_index, reduction), lse, dx, dW, drstd, check.passed()


#: Rows of the fp32 accumulator converted per step where the 16-bit weight gradient takes its place.
CONVERT_BLOCK_ROWS = 8192


def accumulator_halves(V: int, dtype: torch.dtype) -> tuple[slice, ...]:
    """The row ranges of the fp32 weight-gradient accumulators: two halves where a 16-bit gradient of even V
    can take the first half's memory (weight_gradient), else one."""
    if dtype.itemsize == 2 and V % 2 == 0 and V >= 2:
        return slice(0, V // 2), slice(V // 2, V)
    return (slice(0, V),)


def weight_gradient(top: torch.Tensor, bottom: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The (V, d) 16-bit weight gradient from its fp32 accumulator halves (V/2 rows each), written into the
    first half's memory (V/2 · d · 4 bytes: exactly the 16-bit V × d), so the step never holds the fp32
    accumulator and the 16-bit gradient at once (V · d · 2 bytes less at the op's peak: 1.05 GB for the
    Llama-3-8B head). Row blocks go front to back: a block's 16-bit rows lie in fp32 rows already read (the
    first through a temporary), then the second half's rows into the rest."""
    h, d = top.shape
    out = top.view(dtype).view(2 * h, d)
    first = min(CONVERT_BLOCK_ROWS, h)
    out[:first].copy_(top[:first].to(dtype))
    for r0 in range(first, h, first):   # rows r0.. of out occupy fp32 rows < r0: read already
        r1 = min(r0 + first, h)
        out[r0:r1].copy_(top[r0:r1])
    out[h:].copy_(bottom)
    return out


class _RangeCheck:
    """Every counted row's |lse| ≤ LSE_RANGE (NaN counts as out), computed on lse's device when made and read by
    passed(): on a GPU through pinned memory and an event, so the host waits only for the work queued before it."""

    def __init__(self, lse: torch.Tensor, target: torch.Tensor, ignore_index: int):
        flag = ((lse.abs() <= LSE_RANGE) | (target == ignore_index)).all()
        self.event = None
        if flag.is_cuda:
            self.flag = torch.empty((), dtype=torch.bool, pin_memory=True)
            self.flag.copy_(flag, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record(torch.cuda.current_stream(flag.device))   # the copy's stream, on lse's device
        else:
            self.flag = flag

    def passed(self) -> bool:
        if self.event is not None:
            self.event.synchronize()
        return bool(self.flag)


def _exact_train(x, weight, target, rstd, ignore_index: int, reduction: str):
    """(loss, dx, dW, drstd) for dloss = 1 on the exact path: statistics, then the logits recomputed per
    vocabulary chunk (four GEMMs; any logit range)."""
    r = common.run_gemm(NAME, **_gemm(x, weight, target, rstd, reduction))
    loss = finish(r.lse, r.target_logit, target, ignore_index, reduction)
    coef, g = row_gradients(torch.ones((), device=x.device), None, target, ignore_index, reduction)
    dx, dW, drstd = _recompute_gradients(x, weight, target, rstd, r.lse, coef, g, chunk_columns(x.shape[0],
                                                                                                 weight.shape[0]))
    return loss, dx, dW, drstd


@torch.library.custom_op("coda_ext::lm_head_cross_entropy_train", mutates_args=())
def _op_train(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, rstd: torch.Tensor | None,
              ignore_index: int, reduction: str,
              chunk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    common.check_gemm(NAME, **_train_gemm(x, weight, target, rstd, reduction))
    return _train(x, weight, target, rstd, ignore_index, reduction, chunk)


def _train(x, weight, target, rstd, ignore_index: int, reduction: str, chunk: int, logits_chunk=None):
    """The op's outputs (loss, dx, dW, drstd) for dloss = 1: the three-GEMM path when its range check passes
    (else a RuntimeWarning and the exact path), the exact path in CUDA-graph capture; logits_chunk as
    train_gradients takes it."""
    if common.readable(x):
        loss, _, dx, dW, drstd, in_range = train_gradients(x, weight, target, rstd, ignore_index, reduction, chunk,
                                                           logits_chunk)
        if in_range:
            return loss, dx, dW, drstd
        del dx, dW, drstd
        warnings.warn(f"{NAME}: a row's log-sum-exp left ±{LSE_RANGE:g}: the loss and gradients of this call come "
                      "from the exact path (the logits recomputed in the backward's way; the loss is exact only if "
                      "no row passed about ±76, else inf)", RuntimeWarning, stacklevel=3)
    return _exact_train(x, weight, target, rstd, ignore_index, reduction)


@_op_train.register_fake
def _fake_train(x, weight, target, rstd, ignore_index, reduction, chunk):
    common.check_gemm(NAME, **_train_gemm(x, weight, target, rstd, reduction))
    return (x.new_empty((), dtype=torch.float32), torch.empty_like(x), torch.empty_like(weight),
            x.new_empty(x.shape[0], dtype=torch.float32))


def _setup_train(ctx, inputs, output):
    _, _, _, rstd, *_ = inputs
    _, dx, dW, drstd = output
    # dx, dW, drstd are the op's answer, not values the loss depends on: their gradients are None, not V x d
    # (and M x d) zero tensors autograd would allocate and fill at the start of every backward
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(dx, dW, drstd)
    ctx.scaled = rstd is not None


def _backward_train(ctx, dloss, *_):
    dx, dW, drstd = ctx.saved_tensors
    grads = (dx, dW, drstd) if ctx.scaled else (dx, dW)
    s = dloss.float()   # 0-dim: bf16 * s stays bf16, computed in fp32
    if common.traced(s) or common.graph_kept():
        # traced (torch.compile), or a graph kept for another backward (retain_graph): fresh tensors, the saved
        # gradients unchanged (the gradients this backward returns may be held while the next one runs)
        grads = tuple(g * s for g in grads)
    else:
        # in place, without a host read of dloss, nothing written when it is 1 (loss.backward()): no pass over the
        # V x d weight gradient, no second copy of it while the step's activations are alive
        scale.scale_by_(grads, s.contiguous())
    dx, dW, *rest = grads
    return dx, dW, None, rest[0] if ctx.scaled else None, None, None, None


_op_train.register_autograd(_backward_train, setup_context=_setup_train)


def lm_head_cross_entropy_loss(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                               rstd: torch.Tensor | None = None, ignore_index: int = -100,
                               reduction: str = "mean", chunk_bytes: int | None = None) -> torch.Tensor:
    """The loss of lm_head_cross_entropy (same arguments), for training: when a gradient is needed and the
    call is eligible (bf16, 'mean' or 'sum', V a multiple of 8), the gradients of x, weight and rstd are
    computed with the loss, rows chunk by chunk, in three GEMMs (the backward only scales them by dloss);
    otherwise lm_head_cross_entropy's loss, whose backward recomputes the logits.
    chunk_bytes: the training path's exp(logits) chunk (rows × V × 2 bytes; default TRAIN_CHUNK_BYTES, 1 GiB):
    less memory for more time (at V 128256 and 16384 tokens 512 MiB holds 0.56 GB less and took 1.18x the
    head's three bare GEMMs against 1.06x on an H200)."""
    check_chunk_bytes("lm_head_cross_entropy_loss", chunk_bytes)
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, weight, rstd))
    if not (needs_grad and train_eligible(x, weight, reduction)):
        return lm_head_cross_entropy(x, weight, target, rstd, ignore_index, reduction)[0]
    _, rstd = _check_call(x, weight, target, rstd, reduction)
    xr = common.rows(x)
    chunk = train_chunk_rows(xr.shape[0], weight.shape[0], chunk_bytes)
    loss, *_ = torch.ops.coda_ext.lm_head_cross_entropy_train(xr, weight, target.reshape(-1), rstd, int(ignore_index),
                                                              reduction, chunk)
    return loss


BUILDS = [(graph, (s,), "kk") for s in (False, True)] + [(backward_graph, (s,), "kk") for s in (False, True)] + \
    [(train_graph, (s,), "kk") for s in (False, True)]
