// coda/kernels/epilogue_gemm.cuh — the fixed SM90 TMA warp-specialized persistent GEMM with
// an epilogue visitor tree, and the plain-C entry points every kernel translation unit exports.
//
// A kernel translation unit defines a Config, a fusion (the visitor tree), a function that
// builds the fusion's arguments from a CodaLaunch, and the list of its reductions; then
// CODA_DEFINE_ENTRY_POINTS(...) exports coda_workspace_size / coda_run.
#pragma once

// Programmatic dependent launch: the GEMM kernels signal once their last tile's mainloop is
// done, so the reduction finalize (launched as a programmatic dependent, and waiting for the
// whole GEMM grid before it reads) is set up while the last epilogues run. Must precede
// every CUTLASS include. A translation unit defines CODA_NO_PDL first to build without the
// hooks (the finalize then starts when the GEMM has finished, as any launch would).
#if !defined(CODA_NO_PDL) && !defined(CUTLASS_ENABLE_GDC_FOR_SM90)
#define CUTLASS_ENABLE_GDC_FOR_SM90 1
#endif

#include <cuda_runtime.h>

#include <cstdio>

#include "coda/abi.h"
#include "sm90_cutlass.cuh"
#include "config.cuh"
#include "finalize.cuh"
#include "fitted_grid.cuh"
#include "sm90_cooperative_handoff.cuh"
#include "sm90_pingpong_overlap.cuh"
#include "wide_swizzle.cuh"
#include "../epilogues/nodes.hpp"

namespace coda::kernels {

constexpr size_t kWorkspaceAlign = 256;
inline size_t align_up(size_t x) { return (x + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign; }

// One reduction of the graph: which slot receives the finished vector and how to finish it.
struct ReductionSpec {
  int slot;           // CodaLaunch slot of the fp32 output vector
  ReduceAxis axis;    // Rows: one value per row (length M); Cols: one per column (length N)
  ReduceCombine combine;
};

// The reductions of one graph, in the order their partial buffers are laid out.
constexpr int kMaxReductions = kMaxFinalizeItems;
struct ReductionList {
  int count;
  ReductionSpec items[kMaxReductions];
};

// Extent of the partial buffer of one reduction: `count` vectors of `length` (padded) floats.
template <class Cfg>
inline void partial_extent(ReductionSpec const& r, int64_t M, int64_t N, int64_t& length, int64_t& count) {
  constexpr int64_t TM = cute::size<0>(typename Cfg::TileShape{});
  constexpr int64_t TN = cute::size<1>(typename Cfg::TileShape{});
  if (r.axis == ReduceAxis::Rows) {
    length = (M + TM - 1) / TM * TM;
    count = (N + TN - 1) / TN;
  } else {
    length = (N + TN - 1) / TN * TN;
    count = (M + TM - 1) / TM;
  }
}

// The epilogue collective: CUTLASS's builder, or (stage counts set in the Config) the builder's own
// implementation step given the Config's dispatch policy, so the collective and the fusion's nodes
// agree on StagesC / StagesD.
template <class Cfg, class Fusion, bool = Cfg::kEpilogueStagesSet>
struct EpilogueCollective {
  using type = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, typename Cfg::TileShape, typename Cfg::ClusterShape,
      typename Cfg::EpilogueTileType, float, float,
      typename Cfg::ElementC, typename Cfg::LayoutD, Cfg::kAlignmentD,
      typename Cfg::ElementD, typename Cfg::LayoutD, Cfg::kAlignmentD,
      typename Cfg::Schedule::Epilogue, Fusion>::CollectiveOp;
};
template <class Cfg, class Fusion>
struct EpilogueCollective<Cfg, Fusion, true> {
  using Desc = typename Cfg::EpilogueDescriptor;
  using type = typename cutlass::epilogue::collective::detail::Sm90TmaBuilderImpl<
      typename Cfg::TileShape, typename Desc::EpilogueTile, float, float,
      typename Cfg::ElementC, typename Cfg::LayoutD, Cfg::kAlignmentD,
      typename Cfg::ElementD, typename Cfg::LayoutD, Cfg::kAlignmentD,
      Fusion, typename Desc::DispatchPolicy>::CollectiveOp;
};

// The kernel class: CUTLASS's GemmUniversal for the schedule, or one of the project's: the ping-pong kernel
// with overlapping epilogues (PingpongOverlap), the cooperative kernel with epilogue warp groups of its own
// (CooperativeHandoff).
template <class Cfg, class Mainloop, class Epilogue, bool = Cfg::Schedule::kOverlapEpilogues,
          bool = Cfg::Schedule::kHandoff>
struct GemmKernel {
  using type = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Mainloop, Epilogue,
                                                    typename Cfg::Schedule::TileScheduler>;
};
template <class Cfg, class Mainloop, class Epilogue>
struct GemmKernel<Cfg, Mainloop, Epilogue, true, false> {
  using type = PingpongOverlapKernel<cute::Shape<int, int, int, int>, Mainloop, Epilogue,
                                     typename Cfg::Schedule::TileScheduler, Cfg::Schedule::kOrderEpilogues>;
};
template <class Cfg, class Mainloop, class Epilogue>
struct GemmKernel<Cfg, Mainloop, Epilogue, false, true> {
  using type = CooperativeHandoffKernel<cute::Shape<int, int, int, int>, Mainloop, Epilogue,
                                        typename Cfg::Schedule::TileScheduler>;
};

template <class Cfg, class Fusion>
struct EpilogueGemm {
  static constexpr bool kOverlapEpilogues = Cfg::Schedule::kOverlapEpilogues;
  static constexpr bool kHandoff = Cfg::Schedule::kHandoff;
  using BuiltEpilogue = typename EpilogueCollective<Cfg, Fusion>::type;
  using CollectiveEpilogue =
      cute::conditional_t<kOverlapEpilogues || kHandoff, OverlapEpilogue<BuiltEpilogue>, BuiltEpilogue>;
  // The mainloop's stages get what the epilogue leaves: one epilogue's storage, or one per math warp group
  // when their epilogues overlap, and (handoff) two chunk buffers of a quarter of the tile's fp32 accumulators.
  static constexpr int kHandoffSmem =
      kHandoff ? cute::size<0>(typename Cfg::TileShape{}) * cute::size<1>(typename Cfg::TileShape{}) * 2 : 0;
  static constexpr int kEpilogueSmem =
      (kOverlapEpilogues ? 2 : 1) * static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage)) +
      kHandoffSmem;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      typename Cfg::ElementAB, typename Cfg::LayoutA, Cfg::kAlignmentAB,
      typename Cfg::ElementAB, typename Cfg::LayoutB, Cfg::kAlignmentAB,
      float, typename Cfg::TileShape, typename Cfg::ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<kEpilogueSmem>,
      typename Cfg::Schedule::Mainloop>::CollectiveOp;

  using Kernel = typename GemmKernel<Cfg, CollectiveMainloop, CollectiveEpilogue>::type;
  static_assert(Kernel::SharedStorageSize <= 232448, "the kernel's shared memory exceeds an SM90 CTA's 227 KB");
  using Arguments = typename Kernel::Arguments;
  using FusionArguments = typename Fusion::Arguments;
  using ElementAB = typename Cfg::ElementAB;
  using ElementD = typename Cfg::ElementD;

  static int sm_count(int32_t requested) {
    if (requested > 0) return requested;
    int device = 0;
    cudaGetDevice(&device);
    static int cached[64] = {0};
    if (device < 0 || device >= 64) return cutlass::KernelHardwareInfo::query_device_multiprocessor_count(device);
    if (cached[device] == 0) cached[device] = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(device);
    return cached[device];
  }

  static Arguments gemm_arguments(CodaLaunch const& L, FusionArguments const& fusion) {
    using Stride = typename Cfg::StrideRowMajor;
    Arguments args{};
    args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
    args.problem_shape = {int(L.M), int(L.N), int(L.K), 1};
    args.mainloop.ptr_A = static_cast<ElementAB const*>(L.A);
    args.mainloop.dA = Cfg::template operand_stride<typename Cfg::StrideA>(L.lda);
    args.mainloop.ptr_B = static_cast<ElementAB const*>(L.B);
    args.mainloop.dB = Cfg::template operand_stride<typename Cfg::StrideB>(L.ldb);
    args.epilogue.thread = fusion;
    args.epilogue.ptr_C = nullptr;
    args.epilogue.dC = Stride{L.ldd, cute::_1{}, int64_t(0)};
    args.epilogue.ptr_D = static_cast<ElementD*>(L.D);
    args.epilogue.dD = Stride{L.ldd, cute::_1{}, int64_t(0)};
    args.hw_info.device_id = 0;
    args.hw_info.sm_count = sm_count(L.sm_count);
    using Raster = cutlass::gemm::kernel::detail::RasterOrderOptions;
    args.scheduler.max_swizzle_size = L.max_swizzle > 0 ? L.max_swizzle : 1;
    int32_t const raster = L.raster_order & kRasterMask;
    args.scheduler.raster_order = raster == 1 ? Raster::AlongM : raster == 2 ? Raster::AlongN : Raster::Heuristic;
    return args;
  }

  // Elements of the narrower of D and C in 16 bytes (1 where the kernel has neither: no tile goes through TMA).
  static constexpr int tma_row_elements() {
    int bits = 0;
    if constexpr (!cute::is_void_v<ElementD>) bits = cutlass::sizeof_bits<ElementD>::value;
    if constexpr (!cute::is_void_v<typename Cfg::ElementC>) {
      constexpr int c = cutlass::sizeof_bits<typename Cfg::ElementC>::value;
      bits = (bits == 0 || c < bits) ? c : bits;
    }
    return bits == 0 ? 1 : 128 / bits;
  }

  // CUTLASS's can_implement asks the contiguous extent N of D (and C) to be a multiple of 16 bytes, but TMA
  // needs only 16-byte aligned bases and row strides, which the runtime gives every output (rows padded to 16
  // bytes). Where N is not B's contiguous extent (B read K-major) and not such a multiple, CUTLASS's check
  // runs at N rounded up to one (the strides are still checked as given) and the fusion's own checks at the
  // true N too; any other N is checked exactly as CUTLASS does.
  static bool implementable(Arguments const& args) {
    constexpr int kAlign = tma_row_elements();
    int const N = cute::get<1>(args.problem_shape);
    if constexpr (cutlass::detail::is_major<0, typename CollectiveMainloop::StrideB>()) {
      return Kernel::can_implement(args);
    } else {
      if (N % kAlign == 0) return Kernel::can_implement(args);
      Arguments padded = args;
      cute::get<1>(padded.problem_shape) = (N + kAlign - 1) / kAlign * kAlign;
      return Kernel::can_implement(padded) &&
             CollectiveEpilogue::FusionCallbacks::can_implement(args.problem_shape, args.epilogue.thread);
    }
  }

  static constexpr bool kFinishesInKernel = epi::finishes_reductions<Fusion>::value;
  static constexpr int64_t kTileM = cute::size<0>(typename Cfg::TileShape{});
  static constexpr int64_t kTileN = cute::size<1>(typename Cfg::TileShape{});

  // The partial buffers, then (a fusion that can finish its reductions itself) one 64-bit counter per M-tile
  // and one per N-tile (last_tile.hpp).
  static size_t partials_bytes(ReductionList const& reductions, int64_t M, int64_t N) {
    size_t bytes = 0;
    for (int i = 0; i < reductions.count; ++i) {
      int64_t length, count;
      partial_extent<Cfg>(reductions.items[i], M, N, length, count);
      bytes += align_up(size_t(length * count) * sizeof(float));
    }
    if (kFinishesInKernel && reductions.count > 0) bytes += align_up(size_t(tile_counters(M, N)) * sizeof(uint64_t));
    return bytes;
  }
  static int64_t tile_counters(int64_t M, int64_t N) { return (M + kTileM - 1) / kTileM + (N + kTileN - 1) / kTileN; }

  static size_t gemm_workspace_bytes(CodaLaunch const& L) {
    return align_up(Kernel::get_workspace_size(gemm_arguments(L, FusionArguments{})));
  }

  // What a caller allocates for any launch of an M x N x K problem: the stream-K scheduler's workspace depends on
  // the launch's swizzle and raster (they set its grid and how it splits the last waves; at 8192 x 128256 x 4096 in
  // 128 x 256 tiles it needs none at swizzle 1 and some at 4), so the largest over every swizzle and raster a launch
  // may name (the persistent schedulers' workspace does not depend on them).
  static size_t workspace_size(int64_t M, int64_t N, int64_t K, ReductionList const& reductions) {
    CodaLaunch L{};
    L.M = M; L.N = N; L.K = K; L.lda = K; L.ldb = K; L.ldd = N;
    size_t gemm = 0;
    for (int32_t swizzle : {1, 2, 4, 8}) {
      for (int32_t raster : {0, 1, 2}) {
        L.max_swizzle = swizzle;
        L.raster_order = raster;
        size_t const bytes = gemm_workspace_bytes(L);
        if (bytes > gemm) gemm = bytes;
      }
    }
    return gemm + partials_bytes(reductions, M, N);
  }

  // One launch of the persistent kernel: the grid the tile scheduler asks for, the kernel's whole
  // shared memory, and the cluster shape as a launch attribute (a plain launch for 1x1 clusters).
  static cudaError_t launch(typename Kernel::Params const& params, cudaStream_t stream) {
    constexpr int kSmem = Kernel::SharedStorageSize;
    void const* entry = reinterpret_cast<void const*>(&cutlass::device_kernel<Kernel>);
    if constexpr (kSmem >= (48 << 10)) {
      cudaError_t e = cudaFuncSetAttribute(entry, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
      if (e != cudaSuccess) return e;
    }
    cudaLaunchConfig_t config{};
    config.gridDim = Kernel::get_grid_shape(params);
    config.blockDim = Kernel::get_block_shape();
    config.dynamicSmemBytes = kSmem;
    config.stream = stream;
    cudaLaunchAttribute cluster[1];
    constexpr unsigned kClusterM = cute::size<0>(typename Cfg::ClusterShape{});
    constexpr unsigned kClusterN = cute::size<1>(typename Cfg::ClusterShape{});
    if constexpr (kClusterM * kClusterN > 1) {
      cluster[0].id = cudaLaunchAttributeClusterDimension;
      cluster[0].val.clusterDim.x = kClusterM;
      cluster[0].val.clusterDim.y = kClusterN;
      cluster[0].val.clusterDim.z = 1;
      config.attrs = cluster;
      config.numAttrs = 1;
    }
    void* kernel_args[] = {const_cast<typename Kernel::Params*>(&params)};
    return cudaLaunchKernelExC(&config, entry, kernel_args);
  }

  template <class MakeFusionArgs>
  static int run(CodaLaunch const* L_ptr, void* stream_ptr, char* err, size_t err_len, MakeFusionArgs make_fusion,
                 ReductionList const& reductions) {
    auto fail = [&](int code, char const* what, char const* detail) {
      if (err && err_len) std::snprintf(err, err_len, "%s%s%s", what, detail ? ": " : "", detail ? detail : "");
      return code;
    };
    if (L_ptr == nullptr || L_ptr->abi_version != CODA_ABI_VERSION)
      return fail(CODA_ERROR_INVALID_ARGUMENT, "launch description is missing or has the wrong ABI version", nullptr);
    CodaLaunch const& L = *L_ptr;
    cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
    if (L.M <= 0 || L.N <= 0 || L.K <= 0)
      return fail(CODA_ERROR_INVALID_ARGUMENT, "M, N and K must be positive", nullptr);
    // this launch's own need (its swizzle, raster and CTA count), at most workspace_size()'s at one CTA per SM
    size_t const need = gemm_workspace_bytes(L) + partials_bytes(reductions, L.M, L.N);
    if (need > 0 && (L.workspace == nullptr || L.workspace_bytes < need))
      return fail(CODA_ERROR_WORKSPACE, "workspace too small", nullptr);

    // Carve the workspace: [GEMM workspace][partials of reduction 0][partials of reduction 1]...
    size_t gemm_ws = gemm_workspace_bytes(L);
    char* base = static_cast<char*>(L.workspace);
    float* partials[kMaxReductions] = {nullptr};
    size_t offset = gemm_ws;
    for (int i = 0; i < reductions.count; ++i) {
      int64_t length, count;
      partial_extent<Cfg>(reductions.items[i], L.M, L.N, length, count);
      partials[i] = reinterpret_cast<float*>(base + offset);
      offset += align_up(size_t(length * count) * sizeof(float));
    }

    bool const in_kernel = kFinishesInKernel && reductions.count > 0;   // KernelConfig(finalize="kernel")
    FinalizeBatch batch{};
    batch.n_items = reductions.count;
    for (int i = 0; i < reductions.count; ++i) {
      ReductionSpec const& r = reductions.items[i];
      FinalizeItem& item = batch.items[i];
      partial_extent<Cfg>(r, L.M, L.N, item.length, item.count);
      item.partials = partials[i];
      item.out = static_cast<float*>(L.slots[r.slot].ptr);
      item.n_out = r.axis == ReduceAxis::Rows ? L.M : L.N;
      item.combine = r.combine;
      item.axis = r.axis;
    }

    FusionArguments fusion = make_fusion(L, partials);
    if constexpr (kFinishesInKernel) {
      if (in_kernel) {   // else the partials are finished by the launch below
        epi::FinishReductionsArguments& finish = fusion.op_1;  // Sm90EVT<finishing node, body>: (body, node)
        finish.batch = batch;
        finish.epoch = next_epoch();
        finish.row_counters = reinterpret_cast<unsigned long long*>(base + offset);
        finish.col_counters = finish.row_counters + (L.M + kTileM - 1) / kTileM;
      }
    }
    Arguments args = gemm_arguments(L, fusion);
    if (!implementable(args))
      return fail(CODA_ERROR_CAN_IMPLEMENT, "CUTLASS can_implement rejected the problem", nullptr);
    cutlass::Status status = Kernel::initialize_workspace(args, gemm_ws ? base : nullptr, stream, nullptr);
    if (status != cutlass::Status::kSuccess)
      return fail(CODA_ERROR_INITIALIZE, "CUTLASS initialize failed", cutlassGetStatusString(status));
    typename Kernel::Params params = Kernel::to_underlying_arguments(args, gemm_ws ? base : nullptr);
    {
      constexpr int64_t kCm = cute::size<0>(typename Cfg::ClusterShape{}), kCn = cute::size<1>(typename Cfg::ClusterShape{});
      int64_t const ctas_m = (L.M + kTileM * kCm - 1) / (kTileM * kCm) * kCm;
      int64_t const ctas_n = (L.N + kTileN * kCn - 1) / (kTileN * kCn) * kCn;
      // CUTLASS caps the swizzle at 8 (wide_swizzle.cuh), and pads the grid along the raster (fitted_grid.cuh)
      if (L.max_swizzle >= kWideSwizzle) widen_swizzle(params.scheduler, uint32_t(ctas_m), uint32_t(ctas_n), 1u);
      if (!(L.raster_order & kPaddedGrid)) fit_grid(params.scheduler, uint32_t(ctas_m), uint32_t(ctas_n), 1u);
    }
    cudaError_t cuda_status = launch(params, stream);
    cudaError_t last = cudaGetLastError();  // read (and clear) in every case
    if (cuda_status == cudaSuccess) cuda_status = last;
    if (cuda_status != cudaSuccess)
      return fail(CODA_ERROR_LAUNCH, "GEMM launch failed", cudaGetErrorString(cuda_status));

    if (in_kernel) return CODA_OK;
    cuda_status = launch_finalize(batch, stream);
    if (cuda_status != cudaSuccess)
      return fail(CODA_ERROR_LAUNCH, "reduction finalize launch failed", cudaGetErrorString(cuda_status));
    return CODA_OK;
  }
};

}  // namespace coda::kernels

// Exports the plain-C entry points of one kernel translation unit: PREFIX_workspace_size and
// PREFIX_run (see coda/abi.h). JIT kernels use the prefix `coda`; libcoda names each op.
#define CODA_DEFINE_NAMED_ENTRY_POINTS(PREFIX, KERNEL, MAKE_FUSION_ARGS, REDUCTIONS)                \
  extern "C" size_t PREFIX##_workspace_size(int64_t M, int64_t N, int64_t K) {                      \
    return KERNEL::workspace_size(M, N, K, REDUCTIONS);                                             \
  }                                                                                                 \
  extern "C" int PREFIX##_run(const CodaLaunch* launch, void* stream, char* err, size_t err_len) {  \
    return KERNEL::run(launch, stream, err, err_len, MAKE_FUSION_ARGS, REDUCTIONS);                 \
  }

#define CODA_DEFINE_ENTRY_POINTS(KERNEL, MAKE_FUSION_ARGS, REDUCTIONS) \
  CODA_DEFINE_NAMED_ENTRY_POINTS(coda, KERNEL, MAKE_FUSION_ARGS, REDUCTIONS)
