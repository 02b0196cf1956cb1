// coda/epilogues/variants/pair_gated_tma_store.hpp — the gated pair output (pair_gated_store.hpp) written
// through shared memory by TMA (KernelConfig(gated_store="tma")).
//
// Why: the half-width output of a gated activation (SwiGLU's y) is written from registers by default, 8-byte
// global stores after a transpose inside each quad of lanes, at the end of each subtile. Here the same transposed
// values go to a half-width staging buffer in shared memory (EPI_M x EPI_N / 2 per stage, the stages of the
// epilogue's TMA stores) and one TMA store per subtile writes it, in the same commit group as D's: the math warps
// issue two 8-byte shared-memory stores per subtile instead of two global ones, and the copy to global memory
// runs in the TMA unit while they go on with the next subtile.
//
// The collective's store loop gives the order: visit() computes the outputs, postreduce() writes the stage,
// the collective fences and syncs the warp group, tma_store() issues the copy, the store pipeline's acquire keeps
// a stage from being written again before its copy has read it. TMA clips rows and columns past the problem.
// TMA needs 16-byte aligned rows, and its stores write whole 16-byte pieces at the end of a row (measured: a
// 100-element bf16 row in a 104-element stride had its 4 padding elements written): an output whose pointer,
// leading stride or row length (N / 2 elements) is not a multiple of 16 bytes is written from registers as
// before (decided on the host, one uniform branch per subtile), so nothing past a row is ever written.
//
// A variant header (csrc/epilogues/variants/): included by the emitted source of the kernels that use it only,
// after the kernel templates, so a change here re-keys those kernels alone (coda_ext.jit.cache.variant_digest).
#pragma once

#include <cute/atom/copy_traits_sm90_tma.hpp>

#include "../nodes.hpp"

namespace coda::epi {

template <
  class Element,        // stored element type of the half-width output (bf16 / fp16 / float)
  class EpilogueTile,   // (EPI_M, EPI_N) of the full-width subtile
  int Stages,           // the collective's TMA store stages (StagesD): the stage is the store pipeline's
  class ActFn,
  cutlass::FloatRoundStyle RoundStyle = cutlass::FloatRoundStyle::round_to_nearest
>
struct Sm90PairGatedTmaStore : Sm90PlainNode<Sm90PairGatedStoreArguments<Element>> {
  // From Sm90PlainNode: no workspace, no producer loads. Its own parameters (the TMA descriptor) and shared memory.
  using Registers = Sm90PairGatedStore<Element, ActFn, RoundStyle>;   // its visit() and register stores
  static constexpr int kEpiM = decltype(cute::size<0>(EpilogueTile{}))::value;
  static constexpr int kEpiN = decltype(cute::size<1>(EpilogueTile{}))::value;
  static constexpr int kHalfN = kEpiN / 2;
  static_assert(kEpiN % 2 == 0 && kHalfN * int(sizeof(Element)) % 16 == 0,
                "a TMA row of the half-width subtile must be a multiple of 16 bytes");

  using StrideOut = cute::Stride<int64_t, cute::_1, int64_t>;
  using HalfTile = cute::Shape<cute::Int<kEpiM>, cute::Int<kHalfN>>;
  using SmemLayoutTma = cute::Layout<HalfTile, cute::Stride<cute::Int<kHalfN>, cute::_1>>;
  using SmemLayout = cute::Layout<cute::Shape<cute::Int<kEpiM>, cute::Int<kHalfN>, cute::Int<Stages>>,
                                  cute::Stride<cute::Int<kHalfN>, cute::_1, cute::Int<kEpiM * kHalfN>>>;

  struct SharedStorage {
    alignas(128) cute::array_aligned<Element, cute::cosize_v<SmemLayout>> smem_out;
  };

  using Arguments = Sm90PairGatedStoreArguments<Element>;

  struct Params {
    using TmaOut = decltype(cute::make_tma_copy(
        cute::SM90_TMA_STORE{},
        cute::make_tensor(static_cast<Element*>(nullptr), cute::repeat_like(StrideOut{}, int32_t(0)), StrideOut{}),
        SmemLayoutTma{}));
    TmaOut tma_out;
    typename Registers::Params registers;   // the pointer and leading stride, for the register stores
    bool use_tma = false;
  };

  // TMA stores need a 16-byte aligned base and leading stride, and a row of whole 16-byte pieces (see above).
  static bool tma_aligned(Arguments const& args, int64_t out_cols) {
    auto bytes16 = [](int64_t elements) { return (elements * int64_t(sizeof(Element))) % 16 == 0; };
    return reinterpret_cast<uintptr_t>(args.ptr_out) % 16 == 0 && bytes16(args.ld_out) && bytes16(out_cols);
  }

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& problem_shape, Arguments const& args, void*) {
    auto [M, N, K, L] = cute::append<4>(problem_shape, 1);
    Params params;
    params.registers = args;
    params.use_tma = tma_aligned(args, int64_t(N) / 2);
    if (params.use_tma) {
      auto out = cute::make_tensor(args.ptr_out, cute::make_layout(cute::make_shape(int32_t(M), int32_t(N) / 2, int32_t(L)),
                                                                   StrideOut{args.ld_out, cute::_1{}, int64_t(0)}));
      params.tma_out = cute::make_tma_copy(cute::SM90_TMA_STORE{}, out, SmemLayoutTma{});
    }
    return params;
  }

  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem_shape, Arguments const& args) {
    return Registers::can_implement(problem_shape, args);
  }
  CUTLASS_HOST_DEVICE Sm90PairGatedTmaStore() {}
  CUTLASS_HOST_DEVICE Sm90PairGatedTmaStore(Params const& params, SharedStorage const& shared)
      : tma_params_ptr(&params), smem_out(const_cast<Element*>(shared.smem_out.data())) {}

  Params const* tma_params_ptr = nullptr;
  Element* smem_out = nullptr;

  template <class RTensor, class CTensor, class ProblemShapeMN, class STensor, class GTensor>
  struct ConsumerStoreCallbacks
      : Registers::template ConsumerStoreCallbacks<RTensor, CTensor, ProblemShapeMN> {
    using Base = typename Registers::template ConsumerStoreCallbacks<RTensor, CTensor, ProblemShapeMN>;

    CUTLASS_DEVICE ConsumerStoreCallbacks(RTensor&& tC_rOut, CTensor&& tC_cOut, ProblemShapeMN shape_mn,
                                          Params const* params, Element* smem, STensor&& bSG_s, GTensor&& bSG_g,
                                          int tile_row, int tile_col)
        : Base(cute::forward<RTensor>(tC_rOut), cute::forward<CTensor>(tC_cOut), shape_mn, &params->registers),
          tma_params(params), smem(smem), bSG_s(cute::forward<STensor>(bSG_s)), bSG_g(cute::forward<GTensor>(bSG_g)),
          tile_row(tile_row), tile_col(tile_col) {}

    Params const* tma_params;
    Element* smem;       // (EPI_M, EPI_N / 2, Stages), row-major per stage
    STensor bSG_s;       // (TMA, TMA_M, TMA_N, Stages)
    GTensor bSG_g;       // (TMA, TMA_M, TMA_N, EPI_M, EPI_N)
    int tile_row, tile_col;   // the CTA tile's first row and (full-width) column

    CUTLASS_DEVICE void postreduce(int epi_m, int epi_n, int store_iteration, bool issue_smem_store) {
      if (!tma_params->use_tma || !issue_smem_store) {
        return;
      }
      Element* stage = smem + (store_iteration % Stages) * (kEpiM * kHalfN);
      int const row0 = tile_row + epi_m * kEpiM;   // the subtile's first row and full-width column
      int const col0 = tile_col + epi_n * kEpiN;
      cute::Tensor coords = this->tC_cOut(cute::_, cute::_, cute::_, epi_m, epi_n);
      using Size = decltype(cute::size(this->tC_rOut));
      if constexpr (cute::is_static<Size>::value) {
        if constexpr (Size::value == 16) {  // the wgmma layout of a 32-column subtile: 8 pairs per thread
          if (stage_quad_transposed(coords, stage, row0, col0)) {
            return;
          }
        }
      }
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < cute::size(this->tC_rOut); i += 2) {   // any layout: one element at a time
        auto c = coords(i);
        stage[(int(cute::get<0>(c)) - row0) * kHalfN + ((int(cute::get<1>(c)) - col0) >> 1)] = this->tC_rOut(i);
      }
    }

    // The quad transpose (QuadTranspose, pair_gated_store.hpp) into the stage: lane q of a quad writes the outputs
    // (r, 4q .. 4q + 3) of its two rows r, r + 8 with one 4-element store each. False (nothing written) where the
    // fragment is not the wgmma layout.
    template <class Coords>
    CUTLASS_DEVICE bool stage_quad_transposed(Coords const& coords, Element* stage, int row0, int col0) {
      return QuadTranspose<Element>::apply(coords, this->tC_rOut, col0,
                                           [&](Element (&v)[2][4], int top, int lead_col, int q) {
        int const r = top - row0;
        int const c = ((lead_col - col0) >> 1) + 4 * q;
        CUTLASS_PRAGMA_UNROLL
        for (int h = 0; h < 2; ++h) {
          cutlass::AlignedArray<Element, 4> vec;
          CUTLASS_PRAGMA_UNROLL
          for (int k = 0; k < 4; ++k) vec[k] = v[h][k];
          *reinterpret_cast<cutlass::AlignedArray<Element, 4>*>(stage + (r + 8 * h) * kHalfN + c) = vec;
        }
      });
    }

    CUTLASS_DEVICE void tma_store(int epi_m, int epi_n, int store_iteration, bool issue_tma_store) {
      if (tma_params->use_tma && issue_tma_store) {
        cute::copy(tma_params->tma_out, bSG_s(cute::_, cute::_, cute::_, store_iteration % Stages),
                   bSG_g(cute::_, cute::_, cute::_, epi_m, epi_n));
      }
    }

    CUTLASS_DEVICE void end_loop(int epi_m, int epi_n) {
      if (!tma_params->use_tma) {
        Base::end_loop(epi_m, epi_n);
      }
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
    using namespace cute;
    auto [M, N, K, L] = args.problem_shape_mnkl;
    auto [m, n, k, l] = args.tile_coord_mnkl;
    Tensor coord = make_identity_tensor(make_shape(M, N, L));
    Tensor tC_cOut = cutlass::epilogue::fusion::sm90_partition_for_epilogue<ReferenceSrc>(
        coord, args.tile_shape_mnk, args.tile_coord_mnkl, args.epi_tile, args.tiled_copy, args.thread_idx);
    Tensor tC_rOut = make_tensor<Element>(take<0, 3>(shape(tC_cOut)));
    auto shape_mn = make_shape(int(M), int(N));

    constexpr int kTileM = decltype(size<0>(args.tile_shape_mnk))::value;
    constexpr int kTileN = decltype(size<1>(args.tile_shape_mnk))::value;
    Tensor mOut = tma_params_ptr->tma_out.get_tma_tensor(make_shape(int32_t(M), int32_t(N) / 2, int32_t(L)));
    Tensor gOut = local_tile(mOut, make_shape(Int<kTileM>{}, Int<kTileN / 2>{}), make_coord(m, n, l));
    Tensor gOut_epi = flat_divide(gOut, HalfTile{});                     // (EPI_M, EPI_N / 2, SUB_M, SUB_N)
    Tensor sOut = make_tensor(make_smem_ptr(smem_out), SmemLayout{});    // (EPI_M, EPI_N / 2, Stages)
    auto thr = tma_params_ptr->tma_out.get_slice(_0{});
    Tensor bSG_s = thr.partition_S(sOut);
    Tensor bSG_g = thr.partition_D(gOut_epi);
    return ConsumerStoreCallbacks<decltype(tC_rOut), decltype(tC_cOut), decltype(shape_mn), decltype(bSG_s),
                                  decltype(bSG_g)>(
        cute::move(tC_rOut), cute::move(tC_cOut), shape_mn, tma_params_ptr, smem_out, cute::move(bSG_s),
        cute::move(bSG_g), int(m) * kTileM, int(n) * kTileN);
  }
};

// PairGatedStore (nodes.hpp) with its output staged in shared memory and TMA-stored, at the stages of the
// collective's TMA stores.
template <class Cfg, class T, class Act>
struct PairGatedStoreTma {
  using Desc = detail::AuxStoreDescriptor<typename Cfg::EpilogueDescriptor, typename Cfg::LayoutD, T>;
  using Node = Sm90PairGatedTmaStore<T, typename Desc::EpilogueTile, Desc::Stages, Act>;
  static typename Node::Arguments args(CodaSlot const& s) { return {static_cast<T*>(s.ptr), s.ld}; }
};

}  // namespace coda::epi
