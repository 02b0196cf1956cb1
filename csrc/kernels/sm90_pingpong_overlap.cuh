// coda/kernels/sm90_pingpong_overlap.cuh — a persistent SM90 ping-pong GEMM whose two consumer warp groups'
// epilogues may run at the same time.
//
// Why: CUTLASS's ping-pong kernel orders the two math warp groups twice per tile, once for the MMA and
// once for the epilogue, so a tile costs max(mainloop, epilogue). With a short K (GPT-2's 768) a fused
// epilogue (GELU, GELU backward with a column reduction) is longer than the mainloop, and the tensor cores
// wait. Here only the MMA is ordered (warp group 0's MMA, then warp group 1's, ...); each warp group owns
// its epilogue's shared memory (staging buffers, aux tiles, row-broadcast slices), its epilogue load
// pipeline, its named barrier (OverlapEpilogue) and its TMA-store groups, so the epilogues need no order:
// a tile costs about max(mainloop, (mainloop + epilogue) / 2). A tile's TMA stores stay in flight under the
// group's next MMA (each staging stage is acquired before it is written again); the group drains them once,
// after its last tile.
//
// Roles (384 threads): warp group 0 is the producer — warp 0 loads A and B for every tile of the CTA,
// warp 2 loads the epilogue inputs of math group 0's tiles (the CTA's even tiles: 0, 2, 4, ...), warp 3
// those of math group 1's (odd tiles); warp 1 idles. Warp groups 1 and 2 of the CTA are math groups 0 and
// 1, the consumers. Each pipeline state advances only over the tiles of its math group, except the
// mainloop's, whose ring both share (as in CUTLASS's ping-pong kernel).
//
// The host side (Arguments, Params, workspace, grid, can_implement) is CUTLASS's ping-pong kernel's, which
// this class derives from; SharedStorage and operator() are its own. OrderEpilogues = true orders the
// epilogues again as CUTLASS does (with the private buffers kept): a debugging switch whose results must
// be bit-identical to the overlapping kernel's.
#pragma once

#include "sm90_cutlass.cuh"
#include "sm90_epilogue_overlap.cuh"

namespace coda::kernels {

template <class ProblemShape_, class CollectiveMainloop_, class CollectiveEpilogue_, class TileScheduler_,
          bool OrderEpilogues>
class PingpongOverlapKernel
    : public cutlass::gemm::kernel::GemmUniversal<ProblemShape_, CollectiveMainloop_, CollectiveEpilogue_, TileScheduler_> {
 public:
  using Base = cutlass::gemm::kernel::GemmUniversal<ProblemShape_, CollectiveMainloop_, CollectiveEpilogue_, TileScheduler_>;
  using CollectiveMainloop = CollectiveMainloop_;
  using CollectiveEpilogue = CollectiveEpilogue_;
  using typename Base::Arguments;
  using typename Base::ClusterShape;
  using typename Base::Params;
  using typename Base::TileScheduler;
  using typename Base::TiledMma;
  using typename Base::TileShape;
  using MainloopPipeline = typename CollectiveMainloop::MainloopPipeline;
  using EpiLoadPipeline = typename CollectiveEpilogue::LoadPipeline;
  using EpiStorePipeline = typename CollectiveEpilogue::StorePipeline;

  static_assert(cute::is_base_of_v<cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                                   typename CollectiveMainloop::DispatchPolicy::Schedule>,
                "PingpongOverlapKernel runs a ping-pong mainloop");
  static_assert(!Base::IsSchedDynamicPersistent, "static persistent tile scheduler only (no CLC)");
  static_assert(!Base::IsMainloopAuxiliaryLoadNeeded, "producer warp 3 loads epilogue inputs: no auxiliary mainloop loads");
  static_assert(!cutlass::gemm::kernel::detail::Has_SwapAB_v<CollectiveMainloop>, "no swapped A/B mainloops");
  static_assert(CollectiveEpilogue::RequiresTransactionBytes);

  static constexpr int kMathGroups = 2;
  // The math warp groups' order: depth 1, the MMA only; depth 2 (OrderEpilogues), the MMA and the epilogue.
  using MathOrderBarrier = cutlass::OrderedSequenceBarrier<OrderEpilogues ? 2 : 1, kMathGroups>;
  // The epilogue producer warps start after the mainloop warp has issued its first tile's loads.
  using LoadOrderBarrier = cutlass::OrderedSequenceBarrier<1, 2>;

  struct SharedStorage {
    struct Pipelines : cute::aligned_struct<16, cute::_1> {
      alignas(16) typename CollectiveMainloop::PipelineStorage mainloop;
      alignas(16) typename CollectiveEpilogue::PipelineStorage epi_load[kMathGroups];
      alignas(16) typename MathOrderBarrier::SharedStorage math_order;
      alignas(16) typename LoadOrderBarrier::SharedStorage load_order;
    } pipelines;
    struct Tensors : cute::aligned_struct<128, cute::_1> {
      typename CollectiveEpilogue::TensorStorage epilogue[kMathGroups];   // one per math warp group
      typename CollectiveMainloop::TensorStorage mainloop;
    } tensors;
  };
  static constexpr int SharedStorageSize = sizeof(SharedStorage);

  CUTLASS_DEVICE
  void operator()(Params const& params, char* smem_buf) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using namespace cute;
    SharedStorage& shared = *reinterpret_cast<SharedStorage*>(smem_buf);

    int const thread_idx = int(threadIdx.x);
    int const lane_idx = cutlass::canonical_lane_idx();
    int const warp_idx = cutlass::canonical_warp_idx_sync();
    int const warp_group = cutlass::canonical_warp_group_idx();
    int const warp_in_group = warp_idx % cutlass::NumWarpsPerWarpGroup;
    int const group_thread = thread_idx % cutlass::NumThreadsPerWarpGroup;
    bool const is_producer = warp_group == 0;
    bool const is_mainloop_warp = is_producer && warp_in_group == 0;
    bool const is_epi_load_warp = is_producer && warp_in_group >= 2;
    // The math warp group whose tiles this thread handles: its own (consumers), the one it loads for
    // (epilogue producer warps 2 and 3); 0 for the other producer warps (unused).
    int const group = is_producer ? (is_epi_load_warp ? warp_in_group - 2 : 0) : warp_group - 1;
    uint32_t const block_rank = cute::block_rank_in_cluster();

    if (warp_idx == 0 && cute::elect_one_sync()) {
      CollectiveMainloop::prefetch_tma_descriptors(params.mainloop);
      CollectiveEpilogue::prefetch_tma_descriptors(params.epilogue);
    }

    // A/B ring: warp 0 produces, both math warp groups consume (alternating tiles).
    typename MainloopPipeline::Params mainloop_params;
    if (is_mainloop_warp) mainloop_params.role = MainloopPipeline::ThreadCategory::Producer;
    if (!is_producer) mainloop_params.role = MainloopPipeline::ThreadCategory::Consumer;
    mainloop_params.is_leader = group_thread == 0;
    mainloop_params.num_consumers = cutlass::NumThreadsPerWarpGroup;
    mainloop_params.num_producers = Base::NumProducerThreads;
    mainloop_params.transaction_bytes = params.mainloop.tma_transaction_bytes;
    MainloopPipeline mainloop_pipeline(shared.pipelines.mainloop, mainloop_params, ClusterShape{});

    // One epilogue load ring per math warp group: producer warp 2 + group fills it, the group drains it.
    // Warp 0 initialises both rings' barriers; each thread then holds the ring of its own group.
    typename EpiLoadPipeline::Params epi_load_params;
    epi_load_params.dst_blockid = block_rank;
    epi_load_params.producer_arv_count = cutlass::NumThreadsPerWarp;
    epi_load_params.consumer_arv_count = cutlass::NumThreadsPerWarpGroup;
    epi_load_params.transaction_bytes = params.epilogue.tma_transaction_bytes;
    EpiLoadPipeline::init_barriers(shared.pipelines.epi_load[0], epi_load_params);
    EpiLoadPipeline::init_barriers(shared.pipelines.epi_load[1], epi_load_params);
    if (is_epi_load_warp) epi_load_params.role = EpiLoadPipeline::ThreadCategory::Producer;
    if (!is_producer) epi_load_params.role = EpiLoadPipeline::ThreadCategory::Consumer;
    EpiLoadPipeline epi_load_pipeline(shared.pipelines.epi_load[group], epi_load_params, cute::false_type{});

    // TMA stores: per issuing thread (warp 0 of each math group), no shared state.
    typename EpiStorePipeline::Params epi_store_params;
    epi_store_params.always_wait = true;
    EpiStorePipeline epi_store_pipeline(epi_store_params);

    typename LoadOrderBarrier::Params load_order_params;
    load_order_params.group_id = is_mainloop_warp ? 0 : 1;
    load_order_params.group_size = cutlass::NumThreadsPerWarp;
    LoadOrderBarrier load_order(shared.pipelines.load_order, load_order_params);

    typename MathOrderBarrier::Params math_order_params;
    math_order_params.group_id = is_producer ? 0 : warp_group - 1;
    math_order_params.group_size = cutlass::NumThreadsPerWarpGroup;
    MathOrderBarrier math_order(shared.pipelines.math_order, math_order_params);

    typename CollectiveMainloop::PipelineState mainloop_consume;
    auto mainloop_produce = cutlass::make_producer_start_state<MainloopPipeline>();
    typename CollectiveEpilogue::LoadPipelineState epi_load_consume;
    auto epi_load_produce = cutlass::make_producer_start_state<EpiLoadPipeline>();
    auto epi_store_produce = cutlass::make_producer_start_state<EpiStorePipeline>();

    // Barrier initialisation visible to every thread (and CTA of the cluster) before first use.
    if constexpr (size(ClusterShape{}) > 1) {
      cute::cluster_arrive_relaxed();
      cute::cluster_wait();
    } else {
      __syncthreads();
    }

    auto problem_shape_MNKL = append<4>(params.problem_shape, Int<1>{});
    TiledMma tiled_mma;
    auto blk_shape = TileShape{};
    CollectiveMainloop collective_mainloop;
    CollectiveEpilogue collective_epilogue(params.epilogue, shared.tensors.epilogue[group],
                                           overlap_epilogue_barrier(group));
    auto load_inputs = collective_mainloop.load_init(problem_shape_MNKL, params.mainloop);
    Tensor gA_mkl = get<0>(load_inputs);
    Tensor gB_nkl = get<1>(load_inputs);
    auto const k_tiles = size<3>(gA_mkl);

    auto tile_coord = [&](auto const& work) CUTLASS_LAMBDA_FUNC_INLINE {
      return make_coord(idx2crd(work.M_idx, shape<2>(gA_mkl)), idx2crd(work.N_idx, shape<2>(gB_nkl)), _,
                        idx2crd(work.L_idx, shape<4>(gB_nkl)));
    };

    // Group 1 (and warp 3, its epilogue loader) start at the CTA's second tile; every group steps by two.
    TileScheduler scheduler{params.scheduler};
    bool const takes_odd_tiles = !is_mainloop_warp && group == 1;
    if (takes_odd_tiles) scheduler.advance_to_next_work();
    auto work = scheduler.initial_work_tile_info(ClusterShape{});

    if (is_producer) {
      cutlass::arch::warpgroup_reg_dealloc<Base::LoadRegisterRequirement>();
      if (is_mainloop_warp) {
        cutlass::arch::wait_on_dependent_grids();
        bool first_tile = true;
        while (work.is_valid()) {
          auto k_tile_iter = cute::make_coord_iterator(shape<3>(gA_mkl));
          collective_mainloop.load(params.mainloop, mainloop_pipeline, mainloop_produce, load_inputs, tile_coord(work),
                                   k_tile_iter, k_tiles, lane_idx, block_rank, shared.tensors.mainloop);
          mainloop_produce.advance(k_tiles);
          if (first_tile) {   // the epilogue loaders may start now
            load_order.arrive();
            first_tile = false;
          }
          scheduler.advance_to_next_work();
          work = scheduler.get_current_work();
        }
        collective_mainloop.load_tail(mainloop_pipeline, mainloop_produce);
      } else if (is_epi_load_warp && collective_epilogue.is_producer_load_needed()) {
        cutlass::arch::wait_on_dependent_grids();
        bool first_tile = true;
        while (work.is_valid()) {
          if (first_tile) {
            load_order.wait();
            first_tile = false;
          }
          epi_load_produce = collective_epilogue.load(epi_load_pipeline, epi_load_produce, problem_shape_MNKL,
                                                      blk_shape, tile_coord(work), tiled_mma, lane_idx,
                                                      shared.tensors.epilogue[group]);
          scheduler.advance_to_next_work(kMathGroups);
          work = scheduler.get_current_work();
        }
        collective_epilogue.load_tail(epi_load_pipeline, epi_load_produce);
      }
    } else {
      cutlass::arch::warpgroup_reg_alloc<Base::MmaRegisterRequirement>();
#ifdef CUTLASS_ENABLE_GDC_FOR_SM90
      if (!work.is_valid()) {   // nothing for this group: let a dependent grid start early
        cutlass::arch::launch_dependent_grids();
        return;
      }
#endif
      if (group == 1) mainloop_consume.advance(k_tiles);   // the mainloop ring holds group 0's tile first
      while (work.is_valid()) {
        auto blk_coord = tile_coord(work);
        Tensor accumulators = partition_fragment_C(tiled_mma, take<0, 2>(blk_shape));

        math_order.wait();   // the other group's MMA of the previous tile has been issued
        collective_mainloop.mma(mainloop_pipeline, mainloop_consume, accumulators, k_tiles, group_thread,
                                shared.tensors.mainloop, params.mainloop);
        math_order.arrive();
        collective_mainloop.mma_tail(mainloop_pipeline, mainloop_consume, k_tiles);
        mainloop_consume.advance(k_tiles * kMathGroups);   // skip the other group's tile
#ifdef CUTLASS_ENABLE_GDC_FOR_SM90
        if (scheduler.is_last_tile(work, kMathGroups)) cutlass::arch::launch_dependent_grids();
#endif
        if constexpr (OrderEpilogues) math_order.wait();
        auto [load_next, store_next] = collective_epilogue.store(
            epi_load_pipeline, epi_load_consume, epi_store_pipeline, epi_store_produce, problem_shape_MNKL, blk_shape,
            blk_coord, accumulators, tiled_mma, group_thread, shared.tensors.epilogue[group]);
        epi_load_consume = load_next;
        epi_store_produce = store_next;
        if constexpr (OrderEpilogues) {
          // CUTLASS's order: this tile's TMA stores drained before the other group's epilogue starts.
          auto [load_after, store_after] =
              collective_epilogue.store_tail(epi_load_pipeline, epi_load_consume, epi_store_pipeline, epi_store_produce);
          epi_load_consume = load_after;
          epi_store_produce = store_after;
          math_order.arrive();
        }
        // Overlapping: this group's stores stay in flight under its next tile's MMA. Its staging buffers are
        // its own, and store() acquires each stage (waits for the store that last read it) before writing it.

        scheduler.advance_to_next_work(kMathGroups);
        work = scheduler.get_current_work();
      }
      // Drain this group's TMA stores before the CTA's shared memory goes away.
      if constexpr (!OrderEpilogues) {
        collective_epilogue.store_tail(epi_load_pipeline, epi_load_consume, epi_store_pipeline, epi_store_produce);
      }
    }
#else
    if (threadIdx.x == 0) printf("PingpongOverlapKernel: built without sm_90a features\n");
#endif
  }
};

}  // namespace coda::kernels
