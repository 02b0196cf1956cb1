// coda/epilogues/staggered_pairs.hpp — conflict-free shared-memory accesses for the epilogue's 32-bit tiles
// (the packed pair tiles and pair stores of the gated ops).
//
// Why: an accumulator fragment holds two adjacent columns per row (wgmma's C layout: lane / 4 picks the row,
// lane % 4 the column pair), so a warp's access to a 32-bit tile with 128-byte rows and the 128-byte TMA
// swizzle touches 8 rows x 32 bytes. CUTLASS's copy moves each pair as one 8-byte access (LDS.64 / STS.64):
// rows r and r ^ 1 land on the same 32 bytes of banks, and every access takes 4 wavefronts against the 2 its
// 256 bytes need (measured with Nsight Compute on the dSwiGLU, docs/measured.md). Here each pair moves as two
// 4-byte accesses, the pair's two halves in opposite orders on rows of opposite parity ((lane % 4 + lane / 4)
// odd: second half first): each 4-byte access of the warp then hits 32 distinct banks, one wavefront, 2 for
// the 256 bytes. The registers end as CUTLASS's copy leaves them (a select per element), so the node is the
// CUTLASS node's with only the shared-memory copy replaced.
//
// Assumes the partition's flat index pairs the two columns of a pair (2i, 2i + 1), as the accumulator-shaped
// copies do; where it would not, every value still reaches its register (only the banks change).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/epilogue/fusion/sm90_visitor_load_tma_warpspecialized.hpp>
#include <cutlass/epilogue/fusion/sm90_visitor_store_tma_warpspecialized.hpp>

namespace coda::epi {

// Which half of a pair this lane moves first: 1 on rows of odd parity relative to its column pair.
CUTLASS_DEVICE int stagger_lane() {
  int const lane = int(threadIdx.x) & 31;
  return ((lane & 3) + (lane >> 2)) & 1;
}

// smem -> registers: `dst(2i + h)` = `src(2i + h)` for every pair, the two 4-byte loads staggered.
template <class SrcTensor, class DstTensor>
CUTLASS_DEVICE void staggered_load(SrcTensor const& src, DstTensor& dst) {
  static_assert(cute::size(SrcTensor{}) % 2 == 0 && cute::size(SrcTensor{}) == cute::size(DstTensor{}));
  static_assert(sizeof(typename SrcTensor::value_type) == 4, "32-bit tiles only");
  int const s = stagger_lane();
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < cute::size(dst); i += 2) {
    auto const a = src(i + s);
    auto const b = src(i + 1 - s);
    dst(i) = s ? b : a;
    dst(i + 1) = s ? a : b;
  }
}

// registers -> smem, the same way round.
template <class SrcTensor, class DstTensor>
CUTLASS_DEVICE void staggered_store(SrcTensor const& src, DstTensor&& dst) {
  static_assert(cute::size(SrcTensor{}) % 2 == 0 && cute::size(SrcTensor{}) == cute::size(cute::remove_cvref_t<DstTensor>{}));
  static_assert(sizeof(typename SrcTensor::value_type) == 4, "32-bit tiles only");
  int const s = stagger_lane();
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < cute::size(src); i += 2) {
    auto const a = s ? src(i + 1) : src(i);
    auto const b = s ? src(i) : src(i + 1);
    dst(i + s) = a;
    dst(i + 1 - s) = b;
  }
}

// CUTLASS's TMA tile load (Sm90AuxLoad, `Stages` stages) whose consumer copies each subtile from shared memory
// with staggered_load.
template <class AuxLoad, int Stages>
struct StaggeredAuxLoad : AuxLoad {
  using AuxLoad::AuxLoad;

  template <class Callbacks>
  struct StaggeredCallbacks : Callbacks {
    CUTLASS_DEVICE explicit StaggeredCallbacks(Callbacks&& cb) : Callbacks(cute::move(cb)) {}

    CUTLASS_DEVICE void previsit(int, int, int load_iteration, bool) {
      using namespace cute;
      using RLayoutS2R = decltype(cute::layout(decltype(this->tiled_s2r){}.get_slice(0).retile_S(
          decltype(this->tC_rAux){})));
      Tensor regs = make_tensor(this->tC_rAux.data(), RLayoutS2R{});
      staggered_load(this->tSR_sAux(_, _, _, load_iteration % Stages), regs);
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
    auto cb = AuxLoad::template get_consumer_store_callbacks<ReferenceSrc>(args);
    return StaggeredCallbacks<decltype(cb)>(cute::move(cb));
  }
};

// CUTLASS's TMA tile store (Sm90AuxStore, `Stages` stages) whose consumer writes each subtile to shared memory
// with staggered_store.
template <class AuxStore, int Stages>
struct StaggeredAuxStore : AuxStore {
  using AuxStore::AuxStore;

  template <class Callbacks>
  struct StaggeredCallbacks : Callbacks {
    CUTLASS_DEVICE explicit StaggeredCallbacks(Callbacks&& cb) : Callbacks(cute::move(cb)) {}

    CUTLASS_DEVICE void postreduce(int, int, int store_iteration, bool issue_smem_store) {
      using namespace cute;
      using RLayoutR2S = decltype(cute::layout(decltype(this->tiled_r2s){}.get_slice(0).retile_S(
          decltype(this->tC_rAux){})));
      Tensor regs = make_tensor(this->tC_rAux.data(), RLayoutR2S{});
      if (issue_smem_store) staggered_store(regs, this->tRS_sAux(_, _, _, store_iteration % Stages));
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
    auto cb = AuxStore::template get_consumer_store_callbacks<ReferenceSrc>(args);
    return StaggeredCallbacks<decltype(cb)>(cute::move(cb));
  }
};

}  // namespace coda::epi
