// Tests for tf_ops/sharding/core/route_keys.h: the formulas against
// arithmetic on __int128 (no wrap, exact floor division), and the whole
// routing against a reference built from std::map and per-owner scans.
#include "tf_ops/sharding/core/route_keys.h"

#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace sok_graph {
namespace core {
namespace {

using Wide = __int128;

Wide WideFloorDiv(Wide a, Wide b) {
  Wide q = a / b;
  if (a % b != 0 && a < 0) --q;
  return q;
}

TEST(RouteKeysTest, FloorDivisionAsPython) {
  const int64_t big = std::numeric_limits<int64_t>::max();
  const int64_t small = std::numeric_limits<int64_t>::min();
  for (int64_t a : {int64_t{0}, int64_t{7}, int64_t{-7}, int64_t{-1}, int64_t{-8}, big, small}) {
    for (int64_t b : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{8}, int64_t{26}, big}) {
      const Wide q = WideFloorDiv(a, b);
      EXPECT_EQ(FloorDiv(a, b), static_cast<int64_t>(q)) << a << " // " << b;
      EXPECT_EQ(FloorMod(a, b), static_cast<int64_t>(Wide(a) - q * b)) << a << " % " << b;
    }
  }
}

TEST(RouteKeysTest, KeysWrapAndOwnersStayInRange) {
  // id * T + t in two's complement, as TensorFlow's int64 arithmetic gives it.
  EXPECT_EQ(GroupedKey(5, 2, 3), 17);
  EXPECT_EQ(GroupedKey(-1, 0, 3), -3);
  const int64_t big = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(GroupedKey(big, 1, 2), -1);  // 2^64 - 2 + 1 wraps to -1
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 2000; ++trial) {
    const int64_t key = static_cast<int64_t>(rng());
    const int64_t tables = 1 + static_cast<int64_t>(rng() % 30);
    const int64_t workers = 1 + static_cast<int64_t>(rng() % 9);
    const int64_t owner = GroupedKeyOwner(key, tables, workers, -1);
    ASSERT_GE(owner, 0);
    ASSERT_LT(owner, workers);
    // The owner's key: its local row (global row // N) and the key's table.
    const Wide row = WideFloorDiv(key, tables);
    const Wide local = WideFloorDiv(row, workers);
    const Wide table = Wide(key) - row * tables;
    EXPECT_EQ(owner, static_cast<int64_t>(Wide(row) - WideFloorDiv(row, workers) * workers));
    EXPECT_EQ(GroupedKeyOnOwner(key, tables, workers, -1),
              static_cast<int64_t>(static_cast<uint64_t>(local * tables + table)));
    EXPECT_EQ(GroupedKeyOwner(key, tables, workers, workers - 1), workers - 1);
    EXPECT_EQ(GroupedKeyOnOwner(key, tables, workers, 0), key);
  }
}

TEST(RouteKeysTest, RoutingAgainstAReference) {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t n = static_cast<int64_t>(rng() % 60);
    const int64_t tables = 1 + static_cast<int64_t>(rng() % 5);
    const int64_t workers = 1 + static_cast<int64_t>(rng() % 4);
    const int64_t fixed = rng() % 4 == 0 ? static_cast<int64_t>(rng() % workers) : -1;
    std::vector<int64_t> ids, of_table;
    for (int64_t i = 0; i < n; ++i) {
      ids.push_back(rng() % 8 == 0 ? -static_cast<int64_t>(rng() % 3) - 1
                                   : static_cast<int64_t>(rng() % 12));
      of_table.push_back(static_cast<int64_t>(rng() % tables));
    }
    std::vector<int64_t> sent(n), sizes(workers), slots(n);
    RouteGroupedKeys(ids.data(), of_table.data(), n, tables, workers, fixed, sent.data(),
                     sizes.data(), slots.data());

    // The reference: distinct keys in order of first appearance, then each
    // owner's in that order.
    std::vector<int64_t> distinct;
    std::map<int64_t, bool> seen;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t key = ids[i] * tables + of_table[i];
      if (!seen[key]) distinct.push_back(key);
      seen[key] = true;
    }
    std::vector<int64_t> want_sent, want_sizes(workers, 0);
    std::map<int64_t, int64_t> place;
    for (int64_t w = 0; w < workers; ++w) {
      for (int64_t key : distinct) {
        const int64_t row = key >= 0 ? key / tables : -((-key + tables - 1) / tables);
        const int64_t owner = fixed >= 0 ? fixed : ((row % workers) + workers) % workers;
        if (owner != w) continue;
        const int64_t local_row = row >= 0 ? row / workers : -((-row + workers - 1) / workers);
        place[key] = static_cast<int64_t>(want_sent.size());
        want_sent.push_back(fixed >= 0 ? key : local_row * tables + (key - row * tables));
        ++want_sizes[w];
      }
    }
    while (static_cast<int64_t>(want_sent.size()) < n) want_sent.push_back(-1);
    EXPECT_EQ(sent, want_sent) << "trial " << trial;
    EXPECT_EQ(sizes, want_sizes) << "trial " << trial;
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_EQ(slots[i], place[ids[i] * tables + of_table[i]]) << "trial " << trial << " id " << i;
    }
  }
}

}  // namespace
}  // namespace core
}  // namespace sok_graph
