// coda/kernels/sm90_cooperative_handoff.cuh — a persistent SM90 cooperative GEMM whose epilogue runs on
// warp groups of its own, under the next tile's MMAs.
//
// Why: in CUTLASS's cooperative kernel the two math warp groups finish a tile's MMAs and then run its
// epilogue together, so a tile costs mainloop + epilogue; in the ping-pong kernels one warp group's epilogue
// runs under the other's MMAs, but each warp group's MMAs are 64 rows tall and stop while its own epilogue
// runs. Here the two math warp groups only multiply: at the end of a tile each thread writes its accumulator
// fragment to shared memory and starts the next tile at once; two epilogue warp groups read the fragments
// back, thread for thread (epilogue thread t holds exactly what math thread t held), and run the
// cooperative epilogue on them. A tile costs about max(mainloop, epilogue), the mainloop in clusters with
// multicast operands, and the epilogue code is the overlap kernel's (OverlapEpilogue, 256 threads, one
// named barrier).
//
// Roles (640 threads): warp group 0 is the producer — warp 0 loads A and B, warp 1 the epilogue's tile
// inputs; warp groups 1 and 2 are the math warp groups (the cooperative TiledMma's 256 threads); warp
// groups 3 and 4 the epilogue warp groups. Each thread's fragment passes in kChunks chunks of 16-byte
// vectors (interleaved across threads: conflict-free) through two chunk buffers used in turn, each under two
// named barriers: "full" (math arrives after writing it, the epilogue waits) and "empty" (the epilogue
// arrives after reading it, math waits before writing it again). Two chunk buffers of a quarter tile each
// (32 KB at 128 x 128) leave the mainloop one 32 KB stage more than a whole tile's buffer would; while the
// epilogue reads one chunk the math warp groups write the next. Every role walks the same tiles of the
// static persistent scheduler.
//
// Registers: 640 threads leave 96 a thread at launch (61440 in all); the producer gives back down to 40,
// the epilogue warp groups take what that frees.
//
// The host side (Arguments, Params, workspace, grid, can_implement) is CUTLASS's cooperative kernel's,
// which this class derives from; SharedStorage, the block shape and operator() are its own.
#pragma once

#include "sm90_cutlass.cuh"
#include "sm90_epilogue_overlap.cuh"

namespace coda::kernels {

template <class ProblemShape_, class CollectiveMainloop_, class CollectiveEpilogue_, class TileScheduler_>
class CooperativeHandoffKernel
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

  static_assert(cute::is_base_of_v<cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                                   typename CollectiveMainloop::DispatchPolicy::Schedule>,
                "CooperativeHandoffKernel runs a cooperative mainloop");
  static_assert(!Base::IsSchedDynamicPersistent, "static persistent tile scheduler only (no CLC)");
  static_assert(!Base::IsMainloopAuxiliaryLoadNeeded, "no auxiliary mainloop loads");
  static_assert(!cutlass::gemm::kernel::detail::Has_SwapAB_v<CollectiveMainloop>, "no swapped A/B mainloops");
  static_assert(CollectiveEpilogue::RequiresTransactionBytes);

  static constexpr int kMathThreads = cute::size(TiledMma{});
  static_assert(kMathThreads == 256, "two math warp groups");
  static constexpr int kEpilogueThreads = kMathThreads;   // thread t of the epilogue mirrors math thread t
  static constexpr uint32_t MaxThreadsPerBlock = cutlass::NumThreadsPerWarpGroup + kMathThreads + kEpilogueThreads;
  static constexpr uint32_t MinBlocksPerMultiprocessor = 1;

  // Each math thread's accumulator fragment: TILE_M x TILE_N fp32 over 256 threads.
  static constexpr int kFragment = cute::size<0>(TileShape{}) * cute::size<1>(TileShape{}) / kMathThreads;
  static_assert(kFragment % 4 == 0, "fragments move in 16-byte vectors");
  static constexpr int kVectors = kFragment / 4;
  static constexpr int kChunks = 4;                       // chunks a fragment passes in
  static constexpr int kBuffers = 2;                      // chunk buffers, used in turn
  static_assert(kVectors % kChunks == 0 && kChunks % kBuffers == 0);
  static constexpr int kChunkVectors = kVectors / kChunks;

  // Register budgets (setmaxnreg): the launch gives every thread 96 (65536 / 640, in steps of 8); the
  // producer returns 56 of them, which the epilogue warp groups take (math stays at 96: a 128 x 128 tile's
  // 64 accumulators, the pipeline state and the operand descriptors).
  static constexpr uint32_t kLaunchRegisters = 96;
  static constexpr uint32_t kLoadRegisters = 40;
  static constexpr uint32_t kMathRegisters = 96;
  static constexpr uint32_t kEpilogueRegisters = 120;
  static_assert(kLoadRegisters + 2 * kMathRegisters + 2 * kEpilogueRegisters <= 5 * kLaunchRegisters,
                "the warp groups' registers exceed what the launch allocates");
  static_assert(kFragment <= 64, "a math thread's fragment must fit its 96 registers: TILE_M x TILE_N <= 128 x 128");

  // Named barriers: the epilogue's own (OverlapEpilogue syncs its 256 threads on it) and each chunk buffer's
  // full and empty (8, 9 and 10, 11).
  static constexpr uint32_t kEpilogueBarrier = uint32_t(cutlass::arch::ReservedNamedBarriers::EpilogueBarrier);
  static constexpr uint32_t kFullBarrier = uint32_t(cutlass::arch::ReservedNamedBarriers::FirstUserBarrier);
  static constexpr uint32_t kEmptyBarrier = kFullBarrier + kBuffers;
  static_assert(kEmptyBarrier + kBuffers <= 16, "16 hardware named barriers");
  static constexpr uint32_t kHandoffThreads = kMathThreads + kEpilogueThreads;

  // The epilogue producer warp starts after the mainloop warp has issued its first tile's loads.
  using LoadOrderBarrier = cutlass::OrderedSequenceBarrier<1, 2>;

  struct SharedStorage {
    struct Pipelines : cute::aligned_struct<16, cute::_1> {
      alignas(16) typename CollectiveMainloop::PipelineStorage mainloop;
      alignas(16) typename CollectiveEpilogue::PipelineStorage epi_load;
      alignas(16) typename LoadOrderBarrier::SharedStorage load_order;
    } pipelines;
    struct Tensors : cute::aligned_struct<128, cute::_1> {
      typename CollectiveEpilogue::TensorStorage epilogue;
      alignas(128) float4 accumulators[kBuffers][kChunkVectors * kMathThreads];   // [buffer][vector][thread]
      typename CollectiveMainloop::TensorStorage mainloop;
    } tensors;
  };
  static constexpr int SharedStorageSize = sizeof(SharedStorage);
  static constexpr int kHandoffBytes = int(sizeof(float4)) * kBuffers * kChunkVectors * kMathThreads;

  static dim3 get_block_shape() { return dim3(MaxThreadsPerBlock, 1, 1); }

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
    bool const is_producer = warp_group == 0;
    bool const is_math = warp_group == 1 || warp_group == 2;
    bool const is_epilogue = warp_group >= 3;
    bool const is_mainloop_warp = is_producer && warp_in_group == 0;
    bool const is_epi_load_warp = is_producer && warp_in_group == 1;
    // Thread t of the math warp groups and thread t of the epilogue warp groups handle the same fragment.
    int const team_thread = (thread_idx - cutlass::NumThreadsPerWarpGroup) % kMathThreads;
    uint32_t const block_rank = cute::block_rank_in_cluster();

    if (warp_idx == 0 && cute::elect_one_sync()) {
      CollectiveMainloop::prefetch_tma_descriptors(params.mainloop);
      CollectiveEpilogue::prefetch_tma_descriptors(params.epilogue);
    }

    // A/B ring: warp 0 produces, the math warp groups consume.
    typename MainloopPipeline::Params mainloop_params;
    if (is_mainloop_warp) mainloop_params.role = MainloopPipeline::ThreadCategory::Producer;
    if (is_math) mainloop_params.role = MainloopPipeline::ThreadCategory::Consumer;
    mainloop_params.is_leader = thread_idx % cutlass::NumThreadsPerWarpGroup == 0;
    mainloop_params.num_consumers = kMathThreads;
    mainloop_params.num_producers = Base::NumProducerThreads;
    mainloop_params.transaction_bytes = params.mainloop.tma_transaction_bytes;
    MainloopPipeline mainloop_pipeline(shared.pipelines.mainloop, mainloop_params, ClusterShape{});

    // Epilogue input ring: warp 1 produces, the epilogue warp groups consume.
    typename EpiLoadPipeline::Params epi_load_params;
    if (is_epi_load_warp) epi_load_params.role = EpiLoadPipeline::ThreadCategory::Producer;
    if (is_epilogue) epi_load_params.role = EpiLoadPipeline::ThreadCategory::Consumer;
    epi_load_params.dst_blockid = block_rank;
    epi_load_params.producer_arv_count = cutlass::NumThreadsPerWarp;
    epi_load_params.consumer_arv_count = kEpilogueThreads;
    epi_load_params.transaction_bytes = params.epilogue.tma_transaction_bytes;
    EpiLoadPipeline epi_load_pipeline(shared.pipelines.epi_load, epi_load_params);

    // TMA stores: per issuing thread (the epilogue's first warp), no shared state.
    typename EpiStorePipeline::Params epi_store_params;
    epi_store_params.always_wait = true;
    EpiStorePipeline epi_store_pipeline(epi_store_params);

    typename LoadOrderBarrier::Params load_order_params;
    load_order_params.group_id = is_mainloop_warp ? 0 : 1;
    load_order_params.group_size = cutlass::NumThreadsPerWarp;
    LoadOrderBarrier load_order(shared.pipelines.load_order, load_order_params);

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
    CollectiveEpilogue collective_epilogue(params.epilogue, shared.tensors.epilogue, kEpilogueBarrier);
    auto load_inputs = collective_mainloop.load_init(problem_shape_MNKL, params.mainloop);
    Tensor gA_mkl = get<0>(load_inputs);
    Tensor gB_nkl = get<1>(load_inputs);
    auto const k_tiles = size<3>(gA_mkl);

    auto tile_coord = [&](auto const& work) CUTLASS_LAMBDA_FUNC_INLINE {
      return make_coord(idx2crd(work.M_idx, shape<2>(gA_mkl)), idx2crd(work.N_idx, shape<2>(gB_nkl)), _,
                        idx2crd(work.L_idx, shape<4>(gB_nkl)));
    };

    TileScheduler scheduler{params.scheduler};
    auto work = scheduler.initial_work_tile_info(ClusterShape{});
    auto next_work = [&]() CUTLASS_LAMBDA_FUNC_INLINE {
      scheduler.advance_to_next_work();
      return scheduler.get_current_work();
    };
    // Chunk c of every tile goes through buffer c % kBuffers (this thread's column of vectors in it); `chunk`
    // counts the chunks a role has passed, over all tiles.
    auto handoff = [&](int b) CUTLASS_LAMBDA_FUNC_INLINE { return shared.tensors.accumulators[b] + team_thread; };
    int chunk = 0;

    if (is_producer) {
      cutlass::arch::warpgroup_reg_dealloc<kLoadRegisters>();
      if (is_mainloop_warp) {
        cutlass::arch::wait_on_dependent_grids();
        bool first_tile = true;
        while (work.is_valid()) {
          auto k_tile_iter = cute::make_coord_iterator(shape<3>(gA_mkl));
          collective_mainloop.load(params.mainloop, mainloop_pipeline, mainloop_produce, load_inputs, tile_coord(work),
                                   k_tile_iter, k_tiles, lane_idx, block_rank, shared.tensors.mainloop);
          mainloop_produce.advance(k_tiles);
          if (first_tile) {   // the epilogue loader may start now
            load_order.arrive();
            first_tile = false;
          }
          work = next_work();
        }
        collective_mainloop.load_tail(mainloop_pipeline, mainloop_produce);
      } else if (is_epi_load_warp && collective_epilogue.is_producer_load_needed()) {
        cutlass::arch::wait_on_dependent_grids();
        if (work.is_valid()) load_order.wait();
        while (work.is_valid()) {
          epi_load_produce = collective_epilogue.load(epi_load_pipeline, epi_load_produce, problem_shape_MNKL,
                                                      blk_shape, tile_coord(work), tiled_mma, lane_idx,
                                                      shared.tensors.epilogue);
          work = next_work();
        }
        collective_epilogue.load_tail(epi_load_pipeline, epi_load_produce);
      }
    } else if (is_math) {
      if constexpr (kMathRegisters > kLaunchRegisters) cutlass::arch::warpgroup_reg_alloc<kMathRegisters>();
      while (work.is_valid()) {
        Tensor accumulators = partition_fragment_C(tiled_mma, take<0, 2>(blk_shape));
        static_assert(decltype(size(accumulators))::value == kFragment);
        collective_mainloop.mma(mainloop_pipeline, mainloop_consume, accumulators, k_tiles, team_thread,
                                shared.tensors.mainloop, params.mainloop);
        collective_mainloop.mma_tail(mainloop_pipeline, mainloop_consume, k_tiles);
        mainloop_consume.advance(k_tiles);
        CUTLASS_PRAGMA_UNROLL
        for (int c = 0; c < kChunks; ++c, ++chunk) {
          int const b = c % kBuffers;
          if (chunk >= kBuffers) named_barrier_sync(kEmptyBarrier + b, kHandoffThreads);   // its last chunk read
          float4* const out = handoff(b);
          CUTLASS_PRAGMA_UNROLL
          for (int v = 0; v < kChunkVectors; ++v) {
            int const i = 4 * (c * kChunkVectors + v);
            out[v * kMathThreads] = make_float4(accumulators(i), accumulators(i + 1), accumulators(i + 2),
                                                accumulators(i + 3));
          }
          named_barrier_arrive(kFullBarrier + b, kHandoffThreads);
        }
        work = next_work();
      }
    } else {   // epilogue warp groups
      cutlass::arch::warpgroup_reg_alloc<kEpilogueRegisters>();
      while (work.is_valid()) {
        auto blk_coord = tile_coord(work);
        Tensor accumulators = partition_fragment_C(tiled_mma, take<0, 2>(blk_shape));
        work = next_work();
        bool const last_tile = !work.is_valid();
        CUTLASS_PRAGMA_UNROLL
        for (int c = 0; c < kChunks; ++c, ++chunk) {
          int const b = c % kBuffers;
          named_barrier_sync(kFullBarrier + b, kHandoffThreads);   // the math warp groups wrote this chunk
          float4 const* const in = handoff(b);
          CUTLASS_PRAGMA_UNROLL
          for (int v = 0; v < kChunkVectors; ++v) {
            int const i = 4 * (c * kChunkVectors + v);
            float4 const x = in[v * kMathThreads];
            accumulators(i) = x.x;
            accumulators(i + 1) = x.y;
            accumulators(i + 2) = x.z;
            accumulators(i + 3) = x.w;
          }
          // The buffer is free again: math waits for this only where it writes another chunk there (every
          // arrive has its wait: none for the last tile's last kBuffers chunks).
          if (!last_tile || c < kChunks - kBuffers) named_barrier_arrive(kEmptyBarrier + b, kHandoffThreads);
        }
        auto [load_next, store_next] = collective_epilogue.store(
            epi_load_pipeline, epi_load_consume, epi_store_pipeline, epi_store_produce, problem_shape_MNKL, blk_shape,
            blk_coord, accumulators, tiled_mma, team_thread, shared.tensors.epilogue);
        epi_load_consume = load_next;
        epi_store_produce = store_next;
      }
      // Drain the TMA stores before the CTA's shared memory goes away.
      collective_epilogue.store_tail(epi_load_pipeline, epi_load_consume, epi_store_pipeline, epi_store_produce);
    }
#else
    if (threadIdx.x == 0) printf("CooperativeHandoffKernel: built without sm_90a features\n");
#endif
  }
};

}  // namespace coda::kernels
