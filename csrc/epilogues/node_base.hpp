// coda/epilogues/node_base.hpp — the parts of CUTLASS's SM90 visitor-node contract
// (sm90_visitor_*.hpp) that the project's nodes share: no shared memory, no workspace, no
// producer loads, arguments used as parameters. A node derives from Sm90PlainNode<Arguments>,
// inherits its constructors and adds get_consumer_store_callbacks (and its own can_implement
// where it has something to check).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp>

namespace coda::epi {

template <class Arguments_>
struct Sm90PlainNode {
  struct SharedStorage {};
  using Arguments = Arguments_;
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

  CUTLASS_HOST_DEVICE Sm90PlainNode() {}
  CUTLASS_HOST_DEVICE Sm90PlainNode(Params const& params, SharedStorage const&) : params_ptr(&params) {}

  // Also what keeps a node non-empty: CUTLASS's visitor tuples hand an empty node out by value,
  // which its callbacks' lambdas (taking `auto&`) cannot bind.
  Params const* params_ptr = nullptr;

  CUTLASS_DEVICE bool is_producer_load_needed() const { return false; }
  CUTLASS_DEVICE bool is_C_load_needed() const { return false; }

  template <class... Args>
  CUTLASS_DEVICE auto get_producer_load_callbacks(cutlass::epilogue::fusion::ProducerLoadArgs<Args...> const&) {
    return cutlass::epilogue::fusion::EmptyProducerLoadCallbacks{};
  }
};

}  // namespace coda::epi
