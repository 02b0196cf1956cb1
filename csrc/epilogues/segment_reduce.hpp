// coda/epilogues/segment_reduce.hpp — a per-row reduction over a segment of columns (a head),
// broadcast back to every element of the segment, usable inside the same epilogue:
//   y[m, n] = reduce_{n' in segment(n)} f(x[m, n'])
// e.g. the per-head sum of squares of QK-norm. A CUTLASS SM90 epilogue visitor node with one
// child (the node contract of sm90_visitor_*.hpp).
//
// The segment must be exactly one epilogue subtile wide (EPI_N == Size): CUTLASS's collective
// hands each thread its whole subtile in one visit() (FragmentSize = EPI_M * EPI_N / threads),
// so every element of a segment row that a thread owns is in one fragment. The thread folds
// them into one register per distinct row it owns, the lanes that own the same rows (a quad of
// the wgmma layout: they share rows and split the columns) fold with xor-shuffles, and each
// element gets its row's value. A warp owns whole rows of a subtile in every SM90 layout, so
// no shared memory is needed. Deterministic: a fixed fold order.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp>

#include "node_base.hpp"

namespace coda::epi {

struct Sm90SegmentReduceArguments {
  float identity = 0.0f;  // of the node's InputFn / CombineFn
};

template <
  class InputFn,         // scalar rule folding one element into a partial: (partial, x) -> partial
  class CombineFn,       // scalar rule combining two partials (commutative)
  int Size,              // columns per segment: must equal the epilogue subtile's N
  class CtaTileShapeMNK
>
struct Sm90SegmentReduce : Sm90PlainNode<Sm90SegmentReduceArguments> {
  using Sm90PlainNode::Sm90PlainNode;

  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem_shape, Sm90SegmentReduceArguments const&) {
    return int(cute::get<1>(problem_shape)) % Size == 0;  // whole segments only
  }

  template <class RowLayout>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE ConsumerStoreCallbacks(int base_row, float identity) : base_row(base_row), identity(identity) {}

    int base_row;    // the row of the thread's first element: lanes with equal base rows own the same rows
    float identity;

    template <class ElementAccumulator, class ElementInput, int FragmentSize>
    CUTLASS_DEVICE cutlass::Array<float, FragmentSize> visit(cutlass::Array<ElementAccumulator, FragmentSize> const&,
                                                             int epi_v, int, int,
                                                             cutlass::Array<ElementInput, FragmentSize> const& x) {
      using namespace cute;
      static_assert(decltype(size(RowLayout{}))::value == FragmentSize,
                    "segment_reduce: one visit must see the thread's whole subtile");
      // One register per distinct row of the subtile: the row layout has stride 0 along N.
      Tensor r = make_tensor<float>(RowLayout{});
      Tensor rows = filter_zeros(r);
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < size(rows); ++j) rows(j) = identity;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; ++i) {
        r(i) = InputFn{}(r(i), float(x[i]));
      }
      // Lanes owning the same rows hold the other columns of the segment.
      CUTLASS_PRAGMA_UNROLL
      for (int bit = 1; bit < 32; bit <<= 1) {
        bool same = __shfl_xor_sync(0xffffffffu, base_row, bit) == base_row;
        if (__all_sync(0xffffffffu, same)) {
          CUTLASS_PRAGMA_UNROLL
          for (int j = 0; j < size(rows); ++j) {
            rows(j) = CombineFn{}(rows(j), __shfl_xor_sync(0xffffffffu, rows(j), bit));
          }
        }
      }
      cutlass::Array<float, FragmentSize> out;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; ++i) out[i] = r(i);
      (void)epi_v;  // always 0: the fragment is the whole subtile
      return out;
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
    using namespace cute;
    using EpiTile = cute::remove_cvref_t<decltype(args.epi_tile)>;
    static_assert(size<1>(EpiTile{}) == Size,
                  "segment_reduce: the epilogue subtile must be exactly one segment wide (epilogue_tile=(EPI_M, size))");
    constexpr int TileM = size<0>(CtaTileShapeMNK{});
    constexpr int TileN = size<1>(CtaTileShapeMNK{});
    // A stride-0-along-N view of the tile, partitioned like the output: its first subtile's layout
    // maps each fragment element to the register of its row.
    Tensor gRow = make_tensor(make_gmem_ptr(static_cast<float*>(nullptr)),
                              make_layout(make_shape(Int<TileM>{}, Int<TileN>{}), make_stride(_1{}, _0{})));
    Tensor tC_gRow = cutlass::epilogue::fusion::sm90_partition_for_epilogue<ReferenceSrc>(
        gRow, args.epi_tile, args.tiled_copy, args.thread_idx);
    using RowLayout = decltype(make_layout_like(tC_gRow(_, _, _, 0, 0).layout()));
    auto [M, N, K, L] = args.problem_shape_mnkl;
    int base_row = int(M) - int(get<0>(args.residue_tCcD));
    return ConsumerStoreCallbacks<RowLayout>(base_row, params_ptr->identity);
  }
};

}  // namespace coda::epi
