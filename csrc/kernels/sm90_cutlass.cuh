// coda/kernels/sm90_cutlass.cuh — the part of CUTLASS a coda_ext kernel instantiates, and no more.
//
// CUTLASS's umbrella headers (gemm/collective/collective_builder.hpp, collective_mma.hpp,
// gemm/kernel/gemm_universal.hpp and the device adapter that includes them again) bring every
// architecture's mainloops and kernels, SM70 to SM120: a translation unit that instantiated nothing
// spent about a fifth of a kernel's nvcc time parsing them. This header names the SM90 pieces
// directly: the collective builders (the epilogue's builder header has no SM90-only form), the
// TMA warp-specialized SS mainloop, the ping-pong and cooperative persistent kernels with their tile
// schedulers, and the kernel entry and cluster launch the launcher in epilogue_gemm.cuh uses.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/cluster_launch.hpp>
#include <cutlass/device_kernel.h>
#include <cutlass/kernel_hardware_info.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder_decl.hpp>
#include <cutlass/gemm/collective/builders/sm90_gmma_builder.inl>
#include <cutlass/gemm/collective/sm90_mma_tma_gmma_ss_warpspecialized.hpp>
#include <cutlass/gemm/kernel/gemm_universal_decl.h>
#include <cutlass/gemm/kernel/tile_scheduler.hpp>
#include <cutlass/gemm/kernel/sm90_gemm_tma_warpspecialized_pingpong.hpp>
#include <cutlass/gemm/kernel/sm90_gemm_tma_warpspecialized_cooperative.hpp>
