// coda/epilogues/evict_first.hpp — the epilogue's TMA tile loads and stores with the L2 evict-first policy
// (KernelConfig(epilogue_cache="evict_first")).
//
// Why: an epilogue that streams M x N tiles (the dSwiGLU reads the saved pre-activation and writes its gradient
// and y: about 1.3 GB at the Llama-1B shape) moves tens of MB through L2 per wave of tiles, as much as L2 holds,
// while the mainloop relies on L2 to serve each operand strip to the tiles that share it. Under Nsight Compute
// the dSwiGLU's L2 hit rate fell from 87 % (the plain GEMM) to 78 % (docs/measured.md). A tile is read or
// written once: marking its lines evict-first lets L2 drop them before the operands' lines.
//
// The nodes are CUTLASS's (or the staggered ones, staggered_pairs.hpp) with only the TMA copy replaced by the
// same copy carrying an L2 cache hint; the values are unchanged.
#pragma once

#include <cute/tensor.hpp>
#include <cute/arch/copy_sm90_desc.hpp>
#include <cutlass/epilogue/fusion/sm90_visitor_load_tma_warpspecialized.hpp>
#include <cutlass/epilogue/fusion/sm90_visitor_store_tma_warpspecialized.hpp>

namespace coda::epi {

// A TMA store (shared -> global, bulk group) with an L2 cache policy: SM90_TMA_STORE's instruction plus
// `.L2::cache_hint`, for the tensor ranks a TMA descriptor has.
struct TmaStoreEvictFirst {
  static constexpr uint64_t kHint = static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_FIRST);

  CUTLASS_DEVICE static void copy(void const* desc, void const* smem, int32_t c0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.tensor.1d.global.shared::cta.bulk_group.L2::cache_hint [%0, {%2}], [%1], %3;"
                 :: "l"(desc), "r"(cute::cast_smem_ptr_to_uint(smem)), "r"(c0), "l"(kHint) : "memory");
#endif
  }
  CUTLASS_DEVICE static void copy(void const* desc, void const* smem, int32_t c0, int32_t c1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group.L2::cache_hint [%0, {%2, %3}], [%1], %4;"
                 :: "l"(desc), "r"(cute::cast_smem_ptr_to_uint(smem)), "r"(c0), "r"(c1), "l"(kHint) : "memory");
#endif
  }
  CUTLASS_DEVICE static void copy(void const* desc, void const* smem, int32_t c0, int32_t c1, int32_t c2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile(
        "cp.async.bulk.tensor.3d.global.shared::cta.bulk_group.L2::cache_hint [%0, {%2, %3, %4}], [%1], %5;"
        :: "l"(desc), "r"(cute::cast_smem_ptr_to_uint(smem)), "r"(c0), "r"(c1), "r"(c2), "l"(kHint) : "memory");
#endif
  }
  CUTLASS_DEVICE static void copy(void const* desc, void const* smem, int32_t c0, int32_t c1, int32_t c2,
                                  int32_t c3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile(
        "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group.L2::cache_hint [%0, {%2, %3, %4, %5}], [%1], %6;"
        :: "l"(desc), "r"(cute::cast_smem_ptr_to_uint(smem)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "l"(kHint)
        : "memory");
#endif
  }
  CUTLASS_DEVICE static void copy(void const* desc, void const* smem, int32_t c0, int32_t c1, int32_t c2,
                                  int32_t c3, int32_t c4) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile(
        "cp.async.bulk.tensor.5d.global.shared::cta.bulk_group.L2::cache_hint [%0, {%2, %3, %4, %5, %6}], [%1], %7;"
        :: "l"(desc), "r"(cute::cast_smem_ptr_to_uint(smem)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4),
           "l"(kHint) : "memory");
#endif
  }
};

// A tile load node (Sm90AuxLoad or StaggeredAuxLoad over it; `Stages` its pipeline's) whose producer issues each
// subtile's TMA load with the evict-first hint.
template <class AuxLoad, int Stages>
struct EvictFirstAuxLoad : AuxLoad {
  using AuxLoad::AuxLoad;

  template <class Callbacks>
  struct Producer : Callbacks {
    CUTLASS_DEVICE explicit Producer(Callbacks&& cb) : Callbacks(cute::move(cb)) {}

    CUTLASS_DEVICE void step(uint64_t* full_mbarrier_ptr, int epi_m, int epi_n, int load_iteration,
                             bool issue_tma_load) {
      using namespace cute;
      if (issue_tma_load) {
        using Element = typename cute::remove_cvref_t<decltype(this->bGS_sAux)>::value_type;
        uint32_t const bytes = uint32_t(size(this->bGS_sAux(_, _, _, 0)) * sizeof(Element));   // one subtile
        cutlass::arch::ClusterTransactionBarrier::expect_transaction(full_mbarrier_ptr, bytes);
        copy(this->params_ptr->tma_load_aux.with(*full_mbarrier_ptr, uint16_t(0), TMA::CacheHintSm90::EVICT_FIRST),
             this->bGS_gAux(_, _, _, epi_m, epi_n), this->bGS_sAux(_, _, _, load_iteration % Stages));
      }
    }
  };

  template <class... Args>
  CUTLASS_DEVICE auto get_producer_load_callbacks(cutlass::epilogue::fusion::ProducerLoadArgs<Args...> const& args) {
    auto cb = AuxLoad::get_producer_load_callbacks(args);
    return Producer<decltype(cb)>(cute::move(cb));
  }
};

// A tile store node (Sm90AuxStore or StaggeredAuxStore over it; `Stages` its pipeline's) whose consumer issues
// each subtile's TMA store with the evict-first hint.
template <class AuxStore, int Stages>
struct EvictFirstAuxStore : AuxStore {
  using AuxStore::AuxStore;

  template <class Callbacks>
  struct Consumer : Callbacks {
    CUTLASS_DEVICE explicit Consumer(Callbacks&& cb) : Callbacks(cute::move(cb)) {}

    CUTLASS_DEVICE void tma_store(int epi_m, int epi_n, int store_iteration, bool issue_tma_store) {
      using namespace cute;
      if (!issue_tma_store) return;
      auto src = this->bSG_sAux(_, _, _, store_iteration % Stages);   // (TMA, TMA_M, TMA_N) in shared memory
      auto dst = this->bSG_gAux(_, _, _, epi_m, epi_n);               // (TMA, TMA_M, TMA_N) TMA coordinates
      void const* desc = this->params_ptr->tma_store_aux.get_tma_descriptor();
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < size<2>(src); ++j) {
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size<1>(src); ++i) {
          void const* smem = raw_pointer_cast(src(_, i, j).data());
          auto coord = dst(_, i, j).data().coord_;
          cute::detail::explode_tuple(cute::detail::CallCOPY<TmaStoreEvictFirst>{}, make_tuple(desc, smem),
                                      seq<0, 1>{}, coord, tuple_seq<decltype(coord)>{});
        }
      }
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
    auto cb = AuxStore::template get_consumer_store_callbacks<ReferenceSrc>(args);
    return Consumer<decltype(cb)>(cute::move(cb));
  }
};

}  // namespace coda::epi
