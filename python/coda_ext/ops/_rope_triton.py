"""The Triton source of rope_kernel (imported on first use: triton comes with CUDA builds of torch)."""
import triton
import triton.language as tl


@triton.jit
def _part(src, s_src, col0, pairs_total, rows, rmask, qkv, s_qkv, dz, s_dz, cos, sin, acc,
          ROTATE: tl.constexpr, HALF: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_P: tl.constexpr):
    for p0 in range(0, pairs_total, BLOCK_P):
        pairs = p0 + tl.arange(0, BLOCK_P)
        cols = 2 * p0 + tl.arange(0, 2 * BLOCK_P)
        mask = rmask[:, None] & (cols < 2 * pairs_total)[None, :]
        d = tl.load(src + rows[:, None] * s_src + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        z = tl.load(qkv + rows[:, None] * s_qkv + (col0 + cols)[None, :], mask=mask, other=0.0)
        acc += tl.sum(d * z.to(tl.float32), axis=1)
        if ROTATE:
            pmask = rmask[:, None] & (pairs < pairs_total)[None, :]
            j = pairs % HALF
            c = tl.load(cos + rows[:, None] * HALF + j[None, :], mask=pmask, other=0.0)
            s = tl.load(sin + rows[:, None] * HALF + j[None, :], mask=pmask, other=0.0)
            a, b = tl.split(tl.reshape(d, [BLOCK_M, BLOCK_P, 2]))
            out = tl.reshape(tl.join(a * c + b * s, b * c - a * s), [BLOCK_M, 2 * BLOCK_P])
        else:
            out = d
        tl.store(dz + rows[:, None] * s_dz + (col0 + cols)[None, :], out.to(dz.dtype.element_ty), mask=mask)
    return acc

@triton.jit
def rope_backward_kernel(dq, s_dq, dk, s_dk, dv, s_dv, qkv, s_qkv, cos, sin, dz, s_dz, zdz, M, WQ, WK, WV,
                         HALF: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_P: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < M
    acc = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = _part(dq, s_dq, 0, WQ // 2, rows, rmask, qkv, s_qkv, dz, s_dz, cos, sin, acc,
                True, HALF, BLOCK_M, BLOCK_P)
    acc = _part(dk, s_dk, WQ, WK // 2, rows, rmask, qkv, s_qkv, dz, s_dz, cos, sin, acc,
                True, HALF, BLOCK_M, BLOCK_P)
    acc = _part(dv, s_dv, WQ + WK, WV // 2, rows, rmask, qkv, s_qkv, dz, s_dz, cos, sin, acc,
                False, HALF, BLOCK_M, BLOCK_P)
    tl.store(zdz + rows, acc, mask=rmask)
