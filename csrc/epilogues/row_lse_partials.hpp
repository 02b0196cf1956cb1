// coda/epilogues/row_lse_partials.hpp — online log-sum-exp of each row over the columns of each
// output tile, written as one fp32 partial log Σ_n exp(x[m, n]) per (row, N-tile), no atomics.
//
// A CUTLASS SM90 epilogue visitor node (the node contract of sm90_visitor_*.hpp), a sink that
// passes its input through. Each thread keeps a running max m and a rescaled sum s per distinct
// row it owns over the whole tile (registers with static indices: the row layout has stride 0
// along N). One exp per element: with d = x - m, s becomes s·e^(-d) + 1 when d > 0 (a new max)
// and s + e^(d) otherwise. At the end of the tile the lanes that own the same rows merge their
// (m, s) with xor-shuffles (a fixed order: deterministic) and one of them writes m + log s.
//
// Partials: the layout of the other row reductions, a compact (round_up(M, TILE_M), ceil(N / TILE_N))
// m-major buffer; kernels::launch_finalize combines them with ReduceCombine::LogSumExp.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp>

#include "functors.hpp"
#include "interior_tiles.hpp"
#include "node_base.hpp"

namespace coda::epi {

struct Sm90PartialsArguments {
  float* ptr_partials = nullptr;
};

template <
  class CtaTileShapeMNK,
  bool CheckOOB = true   // false only if no element lies beyond the problem's columns (never chosen today);
                         // with it, tiles wholly inside the problem skip the test (interior_tiles.hpp)
>
struct Sm90RowLsePartials : Sm90PlainNode<Sm90PartialsArguments> {
  using Sm90PlainNode::Sm90PlainNode;

  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Sm90PartialsArguments const& args) {
    return args.ptr_partials != nullptr;
  }

  // (m, s) of two parts of a row -> the whole row. Commutative (both lanes of a shuffle agree).
  CUTLASS_DEVICE static void merge(float& m, float& s, float m2, float s2) {
    if (m != m || m2 != m2) {  // NaN propagates
      m = s = m + m2;
      return;
    }
    float mx = fmaxf(m, m2);
    if (mx == -INFINITY) return;  // both empty
    // exp(0) where a part holds the max: keeps +inf maxima from giving inf - inf
    s = s * (m == mx ? 1.0f : scalar::fast_exp(m - mx)) + s2 * (m2 == mx ? 1.0f : scalar::fast_exp(m2 - mx));
    m = mx;
  }

  template <class RTensor, class CTensor, class Residue>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE ConsumerStoreCallbacks(RTensor&& tC_rMax, RTensor&& tC_rSum, CTensor tC_cD, Residue residue,
                                          bool interior, int m_tile, int n_tile, int M, int N,
                                          Params const* params_ptr)
        : tC_rMax(cute::forward<RTensor>(tC_rMax)), tC_rSum(cute::forward<RTensor>(tC_rSum)), tC_cD(tC_cD),
          residue(residue), interior(interior), m_tile(m_tile), n_tile(n_tile), M(M), N(N), params_ptr(params_ptr) {}

    RTensor tC_rMax, tC_rSum;  // (CPY, CPY_M, CPY_N, EPI_M, EPI_N), stride 0 along N: one register per row
    CTensor tC_cD;             // (m, n) of every element relative to this thread's first one
    Residue residue;           // (M, N) minus the coordinate of this thread's first element
    bool interior;             // the tile lies wholly inside the problem: no element needs the bounds test
    int m_tile, n_tile, M, N;
    Params const* params_ptr;

    template <class ElementAccumulator, class ElementInput, int FragmentSize>
    CUTLASS_DEVICE auto visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v, int epi_m, int epi_n,
                              cutlass::Array<ElementInput, FragmentSize> const& frg_input) {
      cute::Tensor rm = tC_rMax(cute::_, cute::_, cute::_, epi_m, epi_n);
      cute::Tensor rs = tC_rSum(cute::_, cute::_, cute::_, epi_m, epi_n);
      cute::Tensor c = tC_cD(cute::_, cute::_, cute::_, epi_m, epi_n);
      auto fold = [&](auto test_bounds) {
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < FragmentSize; ++i) {
          int k = epi_v * FragmentSize + i;
          float x = float(frg_input[i]);
          float m = rm(k), s = rs(k);
          float d = x - m;                               // +inf when m is still -inf
          float e = x == m ? 1.0f : scalar::fast_exp(-fabsf(d));  // x == m == +inf: no inf - inf
          float s_new = d > 0.0f ? fmaf(s, e, 1.0f) : s + e;
          float m_new = (d > 0.0f || x != x) ? x : m;    // a NaN becomes the max: it propagates
          bool take = x != -INFINITY;                    // an -inf logit adds nothing (and would give inf - inf)
          if constexpr (decltype(test_bounds)::value) take = take && cute::elem_less(c(k), residue);
          rs(k) = take ? s_new : s;
          rm(k) = take ? m_new : m;
        }
      };
      if (!CheckOOB || interior) {   // uniform across the tile's threads (interior_tiles.hpp)
        fold(cute::false_type{});
      } else {
        fold(cute::true_type{});
      }
      return frg_input;
    }

    // On the tile's last subtile (not in end(): a fusion's finishing node counts the tile in after every node's
    // reduce, last_tile.hpp).
    template <class STensor, class SyncFn, class VTensor>
    CUTLASS_DEVICE void reduce(STensor&&, SyncFn const&, int, int, bool is_last_iteration, VTensor) {
      using namespace cute;
      if (!is_last_iteration) return;
      constexpr int TileM = size<0>(CtaTileShapeMNK{});
      constexpr int TileN = size<1>(CtaTileShapeMNK{});
      // A tile wholly beyond the problem (the scheduler pads the grid) has no partials.
      if (m_tile * TileM >= M || n_tile * TileN >= N) return;
      Tensor rm = filter_zeros(tC_rMax);
      Tensor rs = filter_zeros(tC_rSum);
      Tensor c = make_tensor(tC_cD.data(), make_layout(rm.shape(), tC_cD.stride()));
      int base_row = M - int(get<0>(residue));
      int lane = int(threadIdx.x) & 31;
      int group = 0;  // lane bits along which lanes share rows: only the lowest lane of a group writes
      CUTLASS_PRAGMA_UNROLL
      for (int bit = 1; bit < 32; bit <<= 1) {
        bool same = __shfl_xor_sync(0xffffffffu, base_row, bit) == base_row;
        if (__all_sync(0xffffffffu, same)) {
          group |= bit;
          CUTLASS_PRAGMA_UNROLL
          for (int j = 0; j < size(rm); ++j) {
            float m2 = __shfl_xor_sync(0xffffffffu, rm(j), bit);
            float s2 = __shfl_xor_sync(0xffffffffu, rs(j), bit);
            merge(rm(j), rs(j), m2, s2);
          }
        }
      }
      if (lane & group) return;
      int64_t ld = int64_t((M + TileM - 1) / TileM) * TileM;
      float* out = params_ptr->ptr_partials + int64_t(n_tile) * ld;
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < size(rm); ++j) {
        int row = base_row + int(get<0>(c(j)));
        if (row < M) out[row] = rs(j) == 0.0f ? -INFINITY : rm(j) + scalar::fast_log(rs(j));  // NaN stays NaN
      }
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
    using namespace cute;
    constexpr int TileM = size<0>(CtaTileShapeMNK{});
    constexpr int TileN = size<1>(CtaTileShapeMNK{});
    Tensor gRow = make_tensor(make_gmem_ptr(static_cast<float*>(nullptr)),
                              make_layout(make_shape(Int<TileM>{}, Int<TileN>{}), make_stride(_1{}, _0{})));
    Tensor tC_gRow = cutlass::epilogue::fusion::sm90_partition_for_epilogue<ReferenceSrc>(
        gRow, args.epi_tile, args.tiled_copy, args.thread_idx);
    Tensor tC_rMax = make_tensor_like<float>(tC_gRow);
    Tensor tC_rSum = make_tensor_like<float>(tC_gRow);
    fill(tC_rMax, -INFINITY);
    fill(tC_rSum, 0.0f);
    auto [M, N, K, L] = args.problem_shape_mnkl;
    auto [m, n, k, l] = args.tile_coord_mnkl;
    return ConsumerStoreCallbacks<decltype(tC_rMax), decltype(args.tCcD), decltype(args.residue_tCcD)>(
        cute::move(tC_rMax), cute::move(tC_rSum), args.tCcD, args.residue_tCcD,
        tile_is_interior(args), int(m), int(n), int(M), int(N), params_ptr);
  }
};

}  // namespace coda::epi
