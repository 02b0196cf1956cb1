// coda/kernels/sm90_epilogue_overlap.cuh — the epilogue collective of the overlapping ping-pong kernel
// (sm90_pingpong_overlap.cuh).
//
// Why: CUTLASS's SM90 TMA warp-specialized epilogue synchronises a warp group's shared-memory traffic (the
// fence -> barrier -> TMA store handshake, the reductions' sync_fn, the row broadcasts' begin sync) on one
// fixed hardware named barrier (ReservedNamedBarriers::EpilogueBarrier). Two warp groups whose epilogues
// run at the same time would meet on that barrier and complete it with a mix of each other's warps. This
// collective derives from CUTLASS's (its arguments, params, TMA descriptors, host checks, the producer
// warp's load() and the store_tail() are CUTLASS's) and replaces store() with a loop of the same shape whose
// barrier is chosen at run time, one per consumer warp group: both warp groups run one copy of the code.
//
// Restricted by static_assert to what coda_ext builds: no C operand (tile inputs are aux loads), so no
// shared-memory reuse of C, no register-to-register copy before the shared-memory store, no im2col, and
// the whole tile per call (no single-subtile mode).
#pragma once

#include "sm90_cutlass.cuh"

namespace coda::kernels {

// The hardware named barriers of the two consumer warp groups' epilogues: CUTLASS's epilogue barrier for
// warp group 0, the first ID CUTLASS leaves to users for warp group 1. Neither the SS mainloop nor the
// persistent ping-pong kernel uses a named barrier; no coda_ext epilogue node uses one of its own.
CUTLASS_HOST_DEVICE constexpr uint32_t overlap_epilogue_barrier(int group) {
  return group == 0 ? uint32_t(cutlass::arch::ReservedNamedBarriers::EpilogueBarrier)
                    : uint32_t(cutlass::arch::ReservedNamedBarriers::FirstUserBarrier);
}

// bar.sync on a barrier whose ID is a register value (PTX allows it): `threads` threads, a multiple of 32.
CUTLASS_DEVICE void named_barrier_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;" : : "r"(id), "r"(threads) : "memory");
}

// bar.arrive on a barrier whose ID is a register value: `threads` threads take part in all, this one not waiting.
CUTLASS_DEVICE void named_barrier_arrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;" : : "r"(id), "r"(threads) : "memory");
}

// OverlapEpilogue<C>: the collective C that CUTLASS's builder made (an Sm90TmaWarpSpecialized epilogue),
// with store() taking its named barrier from the constructor.
template <class BuiltCollective>
struct OverlapEpilogue;

template <int StagesC_, int StagesD_, int FragmentSize_, bool ReuseSmemC_, bool DelayTmaStore_, class CtaTileMNK_,
          class EpilogueTile_, class ElementC_, class StrideC_, class ElementD_, class StrideD_, class FusionCallbacks_,
          class CopyOpG2S_, class SmemLayoutAtomC_, class CopyOpS2R_, class CopyOpS2G_, class SmemLayoutAtomD_,
          class CopyOpR2S_, class CopyAtomC_, class CopyOpR2R_>
struct OverlapEpilogue<cutlass::epilogue::collective::CollectiveEpilogue<
    cutlass::epilogue::Sm90TmaWarpSpecialized<StagesC_, StagesD_, FragmentSize_, ReuseSmemC_, DelayTmaStore_>,
    CtaTileMNK_, EpilogueTile_, ElementC_, StrideC_, ElementD_, StrideD_, FusionCallbacks_, CopyOpG2S_,
    SmemLayoutAtomC_, CopyOpS2R_, CopyOpS2G_, SmemLayoutAtomD_, CopyOpR2S_, CopyAtomC_, CopyOpR2R_>>
    : cutlass::epilogue::collective::CollectiveEpilogue<
          cutlass::epilogue::Sm90TmaWarpSpecialized<StagesC_, StagesD_, FragmentSize_, ReuseSmemC_, DelayTmaStore_>,
          CtaTileMNK_, EpilogueTile_, ElementC_, StrideC_, ElementD_, StrideD_, FusionCallbacks_, CopyOpG2S_,
          SmemLayoutAtomC_, CopyOpS2R_, CopyOpS2G_, SmemLayoutAtomD_, CopyOpR2S_, CopyAtomC_, CopyOpR2R_> {
  using Base = cutlass::epilogue::collective::CollectiveEpilogue<
      cutlass::epilogue::Sm90TmaWarpSpecialized<StagesC_, StagesD_, FragmentSize_, ReuseSmemC_, DelayTmaStore_>,
      CtaTileMNK_, EpilogueTile_, ElementC_, StrideC_, ElementD_, StrideD_, FusionCallbacks_, CopyOpG2S_,
      SmemLayoutAtomC_, CopyOpS2R_, CopyOpS2G_, SmemLayoutAtomD_, CopyOpR2S_, CopyAtomC_, CopyOpR2R_>;
  using typename Base::CtaTileMNK;
  using typename Base::EpilogueTile;
  using typename Base::FusionCallbacks;
  using typename Base::LoadPipeline;
  using typename Base::LoadPipelineState;
  using typename Base::Params;
  using typename Base::StorePipeline;
  using typename Base::StorePipelineState;
  using typename Base::TensorStorage;

  static_assert(cute::is_void_v<ElementC_>, "OverlapEpilogue: coda_ext kernels have no C operand");
  static_assert(cute::is_void_v<CopyOpR2R_>, "OverlapEpilogue: no register-to-register copy before the smem store");
  static_assert(cute::is_same_v<CopyOpS2G_, cute::SM90_TMA_STORE>, "OverlapEpilogue: plain TMA stores only");
  // A tile's TMA stores may still read its staging buffers while the warp group's next tile runs (the
  // kernel drains them once, after its last tile): that holds only while no C load reuses those buffers.
  static_assert(!ReuseSmemC_, "OverlapEpilogue: no shared-memory reuse of C for D");

  // What the base keeps private, derived again from the same template arguments (C is void, so nothing of
  // C's shared memory or its reuse for D remains).
  static constexpr bool kHasD = !cute::is_void_v<ElementD_>;
  using StagingElement = cute::conditional_t<kHasD, ElementD_, cutlass::epilogue::fusion::get_element_aux_t<FusionCallbacks_>>;
  using SmemElementD = typename cutlass::detail::get_unpacked_element_type<StagingElement>::type;
  static constexpr int kStagesD = StagesD_;
  static constexpr bool kDelayTmaStore = DelayTmaStore_;
  using SmemLayoutD = decltype(cute::tile_to_shape(
      SmemLayoutAtomD_{},
      cute::make_shape(cute::size<0>(EpilogueTile_{}), cute::size<1>(EpilogueTile_{}), cute::Int<kStagesD>{}),
      cute::conditional_t<cutlass::epilogue::collective::detail::is_m_major<StrideD_>(),
                          cute::Step<cute::_2, cute::_1, cute::_3>, cute::Step<cute::_1, cute::_2, cute::_3>>{}));
  // The staging buffer the base allocates must be exactly the one this loop indexes.
  static_assert(cute::is_same_v<decltype(TensorStorage::CollectiveStorage::smem_D),
                                cute::ArrayEngine<SmemElementD, cute::cosize_v<SmemLayoutD>>>,
                "OverlapEpilogue: the base collective's D staging buffer changed; re-derive SmemLayoutD");

  CUTLASS_DEVICE
  OverlapEpilogue(Params const& params, TensorStorage& storage, uint32_t barrier_id)
      : Base(params, storage), params_(params), callbacks_(params.thread, storage.thread), barrier_id_(barrier_id) {}

  // One output tile's epilogue by the 128 threads of one consumer warp group: for each subtile (N outer, M
  // inner, the order of the producer's loads) wait for its TMA-loaded inputs, run the fusion on the
  // accumulator fragments, hand the reductions the current store buffer as scratch, write D's staging
  // buffer and issue its TMA store (one subtile late when DelayTmaStore). Returns the advanced load and
  // store states. The only difference from the base's store(): every barrier is barrier_id_.
  template <class ProblemShapeMNKL, class TileShapeMNK, class TileCoordMNKL, class AccEngine, class AccLayout,
            class TiledMma>
  CUTLASS_DEVICE auto store(LoadPipeline load_pipeline, LoadPipelineState load_state, StorePipeline store_pipeline,
                            StorePipelineState store_state, ProblemShapeMNKL problem_shape_mnkl,
                            TileShapeMNK tile_shape_MNK, TileCoordMNKL tile_coord_mnkl,
                            cute::Tensor<AccEngine, AccLayout> accumulators, TiledMma tiled_mma, int thread_idx,
                            TensorStorage& storage) {
    using namespace cute;
    using ElementAccumulator = typename AccEngine::value_type;
    using FusionCompute = typename cutlass::epilogue::fusion::FusionCallbacksTraits<FusionCallbacks>::ElementCompute;
    using ElementCompute = conditional_t<is_void_v<FusionCompute>, ElementAccumulator, FusionCompute>;
    static_assert(is_rmem<AccEngine>::value && rank(AccLayout{}) == 3, "accumulators: (MMA, MMA_M, MMA_N) in registers");
    static_assert(is_static<TileShapeMNK>::value && rank(ProblemShapeMNKL{}) == 4 && rank(TileCoordMNKL{}) == 4);
    constexpr int kFragment = FragmentSize_;
    constexpr int kEpiM = size<0>(EpilogueTile{});
    constexpr int kEpiN = size<1>(EpilogueTile{});

    auto [M, N, K, L] = problem_shape_mnkl;
    auto [m_coord, n_coord, k_coord, l_coord] = tile_coord_mnkl;
    uint32_t const barrier = barrier_id_;
    auto sync = [barrier]() CUTLASS_LAMBDA_FUNC_INLINE { named_barrier_sync(barrier, size(TiledMma{})); };

    // D in global memory, this CTA tile of it, and its subtiles (EPI_M, EPI_N, subtiles along M, along N).
    Tensor mD = coalesce(params_.tma_store_d.get_tma_tensor(make_shape(M, N, L)), take<0, 2>(CtaTileMNK{}));
    Tensor gD = local_tile(mD, take<0, 2>(CtaTileMNK{}), make_coord(m_coord, n_coord, l_coord));
    Tensor gD_sub = flat_divide(gD, EpilogueTile{});
    constexpr int kSubM = size<2>(decltype(gD_sub){});
    constexpr int kSubN = size<3>(decltype(gD_sub){});
    // D's staging stages in shared memory (EPI_M, EPI_N, stage).
    Tensor sD = as_position_independent_swizzle_tensor(
        make_tensor(make_smem_ptr(storage.collective.smem_D.begin()), SmemLayoutD{}));

    // Registers -> shared memory, partitioned like the accumulators.
    auto copy_c_atom = make_tiled_copy_C_atom(CopyAtomC_{}, tiled_mma);
    auto r2s = make_tiled_copy_S(Copy_Atom<CopyOpR2S_, SmemElementD>{}, copy_c_atom);
    auto thr_r2s = r2s.get_slice(thread_idx);
    Tensor acc = thr_r2s.retile_S(accumulators);        // ((R2S, V), MMA_M, MMA_N)
    Tensor d_smem = thr_r2s.partition_D(sD);             // (R2S, R2S_M, R2S_N, stage)
    auto sub_layout = make_layout(take<0, 3>(shape(thr_r2s.partition_S(sD))));
    Tensor d_regs = make_tensor<SmemElementD>(sub_layout);
    Tensor acc_frg = recast<cutlass::Array<ElementAccumulator, kFragment>>(acc);
    Tensor d_regs_frg = recast<cutlass::Array<SmemElementD, kFragment>>(d_regs);
    static_assert(size<0>(decltype(acc){}) % kFragment == 0, "the fragment size must divide a thread's accumulators");
    constexpr int kMmaTileM = size<0>(TileShapeMNK{}) / size<1>(decltype(acc){});
    constexpr int kMmaTileN = size<1>(TileShapeMNK{}) / size<2>(decltype(acc){});
    static_assert(kEpiM % kMmaTileM == 0, "an epilogue subtile holds whole MMA tiles along M");
    constexpr bool kSubtileSpansMma = kEpiM * kEpiN > kMmaTileM * kMmaTileN;
    static_assert(kSubtileSpansMma ? kEpiN % kMmaTileN == 0 : kMmaTileN % kEpiN == 0,
                  "epilogue subtiles and MMA tiles must nest along N");
    // The source registers the visitor arguments reference (no C is ever read into them).
    Tensor c_regs = make_tensor<ElementCompute>(sub_layout);

    // Shared memory -> global memory: one TMA copy per subtile.
    auto s2g = params_.tma_store_d.get_slice(Int<0>{});
    Tensor s2g_src = s2g.partition_S(sD);                // (S2G, S2G_M, S2G_N, stage)
    Tensor s2g_dst = s2g.partition_D(gD_sub);            // (S2G, S2G_M, S2G_N, sub_m, sub_n)

    // Coordinates for the residue predicates of the visitor nodes.
    Tensor cD_mn = local_tile(make_identity_tensor(make_shape(M, N)), take<0, 2>(CtaTileMNK{}), make_coord(m_coord, n_coord));
    Tensor thr_cD_mn = thr_r2s.partition_S(flat_divide(cD_mn, EpilogueTile{}));
    Tensor cD = make_coord_tensor(cD_mn.layout());
    Tensor thr_cD = make_coord_tensor(thr_cD_mn.layout());
    auto residue_cD = make_coord(M, N) - cD_mn(_0{});
    auto residue_thr_cD = make_coord(M, N) - thr_cD_mn(_0{});

    auto store_args = cutlass::epilogue::fusion::detail::ConsumerStoreArgs(
        problem_shape_mnkl, CtaTileMNK{}, tile_coord_mnkl, tiled_mma, EpilogueTile{}, r2s, cD, residue_cD, thr_cD,
        residue_thr_cD, c_regs, thread_idx);
    auto cb = callbacks_.template get_consumer_store_callbacks</*RefSrc=*/true>(store_args);
    bool const has_loads = callbacks_.is_producer_load_needed();

    using Visited = decltype(cb.visit(acc_frg(0), 0, 0, 0));
    using ComputeElement = conditional_t<is_same_v<Visited, cutlass::Array<SmemElementD, kFragment>>, SmemElementD, ElementCompute>;
    Tensor out = make_tensor<ComputeElement>(sub_layout);
    Tensor out_frg = recast<cutlass::Array<ComputeElement, kFragment>>(out);

    bool const tma_warp = thread_idx / cutlass::NumThreadsPerWarp == 0;   // warp 0 of the group issues the stores

    // Store the staged subtile (sub_m, sub_n) with TMA, then take the next staging stage once free.
    auto issue_store = [&](int sub_m, int sub_n) CUTLASS_LAMBDA_FUNC_INLINE {
      cutlass::arch::fence_view_async_shared();   // this thread's smem writes, visible to the TMA unit
      sync();                                     // ... for every thread of the group
      if constexpr (kHasD) {
        if (tma_warp) copy(params_.tma_store_d, s2g_src(_, _, _, store_state.index()), s2g_dst(_, _, _, sub_m, sub_n));
      }
      cb.tma_store(sub_m, sub_n, store_state.count(), tma_warp);
      if (tma_warp) store_pipeline.producer_commit(store_state);
      ++store_state;
      if (tma_warp) store_pipeline.producer_acquire(store_state);   // the next stage's old store has read its smem
      sync();
    };

    cb.begin();
    if (cb.begin_sync_needed()) sync();

    [[maybe_unused]] int pending_m = 0;
    [[maybe_unused]] int pending_n = 0;
    CUTLASS_PRAGMA_UNROLL
    for (int sub_n = 0; sub_n < kSubN; ++sub_n) {
      CUTLASS_PRAGMA_UNROLL
      for (int sub_m = 0; sub_m < kSubM; ++sub_m) {
        bool const first = sub_m == 0 && sub_n == 0;
        bool const last = sub_m == kSubM - 1 && sub_n == kSubN - 1;
        cb.begin_loop(sub_m, sub_n);
        if (has_loads) load_pipeline.consumer_wait(load_state);   // this subtile's TMA-loaded inputs landed
        cb.previsit(sub_m, sub_n, load_state.count(), has_loads);
        if (has_loads) {   // the nodes copied their inputs to registers in previsit: give the stage back
          cutlass::arch::fence_view_async_shared();
          load_pipeline.consumer_release(load_state);
          ++load_state;
        }

        if constexpr (kSubtileSpansMma) {   // several MMA tiles per subtile
          constexpr int kPerM = kEpiM / kMmaTileM;
          constexpr int kPerN = kEpiN / kMmaTileN;
          CUTLASS_PRAGMA_UNROLL
          for (int in = 0; in < kPerN; ++in) {
            CUTLASS_PRAGMA_UNROLL
            for (int im = 0; im < kPerM; ++im) {
              int const v = in * kPerM + im;
              out_frg(v) = cb.visit(acc_frg(_, sub_m * kPerM + im, sub_n * kPerN + in)(0), v, sub_m, sub_n);
            }
          }
        } else {   // a subtile is a slice of one MMA tile
          auto mma_frg = acc_frg(_, sub_m, (sub_n * kEpiN) / kMmaTileN);
          int const offset = (sub_n % (kMmaTileN / kEpiN)) * size(out_frg);
          CUTLASS_PRAGMA_UNROLL
          for (int v = 0; v < size(out_frg); ++v) {
            out_frg(v) = cb.visit(mma_frg(offset + v), v, sub_m, sub_n);
          }
        }

        if constexpr (kDelayTmaStore) {   // the previous subtile's store, as late as its stage allows
          if (!first) issue_store(pending_m, pending_n);
          pending_m = sub_m;
          pending_n = sub_n;
        }

        cb.reduce(sD(_, _, store_state.index()), sync, sub_m, sub_n, last, out_frg);

        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(d_regs_frg); ++i) {
          d_regs_frg(i) = cutlass::NumericArrayConverter<SmemElementD, ComputeElement, kFragment>{}(out_frg(i));
        }
        if constexpr (kHasD) copy(r2s, d_regs, d_smem(_, _, _, store_state.index()));
        cb.postreduce(sub_m, sub_n, store_state.count(), /*issue_smem_store=*/true);

        if constexpr (!kDelayTmaStore) issue_store(sub_m, sub_n);
        cb.end_loop(sub_m, sub_n);
      }
    }
    if constexpr (kDelayTmaStore) issue_store(pending_m, pending_n);
    cb.end();
    return make_tuple(load_state, store_state);
  }

 private:
  Params const& params_;
  FusionCallbacks callbacks_;
  uint32_t barrier_id_;
};

}  // namespace coda::kernels
