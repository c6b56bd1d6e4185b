// Tests for tf_ops/sharding/core/bucketize.h against naive per-worker scans.
#include "tf_ops/sharding/core/bucketize.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace sok_graph {
namespace core {
namespace {

template <typename K>
class BucketizeTest : public ::testing::Test {};
using KeyTypes = ::testing::Types<int32_t, int64_t>;
TYPED_TEST_SUITE(BucketizeTest, KeyTypes);

TYPED_TEST(BucketizeTest, FirstNegative) {
  using K = TypeParam;
  std::vector<K> none = {0, 1, 2, std::numeric_limits<K>::max()};
  EXPECT_EQ(FirstNegative(none.data(), 0), -1);
  EXPECT_EQ(FirstNegative(none.data(), 4), -1);
  std::vector<K> first = {-1, 0, -2};
  EXPECT_EQ(FirstNegative(first.data(), 3), 0);
  std::vector<K> later = {5, 0, 7, std::numeric_limits<K>::min(), -1};
  EXPECT_EQ(FirstNegative(later.data(), 5), 3);
  EXPECT_EQ(FirstNegative(later.data(), 3), -1);  // only the first n count

  std::mt19937_64 rng(1);
  for (int trial = 0; trial < 300; ++trial) {
    const int n = static_cast<int>(rng() % 40);
    std::vector<K> ids;
    for (int i = 0; i < n; ++i) {
      ids.push_back(rng() % 10 == 0 ? static_cast<K>(-1 - static_cast<int64_t>(rng() % 5))
                                    : static_cast<K>(rng() % 100));
    }
    int64_t want = -1;
    for (int i = n - 1; i >= 0; --i) {
      if (ids[static_cast<size_t>(i)] < K(0)) want = i;
    }
    EXPECT_EQ(FirstNegative(ids.data(), n), want) << "trial " << trial;
  }
}

TYPED_TEST(BucketizeTest, OwnerOf) {
  using K = TypeParam;
  EXPECT_EQ(OwnerOf(K(0), 4, -1), 0);
  EXPECT_EQ(OwnerOf(K(7), 4, -1), 3);
  EXPECT_EQ(OwnerOf(K(8), 4, -1), 0);
  EXPECT_EQ(OwnerOf(K(9), 1, -1), 0);
  EXPECT_EQ(OwnerOf(K(9), 4, 2), 2);
  EXPECT_EQ(OwnerOf(K(9), 4, 0), 0);
  const K big = std::numeric_limits<K>::max();
  // 2^31 - 1 and 2^63 - 1 both end in 7, so both are 2 mod 5.
  EXPECT_EQ(OwnerOf(big, 5, -1), 2);
  EXPECT_EQ(OwnerOf(big, 2, -1), 1);
}

struct BucketResult {
  std::vector<int64_t> permutation, inverse, sizes;
};

// Reference: worker by worker, scan the ids in order and take those it owns.
template <typename K>
BucketResult ReferenceBucketize(const std::vector<K>& ids, int64_t world, int64_t fixed) {
  BucketResult r;
  r.inverse.assign(ids.size(), -1);
  for (int64_t w = 0; w < world; ++w) {
    int64_t count = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      const int64_t owner = fixed >= 0 ? fixed : static_cast<int64_t>(ids[i]) % world;
      if (owner != w) continue;
      r.inverse[i] = static_cast<int64_t>(r.permutation.size());
      r.permutation.push_back(static_cast<int64_t>(i));
      ++count;
    }
    r.sizes.push_back(count);
  }
  return r;
}

template <typename K>
void CheckBucketize(const std::vector<K>& ids, int64_t world, int64_t fixed) {
  SCOPED_TRACE(::testing::Message() << "n " << ids.size() << " world " << world << " fixed "
                                    << fixed);
  const size_t n = ids.size();
  // One extra slot each, to catch writes past the end; garbage in sizes.
  std::vector<K> bucketed(n + 1, K(-3));
  std::vector<int64_t> sizes(static_cast<size_t>(world) + 1, 12345);
  std::vector<int64_t> permutation(n + 1, -3), inverse(n + 1, -3);
  BucketizeByOwner(ids.data(), static_cast<int64_t>(n), world, fixed, bucketed.data(),
                   sizes.data(), permutation.data(), inverse.data());
  EXPECT_EQ(bucketed[n], K(-3));
  EXPECT_EQ(sizes[static_cast<size_t>(world)], 12345);
  EXPECT_EQ(permutation[n], -3);
  EXPECT_EQ(inverse[n], -3);
  bucketed.pop_back();
  sizes.pop_back();
  permutation.pop_back();
  inverse.pop_back();

  const BucketResult want = ReferenceBucketize(ids, world, fixed);
  ASSERT_EQ(sizes, want.sizes);
  ASSERT_EQ(permutation, want.permutation);
  ASSERT_EQ(inverse, want.inverse);

  // Properties, checked directly.
  std::vector<int> hit(n, 0);
  for (size_t k = 0; k < n; ++k) {
    const int64_t p = permutation[k];
    ASSERT_GE(p, 0);
    ASSERT_LT(p, static_cast<int64_t>(n));
    ++hit[static_cast<size_t>(p)];
    EXPECT_EQ(bucketed[k], ids[static_cast<size_t>(p)]) << "k " << k;
    EXPECT_EQ(inverse[static_cast<size_t>(p)], static_cast<int64_t>(k)) << "k " << k;
  }
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(hit[i], 1) << "permutation misses or repeats " << i;
    EXPECT_EQ(permutation[static_cast<size_t>(inverse[i])], static_cast<int64_t>(i));
    // Gathering the bucketed ids with `inverse` restores the input.
    EXPECT_EQ(bucketed[static_cast<size_t>(inverse[i])], ids[i]);
  }
  // Buckets: worker w's ids occupy [start_w, start_w + sizes[w]), all owned
  // by w, in increasing input position (stable).
  int64_t start = 0;
  for (int64_t w = 0; w < world; ++w) {
    for (int64_t k = start; k < start + sizes[static_cast<size_t>(w)]; ++k) {
      const K id = bucketed[static_cast<size_t>(k)];
      const int64_t owner = fixed >= 0 ? fixed : static_cast<int64_t>(id) % world;
      EXPECT_EQ(owner, w) << "k " << k;
      if (k > start) {
        EXPECT_LT(permutation[static_cast<size_t>(k - 1)], permutation[static_cast<size_t>(k)])
            << "not stable within bucket " << w;
      }
    }
    start += sizes[static_cast<size_t>(w)];
  }
  EXPECT_EQ(start, static_cast<int64_t>(n));
}

TYPED_TEST(BucketizeTest, HandWritten) {
  using K = TypeParam;
  std::vector<K> ids = {5, 2, 8, 3, 0, 6, 7, 4};  // world 3: owners 2 2 2 0 0 0 1 1
  std::vector<K> bucketed(8);
  std::vector<int64_t> sizes(3), permutation(8), inverse(8);
  BucketizeByOwner(ids.data(), 8, 3, -1, bucketed.data(), sizes.data(), permutation.data(),
                   inverse.data());
  EXPECT_EQ(bucketed, (std::vector<K>{3, 0, 6, 7, 4, 5, 2, 8}));
  EXPECT_EQ(sizes, (std::vector<int64_t>{3, 2, 3}));
  EXPECT_EQ(permutation, (std::vector<int64_t>{3, 4, 5, 6, 7, 0, 1, 2}));
  EXPECT_EQ(inverse, (std::vector<int64_t>{5, 6, 7, 0, 1, 2, 3, 4}));
}

TYPED_TEST(BucketizeTest, EdgeCases) {
  using K = TypeParam;
  const K big = std::numeric_limits<K>::max();
  CheckBucketize<K>({}, 1, -1);
  CheckBucketize<K>({}, 4, -1);
  CheckBucketize<K>({}, 4, 2);
  CheckBucketize<K>({0}, 1, -1);
  CheckBucketize<K>({0}, 3, -1);
  CheckBucketize<K>({7}, 3, -1);
  CheckBucketize<K>(std::vector<K>(100, K(5)), 4, -1);  // all equal: one bucket
  CheckBucketize<K>(std::vector<K>(100, K(0)), 4, -1);
  CheckBucketize<K>({big, 0, big - 1, 1, big, 2, big - 2}, 3, -1);
  CheckBucketize<K>({big, 0, big - 1, 1, big, 2, big - 2}, 8, -1);
  CheckBucketize<K>({3, 1, 4, 1, 5, 9, 2, 6}, 1, -1);  // one worker: identity
  CheckBucketize<K>({3, 1, 4, 1, 5, 9, 2, 6}, 16, -1);  // more workers than ids
}

TYPED_TEST(BucketizeTest, FixedOwner) {
  using K = TypeParam;
  std::vector<K> ids = {9, 4, 4, 0, 13, 2};
  for (int64_t fixed = 0; fixed < 4; ++fixed) {
    std::vector<K> bucketed(ids.size());
    std::vector<int64_t> sizes(4, 77), permutation(ids.size()), inverse(ids.size());
    BucketizeByOwner(ids.data(), static_cast<int64_t>(ids.size()), 4, fixed, bucketed.data(),
                     sizes.data(), permutation.data(), inverse.data());
    EXPECT_EQ(bucketed, ids);
    for (int64_t w = 0; w < 4; ++w) {
      EXPECT_EQ(sizes[static_cast<size_t>(w)], w == fixed ? 6 : 0) << "fixed " << fixed;
    }
    EXPECT_EQ(permutation, (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
    EXPECT_EQ(inverse, (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
    CheckBucketize<K>(ids, 4, fixed);
  }
}

TYPED_TEST(BucketizeTest, Random) {
  using K = TypeParam;
  std::mt19937_64 rng(sizeof(K));
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t n = static_cast<int64_t>(rng() % 300);
    const int64_t world = 1 + static_cast<int64_t>(rng() % 9);
    const int64_t fixed = (rng() % 4 == 0) ? static_cast<int64_t>(rng() % world) : -1;
    const bool wide = rng() % 2 == 0;
    std::uniform_int_distribution<K> wide_dist(0, std::numeric_limits<K>::max());
    std::vector<K> ids;
    for (int64_t i = 0; i < n; ++i) {
      ids.push_back(wide ? wide_dist(rng) : static_cast<K>(rng() % 50));
    }
    SCOPED_TRACE(::testing::Message() << "trial " << trial);
    CheckBucketize(ids, world, fixed);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TYPED_TEST(BucketizeTest, LocalRows) {
  using K = TypeParam;
  std::vector<K> ids = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  std::vector<K> out(ids.size(), K(-1));
  LocalRows(ids.data(), 0, static_cast<int64_t>(ids.size()), 3, out.data());
  EXPECT_EQ(out, (std::vector<K>{0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3}));

  // World size 1 (localized tables keep their own ids).
  std::fill(out.begin(), out.end(), K(-1));
  LocalRows(ids.data(), 0, static_cast<int64_t>(ids.size()), 1, out.data());
  EXPECT_EQ(out, ids);

  // Only [begin, end) is written.
  std::fill(out.begin(), out.end(), K(-1));
  LocalRows(ids.data(), 4, 7, 2, out.data());
  EXPECT_EQ(out, (std::vector<K>{-1, -1, -1, -1, 2, 2, 3, -1, -1, -1, -1}));
  LocalRows(ids.data(), 5, 5, 2, out.data());  // empty range
  EXPECT_EQ(out, (std::vector<K>{-1, -1, -1, -1, 2, 2, 3, -1, -1, -1, -1}));

  // Random, including the largest id: local row and owner reassemble the id,
  // and the local row is the floor of id / world.
  std::mt19937_64 rng(5 + sizeof(K));
  std::uniform_int_distribution<K> dist(0, std::numeric_limits<K>::max());
  for (int trial = 0; trial < 100; ++trial) {
    const int64_t world = 1 + static_cast<int64_t>(rng() % 12);
    std::vector<K> r = {0, std::numeric_limits<K>::max(), static_cast<K>(world - 1),
                        static_cast<K>(world)};
    for (int i = 0; i < 50; ++i) r.push_back(i % 2 ? dist(rng) : static_cast<K>(rng() % 100));
    std::vector<K> local(r.size());
    LocalRows(r.data(), 0, static_cast<int64_t>(r.size()), world, local.data());
    for (size_t i = 0; i < r.size(); ++i) {
      const int64_t id = static_cast<int64_t>(r[i]);
      const int64_t row = static_cast<int64_t>(local[i]);
      const int64_t owner = OwnerOf(r[i], world, -1);
      EXPECT_GE(owner, 0);
      EXPECT_LT(owner, world);
      EXPECT_GE(row, 0);
      EXPECT_EQ(row * world + owner, id) << "id " << id << " world " << world;
      // floor: row * world <= id < (row + 1) * world, checked without overflow
      EXPECT_LT(id - row * world, world);
      EXPECT_GE(id - row * world, 0);
    }
  }
}

}  // namespace
}  // namespace core
}  // namespace sok_graph
