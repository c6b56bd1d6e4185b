// Arithmetic on one embedding row at a time, for the CPU forward and
// backward of the fused lookup (lookup.h). TF-independent; C++14.
//
// Every operation is written twice: for a width known at compile time
// (FixedWidth<N>, the widths tables commonly have, all multiples of 4) with
// GCC/Clang vector types of four floats, and for any other width (int64_t)
// as a plain loop. Plain loops over a fixed width are not enough: whether
// gcc vectorises them depends on where they are inlined (in libsok_ops.so's
// build it turned the forward's width-16 sum into scalar code with the sum
// spilled to the stack). Written with vector types the fixed widths always
// run four lanes at a time with a sample's sum in registers: at width 16 the
// forward is about 1.7x as fast as over a runtime width. Each lane does
// the scalar code's operations in the scalar code's order (no fused
// multiply-adds: the library builds with -ffp-contract=off), so both forms
// give bit-identical results.
#ifndef SOK_GRAPH_TF_OPS_LOOKUP_CORE_ROW_OPS_H_
#define SOK_GRAPH_TF_OPS_LOOKUP_CORE_ROW_OPS_H_

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace sok_graph {
namespace core {

// A row width known at compile time.
template <int64_t N>
using FixedWidth = std::integral_constant<int64_t, N>;

// Calls fn(width) with `dim` as a FixedWidth where it is one, else as is.
template <typename Fn>
auto WithRowWidth(int64_t dim, Fn&& fn) -> decltype(fn(dim)) {
  switch (dim) {
    case 4: return fn(FixedWidth<4>());
    case 8: return fn(FixedWidth<8>());
    case 16: return fn(FixedWidth<16>());
    case 32: return fn(FixedWidth<32>());
    case 64: return fn(FixedWidth<64>());
    case 128: return fn(FixedWidth<128>());
    default: return fn(dim);
  }
}

// Four floats in one vector register.
typedef float Floats4 __attribute__((vector_size(16)));

// Loads four elements as floats (unaligned: rows start anywhere).
inline Floats4 LoadFloats4(const float* p) {
  Floats4 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
template <typename T>
Floats4 LoadFloats4(const T* p) {
  return Floats4{static_cast<float>(p[0]), static_cast<float>(p[1]), static_cast<float>(p[2]),
                 static_cast<float>(p[3])};
}

inline void StoreFloats4(Floats4 v, float* p) { std::memcpy(p, &v, sizeof(v)); }
template <typename T>
void StoreFloats4(Floats4 v, T* p) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<T>(v[i]);
}

// One row of floats that a sample works with (the forward's sum, the
// backward's gradient row): vector registers for a fixed width, the
// caller's scratch of `dim` floats otherwise. Declare it inside the loop
// over samples, so the compiler need not keep it in memory between them.
template <typename W>
struct RowBuffer {
  explicit RowBuffer(float* scratch) : v(scratch) {}
  float* v;
};
template <int64_t N>
struct RowBuffer<FixedWidth<N>> {
  static_assert(N % 4 == 0, "fixed widths are multiples of 4");
  explicit RowBuffer(float* /*scratch*/) {}
  Floats4 v[N / 4];
};

// r = 0
template <typename W>
void SetZero(RowBuffer<W>* r, W dim) {
  for (int64_t d = 0; d < dim; ++d) r->v[d] = 0.0f;
}
template <int64_t N>
void SetZero(RowBuffer<FixedWidth<N>>* r, FixedWidth<N>) {
  for (int64_t i = 0; i < N / 4; ++i) r->v[i] = Floats4{0.0f, 0.0f, 0.0f, 0.0f};
}

// r = float(src)
template <typename W, typename T>
void Load(RowBuffer<W>* r, const T* src, W dim) {
  for (int64_t d = 0; d < dim; ++d) r->v[d] = static_cast<float>(src[d]);
}
template <int64_t N, typename T>
void Load(RowBuffer<FixedWidth<N>>* r, const T* src, FixedWidth<N>) {
  for (int64_t i = 0; i < N / 4; ++i) r->v[i] = LoadFloats4(src + 4 * i);
}

// r += s * float(src)
template <typename W, typename T>
void AddScaled(RowBuffer<W>* r, float s, const T* src, W dim) {
  for (int64_t d = 0; d < dim; ++d) r->v[d] += s * static_cast<float>(src[d]);
}
template <int64_t N, typename T>
void AddScaled(RowBuffer<FixedWidth<N>>* r, float s, const T* src, FixedWidth<N>) {
  for (int64_t i = 0; i < N / 4; ++i) r->v[i] += s * LoadFloats4(src + 4 * i);
}

// dst = T(r * s)
template <typename W, typename T>
void StoreScaled(const RowBuffer<W>& r, float s, T* dst, W dim) {
  for (int64_t d = 0; d < dim; ++d) dst[d] = static_cast<T>(r.v[d] * s);
}
template <int64_t N, typename T>
void StoreScaled(const RowBuffer<FixedWidth<N>>& r, float s, T* dst, FixedWidth<N>) {
  for (int64_t i = 0; i < N / 4; ++i) StoreFloats4(r.v[i] * s, dst + 4 * i);
}

// dst = s * r
template <typename W>
void SetToScaled(float* dst, float s, const RowBuffer<W>& r, W dim) {
  for (int64_t d = 0; d < dim; ++d) dst[d] = s * r.v[d];
}
template <int64_t N>
void SetToScaled(float* dst, float s, const RowBuffer<FixedWidth<N>>& r, FixedWidth<N>) {
  for (int64_t i = 0; i < N / 4; ++i) StoreFloats4(s * r.v[i], dst + 4 * i);
}

// dst += s * r
template <typename W>
void AddScaledTo(float* dst, float s, const RowBuffer<W>& r, W dim) {
  for (int64_t d = 0; d < dim; ++d) dst[d] += s * r.v[d];
}
template <int64_t N>
void AddScaledTo(float* dst, float s, const RowBuffer<FixedWidth<N>>& r, FixedWidth<N>) {
  for (int64_t i = 0; i < N / 4; ++i) {
    StoreFloats4(LoadFloats4(dst + 4 * i) + s * r.v[i], dst + 4 * i);
  }
}

}  // namespace core
}  // namespace sok_graph

#endif  // SOK_GRAPH_TF_OPS_LOOKUP_CORE_ROW_OPS_H_
