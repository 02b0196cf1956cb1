// coda/epilogues/pair_gated_store.hpp — gated activation on adjacent column pairs, stored
// at half width:  out[m, i] = Act(x[m, 2i]) * x[m, 2i + 1]   (SwiGLU of an interleaved
// gate/up projection when Act = Silu).
//
// A CUTLASS SM90 epilogue visitor node (the node contract of sm90_visitor_*.hpp). It is a
// sink that passes its input through unchanged, so it can sit anywhere in a tree.
// The wgmma accumulator layout gives every thread adjacent column pairs (2c, 2c + 1) in
// consecutive fragment slots, so each pair is combined in registers; results are written
// with predicated per-thread stores at the end of each epilogue subtile.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp>

#include "functors.hpp"

namespace coda::epi {

template <
  class Element,        // stored element type of the half-width output (bf16 / fp16 / float)
  class ActFn,          // scalar rule applied to the gate column, e.g. scalar::Silu
  cutlass::FloatRoundStyle RoundStyle = cutlass::FloatRoundStyle::round_to_nearest
>
struct Sm90PairGatedStore {
  struct SharedStorage {};

  struct Arguments {
    Element* ptr_out = nullptr;  // (M, N / 2), row-major
    int64_t ld_out = 0;          // leading stride of the output, in elements
  };
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {
    return args;
  }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem_shape, Arguments const& args) {
    auto N = cute::get<1>(problem_shape);
    return (N % 2 == 0) && args.ptr_out != nullptr && args.ld_out >= N / 2;
  }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) { return 0; }
  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*, cudaStream_t,
                                              cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }

  CUTLASS_HOST_DEVICE Sm90PairGatedStore() {}
  CUTLASS_HOST_DEVICE Sm90PairGatedStore(Params const& params, SharedStorage const&) : params_ptr(&params) {}

  Params const* params_ptr = nullptr;

  CUTLASS_DEVICE bool is_producer_load_needed() const { return false; }
  CUTLASS_DEVICE bool is_C_load_needed() const { return false; }

  template <class... Args>
  CUTLASS_DEVICE auto get_producer_load_callbacks(cutlass::epilogue::fusion::ProducerLoadArgs<Args...> const&) {
    return cutlass::epilogue::fusion::EmptyProducerLoadCallbacks{};
  }

  template <class RTensor, class CTensor, class ProblemShapeMN>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE ConsumerStoreCallbacks(RTensor&& tC_rOut, CTensor&& tC_cOut, ProblemShapeMN shape_mn,
                                          Params const* params_ptr)
        : tC_rOut(cute::forward<RTensor>(tC_rOut)),
          tC_cOut(cute::forward<CTensor>(tC_cOut)),
          shape_mn(shape_mn),
          params_ptr(params_ptr) {}

    RTensor tC_rOut;       // (CPY, CPY_M, CPY_N) results of this subtile, valid at even columns
    CTensor tC_cOut;       // (CPY, CPY_M, CPY_N, EPI_M, EPI_N) full-width coordinates
    ProblemShapeMN shape_mn;
    Params const* params_ptr;

    template <class ElementAccumulator, class ElementInput, int FragmentSize>
    CUTLASS_DEVICE auto visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v, int, int,
                              cutlass::Array<ElementInput, FragmentSize> const& frg_input) {
      static_assert(FragmentSize % 2 == 0, "pairwise node needs an even fragment size");
      cutlass::NumericConverter<float, ElementInput, RoundStyle> to_float{};
      cutlass::NumericConverter<Element, float, RoundStyle> to_out{};
      cute::Tensor frg = cute::recast<cutlass::Array<Element, FragmentSize>>(cute::coalesce(tC_rOut));
      cutlass::Array<Element, FragmentSize>& out = frg(epi_v);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; i += 2) {
        float gate = to_float(frg_input[i]);
        float up = to_float(frg_input[i + 1]);
        out[i] = to_out(ActFn{}(gate) * up);
        out[i + 1] = out[i];
      }
      return frg_input;
    }

    CUTLASS_DEVICE void end_loop(int epi_m, int epi_n) {
      Element* ptr = params_ptr->ptr_out;
      int64_t ld = params_ptr->ld_out;
      cute::Tensor coords = tC_cOut(cute::_, cute::_, cute::_, epi_m, epi_n);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < cute::size(tC_rOut); i += 2) {
        auto c = coords(i);
        int row = cute::get<0>(c);
        int col = cute::get<1>(c);
        if (row < cute::get<0>(shape_mn) && col < cute::get<1>(shape_mn)) {
          ptr[int64_t(row) * ld + (col >> 1)] = tC_rOut(i);
        }
      }
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
    using namespace cute;
    auto [M, N, K, L] = args.problem_shape_mnkl;
    Tensor coord = make_identity_tensor(make_shape(M, N, L));
    Tensor tC_cOut = cutlass::epilogue::fusion::sm90_partition_for_epilogue<ReferenceSrc>(
        coord, args.tile_shape_mnk, args.tile_coord_mnkl, args.epi_tile, args.tiled_copy, args.thread_idx);
    Tensor tC_rOut = make_tensor<Element>(take<0, 3>(shape(tC_cOut)));
    auto shape_mn = make_shape(int(M), int(N));
    return ConsumerStoreCallbacks<decltype(tC_rOut), decltype(tC_cOut), decltype(shape_mn)>(
        cute::move(tC_rOut), cute::move(tC_cOut), shape_mn, params_ptr);
  }
};

}  // namespace coda::epi
