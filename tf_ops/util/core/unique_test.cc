// Tests for tf_ops/util/core/unique.h against a std::map based reference.
#include "tf_ops/util/core/unique.h"

#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <type_traits>
#include <vector>

#include "gtest/gtest.h"

namespace sok_graph {
namespace core {
namespace {

// Obviously-correct reference: unique keys in order of first appearance,
// the index of each key in that list, and occurrence counts.
template <typename K>
struct RefUnique {
  std::vector<K> unique;
  std::vector<int64_t> inverse;
  std::vector<int64_t> counts;
};

template <typename K>
RefUnique<K> ReferenceUnique(const std::vector<K>& keys) {
  RefUnique<K> r;
  std::map<K, int64_t> seen;
  for (const K& k : keys) {
    auto it = seen.find(k);
    int64_t idx;
    if (it == seen.end()) {
      idx = static_cast<int64_t>(r.unique.size());
      seen.emplace(k, idx);
      r.unique.push_back(k);
      r.counts.push_back(0);
    } else {
      idx = it->second;
    }
    r.inverse.push_back(idx);
    ++r.counts[static_cast<size_t>(idx)];
  }
  return r;
}

template <typename KI>
class UniqueWithInverseTest : public ::testing::Test {};

template <typename K_, typename I_>
struct KI {
  using K = K_;
  using I = I_;
};

using KITypes = ::testing::Types<KI<int32_t, int32_t>, KI<int32_t, int64_t>,
                                 KI<int64_t, int32_t>, KI<int64_t, int64_t>>;
TYPED_TEST_SUITE(UniqueWithInverseTest, KITypes);

// Runs UniqueWithInverse (with and without counts) and compares every output
// with the reference.
template <typename K, typename I>
void CheckAgainstReference(const std::vector<K>& keys) {
  const RefUnique<K> ref = ReferenceUnique(keys);
  const int64_t n = static_cast<int64_t>(keys.size());

  std::vector<K> unique = {K(42), K(43)};  // must be replaced, not appended to
  std::vector<I> inverse(keys.size() + 1, I(-7));
  std::vector<I> counts = {I(99)};
  UniqueWithInverse<K, I>(keys.data(), n, &unique, inverse.data(), &counts);

  ASSERT_EQ(unique.size(), ref.unique.size());
  for (size_t u = 0; u < unique.size(); ++u) {
    EXPECT_EQ(unique[u], ref.unique[u]) << "unique[" << u << "]";
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(static_cast<int64_t>(inverse[i]), ref.inverse[i]) << "inverse[" << i << "]";
  }
  EXPECT_EQ(inverse[keys.size()], I(-7)) << "wrote past the end of inverse";
  ASSERT_EQ(counts.size(), ref.counts.size());
  for (size_t u = 0; u < counts.size(); ++u) {
    EXPECT_EQ(static_cast<int64_t>(counts[u]), ref.counts[u]) << "counts[" << u << "]";
  }

  // Same, without counts.
  std::vector<K> unique2;
  std::vector<I> inverse2(keys.size() + 1, I(-7));
  UniqueWithInverse<K, I>(keys.data(), n, &unique2, inverse2.data(), nullptr);
  EXPECT_EQ(unique2, unique);
  EXPECT_EQ(inverse2, inverse);
}

TYPED_TEST(UniqueWithInverseTest, Empty) {
  using K = typename TypeParam::K;
  using I = typename TypeParam::I;
  std::vector<K> keys;
  std::vector<K> unique = {K(1), K(2), K(3)};
  std::vector<I> counts = {I(5)};
  I dummy = I(-3);
  UniqueWithInverse<K, I>(keys.data(), 0, &unique, &dummy, &counts);
  EXPECT_TRUE(unique.empty());
  EXPECT_TRUE(counts.empty());
  EXPECT_EQ(dummy, I(-3));
  CheckAgainstReference<K, I>(keys);
}

TYPED_TEST(UniqueWithInverseTest, SingleElement) {
  using K = typename TypeParam::K;
  using I = typename TypeParam::I;
  std::vector<K> keys = {K(17)};
  std::vector<K> unique;
  I inverse = I(-1);
  std::vector<I> counts;
  UniqueWithInverse<K, I>(keys.data(), 1, &unique, &inverse, &counts);
  ASSERT_EQ(unique.size(), 1u);
  EXPECT_EQ(unique[0], K(17));
  EXPECT_EQ(inverse, I(0));
  ASSERT_EQ(counts.size(), 1u);
  EXPECT_EQ(counts[0], I(1));
}

TYPED_TEST(UniqueWithInverseTest, HandWrittenExample) {
  using K = typename TypeParam::K;
  using I = typename TypeParam::I;
  // tf.unique([1, 1, 2, 4, 4, 4, 7, 8, 8]) -> y [1 2 4 7 8], idx [0 0 1 2 2 2 3 4 4]
  std::vector<K> keys = {1, 1, 2, 4, 4, 4, 7, 8, 8};
  std::vector<K> unique;
  std::vector<I> inverse(keys.size());
  std::vector<I> counts;
  UniqueWithInverse<K, I>(keys.data(), static_cast<int64_t>(keys.size()), &unique,
                          inverse.data(), &counts);
  EXPECT_EQ(unique, (std::vector<K>{1, 2, 4, 7, 8}));
  EXPECT_EQ(inverse, (std::vector<I>{0, 0, 1, 2, 2, 2, 3, 4, 4}));
  EXPECT_EQ(counts, (std::vector<I>{2, 1, 3, 1, 2}));

  // Order is first appearance, not sorted.
  std::vector<K> keys2 = {9, 3, 9, 0, 3, 5};
  UniqueWithInverse<K, I>(keys2.data(), static_cast<int64_t>(keys2.size()), &unique,
                          inverse.data(), &counts);
  EXPECT_EQ(unique, (std::vector<K>{9, 3, 0, 5}));
  EXPECT_EQ(std::vector<I>(inverse.begin(), inverse.begin() + 6),
            (std::vector<I>{0, 1, 0, 2, 1, 3}));
  EXPECT_EQ(counts, (std::vector<I>{2, 2, 1, 1}));
}

TYPED_TEST(UniqueWithInverseTest, AllEqual) {
  using K = typename TypeParam::K;
  using I = typename TypeParam::I;
  for (K v : {K(0), K(5), K(-1), std::numeric_limits<K>::max(), std::numeric_limits<K>::min()}) {
    std::vector<K> keys(1000, v);
    std::vector<K> unique;
    std::vector<I> inverse(keys.size(), I(-1));
    std::vector<I> counts;
    UniqueWithInverse<K, I>(keys.data(), static_cast<int64_t>(keys.size()), &unique,
                            inverse.data(), &counts);
    ASSERT_EQ(unique.size(), 1u);
    EXPECT_EQ(unique[0], v);
    for (I x : inverse) ASSERT_EQ(x, I(0));
    ASSERT_EQ(counts.size(), 1u);
    EXPECT_EQ(counts[0], I(1000));
  }
}

TYPED_TEST(UniqueWithInverseTest, KeyZeroAndExtremes) {
  using K = typename TypeParam::K;
  using I = typename TypeParam::I;
  const K lo = std::numeric_limits<K>::min();
  const K hi = std::numeric_limits<K>::max();
  // Key 0 must not be confused with an empty slot (default-constructed K is 0).
  CheckAgainstReference<K, I>({0});
  CheckAgainstReference<K, I>({0, 0, 0});
  CheckAgainstReference<K, I>({1, 0, 2, 0, 1});
  CheckAgainstReference<K, I>({lo, hi, 0, -1, 1, lo, hi, lo + 1, hi - 1, 0, -1});
  CheckAgainstReference<K, I>({hi, lo});
  // Values that agree in the low bits (where the table index comes from).
  std::vector<K> keys;
  for (int r = 0; r < 3; ++r) {
    for (int s = 0; s < static_cast<int>(8 * sizeof(K)); ++s) {
      const uint64_t bit = uint64_t{1} << s;
      keys.push_back(static_cast<K>(static_cast<typename std::make_unsigned<K>::type>(bit)));
      keys.push_back(static_cast<K>(
          static_cast<typename std::make_unsigned<K>::type>(bit | 1u)));
      keys.push_back(static_cast<K>(-static_cast<int64_t>(s)));
    }
  }
  CheckAgainstReference<K, I>(keys);
}

TYPED_TEST(UniqueWithInverseTest, RandomSmallRange) {
  using K = typename TypeParam::K;
  using I = typename TypeParam::I;
  std::mt19937_64 rng(12345);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t n = static_cast<int64_t>(rng() % 300);
    const int64_t range = 1 + static_cast<int64_t>(rng() % 64);
    std::uniform_int_distribution<int64_t> key(-range / 2, range);
    std::vector<K> keys;
    for (int64_t i = 0; i < n; ++i) keys.push_back(static_cast<K>(key(rng)));
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " n " << n << " range " << range);
    CheckAgainstReference<K, I>(keys);
  }
}

TYPED_TEST(UniqueWithInverseTest, RandomFullRangeWithRepeats) {
  using K = typename TypeParam::K;
  using I = typename TypeParam::I;
  std::mt19937_64 rng(777);
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t n = static_cast<int64_t>(rng() % 5000);
    std::uniform_int_distribution<K> key(std::numeric_limits<K>::min(),
                                         std::numeric_limits<K>::max());
    std::vector<K> keys;
    for (int64_t i = 0; i < n; ++i) {
      // Half the time repeat an earlier key, so there are many duplicates.
      if (!keys.empty() && rng() % 2 == 0) {
        keys.push_back(keys[static_cast<size_t>(rng() % keys.size())]);
      } else {
        keys.push_back(key(rng));
      }
    }
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " n " << n);
    CheckAgainstReference<K, I>(keys);
  }
}

TYPED_TEST(UniqueWithInverseTest, SequentialIdsGrowTheTable) {
  using K = typename TypeParam::K;
  using I = typename TypeParam::I;
  // Many distinct keys force several rehashes; 0..n-1 then again in reverse.
  std::vector<K> keys;
  for (int i = 0; i < 20000; ++i) keys.push_back(static_cast<K>(i));
  for (int i = 19999; i >= 0; i -= 3) keys.push_back(static_cast<K>(i));
  CheckAgainstReference<K, I>(keys);
}

template <typename K>
class FirstOccurrenceIndexTest : public ::testing::Test {};
using KeyTypes = ::testing::Types<int32_t, int64_t>;
TYPED_TEST_SUITE(FirstOccurrenceIndexTest, KeyTypes);

TYPED_TEST(FirstOccurrenceIndexTest, InsertMatchesReference) {
  using K = TypeParam;
  std::mt19937_64 rng(99);
  // expected_keys both far too small (forces growth), zero, negative and exact.
  for (int64_t expected : {int64_t{-5}, int64_t{0}, int64_t{1}, int64_t{100}, int64_t{4000}}) {
    FirstOccurrenceIndex<K> index(expected);
    EXPECT_EQ(index.size(), 0);
    EXPECT_TRUE(index.keys().empty());
    std::map<K, int64_t> ref;
    std::vector<K> ref_keys;
    std::uniform_int_distribution<int64_t> key(-3000, 3000);
    for (int i = 0; i < 4000; ++i) {
      K k = static_cast<K>(key(rng));
      if (i % 97 == 0) k = 0;
      if (i % 101 == 0) k = std::numeric_limits<K>::min();
      if (i % 103 == 0) k = std::numeric_limits<K>::max();
      auto it = ref.find(k);
      int64_t want;
      if (it == ref.end()) {
        want = static_cast<int64_t>(ref_keys.size());
        ref.emplace(k, want);
        ref_keys.push_back(k);
      } else {
        want = it->second;
      }
      ASSERT_EQ(index.Insert(k), want) << "i " << i << " key " << k;
      ASSERT_EQ(index.size(), static_cast<int64_t>(ref_keys.size()));
    }
    EXPECT_EQ(index.keys(), ref_keys);
    // Inserting again changes nothing.
    for (size_t u = 0; u < ref_keys.size(); ++u) {
      ASSERT_EQ(index.Insert(ref_keys[u]), static_cast<int64_t>(u));
    }
    EXPECT_EQ(index.size(), static_cast<int64_t>(ref_keys.size()));
  }
}

TEST(MixHashTest, IsAPermutationOnSmallInputsAndNotIdentity) {
  // Not part of the contract beyond "a hash", but a constant hash or identity
  // would make the table degenerate; check it spreads sequential ids.
  std::map<uint64_t, int> low_bits;
  for (uint64_t x = 0; x < 1024; ++x) ++low_bits[MixHash(x) & 1023];
  EXPECT_GT(low_bits.size(), 500u);
  std::map<uint64_t, uint64_t> seen;
  for (uint64_t x = 0; x < 10000; ++x) {
    EXPECT_TRUE(seen.emplace(MixHash(x), x).second) << "collision at " << x;
  }
}

}  // namespace
}  // namespace core
}  // namespace sok_graph

namespace sok_graph {
namespace core {
namespace {

// UniqueWithInverseInRange: the direct-indexing variant used when ids are
// bounded by a table's rows. Same results as the reference, scratch left
// zeroed, and the first out-of-range position reported.
TYPED_TEST(UniqueWithInverseTest, InRangeMatchesReferenceAndRestoresScratch) {
  using K = typename TypeParam::K;
  using I = typename TypeParam::I;
  std::mt19937_64 rng(77);
  const int64_t range = 300;
  std::vector<int32_t> scratch(static_cast<size_t>(range), 0);
  for (int trial = 0; trial < 20; ++trial) {
    const size_t n = static_cast<size_t>(rng() % 700);
    std::vector<K> keys(n);
    for (auto& k : keys) k = static_cast<K>(rng() % range);
    if (n > 2) {
      keys[0] = 0;
      keys[n - 1] = static_cast<K>(range - 1);
    }
    const RefUnique<K> ref = ReferenceUnique(keys);
    std::vector<K> unique;
    std::vector<I> inverse(n, I(-9));
    EXPECT_EQ((UniqueWithInverseInRange<K, I>(keys.data(), static_cast<int64_t>(n), range,
                                             scratch.data(), &unique, inverse.data())),
              -1);
    EXPECT_EQ(unique, ref.unique);
    for (size_t i = 0; i < n; ++i) {
      EXPECT_EQ(static_cast<int64_t>(inverse[i]), static_cast<int64_t>(ref.inverse[i]));
    }
    for (int32_t s : scratch) ASSERT_EQ(s, 0) << "scratch must be left zeroed";
  }
}

TYPED_TEST(UniqueWithInverseTest, InRangeReportsFirstBadPosition) {
  using K = typename TypeParam::K;
  using I = typename TypeParam::I;
  std::vector<int32_t> scratch(10, 0);
  std::vector<K> unique;
  std::vector<I> inverse(6);
  const std::vector<K> too_big = {1, 2, 1, 10, 3, -1};
  EXPECT_EQ((UniqueWithInverseInRange<K, I>(too_big.data(), 6, 10, scratch.data(), &unique,
                                           inverse.data())),
            3);
  for (int32_t s : scratch) ASSERT_EQ(s, 0);
  const std::vector<K> negative = {4, -1, 20};
  EXPECT_EQ((UniqueWithInverseInRange<K, I>(negative.data(), 3, 10, scratch.data(), &unique,
                                           inverse.data())),
            1);
  for (int32_t s : scratch) ASSERT_EQ(s, 0);
}

}  // namespace
}  // namespace core
}  // namespace sok_graph
