// Tests for tf_ops/util/core/segment_sum.h against naive O(n * segments) loops.
#include "tf_ops/util/core/segment_sum.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace sok_graph {
namespace core {
namespace {

// For each segment, the positions with that segment id, in increasing order.
template <typename I>
std::vector<std::vector<int64_t>> ReferenceGroups(const std::vector<I>& ids,
                                                  int64_t num_segments) {
  std::vector<std::vector<int64_t>> groups(static_cast<size_t>(num_segments));
  for (int64_t s = 0; s < num_segments; ++s) {
    for (size_t i = 0; i < ids.size(); ++i) {
      if (static_cast<int64_t>(ids[i]) == s) groups[static_cast<size_t>(s)].push_back(
          static_cast<int64_t>(i));
    }
  }
  return groups;
}

template <typename I>
void CheckGroups(const std::vector<I>& ids, int64_t num_segments) {
  SegmentGroups g;
  // Stale contents must be overwritten.
  g.offsets = {5, 6, 7};
  g.order = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20};
  GroupBySegment(ids.data(), static_cast<int64_t>(ids.size()), num_segments, &g);
  const auto ref = ReferenceGroups(ids, num_segments);

  ASSERT_EQ(g.offsets.size(), static_cast<size_t>(num_segments + 1));
  EXPECT_EQ(g.offsets[0], 0);
  size_t kept = 0;
  for (const auto& grp : ref) kept += grp.size();
  ASSERT_EQ(g.order.size(), kept);
  EXPECT_EQ(g.offsets[static_cast<size_t>(num_segments)], static_cast<int64_t>(kept));
  for (int64_t s = 0; s < num_segments; ++s) {
    const auto& want = ref[static_cast<size_t>(s)];
    ASSERT_EQ(g.offsets[s + 1] - g.offsets[s], static_cast<int64_t>(want.size()))
        << "segment " << s;
    for (size_t k = 0; k < want.size(); ++k) {
      EXPECT_EQ(g.order[static_cast<size_t>(g.offsets[s]) + k], want[k])
          << "segment " << s << " k " << k;
    }
  }
}

TEST(GroupBySegmentTest, Empty) {
  std::vector<int32_t> ids;
  CheckGroups(ids, 0);
  CheckGroups(ids, 4);
  SegmentGroups g;
  GroupBySegment(ids.data(), 0, 3, &g);
  EXPECT_EQ(g.offsets, (std::vector<int64_t>{0, 0, 0, 0}));
  EXPECT_TRUE(g.order.empty());
}

TEST(GroupBySegmentTest, HandWritten) {
  std::vector<int64_t> ids = {2, 0, 2, -1, 1, 0, 2};
  SegmentGroups g;
  GroupBySegment(ids.data(), static_cast<int64_t>(ids.size()), 4, &g);
  EXPECT_EQ(g.offsets, (std::vector<int64_t>{0, 2, 3, 6, 6}));
  EXPECT_EQ(g.order, (std::vector<int64_t>{1, 5, 4, 0, 2, 6}));
}

TEST(GroupBySegmentTest, SingleAndAllEqualAndAllNegative) {
  CheckGroups(std::vector<int32_t>{0}, 1);
  CheckGroups(std::vector<int32_t>{3}, 5);
  CheckGroups(std::vector<int64_t>(500, 2), 3);
  CheckGroups(std::vector<int32_t>(50, -1), 3);
  CheckGroups(std::vector<int64_t>{-1, std::numeric_limits<int64_t>::min(), 0}, 1);
}

TEST(GroupBySegmentTest, Random) {
  std::mt19937_64 rng(2024);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t n = static_cast<int64_t>(rng() % 200);
    const int64_t num_segments = static_cast<int64_t>(rng() % 40);
    std::uniform_int_distribution<int64_t> seg(-3, num_segments - 1);
    std::vector<int32_t> ids32;
    std::vector<int64_t> ids64;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t s = num_segments > 0 ? seg(rng) : -1 - static_cast<int64_t>(rng() % 3);
      ids32.push_back(static_cast<int32_t>(s));
      ids64.push_back(s);
    }
    SCOPED_TRACE(::testing::Message() << "trial " << trial);
    CheckGroups(ids32, num_segments);
    CheckGroups(ids64, num_segments);
  }
}

// Sums in increasing position order with accumulator Acc, in pieces of
// kSegmentPiece positions of the segment (each summed from zero, the pieces'
// sums added in order), the association the header documents; with the same
// Acc type the result must be bit-identical.
template <typename T, typename Acc>
std::vector<T> ReferenceSums(const std::vector<T>& data, int64_t width,
                             const std::vector<int64_t>& ids, int64_t num_segments) {
  std::vector<T> out(static_cast<size_t>(num_segments * width));
  for (int64_t s = 0; s < num_segments; ++s) {
    std::vector<size_t> rows;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] == s) rows.push_back(i);
    }
    for (int64_t d = 0; d < width; ++d) {
      Acc total = Acc(0), piece = Acc(0);
      for (size_t k = 0; k < rows.size(); ++k) {
        piece += static_cast<Acc>(data[rows[k] * static_cast<size_t>(width) + d]);
        if ((k + 1) % static_cast<size_t>(kSegmentPiece) == 0 || k + 1 == rows.size()) {
          total += piece;
          piece = Acc(0);
        }
      }
      out[static_cast<size_t>(s * width + d)] = static_cast<T>(total);
    }
  }
  return out;
}

template <typename T, typename Acc>
void CheckSums(const std::vector<T>& data, int64_t width, const std::vector<int64_t>& ids,
               int64_t num_segments, std::mt19937_64* rng) {
  SegmentGroups g;
  GroupBySegment(ids.data(), static_cast<int64_t>(ids.size()), num_segments, &g);
  const std::vector<T> want = ReferenceSums<T, Acc>(data, width, ids, num_segments);

  // Whole range at once.
  std::vector<T> out(static_cast<size_t>(num_segments * width), T(-12345));
  std::vector<Acc> scratch(static_cast<size_t>(2 * width) + 1);
  SumSegments<T, Acc>(data.data(), width, g, 0, num_segments, out.data(), scratch.data());
  ASSERT_EQ(out.size(), want.size());
  for (size_t k = 0; k < out.size(); ++k) {
    ASSERT_EQ(out[k], want[k]) << "element " << k << " (segment " << k / width << ")";
  }

  // Split at a random point: a partial range writes exactly its segments.
  if (num_segments > 0) {
    const int64_t mid = static_cast<int64_t>((*rng)() % static_cast<uint64_t>(num_segments + 1));
    std::vector<T> part(out.size(), T(-12345));
    SumSegments<T, Acc>(data.data(), width, g, 0, mid, part.data(), scratch.data());
    for (int64_t k = mid * width; k < num_segments * width; ++k) {
      ASSERT_EQ(part[static_cast<size_t>(k)], T(-12345)) << "wrote outside [0, mid)";
    }
    SumSegments<T, Acc>(data.data(), width, g, mid, num_segments, part.data(), scratch.data());
    ASSERT_EQ(0, std::memcmp(part.data(), out.data(), out.size() * sizeof(T)))
        << "split at " << mid << " differs from the whole range";
  }
}

TEST(SumSegmentsTest, HandWritten) {
  // data rows: [1,2] [3,4] [5,6] [7,8]; ids 1, -1, 1, 0; three segments.
  std::vector<float> data = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<int64_t> ids = {1, -1, 1, 0};
  SegmentGroups g;
  GroupBySegment(ids.data(), 4, 3, &g);
  std::vector<float> out(6, -1.0f);
  std::vector<float> scratch(4);
  SumSegments<float, float>(data.data(), 2, g, 0, 3, out.data(), scratch.data());
  EXPECT_EQ(out, (std::vector<float>{7, 8, 6, 8, 0, 0}));
}

TEST(SumSegmentsTest, EmptyInputGivesZeroRows) {
  std::vector<float> data;
  std::vector<int64_t> ids;
  SegmentGroups g;
  GroupBySegment(ids.data(), 0, 3, &g);
  std::vector<float> out(9, 5.0f);
  std::vector<float> scratch(6);
  SumSegments<float, float>(data.data(), 3, g, 0, 3, out.data(), scratch.data());
  for (float v : out) EXPECT_EQ(v, 0.0f);
}

TEST(SumSegmentsTest, RandomFloatAndDoubleAccumulators) {
  std::mt19937_64 rng(31337);
  std::uniform_real_distribution<float> val(-10.0f, 10.0f);
  for (int trial = 0; trial < 150; ++trial) {
    const int64_t n = static_cast<int64_t>(rng() % 150);
    const int64_t width = 1 + static_cast<int64_t>(rng() % 7);
    const int64_t num_segments = static_cast<int64_t>(rng() % 30);
    std::uniform_int_distribution<int64_t> seg(-2, num_segments - 1);
    std::vector<int64_t> ids;
    for (int64_t i = 0; i < n; ++i) ids.push_back(num_segments > 0 ? seg(rng) : -1);
    std::vector<float> data;
    for (int64_t k = 0; k < n * width; ++k) data.push_back(val(rng));
    SCOPED_TRACE(::testing::Message() << "trial " << trial);
    CheckSums<float, float>(data, width, ids, num_segments, &rng);
    CheckSums<float, double>(data, width, ids, num_segments, &rng);
    std::vector<double> ddata(data.begin(), data.end());
    CheckSums<double, double>(ddata, width, ids, num_segments, &rng);
  }
}

TEST(SumSegmentsTest, IntegerSumsAreExact) {
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<int32_t> val(-1000, 1000);
  const int64_t n = 400, width = 3, num_segments = 7;
  std::vector<int64_t> ids;
  std::vector<int32_t> data;
  std::vector<int64_t> expect(static_cast<size_t>(num_segments * width), 0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = static_cast<int64_t>(rng() % 8) - 1;  // -1 .. 6
    ids.push_back(s);
    for (int64_t d = 0; d < width; ++d) {
      const int32_t v = val(rng);
      data.push_back(v);
      if (s >= 0) expect[static_cast<size_t>(s * width + d)] += v;
    }
  }
  SegmentGroups g;
  GroupBySegment(ids.data(), n, num_segments, &g);
  std::vector<int32_t> out(static_cast<size_t>(num_segments * width), 0);
  std::vector<int64_t> scratch(2 * width);
  SumSegments<int32_t, int64_t>(data.data(), width, g, 0, num_segments, out.data(),
                                scratch.data());
  for (size_t k = 0; k < out.size(); ++k) EXPECT_EQ(static_cast<int64_t>(out[k]), expect[k]);
}

TEST(SumSegmentsTest, AccumulatesInWiderTypeAndRoundsOnce) {
  // 1 + 2^-24 * 4 in float, one addend at a time, loses every small addend;
  // accumulated in double and rounded once it does not.
  const float big = 1.0f, tiny = 1.0f / (1 << 24);
  std::vector<float> data = {big, tiny, tiny, tiny, tiny};
  std::vector<int64_t> ids = {0, 0, 0, 0, 0};
  SegmentGroups g;
  GroupBySegment(ids.data(), 5, 1, &g);
  float out = 0.0f;
  double dscratch[2] = {0.0, 0.0};
  SumSegments<float, double>(data.data(), 1, g, 0, 1, &out, dscratch);
  EXPECT_EQ(out, static_cast<float>(1.0 + 4.0 / (1 << 24)));
  float fscratch[2] = {0.0f, 0.0f};
  SumSegments<float, float>(data.data(), 1, g, 0, 1, &out, fscratch);
  EXPECT_EQ(out, 1.0f);
}

TEST(SumSegmentsTest, LongSegmentsAddTheirPiecesInOrder) {
  // A hot segment of several pieces (and one a piece long, one a piece and
  // one long) next to short ones: bit-identical to the piece-wise reference,
  // and within float rounding of a double sum.
  std::mt19937_64 rng(77);
  std::uniform_real_distribution<float> val(-1.0f, 1.0f);
  const int64_t width = 3, num_segments = 6;
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 3 * kSegmentPiece + 17; ++i) ids.push_back(0);
  for (int64_t i = 0; i < kSegmentPiece; ++i) ids.push_back(2);
  for (int64_t i = 0; i < kSegmentPiece + 1; ++i) ids.push_back(3);
  for (int64_t i = 0; i < 40; ++i) ids.push_back(1 + static_cast<int64_t>(rng() % 5));
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<float> data;
  for (size_t k = 0; k < ids.size() * width; ++k) data.push_back(val(rng));
  CheckSums<float, float>(data, width, ids, num_segments, &rng);

  SegmentGroups g;
  GroupBySegment(ids.data(), static_cast<int64_t>(ids.size()), num_segments, &g);
  std::vector<float> out(static_cast<size_t>(num_segments * width));
  std::vector<float> scratch(static_cast<size_t>(2 * width));
  SumSegments<float, float>(data.data(), width, g, 0, num_segments, out.data(), scratch.data());
  for (int64_t s = 0; s < num_segments; ++s) {
    for (int64_t d = 0; d < width; ++d) {
      double exact = 0.0;
      for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] == s) exact += data[i * width + static_cast<size_t>(d)];
      }
      EXPECT_NEAR(out[static_cast<size_t>(s * width + d)], exact, 1e-3)
          << "segment " << s << " column " << d;
    }
  }
}

}  // namespace
}  // namespace core
}  // namespace sok_graph
