// coda/epilogues/interior_tiles.hpp — a reduction's per-element bounds test only on the tiles that reach beyond
// the problem.
//
// A reduction whose input is not provably its identity beyond the problem (python/coda_ext/codegen/oob.py) tests
// each element's coordinate against the problem's bounds before folding it in: two integer compares and a select
// per element, in every tile. Only the last row and column of tiles can hold elements beyond the problem; a tile
// wholly inside it (every tile where M and N are multiples of the tile) folds every element unconditionally. The
// choice is made once per tile, on a value uniform across the epilogue's threads, so the two paths never diverge
// within a warp; both fold the same elements in the same order, so the results are bit-identical to the tested
// path's.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/epilogue/fusion/sm90_visitor_store_tma_warpspecialized.hpp>

namespace coda::epi {

// True for a CTA tile wholly inside the problem, from the epilogue collective's ConsumerStoreArgs: residue_cD is the
// problem's (M, N) minus the tile's first coordinate, tile_shape_mnk the CTA tile.
template <class Args>
CUTLASS_DEVICE bool tile_is_interior(Args const& args) {
  return int(cute::get<0>(args.residue_cD)) >= int(cute::size<0>(args.tile_shape_mnk)) &&
         int(cute::get<1>(args.residue_cD)) >= int(cute::size<1>(args.tile_shape_mnk));
}

// CUTLASS's per-row reduction (Sm90ColReduction: one partial per row and N-tile, reduced over the tile's columns)
// with its bounds test, skipped on interior tiles: everything but visit() is CUTLASS's node as it is.
template <template <class> class RegReduceFn, template <class> class ShuffleReduceFn,
          template <class> class GmemReduceFn, int Stages, class CtaTileShapeMNK, class ElementOutput,
          class ElementCompute, cutlass::FloatRoundStyle RoundStyle, class StrideMNL, int Alignment,
          bool EnableNullptr, bool FinalReduction>
struct Sm90RowReductionInterior
    : cutlass::epilogue::fusion::Sm90ColReduction<RegReduceFn, ShuffleReduceFn, GmemReduceFn, Stages,
                                                  CtaTileShapeMNK, ElementOutput, ElementCompute, RoundStyle,
                                                  StrideMNL, Alignment, EnableNullptr, FinalReduction,
                                                  /*VisitCheckOOB=*/true> {
  using Base = cutlass::epilogue::fusion::Sm90ColReduction<RegReduceFn, ShuffleReduceFn, GmemReduceFn, Stages,
                                                           CtaTileShapeMNK, ElementOutput, ElementCompute, RoundStyle,
                                                           StrideMNL, Alignment, EnableNullptr, FinalReduction, true>;
  using Base::Base;

  template <class Parent>
  struct ConsumerStoreCallbacks : Parent {
    CUTLASS_DEVICE ConsumerStoreCallbacks(Parent&& parent, bool interior)
        : Parent(cute::move(parent)), interior(interior) {}

    bool interior;

    template <class ElementAccumulator, class ElementInput, int FragmentSize>
    CUTLASS_DEVICE auto visit(cutlass::Array<ElementAccumulator, FragmentSize> const& frg_acc, int epi_v, int epi_m,
                              int epi_n, cutlass::Array<ElementInput, FragmentSize> const& frg_input) {
      if (!interior) {
        return Parent::visit(frg_acc, epi_v, epi_m, epi_n, frg_input);
      }
      if constexpr (EnableNullptr) {
        if (this->params.ptr_col == nullptr) {
          return frg_input;
        }
      }
      // The row partials in registers: the second element of the parent's argument tuple (CUTLASS's layout).
      auto& tCrCol = cute::get<1>(this->args_tuple);
      cute::Tensor r = tCrCol(cute::_, cute::_, cute::_, epi_m, epi_n);
      cutlass::NumericArrayConverter<ElementCompute, ElementInput, FragmentSize, RoundStyle> convert;
      RegReduceFn<ElementCompute> fold;
      cutlass::Array<ElementCompute, FragmentSize> x = convert(frg_input);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; ++i) {
        ElementCompute& partial = r(epi_v * FragmentSize + i);
        partial = fold(partial, x[i]);
      }
      return frg_input;
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
    auto parent = Base::template get_consumer_store_callbacks<ReferenceSrc>(args);
    return ConsumerStoreCallbacks<decltype(parent)>(cute::move(parent), tile_is_interior(args));
  }
};

}  // namespace coda::epi
