// coda/kernels/config.cuh — the fixed SM90 GEMM configuration every coda_ext kernel uses.
//
// A (M, K) and B = W (N, K) are K-contiguous (torch.nn.Linear's layout) unless AMajorM / BMajorN
// make M of A / N of B the contiguous dimension (transposed views: the backward GEMMs read
// operands as they are stored); D (M, N) is row-major. Accumulation and epilogue math are fp32. What varies per kernel is the tile,
// the cluster, the schedule (cooperative or ping-pong) and the epilogue graph.
#pragma once

#include "sm90_cutlass.cuh"

namespace coda::kernels {

// A schedule names the mainloop and epilogue policies and the persistent tile scheduler.
struct Cooperative {
  using Mainloop = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using Epilogue = cutlass::epilogue::TmaWarpSpecializedCooperative;
  using TileScheduler = cutlass::gemm::PersistentScheduler;
  static constexpr int kEpilogueThreads = 256;
  static constexpr bool kOverlapEpilogues = false;
  static constexpr bool kHandoff = false;
};
struct Pingpong {
  using Mainloop = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
  using Epilogue = cutlass::epilogue::TmaWarpSpecialized;
  using TileScheduler = cutlass::gemm::PersistentScheduler;
  static constexpr int kEpilogueThreads = 128;
  static constexpr bool kOverlapEpilogues = false;
  static constexpr bool kHandoff = false;
};
// Ping-pong whose two math warp groups' epilogues may overlap (only their MMAs stay ordered): the
// project's own kernel (sm90_pingpong_overlap.cuh), each warp group with its own epilogue shared memory,
// load pipeline and named barrier. OrderEpilogues = true orders the epilogues again, for debugging (its
// results must be bit-identical).
template <bool OrderEpilogues>
struct PingpongOverlapT : Pingpong {
  static constexpr bool kOverlapEpilogues = true;
  static constexpr bool kOrderEpilogues = OrderEpilogues;
};
using PingpongOverlap = PingpongOverlapT<false>;
using PingpongOverlapOrdered = PingpongOverlapT<true>;
// Cooperative MMAs whose epilogue runs on two warp groups of its own (the project's kernel,
// sm90_cooperative_handoff.cuh): each tile's accumulators pass through shared memory, and the epilogue
// of a tile runs under the next tile's MMAs. TILE_M x TILE_N <= 128 x 128 (the math threads' registers).
struct CooperativeHandoff : Cooperative {
  static constexpr bool kHandoff = true;
};
// Cooperative with the stream-K scheduler, for problems with too few output tiles to fill the
// GPU (small M, long K): the K loop of a tile is split across CTAs, their fp32 partial
// accumulators meet in the GEMM workspace in a fixed order (deterministic), and the epilogue
// runs once per output tile, after its last split.
struct CooperativeStreamK : Cooperative {
  using TileScheduler = cutlass::gemm::StreamKScheduler;
};

template <
  class ElementAB_,     // cutlass::bfloat16_t or cutlass::half_t (A and W)
  class ElementD_,      // element of the main output D; void: the graph writes no D
  int TileM, int TileN, int TileK,
  int ClusterM, int ClusterN,
  class Schedule_,      // Cooperative, Pingpong, CooperativeStreamK, PingpongOverlap(Ordered), CooperativeHandoff
  int EpiTileM = 0,     // epilogue subtile (0, 0): CUTLASS's choice (128x32 cooperative, 64x32 ping-pong)
  int EpiTileN = 0,
  bool AMajorM = false, // A (M, K) with M contiguous
  bool BMajorN = false, // B (N, K) with N contiguous
  int EpiStagesC = 0,   // shared-memory stages of the epilogue's TMA loads (tile inputs) and of D and
  int EpiStagesD = 0    // the TMA stores; 0: CUTLASS's choice (C: min(subtiles, 4), D: min(subtiles, 2))
>
struct Config {
  using ElementAB = ElementAB_;
  using ElementD = ElementD_;
  // The element of D's shared-memory staging buffer (without a D, the operands'; reductions use
  // the buffer as scratch, and CUTLASS takes it from the fusion: epi::WithoutD).
  using ElementDStaging = cute::conditional_t<cute::is_void_v<ElementD_>, ElementAB_, ElementD_>;
  static constexpr bool kHasD = !cute::is_void_v<ElementD_>;
  using ElementC = void;  // no C operand: tile inputs are epilogue aux loads
  using ElementAccumulator = float;
  using ElementCompute = float;
  using Schedule = Schedule_;
  using TileShape = cute::Shape<cute::Int<TileM>, cute::Int<TileN>, cute::Int<TileK>>;
  using ClusterShape = cute::Shape<cute::Int<ClusterM>, cute::Int<ClusterN>, cute::_1>;
  using LayoutA = cute::conditional_t<AMajorM, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  using LayoutB = cute::conditional_t<BMajorN, cutlass::layout::RowMajor, cutlass::layout::ColumnMajor>;
  using LayoutD = cutlass::layout::RowMajor;     // (M, N), N contiguous
  using EpilogueTileType = cute::conditional_t<(EpiTileM > 0 && EpiTileN > 0),
      cute::Shape<cute::Int<(EpiTileM > 0 ? EpiTileM : 1)>, cute::Int<(EpiTileN > 0 ? EpiTileN : 1)>>,
      cutlass::epilogue::collective::EpilogueTileAuto>;
  using AutoEpilogueDescriptor = cutlass::epilogue::collective::detail::EpilogueDescriptor<
      TileShape, EpilogueTileType, ElementC, ElementDStaging, typename Schedule::Epilogue>;
  // The epilogue's subtile and pipeline stages, read by the collective (epilogue_gemm.cuh) and by every
  // TMA tile load and store node (their stage counts must be the collective's). CUTLASS's descriptor
  // unless EpiStagesC/EpiStagesD say otherwise: deeper load stages let the producer warp fetch more of a
  // tile's inputs while the mainloop still runs, so fewer loads wait in the epilogue.
  struct EpilogueDescriptor {
    using TileShape = Config::TileShape;
    using EpilogueTile = typename AutoEpilogueDescriptor::EpilogueTile;
    using AutoPolicy = typename AutoEpilogueDescriptor::DispatchPolicy;
    static constexpr int StagesC = EpiStagesC > 0 ? EpiStagesC : AutoPolicy::StagesC;
    static constexpr int StagesD = EpiStagesD > 0 ? EpiStagesD : AutoPolicy::StagesD;
    using DispatchPolicy = cutlass::epilogue::Sm90TmaWarpSpecialized<
        StagesC, StagesD, AutoPolicy::FragmentSize, AutoPolicy::ReuseSmemC, AutoPolicy::DelayTmaStore>;
  };
  static constexpr bool kEpilogueStagesSet = EpiStagesC > 0 || EpiStagesD > 0;
  static constexpr int kAlignmentAB = 128 / cutlass::sizeof_bits<ElementAB>::value;
  static constexpr int kAlignmentD = 128 / cutlass::sizeof_bits<ElementDStaging>::value;
  // Stride types (M/N, K or N, L) with a unit inner stride and a runtime leading stride.
  using StrideRowMajor = cute::Stride<int64_t, cute::_1, int64_t>;
  using StrideMajorMN = cute::Stride<cute::_1, int64_t, int64_t>;   // (M or N, K) with M or N contiguous
  using StrideA = cute::conditional_t<AMajorM, StrideMajorMN, StrideRowMajor>;
  using StrideB = cute::conditional_t<BMajorN, StrideMajorMN, StrideRowMajor>;
  // An operand's stride from its leading (non-unit) stride.
  template <class Stride>
  static Stride operand_stride(int64_t ld) {
    if constexpr (cute::is_same_v<Stride, StrideMajorMN>) return Stride{cute::_1{}, ld, int64_t(0)};
    else return Stride{ld, cute::_1{}, int64_t(0)};
  }
  using RowVectorStride = cute::Stride<cute::_0, cute::_1, int64_t>;  // length N, broadcast over M
  using ColVectorStride = cute::Stride<cute::_1, cute::_0, int64_t>;  // length M, broadcast over N
  using ScalarStride = cute::Stride<cute::_0, cute::_0, int64_t>;
};

}  // namespace coda::kernels
