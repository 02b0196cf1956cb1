"""Config selection: a few candidate kernel configs per graph, a shape heuristic, measured
tuning on request, and the choice remembered on disk per (graph, dtype, N, K, M bucket, GPU).

    op = coda_ext.compile(g, torch.bfloat16, config="auto")   # remembered choice, else the heuristic
    op = coda_ext.compile(g, torch.bfloat16, config="tune")   # measure unknown shapes on first call

The per-shape dispatch that uses these choices is runtime/tuned.py (TunedOp).

Every candidate computes the same graph; only tile shapes (and so the order of fp32 additions in
reductions) differ, so a choice never changes results beyond rounding.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

from .config import DEFAULT_CONFIG, KernelConfig, applied_raster, applied_swizzle
from .jit.cache import locked
from .jit.paths import cache_root

#: What the heuristic chooses from (benchmarks/results/sweep_*_h100.json: tile x cluster x schedule x
#: swizzle x raster of the plain GEMM and of pointwise, tile-load and reduction graphs at the
#: Llama shapes). Ping-pong overlaps one warp group's epilogue with the other's MMAs.
LARGE = KernelConfig((128, 256, 64), (2, 1), "cooperative", swizzle=4)    # many tiles otherwise (see heuristic)
LARGE_TALL = dataclasses.replace(LARGE, swizzle=8)                         # LARGE with 32 or more M tiles
PINGPONG = DEFAULT_CONFIG                                    # many tiles, N <= 16384, K <= 4096, an epilogue
#: PINGPONG for an epilogue that reads a pair tile (2N columns: dSwiGLU), with 32 or more M tiles: swizzle 8
#: rastered along N keeps more of the operands in L2 beside the epilogue's stream (swizzle and raster are launch
#: arguments; benchmarks/results/sweep_raster_dswiglu_h100.json), and its pair tile and pair store go through
#: shared memory as staggered 4-byte halves, free of bank conflicts (pair_smem; bit-identical results): the
#: Llama dSwiGLU 1.239 -> 1.206x cuBLAS held at 1B, 1.090 -> 1.076x at 8B, 1.255 -> 1.231x and 1.108 -> 1.107x
#: alone (H200, one run, benchmarks/results/sweep_backward_staggered_h200.json and _sustained_)
PINGPONG_PAIR_LOADS = dataclasses.replace(PINGPONG, swizzle=8, raster="along_n", pair_smem="staggered")
#: PINGPONG over a wide N and a deep K (N >= 4096, K >= 4096, 32 or more M tiles, K-major), where an epilogue keeps
#: it from 128x192 tiles (QK-norm's 128-wide heads, a tile load) or 192 does not divide N: swizzle 8 (a launch
#: argument). QKV + QK-norm + RoPE at Llama-8B's 16384x6144x4096: 1.068x cuBLAS against 1.093x with swizzle 4,
#: 1.081 against 1.093 in 2x1 clusters (benchmarks/results/sweep_qknorm8b_h200.json); linear + residual + norm
#: statistic at 16384x4096x4096 1.061x against 1.081x (H200, one run each, sweep_residual_norm_s8_h200.json)
PINGPONG_S8 = dataclasses.replace(PINGPONG, swizzle=8)
#: PINGPONG_S8 rastered along M, where N is 4096 to 6143 (a 32-to-47-tile N: two waves cover an 8-tile band of W's
#: columns while A's rows stream), K-major or with W read N-major (the dX GEMMs), over K >= 4096 and 32 or more M
#: tiles. At Llama-8B's widths (H200, one run each, against the same kernel at swizzle 4 and the heuristic's
#: raster): linear + residual + norm statistic at 16384x4096x4096 1.044x cuBLAS against 1.072x (swizzle 8, default
#: raster: 1.087x; benchmarks/results/sweep_residual_norm_raster_h200.json; 1.047x against 1.061x in the tenth
#: session's run), the RMSNorm backward at 16384x4096x6144 1.072x against 1.095x, with dx_in (x28672) 0.975x against
#: 0.980x, the plain dX GEMM at 16384x4096x4096 1.005x against 1.027x (sweep_backward_kn_launch_h200.json; swizzle 8
#: along N: 1.079x, 0.982x, 1.009x). At N = 2048 (Llama-1B) swizzle 4 stays as good or better (1.075x against 1.079x
#: for the residual + norm, 0.994x against 1.003x for the dX GEMM).
PINGPONG_S8_ALONG_M = dataclasses.replace(PINGPONG, swizzle=8, raster="along_m")
# compute-only, N > 16384, M >= 4096
WIDE = KernelConfig((64, 256, 64), (1, 1), "pingpong", swizzle=8, raster="along_n")
MEDIUM = KernelConfig((128, 256, 64), (1, 1), "cooperative", swizzle=4)   # under two waves of 128x256
WAVE_FILL = KernelConfig((128, 128, 64), (1, 1), "pingpong")              # 128x128 fills the waves better
SKINNY = KernelConfig((64, 128, 64), (1, 1), "pingpong")                  # M <= 128: more CTAs stream W
#: Ping-pong 128x192 (the wgmma N of 192 keeps both warp groups' accumulators in registers): M >= 4096,
#: K <= 4096, N >= 6144 (benchmarks/results/sweep_192_h100.json). Swizzle 4 at N > 16384, else 8; pair
#: graphs (SwiGLU) at N <= 16384 in clusters of two.
TALL_192 = KernelConfig((128, 192, 64), (1, 1), "pingpong", swizzle=4)
TALL_192_S8 = dataclasses.replace(TALL_192, swizzle=8)
#: TALL_192 where A does not fit in half of L2 (A_IN_L2_BYTES): swizzle 8 rastered along N, bands of 8 M tiles swept
#: across N (as the peer walks its tiles), W read once per band and A once, where CUTLASS's raster along M re-read A
#: once per 4-tile band of N: 0.958x cuBLAS at 16384x28672x4096 against 0.976x; where A stays in L2 (an LM head
#: chunk, 4096x128256x2048) the raster along M reads each operand once and stays (0.940x against 0.946x; H200, plain
#: GEMM, fitted grid, benchmarks/results/peer_quack_plain_h200.json, peer_quack_plain_lmhead_h200.json)
TALL_192_ALONG_N = dataclasses.replace(TALL_192, swizzle=8, raster="along_n")
TALL_192_PAIRS = KernelConfig((128, 192, 64), (2, 1), "pingpong", swizzle=8)
#: Half of an H100's or H200's 50 MB L2: an operand this size or smaller stays there while the other one streams.
A_IN_L2_BYTES = 25 << 20
COOP_SMALL = KernelConfig((128, 128, 64), (1, 1), "cooperative")
#: PINGPONG whose two warp groups' epilogues may run at the same time (csrc/kernels/sm90_pingpong_overlap.cuh):
#: where PINGPONG is chosen over K <= SHORT_K with an epilogue to run (see heuristic)
OVERLAP = dataclasses.replace(PINGPONG, schedule="overlap")
#: LARGE's tiles and clusters with CUTLASS's stream-K scheduler (full waves data-parallel, the tiles of the last wave
#: split along K across every SM): for a weight gradient ("mn") with a light epilogue (at most LIGHT_STREAMK_NODES
#: lowered nodes, no reduction) whose grid of LARGE's tiles leaves its last wave at most STREAMK_MAX_FILL full over 8
#: waves or more. Llama-8B's gate/up weight gradient (28672 x 4096 x 16384: 3584 tiles on 132 SMs, 27.15 waves) 0.968x
#: cuBLAS against 0.996x, accumulating into the gradient 0.980x against 1.005x; where the last wave was 52-88 % full
#: (every other weight gradient, the LM head's, linear + residual, the plain GEMM) stream-K was level or up to 1.6
#: points slower (H200, one run, benchmarks/results/sweep_backward_streamk_h200.json, sweep_identity_streamk_h200.json)
STREAMK_LARGE = KernelConfig((128, 256, 64), (2, 1), "streamk", swizzle=4)
STREAMK_MAX_FILL = 0.25
LIGHT_STREAMK_NODES = 5
HEURISTIC_CONFIGS: tuple[KernelConfig, ...] = (LARGE, LARGE_TALL, PINGPONG, PINGPONG_PAIR_LOADS, PINGPONG_S8, WIDE,
                                               MEDIUM, WAVE_FILL, SKINNY, TALL_192, TALL_192_S8, TALL_192_ALONG_N,
                                               TALL_192_PAIRS, OVERLAP, PINGPONG_S8_ALONG_M, STREAMK_LARGE)
STREAMK = KernelConfig((128, 128, 64), (1, 1), "streamk")
#: What config="tune" measures: the heuristic's configs, stream-K and cooperative 128x128.
CANDIDATES: tuple[KernelConfig, ...] = HEURISTIC_CONFIGS + (STREAMK, COOP_SMALL)
#: SMs assumed when no GPU is at hand (H100 SXM).
DEFAULT_SMS = 132
#: The most lowered nodes an epilogue may have for ping-pong 128x192 at N <= 1536 (see heuristic)
LIGHT_NODES = 20
#: The most lowered nodes an epilogue without a tile load may have for ping-pong 128x192 at 3072 <= N < 6144
#: (see heuristic: measured on QKV + RoPE, 7 nodes, 9 with the RMSNorm row scale)
ROPE_NODES = 10
#: The longest K loop at which a ping-pong epilogue runs in the overlap schedule (see heuristic)
SHORT_K = 1024
#: The most lowered nodes an N-major ("kn") epilogue with a tile load and column sums may have for OVERLAP over
#: K <= SHORT_K (_light_kn_sums: measured on BERT's GELU derivative with the bias gradient, 6 nodes; its 768-wide
#: layer-norm backward, 20 nodes or more, ran slower in it)
LIGHT_KN_SUM_NODES = 8
MEMORY_FILE = "tuning.json"


@dataclasses.dataclass(frozen=True)
class Epilogue:
    """What of a graph's epilogue the config choice depends on.

    plain: the output is the accumulator (at most a cast): nothing to overlap, the mainloop decides;
    tile_load: the epilogue reads an M x N tile (its loads compete with the operands for DRAM and L2);
    col_reduce: it reduces over M (per-tile partials of every column);
    large_stages: the mainloop stages the epilogue's shared memory leaves the 128x256 configs;
    pairs: it stores pairs of adjacent columns at half width (SwiGLU);
    pair_loads: it reads a pair tile (M x 2N 16-bit values: the dSwiGLU's saved pre-activation);
    tall_192: a 128x192 tile fits it (its segments divide 192 and it leaves three mainloop stages);
    bounds_tests: a reduction of it tests each element's bounds (codegen/oob.py could not show its input 0 beyond
        the problem): per-element work that a tile partly beyond N pays;
    nodes: the lowered graph's node count (how much the epilogue computes and holds);
    overlap_stages: the mainloop stages OVERLAP leaves it (its epilogue storage counts twice);
    pingpong_stages: the mainloop stages PINGPONG leaves it."""

    plain: bool = False
    tile_load: bool = False
    col_reduce: bool = False
    large_stages: int = 8
    pairs: bool = False
    pair_loads: bool = False
    tall_192: bool = True
    bounds_tests: bool = False
    nodes: int = 0
    overlap_stages: int = 8
    pingpong_stages: int = 8

    @classmethod
    def of(cls, lowered: Any) -> Epilogue:
        from .codegen.constraints import mainloop_stages, segment_size
        from .codegen.oob import reduction_needs_bounds_check

        kinds = {n.kind for n in lowered.nodes}
        bounds_tests = any(lowered[i].kind in ("row_reduce", "col_reduce") and reduction_needs_bounds_check(lowered, i)
                           for i in range(len(lowered)))
        segment = segment_size(lowered)
        tall_192 = (segment is None or 192 % segment == 0) and mainloop_stages(lowered, "bfloat16", TALL_192) >= 3
        return cls(plain=kinds <= {"accumulator", "output", "cast"}, tile_load=bool(kinds & {"tile", "pair_tile"}),
                   col_reduce="col_reduce" in kinds, large_stages=mainloop_stages(lowered, "bfloat16", LARGE),
                   pairs=bool(kinds & {"pair_gate", "pair_gated_store"}), pair_loads="pair_tile" in kinds,
                   tall_192=tall_192, bounds_tests=bounds_tests, nodes=len(lowered.nodes),
                   overlap_stages=mainloop_stages(lowered, "bfloat16", OVERLAP),
                   pingpong_stages=mainloop_stages(lowered, "bfloat16", PINGPONG))


def _waves(tiles: int, sms: int) -> float:
    """Fraction of the SM-slots of the last wave's round-up that do work (1.0: no idle tail)."""
    return tiles / (-(-tiles // sms) * sms)


def heuristic(M: int, N: int, K: int, sms: int = DEFAULT_SMS, epilogue: Epilogue = Epilogue(),
              major: str = "kk") -> KernelConfig:
    """The config for an (M, N, K) problem and a kind of epilogue (a few integer operations). M is the exact
    row count: it enters as M tiles of 128 (and of the chosen config's TILE_M where fit_swizzle counts the
    grid: ops remember their choice per M tiles of 128, so a 64-row config may keep a swizzle fitted for a
    neighbouring M, a matter of speed only), and a power-of-two bucket's rounding would hide a wave's
    tail (the QKV weight gradient's 3072 rows at 1B are 24 tiles, not the 4096 bucket's 32: 192 tiles of
    128x256 leave a second wave 45 % full, where the bucket's 256 fill two):
    - M <= 128: 64x128 ping-pong tiles, so twice as many CTAs stream W (memory-bound shapes);
    - 128x128 ping-pong where it fills the waves clearly better than 128x256 (192 tiles of
      128x256 on 132 SMs leave the second wave 45 % full; 384 of 128x128 fill 97 % of three);
    - two waves or more of 128x256 (ping-pong hides the epilogue behind the other warp group's MMAs,
      cooperative 128x256 in clusters of two has the best mainloop):
      - a column reduction: cooperative (with many tiles the ping-pong epilogue's column reduction
        cost up to 1.76x the GEMM at 16384x16384x2048, cooperative 1.10-1.14x);
      - N > 16384 and M >= 4096: ping-pong 64x256 rastered along N with swizzle 8, which keeps a
        wave's operands in L2 (bias+SiLU 1.013-1.020x cuBLAS vs 1.049-1.069x cooperative at
        N = 28672 and 128256); cooperative for a plain GEMM, with a tile load (residual 0.996-1.037x
        vs 1.035-1.050x) and at smaller M, where A stays in L2 anyway (M = 1024: 1.048x vs 1.104x);
      - N <= 16384: ping-pong 128x128 when K <= 4096 and there is an epilogue to hide; with a
        longer K loop the epilogue matters less than the mainloop, and cooperative 128x256 was faster
        (16384x4096x14336, one run: bias+SiLU 1.023x vs 1.067x, residual 1.002x vs 1.077x, SwiGLU
        1.034x vs 1.081x); a plain GEMM with both operands K-major (`major`, the layout this was
        measured in) has nothing to hide and takes cooperative 128x256 (2x1, swizzle 8: 1.030x /
        1.000x / 0.989x cuBLAS at 16384x6144x4096, 16384x16384x2048 and 8192x8192x4096 against
        1.061x / 1.037x / 1.020x in ping-pong 128x128, one run,
        benchmarks/results/sweep_identity_h100.json); the backward GEMMs that read an operand
        M- or N-major keep ping-pong there (measured at 0.89-1.02x cuBLAS in the training step);
        an epilogue that reads a pair tile (dSwiGLU), with 32 or more M tiles, launches it with swizzle 8
        rastered along N (PINGPONG_PAIR_LOADS): the kernel's DRAM reads fell from 5.0 to 3.9 GB and its
        time from 1.256x to 1.186x cuBLAS at 16384x14336x4096, from 1.65 to 1.25 GB and 1.440x to
        1.325x at 16384x8192x2048 (kernel alone, one run, benchmarks/results/sweep_raster_dswiglu_h100.json),
        with its pair accesses in shared memory staggered (pair_smem, at PINGPONG_PAIR_LOADS); where 128x192 tiles
        fit it, over K >= 4096, or K >= 2048 where no reduction of it tests bounds, ping-pong 128x192 with swizzle 8
        (TALL_192_S8: Llama's dSwiGLU at 8B 1.043x against 1.084x, at 1B 1.18x against 1.20x);
    - the 2x1-cluster cooperative 128x256 config uses swizzle 8 with 32 or more M tiles (0-1.5 %
      faster than 4 in that sweep and at M = 8192 and 16384 in graphs_h100.json); with fewer the
      swizzled grid runs idle tiles: at 1024x28672x4096 swizzle 8 took 2.05-2.24x cuBLAS, 4 took
      1.01-1.11x (git history: 5c5a523:benchmarks/results/earlier/graphs_h100_a9e8b89.json);
    - else one wave or so: cooperative 128x256;
    - M >= 4096, K <= 4096 and N >= 6144 with both operands K-major and no column reduction: ping-pong
      128x192 before all of the above (TALL_192): 0.87-0.94x cuBLAS at 8192x128256x4096 (against
      0.90-0.97x cooperative 128x256), 0.97-1.01x at 16384x28672x4096 (0.99-1.07x), 1.01-1.05x at
      16384x6144x4096 (1.07-1.10x ping-pong 128x128) for the plain GEMM, bias+SiLU, residual, SwiGLU,
      row-sum and design-graph epilogues (one run, benchmarks/results/sweep_192_h100.json); swizzle 8
      at N <= 16384 (4 above), and pair graphs there in 2x1 clusters (SwiGLU y only at
      16384x16384x2048: 1.031x against 1.151x in 1x1). At N <= 4096, K > 4096 or M = 1024 it loses
      (1.12-2.1x: a 192 tile divides neither N nor the waves), so those keep the configs above;
      the same at N <= 1536 where 192 divides N, for an epilogue of at most LIGHT_NODES lowered nodes:
      16384x768x768 and x768x3072 (BERT-base's fused forward GEMMs, LayerNorm folded in, with and without
      a residual and two row reductions) ran at 1.02-1.09x cuBLAS against 1.50-1.98x in ping-pong 128x128
      and 1.43-1.79x in cooperative 128x256; a 32-node epilogue (GELU and its derivative beside two row
      reductions) ran 1.76x slower in 128x192 than in 128x128 (H200, one run,
      benchmarks/results/sweep_fusion_h200.json); and at 3072 <= N < 6144 where 192 divides N, over K >= 2048,
      for an epilogue without a tile load of at most ROPE_NODES nodes: QKV + RoPE at Llama-1B's 16384x3072x2048
      ran at 1.033-1.037x cuBLAS in 128x192 against 1.088-1.095x in 128x128 (and at 16384x2048x2048 1.066x against
      1.085x); linear + residual + norm statistic (a tile load) was slower in 128x192 at both (1.106-1.152x against
      1.078-1.099x: H200, one run, benchmarks/results/sweep_residual_qkv_h200.json);
    - PINGPONG (also where a 128x256 epilogue would leave too few stages, below) at 4096 <= N < 6144 and K >= 4096
      with 32 or more M tiles, operands "kk" or "kn" (the dX GEMMs): swizzle 8 rastered along M (PINGPONG_S8_ALONG_M;
      Llama-8B's residual + norm, RMSNorm backward and dX GEMM 1.5-2.3 points faster than swizzle 4, H200);
    - PINGPONG at N >= 6144 and K >= 4096 with 32 or more M tiles, both operands K-major (an epilogue 128x192
      tiles do not fit, QK-norm's 128-wide heads, or one with a tile load): swizzle 8 (PINGPONG_S8), QKV + QK-norm
      + RoPE at 16384x6144x4096 1.068x cuBLAS against 1.093x with swizzle 4 (benchmarks/results/
      sweep_qknorm8b_h200.json), linear + residual + norm statistic at Llama-8B's 16384x4096x4096 1.061x against
      1.081x, its plain GEMM 1.007x against 1.031x (H200, one run each, benchmarks/results/
      sweep_residual_norm_s8_h200.json; at 16384x2048x2048 swizzle 8 and 4 were level, 1.079x and 1.080x);
    - a column reduction over K <= 1024 (a short mainloop: the epilogue is most of a tile's time) with
      both operands K-major in ping-pong 128x128, whose epilogue overlaps the other warp group's mainloop:
      GPT-2's GELU backward with the bias gradient (16384x3072x768, dy . gelu'(x) and its column sums)
      177 us against 182 in cooperative 128x256 2x1 and 190 in cooperative 128x128; N-major, cooperative
      128x256 2x1 (BERT's GELU derivative then: 190 us against 200 in cooperative 128x128 and 202 in ping-pong
      128x128, H200, one run each, benchmarks/results/sweep_fusion_gelu_h200.json; with the GELU derivative
      written out node by node cooperative 128x128 had been the fastest there, 246 us against 295: a lighter
      epilogue moves the balance to the larger tile), but for a light N-major epilogue, a tile load and column
      sums in at most LIGHT_KN_SUM_NODES nodes with no bounds test that OVERLAP fits (_light_kn_sums: BERT's
      GELU derivative since), OVERLAP;
    - PINGPONG over K <= SHORT_K with an epilogue (not plain) that leaves OVERLAP three mainloop stages or
      more and at most one fewer than PINGPONG (_overlap_fits): OVERLAP, the same tiles with the two warp
      groups' epilogues running at the same time. A short K loop makes the epilogue most of a tile's time and
      CUTLASS's ping-pong orders the two epilogues; at
      16384x3072x768 (128x128, swizzle 4) the GELU backward with column sums took 160 us against 177 in
      ping-pong, GELU forward with three stores 208 against 224, the design graph's row reduction 139 against
      143, the plain GEMM 110 against 112 (H200, one run, benchmarks/results/overlap_h200.txt);
    - but never a 128x256 config whose epilogue leaves its mainloop fewer than three stages: ping-pong
      128x128 then (the RMSNorm-backward epilogue, two tile loads, two stores and a column reduction, ran
      at 1.65x cuBLAS in cooperative 128x256 2x1 with two stages and 1.13-1.19x in ping-pong 128x128
      with five; benchmarks/results/norm_backward_configs_h100.txt, docs/measured.md), or 128x192 where that
      epilogue is N-major over K >= 8192 and N <= 2048 (_deep_narrow_kn: Llama-1B's RMSNorm backward with dx_in);
    - a weight gradient ("mn") with a light epilogue (the plain GEMM or the accumulating one) where cooperative
      128x256 2x1 runs 8 waves or more and leaves its last one at most a quarter full: the same tiles with the stream-K
      scheduler (STREAMK_LARGE: Llama-8B's gate/up weight gradient 0.968x cuBLAS against 0.996x);
    - and the choice's swizzle halved while it pads the scheduler's grid by more than MAX_SWIZZLE_PADDING
      (fit_swizzle: a launch argument, the same kernel); a weight gradient's ("mn": both operands read along M
      and N) first tries the other raster at its swizzle (fit_swizzle's flip)."""
    return fit_swizzle(_choice(M, N, K, sms, epilogue, major), M, N, flip=major == "mn")


def _choice(M: int, N: int, K: int, sms: int, epilogue: Epilogue, major: str) -> KernelConfig:
    narrow = N <= 1536 and N % 192 == 0 and epilogue.nodes <= LIGHT_NODES
    mid = (3072 <= N < 6144 and N % 192 == 0 and K >= 2048 and not epilogue.tile_load
           and epilogue.nodes <= ROPE_NODES)
    if (-(-M // 128) >= 32 and K <= 4096 and (N >= 6144 or narrow or mid) and major == "kk" and not epilogue.col_reduce
            and epilogue.tall_192):
        if N > 16384:
            return TALL_192_ALONG_N if M * K * 2 > A_IN_L2_BYTES else TALL_192
        return TALL_192_PAIRS if epilogue.pairs else TALL_192_S8
    choice = _by_shape(M, N, K, sms, epilogue, major)
    if choice == PINGPONG and K <= SHORT_K and not epilogue.plain and _overlap_fits(epilogue):
        return OVERLAP
    if choice == LARGE and _light_kn_sums(K, epilogue, major):
        return OVERLAP
    if choice.tile[1] == 256 and choice.tile[0] == 128 and epilogue.large_stages < 3:
        if _deep_narrow_kn(M, N, K, epilogue, major):
            return TALL_192
        choice = PINGPONG
    if choice == PINGPONG and N >= 4096 and K >= 4096 and -(-M // 128) >= 32:
        if N < 6144 and major in ("kk", "kn"):
            return PINGPONG_S8_ALONG_M
        if major == "kk":
            return PINGPONG_S8
    if choice == LARGE and _last_wave_nearly_empty(M, N, sms, epilogue, major):
        return STREAMK_LARGE
    if choice == LARGE and -(-M // 128) >= 32:
        return LARGE_TALL
    return choice


def _light_kn_sums(K: int, epilogue: Epilogue, major: str) -> bool:
    """An N-major ("kn") epilogue with a tile load and column sums, at most LIGHT_KN_SUM_NODES lowered nodes and no
    bounds test in its reductions, over K <= SHORT_K, that OVERLAP fits (_overlap_fits): OVERLAP where the shape
    would take cooperative 128x256. BERT-base's GELU derivative with the bias gradient (dX GEMM at 16384x3072x768,
    W read N-major) 182.6 us against 189.4 in cooperative 128x256 2x1 and 211.8 in ping-pong 128x128 with
    epilogue stages (2, 1) (H200, one sweep run, benchmarks/results/sweep_fusion_overlap_kn_h200.json;
    bit-identical to ping-pong in tests/gpu/test_overlap_gpu.py's gelu_bwd_kn); its 768-wide layer-norm backward
    (d738ff69, 20 nodes or more) ran slower in it (102.4-103.7 against 96.3 us at 16384x768x768)."""
    return (major == "kn" and K <= SHORT_K and epilogue.tile_load and epilogue.col_reduce
            and epilogue.nodes <= LIGHT_KN_SUM_NODES and not epilogue.bounds_tests and _overlap_fits(epilogue))


def _streamk_may_take(epilogue: Epilogue, major: str) -> bool:
    """A weight gradient ("mn") with a light epilogue (at most LIGHT_STREAMK_NODES lowered nodes, no column
    reduction): the GEMMs STREAMK_LARGE was measured on."""
    return major == "mn" and not epilogue.col_reduce and epilogue.nodes <= LIGHT_STREAMK_NODES


def _last_wave_nearly_empty(M: int, N: int, sms: int, epilogue: Epilogue, major: str) -> bool:
    """A weight gradient ("mn") with a light epilogue whose LARGE tiles run 8 waves or more and leave the last one at
    most STREAMK_MAX_FILL full: STREAMK_LARGE spreads that wave's tiles over every SM."""
    if not _streamk_may_take(epilogue, major):
        return False
    bm, bn = _ctas(LARGE, M, N)
    tiles = bm * bn
    return tiles >= 8 * sms and 0 < tiles % sms <= STREAMK_MAX_FILL * sms


def _deep_narrow_kn(M: int, N: int, K: int, epilogue: Epilogue, major: str) -> bool:
    """An N-major ("kn") epilogue with tile loads and column sums (the RMSNorm backward's) over a deep K (>= 8192)
    and a narrow N (<= 2048), 32 or more M tiles, where 128x192 tiles fit: ping-pong 128x192 (TALL_192). Llama-1B's
    RMSNorm backward with dx_in (16384x2048x16384): 1.084-1.095x cuBLAS against 1.089-1.118x in 128x128, its plain
    GEMM 1.042-1.052x against 1.059-1.083x (H200, three runs; benchmarks/results/sweep_dx_in_residual_1b_h200.log,
    sweep_norm_backward_192_h200.json); at K = 3072 and for Llama-8B's dx_in (N = 4096, K = 28672) 128x128 stayed
    ahead."""
    return (major == "kn" and N <= 2048 and K >= 8192 and -(-M // 128) >= 32 and epilogue.tile_load
            and epilogue.col_reduce and not epilogue.pair_loads and epilogue.tall_192)


#: The most a swizzle may add to the persistent grid's tiles (scheduled_tiles) before the heuristic halves it.
MAX_SWIZZLE_PADDING = 0.05


def scheduled_tiles(config: KernelConfig, M: int, N: int) -> int:
    """The tiles the SM90 persistent scheduler walks for an M x N output in `config`: the tile counts in whole
    clusters; across the raster direction (config.applied_raster) rounded up to a multiple of the swizzle it
    applies (config.applied_swizzle) times the cluster's extent, whole bands; along it, as they are
    (csrc/kernels/fitted_grid.cuh; with grid="padded", CUTLASS's own grid, both counts rounded up). The padded
    tiles take their turns like real ones: 16384 x 768 in 128 x 128 tiles is 6 N tiles, swizzle 4 made it 8 in
    CUTLASS's grid, and the plain GEMM (x768x3072, N-major W) took 1.79x cuBLAS against 1.01x with swizzle 2
    (H200, one run, benchmarks/results/sweep_swizzle_h200.json)."""
    cm, cn = config.cluster
    bm, bn = _ctas(config, M, N)
    s = applied_swizzle(config.swizzle, bm, bn)
    pm, pn = _up(bm, cm * s), _up(bn, cn * s)
    if config.grid == "padded":
        return pm * pn
    return pm * bn if _raster(config, M, N) == "along_n" else bm * pn


def _up(n: int, k: int) -> int:
    return -(-n // k) * k


def _ctas(config: KernelConfig, M: int, N: int) -> tuple[int, int]:
    """config's CTA counts along M and N for an M x N output, each rounded up to whole clusters."""
    (tm, tn, _), (cm, cn) = config.tile, config.cluster
    return _up(_up(M, tm) // tm, cm), _up(_up(N, tn) // tn, cn)


def _raster(config: KernelConfig, M: int, N: int) -> str:
    """The raster order the scheduler walks config's M x N grid in (config.applied_raster)."""
    return applied_raster(config.raster, config.swizzle, *_ctas(config, M, N), config.cluster)


def fit_swizzle(config: KernelConfig, M: int, N: int, flip: bool = False) -> KernelConfig:
    """config with its swizzle halved until it pads the grid by at most MAX_SWIZZLE_PADDING (a launch argument:
    the same kernel). The Llama shapes keep theirs (at most 2.3 % padding); BERT's 768-wide outputs in 128-wide
    tiles take swizzle 2. flip: where config's raster is CUTLASS's heuristic and its swizzle pads, the other raster
    at the same swizzle first (its bands run across the other dimension), if that one does not pad. The 8B LM
    head's last weight-gradient chunk (13568 x 4096 x 8192, "mn", cooperative 128 x 256 2 x 1): its 106 M tiles
    across the raster took swizzle 2 at 1.082x cuBLAS; rastered along M with swizzle 8 (bands of 8 of its 16 N
    tiles) 1.009x, swizzle 4 along M 1.019x (H200, one run, benchmarks/results/sweep_lm_head_dw_h200.log)."""
    base = scheduled_tiles(dataclasses.replace(config, swizzle=1), M, N)

    def pads(c: KernelConfig) -> bool:
        return scheduled_tiles(c, M, N) > base * (1 + MAX_SWIZZLE_PADDING)

    if flip and config.raster == "heuristic" and config.grid != "padded" and pads(config):
        other = dataclasses.replace(config, raster="along_m" if _raster(config, M, N) == "along_n" else "along_n")
        if not pads(other):
            return other
    s = config.swizzle
    while s > 1 and pads(dataclasses.replace(config, swizzle=s)):
        s //= 2
    return config if s == config.swizzle else dataclasses.replace(config, swizzle=s)


def _overlap_fits(epilogue: Epilogue) -> bool:
    """OVERLAP's two copies of the epilogue leave its mainloop three stages or more, and at most one fewer than
    PINGPONG's (the heuristic, the configs "auto" may build and config="tune" all take it only then). Every
    epilogue measured faster in it lost one stage (GPT-2's, BERT's, ViT's and the MLP's sites: 6 -> 5 or none);
    those that lost two ran slower, the dSwiGLU's (5 -> 3) at 1.60x cuBLAS against 1.26x in ping-pong and the
    RMSNorm backward's (5 -> 3) at 1.17x against 1.10x (H200, K = 2048 and 16384,
    benchmarks/results/overlap_llama_h200.json)."""
    return epilogue.overlap_stages >= max(3, epilogue.pingpong_stages - 1)


def fits(config: KernelConfig, epilogue: Epilogue) -> bool:
    """False for a 128x192 config the epilogue does not fit, or an overlap config whose two copies of the
    epilogue leave the mainloop fewer than three stages (config="tune" skips them, as the heuristic does)."""
    if config.schedule == OVERLAP.schedule and not _overlap_fits(epilogue):
        return False
    return config.tile[:2] != (128, 192) or epilogue.tall_192


def heuristic_configs(epilogue: Epilogue = Epilogue(), major: str = "kk") -> tuple[KernelConfig, ...]:
    """The configs heuristic() may return for this kind of epilogue and operand layout (what an "auto"
    op may compile)."""
    tall = ()
    if major == "kk" and not epilogue.col_reduce and epilogue.tall_192:
        tall = (TALL_192, TALL_192_ALONG_N, TALL_192_PAIRS if epilogue.pairs else TALL_192_S8)
    elif epilogue.pair_loads and epilogue.tall_192:   # the pair-tile epilogue over K >= 2048 (_by_shape)
        tall = (TALL_192_S8,)
    elif major == "kn" and epilogue.tile_load and epilogue.col_reduce and epilogue.tall_192:   # _deep_narrow_kn
        tall = (TALL_192,)
    skip = ((TALL_192, TALL_192_S8, TALL_192_ALONG_N, TALL_192_PAIRS)
            + (() if epilogue.pair_loads else (PINGPONG_PAIR_LOADS,))
            + ((OVERLAP,) if epilogue.plain or not _overlap_fits(epilogue) else ())
            + (() if _streamk_may_take(epilogue, major) else (STREAMK_LARGE,)))
    return tuple(c for c in HEURISTIC_CONFIGS if c not in skip) + tall


def for_every_m(config: KernelConfig) -> KernelConfig:
    """The config a kernel with one launch default for every M takes (libcoda's fixed kernels): the
    heuristic's, but LARGE_TALL's swizzle 8 only pays with 32 or more M tiles and wastes half the
    grid with 8 (1024 rows), so such a kernel launches with LARGE's swizzle 4 (and PINGPONG_PAIR_LOADS and
    PINGPONG_S8 with PINGPONG's launch arguments)."""
    return {LARGE_TALL: LARGE, PINGPONG_PAIR_LOADS: PINGPONG, PINGPONG_S8: PINGPONG,
            PINGPONG_S8_ALONG_M: PINGPONG}.get(config, config)


def _by_shape(M: int, N: int, K: int, sms: int, epilogue: Epilogue, major: str) -> KernelConfig:
    tiles_m = -(-M // 128)
    if tiles_m == 1:
        return SKINNY
    tiles_128 = tiles_m * -(-N // 128)
    tiles_256 = tiles_m * -(-N // 256)
    if _waves(tiles_128, sms) > _waves(tiles_256, sms) + 0.1:
        return WAVE_FILL
    if tiles_256 >= 2 * sms:
        if epilogue.col_reduce:
            return PINGPONG if K <= 1024 and major == "kk" else LARGE
        if N > 16384:
            return WIDE if tiles_m >= 32 and not (epilogue.plain or epilogue.tile_load) else LARGE
        if K > 4096 or (epilogue.plain and major == "kk"):
            return LARGE
        if epilogue.pair_loads and tiles_m >= 32:
            # over K >= 2048, 128x192 tiles where they fit the pair-tile epilogue (dSwiGLU): half again the FLOPs per
            # operand byte now that the scheduler walks no padded tiles (14336 columns are 75 tiles of 192, which
            # swizzle 8 had padded to 80): the 8B dSwiGLU (16384x14336x4096) 1.043x cuBLAS against 1.084x (H200,
            # benchmarks/results/sweep_backward_fitted_h200.json). Over K = 2048 (1B) 128x192 lost while its row
            # sum tested every element's bounds (1.245-1.263x against 1.220x; 8192 columns leave the last 192-wide
            # tile part padding); without the test (codegen/oob.py: the summand is 0 in the padding) 1.176-1.181x
            # against 1.194-1.200x in PINGPONG_PAIR_LOADS (two runs, sweep_dswiglu_bounds_h200.json and
            # sweep_dswiglu_1b_192_h200.json; with the test kept 1.261x): over K < 4096 only where no reduction
            # tests bounds
            deep = K >= 4096 or (K >= 2048 and not epilogue.bounds_tests)
            return TALL_192_S8 if deep and epilogue.tall_192 else PINGPONG_PAIR_LOADS
        return PINGPONG
    return MEDIUM


def m_bucket(M: int) -> int:
    """Token counts share a remembered tuning choice (config="tune") within a power-of-two bucket (64, 128, ...,
    16384, then 16384)."""
    return min(max(64, 1 << max(0, M - 1).bit_length()), 16384)


def memory_key(digest: str, dtype: str, N: int, K: int, M: int, gpu: str, major: str = "kk") -> str:
    layout = "" if major == "kk" else f"|{major}"      # each operand layout remembers its own choice
    return f"{digest}|{dtype}|N={N}|K={K}|M<={m_bucket(M)}|{gpu}{layout}"


def config_by_tag(tag: str, candidates: tuple[KernelConfig, ...]) -> KernelConfig | None:
    return next((c for c in candidates if c.tag == tag), None)


def load_memory() -> dict[str, Any]:
    path = cache_root() / MEMORY_FILE
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        return {}  # a corrupt file is only a lost cache of choices


def remember(key: str, tag: str, timings_ms: dict[str, float]) -> None:
    """Stores one choice (read-modify-write under the cache lock, so processes do not clobber)."""
    path = cache_root() / MEMORY_FILE
    with locked("tuning-memory"):
        memory = load_memory()
        memory[key] = {"config": tag, "median_ms": timings_ms}
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(memory, indent=1, sort_keys=True))
        tmp.replace(path)


def cuda_event_time_ms(fn: Callable[[], Any], reps: int) -> list[float]:
    """Times fn() with CUDA events, one measurement per call (after one warm-up call)."""
    import torch

    fn()
    out = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end))
    return out
