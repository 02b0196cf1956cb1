// coda/epilogues/pair_gated_store.hpp — gated activation on adjacent column pairs, stored
// at half width:  out[m, i] = Act(x[m, 2i]) * x[m, 2i + 1]   (SwiGLU of an interleaved
// gate/up projection when Act = Silu).
//
// A CUTLASS SM90 epilogue visitor node (the node contract of sm90_visitor_*.hpp). It is a
// sink that passes its input through unchanged, so it can sit anywhere in a tree.
// The wgmma accumulator layout gives every thread adjacent column pairs (2c, 2c + 1) in
// consecutive fragment slots, so each pair is combined in registers. At the end of each
// epilogue subtile the results are written with 4-element vector stores after a transpose
// within each quad of lanes (when the subtile has the wgmma layout, checked at run time), else
// with predicated per-element stores.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp>

#include "functors.hpp"
#include "node_base.hpp"

namespace coda::epi {

template <class Element>
struct Sm90PairGatedStoreArguments {
  Element* ptr_out = nullptr;  // (M, N / 2), row-major
  int64_t ld_out = 0;          // leading stride of the output, in elements
};

template <
  class Element,        // stored element type of the half-width output (bf16 / fp16 / float)
  class ActFn,          // scalar rule applied to the gate column, e.g. scalar::Silu
  cutlass::FloatRoundStyle RoundStyle = cutlass::FloatRoundStyle::round_to_nearest
>
struct Sm90PairGatedStore : Sm90PlainNode<Sm90PairGatedStoreArguments<Element>> {
  using Base = Sm90PlainNode<Sm90PairGatedStoreArguments<Element>>;
  using typename Base::Params;
  using Base::Base;

  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem_shape, Params const& args) {
    auto N = cute::get<1>(problem_shape);
    return (N % 2 == 0) && args.ptr_out != nullptr && args.ld_out >= N / 2;
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
      cute::Tensor coords = tC_cOut(cute::_, cute::_, cute::_, epi_m, epi_n);
      using Size = decltype(cute::size(tC_rOut));
      if constexpr (cute::is_static<Size>::value) {
        if constexpr (Size::value == 16) {  // 8 pairs per thread: the wgmma layout of a 32-column subtile
          if (store_quad_transposed(coords)) {
            return;
          }
        }
      }
      store_elementwise(coords);
    }

    // One predicated store per output element (any layout).
    template <class Coords>
    CUTLASS_DEVICE void store_elementwise(Coords const& coords) {
      Element* ptr = params_ptr->ptr_out;
      int64_t ld = params_ptr->ld_out;
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

    template <class T>
    CUTLASS_DEVICE static T shfl(T x, int src_lane) {
      static_assert(sizeof(T) == 4, "shuffles move 32-bit words");
      uint32_t bits;
      memcpy(&bits, &x, 4);
      bits = __shfl_sync(0xffffffffu, bits, src_lane);
      memcpy(&x, &bits, 4);
      return x;
    }

    // Vector stores through a transpose inside each quad of lanes. In the wgmma accumulator
    // layout the 4 lanes of a quad share two rows (r, r + 8) and lane q holds the outputs
    // (r, 4j + q), j = 0..3, of a 16-output (32-column) subtile row: after the transpose lane q
    // holds (r, 4q + k), k = 0..3, and writes them with one 4-element store. The layout is
    // checked from the coordinates first: if any lane of the warp sees another layout, the
    // warp returns false and stores element by element.
    template <class Coords>
    CUTLASS_DEVICE bool store_quad_transposed(Coords const& coords) {
      int row0 = cute::get<0>(coords(0));
      int oc0 = cute::get<1>(coords(0)) >> 1;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 2; i < 16; i += 2) {
        row0 = cute::min(row0, int(cute::get<0>(coords(i))));
        oc0 = cute::min(oc0, int(cute::get<1>(coords(i))) >> 1);
      }
      Element v[2][4];
      unsigned filled = 0;
      bool ok = true;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < 16; i += 2) {
        int dr = int(cute::get<0>(coords(i))) - row0;
        int doc = (int(cute::get<1>(coords(i))) >> 1) - oc0;
        ok = ok && (dr == 0 || dr == 8) && (doc & 3) == 0 && doc < 16;
        int slot = (dr >> 3) * 4 + (doc >> 2);
        filled |= 1u << (slot & 7);
        CUTLASS_PRAGMA_UNROLL
        for (int s = 0; s < 8; ++s) {
          if (slot == s) v[s / 4][s % 4] = tC_rOut(i);
        }
      }
      int lane = int(threadIdx.x) & 31;
      int q = lane & 3;
      int leader = lane & ~3;
      int lead_row = __shfl_sync(0xffffffffu, row0, leader);
      int lead_oc = __shfl_sync(0xffffffffu, oc0, leader);
      ok = ok && filled == 0xffu && row0 == lead_row && oc0 == lead_oc + q && (lead_oc & 3) == 0;
      if (!__all_sync(0xffffffffu, ok)) {
        return false;
      }
      // Transpose: in round s lane q sends its value for column group (q - s) & 3 and receives
      // lane ((q + s) & 3)'s value for group q, which is output 4q + ((q + s) & 3).
      Element w[2][4];
      CUTLASS_PRAGMA_UNROLL
      for (int s = 0; s < 4; ++s) {
        int send = (q - s) & 3;
        int from = (q + s) & 3;
        cutlass::Array<Element, 2> out;
        out[0] = send == 0 ? v[0][0] : send == 1 ? v[0][1] : send == 2 ? v[0][2] : v[0][3];
        out[1] = send == 0 ? v[1][0] : send == 1 ? v[1][1] : send == 2 ? v[1][2] : v[1][3];
        cutlass::Array<Element, 2> in;
        if constexpr (sizeof(Element) == 2) {
          in = shfl(out, leader | from);
        } else {
          in[0] = shfl(out[0], leader | from);
          in[1] = shfl(out[1], leader | from);
        }
        CUTLASS_PRAGMA_UNROLL
        for (int k = 0; k < 4; ++k) {
          if (from == k) {
            w[0][k] = in[0];
            w[1][k] = in[1];
          }
        }
      }
      Element* ptr = params_ptr->ptr_out;
      int64_t ld = params_ptr->ld_out;
      int out_cols = cute::get<1>(shape_mn) >> 1;
      int oc = lead_oc + 4 * q;
      bool vector_ok = (ld % 4 == 0) && (reinterpret_cast<uintptr_t>(ptr) % (4 * sizeof(Element)) == 0);
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < 2; ++r) {
        int row = row0 + 8 * r;
        if (row >= cute::get<0>(shape_mn)) continue;
        Element* dst = ptr + int64_t(row) * ld + oc;
        if (vector_ok && oc + 3 < out_cols) {
          cutlass::AlignedArray<Element, 4> vec;
          CUTLASS_PRAGMA_UNROLL
          for (int k = 0; k < 4; ++k) vec[k] = w[r][k];
          *reinterpret_cast<cutlass::AlignedArray<Element, 4>*>(dst) = vec;
        } else {
          CUTLASS_PRAGMA_UNROLL
          for (int k = 0; k < 4; ++k) {
            if (oc + k < out_cols) dst[k] = w[r][k];
          }
        }
      }
      return true;
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
        cute::move(tC_rOut), cute::move(tC_cOut), shape_mn, this->params_ptr);
  }
};

}  // namespace coda::epi
