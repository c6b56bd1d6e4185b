// Tests for tf_ops/lookup/core/combiner.h.
#include "tf_ops/lookup/core/combiner.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace sok_graph {
namespace core {
namespace {

TEST(ParseCombinerTest, KnownNames) {
  Combiner c = Combiner::kSqrtn;
  ASSERT_TRUE(ParseCombiner("sum", &c));
  EXPECT_EQ(c, Combiner::kSum);
  ASSERT_TRUE(ParseCombiner("mean", &c));
  EXPECT_EQ(c, Combiner::kMean);
  ASSERT_TRUE(ParseCombiner("sqrtn", &c));
  EXPECT_EQ(c, Combiner::kSqrtn);
}

TEST(ParseCombinerTest, TheOneListSpellsTheAttribute) {
  EXPECT_EQ(QuotedCombinerNames(), "'sum', 'mean', 'sqrtn'");
  EXPECT_EQ(CombinersAttr(), "combiners: list({'sum', 'mean', 'sqrtn'})");
}

TEST(ParseCombinerTest, RejectsOtherNames) {
  for (const char* bad : {"", "Sum", "SUM", "mean ", " mean", "sqrt", "sqrtN", "max", "avg",
                          "summ", "tile"}) {
    Combiner c = Combiner::kMean;
    EXPECT_FALSE(ParseCombiner(bad, &c)) << "'" << bad << "'";
  }
}

TEST(CombinerScaleTest, Sum) {
  EXPECT_EQ(CombinerScale(Combiner::kSum, 3.0f, 5.0f), 1.0f);
  EXPECT_EQ(CombinerScale(Combiner::kSum, 0.0f, 0.0f), 1.0f);
  EXPECT_EQ(CombinerScale(Combiner::kSum, -2.0f, 4.0f), 1.0f);
}

TEST(CombinerScaleTest, Mean) {
  EXPECT_FLOAT_EQ(CombinerScale(Combiner::kMean, 4.0f, 123.0f), 0.25f);
  EXPECT_FLOAT_EQ(CombinerScale(Combiner::kMean, 3.0f, 3.0f), 1.0f / 3.0f);
  EXPECT_FLOAT_EQ(CombinerScale(Combiner::kMean, -0.5f, 0.25f), -2.0f);
  // No ids or weights summing to zero: 0, never inf/NaN.
  EXPECT_EQ(CombinerScale(Combiner::kMean, 0.0f, 0.0f), 0.0f);
  EXPECT_EQ(CombinerScale(Combiner::kMean, 0.0f, 2.0f), 0.0f);
  EXPECT_EQ(CombinerScale(Combiner::kMean, -0.0f, 0.0f), 0.0f);
}

TEST(CombinerScaleTest, Sqrtn) {
  EXPECT_FLOAT_EQ(CombinerScale(Combiner::kSqrtn, 2.0f, 4.0f), 0.5f);
  EXPECT_FLOAT_EQ(CombinerScale(Combiner::kSqrtn, 0.0f, 2.0f), static_cast<float>(1.0 / std::sqrt(2.0)));
  // Weight sum is irrelevant for sqrtn.
  EXPECT_FLOAT_EQ(CombinerScale(Combiner::kSqrtn, -7.0f, 9.0f), 1.0f / 3.0f);
  EXPECT_EQ(CombinerScale(Combiner::kSqrtn, 0.0f, 0.0f), 0.0f);
  EXPECT_EQ(CombinerScale(Combiner::kSqrtn, 3.0f, 0.0f), 0.0f);
}

TEST(CombinerScaleTest, RandomAgainstDouble) {
  std::mt19937_64 rng(8);
  std::uniform_real_distribution<float> w(0.01f, 50.0f);
  for (int i = 0; i < 1000; ++i) {
    const float s = w(rng), q = w(rng);
    EXPECT_NEAR(CombinerScale(Combiner::kMean, s, q), 1.0 / s, 1e-6 / s);
    EXPECT_NEAR(CombinerScale(Combiner::kSqrtn, s, q), 1.0 / std::sqrt(double{q}),
                1e-6 / std::sqrt(double{q}));
    EXPECT_EQ(CombinerScale(Combiner::kSum, s, q), 1.0f);
  }
}

// Reference clip factor in double.
double RefClip(const std::vector<double>& x, double m) {
  if (m <= 0) return 1.0;
  double sq = 0;
  for (double v : x) sq += v * v;
  const double norm = std::sqrt(sq);
  return m / std::max(norm, m);
}

TEST(MaxNormScaleTest, HandWritten) {
  const float row[3] = {3.0f, 0.0f, 4.0f};  // norm 5
  EXPECT_EQ(MaxNormScale(row, 3, 0.0f), 1.0f);
  EXPECT_EQ(MaxNormScale(row, 3, -1.0f), 1.0f);
  EXPECT_EQ(MaxNormScale(row, 3, 10.0f), 1.0f);
  EXPECT_EQ(MaxNormScale(row, 3, 5.0f), 1.0f);  // exactly at the limit: no clipping
  EXPECT_FLOAT_EQ(MaxNormScale(row, 3, 1.0f), 0.2f);
  EXPECT_FLOAT_EQ(MaxNormScale(row, 3, 2.5f), 0.5f);
  const double drow[2] = {-6.0, 8.0};  // norm 10
  EXPECT_FLOAT_EQ(MaxNormScale(drow, 2, 4.0f), 0.4f);
  const int32_t irow[2] = {5, 12};  // norm 13
  EXPECT_FLOAT_EQ(MaxNormScale(irow, 2, 1.0f), 1.0f / 13.0f);
  const float zero[4] = {0, 0, 0, 0};
  EXPECT_EQ(MaxNormScale(zero, 4, 1.0f), 1.0f);
  EXPECT_EQ(MaxNormScale(zero, 0, 1.0f), 1.0f);  // empty row
}

TEST(MaxNormScaleTest, RandomAgainstDouble) {
  std::mt19937_64 rng(17);
  std::uniform_real_distribution<float> v(-2.0f, 2.0f);
  std::uniform_real_distribution<float> m(-0.5f, 4.0f);
  for (int trial = 0; trial < 2000; ++trial) {
    const int dim = 1 + static_cast<int>(rng() % 16);
    std::vector<float> row(static_cast<size_t>(dim));
    for (float& x : row) x = v(rng);
    const float max_norm = m(rng);
    const double want = RefClip(std::vector<double>(row.begin(), row.end()), max_norm);
    const double got = MaxNormScale(row.data(), dim, max_norm);
    EXPECT_NEAR(got, want, 1e-5 * want) << "trial " << trial;
    // The clipped row never exceeds max_norm (up to float rounding).
    if (max_norm > 0) {
      double sq = 0;
      for (float x : row) sq += (x * got) * (x * got);
      EXPECT_LE(std::sqrt(sq), max_norm * (1 + 1e-5)) << "trial " << trial;
    }
  }
}

// L(x) = g . clip(x), clip(x) = x * m / max(||x||, m), in double.
double ClippedDot(const std::vector<double>& x, const std::vector<double>& g, double m) {
  const double c = RefClip(x, m);
  double l = 0;
  for (size_t i = 0; i < x.size(); ++i) l += g[i] * x[i] * c;
  return l;
}

// dL/dx by central finite differences.
std::vector<double> FiniteDifferenceGrad(const std::vector<double>& x,
                                         const std::vector<double>& g, double m) {
  const double h = 1e-6;
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    std::vector<double> xp = x, xm = x;
    xp[i] += h;
    xm[i] -= h;
    out[i] = (ClippedDot(xp, g, m) - ClippedDot(xm, g, m)) / (2 * h);
  }
  return out;
}

TEST(MaxNormBackwardTest, DisabledOrUnclippedIsIdentity) {
  const float row[3] = {3.0f, 0.0f, 4.0f};  // norm 5
  for (float m : {0.0f, -1.0f, 5.0f, 5.5f, 100.0f}) {
    float grad[3] = {0.5f, -2.0f, 7.0f};
    MaxNormBackward(row, 3, m, grad);
    EXPECT_EQ(grad[0], 0.5f) << "m " << m;
    EXPECT_EQ(grad[1], -2.0f) << "m " << m;
    EXPECT_EQ(grad[2], 7.0f) << "m " << m;
  }
  const float zero[2] = {0.0f, 0.0f};
  float grad[2] = {1.0f, 2.0f};
  MaxNormBackward(zero, 2, 1.0f, grad);
  EXPECT_EQ(grad[0], 1.0f);
  EXPECT_EQ(grad[1], 2.0f);
}

TEST(MaxNormTest, ARowHoldingNaNIsNaNAsTensorFlowsClip) {
  // tf.clip_by_norm divides by max(NaN, m), which is NaN: every value of the
  // clipped row and of its gradient is NaN. Unclipped, the row's finite
  // values and a finite gradient hid the NaN.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float row[3] = {nan, 1.0f, 2.0f};
  EXPECT_TRUE(std::isnan(MaxNormScale(row, 3, 1.0f)));
  EXPECT_EQ(MaxNormScale(row, 3, 0.0f), 1.0f);  // no clipping asked
  float grad[3] = {1.0f, 1.0f, 1.0f};
  MaxNormBackward(row, 3, 1.0f, grad);
  for (float g : grad) EXPECT_TRUE(std::isnan(g));
}

TEST(MaxNormBackwardTest, HandWritten) {
  // x = (3, 4), ||x|| = 5, m = 1: J = (1/5) (I - x x^T / 25).
  // g = (1, 0): J g = (1/5) ((1, 0) - (3, 4) * 3/25) = (16/125, -12/125).
  const float row[2] = {3.0f, 4.0f};
  float grad[2] = {1.0f, 0.0f};
  MaxNormBackward(row, 2, 1.0f, grad);
  EXPECT_NEAR(grad[0], 16.0 / 125.0, 1e-6);
  EXPECT_NEAR(grad[1], -12.0 / 125.0, 1e-6);
  // A gradient along x is annihilated (the clipped norm is constant).
  float along[2] = {3.0f, 4.0f};
  MaxNormBackward(row, 2, 1.0f, along);
  EXPECT_NEAR(along[0], 0.0, 1e-6);
  EXPECT_NEAR(along[1], 0.0, 1e-6);
}

TEST(MaxNormBackwardTest, MatchesFiniteDifferences) {
  std::mt19937_64 rng(4242);
  std::uniform_real_distribution<float> v(-2.0f, 2.0f);
  std::uniform_real_distribution<float> m(0.05f, 4.0f);
  int clipped = 0, unclipped = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const int dim = 1 + static_cast<int>(rng() % 12);
    std::vector<float> row(static_cast<size_t>(dim));
    std::vector<float> grad(static_cast<size_t>(dim));
    for (float& x : row) x = v(rng);
    for (float& x : grad) x = v(rng);
    const float max_norm = m(rng);
    std::vector<double> x(row.begin(), row.end()), g(grad.begin(), grad.end());
    double norm = 0;
    for (double e : x) norm += e * e;
    norm = std::sqrt(norm);
    // Stay away from the kink at ||x|| == m, where the gradient jumps.
    if (std::fabs(norm - max_norm) < 1e-3 * max_norm) continue;
    (norm > max_norm ? clipped : unclipped)++;

    const std::vector<double> want = FiniteDifferenceGrad(x, g, max_norm);
    double scale = 0;
    for (double e : want) scale = std::max(scale, std::fabs(e));
    for (double e : g) scale = std::max(scale, std::fabs(e));
    MaxNormBackward(row.data(), dim, max_norm, grad.data());
    for (int d = 0; d < dim; ++d) {
      EXPECT_NEAR(grad[static_cast<size_t>(d)], want[static_cast<size_t>(d)],
                  1e-4 * (1 + scale))
          << "trial " << trial << " d " << d << " norm " << norm << " m " << max_norm;
    }
  }
  // Both branches were exercised.
  EXPECT_GT(clipped, 200);
  EXPECT_GT(unclipped, 200);
}

TEST(MaxNormBackwardTest, DoubleRows) {
  std::mt19937_64 rng(99);
  std::uniform_real_distribution<double> v(-3.0, 3.0);
  for (int trial = 0; trial < 200; ++trial) {
    const int dim = 1 + static_cast<int>(rng() % 8);
    std::vector<double> x(static_cast<size_t>(dim)), g(static_cast<size_t>(dim));
    for (double& e : x) e = v(rng);
    for (double& e : g) e = v(rng);
    double norm = 0;
    for (double e : x) norm += e * e;
    norm = std::sqrt(norm);
    const float max_norm = static_cast<float>(norm / 2);  // always clipped
    if (!(max_norm > 1e-3)) continue;
    const std::vector<double> want = FiniteDifferenceGrad(x, g, max_norm);
    std::vector<float> grad(g.begin(), g.end());
    MaxNormBackward(x.data(), dim, max_norm, grad.data());
    for (int d = 0; d < dim; ++d) {
      EXPECT_NEAR(grad[static_cast<size_t>(d)], want[static_cast<size_t>(d)], 1e-4 * 4)
          << "trial " << trial << " d " << d;
    }
  }
}

// A checker written differently from the header: collect every problem, then
// report the one with the highest priority (first != 0, then the first
// decrease, then the last element).
template <typename S>
SplitsProblem ReferenceCheck(const std::vector<S>& s, int64_t nnz) {
  SplitsProblem p;
  if (s.empty()) return p;
  std::vector<int64_t> decreases;
  for (size_t i = 0; i + 1 < s.size(); ++i) {
    if (static_cast<int64_t>(s[i + 1]) - static_cast<int64_t>(s[i]) < 0) {
      decreases.push_back(static_cast<int64_t>(i + 1));
    }
  }
  if (static_cast<int64_t>(s.front()) != 0) {
    p.kind = SplitsProblem::kFirstNotZero;
    p.position = 0;
  } else if (!decreases.empty()) {
    p.kind = SplitsProblem::kDecreasing;
    p.position = decreases.front();
  } else if (static_cast<int64_t>(s.back()) != nnz) {
    p.kind = SplitsProblem::kLastNotNnz;
    p.position = static_cast<int64_t>(s.size()) - 1;
  }
  return p;
}

TEST(CheckRowSplitsTest, HandWritten) {
  std::vector<int64_t> ok = {0, 2, 2, 5};
  SplitsProblem p = CheckRowSplits(ok.data(), 4, 5);
  EXPECT_EQ(p.kind, SplitsProblem::kNone);
  EXPECT_EQ(p.position, -1);

  p = CheckRowSplits(ok.data(), 0, 7);  // no splits at all
  EXPECT_EQ(p.kind, SplitsProblem::kNone);

  std::vector<int64_t> zero = {0};
  EXPECT_EQ(CheckRowSplits(zero.data(), 1, 0).kind, SplitsProblem::kNone);
  p = CheckRowSplits(zero.data(), 1, 3);
  EXPECT_EQ(p.kind, SplitsProblem::kLastNotNnz);
  EXPECT_EQ(p.position, 0);

  std::vector<int32_t> first = {1, 2, 3};
  p = CheckRowSplits(first.data(), 3, 3);
  EXPECT_EQ(p.kind, SplitsProblem::kFirstNotZero);
  EXPECT_EQ(p.position, 0);

  std::vector<int32_t> dec = {0, 3, 2, 1, 4};
  p = CheckRowSplits(dec.data(), 5, 4);
  EXPECT_EQ(p.kind, SplitsProblem::kDecreasing);
  EXPECT_EQ(p.position, 2);

  std::vector<int64_t> last = {0, 1, 2};
  p = CheckRowSplits(last.data(), 3, 3);
  EXPECT_EQ(p.kind, SplitsProblem::kLastNotNnz);
  EXPECT_EQ(p.position, 2);

  std::vector<int64_t> neg = {-1, 0, 1};
  EXPECT_EQ(CheckRowSplits(neg.data(), 3, 1).kind, SplitsProblem::kFirstNotZero);
}

template <typename S>
void ExhaustiveSplits() {
  // Every vector of length 0..4 with values in [-1, 3], every nnz in [0, 3].
  for (int len = 0; len <= 4; ++len) {
    int total = 1;
    for (int i = 0; i < len; ++i) total *= 5;
    for (int code = 0; code < total; ++code) {
      std::vector<S> s;
      int c = code;
      for (int i = 0; i < len; ++i) {
        s.push_back(static_cast<S>(c % 5 - 1));
        c /= 5;
      }
      for (int64_t nnz = 0; nnz <= 3; ++nnz) {
        const SplitsProblem want = ReferenceCheck(s, nnz);
        const SplitsProblem got =
            CheckRowSplits(s.data(), static_cast<int64_t>(s.size()), nnz);
        ::testing::Message m;
        m << "splits [";
        for (S v : s) m << v << " ";
        m << "] nnz " << nnz;
        ASSERT_EQ(got.kind, want.kind) << m;
        ASSERT_EQ(got.position, want.position) << m;
      }
    }
  }
}

TEST(CheckRowSplitsTest, ExhaustiveInt32) { ExhaustiveSplits<int32_t>(); }
TEST(CheckRowSplitsTest, ExhaustiveInt64) { ExhaustiveSplits<int64_t>(); }

TEST(CheckRowSplitsTest, RandomLong) {
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 500; ++trial) {
    const int batch = static_cast<int>(rng() % 50);
    std::vector<int64_t> s = {0};
    for (int b = 0; b < batch; ++b) s.push_back(s.back() + static_cast<int64_t>(rng() % 4));
    int64_t nnz = s.back();
    const int corrupt = static_cast<int>(rng() % 4);
    if (corrupt == 1) s[rng() % s.size()] += 1 + static_cast<int64_t>(rng() % 3);
    if (corrupt == 2 && s.size() > 1) s[1 + rng() % (s.size() - 1)] -= 1 + static_cast<int64_t>(rng() % 3);
    if (corrupt == 3) nnz += 1;
    const SplitsProblem want = ReferenceCheck(s, nnz);
    const SplitsProblem got = CheckRowSplits(s.data(), static_cast<int64_t>(s.size()), nnz);
    ASSERT_EQ(got.kind, want.kind) << "trial " << trial;
    ASSERT_EQ(got.position, want.position) << "trial " << trial;
  }
}

}  // namespace
}  // namespace core
}  // namespace sok_graph
