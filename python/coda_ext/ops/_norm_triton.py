"""The Triton source of norm_kernel (imported on first use: triton comes with CUDA builds of torch)."""
import triton
import triton.language as tl


@triton.jit
def rms_norm_input_kernel(x, s_x, w, h, s_h, rstd, M, N, eps: tl.constexpr, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr):
    # eps a constant (one per model): as a runtime float Inductor passes it in fp64, and the fp32 math refuses it
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < M
    acc = tl.zeros([BLOCK_M], dtype=tl.float32)
    for n0 in range(0, N, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        cmask = cols < N
        mask = rmask[:, None] & cmask[None, :]
        v = tl.load(x + rows[:, None] * s_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        g = tl.load(w + cols, mask=cmask, other=0.0).to(h.dtype.element_ty).to(tl.float32)   # weight.to(x.dtype)
        acc += tl.sum(v * v, axis=1)
        tl.store(h + rows[:, None] * s_h + cols[None, :], (v * g[None, :]).to(h.dtype.element_ty), mask=mask)
    tl.store(rstd + rows, 1.0 / tl.sqrt_rn(acc / N + eps), mask=rmask)
