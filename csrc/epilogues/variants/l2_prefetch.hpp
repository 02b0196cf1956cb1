// coda/epilogues/variants/l2_prefetch.hpp — the epilogue's TMA tile loads asked of L2 when the producer warp
// starts a tile (KernelConfig(epilogue_cache="prefetch")).
//
// Why: in ping-pong both math warp groups share one epilogue load pipeline of STAGES_C subtiles. Its producer
// warp reaches a tile only once the other group's epilogue has freed the stages of the tile before it, so the
// first STAGES_C subtiles of a tile arrive ahead of its epilogue and the rest are issued while that epilogue
// runs, each then waiting on DRAM. Here the producer warp, as it starts a tile, prefetches every subtile of
// the tile into L2 at once (cp.async.bulk.prefetch.tensor: no shared memory, no barrier); the TMA loads that
// follow read them from L2. The values are unchanged.
//
// A variant header (csrc/epilogues/variants/): included by the emitted source of the kernels that use it
// only, so a change here re-keys those kernels alone (coda_ext.jit.cache.variant_digest).
#pragma once

#include <cute/tensor.hpp>
#include <cute/algorithm/prefetch.hpp>
#include <cutlass/epilogue/fusion/sm90_visitor_load_tma_warpspecialized.hpp>

#include "coda/abi.h"

namespace coda::epi {

// A tile load node (Sm90AuxLoad, or StaggeredAuxLoad over it) whose producer prefetches the whole tile into
// L2 before it acquires the first stage.
template <class AuxLoad>
struct L2PrefetchAuxLoad : AuxLoad {
  using AuxLoad::AuxLoad;

  template <class Callbacks>
  struct Producer : Callbacks {
    CUTLASS_DEVICE explicit Producer(Callbacks&& cb) : Callbacks(cute::move(cb)) {}

    CUTLASS_DEVICE void begin() {
      using namespace cute;
      Callbacks::begin();
      if (this->params_ptr->use_default) return;   // no tensor behind the node
      if (elect_one_sync()) {
        CUTLASS_PRAGMA_UNROLL
        for (int n = 0; n < size<4>(this->bGS_gAux); ++n) {
          CUTLASS_PRAGMA_UNROLL
          for (int m = 0; m < size<3>(this->bGS_gAux); ++m) {
            prefetch(this->params_ptr->tma_load_aux, this->bGS_gAux(_, _, _, m, n));   // (TMA, TMA_M, TMA_N)
          }
        }
      }
    }
  };

  template <class... Args>
  CUTLASS_DEVICE auto get_producer_load_callbacks(cutlass::epilogue::fusion::ProducerLoadArgs<Args...> const& args) {
    auto cb = AuxLoad::get_producer_load_callbacks(args);
    return Producer<decltype(cb)>(cute::move(cb));
  }
};

// The node wrapper of a TMA tile load (nodes.hpp's TileLoad or TileLoadStaggered) with the L2 prefetch.
template <class W>
struct L2PrefetchLoad {
  using Node = L2PrefetchAuxLoad<typename W::Node>;
  static typename Node::Arguments args(CodaSlot const& s) { return W::args(s); }
};

}  // namespace coda::epi
