// Counter-based random draws for the initial rows of dynamic tables, shared
// by the CPU table (core/initializer.h) and the GPU table
// (kernels/dynamic_table_insert.cu): one source, so both draw bit-identical
// values.
//
// Identical by construction: the float path uses only operations that IEEE
// 754 rounds correctly (+ - * / sqrt, int32 -> float conversion) and integer
// and bit operations; no library transcendental function. On the device each
// operation is an explicit round-to-nearest intrinsic (__fadd_rn, ...),
// which nvcc and clang never fuse into a multiply-add; on the host the
// build compiles with -ffp-contract=off (tf_ops/build/sok_ops.bzl,
// tests/gpu/run_all.sh), and without -ffast-math the compiler neither
// reorders nor fuses them. No intermediate value is ever subnormal, so
// flush-to-zero modes (TensorFlow sets them on its CPU threads) change
// nothing either.
//
// Normal draws: Box-Muller, one 64-bit SplitMix64 hash per pair of values:
//   bits 33..63 (31 bits): u1 = float(a | 1) / 2^31 in [2^-31, 1], so
//     r = sqrt(-2 ln u1) <= sqrt(62 ln 2) = 6.56 (P(|Z| > 6.56) = 5e-11);
//   bits 0..25 (26 bits): the angle 2 pi (v + 1/2) / 2^26, as a quadrant
//     and an offset t in (-1/2, 1/2) within it (t held exactly in a float).
// ln is 2 atanh(s), s = f / (2 + f) for the mantissa 1 + f of u1 scaled to
// [sqrt(1/2), sqrt(2)), with a degree-9 odd polynomial in s; sin and cos of
// (pi/2) t are polynomials of degree 7 and 8 in t. The coefficients are
// near-minimax fits (relative error 2e-9, 3e-9 and 6e-11 before rounding to
// float). Measured in float over every input they can get (the bounds
// initializer_test.cc checks are 2 ulp): -2 ln u1 within 1.65 ulp of double
// std::log, sin within 1.70 ulp, cos within 1.22 ulp; each normal within
// 2.9e-7 * max(1, r) of double-precision Box-Muller on the same uniforms.
//
// C++14; usable from CUDA (__host__ __device__) and plain C++.
#ifndef SOK_GRAPH_TF_OPS_DYNAMIC_CORE_RANDOM_DRAWS_H_
#define SOK_GRAPH_TF_OPS_DYNAMIC_CORE_RANDOM_DRAWS_H_

#include <stdint.h>

#if !defined(__CUDA_ARCH__)
#include <cmath>
#include <cstring>
#endif

#if defined(__CUDACC__)
#define SOK_DRAW_FN __host__ __device__ __forceinline__
#else
#define SOK_DRAW_FN inline
#endif

namespace sok_graph {
namespace core {
namespace draw {

// splitmix64: a counter-based generator, so value i of key k needs no state.
SOK_DRAW_FN uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The part of every draw's hash input that the seed gives (hashed once per
// table) and the part the key gives (once per row).
SOK_DRAW_FN uint64_t SeedMix(uint64_t seed) { return SplitMix64(seed ^ 0x5851f42d4c957f2dULL); }
SOK_DRAW_FN uint64_t KeyMix(int64_t key) { return SplitMix64(static_cast<uint64_t>(key)); }

// The 64 random bits of draw `counter` for a row whose seed and key mix to
// seed_key (SeedMix(seed) ^ KeyMix(key)).
SOK_DRAW_FN uint64_t DrawBits(uint64_t seed_key, uint64_t counter) {
  return SplitMix64(seed_key ^ (counter * 0xd1b54a32d192ed03ULL));
}

// Correctly rounded float operations, never fused or reordered.
#if defined(__CUDA_ARCH__)
SOK_DRAW_FN float Add(float a, float b) { return __fadd_rn(a, b); }
SOK_DRAW_FN float Sub(float a, float b) { return __fsub_rn(a, b); }
SOK_DRAW_FN float Mul(float a, float b) { return __fmul_rn(a, b); }
SOK_DRAW_FN float Div(float a, float b) { return __fdiv_rn(a, b); }
SOK_DRAW_FN float Sqrt(float a) { return __fsqrt_rn(a); }
SOK_DRAW_FN float ToFloat(int32_t i) { return __int2float_rn(i); }
SOK_DRAW_FN uint32_t FloatBits(float f) { return __float_as_uint(f); }
SOK_DRAW_FN float BitsFloat(uint32_t u) { return __uint_as_float(u); }
SOK_DRAW_FN double DAdd(double a, double b) { return __dadd_rn(a, b); }
SOK_DRAW_FN double DMul(double a, double b) { return __dmul_rn(a, b); }
#else
SOK_DRAW_FN float Add(float a, float b) { return a + b; }
SOK_DRAW_FN float Sub(float a, float b) { return a - b; }
SOK_DRAW_FN float Mul(float a, float b) { return a * b; }
SOK_DRAW_FN float Div(float a, float b) { return a / b; }
SOK_DRAW_FN float Sqrt(float a) { return std::sqrt(a); }
SOK_DRAW_FN float ToFloat(int32_t i) { return static_cast<float>(i); }
SOK_DRAW_FN uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
SOK_DRAW_FN float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
SOK_DRAW_FN double DAdd(double a, double b) { return a + b; }
SOK_DRAW_FN double DMul(double a, double b) { return a * b; }
#endif

// The uniform u1 of a Box-Muller pair as x / 2^31: x = float(a | 1) for the
// top 31 bits a of the pair's hash, in [1, 2^31] (an odd a rounds to
// nearest, so x / 2^31 is a midpoint-like sample of (0, 1]).
SOK_DRAW_FN float LogArgument(uint64_t bits) {
  return ToFloat(static_cast<int32_t>((bits >> 33) | 1u));
}

// -2 ln(x / 2^31) for a float x in [1, 2^31]: >= 0, and 0 only at x = 2^31.
SOK_DRAW_FN float NegTwoLogScaled(float x) {
  const uint32_t xb = FloatBits(x);
  // x = 2^e * m, m in [1, 2); m >= sqrt(2) moves to m / 2 in [sqrt(1/2), 1).
  int32_t e = static_cast<int32_t>(xb >> 23) - 127;
  const uint32_t mb = (xb & 0x007fffffu) | 0x3f800000u;
  const bool high = mb >= 0x3fb504f3u;  // m >= 1.41421354 (sqrt 2 rounded down)
  const float m = BitsFloat(high ? mb - 0x00800000u : mb);
  e += high ? 1 : 0;
  const float f = Sub(m, 1.0f);  // exact (Sterbenz): f in [-0.293, 0.415)
  // ln(1 + f) = 2 atanh(s) = 2 s + s^3 R(s^2), s = f / (2 + f), |s| < 0.1716.
  const float s = Div(f, Add(2.0f, f));
  const float y = Mul(s, s);
  float r = 0.23332141f;
  r = Add(Mul(r, y), 0.28550756f);
  r = Add(Mul(r, y), 0.40000123f);
  r = Add(Mul(r, y), 0.6666667f);
  const float log1pf = Add(Add(s, s), Mul(s, Mul(y, r)));
  // -ln(x / 2^31) = k ln 2 - ln(1 + f), k = 31 - e in [0, 31]; ln 2 in two
  // parts, k * kLn2Hi exact (kLn2Hi has 16 significant bits).
  const float k = ToFloat(31 - e);
  const float kLn2Hi = 0.693145752f;   // 0x1.62e4p-1, exactly
  const float kLn2Lo = 1.4286068e-06f;  // ln 2 - kLn2Hi, rounded
  const float neg_log = Add(Mul(k, kLn2Hi), Sub(Mul(k, kLn2Lo), log1pf));
  return Add(neg_log, neg_log);
}

// The angle of a pair: bits 0..25 of its hash, v, give 2 pi (v + 1/2) / 2^26
// = (pi / 2) (q + t) for the nearest quarter turn q (mod 4) and t in
// (-1/2, 1/2): t = (2 j + 1) / 2^25 for an integer j in [-2^23, 2^23).
struct Angle {
  int32_t quadrant;  // 0..3
  float t;
};
SOK_DRAW_FN Angle AngleOf(uint64_t bits) {
  const int32_t v = static_cast<int32_t>(bits & 0x3ffffffu);
  const int32_t q = (v + (1 << 23)) >> 24;                 // 0..4
  const int32_t j = v - (q << 24);                         // [-2^23, 2^23)
  Angle a;
  a.quadrant = q & 3;
  a.t = Mul(ToFloat(2 * j + 1), (1.0f / 33554432.0f));  // exact: * 2^-25
  return a;
}

// sin((pi / 2) t) and cos((pi / 2) t) for |t| <= 1/2.
SOK_DRAW_FN float SinHalfPi(float t) {
  const float y = Mul(t, t);
  float p = -0.004601658f;
  p = Add(Mul(p, y), 0.07968003f);
  p = Add(Mul(p, y), -0.6459635f);
  p = Add(Mul(p, y), 1.5707964f);
  return Mul(t, p);
}
SOK_DRAW_FN float CosHalfPi(float t) {
  const float y = Mul(t, t);
  float p = 0.000903363f;
  p = Add(Mul(p, y), -0.020859936f);
  p = Add(Mul(p, y), 0.25366917f);
  p = Add(Mul(p, y), -1.2337005f);
  return Add(Mul(p, y), 1.0f);
}

// The two standard normals of the Box-Muller pair with hash `bits`.
SOK_DRAW_FN void NormalPair(uint64_t bits, float* z0, float* z1) {
  const float r = Sqrt(NegTwoLogScaled(LogArgument(bits)));
  const Angle a = AngleOf(bits);
  const float s = SinHalfPi(a.t);
  const float c = CosHalfPi(a.t);
  // Rotate (cos, sin) of (pi / 2) t by q quarter turns.
  const bool odd = (a.quadrant & 1) != 0;
  const float cq = odd ? s : c;
  const float sq = odd ? c : s;
  const bool neg_cos = a.quadrant == 1 || a.quadrant == 2;
  const bool neg_sin = a.quadrant >= 2;
  *z0 = Mul(r, neg_cos ? -cq : cq);
  *z1 = Mul(r, neg_sin ? -sq : sq);
}

// Standard normal draw j of a row: component j % 2 of pair j / 2. Value d of
// a normal row is draw d; a truncated normal row redraws from dim on.
SOK_DRAW_FN float NormalDraw(uint64_t seed_key, uint64_t j) {
  float z0, z1;
  NormalPair(DrawBits(seed_key, j >> 1), &z0, &z1);
  return (j & 1) ? z1 : z0;
}

// mean + stddev * z, two roundings.
SOK_DRAW_FN float Affine(float mean, float stddev, float z) { return Add(mean, Mul(stddev, z)); }

// Uniform draw `counter` in [minval, maxval): a 53-bit uniform double in
// (0, 1) scaled in double, rounded to float; a value that rounds up to
// maxval becomes the float just below it.
SOK_DRAW_FN double UniformOpen(uint64_t seed_key, uint64_t counter) {
  const uint64_t bits = DrawBits(seed_key, counter);
  return DMul(DAdd(static_cast<double>(bits >> 11), 0.5), 1.0 / 9007199254740992.0);
}

}  // namespace draw
}  // namespace core
}  // namespace sok_graph

#undef SOK_DRAW_FN

#endif  // SOK_GRAPH_TF_OPS_DYNAMIC_CORE_RANDOM_DRAWS_H_
