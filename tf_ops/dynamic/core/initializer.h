// Initial values for rows of new keys. Every value is a pure function of
// (seed, key, position in the row): a key gets the same initial row whatever
// the batch, the thread that inserts it, or the order of insertion, so runs
// are reproducible and a key evicted and re-inserted starts afresh the same
// way. TF-independent; C++14.
#ifndef SOK_GRAPH_TF_OPS_DYNAMIC_CORE_INITIALIZER_H_
#define SOK_GRAPH_TF_OPS_DYNAMIC_CORE_INITIALIZER_H_

#include <cmath>
#include <cstdint>
#include <string>

#include "tf_ops/dynamic/core/random_draws.h"

namespace sok_graph {
namespace core {

enum class InitKind { kNormal, kTruncatedNormal, kUniform, kZeros, kConstant };

struct InitializerSpec {
  InitKind kind = InitKind::kNormal;
  float mean = 0.0f;    // normal, truncated normal
  float stddev = 1.0f;  // normal, truncated normal
  float minval = 0.0f;  // uniform: [minval, maxval)
  float maxval = 1.0f;
  float value = 0.0f;  // constant
  uint64_t seed = 0;
};

inline bool ParseInitKind(const std::string& name, InitKind* kind) {
  if (name == "normal" || name == "random_normal") {
    *kind = InitKind::kNormal;
  } else if (name == "truncated_normal") {
    *kind = InitKind::kTruncatedNormal;
  } else if (name == "uniform" || name == "random_uniform") {
    *kind = InitKind::kUniform;
  } else if (name == "zeros") {
    *kind = InitKind::kZeros;
  } else if (name == "constant" || name == "ones") {
    *kind = InitKind::kConstant;
  } else {
    return false;
  }
  return true;
}

using draw::SplitMix64;

// A draw's bits mix three parts: the seed's and the key's (each hashed once
// per row, not once per draw) and the draw counter's (random_draws.h).
struct DrawMix {
  uint64_t seed_key;  // SplitMix64(seed ^ constant) ^ SplitMix64(key)
  DrawMix(uint64_t seed, int64_t key) : seed_key(draw::SeedMix(seed) ^ draw::KeyMix(key)) {}
};

// A uniform double in (0, 1) for draw `counter`.
inline double UniformOpen(const DrawMix& mix, uint64_t counter) {
  return draw::UniformOpen(mix.seed_key, counter);
}
inline double UniformOpen(uint64_t seed, int64_t key, uint64_t counter) {
  return UniformOpen(DrawMix(seed, key), counter);
}

// Standard normal draw j (component j % 2 of Box-Muller pair j / 2).
inline float StandardNormal(const DrawMix& mix, uint64_t j) {
  return draw::NormalDraw(mix.seed_key, j);
}
inline float StandardNormal(uint64_t seed, int64_t key, uint64_t j) {
  return StandardNormal(DrawMix(seed, key), j);
}

// Row values 0 .. 2 pairs - 1 from whole Box-Muller pairs: the standard
// normals themselves (kStandard) or mean + stddev * each. Pairs are
// independent of one another, so the loop vectorizes: four pairs at a time
// with SSE2 (the hashes' 64-bit products as well), eight with AVX2.
template <bool kStandard>
inline void NormalPairsLoop(uint64_t seed_key, float mean, float stddev, int64_t pairs,
                            float* row) {
  for (int64_t p = 0; p < pairs; ++p) {
    float z0, z1;
    draw::NormalPair(draw::DrawBits(seed_key, static_cast<uint64_t>(p)), &z0, &z1);
    row[2 * p] = kStandard ? z0 : draw::Affine(mean, stddev, z0);
    row[2 * p + 1] = kStandard ? z1 : draw::Affine(mean, stddev, z1);
  }
}

// On x86-64 the loop runs as AVX2 code where the CPU has AVX2 (1.8x the
// speed of the SSE2 baseline the library is built for). The values are the
// same: the same IEEE-rounded operations in wider registers, and the "avx2"
// target has no fused multiply-add to contract into.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#define SOK_GRAPH_INIT_AVX2 1
template <bool kStandard>
__attribute__((target("avx2"))) inline void NormalPairsAvx2(uint64_t seed_key, float mean,
                                                             float stddev, int64_t pairs,
                                                             float* row) {
  NormalPairsLoop<kStandard>(seed_key, mean, stddev, pairs, row);
}
inline bool CpuHasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}
#endif

template <bool kStandard>
inline void NormalPairs(uint64_t seed_key, float mean, float stddev, int64_t pairs, float* row) {
#ifdef SOK_GRAPH_INIT_AVX2
  if (CpuHasAvx2()) return NormalPairsAvx2<kStandard>(seed_key, mean, stddev, pairs, row);
#endif
  NormalPairsLoop<kStandard>(seed_key, mean, stddev, pairs, row);
}

// Writes the initial row of `key` (dim floats).
inline void InitializeRow(const InitializerSpec& s, int64_t key, int64_t dim, float* row) {
  const DrawMix mix(s.seed, key);
  switch (s.kind) {
    case InitKind::kZeros:
      for (int64_t d = 0; d < dim; ++d) row[d] = 0.0f;
      return;
    case InitKind::kConstant:
      for (int64_t d = 0; d < dim; ++d) row[d] = s.value;
      return;
    case InitKind::kUniform:
      for (int64_t d = 0; d < dim; ++d) {
        const double u = UniformOpen(mix, static_cast<uint64_t>(d));
        const float v = static_cast<float>(
            draw::DAdd(s.minval, draw::DMul(static_cast<double>(s.maxval - s.minval), u)));
        // u within about 2^-25 of 1 rounds to maxval in float: keep the
        // range half-open, as tf.random.uniform's [minval, maxval).
        row[d] = (v >= s.maxval && s.maxval > s.minval) ? std::nextafter(s.maxval, s.minval) : v;
      }
      return;
    case InitKind::kNormal:
      if (dim <= 0) return;
      NormalPairs<false>(mix.seed_key, s.mean, s.stddev, dim / 2, row);
      if (dim % 2 != 0) {
        row[dim - 1] = draw::Affine(s.mean, s.stddev, StandardNormal(mix, dim - 1));
      }
      return;
    case InitKind::kTruncatedNormal:
      // As tf.random.truncated_normal: draws beyond two standard deviations
      // are redrawn, in column order, with draws dim, dim + 1, ...
      if (dim <= 0) return;
      NormalPairs<true>(mix.seed_key, 0.0f, 1.0f, dim / 2, row);  // standard draws
      if (dim % 2 != 0) row[dim - 1] = StandardNormal(mix, dim - 1);
      {
        uint64_t counter = static_cast<uint64_t>(dim);
        for (int64_t d = 0; d < dim; ++d) {
          float z = row[d];
          while (std::fabs(z) > 2.0f) z = StandardNormal(mix, counter++);
          row[d] = draw::Affine(s.mean, s.stddev, z);
        }
      }
      return;
  }
}

}  // namespace core
}  // namespace sok_graph

#endif  // SOK_GRAPH_TF_OPS_DYNAMIC_CORE_INITIALIZER_H_
