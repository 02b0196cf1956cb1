// coda/kernels/ops/fusions.cuh — the epilogues of libcoda's ready-made ops, written with the
// same templates the coda_ext JIT emits (coda::kernels::Config / EpilogueGemm, coda::epi node
// wrappers, Sm90EVT trees), so a library kernel and the JIT kernel of the same graph are the
// same instantiation. Each op is a struct templated on the element type T; a translation unit
// under csrc/kernels/ops/ instantiates one of them for one T and exports its entry points:
//
//   using Op = coda::ops::GemmBiasAct<cutlass::bfloat16_t>;
//   CODA_DEFINE_NAMED_ENTRY_POINTS(coda_gemm_bias_act_bf16, Op::Kernel, Op::fusion_arguments,
//                                  Op::kReductions)
//
// The slots each op reads are fixed in contract.h; csrc/lib fills them. Most kernels of the
// ready ops (linear_residual_norm, linear_swiglu, qkv_rope, ...) are emitted from their Python
// graphs instead (python -m coda_ext libgen, contract_generated.h); RmsLinear below is the one
// of them written here, because its activation is chosen at run time.
#pragma once

#include <type_traits>

#include "../epilogue_gemm.cuh"
#include "contract.h"
#include "contract_generated.h"

namespace coda::ops {

using namespace coda::epi;
using coda::kernels::ReduceAxis;
using coda::kernels::ReduceCombine;
using coda::kernels::ReductionList;

template <class T>
using DefaultConfig =
    coda::kernels::Config<T, T, kTileM, kTileN, kTileK, kClusterM, kClusterN,
                          std::conditional_t<kCooperative, coda::kernels::Cooperative, coda::kernels::Pingpong>>;

// An element-wise activation chosen at run time, for Compute<Cfg, SelectActivation>: one kernel
// serves every coda::Activation. The scalar rules are coda::epi's (functors.hpp), so the math is
// the JIT's. Sm90Compute passes a functor's `Arguments` (here: which activation) as the last
// call argument, the way CUTLASS passes activation hyper-parameters. (Arguments is one type for
// every Fragment: Sm90Compute takes it from SelectActivation<float> and calls the fragment's.)
struct SelectActivationArguments {
  int32_t kind = act::kIdentity;  // a coda::Activation value (contract.h, namespace act)
};

template <class Fragment>
struct SelectActivation {
  using Arguments = SelectActivationArguments;

  template <int N>
  CUTLASS_HOST_DEVICE cutlass::Array<float, N> operator()(cutlass::Array<float, N> const& x,
                                                          Arguments const& args) const {
    switch (args.kind) {
      case act::kRelu: return MapArrays<scalar::Relu>{}(x);
      case act::kSilu: return MapArrays<scalar::Silu>{}(x);
      case act::kGeluTanh: return MapArrays<scalar::GeluTanh>{}(x);
      case act::kGelu: return MapArrays<scalar::GeluErf>{}(x);
      default: return x;  // act::kIdentity (the host rejects any other value before launch)
    }
  }
};

// D = A · Bᵀ
template <class T>
struct Gemm {
  using Cfg = DefaultConfig<T>;
  using n0 = Accumulator;
  using Fusion = n0::Node;

  static typename Fusion::Arguments fusion_arguments(CodaLaunch const&, float* const*) { return n0::args(); }
  static constexpr ReductionList kReductions{0, {}};
  using Kernel = coda::kernels::EpilogueGemm<Cfg, Fusion>;
};

// D = act(A · Bᵀ + bias[n])
template <class T>
struct GemmBiasAct {
  using Cfg = DefaultConfig<T>;
  using n0 = Accumulator;
  using n1 = RowVector<Cfg, T>;              // bias
  using n2 = Compute<Cfg, Add>;
  using n3 = Compute<Cfg, SelectActivation>;
  using t2 = fusion::Sm90EVT<typename n2::Node, n0::Node, typename n1::Node>;
  using t3 = fusion::Sm90EVT<typename n3::Node, t2>;
  using Fusion = t3;

  static typename Fusion::Arguments fusion_arguments(CodaLaunch const& L, float* const*) {
    typename t2::Arguments a2{n0::args(), n1::args(L.slots[slot::kBias]), n2::args()};
    typename n3::Node::Arguments activation{static_cast<int32_t>(L.slots[slot::kActivation].value)};
    typename t3::Arguments a3{a2, activation};
    return a3;
  }
  static constexpr ReductionList kReductions{0, {}};
  using Kernel = coda::kernels::EpilogueGemm<Cfg, Fusion>;
};

// D = A · Bᵀ + residual
template <class T>
struct GemmResidual {
  using Cfg = DefaultConfig<T>;
  using n0 = Accumulator;
  using n1 = TileLoad<Cfg, T>;               // residual
  using n2 = Compute<Cfg, Add>;
  using t2 = fusion::Sm90EVT<typename n2::Node, n0::Node, typename n1::Node>;
  using Fusion = t2;

  static typename Fusion::Arguments fusion_arguments(CodaLaunch const& L, float* const*) {
    typename t2::Arguments a2{n0::args(), n1::args(L.slots[slot::kResidual]), n2::args()};
    return a2;
  }
  static constexpr ReductionList kReductions{0, {}};
  using Kernel = coda::kernels::EpilogueGemm<Cfg, Fusion>;
};

// Z = D = A · Bᵀ;  Y[:, i] = silu(acc[:, 2i]) · acc[:, 2i+1] (half width)
template <class T>
struct GemmSwiglu {
  using Cfg = DefaultConfig<T>;
  using n0 = Accumulator;
  using n1 = PairGatedStore<Cfg, T, scalar::Silu>;  // Y
  using t1 = fusion::Sm90EVT<typename n1::Node, n0::Node>;
  using Fusion = t1;

  static typename Fusion::Arguments fusion_arguments(CodaLaunch const& L, float* const*) {
    typename t1::Arguments a1{n0::args(), n1::args(L.slots[slot::kGatedOut])};
    return a1;
  }
  static constexpr ReductionList kReductions{0, {}};
  using Kernel = coda::kernels::EpilogueGemm<Cfg, Fusion>;
};

// D = A · Bᵀ;  sumsq[m] = Σ_n acc[m, n]²  (per-tile partials, finished by kernels::launch_finalize)
template <class T>
struct GemmRowSumSq {
  using Cfg = DefaultConfig<T>;
  using n0 = Accumulator;
  using n1 = RowReduce<Cfg, ReduceSumSq>;
  using t1 = fusion::Sm90EVT<typename n1::Node, n0::Node>;
  using Fusion = t1;

  static typename Fusion::Arguments fusion_arguments(CodaLaunch const&, float* const* partials) {
    typename t1::Arguments a1{n0::args(), n1::args(partials[0], 0.0f)};
    return a1;
  }
  static constexpr ReductionList kReductions{1, {{slot::kRowSumSq, ReduceAxis::Rows, ReduceCombine::Sum}}};
  using Kernel = coda::kernels::EpilogueGemm<Cfg, Fusion>;
};

// D = act(rstd[m] · (A · Bᵀ)), act a coda::Activation chosen at run time: the tree the JIT emits
// for coda_ext.ops.rms_scale.graph(activation) (Mul(rstd, acc), then the activation), with
// SelectActivation in place of the fixed activation. Cfg is the emitted graph's (the generated
// rms_linear_<dtype>.cu passes it); the slots are the graph's, then the activation's.
template <class Cfg>
struct RmsLinear {
  using n0 = ColVector<Cfg, float>;  // rstd
  using n1 = Accumulator;
  using n2 = Compute<Cfg, Mul>;
  using n3 = Compute<Cfg, SelectActivation>;
  using t2 = fusion::Sm90EVT<typename n2::Node, typename n0::Node, n1::Node>;
  using t3 = fusion::Sm90EVT<typename n3::Node, t2>;
  using Fusion = t3;

  static typename Fusion::Arguments fusion_arguments(CodaLaunch const& L, float* const*) {
    namespace s = gen::rms_linear::slot;
    typename t2::Arguments a2{n0::args(L.slots[s::kRstd]), n1::args(), n2::args()};
    typename n3::Node::Arguments activation{static_cast<int32_t>(L.slots[s::kActivation].value)};
    typename t3::Arguments a3{a2, activation};
    return a3;
  }
  static constexpr ReductionList kReductions{0, {}};
  using Kernel = coda::kernels::EpilogueGemm<Cfg, Fusion>;
};

}  // namespace coda::ops
