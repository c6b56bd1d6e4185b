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

// splitmix64: a counter-based generator, so value i of key k needs no state.
inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A draw's bits mix three parts: the seed's and the key's (each hashed once
// per row, not once per draw) and the draw counter's.
struct DrawMix {
  uint64_t seed_key;  // SplitMix64(seed ^ constant) ^ SplitMix64(key)
  DrawMix(uint64_t seed, int64_t key)
      : seed_key(SplitMix64(seed ^ 0x5851f42d4c957f2dULL) ^
                 SplitMix64(static_cast<uint64_t>(key))) {}
};

// A uniform double in (0, 1) for draw `counter`.
inline double UniformOpen(const DrawMix& mix, uint64_t counter) {
  const uint64_t bits = SplitMix64(mix.seed_key ^ (counter * 0xd1b54a32d192ed03ULL));
  return (static_cast<double>(bits >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}
inline double UniformOpen(uint64_t seed, int64_t key, uint64_t counter) {
  return UniformOpen(DrawMix(seed, key), counter);
}

// A standard normal for draw `counter` (Box-Muller on two uniforms).
inline double StandardNormal(const DrawMix& mix, uint64_t counter) {
  const double u1 = UniformOpen(mix, 2 * counter);
  const double u2 = UniformOpen(mix, 2 * counter + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}
inline double StandardNormal(uint64_t seed, int64_t key, uint64_t counter) {
  return StandardNormal(DrawMix(seed, key), counter);
}

// Both standard normals of Box-Muller pair `pair` (uniforms 2*pair, 2*pair+1):
// half the logarithms and square roots of drawing them one at a time.
inline void StandardNormalPair(const DrawMix& mix, uint64_t pair, double* a, double* b) {
  const double u1 = UniformOpen(mix, 2 * pair);
  const double u2 = UniformOpen(mix, 2 * pair + 1);
  const double r = std::sqrt(-2.0 * std::log(u1));
  const double theta = 6.283185307179586 * u2;
  *a = r * std::cos(theta);
  *b = r * std::sin(theta);
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
        const float v = static_cast<float>(s.minval + (s.maxval - s.minval) * u);
        // u within about 2^-25 of 1 rounds to maxval in float: keep the
        // range half-open, as tf.random.uniform's [minval, maxval).
        row[d] = (v >= s.maxval && s.maxval > s.minval) ? std::nextafter(s.maxval, s.minval) : v;
      }
      return;
    case InitKind::kNormal:
      for (int64_t d = 0; d < dim; d += 2) {
        double a, b;
        StandardNormalPair(mix, static_cast<uint64_t>(d / 2), &a, &b);
        row[d] = static_cast<float>(s.mean + s.stddev * a);
        if (d + 1 < dim) row[d + 1] = static_cast<float>(s.mean + s.stddev * b);
      }
      return;
    case InitKind::kTruncatedNormal:
      // As tf.random.truncated_normal: draws beyond two standard deviations
      // are redrawn. Draw counters continue past dim for the redraws.
      {
        uint64_t counter = static_cast<uint64_t>(dim);
        for (int64_t d = 0; d < dim; ++d) {
          double z = StandardNormal(mix, static_cast<uint64_t>(d));
          while (std::fabs(z) > 2.0) z = StandardNormal(mix, counter++);
          row[d] = static_cast<float>(s.mean + s.stddev * z);
        }
      }
      return;
  }
}

}  // namespace core
}  // namespace sok_graph

#endif  // SOK_GRAPH_TF_OPS_DYNAMIC_CORE_INITIALIZER_H_
