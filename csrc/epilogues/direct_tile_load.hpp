// coda/epilogues/direct_tile_load.hpp — an M x N tile input read from global memory straight into each
// epilogue thread's registers, one subtile ahead, with no shared memory.
//
// Why: the TMA path (CUTLASS's Sm90AuxLoad) writes every tile element into shared memory and reads it back
// with LDS, beside a mainloop whose operand stages need that capacity and bandwidth; a fused backward epilogue
// costs what it shares with the MMAs (docs/measured.md, "the epilogue on warp groups of its own"). Here each
// thread loads the elements of its own accumulator fragment (for 16-bit tiles two adjacent columns, for a pair
// tile two adjacent 32-bit pairs: 4- and 8-byte loads, every 32-byte sector whole across a warp's row) with
// ld.global, predicated on the problem's bounds. CUTLASS's shared-memory-free variant (Sm90AuxLoad with 0
// stages) loads a subtile when it starts and waits for it there; this node issues the next subtile's loads when
// a subtile starts, so their latency runs under the current subtile's math and stores.
//
// The prefetch assumes the collective's subtile order, N outer and M inner (CUTLASS's store() and
// OverlapEpilogue's); a subtile that is not the one prefetched is loaded where it starts (correct, slower).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/epilogue/fusion/sm90_visitor_load_tma_warpspecialized.hpp>

namespace coda::epi {

template <class Element, class StrideMNL, int Alignment>
struct DirectTileLoad : cutlass::epilogue::fusion::Sm90AuxLoad<0, cute::Shape<cute::_1, cute::_1>, Element, StrideMNL,
                                                               void, void, Alignment, /*EnableNullptr=*/false> {
  using Base = cutlass::epilogue::fusion::Sm90AuxLoad<0, cute::Shape<cute::_1, cute::_1>, Element, StrideMNL, void,
                                                      void, Alignment, false>;
  using Base::Base;
  using typename Base::Params;

  template <class GTensor, class RTensor, class CTensor, class ProblemShapeMNL>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE
    ConsumerStoreCallbacks(GTensor&& tC_gAux, RTensor&& current, RTensor&& next, CTensor&& tC_cAux,
                           ProblemShapeMNL problem_shape_mnl)
        : tC_gAux(cute::forward<GTensor>(tC_gAux)), current(cute::forward<RTensor>(current)),
          next(cute::forward<RTensor>(next)), tC_cAux(cute::forward<CTensor>(tC_cAux)),
          problem_shape_mnl(problem_shape_mnl) {}

    GTensor tC_gAux;      // (CPY, CPY_M, CPY_N, EPI_M, EPI_N)
    RTensor current;      // (CPY, CPY_M, CPY_N): the subtile being visited
    RTensor next;         // the prefetched one
    CTensor tC_cAux;      // coordinates, for the bounds predicate
    ProblemShapeMNL problem_shape_mnl;
    int next_m = -1;      // the subtile `next` holds (-1: none)
    int next_n = -1;

    static constexpr int kSubM = cute::size<3>(GTensor{});
    static constexpr int kSubN = cute::size<4>(GTensor{});

    // Issue the loads of subtile (m, n) into `dst` (predicated: out-of-bounds elements are left as they are).
    CUTLASS_DEVICE void load(int m, int n, RTensor& dst) {
      using namespace cute;
      constexpr auto common = decltype(max_common_layout(tC_gAux(_, _, _, _0{}, _0{}), dst)){};
      constexpr int V = cute::min(Alignment, size(common));
      Tensor src_vec = recast<cutlass::Array<Element, V>>(coalesce(tC_gAux(_, _, _, m, n)));
      Tensor dst_vec = recast<cutlass::Array<Element, V>>(coalesce(dst));
      Tensor coord_vec = tensor<1>(zipped_divide(coalesce(tC_cAux(_, _, _, m, n)), common.compose(Int<V>{})));
      Tensor pred_vec = cute::lazy::transform(coord_vec, [&](auto const& c) { return elem_less(c, problem_shape_mnl); });
      copy_if(pred_vec, src_vec, dst_vec);
    }

    CUTLASS_DEVICE void begin() {
      load(0, 0, next);
      next_m = 0;
      next_n = 0;
    }

    CUTLASS_DEVICE void begin_loop(int epi_m, int epi_n) {
      if (next_m == epi_m && next_n == epi_n) {
        cute::copy(next, current);
      } else {
        load(epi_m, epi_n, current);
      }
      // Prefetch the subtile after this one in the collective's order (N outer, M inner).
      int m = epi_m + 1, n = epi_n;
      if (m == kSubM) {
        m = 0;
        ++n;
      }
      if (n < kSubN) {
        load(m, n, next);
        next_m = m;
        next_n = n;
      } else {
        next_m = next_n = -1;
      }
    }

    template <typename ElementAccumulator, int FragmentSize>
    CUTLASS_DEVICE cutlass::Array<Element, FragmentSize>
    visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v, int, int) {
      return cute::recast<cutlass::Array<Element, FragmentSize>>(current)(epi_v);
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
    using namespace cute;
    auto [M, N, K, L] = args.problem_shape_mnkl;
    auto problem_shape_mnl = make_shape(M, N, L);
    Tensor mAux = make_tensor(make_gmem_ptr(this->params_ptr->ptr_aux), make_shape(M, N, L), this->params_ptr->dAux);
    Tensor tC_gAux = cutlass::epilogue::fusion::sm90_partition_for_epilogue<ReferenceSrc>(
        mAux, args.tile_shape_mnk, args.tile_coord_mnkl, args.epi_tile, args.tiled_copy, args.thread_idx);
    Tensor current = make_tensor<Element>(take<0, 3>(shape(tC_gAux)));
    Tensor next = make_tensor<Element>(take<0, 3>(shape(tC_gAux)));
    Tensor tC_cAux = cutlass::epilogue::fusion::sm90_partition_for_epilogue<ReferenceSrc>(
        make_identity_tensor(shape(mAux)), args.tile_shape_mnk, args.tile_coord_mnkl, args.epi_tile, args.tiled_copy,
        args.thread_idx);
    return ConsumerStoreCallbacks<decltype(tC_gAux), decltype(current), decltype(tC_cAux), decltype(problem_shape_mnl)>(
        cute::move(tC_gAux), cute::move(current), cute::move(next), cute::move(tC_cAux), problem_shape_mnl);
  }
};

}  // namespace coda::epi
