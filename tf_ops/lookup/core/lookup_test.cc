// Tests for tf_ops/lookup/core/lookup.h against brute-force double-precision
// references of tf.nn.embedding_lookup_sparse's forward and backward.
#include "tf_ops/lookup/core/lookup.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "gtest/gtest.h"

namespace sok_graph {
namespace core {
namespace {

const Combiner kAllCombiners[] = {Combiner::kSum, Combiner::kMean, Combiner::kSqrtn};

const char* Name(Combiner c) {
  switch (c) {
    case Combiner::kSum:
      return "sum";
    case Combiner::kMean:
      return "mean";
    case Combiner::kSqrtn:
      return "sqrtn";
  }
  return "?";
}

// One table's inputs, owned.
template <typename T, typename K>
struct Case {
  int64_t rows = 0;
  int64_t dim = 0;
  std::vector<T> params;
  std::vector<K> ids;
  std::vector<int64_t> splits = {0};
  std::vector<T> weights;  // empty: unweighted
  Combiner combiner = Combiner::kMean;
  float max_norm = 0.0f;

  int64_t batch() const { return static_cast<int64_t>(splits.size()) - 1; }
  int64_t nnz() const { return static_cast<int64_t>(ids.size()); }

  TableView<T, K> View() const {
    TableView<T, K> t;
    t.params = params.data();
    t.rows = rows;
    t.dim = dim;
    t.ids = ids.data();
    t.row_splits = splits.data();
    t.batch = batch();
    t.weights = weights.empty() ? nullptr : weights.data();
    t.combiner = combiner;
    t.max_norm = max_norm;
    return t;
  }

  std::string Describe() const {
    std::string s = std::string("combiner ") + Name(combiner) +
                    (weights.empty() ? " unweighted" : " weighted") +
                    " max_norm " + std::to_string(max_norm) + " rows " +
                    std::to_string(rows) + " dim " + std::to_string(dim) + " batch " +
                    std::to_string(batch()) + " ids [";
    for (K id : ids) s += std::to_string(static_cast<int64_t>(id)) + " ";
    s += "] splits [";
    for (int64_t x : splits) s += std::to_string(x) + " ";
    return s + "]";
  }
};

// ---------------------------------------------------------------------------
// Reference implementation, in double, written from the documented semantics.

double RefWeight(const std::vector<double>& w, size_t j) { return w.empty() ? 1.0 : w[j]; }

template <typename T, typename K>
std::vector<double> RefRow(const Case<T, K>& c, int64_t id) {
  std::vector<double> row(static_cast<size_t>(c.dim));
  for (int64_t d = 0; d < c.dim; ++d) row[static_cast<size_t>(d)] =
      static_cast<double>(c.params[static_cast<size_t>(id * c.dim + d)]);
  return row;
}

// clip(x) = x * m / max(||x||, m); no clipping when m <= 0.
std::vector<double> RefClip(std::vector<double> x, double m) {
  if (m <= 0) return x;
  double sq = 0;
  for (double v : x) sq += v * v;
  const double f = m / std::max(std::sqrt(sq), m);
  for (double& v : x) v *= f;
  return x;
}

double RefCombinerScale(Combiner c, double wsum, double wsq) {
  if (c == Combiner::kSum) return 1.0;
  if (c == Combiner::kMean) return wsum != 0 ? 1.0 / wsum : 0.0;
  return wsq > 0 ? 1.0 / std::sqrt(wsq) : 0.0;
}

template <typename T, typename K>
std::vector<double> RefScales(const Case<T, K>& c) {
  const std::vector<double> w(c.weights.begin(), c.weights.end());
  std::vector<double> scales;
  for (int64_t b = 0; b < c.batch(); ++b) {
    double wsum = 0, wsq = 0;
    for (int64_t j = c.splits[b]; j < c.splits[b + 1]; ++j) {
      const double x = RefWeight(w, static_cast<size_t>(j));
      wsum += x;
      wsq += x * x;
    }
    scales.push_back(RefCombinerScale(c.combiner, wsum, wsq));
  }
  return scales;
}

// out[b] = scale(b) * sum_j w_j * clip(params[ids[j]]), in double.
template <typename T, typename K>
std::vector<double> RefForward(const Case<T, K>& c) {
  const std::vector<double> w(c.weights.begin(), c.weights.end());
  const std::vector<double> scales = RefScales(c);
  std::vector<double> out(static_cast<size_t>(c.batch() * c.dim), 0.0);
  for (int64_t b = 0; b < c.batch(); ++b) {
    for (int64_t j = c.splits[b]; j < c.splits[b + 1]; ++j) {
      const std::vector<double> row =
          RefClip(RefRow(c, static_cast<int64_t>(c.ids[static_cast<size_t>(j)])), c.max_norm);
      for (int64_t d = 0; d < c.dim; ++d) {
        out[static_cast<size_t>(b * c.dim + d)] +=
            scales[static_cast<size_t>(b)] * RefWeight(w, static_cast<size_t>(j)) *
            row[static_cast<size_t>(d)];
      }
    }
  }
  return out;
}

// d/dx of g . clip(x) by central finite differences.
std::vector<double> FdClipGrad(const std::vector<double>& x, const std::vector<double>& g,
                               double m) {
  const double h = 1e-6;
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    std::vector<double> xp = x, xm = x;
    xp[i] += h;
    xm[i] -= h;
    const std::vector<double> yp = RefClip(xp, m), ym = RefClip(xm, m);
    double lp = 0, lm = 0;
    for (size_t k = 0; k < x.size(); ++k) {
      lp += g[k] * yp[k];
      lm += g[k] * ym[k];
    }
    out[i] = (lp - lm) / (2 * h);
  }
  return out;
}

template <typename K>
struct RefGrad {
  std::vector<K> unique;              // first-appearance order
  std::vector<std::vector<double>> rows;
  std::vector<double> magnitude;      // sum of |terms|, for tolerances
};

// For each occurrence j of id u in sample b: w_j * scale(b) * grads[b], summed
// per unique id, then through the clip's Jacobian when max_norm > 0.
template <typename T, typename K>
RefGrad<K> RefBackward(const Case<T, K>& c, const std::vector<T>& grads) {
  const std::vector<double> w(c.weights.begin(), c.weights.end());
  const std::vector<double> scales = RefScales(c);
  RefGrad<K> r;
  std::map<K, size_t> where;
  for (int64_t b = 0; b < c.batch(); ++b) {
    for (int64_t j = c.splits[b]; j < c.splits[b + 1]; ++j) {
      const K id = c.ids[static_cast<size_t>(j)];
      if (where.find(id) == where.end()) {
        where[id] = r.unique.size();
        r.unique.push_back(id);
        r.rows.push_back(std::vector<double>(static_cast<size_t>(c.dim), 0.0));
        r.magnitude.push_back(0.0);
      }
      const size_t u = where[id];
      const double s = RefWeight(w, static_cast<size_t>(j)) * scales[static_cast<size_t>(b)];
      for (int64_t d = 0; d < c.dim; ++d) {
        const double term = s * static_cast<double>(grads[static_cast<size_t>(b * c.dim + d)]);
        r.rows[u][static_cast<size_t>(d)] += term;
        r.magnitude[u] += std::fabs(term);
      }
    }
  }
  if (c.max_norm > 0) {
    for (size_t u = 0; u < r.unique.size(); ++u) {
      r.rows[u] = FdClipGrad(RefRow(c, static_cast<int64_t>(r.unique[u])), r.rows[u], c.max_norm);
    }
  }
  return r;
}

// ---------------------------------------------------------------------------
// Random cases.

template <typename T, typename K>
Case<T, K> RandomCase(std::mt19937_64* rng, Combiner combiner, bool weighted, bool clip) {
  Case<T, K> c;
  c.rows = 1 + static_cast<int64_t>((*rng)() % 40);
  // Widths 1..8 and a few wider ones, so that both the loops over a runtime
  // width and those compiled for fixed widths (4, 8, 16, 32, 64, 128; see
  // FixedWidth in lookup.h) are checked.
  static const int64_t kWidths[] = {1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 20, 32, 64, 128};
  c.dim = kWidths[(*rng)() % (sizeof(kWidths) / sizeof(kWidths[0]))];
  c.combiner = combiner;
  c.max_norm = clip ? std::uniform_real_distribution<float>(0.3f, 1.5f)(*rng) : 0.0f;
  std::uniform_real_distribution<float> val(-1.0f, 1.0f);
  for (int64_t r = 0; r < c.rows; ++r) {
    while (true) {
      std::vector<float> row(static_cast<size_t>(c.dim));
      double sq = 0;
      for (float& x : row) {
        x = val(*rng);
        sq += double{x} * x;
      }
      // Keep rows away from the clip's kink at ||x|| == max_norm.
      if (clip && std::fabs(std::sqrt(sq) - c.max_norm) < 1e-3 * c.max_norm) continue;
      for (float x : row) c.params.push_back(static_cast<T>(x));
      break;
    }
  }
  const int64_t batch = static_cast<int64_t>((*rng)() % 20);
  // Sometimes draw ids from a few rows only, so ids repeat a lot.
  const int64_t id_range = ((*rng)() % 3 == 0) ? std::min<int64_t>(c.rows, 3) : c.rows;
  std::uniform_real_distribution<float> wdist(0.25f, 2.0f);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t n = ((*rng)() % 4 == 0) ? 0 : static_cast<int64_t>((*rng)() % 7);
    for (int64_t k = 0; k < n; ++k) {
      c.ids.push_back(static_cast<K>((*rng)() % static_cast<uint64_t>(id_range)));
      if (weighted) c.weights.push_back(static_cast<T>(wdist(*rng)));
    }
    c.splits.push_back(static_cast<int64_t>(c.ids.size()));
  }
  return c;
}

template <typename T>
std::vector<T> RandomGrads(std::mt19937_64* rng, int64_t batch, int64_t dim) {
  std::uniform_real_distribution<float> val(-1.0f, 1.0f);
  std::vector<T> g(static_cast<size_t>(batch * dim));
  for (T& x : g) x = static_cast<T>(val(*rng));
  return g;
}

// ---------------------------------------------------------------------------
// Checks.

template <typename T, typename K>
void CheckScales(const Case<T, K>& c) {
  const TableView<T, K> t = c.View();
  const std::vector<double> want = RefScales(c);
  const int64_t batch = c.batch();
  for (int64_t b0 = 0; b0 <= batch; b0 += std::max<int64_t>(1, batch / 2)) {
    const int64_t b1 = std::min(batch, b0 + std::max<int64_t>(1, batch / 2));
    std::vector<float> scales(static_cast<size_t>(batch) + 1, -99.0f);
    SampleScales(t, b0, b1, scales.data());
    for (int64_t b = 0; b <= batch; ++b) {
      if (b >= b0 && b < b1) {
        EXPECT_NEAR(scales[static_cast<size_t>(b)], want[static_cast<size_t>(b)],
                    1e-5 * std::fabs(want[static_cast<size_t>(b)]))
            << "sample " << b << " of " << c.Describe();
      } else {
        EXPECT_EQ(scales[static_cast<size_t>(b)], -99.0f) << "wrote sample " << b
                                                          << " outside [" << b0 << ", " << b1
                                                          << ")";
      }
    }
    if (batch == 0) break;
  }
}

template <typename T, typename K>
void CheckForward(const Case<T, K>& c) {
  const TableView<T, K> t = c.View();
  const std::vector<double> want = RefForward(c);
  const int64_t batch = c.batch(), dim = c.dim;
  // Whole batch.
  std::vector<T> out(static_cast<size_t>(batch * dim), T(-77));
  std::vector<float> acc(static_cast<size_t>(dim));
  LookupForward(t, 0, batch, out.data(), acc.data());
  for (int64_t k = 0; k < batch * dim; ++k) {
    const double got = static_cast<double>(out[static_cast<size_t>(k)]);
    ASSERT_FALSE(std::isnan(got)) << "NaN at sample " << k / dim << " of " << c.Describe();
    ASSERT_NEAR(got, want[static_cast<size_t>(k)], 1e-4 * (1 + std::fabs(want[static_cast<size_t>(k)])))
        << "sample " << k / dim << " d " << k % dim << " of " << c.Describe();
  }
  // Empty samples give zero rows.
  for (int64_t b = 0; b < batch; ++b) {
    if (c.splits[b] != c.splits[b + 1]) continue;
    for (int64_t d = 0; d < dim; ++d) ASSERT_EQ(out[static_cast<size_t>(b * dim + d)], T(0));
  }
  // A sub-range writes exactly its samples, with the same values.
  if (batch > 0) {
    const int64_t b0 = batch / 3, b1 = batch - batch / 4;
    std::vector<T> part(out.size(), T(-77));
    LookupForward(t, b0, b1, part.data(), acc.data());
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t d = 0; d < dim; ++d) {
        const size_t k = static_cast<size_t>(b * dim + d);
        if (b >= b0 && b < b1) {
          ASSERT_EQ(part[k], out[k]);
        } else {
          ASSERT_EQ(part[k], T(-77)) << "wrote sample " << b << " outside range";
        }
      }
    }
  }
}

template <typename T, typename K>
void CheckPlan(const Case<T, K>& c, const BackwardPlan<K>& plan) {
  // Unique ids in first-appearance order.
  std::vector<K> unique;
  std::map<K, int> seen;
  for (K id : c.ids) {
    if (seen.emplace(id, 0).second) unique.push_back(id);
  }
  ASSERT_EQ(plan.unique_ids, unique) << c.Describe();
  ASSERT_EQ(plan.inverse.size(), c.ids.size());
  for (size_t j = 0; j < c.ids.size(); ++j) {
    const size_t want = static_cast<size_t>(
        std::find(unique.begin(), unique.end(), c.ids[j]) - unique.begin());
    ASSERT_EQ(static_cast<size_t>(plan.inverse[j]), want) << "position " << j << " of "
                                                         << c.Describe();
  }
}

template <typename T, typename K>
void CheckBackward(const Case<T, K>& c, const std::vector<T>& grads) {
  const TableView<T, K> t = c.View();
  const RefGrad<K> want = RefBackward(c, grads);

  BackwardPlan<K> plan;
  PlanBackward(t, c.nnz(), &plan);
  CheckPlan(c, plan);
  if (::testing::Test::HasFatalFailure()) return;

  // Scales from the reference, so that LookupBackward is checked on its own.
  const std::vector<double> ref_scales = RefScales(c);
  const std::vector<float> scales(ref_scales.begin(), ref_scales.end());

  const int64_t U = static_cast<int64_t>(plan.unique_ids.size()), dim = c.dim;
  ASSERT_EQ(U, static_cast<int64_t>(want.unique.size()));
  std::vector<T> rows(static_cast<size_t>(U * dim), T(-55));
  std::vector<float> acc(static_cast<size_t>(dim));
  LookupBackward(t, plan, scales.data(), grads.data(), 0, U, rows.data());
  for (int64_t u = 0; u < U; ++u) {
    ASSERT_EQ(plan.unique_ids[static_cast<size_t>(u)], want.unique[static_cast<size_t>(u)]);
    for (int64_t d = 0; d < dim; ++d) {
      const double got = static_cast<double>(rows[static_cast<size_t>(u * dim + d)]);
      const double w = want.rows[static_cast<size_t>(u)][static_cast<size_t>(d)];
      ASSERT_NEAR(got, w, 1e-4 * (1 + 2 * want.magnitude[static_cast<size_t>(u)]))
          << "unique " << u << " (id " << static_cast<int64_t>(want.unique[static_cast<size_t>(u)])
          << ") d " << d << " of " << c.Describe();
    }
  }

  // Determinism: two halves, and one id at a time in reverse order, give
  // bit-identical rows.
  std::vector<T> halves(rows.size(), T(-55));
  const int64_t mid = U / 2;
  LookupBackward(t, plan, scales.data(), grads.data(), 0, mid, halves.data());
  for (int64_t k = mid * dim; k < U * dim; ++k) {
    ASSERT_EQ(halves[static_cast<size_t>(k)], T(-55)) << "wrote outside [0, mid)";
  }
  std::vector<float> acc2(static_cast<size_t>(dim));
  LookupBackward(t, plan, scales.data(), grads.data(), mid, U, halves.data());
  // Empty vectors have null data(), which memcmp must not get even for 0 bytes.
  ASSERT_TRUE(rows.empty() ||
              std::memcmp(halves.data(), rows.data(), rows.size() * sizeof(T)) == 0)
      << c.Describe();
  std::vector<T> singles(rows.size(), T(-55));
  for (int64_t u = U - 1; u >= 0; --u) {
    LookupBackward(t, plan, scales.data(), grads.data(), u, u + 1, singles.data());
  }
  ASSERT_TRUE(rows.empty() ||
              std::memcmp(singles.data(), rows.data(), rows.size() * sizeof(T)) == 0)
      << c.Describe();

  // End to end with the header's own SampleScales: same as with the
  // reference scales up to float rounding of the scales.
  std::vector<float> own_scales(static_cast<size_t>(c.batch()));
  SampleScales(t, 0, c.batch(), own_scales.data());
  std::vector<T> rows2(rows.size());
  LookupBackward(t, plan, own_scales.data(), grads.data(), 0, U, rows2.data());
  // Scales computed inside (nullptr): bit for bit the same rows.
  std::vector<T> rows3(rows.size(), T(-55));
  LookupBackward(t, plan, nullptr, grads.data(), 0, U, rows3.data());
  ASSERT_TRUE(rows.empty() ||
              std::memcmp(rows3.data(), rows2.data(), rows.size() * sizeof(T)) == 0)
      << c.Describe();
  for (int64_t u = 0; u < U; ++u) {
    for (int64_t d = 0; d < dim; ++d) {
      ASSERT_NEAR(static_cast<double>(rows2[static_cast<size_t>(u * dim + d)]),
                  want.rows[static_cast<size_t>(u)][static_cast<size_t>(d)],
                  1e-4 * (1 + 2 * want.magnitude[static_cast<size_t>(u)]))
          << c.Describe();
    }
  }
}

template <typename T, typename K>
void CheckAll(const Case<T, K>& c, std::mt19937_64* rng) {
  CheckScales(c);
  CheckForward(c);
  if (::testing::Test::HasFatalFailure()) return;
  CheckBackward(c, RandomGrads<T>(rng, c.batch(), c.dim));
}

template <typename K>
class LookupTest : public ::testing::Test {};
using KeyTypes = ::testing::Types<int32_t, int64_t>;
TYPED_TEST_SUITE(LookupTest, KeyTypes);

TYPED_TEST(LookupTest, RandomEveryConfiguration) {
  using K = TypeParam;
  std::mt19937_64 rng(sizeof(K) * 1000 + 1);
  for (Combiner combiner : kAllCombiners) {
    for (bool weighted : {false, true}) {
      for (bool clip : {false, true}) {
        for (int trial = 0; trial < 60; ++trial) {
          const Case<float, K> c = RandomCase<float, K>(&rng, combiner, weighted, clip);
          SCOPED_TRACE(::testing::Message() << "trial " << trial);
          CheckAll(c, &rng);
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
    }
  }
}

TYPED_TEST(LookupTest, RandomDoubleParams) {
  using K = TypeParam;
  std::mt19937_64 rng(sizeof(K) * 1000 + 2);
  for (Combiner combiner : kAllCombiners) {
    for (bool weighted : {false, true}) {
      for (bool clip : {false, true}) {
        for (int trial = 0; trial < 10; ++trial) {
          const Case<double, K> c = RandomCase<double, K>(&rng, combiner, weighted, clip);
          SCOPED_TRACE(::testing::Message() << "trial " << trial);
          CheckAll(c, &rng);
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
    }
  }
}

// Whether two float vectors hold the same bits (memcmp itself may not be
// given the null data() of an empty vector).
bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// The loops compiled for a fixed width do the same arithmetic in the same
// order as the loops over a runtime width: the results agree bit for bit.
TYPED_TEST(LookupTest, FixedWidthsEqualRuntimeWidthBitForBit) {
  using K = TypeParam;
  std::mt19937_64 rng(sizeof(K) * 1000 + 3);
  int checked = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const Combiner combiner = kAllCombiners[trial % 3];
    const Case<float, K> c =
        RandomCase<float, K>(&rng, combiner, (trial / 3) % 2 == 1, (trial / 6) % 2 == 1);
    const int64_t dim = c.dim;
    bool fixed = false;
    WithRowWidth(dim, [&](auto w) { fixed = !std::is_integral<decltype(w)>::value; });
    if (!fixed) continue;
    ++checked;
    SCOPED_TRACE(c.Describe());
    const TableView<float, K> t = c.View();
    const int64_t batch = c.batch();
    std::vector<float> acc(static_cast<size_t>(dim));
    std::vector<float> fixed_out(static_cast<size_t>(batch * dim), -1.0f), runtime_out = fixed_out;
    ASSERT_EQ(LookupForward(t, 0, batch, fixed_out.data(), acc.data()), -1);
    ASSERT_EQ(LookupForwardRows(t, dim, 0, batch, runtime_out.data(), acc.data()), -1);
    ASSERT_TRUE(SameBits(fixed_out, runtime_out));

    BackwardPlan<K> plan;
    ASSERT_EQ(PlanBackward(t, c.nnz(), &plan), -1);
    const int64_t U = static_cast<int64_t>(plan.unique_ids.size());
    const std::vector<float> grads = RandomGrads<float>(&rng, batch, dim);
    std::vector<float> fixed_rows(static_cast<size_t>(U * dim), -1.0f), runtime_rows = fixed_rows;
    LookupBackward(t, plan, nullptr, grads.data(), 0, U, fixed_rows.data());
    if (U > 0) {
      LookupBackwardRows(t, dim, plan, nullptr, grads.data(), 0, U, runtime_rows.data());
    }
    ASSERT_TRUE(SameBits(fixed_rows, runtime_rows));
  }
  EXPECT_GT(checked, 100);  // the draw of widths gives fixed ones often
}

// The one-pass gradient of a whole table gives the plan's unique ids, in the
// plan's order, and the same rows bit for bit, with the slot table (left
// zeroed) and with hashing; a bad id is reported at the plan's position.
TYPED_TEST(LookupTest, SumGradientRowsEqualsPlanAndBackward) {
  using K = TypeParam;
  std::mt19937_64 rng(sizeof(K) * 1000 + 4);
  for (int trial = 0; trial < 300; ++trial) {
    const Combiner combiner = kAllCombiners[trial % 3];
    Case<float, K> c =
        RandomCase<float, K>(&rng, combiner, (trial / 3) % 2 == 1, (trial / 6) % 2 == 1);
    const bool corrupt = trial % 10 == 9 && c.nnz() > 0;
    if (corrupt) {
      c.ids[static_cast<size_t>(rng() % c.ids.size())] = static_cast<K>(c.rows + (trial % 3));
    }
    SCOPED_TRACE(c.Describe());
    const TableView<float, K> t = c.View();
    const int64_t dim = c.dim;
    const std::vector<float> grads = RandomGrads<float>(&rng, c.batch(), dim);
    BackwardPlan<K> plan;
    const int64_t want_bad = PlanBackward(t, c.nnz(), &plan);
    const int64_t U = static_cast<int64_t>(plan.unique_ids.size());
    std::vector<float> want(static_cast<size_t>(U * dim), -1.0f);
    if (want_bad < 0) LookupBackward(t, plan, nullptr, grads.data(), 0, U, want.data());
    for (bool with_slots : {true, false}) {
      SCOPED_TRACE(with_slots ? "slot table" : "hashed");
      std::vector<int32_t> slots(static_cast<size_t>(c.rows), 0);
      std::vector<K> unique;
      std::vector<float> rows(static_cast<size_t>(c.nnz() * dim) + 1, -2.0f);
      const int64_t bad = SumGradientRows(t, grads.data(), with_slots ? slots.data() : nullptr,
                                          &unique, rows.data());
      ASSERT_EQ(bad, want_bad);
      EXPECT_TRUE(std::all_of(slots.begin(), slots.end(), [](int32_t x) { return x == 0; }));
      if (want_bad >= 0) continue;
      ASSERT_EQ(unique, plan.unique_ids);
      rows.resize(want.size());
      ASSERT_TRUE(SameBits(rows, want));
    }
  }
}

// Edge cases, each under every combiner / weighting / clipping.
template <typename K>
void ForEveryConfiguration(Case<float, K> base, const std::vector<float>& weights) {
  std::mt19937_64 rng(11);
  for (Combiner combiner : kAllCombiners) {
    for (bool weighted : {false, true}) {
      for (float max_norm : {0.0f, 0.5f}) {
        Case<float, K> c = base;
        c.combiner = combiner;
        c.weights = weighted ? weights : std::vector<float>();
        c.max_norm = max_norm;
        SCOPED_TRACE(c.Describe());
        CheckAll(c, &rng);
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
}

template <typename K>
Case<float, K> SmallTable() {
  Case<float, K> c;
  c.rows = 4;
  c.dim = 3;
  c.params = {0.1f, 0.2f, 0.3f,    // norm 0.37 < 0.5
              1.0f, -2.0f, 2.0f,   // norm 3
              0.0f, 0.0f, 0.0f,    // zero row
              -0.6f, 0.8f, 0.0f};  // norm 1
  return c;
}

TYPED_TEST(LookupTest, EmptyBatch) {
  using K = TypeParam;
  Case<float, K> c = SmallTable<K>();
  ForEveryConfiguration(c, {});
}

TYPED_TEST(LookupTest, AllSamplesEmpty) {
  using K = TypeParam;
  Case<float, K> c = SmallTable<K>();
  c.splits = {0, 0, 0, 0};
  ForEveryConfiguration(c, {});
}

TYPED_TEST(LookupTest, SingleId) {
  using K = TypeParam;
  for (K id : {K(0), K(1), K(2), K(3)}) {
    Case<float, K> c = SmallTable<K>();
    c.ids = {id};
    c.splits = {0, 1};
    ForEveryConfiguration(c, {1.5f});
  }
}

TYPED_TEST(LookupTest, AllIdsEqualKeyZero) {
  using K = TypeParam;
  Case<float, K> c = SmallTable<K>();
  c.ids = {0, 0, 0, 0, 0, 0};
  c.splits = {0, 2, 2, 5, 6};
  ForEveryConfiguration(c, {0.5f, 1.0f, 2.0f, 0.25f, 1.0f, 3.0f});
  Case<float, K> d = SmallTable<K>();
  d.ids = {1, 1, 1, 1};
  d.splits = {0, 1, 4};
  ForEveryConfiguration(d, {0.5f, 1.0f, 2.0f, 0.25f});
}

TYPED_TEST(LookupTest, RepeatedIdsAndEmptySamplesBetween) {
  using K = TypeParam;
  Case<float, K> c = SmallTable<K>();
  c.ids = {3, 1, 3, 0, 2, 1, 1, 3};
  c.splits = {0, 0, 3, 3, 3, 6, 8, 8};
  ForEveryConfiguration(c, {1.0f, 0.5f, 2.0f, 0.75f, 1.25f, 3.0f, 0.1f, 1.0f});
}

TYPED_TEST(LookupTest, WeightsSummingToZeroGiveZeroRowsNotNaN) {
  using K = TypeParam;
  Case<float, K> c = SmallTable<K>();
  c.ids = {1, 3, 1, 2};
  c.splits = {0, 2, 4};
  c.weights = {1.0f, -1.0f, 0.0f, 0.0f};
  std::mt19937_64 rng(1);
  for (Combiner combiner : kAllCombiners) {
    for (float max_norm : {0.0f, 0.5f}) {
      c.combiner = combiner;
      c.max_norm = max_norm;
      SCOPED_TRACE(c.Describe());
      CheckAll(c, &rng);
      std::vector<float> out(2 * 3, -1.0f), acc(3);
      LookupForward(c.View(), 0, 2, out.data(), acc.data());
      // Sample 1 has all-zero weights: a zero row under every combiner.
      for (int d = 0; d < 3; ++d) EXPECT_EQ(out[3 + d], 0.0f);
      if (combiner == Combiner::kMean) {
        // Sample 0's weights sum to zero: mean gives a zero row.
        for (int d = 0; d < 3; ++d) EXPECT_EQ(out[d], 0.0f);
      }
    }
  }
}

TEST(LookupHandWritten, ForwardAndBackward) {
  // params rows: r0 = (1, 0), r1 = (0, 2), r2 = (3, 4).
  // sample 0: ids {0, 2} weights {1, 2}; sample 1: {}; sample 2: ids {2} weight {0.5}.
  Case<float, int64_t> c;
  c.rows = 3;
  c.dim = 2;
  c.params = {1, 0, 0, 2, 3, 4};
  c.ids = {0, 2, 2};
  c.splits = {0, 2, 2, 3};
  c.weights = {1.0f, 2.0f, 0.5f};
  c.combiner = Combiner::kMean;
  std::vector<float> out(6), acc(2);
  LookupForward(c.View(), 0, 3, out.data(), acc.data());
  // sample 0: (1*(1,0) + 2*(3,4)) / 3 = (7/3, 8/3); sample 2: 0.5*(3,4)/0.5 = (3,4).
  EXPECT_FLOAT_EQ(out[0], 7.0f / 3);
  EXPECT_FLOAT_EQ(out[1], 8.0f / 3);
  EXPECT_EQ(out[2], 0.0f);
  EXPECT_EQ(out[3], 0.0f);
  EXPECT_FLOAT_EQ(out[4], 3.0f);
  EXPECT_FLOAT_EQ(out[5], 4.0f);

  // Backward with grads g0 = (1, 1), g1 = (9, 9) (unused), g2 = (1, -1):
  // unique ids {0, 2}; row 0: 1/3 * g0 = (1/3, 1/3);
  // row 2: 2/3 * g0 + 0.5/0.5 * g2 = (5/3, -1/3).
  const std::vector<float> grads = {1, 1, 9, 9, 1, -1};
  BackwardPlan<int64_t> plan;
  PlanBackward(c.View(), 3, &plan);
  EXPECT_EQ(plan.unique_ids, (std::vector<int64_t>{0, 2}));
  std::vector<float> scales(3);
  SampleScales(c.View(), 0, 3, scales.data());
  EXPECT_FLOAT_EQ(scales[0], 1.0f / 3);
  EXPECT_EQ(scales[1], 0.0f);
  EXPECT_FLOAT_EQ(scales[2], 2.0f);
  std::vector<float> rows(4);
  LookupBackward(c.View(), plan, scales.data(), grads.data(), 0, 2, rows.data());
  EXPECT_FLOAT_EQ(rows[0], 1.0f / 3);
  EXPECT_FLOAT_EQ(rows[1], 1.0f / 3);
  EXPECT_FLOAT_EQ(rows[2], 5.0f / 3);
  EXPECT_FLOAT_EQ(rows[3], -1.0f / 3);

  // Sum combiner with max_norm 1: r2 = (3, 4) is clipped to (0.6, 0.8).
  c.combiner = Combiner::kSum;
  c.max_norm = 1.0f;
  LookupForward(c.View(), 0, 3, out.data(), acc.data());
  EXPECT_FLOAT_EQ(out[0], 1.0f + 2 * 0.6f);
  EXPECT_FLOAT_EQ(out[1], 0.0f + 2 * 0.8f);
  EXPECT_FLOAT_EQ(out[4], 0.5f * 0.6f);
  EXPECT_FLOAT_EQ(out[5], 0.5f * 0.8f);
}

// The forward pass prefetches rows of ids far ahead of the one it reads; a
// bad id there must not turn into an out-of-range address computation (the
// UBSan build checks) and the pass still stops at it.
TYPED_TEST(LookupTest, ForwardStopsAtBadIdFarAhead) {
  using K = TypeParam;
  for (const K bad : {std::numeric_limits<K>::max(), std::numeric_limits<K>::min(), K(-1),
                      K(4)}) {
    Case<float, K> c = SmallTable<K>();  // rows = 4
    for (int j = 0; j < 3 * static_cast<int>(kPrefetchDistance); ++j) c.ids.push_back(K(j % 4));
    const int64_t bad_at = static_cast<int64_t>(kPrefetchDistance) + 5;
    c.ids[static_cast<size_t>(bad_at)] = bad;
    c.splits.clear();
    for (int64_t j = 0; j <= c.nnz(); ++j) c.splits.push_back(j);  // one id per sample
    c.combiner = Combiner::kSum;
    std::vector<float> out(static_cast<size_t>(c.batch() * c.dim), -7.0f);
    std::vector<float> acc(static_cast<size_t>(c.dim));
    EXPECT_EQ(LookupForward(c.View(), 0, c.batch(), out.data(), acc.data()), bad_at);
    for (int64_t b = 0; b < bad_at; ++b) {
      for (int64_t d = 0; d < c.dim; ++d) {
        EXPECT_EQ(out[static_cast<size_t>(b * c.dim + d)],
                  c.params[static_cast<size_t>((b % 4) * c.dim + d)]);
      }
    }
  }
}

TYPED_TEST(LookupTest, FirstBadId) {
  using K = TypeParam;
  Case<float, K> c = SmallTable<K>();  // rows = 4
  c.ids = {0, 3, 1, 4, 2, -1, 0, std::numeric_limits<K>::max(), std::numeric_limits<K>::min()};
  c.splits = {0, static_cast<int64_t>(c.ids.size())};
  const TableView<float, K> t = c.View();
  const int64_t n = c.nnz();
  for (int64_t begin = 0; begin <= n; ++begin) {
    for (int64_t end = begin; end <= n; ++end) {
      int64_t want = -1;
      for (int64_t j = end - 1; j >= begin; --j) {
        const int64_t id = static_cast<int64_t>(c.ids[static_cast<size_t>(j)]);
        if (!(0 <= id && id < 4)) want = j;
      }
      EXPECT_EQ(FirstBadId(t, begin, end), want) << "[" << begin << ", " << end << ")";
    }
  }
  Case<float, K> ok = SmallTable<K>();
  ok.ids = {0, 1, 2, 3, 3, 0};
  EXPECT_EQ(FirstBadId(ok.View(), 0, 6), -1);
  EXPECT_EQ(FirstBadId(ok.View(), 0, 0), -1);

  // Random.
  std::mt19937_64 rng(6);
  for (int trial = 0; trial < 200; ++trial) {
    Case<float, K> r;
    r.rows = static_cast<int64_t>(rng() % 10);
    const int64_t nn = static_cast<int64_t>(rng() % 30);
    for (int64_t j = 0; j < nn; ++j) {
      r.ids.push_back(static_cast<K>(static_cast<int64_t>(rng() % 14) - 2));
    }
    int64_t want = -1;
    for (int64_t j = 0; j < nn && want < 0; ++j) {
      const int64_t id = static_cast<int64_t>(r.ids[static_cast<size_t>(j)]);
      if (id < 0 || id >= r.rows) want = j;
    }
    EXPECT_EQ(FirstBadId(r.View(), 0, nn), want) << "trial " << trial;
  }
}

}  // namespace
}  // namespace core
}  // namespace sok_graph
