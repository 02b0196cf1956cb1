// coda/epilogues/pair_gated_store.hpp — gated activation on adjacent column pairs, stored
// at half width:  out[m, i] = Act(x[m, 2i]) * x[m, 2i + 1]   (SwiGLU of an interleaved
// gate/up projection when Act = Silu).
//
// A CUTLASS SM90 epilogue visitor node (the node contract of sm90_visitor_*.hpp). It is a
// sink that passes its input through unchanged, so it can sit anywhere in a tree.
// The wgmma accumulator layout gives every thread adjacent column pairs (2c, 2c + 1) in
// consecutive fragment slots, so each pair is combined in registers. At the end of each
// epilogue subtile the results are written with 4-element vector stores after a transpose
// within each quad of lanes (when the subtile has the wgmma layout: decided at compile time from
// the static coordinate layout, the quad's arrangement checked at run time), else with
// predicated per-element stores.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp>

#include "functors.hpp"
#include "node_base.hpp"

namespace coda::epi {

// The results of a 32-column subtile (16 fragment slots, the outputs at the even ones) transposed inside each quad
// of lanes, for 4-element vector stores. In the wgmma accumulator layout the 4 lanes of a quad share two rows
// (r, r + 8) and lane q holds the outputs (r, 4j + q), j = 0..3, of a 16-output subtile row: after the transpose
// lane q holds (r, 4q + k), k = 0..3.
// Which fragment slot holds which output is decided at compile time: the coordinates are the thread's first one plus
// a static layout, so every offset below folds to a constant (a layout other than wgmma's folds `layout_ok` to
// false). At run time only the quad's arrangement is checked (two shuffles and a vote per subtile).
template <class Element>
struct QuadTranspose {
  // Two elements from lane (this lane ^ mask), as one 32-bit shuffle for 16-bit elements.
  CUTLASS_DEVICE static void exchange(Element& a, Element& b, int mask) {
    if constexpr (sizeof(Element) == 2) {
      cutlass::Array<Element, 2> pair;
      pair[0] = a;
      pair[1] = b;
      uint32_t bits;
      memcpy(&bits, &pair, 4);
      bits = __shfl_xor_sync(0xffffffffu, bits, mask);
      memcpy(&pair, &bits, 4);
      a = pair[0];
      b = pair[1];
    } else {
      static_assert(sizeof(Element) == 4, "pair outputs are 16- or 32-bit");
      uint32_t x, y;
      memcpy(&x, &a, 4);
      memcpy(&y, &b, 4);
      x = __shfl_xor_sync(0xffffffffu, x, mask);
      y = __shfl_xor_sync(0xffffffffu, y, mask);
      memcpy(&a, &x, 4);
      memcpy(&b, &y, 4);
    }
  }

  // Transposes the fragment `frag` at the (full-width) coordinates `coords` and calls store(v, top, lead_col, q):
  // v[h][k] is the output (top + 8h, lead_col / 2 + 4q + k), where top is the fragment's first row, lead_col the
  // first column of lane 0 of the quad and q this lane within it. False (store not called) where the fragment is
  // not the wgmma layout, or the quad's lanes are not at consecutive column pairs of an 8-column group counted
  // from col_origin.
  template <class Coords, class Frag, class Store>
  CUTLASS_DEVICE static bool apply(Coords const& coords, Frag const& frag, int col_origin, Store&& store) {
    // Offsets from element 0 (static), and the fragment's top-left corner relative to it.
    int dr_min = 0, dc_min = 0;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 2; i < 16; i += 2) {
      dr_min = cute::min(dr_min, int(cute::get<0>(coords(i))) - int(cute::get<0>(coords(0))));
      dc_min = cute::min(dc_min, int(cute::get<1>(coords(i))) - int(cute::get<1>(coords(0))));
    }
    int const row0 = int(cute::get<0>(coords(0))) + dr_min;
    int const col0 = int(cute::get<1>(coords(0))) + dc_min;
    Element v[2][4];
    bool layout_ok = true;
    unsigned filled = 0;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < 16; i += 2) {
      int dr = int(cute::get<0>(coords(i))) - int(cute::get<0>(coords(0))) - dr_min;   // static: 0 or 8
      int dc = int(cute::get<1>(coords(i))) - int(cute::get<1>(coords(0))) - dc_min;   // static: 0, 8, 16, 24
      bool here = (dr == 0 || dr == 8) && dc >= 0 && dc < 32 && (dc & 7) == 0;
      layout_ok = layout_ok && here;
      int slot = here ? (dr >> 3) * 4 + (dc >> 3) : 0;
      filled |= 1u << slot;
      v[slot >> 2][slot & 3] = frag(i);
    }
    if (!layout_ok || filled != 0xffu) {
      return false;
    }
    int const lane = int(threadIdx.x) & 31;
    int const q = lane & 3;
    int const lead_row = __shfl_sync(0xffffffffu, row0, lane & ~3);
    int const lead_col = __shfl_sync(0xffffffffu, col0, lane & ~3);
    bool const quad_ok = row0 == lead_row && col0 == lead_col + 2 * q && ((lead_col - col_origin) & 7) == 0;
    if (!__all_sync(0xffffffffu, quad_ok)) {
      return false;
    }
    // 4 x 4 transpose per row in two butterfly steps. Step 1 (lanes q, q ^ 2): the lanes with q & 2 trade their
    // slots 0, 1 for the partner's 2, 3. Step 2 (lanes q, q ^ 1): the odd lanes trade slots 0, 2 for the partner's
    // 1, 3. Lane q then holds (r, 4q + k) in slot k.
    bool const hi = (q & 2) != 0;
    bool const odd = (q & 1) != 0;
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < 2; ++h) {
      Element a = hi ? v[h][0] : v[h][2];
      Element b = hi ? v[h][1] : v[h][3];
      exchange(a, b, 2);
      if (hi) { v[h][0] = a; v[h][1] = b; } else { v[h][2] = a; v[h][3] = b; }
      a = odd ? v[h][0] : v[h][1];
      b = odd ? v[h][2] : v[h][3];
      exchange(a, b, 1);
      if (odd) { v[h][0] = a; v[h][2] = b; } else { v[h][1] = a; v[h][3] = b; }
    }
    store(v, row0, lead_col, q);
    return true;
  }
};

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

    // Vector stores after the quad transpose (QuadTranspose): lane q of a quad writes the outputs (r, 4q .. 4q + 3)
    // of its two rows r, r + 8 with one 4-element store each. False (nothing written) where the fragment is not the
    // wgmma layout.
    template <class Coords>
    CUTLASS_DEVICE bool store_quad_transposed(Coords const& coords) {
      return QuadTranspose<Element>::apply(coords, tC_rOut, 0, [&](Element (&v)[2][4], int row0, int lead_col, int q) {
        Element* ptr = params_ptr->ptr_out;
        int64_t ld = params_ptr->ld_out;
        int out_cols = cute::get<1>(shape_mn) >> 1;
        int oc = (lead_col >> 1) + 4 * q;
        bool vector_ok = (ld % 4 == 0) && (reinterpret_cast<uintptr_t>(ptr) % (4 * sizeof(Element)) == 0);
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < 2; ++r) {
          int row = row0 + 8 * r;
          if (row >= cute::get<0>(shape_mn)) continue;
          Element* dst = ptr + int64_t(row) * ld + oc;
          if (vector_ok && oc + 3 < out_cols) {
            cutlass::AlignedArray<Element, 4> vec;
            CUTLASS_PRAGMA_UNROLL
            for (int k = 0; k < 4; ++k) vec[k] = v[r][k];
            *reinterpret_cast<cutlass::AlignedArray<Element, 4>*>(dst) = vec;
          } else {
            CUTLASS_PRAGMA_UNROLL
            for (int k = 0; k < 4; ++k) {
              if (oc + k < out_cols) dst[k] = v[r][k];
            }
          }
        }
      });
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
