// coda/epilogues/coordinates.hpp — the global column index of every element, as a value.
//
// A CUTLASS SM90 epilogue visitor leaf (the node contract of sm90_visitor_*.hpp): visit()
// returns, for each element of the fragment, its column n in the whole problem, as fp32 (exact
// below 2^24). With a comparison and a select it picks per-row columns, e.g. the target logit
// x[m, target[m]] of a cross-entropy.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp>

namespace coda::epi {

struct Sm90ColIndex {
  struct SharedStorage {};
  struct Arguments {};
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {
    return args;
  }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const&) { return true; }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) { return 0; }
  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*, cudaStream_t,
                                              cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }

  CUTLASS_HOST_DEVICE Sm90ColIndex() {}
  CUTLASS_HOST_DEVICE Sm90ColIndex(Params const& params, SharedStorage const&) : params_ptr(&params) {}

  // A data member: CUTLASS's visitor tuples hand an empty node out by value, which its
  // callbacks' lambdas (taking `auto&`) cannot bind.
  Params const* params_ptr = nullptr;

  CUTLASS_DEVICE bool is_producer_load_needed() const { return false; }
  CUTLASS_DEVICE bool is_C_load_needed() const { return false; }

  template <class... Args>
  CUTLASS_DEVICE auto get_producer_load_callbacks(cutlass::epilogue::fusion::ProducerLoadArgs<Args...> const&) {
    return cutlass::epilogue::fusion::EmptyProducerLoadCallbacks{};
  }

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
