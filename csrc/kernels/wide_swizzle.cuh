// coda/kernels/wide_swizzle.cuh — swizzle 16 for CUTLASS's SM90 persistent tile scheduler.
//
// Why: the scheduler walks the output in strips of `swizzle` tiles (clusters) across the grid; a wave of
// persistent CTAs then works inside one or two strips and keeps their operand panels in L2. CUTLASS caps the
// swizzle at 8 (get_log_swizzle_size) although its tile-index math (get_work_idx_m_and_n: an offset within
// the strip from the low log-swizzle bits, the strip from the rest) takes any power of two. The backward
// epilogue GEMMs stream their epilogue's tiles beside a mainloop that re-reads A and W from DRAM; with
// 1024-row strips an ideal L2 re-reads W about twice as often as with 2048-row ones (docs/measured.md, "What
// the peer does differently").
//
// widen_swizzle() re-derives the fields the scheduler's Params::initialize() sets from the swizzle, at
// log2(16) = 4, keeping the raster order it chose; CUTLASS takes 8 only where the shorter side has 6 CTAs or
// more, so 16 needs 12 (else the Params stay as CUTLASS made them). The launch grid (get_grid_shape, which
// recomputes a swizzle capped at 8) may then be smaller than the padded tile count: every persistent CTA
// strides over all of them, so only which CTA takes which tile changes, never a result.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "sm90_cutlass.cuh"

namespace coda::kernels {

constexpr int kWideSwizzle = 16;      // the one swizzle above CUTLASS's 8
constexpr int kWideSwizzleLog = 4;
constexpr int kWideSwizzleMinCtas = 12;   // CUTLASS: 8 from 6 CTAs on the shorter side; 16 from 12

// ctas_m, ctas_n: the output's CTA counts along M and N, each rounded up to whole clusters.
template <class SchedulerParams>
void widen_swizzle(SchedulerParams& p, uint32_t ctas_m, uint32_t ctas_n, uint32_t batches) {
  using Params = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90Params;
  if constexpr (std::is_same_v<SchedulerParams, Params>) {
    if (std::min(ctas_m, ctas_n) < uint32_t(kWideSwizzleMinCtas)) return;
    uint32_t const cm = p.cluster_shape_m_, cn = p.cluster_shape_n_;
    uint32_t const blocks_m = (ctas_m + kWideSwizzle * cm - 1) / (kWideSwizzle * cm) * (kWideSwizzle * cm);
    uint32_t const blocks_n = (ctas_n + kWideSwizzle * cn - 1) / (kWideSwizzle * cn) * (kWideSwizzle * cn);
    p.problem_tiles_m_ = blocks_m / cm;
    p.problem_tiles_n_ = blocks_n / cn;
    p.blocks_per_problem_ = uint64_t(blocks_m) * blocks_n * batches;
    p.log_swizzle_size_ = kWideSwizzleLog;
    p.divmod_batch_ = cutlass::FastDivmodU64(uint64_t(blocks_m) * blocks_n);
    p.divmod_cluster_blk_major_ = cutlass::FastDivmodU64(
        p.raster_order_ == Params::RasterOrder::AlongN ? blocks_n / cn : blocks_m / cm);
  }
}

}  // namespace coda::kernels
