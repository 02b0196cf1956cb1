// coda/epilogues/functors.hpp — the element-wise math of coda_ext epilogue graphs.
//
// Sm90Compute<Fn, ...> instantiates Fn<Array<float, FragmentSize>> and calls it on whole
// fragments, so every functor here is a one-parameter template whose call operator takes
// arrays and maps a scalar rule over them. One scalar rule per graph op; the math is fp32
// fp32. An epilogue whose math outlasts the tile's mainloop (a short K, or the cooperative
// schedule, which does not overlap them) costs GEMM time for every instruction per element: exp,
// log, division and the sigmoid family use the hardware approximations (ex2 and rcp with
// flush-to-zero, __logf; relative error ~1e-6, far below the 16-bit rounding of every stored
// result; results below fp32's normal range are 0), the rest are IEEE fp32.
#pragma once

#include <cstdint>
#include <cstring>

#include <cutlass/array.h>
#include <cutlass/cutlass.h>
#include <cutlass/numeric_conversion.h>

namespace coda::epi {

// Applies the scalar rule `Op` element by element to one or more arrays (or scalars).
template <class Op>
struct MapArrays {
  template <class T, int N, class... Rest>
  CUTLASS_HOST_DEVICE cutlass::Array<T, N> operator()(cutlass::Array<T, N> const& a,
                                                      Rest const&... rest) const {
    cutlass::Array<T, N> out;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) {
      out[i] = Op{}(a[i], rest[i]...);
    }
    return out;
  }
  CUTLASS_HOST_DEVICE float operator()(float a) const { return Op{}(a); }
  CUTLASS_HOST_DEVICE float operator()(float a, float b) const { return Op{}(a, b); }
  CUTLASS_HOST_DEVICE float operator()(float a, float b, float c) const { return Op{}(a, b, c); }
};

namespace scalar {
struct Add { CUTLASS_HOST_DEVICE float operator()(float a, float b) const { return a + b; } };
struct Sub { CUTLASS_HOST_DEVICE float operator()(float a, float b) const { return a - b; } };
struct Mul { CUTLASS_HOST_DEVICE float operator()(float a, float b) const { return a * b; } };
// Fast math on the device, IEEE on the host (the functors are also host-callable). The device's
// exp and reciprocal are one MUFU instruction each with flush-to-zero (ex2.approx.ftz and
// rcp.approx.ftz); without it (__expf, __fdividef) each adds a compare and two scalings for
// arguments at the edges of the normal range.
CUTLASS_HOST_DEVICE float fast_exp2(float a) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(a));
  return r;
#else
  return exp2f(a);
#endif
}
CUTLASS_HOST_DEVICE float fast_exp(float a) { return fast_exp2(a * 1.4426950408889634f); }
CUTLASS_HOST_DEVICE float fast_rcp(float a) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(a));
  return r;
#else
  return 1.0f / a;
#endif
}
CUTLASS_HOST_DEVICE float fast_log(float a) {
#if defined(__CUDA_ARCH__)
  return __logf(a);
#else
  return logf(a);
#endif
}
CUTLASS_HOST_DEVICE float fast_div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return a * fast_rcp(b);   // as __fdividef: 0 where 2^126 < |b|
#else
  return a / b;
#endif
}
CUTLASS_HOST_DEVICE float fast_sigmoid(float a) { return fast_rcp(1.0f + fast_exp(-a)); }

struct Div { CUTLASS_HOST_DEVICE float operator()(float a, float b) const { return fast_div(a, b); } };
struct Max {  // NaN-propagating, like torch.maximum
  CUTLASS_HOST_DEVICE float operator()(float a, float b) const {
    return (a != a || b != b) ? (a + b) : (a > b ? a : b);
  }
};
struct Min {
  CUTLASS_HOST_DEVICE float operator()(float a, float b) const {
    return (a != a || b != b) ? (a + b) : (a < b ? a : b);
  }
};
struct Fma { CUTLASS_HOST_DEVICE float operator()(float a, float b, float c) const { return fmaf(a, b, c); } };
struct Identity { CUTLASS_HOST_DEVICE float operator()(float a) const { return a; } };
struct Neg { CUTLASS_HOST_DEVICE float operator()(float a) const { return -a; } };
struct Abs { CUTLASS_HOST_DEVICE float operator()(float a) const { return fabsf(a); } };
struct Exp { CUTLASS_HOST_DEVICE float operator()(float a) const { return fast_exp(a); } };
struct Log { CUTLASS_HOST_DEVICE float operator()(float a) const { return fast_log(a); } };
struct Sqrt { CUTLASS_HOST_DEVICE float operator()(float a) const { return sqrtf(a); } };
struct Rsqrt {
  CUTLASS_HOST_DEVICE float operator()(float a) const {
#if defined(__CUDA_ARCH__)
    return rsqrtf(a);
#else
    return 1.0f / sqrtf(a);
#endif
  }
};
struct Square { CUTLASS_HOST_DEVICE float operator()(float a) const { return a * a; } };
struct Tanh { CUTLASS_HOST_DEVICE float operator()(float a) const { return tanhf(a); } };
struct Sigmoid { CUTLASS_HOST_DEVICE float operator()(float a) const { return fast_sigmoid(a); } };
struct Silu { CUTLASS_HOST_DEVICE float operator()(float a) const { return a * fast_sigmoid(a); } };
struct Relu { CUTLASS_HOST_DEVICE float operator()(float a) const { return (a != a) ? a : (a > 0.f ? a : 0.f); } };
// GELU's tanh form: 0.5 a (1 + tanh(y)) = a s with s = sigmoid(2y) = 1 / (1 + 2^u), where
// 2y = a (k1 + k3 a²), k1 = 2 √(2/π), k3 = 0.044715 k1, and u = -2y log2(e) = a (c1 + c3 a²): the
// exponent's scale folded into the constants (three FMUL/FFMA, one ex2, one rcp, one FMUL).
struct GeluTanhParts {
  float e;   // 2^u = exp(-2y)
  float s;   // sigmoid(2y)
};
CUTLASS_HOST_DEVICE GeluTanhParts gelu_tanh_parts(float a, float a2) {
  float e = fast_exp2(a * fmaf(-0.10294323958002350f, a2, -2.3022081981443250f));   // c3, c1
  return {e, fast_rcp(1.0f + e)};   // a -> -inf: e = inf, s = 0
}
struct GeluTanh {
  CUTLASS_HOST_DEVICE float operator()(float a) const { return a * gelu_tanh_parts(a, a * a).s; }
};
// Its derivative: d/da (a s) = s + a (2y)' s (1 - s), (2y)' = k1 + 3 k3 a², and 1 - s = e s (no
// cancellation where s is near 1; where e overflows s is 0 and so is the term: the min keeps inf * 0 out).
struct GeluTanhGrad {
  CUTLASS_HOST_DEVICE float operator()(float a) const {
    float a2 = a * a;
    GeluTanhParts p = gelu_tanh_parts(a, a2);
    float ds = p.s * fminf(p.e * p.s, 1.0f);   // s (1 - s); NaN stays NaN (fminf(NaN, 1) = 1, s NaN)
    return fmaf(a * ds, fmaf(0.21406444881780073f, a2, 1.5957691216057308f), p.s);   // 3 k3, k1
  }
};
// Φ(a), the standard normal CDF, from exp(-a² / 2) (which φ(a), GELU's derivative, shares): with
// z = |a| / √2 and t = 1 / (1 + p z), erfc(z) = t Q(t) exp(-z²), where Q, a degree-9 polynomial on
// t in (0, 1], is fitted (weighted minimax, p = 0.4525) to erfcx(z) / t: relative error 3.2e-8 in
// exact arithmetic, tails included, where 0.5 (1 + erf) cancels; in fp32 the rounding of the
// exponent's argument adds about 1e-7 a². No branch: one exp, one reciprocal and ten FMAs.
struct NormalTail {
  float e;           // exp(-a² / 2)
  float half_erfc;   // 0.5 erfc(|a| / √2): Φ(-|a|)
};
CUTLASS_HOST_DEVICE NormalTail normal_tail(float a) {
  float e = fast_exp2(a * a * -0.7213475204444817f);   // -log2(e) / 2
  float t = fast_rcp(fmaf(0.319965818f, fabsf(a), 1.0f));   // p / √2
  float q = fmaf(t, -0.0210773461f, 0.0954338536f);   // 0.5 Q
  q = fmaf(t, q, -0.146824628f);
  q = fmaf(t, q, 0.0654853433f);
  q = fmaf(t, q, -0.00943693891f);
  q = fmaf(t, q, 0.0586874709f);
  q = fmaf(t, q, 0.0878237411f);
  q = fmaf(t, q, 0.11461331f);
  q = fmaf(t, q, 0.127647296f);
  q = fmaf(t, q, 0.127647892f);
  return {e, t * q * e};
}
CUTLASS_HOST_DEVICE float normal_cdf(float a) {
  float h = normal_tail(a).half_erfc;
  return a > 0.0f ? 1.0f - h : h;   // NaN: the second branch, NaN
}
struct GeluErf {  // a Φ(a) == 0.5 a (1 + erf(a / √2))
  CUTLASS_HOST_DEVICE float operator()(float a) const { return a * normal_cdf(a); }
};
struct GeluErfGrad {  // d/da GELU(a) = Φ(a) + a φ(a), φ(a) = exp(-a² / 2) / √(2π)
  CUTLASS_HOST_DEVICE float operator()(float a) const {
    NormalTail n = normal_tail(a);
    return fmaf(a * 0.3989422804014327f, n.e, a > 0.0f ? 1.0f - n.half_erfc : n.half_erfc);
  }
};
// Reduction input rule of a sum-of-squares reduction: acc + x * x.
struct PlusSquare { CUTLASS_HOST_DEVICE float operator()(float acc, float x) const { return acc + x * x; } };

// Comparisons: 1.0 where true, 0.0 where false (IEEE: a NaN compares false, except for !=).
struct Eq { CUTLASS_HOST_DEVICE float operator()(float a, float b) const { return a == b ? 1.0f : 0.0f; } };
struct Ne { CUTLASS_HOST_DEVICE float operator()(float a, float b) const { return a != b ? 1.0f : 0.0f; } };
struct Lt { CUTLASS_HOST_DEVICE float operator()(float a, float b) const { return a < b ? 1.0f : 0.0f; } };
struct Le { CUTLASS_HOST_DEVICE float operator()(float a, float b) const { return a <= b ? 1.0f : 0.0f; } };
struct Gt { CUTLASS_HOST_DEVICE float operator()(float a, float b) const { return a > b ? 1.0f : 0.0f; } };
struct Ge { CUTLASS_HOST_DEVICE float operator()(float a, float b) const { return a >= b ? 1.0f : 0.0f; } };
// a where c != 0, else b.
struct Where { CUTLASS_HOST_DEVICE float operator()(float c, float a, float b) const { return c != 0.0f ? a : b; } };

// frac(pos * (hi + lo)) in [-0.5, 0.5]: an angle in turns, reduced exactly. fmaf recovers the
// rounding error of pos * hi, and p - rint(p) is exact (Sterbenz), so the result keeps fp32
// precision of the fraction even where pos * hi is ~1e5 turns.
struct Turns {
  CUTLASS_HOST_DEVICE float operator()(float pos, float hi, float lo) const {
    float p = pos * hi;
    float err = fmaf(pos, hi, -p);
    float frac = (p - rintf(p)) + fmaf(pos, lo, err);
    return frac - rintf(frac);  // the small terms can leave [-0.5, 0.5]
  }
};
// sin(2 pi t) and cos(2 pi t) of an angle t in turns. On the device one MUFU instruction each (sin.approx and
// cos.approx, absolute error below 2^-20.9 over [-pi, pi]: Turns' range [-0.5, 0.5] turns, reduced exactly),
// where sincospif's range reduction and polynomials made the RoPE epilogue most of a 128x192 tile's time
// (docs/measured.md); fp64 on the host.
CUTLASS_HOST_DEVICE void sincos_turns(float t, float& s, float& c) {
#if defined(__CUDA_ARCH__)
  float x = 6.28318530717958647692f * t;
  asm("sin.approx.ftz.f32 %0, %1;" : "=f"(s) : "f"(x));
  asm("cos.approx.ftz.f32 %0, %1;" : "=f"(c) : "f"(x));
#else
  s = float(sin(2.0 * 3.14159265358979323846 * double(t)));
  c = float(cos(2.0 * 3.14159265358979323846 * double(t)));
#endif
}
struct CosTurns {
  CUTLASS_HOST_DEVICE float operator()(float t) const {
    float s, c;
    sincos_turns(t, s, c);
    return c;
  }
};
struct SinTurns {
  CUTLASS_HOST_DEVICE float operator()(float t) const {
    float s, c;
    sincos_turns(t, s, c);
    return s;
  }
};
// Rounds to the storage type S and back: a cast inside fp32 math (the value stays fp32, so a
// cast to any 16-bit type can feed any node, the main output included).
template <class S>
struct RoundVia {
  CUTLASS_HOST_DEVICE float operator()(float a) const {
    return cutlass::NumericConverter<float, S>{}(cutlass::NumericConverter<S, float>{}(a));
  }
};
// An fp32 value in three bytes: rounded to its top 24 bits (to nearest, ties to even, on the bits: a carry
// moves into the exponent as it should), split into the top 16 (a value bfloat16 holds exactly) and the next 8
// (an integer 0..255, exact in a uint8), and joined back. Integer ops only. A NaN stays a NaN (quieted: the GPU's
// 0x7fffffff would otherwise carry into the sign bit, and a payload in the low 8 bits alone would become inf).
CUTLASS_HOST_DEVICE uint32_t bits24(float a) {
  uint32_t b;
  memcpy(&b, &a, sizeof(b));
  if ((b & 0x7fffffffu) > 0x7f800000u) return (b | 0x00400000u) & 0xffffff00u;
  return (b + 0x7fu + ((b >> 8) & 1u)) & 0xffffff00u;
}
CUTLASS_HOST_DEVICE float from_bits(uint32_t b) {
  float f;
  memcpy(&f, &b, sizeof(f));
  return f;
}
struct Hi16 { CUTLASS_HOST_DEVICE float operator()(float a) const { return from_bits(bits24(a) & 0xffff0000u); } };
struct Lo8 { CUTLASS_HOST_DEVICE float operator()(float a) const { return float((bits24(a) >> 8) & 0xffu); } };
struct Join24 {
  CUTLASS_HOST_DEVICE float operator()(float hi, float lo) const {
    uint32_t h;
    memcpy(&h, &hi, sizeof(h));
    float byte = fminf(fmaxf(lo, 0.0f), 255.0f);   // as a uint8 store would hold it (NaN: 0)
    return from_bits((h & 0xffff0000u) | (uint32_t(rintf(byte)) << 8));
  }
};
}  // namespace scalar

// One-parameter templates for Sm90Compute (the parameter is the fragment type, unused).
#define CODA_EPI_FUNCTOR(Name) \
  template <class T> struct Name : MapArrays<scalar::Name> {};
CODA_EPI_FUNCTOR(Add)
CODA_EPI_FUNCTOR(Sub)
CODA_EPI_FUNCTOR(Mul)
CODA_EPI_FUNCTOR(Div)
CODA_EPI_FUNCTOR(Max)
CODA_EPI_FUNCTOR(Min)
CODA_EPI_FUNCTOR(Fma)
CODA_EPI_FUNCTOR(Identity)
CODA_EPI_FUNCTOR(Neg)
CODA_EPI_FUNCTOR(Abs)
CODA_EPI_FUNCTOR(Exp)
CODA_EPI_FUNCTOR(Log)
CODA_EPI_FUNCTOR(Sqrt)
CODA_EPI_FUNCTOR(Rsqrt)
CODA_EPI_FUNCTOR(Square)
CODA_EPI_FUNCTOR(Tanh)
CODA_EPI_FUNCTOR(Sigmoid)
CODA_EPI_FUNCTOR(Silu)
CODA_EPI_FUNCTOR(Relu)
CODA_EPI_FUNCTOR(GeluTanh)
CODA_EPI_FUNCTOR(GeluTanhGrad)
CODA_EPI_FUNCTOR(GeluErf)
CODA_EPI_FUNCTOR(GeluErfGrad)
CODA_EPI_FUNCTOR(PlusSquare)
CODA_EPI_FUNCTOR(Eq)
CODA_EPI_FUNCTOR(Ne)
CODA_EPI_FUNCTOR(Lt)
CODA_EPI_FUNCTOR(Le)
CODA_EPI_FUNCTOR(Gt)
CODA_EPI_FUNCTOR(Ge)
CODA_EPI_FUNCTOR(Where)
CODA_EPI_FUNCTOR(Turns)
CODA_EPI_FUNCTOR(CosTurns)
CODA_EPI_FUNCTOR(SinTurns)
CODA_EPI_FUNCTOR(Hi16)
CODA_EPI_FUNCTOR(Lo8)
CODA_EPI_FUNCTOR(Join24)
#undef CODA_EPI_FUNCTOR

// A cast: round to S and continue in fp32 (Compute<Cfg, RoundThrough<S>::Fn>).
template <class S>
struct RoundThrough {
  template <class T> struct Fn : MapArrays<scalar::RoundVia<S>> {};
};

// Packed pairs: a 32-bit container (carried as fp32 bits) holding two 16-bit elements S, the
// even column in the low half (little-endian memory order of an (M, 2N) tensor).
namespace scalar {
template <class S, int Half>
struct UnpackHalf {
  CUTLASS_HOST_DEVICE float operator()(float packed) const {
    uint32_t bits;
    memcpy(&bits, &packed, sizeof(bits));
    return float(S::bitcast(static_cast<uint16_t>(Half ? bits >> 16 : bits & 0xffffu)));
  }
};
template <class S>
struct PackPair {
  CUTLASS_HOST_DEVICE float operator()(float even, float odd) const {
    cutlass::NumericConverter<S, float> round;
    uint32_t bits = uint32_t(round(even).raw()) | (uint32_t(round(odd).raw()) << 16);
    float packed;
    memcpy(&packed, &bits, sizeof(packed));
    return packed;
  }
};
}  // namespace scalar
template <class S, int Half>
struct UnpackHalf {
  template <class T> struct Fn : MapArrays<scalar::UnpackHalf<S, Half>> {};
};
template <class S>
struct PackPair {
  template <class T> struct Fn : MapArrays<scalar::PackPair<S>> {};
};

// Full width: each pair (a, b) = (x[2i], x[2i + 1]) rotated by θ = 2π·t[2i] (RoPE): one sine and cosine per
// pair (scalar::sincos_turns), in registers (pairs sit in consecutive fragment slots, as for PairSwap below).
template <class T>
struct RotatePairs {
  template <class E, int N>
  CUTLASS_HOST_DEVICE cutlass::Array<E, N> operator()(cutlass::Array<E, N> const& x,
                                                      cutlass::Array<E, N> const& t) const {
    static_assert(N % 2 == 0, "rotate_pairs needs an even fragment size");
    cutlass::Array<E, N> out;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; i += 2) {
      float s, c;
      scalar::sincos_turns(float(t[i]), s, c);
      float a = float(x[i]), b = float(x[i + 1]);
      out[i] = E(fmaf(a, c, -b * s));
      out[i + 1] = E(fmaf(b, c, a * s));
    }
    return out;
  }
};

// Full width: y[2i] = x[2i + 1], y[2i + 1] = x[2i]. The wgmma accumulator layout (and the
// epilogue fragments made from it) gives each thread both columns of an adjacent pair in
// consecutive fragment slots, so the swap stays in registers.
template <class T>
struct PairSwap {
  template <class E, int N>
  CUTLASS_HOST_DEVICE cutlass::Array<E, N> operator()(cutlass::Array<E, N> const& a) const {
    static_assert(N % 2 == 0, "pair_swap needs an even fragment size");
    cutlass::Array<E, N> out;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; i += 2) {
      out[i] = a[i + 1];
      out[i + 1] = a[i];
    }
    return out;
  }
};

// Returns its first input; the others are visited for their side effects (stores and
// reductions that feed nothing else). Lets side outputs live inside a tree.
template <class T>
struct KeepFirst {
  template <class A, class... Rest>
  CUTLASS_HOST_DEVICE A operator()(A const& a, Rest const&...) const { return a; }
};

}  // namespace coda::epi
