// Tests for tf_ops/dynamic/core/initializer.h: determinism in
// (seed, key, position), exact zeros/constant, and the moments and ranges of
// the random kinds (checked against closed-form values, not the code).
#include "tf_ops/dynamic/core/initializer.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace sok_graph {
namespace core {
namespace {

constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();
constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();

std::vector<float> Row(const InitializerSpec& s, int64_t key, int64_t dim) {
  // Poison first, so an unwritten position shows.
  std::vector<float> row(static_cast<size_t>(dim), std::numeric_limits<float>::quiet_NaN());
  InitializeRow(s, key, dim, row.data());
  return row;
}

bool BitwiseEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

InitializerSpec Spec(InitKind kind, uint64_t seed) {
  InitializerSpec s;
  s.kind = kind;
  s.seed = seed;
  return s;
}

std::vector<int64_t> SpecialKeys() {
  return {0, 1, -1, 2, -2, 42, kI64Min, kI64Min + 1, kI64Max, kI64Max - 1,
          int64_t{1} << 40, -(int64_t{1} << 40), int64_t{1} << 62, int64_t{3} << 32};
}

const InitKind kRandomKinds[] = {InitKind::kNormal, InitKind::kTruncatedNormal,
                                 InitKind::kUniform};

TEST(ParseInitKindTest, AcceptsDocumentedNames) {
  struct Case {
    const char* name;
    InitKind kind;
  };
  const Case cases[] = {
      {"normal", InitKind::kNormal},
      {"random_normal", InitKind::kNormal},
      {"truncated_normal", InitKind::kTruncatedNormal},
      {"uniform", InitKind::kUniform},
      {"random_uniform", InitKind::kUniform},
      {"zeros", InitKind::kZeros},
      {"constant", InitKind::kConstant},
      {"ones", InitKind::kConstant},
  };
  for (const Case& c : cases) {
    // Start from a kind different from the expected one.
    InitKind kind = c.kind == InitKind::kZeros ? InitKind::kNormal : InitKind::kZeros;
    EXPECT_TRUE(ParseInitKind(c.name, &kind)) << c.name;
    EXPECT_EQ(kind, c.kind) << c.name;
  }
}

TEST(ParseInitKindTest, RejectsOtherNames) {
  const char* bad[] = {"",      "Normal",         "NORMAL",         "normal ",  " normal",
                       "zero",  "one",            "glorot_uniform", "gaussian", "truncated",
                       "const", "random_uniform_", "truncatednormal", "uniform\n"};
  for (const char* name : bad) {
    InitKind kind = InitKind::kNormal;
    EXPECT_FALSE(ParseInitKind(name, &kind)) << "'" << name << "'";
  }
  // A name with an embedded NUL is not "zeros".
  InitKind kind = InitKind::kNormal;
  EXPECT_FALSE(ParseInitKind(std::string("zeros\0x", 7), &kind));
}

TEST(SplitMix64Test, MatchesReferenceSequence) {
  // The published splitmix64 outputs for state 0 (Vigna): output i is
  // SplitMix64(i * golden gamma).
  const uint64_t gamma = 0x9e3779b97f4a7c15ULL;
  EXPECT_EQ(SplitMix64(0), 0xe220a8397b1dcdafULL);
  EXPECT_EQ(SplitMix64(gamma), 0x6e789e6aa1b965f4ULL);
  EXPECT_EQ(SplitMix64(2 * gamma), 0x06c45d188009454fULL);
  EXPECT_EQ(SplitMix64(3 * gamma), 0xf88bb8a8724c81ecULL);
  // Values from an independent (Python) implementation.
  EXPECT_EQ(SplitMix64(1), 0x910a2dec89025cc1ULL);
  EXPECT_EQ(SplitMix64(~uint64_t{0}), 0xe4d971771b652c20ULL);
  EXPECT_EQ(SplitMix64(0x123456789abcdef0ULL), 0x161922c645ce50e8ULL);
}

TEST(UniformOpenTest, StrictlyInsideUnitIntervalAndDeterministic) {
  for (uint64_t seed : {uint64_t{0}, uint64_t{1}, uint64_t{12345}, ~uint64_t{0}}) {
    for (int64_t key : SpecialKeys()) {
      for (uint64_t c = 0; c < 64; ++c) {
        const double u = UniformOpen(seed, key, c);
        EXPECT_GT(u, 0.0);
        EXPECT_LT(u, 1.0);
        EXPECT_EQ(u, UniformOpen(seed, key, c));
      }
    }
  }
}

TEST(UniformOpenTest, MomentsOverManyKeys) {
  const int n = 200000;
  double sum = 0, sum2 = 0;
  for (int i = 0; i < n; ++i) {
    const double u = UniformOpen(7, i - n / 2, static_cast<uint64_t>(i % 5));
    sum += u;
    sum2 += u * u;
  }
  const double mean = sum / n;
  const double var = sum2 / n - mean * mean;
  EXPECT_NEAR(mean, 0.5, 0.005);
  EXPECT_NEAR(var, 1.0 / 12.0, 0.002);
}

TEST(StandardNormalTest, Moments) {
  const int n = 100000;
  double sum = 0, sum2 = 0;
  int within1 = 0;
  for (int i = 0; i < n; ++i) {
    const double z = StandardNormal(3, i, static_cast<uint64_t>(i % 3));
    ASSERT_TRUE(std::isfinite(z));
    sum += z;
    sum2 += z * z;
    if (std::fabs(z) < 1.0) ++within1;
  }
  const double mean = sum / n;
  EXPECT_NEAR(mean, 0.0, 0.02);
  EXPECT_NEAR(std::sqrt(sum2 / n - mean * mean), 1.0, 0.02);
  EXPECT_NEAR(static_cast<double>(within1) / n, std::erf(1.0 / std::sqrt(2.0)), 0.01);
}

TEST(InitializeRowTest, SameKeySameRowWhateverTheOrder) {
  for (InitKind kind : kRandomKinds) {
    InitializerSpec s = Spec(kind, 99);
    s.mean = 0.25f;
    s.stddev = 0.75f;
    s.minval = -2.0f;
    s.maxval = 3.0f;
    std::vector<int64_t> keys = SpecialKeys();
    for (int64_t k = -300; k < 300; ++k) keys.push_back(k * 7919);
    const int64_t dim = 13;
    std::vector<std::vector<float>> first;
    for (int64_t k : keys) first.push_back(Row(s, k, dim));
    // Reverse, then shuffled order, with other keys interleaved.
    std::vector<size_t> order(keys.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = order.size() - 1 - i;
    for (size_t i : order) {
      Row(s, keys[i] ^ 1, dim);  // a neighbouring key (no overflow at INT64_MAX)
      EXPECT_TRUE(BitwiseEqual(Row(s, keys[i], dim), first[i])) << keys[i];
    }
    std::mt19937_64 rng(5);
    std::shuffle(order.begin(), order.end(), rng);
    const InitializerSpec copy = s;
    for (size_t i : order) {
      EXPECT_TRUE(BitwiseEqual(Row(copy, keys[i], dim), first[i])) << keys[i];
    }
  }
}

TEST(InitializeRowTest, PositionsArePerPositionForNormalAndUniform) {
  // Value d of a row depends on (seed, key, d) only, so a shorter row is a
  // prefix of a longer one.
  for (InitKind kind : {InitKind::kNormal, InitKind::kUniform}) {
    const InitializerSpec s = Spec(kind, 11);
    for (int64_t key : SpecialKeys()) {
      const std::vector<float> long_row = Row(s, key, 32);
      const std::vector<float> short_row = Row(s, key, 5);
      EXPECT_TRUE(BitwiseEqual(short_row, std::vector<float>(long_row.begin(), long_row.begin() + 5)));
    }
  }
}

TEST(InitializeRowTest, DifferentSeedsAndKeysDiffer) {
  for (InitKind kind : kRandomKinds) {
    const int64_t dim = 8;
    std::vector<int64_t> keys = SpecialKeys();
    for (int64_t k = 3; k < 500; ++k) keys.push_back(k);
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    std::set<std::vector<float>> rows;
    for (int64_t k : keys) {
      const std::vector<float> a = Row(Spec(kind, 1), k, dim);
      const std::vector<float> b = Row(Spec(kind, 2), k, dim);
      const std::vector<float> c = Row(Spec(kind, 0), k, dim);
      EXPECT_FALSE(BitwiseEqual(a, b)) << k;
      EXPECT_FALSE(BitwiseEqual(a, c)) << k;
      EXPECT_FALSE(BitwiseEqual(b, c)) << k;
      // Values within a row differ too.
      EXPECT_EQ(std::set<float>(a.begin(), a.end()).size(), a.size()) << k;
      rows.insert(a);
    }
    EXPECT_EQ(rows.size(), keys.size());
  }
}

TEST(InitializeRowTest, ZerosAndConstantAreExact) {
  InitializerSpec zeros = Spec(InitKind::kZeros, 3);
  zeros.value = 5.0f;  // ignored
  zeros.mean = 1.0f;   // ignored
  InitializerSpec constant = Spec(InitKind::kConstant, 3);
  constant.value = 0.37f;
  constant.mean = 9.0f;  // ignored
  InitializerSpec negative = Spec(InitKind::kConstant, 0);
  negative.value = -1.5e-7f;
  for (int64_t key : SpecialKeys()) {
    for (int64_t dim : {1, 7, 64}) {
      const std::vector<float> z = Row(zeros, key, dim);
      const std::vector<float> c = Row(constant, key, dim);
      const std::vector<float> m = Row(negative, key, dim);
      for (int64_t d = 0; d < dim; ++d) {
        EXPECT_EQ(z[d], 0.0f);
        EXPECT_FALSE(std::signbit(z[d]));
        EXPECT_EQ(c[d], 0.37f);
        EXPECT_EQ(m[d], -1.5e-7f);
      }
    }
  }
}

TEST(InitializeRowTest, ZeroDimWritesNothing) {
  float guard = 123.0f;
  for (InitKind kind : {InitKind::kNormal, InitKind::kTruncatedNormal, InitKind::kUniform,
                        InitKind::kZeros, InitKind::kConstant}) {
    InitializeRow(Spec(kind, 1), 5, 0, &guard);
    EXPECT_EQ(guard, 123.0f);
  }
}

TEST(InitializeRowTest, UniformRangeAndMoments) {
  InitializerSpec s = Spec(InitKind::kUniform, 2024);
  s.minval = -0.5f;
  s.maxval = 2.0f;
  const int64_t dim = 4;
  const int64_t keys = 20000;
  double sum = 0, sum2 = 0;
  int64_t n = 0;
  float lo = std::numeric_limits<float>::max(), hi = -lo;
  for (int64_t k = 0; k < keys; ++k) {
    const std::vector<float> row = Row(s, k * 1000003 - 77, dim);
    for (float v : row) {
      ASSERT_GE(v, s.minval);
      ASSERT_LT(v, s.maxval);
      lo = std::min(lo, v);
      hi = std::max(hi, v);
      sum += v;
      sum2 += static_cast<double>(v) * v;
      ++n;
    }
  }
  const double mean = sum / n;
  const double var = sum2 / n - mean * mean;
  const double width = 2.5;
  EXPECT_NEAR(mean, 0.75, 0.02);                   // (min + max) / 2
  EXPECT_NEAR(var, width * width / 12.0, 0.02);  // width^2 / 12
  // The range is used in full.
  EXPECT_LT(lo, -0.49f);
  EXPECT_GT(hi, 1.99f);
}

TEST(InitializeRowTest, UniformNeverReachesMaxval) {
  // A draw u in (0, 1) within 2^-27 of 1 gives minval + (maxval - minval) * u
  // closer to maxval than half a float ulp for each range below, so a plain
  // conversion to float yields maxval itself. Such draws exist (one in 2^27):
  // find one, and check that the row value stays below maxval all the same.
  const uint64_t seed = 0;
  const double threshold = 1.0 - std::ldexp(1.0, -27);
  const int64_t dim = 64;
  int64_t key = -1, pos = -1;
  for (int64_t k = 0; k < (int64_t{1} << 24) && key < 0; ++k) {
    for (int64_t d = 0; d < dim; ++d) {
      if (UniformOpen(seed, k, static_cast<uint64_t>(d)) >= threshold) {
        key = k;
        pos = d;
        break;
      }
    }
  }
  ASSERT_GE(key, 0) << "no draw close enough to 1 found";
  const float ranges[][2] = {{0.0f, 1.0f}, {-1.0f, 1.0f}, {-0.05f, 0.05f}};
  for (const auto& r : ranges) {
    InitializerSpec s = Spec(InitKind::kUniform, seed);
    s.minval = r[0];
    s.maxval = r[1];
    const std::vector<float> row = Row(s, key, dim);
    EXPECT_LT(row[pos], s.maxval) << "[" << r[0] << ", " << r[1] << "): key " << key
                                  << " position " << pos;
    EXPECT_GE(row[pos], s.maxval - 1e-6f * (s.maxval - s.minval));
    for (float v : row) {
      EXPECT_GE(v, s.minval);
      EXPECT_LT(v, s.maxval);
    }
  }
}

TEST(InitializeRowTest, NormalMoments) {
  InitializerSpec s = Spec(InitKind::kNormal, 77);
  s.mean = 1.5f;
  s.stddev = 0.5f;
  const int64_t dim = 4;
  double sum = 0, sum2 = 0;
  int64_t n = 0, within1 = 0, beyond2 = 0;
  for (int64_t k = 0; k < 5000; ++k) {
    for (float v : Row(s, (k - 2500) * 65537, dim)) {
      ASSERT_TRUE(std::isfinite(v));
      sum += v;
      sum2 += static_cast<double>(v) * v;
      const double z = (v - 1.5) / 0.5;
      if (std::fabs(z) < 1.0) ++within1;
      if (std::fabs(z) > 2.0) ++beyond2;
      ++n;
    }
  }
  ASSERT_EQ(n, 20000);
  const double mean = sum / n;
  EXPECT_NEAR(mean, 1.5, 0.02);
  EXPECT_NEAR(std::sqrt(sum2 / n - mean * mean), 0.5, 0.02);
  // P(|Z| < 1) = 0.6827, P(|Z| > 2) = 0.0455.
  EXPECT_NEAR(static_cast<double>(within1) / n, 0.6827, 0.02);
  EXPECT_NEAR(static_cast<double>(beyond2) / n, 0.0455, 0.01);
}

TEST(InitializeRowTest, TruncatedNormalStaysWithinTwoStddev) {
  InitializerSpec s = Spec(InitKind::kTruncatedNormal, 4242);
  s.mean = -0.3f;
  s.stddev = 2.0f;
  const int64_t dim = 8;
  double sum = 0, sum2 = 0;
  int64_t n = 0, near_edge = 0;
  for (int64_t k = 0; k < 2500; ++k) {
    for (float v : Row(s, k ^ (int64_t{1} << 50), dim)) {
      const double dev = std::fabs(static_cast<double>(v) - s.mean);
      ASSERT_LE(dev, 2.0 * s.stddev + 1e-5) << v;
      if (dev > 1.8 * s.stddev) ++near_edge;
      sum += v;
      sum2 += static_cast<double>(v) * v;
      ++n;
    }
  }
  ASSERT_EQ(n, 20000);
  const double mean = sum / n;
  // Standard normal truncated to [-2, 2]: variance 1 - 2*2*phi(2)/(2*Phi(2)-1).
  const double phi2 = std::exp(-2.0) / std::sqrt(2.0 * 3.14159265358979323846);
  const double mass = std::erf(2.0 / std::sqrt(2.0));
  const double sd = std::sqrt(1.0 - 4.0 * phi2 / mass);  // about 0.8796
  EXPECT_NEAR(mean, -0.3, 0.05);
  EXPECT_NEAR(std::sqrt(sum2 / n - mean * mean), 2.0 * sd, 0.05);
  // Truncated, not clipped: the density near the edge is that of the normal.
  // P(1.8 < |Z| <= 2 | |Z| <= 2) = (erf(2/sqrt2) - erf(1.8/sqrt2)) / mass.
  const double p_edge = (mass - std::erf(1.8 / std::sqrt(2.0))) / mass;  // about 0.0262
  EXPECT_NEAR(static_cast<double>(near_edge) / n, p_edge, 0.008);
}

TEST(InitializeRowTest, TruncatedNormalRedrawsAreDeterministic) {
  // Keys whose first draws fall beyond 2 stddev take redraws; the row must
  // still be the same on every call.
  const InitializerSpec s = Spec(InitKind::kTruncatedNormal, 8);
  int redrawn = 0;
  for (int64_t k = 0; k < 2000; ++k) {
    const std::vector<float> a = Row(s, k, 16);
    EXPECT_TRUE(BitwiseEqual(a, Row(s, k, 16)));
    for (int64_t d = 0; d < 16; ++d) {
      EXPECT_LE(std::fabs(a[d]), 2.0f);
      if (std::fabs(StandardNormal(s.seed, k, static_cast<uint64_t>(d))) > 2.0) ++redrawn;
    }
  }
  EXPECT_GT(redrawn, 100);  // the redraw path was exercised
}

// ---------------------------------------------------------------------------
// The float draws of random_draws.h: accuracy against double-precision libm
// over every input they can get, bitwise agreement with an independent
// emulation, and the distribution of the rows.

float FloatOf(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// Distance from `got` to the exact `ref`, in units of the float spacing at
// ref (float(ref)'s ulp).
double UlpError(float got, double ref) {
  const float r = std::fabs(static_cast<float>(ref));
  const double ulp = static_cast<double>(std::nextafter(r, std::numeric_limits<float>::infinity())) - r;
  return std::fabs(static_cast<double>(got) - ref) / ulp;
}

TEST(RandomDrawsTest, NegTwoLogWithinTwoUlpOverEveryInput) {
  // The argument is float(a | 1) for a 31-bit a: every odd integer below
  // 2^24 and every float in [2^24, 2^31] (which covers every mantissa, so
  // every input of the polynomial). Measured: 1.65 ulp (relative 1.52e-7).
  double worst = 0;
  float worst_x = 0;
  float prev = std::numeric_limits<float>::infinity();
  auto check = [&](float x) {
    const float got = draw::NegTwoLogScaled(x);
    const double ref = -2.0 * std::log(static_cast<double>(x) / 2147483648.0);
    ASSERT_GE(got, 0.0f) << x;
    ASSERT_LE(got, prev) << "not monotone at " << x;  // x increases
    prev = got;
    if (ref == 0.0) {
      ASSERT_EQ(got, 0.0f);
      return;
    }
    const double e = UlpError(got, ref);
    if (e > worst) {
      worst = e;
      worst_x = x;
    }
  };
  for (uint32_t a = 1; a < (1u << 24); a += 2) check(static_cast<float>(a));
  for (uint32_t b = 0x4b800000u; b <= 0x4f000000u; ++b) check(FloatOf(b));  // 2^24 .. 2^31
  EXPECT_LE(worst, 2.0) << "at x = " << worst_x;
  // The ends: u1 = 2^-31 and u1 = 1.
  EXPECT_NEAR(draw::NegTwoLogScaled(1.0f), 62.0 * std::log(2.0), 4e-6);
  EXPECT_EQ(draw::NegTwoLogScaled(2147483648.0f), 0.0f);
}

TEST(RandomDrawsTest, SinCosWithinTwoUlpOverEveryAngle) {
  // Every t = (2j + 1) / 2^25 in (-1/2, 1/2) that AngleOf yields. Measured:
  // sin 1.70 ulp (8.7e-8 absolute), cos 1.22 ulp (7.2e-8).
  double worst_sin = 0, worst_cos = 0;
  for (int32_t j = -(1 << 23); j < (1 << 23); ++j) {
    const float t = static_cast<float>(2 * j + 1) / 33554432.0f;
    const double x = 1.5707963267948966 * static_cast<double>(t);
    const float s = draw::SinHalfPi(t);
    const float c = draw::CosHalfPi(t);
    worst_sin = std::max(worst_sin, UlpError(s, std::sin(x)));
    worst_cos = std::max(worst_cos, UlpError(c, std::cos(x)));
    ASSERT_EQ(std::signbit(s), t < 0) << t;
    ASSERT_LE(c, 1.0f);
  }
  EXPECT_LE(worst_sin, 2.0);
  EXPECT_LE(worst_cos, 2.0);
}

TEST(RandomDrawsTest, AngleCoversTheTurnEvenly) {
  // Bits v give the angle 2 pi (v + 1/2) / 2^26 = (pi / 2) (q + t).
  for (uint32_t v : {0u, 1u, (1u << 23) - 1, 1u << 23, (1u << 24) - 1, 1u << 24, 3u << 24,
                     (1u << 26) - (1u << 23) - 1, (1u << 26) - (1u << 23), (1u << 26) - 1}) {
    const draw::Angle a = draw::AngleOf(v | (uint64_t{0xabcdef} << 26));  // upper bits ignored
    const double turn = (v + 0.5) / 67108864.0 * 4.0;                      // in quarter turns
    const double want = turn - std::floor(turn + 0.5);
    EXPECT_EQ(static_cast<double>(a.t), want) << v;
    EXPECT_EQ(a.quadrant, static_cast<int32_t>(std::floor(turn + 0.5)) % 4) << v;
  }
}

// An independent evaluation of the same recipe: every float operation done
// in double and rounded to float at once (correctly rounded: double has more
// than 2 * 24 + 2 bits), the exponent split by std::frexp, the angle by
// double arithmetic. Bitwise agreement with draw::NormalPair shows the
// library's arithmetic is the correctly rounded one: nothing fused,
// reordered or flushed.
float F(double v) { return static_cast<float>(v); }

void ReferencePair(uint64_t bits, float* z0, float* z1) {
  const float x = F(static_cast<double>((bits >> 33) | 1u));
  int e2 = 0;
  const double half = std::frexp(static_cast<double>(x), &e2);  // x = half * 2^e2
  float m;
  int e;
  if (F(half) >= 0.70710677f) {  // 2 half >= the float below sqrt 2
    m = F(half);
    e = e2;
  } else {
    m = F(2.0 * half);
    e = e2 - 1;
  }
  const float f = F(static_cast<double>(m) - 1.0);
  const float s = F(static_cast<double>(f) / F(2.0 + static_cast<double>(f)));
  const float y = F(static_cast<double>(s) * s);
  const float kR[] = {0.23332141f, 0.28550756f, 0.40000123f, 0.6666667f};
  float r = kR[0];
  for (int i = 1; i < 4; ++i) r = F(static_cast<double>(F(static_cast<double>(r) * y)) + kR[i]);
  const float log1pf = F(static_cast<double>(F(2.0 * s)) + F(static_cast<double>(s) * F(static_cast<double>(y) * r)));
  const double k = 31 - e;
  const float neg_log =
      F(static_cast<double>(F(k * 0.693145751953125)) +
        F(static_cast<double>(F(k * static_cast<double>(1.4286068e-06f))) - log1pf));
  const float radius = F(std::sqrt(2.0 * neg_log));
  const double turn = (static_cast<double>(bits & 0x3ffffffu) + 0.5) / 16777216.0;  // quarters
  const double q = std::floor(turn + 0.5);
  const float t = F(turn - q);
  const float yt = F(static_cast<double>(t) * t);
  const float kS[] = {-0.004601658f, 0.07968003f, -0.6459635f, 1.5707964f};
  const float kC[] = {0.000903363f, -0.020859936f, 0.25366917f, -1.2337005f, 1.0f};
  float ps = kS[0], pc = kC[0];
  for (int i = 1; i < 4; ++i) ps = F(static_cast<double>(F(static_cast<double>(ps) * yt)) + kS[i]);
  for (int i = 1; i < 5; ++i) pc = F(static_cast<double>(F(static_cast<double>(pc) * yt)) + kC[i]);
  const float sn = F(static_cast<double>(t) * ps);
  const float cs = pc;
  float c = cs, si = sn;  // rotate by q quarter turns
  for (int i = 0; i < static_cast<int>(q) % 4; ++i) {
    const float c2 = -si;
    si = c;
    c = c2;
  }
  *z0 = F(static_cast<double>(radius) * c);
  *z1 = F(static_cast<double>(radius) * si);
}

std::vector<uint64_t> EdgeBits() {
  std::vector<uint64_t> bits;
  const uint64_t highs[] = {0, 1, 2, (uint64_t{1} << 23) - 1, uint64_t{1} << 23,
                            (uint64_t{1} << 24) - 1, uint64_t{1} << 24, (uint64_t{1} << 31) - 1,
                            (uint64_t{1} << 31) - 64, (uint64_t{1} << 31) - 65, 0x5a827999u};
  const uint64_t angles[] = {0, 1, (1u << 23) - 1, 1u << 23, (1u << 24) - 1, 1u << 24,
                             (1u << 25) + (1u << 23), (1u << 26) - 1};
  for (uint64_t h : highs) {
    for (uint64_t a : angles) bits.push_back((h << 33) | a | (uint64_t{0x55} << 26));
  }
  return bits;
}

TEST(RandomDrawsTest, NormalPairMatchesIndependentEmulationBitwise) {
  std::vector<uint64_t> bits = EdgeBits();
  for (uint64_t i = 0; i < (uint64_t{1} << 20); ++i) bits.push_back(draw::SplitMix64(i ^ 0x1234));
  int64_t mismatches = 0;
  for (uint64_t b : bits) {
    float z0, z1, r0, r1;
    draw::NormalPair(b, &z0, &z1);
    ReferencePair(b, &r0, &r1);
    if (std::memcmp(&z0, &r0, 4) != 0 || std::memcmp(&z1, &r1, 4) != 0) {
      if (++mismatches <= 5) {
        ADD_FAILURE() << std::hex << "bits 0x" << b << std::dec << ": " << z0 << ", " << z1
                      << " vs " << r0 << ", " << r1;
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(RandomDrawsTest, NormalPairCloseToDoubleBoxMuller) {
  // Against r cos(theta), r sin(theta) in double from the same uniforms:
  // error <= 3 * 2^-24 * max(1, r) (measured 2.82).
  std::vector<uint64_t> bits = EdgeBits();
  for (uint64_t i = 0; i < 2000000; ++i) bits.push_back(draw::SplitMix64(i * 3 + 1));
  double worst = 0;
  for (uint64_t b : bits) {
    float z0, z1;
    draw::NormalPair(b, &z0, &z1);
    const double x = static_cast<float>(static_cast<int32_t>((b >> 33) | 1u));
    const double r = std::sqrt(-2.0 * std::log(x / 2147483648.0));
    const double theta = 6.283185307179586 * ((b & 0x3ffffffu) + 0.5) / 67108864.0;
    const double e = std::max(std::fabs(z0 - r * std::cos(theta)), std::fabs(z1 - r * std::sin(theta)));
    worst = std::max(worst, e / std::max(1.0, r));
    ASSERT_LE(std::fabs(z0), 6.5566f);
    ASSERT_LE(std::fabs(z1), 6.5566f);
  }
  EXPECT_LE(worst, 3.0 / 16777216.0);
  // The largest radius: a = 0, u1 = 2^-31, r = sqrt(62 ln 2) = 6.5561.
  float z0, z1;
  draw::NormalPair(0x3ffffffu ^ 0x1ffffffu, &z0, &z1);  // angle near 0 (just below)
  EXPECT_NEAR(std::sqrt(static_cast<double>(z0) * z0 + static_cast<double>(z1) * z1),
              std::sqrt(62.0 * std::log(2.0)), 1e-5);
}

TEST(InitializeRowTest, NormalRowIsDrawByDrawWhateverTheLoop) {
  // Value d is mean + stddev * draw d, the same from the vectorized loop (and
  // its AVX2 version) as from one draw at a time, for every dim.
  InitializerSpec s = Spec(InitKind::kNormal, 31);
  s.mean = -0.25f;
  s.stddev = 3.0f;
  for (int64_t dim = 1; dim <= 41; ++dim) {
    for (int64_t key : SpecialKeys()) {
      const std::vector<float> row = Row(s, key, dim);
      const DrawMix mix(s.seed, key);
      for (int64_t d = 0; d < dim; ++d) {
        const float want = s.mean + s.stddev * StandardNormal(mix, static_cast<uint64_t>(d));
        ASSERT_EQ(std::memcmp(&row[d], &want, 4), 0) << "dim " << dim << " key " << key << " d " << d;
      }
      std::vector<float> base(static_cast<size_t>(dim / 2 * 2));
      NormalPairsLoop<false>(mix.seed_key, s.mean, s.stddev, dim / 2, base.data());
      EXPECT_TRUE(BitwiseEqual(base, std::vector<float>(row.begin(), row.begin() + dim / 2 * 2)));
    }
  }
}

// Kolmogorov-Smirnov statistic of `v` (sorted here) against `cdf`.
template <typename Cdf>
double KolmogorovSmirnov(std::vector<double>* v, Cdf cdf) {
  std::sort(v->begin(), v->end());
  const double n = static_cast<double>(v->size());
  double d = 0;
  for (size_t i = 0; i < v->size(); ++i) {
    const double c = cdf((*v)[i]);
    d = std::max(d, std::max(c - i / n, (i + 1) / n - c));
  }
  return d;
}

double NormalCdf(double z) { return 0.5 * std::erfc(-z / std::sqrt(2.0)); }

TEST(InitializeRowTest, NormalDistributionOverAMillionDraws) {
  InitializerSpec s = Spec(InitKind::kNormal, 2025);
  const int64_t dim = 16, keys = 1 << 16;  // 1,048,576 values
  std::vector<double> z;
  z.reserve(static_cast<size_t>(dim * keys));
  double sum = 0, sum2 = 0, cross = 0;
  int64_t beyond3 = 0;
  for (int64_t k = 0; k < keys; ++k) {
    const std::vector<float> row = Row(s, k * 2654435761LL - 12345, dim);
    for (int64_t d = 0; d < dim; ++d) {
      z.push_back(row[d]);
      sum += row[d];
      sum2 += static_cast<double>(row[d]) * row[d];
      if (std::fabs(row[d]) > 3.0f) ++beyond3;
      if (d % 2 == 1) cross += static_cast<double>(row[d - 1]) * row[d];  // the pair's two values
    }
  }
  const double n = static_cast<double>(z.size());
  const double mean = sum / n;
  EXPECT_NEAR(mean, 0.0, 4.0 / std::sqrt(n));
  EXPECT_NEAR(std::sqrt(sum2 / n - mean * mean), 1.0, 4.0 / std::sqrt(2.0 * n));
  EXPECT_NEAR(cross / (n / 2), 0.0, 4.0 / std::sqrt(n / 2));  // uncorrelated components
  // P(|Z| > 3) = 0.0026998: about 2831 of 1,048,576 (sd 53).
  EXPECT_NEAR(static_cast<double>(beyond3), 0.0026998 * n, 4 * std::sqrt(0.0027 * n));
  // The 0.1% critical value of D is 1.95 / sqrt(n).
  const double ks = KolmogorovSmirnov(&z, NormalCdf);
  EXPECT_LT(ks, 1.95 / std::sqrt(n)) << "KS statistic " << ks;
}

TEST(InitializeRowTest, TruncatedNormalDistributionOverAMillionDraws) {
  InitializerSpec s = Spec(InitKind::kTruncatedNormal, 606);
  s.mean = 0.5f;
  s.stddev = 0.25f;
  const int64_t dim = 16, keys = 1 << 16;
  std::vector<double> z;
  z.reserve(static_cast<size_t>(dim * keys));
  for (int64_t k = 0; k < keys; ++k) {
    for (float v : Row(s, k ^ 0x7777, dim)) {
      ASSERT_GE(v, s.mean - 2 * s.stddev);
      ASSERT_LE(v, s.mean + 2 * s.stddev);
      z.push_back((static_cast<double>(v) - s.mean) / s.stddev);
    }
  }
  const double n = static_cast<double>(z.size());
  const double lo = NormalCdf(-2.0), mass = NormalCdf(2.0) - lo;
  const double ks = KolmogorovSmirnov(&z, [&](double x) { return (NormalCdf(x) - lo) / mass; });
  // The affine map's float rounding moves values by ~1e-7, far below the
  // critical value's 1.9e-3.
  EXPECT_LT(ks, 1.95 / std::sqrt(n)) << "KS statistic " << ks;
}

}  // namespace
}  // namespace core
}  // namespace sok_graph
