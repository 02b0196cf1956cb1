// coda/kernels/fitted_grid.cuh — CUTLASS's SM90 persistent tile scheduler without the tiles it pads on.
//
// Why: the scheduler walks the output in bands of `swizzle` clusters across the raster direction, and its
// Params::initialize() rounds *both* tile counts up to a multiple of swizzle x cluster. Only the count across
// the bands needs it (a band is swizzle clusters wide); along the raster direction the index math takes any
// count (get_work_idx_m_and_n splits a band's clusters with divmod_cluster_blk_major_, an arbitrary divisor).
// The padded tiles are not skipped: each takes its turn through the whole mainloop with out-of-bounds
// operands and stores nothing. At 16384 x 16384 in 128 x 192 tiles, swizzle 8, the 86 N tiles walked along N
// became 88: 2.3 % of the kernel's tiles did no work.
//
// fit_grid() sets the count along the raster direction back to the real one (whole clusters) after CUTLASS
// made its Params (and after widen_swizzle); the count across the bands keeps its padding to whole bands.
// Which CTA takes which tile changes, never a result. The launch grid (get_grid_shape, from the padded
// counts) is at most the SM count, or the padded tile count for a small problem: the CTAs past the real
// tiles find no work and exit. CodaLaunch.raster_order's kPaddedGrid bit keeps CUTLASS's grid (comparisons).
#pragma once

#include <cstdint>
#include <type_traits>

#include "sm90_cutlass.cuh"

namespace coda::kernels {

constexpr int32_t kRasterMask = 3;      // CodaLaunch.raster_order: 0 heuristic, 1 along M, 2 along N
constexpr int32_t kPaddedGrid = 4;      // ... | 4: CUTLASS's padded grid (KernelConfig(grid="padded"))

// ctas_m, ctas_n: the output's CTA counts along M and N, each rounded up to whole clusters.
template <class SchedulerParams>
void fit_grid(SchedulerParams& p, uint32_t ctas_m, uint32_t ctas_n, uint32_t batches) {
  using Params = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90Params;
  if constexpr (std::is_same_v<SchedulerParams, Params>) {
    bool const along_n = p.raster_order_ == Params::RasterOrder::AlongN;
    if (along_n) p.problem_tiles_n_ = ctas_n / p.cluster_shape_n_;
    else p.problem_tiles_m_ = ctas_m / p.cluster_shape_m_;
    uint64_t const blocks = uint64_t(p.problem_tiles_m_) * p.cluster_shape_m_ * p.problem_tiles_n_ * p.cluster_shape_n_;
    p.blocks_per_problem_ = blocks * batches;
    p.divmod_batch_ = cutlass::FastDivmodU64(blocks);
    p.divmod_cluster_blk_major_ = cutlass::FastDivmodU64(along_n ? p.problem_tiles_n_ : p.problem_tiles_m_);
  }
}

}  // namespace coda::kernels
