// coda/epilogues/coordinates.hpp — the global column index of every element, as a value.
//
// A CUTLASS SM90 epilogue visitor leaf (the node contract of sm90_visitor_*.hpp): visit()
// returns, for each element of the fragment, its column n in the whole problem, as fp32 (exact
// below 2^24). With a comparison and a select it picks per-row columns, e.g. the target logit
// x[m, target[m]] of a cross-entropy.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp>

#include "node_base.hpp"

namespace coda::epi {

struct Sm90ColIndexArguments {};

struct Sm90ColIndex : Sm90PlainNode<Sm90ColIndexArguments> {
  using Sm90PlainNode::Sm90PlainNode;

  template <class CTensor>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE ConsumerStoreCallbacks(CTensor tC_cD, int base_col) : tC_cD(tC_cD), base_col(base_col) {}

    CTensor tC_cD;  // (CPY, CPY_M, CPY_N, EPI_M, EPI_N): (m, n) of every element relative to the thread's first
    int base_col;   // the column of the thread's first element

    template <class ElementAccumulator, int FragmentSize>
    CUTLASS_DEVICE cutlass::Array<float, FragmentSize> visit(cutlass::Array<ElementAccumulator, FragmentSize> const&,
                                                             int epi_v, int epi_m, int epi_n) {
      cute::Tensor c = tC_cD(cute::_, cute::_, cute::_, epi_m, epi_n);
      cutlass::Array<float, FragmentSize> out;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; ++i) {
        out[i] = float(base_col + int(cute::get<1>(c(epi_v * FragmentSize + i))));
      }
      return out;
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
    auto [M, N, K, L] = args.problem_shape_mnkl;
    int base_col = int(N) - int(cute::get<1>(args.residue_tCcD));
    return ConsumerStoreCallbacks<decltype(args.tCcD)>(args.tCcD, base_col);
  }
};

}  // namespace coda::epi
