// Tests for tf_ops/dynamic/core/dynamic_table.h against a std::map based
// reference model: random insert / find / remove / touch sequences over keys
// chosen to collide in the index, growth from an empty index, LRU / LFU
// eviction with protected entries, and memory per key at a full table.
#include "tf_ops/dynamic/core/dynamic_table.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tf_ops/dynamic/core/initializer.h"
#include "tf_ops/util/core/unique.h"

namespace sok_graph {
namespace core {
namespace {

constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();
constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();

struct RefEntry {
  std::vector<float> row;
  int64_t timestamp;
  uint32_t frequency;
};
using RefMap = std::map<int64_t, RefEntry>;

std::vector<float> InitialRow(const TableConfig& c, int64_t key) {
  std::vector<float> row(static_cast<size_t>(c.dim));
  InitializeRow(c.initializer, key, c.dim, row.data());
  return row;
}

// A row that no initializer produces: a function of (key, version).
std::vector<float> PatternRow(int64_t key, int64_t version, int64_t dim) {
  std::vector<float> row(static_cast<size_t>(dim));
  for (int64_t d = 0; d < dim; ++d) {
    row[d] = static_cast<float>(static_cast<double>(key % 100003) + 1000.0 * version + 0.25 * d);
  }
  return row;
}

// Empty when the table matches the reference exactly: same size, every live
// key found at a distinct entry in [0, size) with the same key, row,
// timestamp and frequency; no absent key of `probe` found.
std::string Mismatch(const DynamicTable& t, const RefMap& ref, const std::vector<int64_t>& probe) {
  std::ostringstream err;
  if (t.size() != static_cast<int64_t>(ref.size())) {
    err << "size " << t.size() << " != " << ref.size();
    return err.str();
  }
  std::vector<bool> seen(static_cast<size_t>(t.size()), false);
  for (RefMap::const_iterator it = ref.begin(); it != ref.end(); ++it) {
    const int64_t key = it->first;
    const int64_t e = t.Find(key);
    if (e < 0 || e >= t.size()) {
      err << "key " << key << ": Find -> " << e;
      return err.str();
    }
    if (seen[e]) {
      err << "key " << key << ": entry " << e << " found for two keys";
      return err.str();
    }
    seen[e] = true;
    if (t.Key(e) != key) {
      err << "key " << key << ": Key(" << e << ") = " << t.Key(e);
      return err.str();
    }
    if (t.Timestamp(e) != it->second.timestamp) {
      err << "key " << key << ": timestamp " << t.Timestamp(e) << " != " << it->second.timestamp;
      return err.str();
    }
    if (t.Frequency(e) != it->second.frequency) {
      err << "key " << key << ": frequency " << t.Frequency(e) << " != " << it->second.frequency;
      return err.str();
    }
    if (std::memcmp(t.Row(e), it->second.row.data(), it->second.row.size() * sizeof(float)) != 0) {
      err << "key " << key << ": row differs (first value " << t.Row(e)[0] << " vs "
          << it->second.row[0] << ")";
      return err.str();
    }
  }
  for (int64_t key : probe) {
    if (ref.count(key) == 0 && t.Find(key) != -1) {
      err << "absent key " << key << " found at entry " << t.Find(key);
      return err.str();
    }
  }
  return "";
}

// `count` keys whose index home slot is `home` for every table of at most
// `slots` slots (their hashes agree in the low bits).
std::vector<int64_t> CollidingKeys(uint64_t home, uint64_t slots, int count, uint64_t seed) {
  std::vector<int64_t> keys;
  std::mt19937_64 rng(seed);
  while (static_cast<int>(keys.size()) < count) {
    const int64_t k = static_cast<int64_t>(rng());
    if ((MixHash(static_cast<uint64_t>(k)) & (slots - 1)) == (home & (slots - 1))) keys.push_back(k);
  }
  return keys;
}

std::vector<int64_t> SpecialKeys() {
  std::vector<int64_t> keys = {0,       1,           -1,      2,          -2,
                               kI64Min, kI64Min + 1, kI64Max, kI64Max - 1};
  // Multiples of large powers of two: equal low bits.
  for (int64_t m = -6; m <= 6; ++m) {
    if (m != 0) keys.push_back(m * (int64_t{1} << 40));
  }
  for (int64_t m = 1; m <= 6; ++m) keys.push_back(m * (int64_t{1} << 32));
  keys.push_back(int64_t{1} << 62);
  keys.push_back(-(int64_t{1} << 62));
  keys.push_back(int64_t{3} << 61);
  return keys;
}

// Special keys, four clusters of keys sharing a home slot (one at the last
// slot, so probes wrap around, and neighbours 0, 1 and mask-1 of it), and
// random keys.
std::vector<int64_t> KeyPool(int random_keys, uint64_t seed) {
  std::vector<int64_t> pool = SpecialKeys();
  const uint64_t slots = 4096;
  const uint64_t homes[] = {slots - 1, 0, 1, slots - 2};
  for (int h = 0; h < 4; ++h) {
    std::vector<int64_t> c = CollidingKeys(homes[h], slots, 14, seed + h);
    pool.insert(pool.end(), c.begin(), c.end());
  }
  std::mt19937_64 rng(seed * 31 + 7);
  for (int i = 0; i < random_keys; ++i) pool.push_back(static_cast<int64_t>(rng()));
  std::sort(pool.begin(), pool.end());
  pool.erase(std::unique(pool.begin(), pool.end()), pool.end());
  std::shuffle(pool.begin(), pool.end(), rng);
  return pool;
}

TableConfig Config(int64_t dim, int64_t init_capacity, int64_t max_rows, Eviction eviction) {
  TableConfig c;
  c.dim = dim;
  c.init_capacity = init_capacity;
  c.max_rows = max_rows;
  c.eviction = eviction;
  c.initializer.kind = InitKind::kUniform;
  c.initializer.minval = -1.0f;
  c.initializer.maxval = 1.0f;
  c.initializer.seed = 17;
  return c;
}

TEST(DynamicTableTest, CollidingKeysReallyCollide) {
  // The clusters share their home slot in tables of up to 4096 slots.
  const std::vector<int64_t> c = CollidingKeys(4095, 4096, 14, 3);
  for (int64_t k : c) EXPECT_EQ(MixHash(static_cast<uint64_t>(k)) & 4095, 4095u);
  EXPECT_EQ(std::set<int64_t>(c.begin(), c.end()).size(), c.size());
}

TEST(DynamicTableTest, EmptyTable) {
  for (int64_t cap : {0, 1, 100}) {
    DynamicTable t(Config(4, cap, 0, Eviction::kLru));
    EXPECT_EQ(t.size(), 0);
    EXPECT_EQ(t.dim(), 4);
    EXPECT_EQ(t.evicted_total(), 0);
    for (int64_t k : SpecialKeys()) EXPECT_EQ(t.Find(k), -1) << k;
    EXPECT_FALSE(t.Remove(0));
    EXPECT_FALSE(t.Remove(kI64Min));
  }
}

TEST(DynamicTableTest, RowLimit) {
  // A copy: gtest takes its arguments by reference, which would odr-use the
  // static member (no out-of-line definition before C++17).
  const int64_t max_entries = DynamicTable::kMaxEntries;
  EXPECT_EQ(DynamicTable(Config(1, 0, 0, Eviction::kLru)).row_limit(), max_entries);
  EXPECT_EQ(DynamicTable(Config(1, 0, 10, Eviction::kLru)).row_limit(), 10);
  EXPECT_EQ(DynamicTable(Config(1, 0, 1, Eviction::kLfu)).row_limit(), 1);
  EXPECT_EQ(max_entries, 1073741823);
}

TEST(DynamicTableTest, TickIsStrictlyIncreasing) {
  DynamicTable t(Config(1, 0, 0, Eviction::kLru));
  EXPECT_EQ(t.Tick(100), 100);
  EXPECT_EQ(t.Tick(50), 101);   // clock went back
  EXPECT_EQ(t.Tick(101), 102);  // same as the last time
  EXPECT_EQ(t.Tick(102), 103);
  EXPECT_EQ(t.Tick(1000), 1000);
  EXPECT_EQ(t.Tick(1000), 1001);
  EXPECT_EQ(t.Tick(-5), 1002);
}

TEST(DynamicTableTest, InsertTouchAndMetadata) {
  const TableConfig c = Config(3, 0, 0, Eviction::kLru);
  DynamicTable t(c);
  ASSERT_EQ(t.MakeRoom(2, 10), 0);
  const int64_t a = t.Insert(-7, 10, true);
  const int64_t b = t.Insert(9, 11, false);
  EXPECT_EQ(a, 0);
  EXPECT_EQ(b, 1);
  EXPECT_EQ(t.Frequency(a), 1u);
  EXPECT_EQ(t.Frequency(b), 0u);
  EXPECT_EQ(t.Timestamp(a), 10);
  EXPECT_EQ(t.Timestamp(b), 11);
  const std::vector<float> ra = InitialRow(c, -7);
  EXPECT_EQ(std::memcmp(t.Row(a), ra.data(), 3 * sizeof(float)), 0);

  t.Touch(a, 20, false);
  EXPECT_EQ(t.Timestamp(a), 20);
  EXPECT_EQ(t.Frequency(a), 1u);
  t.Touch(a, 21, true);
  t.Touch(a, 22, true);
  EXPECT_EQ(t.Timestamp(a), 22);
  EXPECT_EQ(t.Frequency(a), 3u);

  // Frequencies saturate instead of wrapping to 0.
  const uint32_t top = std::numeric_limits<uint32_t>::max();
  t.SetMetadata(b, 5, top - 1);
  t.Touch(b, 30, true);
  EXPECT_EQ(t.Frequency(b), top);
  t.Touch(b, 31, true);
  EXPECT_EQ(t.Frequency(b), top);
  EXPECT_EQ(t.Timestamp(b), 31);

  // InsertUninitialized leaves the row to the caller; InitializeEntry fills it.
  ASSERT_EQ(t.MakeRoom(1, 40), 0);
  const int64_t u = t.InsertUninitialized(kI64Min, 40, true);
  EXPECT_EQ(u, 2);
  EXPECT_EQ(t.Key(u), kI64Min);
  EXPECT_EQ(t.Frequency(u), 1u);
  EXPECT_EQ(t.Timestamp(u), 40);
  t.InitializeEntry(u);
  const std::vector<float> ru = InitialRow(c, kI64Min);
  EXPECT_EQ(std::memcmp(t.Row(u), ru.data(), 3 * sizeof(float)), 0);
}

TEST(DynamicTableTest, MakeRoomHandsBackEvictedKeysAndRows) {
  DynamicTable t(Config(2, 0, 3, Eviction::kLru));
  ASSERT_EQ(t.MakeRoom(3, 1), 0);
  const int64_t keys[] = {10, 20, 30};
  for (int i = 0; i < 3; ++i) {
    const int64_t e = t.Insert(keys[i], 1 + i, true);  // 10 is the least recently used
    t.MutableRow(e)[0] = static_cast<float>(keys[i]);
    t.MutableRow(e)[1] = -static_cast<float>(keys[i]);
  }
  t.Touch(t.Find(10), 5, true);  // now 20 is, then 30
  std::vector<int64_t> evicted_keys;
  std::vector<float> evicted_rows;
  ASSERT_EQ(t.MakeRoom(2, 6, &evicted_keys, &evicted_rows), 2);
  std::vector<std::pair<int64_t, std::vector<float>>> got;
  for (size_t i = 0; i < evicted_keys.size(); ++i) {
    got.push_back({evicted_keys[i], {evicted_rows[2 * i], evicted_rows[2 * i + 1]}});
  }
  std::sort(got.begin(), got.end());
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].first, 20);
  EXPECT_EQ(got[0].second, (std::vector<float>{20.0f, -20.0f}));
  EXPECT_EQ(got[1].first, 30);
  EXPECT_EQ(got[1].second, (std::vector<float>{30.0f, -30.0f}));
  EXPECT_GE(t.Find(10), 0);
  EXPECT_LT(t.Find(20), 0);
}

TEST(DynamicTableTest, ClearEmptiesAndTableStaysUsable) {
  const TableConfig c = Config(2, 0, 0, Eviction::kLru);
  DynamicTable t(c);
  const std::vector<int64_t> pool = KeyPool(50, 9);
  ASSERT_EQ(t.MakeRoom(static_cast<int64_t>(pool.size()), 1), 0);
  for (int64_t k : pool) t.Insert(k, 1, true);
  ASSERT_EQ(t.size(), static_cast<int64_t>(pool.size()));
  t.Clear();
  EXPECT_EQ(t.size(), 0);
  for (int64_t k : pool) EXPECT_EQ(t.Find(k), -1) << k;
  RefMap ref;
  for (size_t i = 0; i < pool.size(); i += 2) {
    ASSERT_EQ(t.MakeRoom(1, 2), 0);
    t.Insert(pool[i], 2, false);
    ref[pool[i]] = RefEntry{InitialRow(c, pool[i]), 2, 0};
  }
  EXPECT_EQ(Mismatch(t, ref, pool), "");
}

// Random operation sequences, checked against the reference after every step.
class DynamicTableRandomTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(DynamicTableRandomTest, MatchesReferenceModel) {
  const int64_t init_capacity = GetParam();
  const int64_t dim = 3;
  const TableConfig c = Config(dim, init_capacity, 0, Eviction::kLru);
  DynamicTable t(c);
  RefMap ref;
  const std::vector<int64_t> pool = KeyPool(40, 100 + static_cast<uint64_t>(init_capacity));
  std::mt19937_64 rng(12345 + static_cast<uint64_t>(init_capacity));
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  auto random_live = [&]() {
    RefMap::iterator it = ref.begin();
    std::advance(it, pick(ref.size()));
    return it->first;
  };
  int64_t wall = 1000;
  int64_t version = 0;
  int64_t inserts = 0, removes = 0;
  const int steps = 12000;
  for (int step = 0; step < steps; ++step) {
    wall += static_cast<int64_t>(pick(5)) - 1;
    const int64_t now = t.Tick(wall);
    const size_t op = pick(100);
    // Phases: grow to most of the pool, then shrink, and again.
    const bool growing = (step / 1500) % 2 == 0;
    if (op < (growing ? 45u : 20u)) {
      const int64_t key = pool[pick(pool.size())];
      if (ref.count(key) == 0) {
        ASSERT_EQ(t.MakeRoom(1, now), 0);
        const bool accessed = rng() & 1;
        if (rng() & 1) {
          const int64_t e = t.Insert(key, now, accessed);
          ASSERT_EQ(e, static_cast<int64_t>(ref.size()));  // entries are dense
          ref[key] = RefEntry{InitialRow(c, key), now, accessed ? 1u : 0u};
        } else {
          const int64_t e = t.InsertUninitialized(key, now, accessed);
          ASSERT_EQ(e, static_cast<int64_t>(ref.size()));
          const std::vector<float> row = PatternRow(key, ++version, dim);
          std::memcpy(t.MutableRow(e), row.data(), row.size() * sizeof(float));
          ref[key] = RefEntry{row, now, accessed ? 1u : 0u};
        }
        ++inserts;
      }
    } else if (op < 65) {
      const int64_t key = pool[pick(pool.size())];
      const bool present = ref.erase(key) > 0;
      ASSERT_EQ(t.Remove(key), present) << "step " << step << " key " << key;
      if (present) ++removes;
    } else if (op < 75 && !ref.empty()) {
      const int64_t key = random_live();
      const bool accessed = rng() & 1;
      t.Touch(t.Find(key), now, accessed);
      ref[key].timestamp = now;
      if (accessed) ++ref[key].frequency;
    } else if (op < 85 && !ref.empty()) {
      const int64_t key = random_live();
      const std::vector<float> row = PatternRow(key, ++version, dim);
      std::memcpy(t.MutableRow(t.Find(key)), row.data(), row.size() * sizeof(float));
      ref[key].row = row;
    } else if (op < 90 && !ref.empty()) {
      const int64_t key = random_live();
      const int64_t ts = static_cast<int64_t>(rng());
      const uint32_t freq = static_cast<uint32_t>(rng());
      t.SetMetadata(t.Find(key), ts, freq);
      ref[key].timestamp = ts;
      ref[key].frequency = freq;
    } else if (op < 93 && !ref.empty()) {
      // A burst of removals of live keys.
      for (int i = 0; i < 8 && !ref.empty(); ++i) {
        const int64_t key = random_live();
        ref.erase(key);
        ASSERT_TRUE(t.Remove(key));
        ++removes;
      }
    } else {
      const int64_t key = pool[pick(pool.size())];
      const int64_t e = t.Find(key);
      ASSERT_EQ(e >= 0, ref.count(key) > 0) << "step " << step << " key " << key;
    }
    ASSERT_EQ(Mismatch(t, ref, pool), "") << "step " << step << " op " << op;
  }
  // The sequence did what it was meant to.
  EXPECT_GT(inserts, 1500);
  EXPECT_GT(removes, 1500);
}

INSTANTIATE_TEST_SUITE_P(InitCapacities, DynamicTableRandomTest, ::testing::Values(0, 5, 1000));

TEST(DynamicTableTest, BackwardShiftDeletionInCollisionClusters) {
  // Keys of one home slot at the end of the index (probes wrap to slot 0)
  // next to keys whose home is slots 0 and 1: remove them in many orders.
  const int64_t dim = 2;
  const TableConfig c = Config(dim, 0, 0, Eviction::kLru);
  std::vector<int64_t> keys;
  const uint64_t homes[] = {4095, 0, 1, 4094};
  for (int h = 0; h < 4; ++h) {
    std::vector<int64_t> k = CollidingKeys(homes[h], 4096, 6, 50 + h);
    keys.insert(keys.end(), k.begin(), k.end());
  }
  keys.push_back(0);  // MixHash(0) == 0: home slot 0 too
  std::mt19937_64 rng(77);
  for (int round = 0; round < 60; ++round) {
    DynamicTable t(c);
    RefMap ref;
    std::vector<int64_t> order = keys;
    std::shuffle(order.begin(), order.end(), rng);
    // Room for every key up front: the index keeps one size (64 slots), so
    // the clusters pile into each other.
    ASSERT_EQ(t.MakeRoom(static_cast<int64_t>(order.size()), 1), 0);
    for (int64_t k : order) {
      t.InsertUninitialized(k, 1, false);
      const std::vector<float> row = PatternRow(k, round, dim);
      std::memcpy(t.MutableRow(t.Find(k)), row.data(), row.size() * sizeof(float));
      ref[k] = RefEntry{row, 1, 0};
    }
    ASSERT_EQ(Mismatch(t, ref, keys), "");
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t i = 0; i < order.size(); ++i) {
      ASSERT_TRUE(t.Remove(order[i])) << order[i];
      ref.erase(order[i]);
      ASSERT_EQ(Mismatch(t, ref, keys), "") << "round " << round << " removal " << i;
      ASSERT_FALSE(t.Remove(order[i]));
      // Re-insert some removed keys, so deletions and insertions interleave.
      if (rng() % 3 == 0 && i + 1 < order.size()) {
        ASSERT_EQ(t.MakeRoom(1, 2), 0);
        t.Insert(order[i], 2, true);
        ref[order[i]] = RefEntry{InitialRow(c, order[i]), 2, 1};
        ASSERT_EQ(Mismatch(t, ref, keys), "");
        ASSERT_TRUE(t.Remove(order[i]));
        ref.erase(order[i]);
      }
    }
    EXPECT_EQ(t.size(), 0);
  }
}

TEST(DynamicTableTest, IndexSurvivesGrowthFromEmpty) {
  const int64_t dim = 2;
  const TableConfig c = Config(dim, 0, 0, Eviction::kLru);
  DynamicTable t(c);
  std::vector<int64_t> keys = SpecialKeys();
  for (int64_t m = 1; m < 3000; ++m) keys.push_back(m << 44);  // low 44 bits all zero
  std::mt19937_64 rng(2);
  while (keys.size() < 150000) keys.push_back(static_cast<int64_t>(rng()));
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  std::shuffle(keys.begin(), keys.end(), rng);

  auto check_prefix = [&](size_t n) {
    ASSERT_EQ(t.size(), static_cast<int64_t>(n));
    for (size_t i = 0; i < n; ++i) {
      const int64_t e = t.Find(keys[i]);
      ASSERT_GE(e, 0) << "key " << keys[i] << " after " << n << " inserts";
      ASSERT_EQ(t.Key(e), keys[i]);
      ASSERT_EQ(t.Row(e)[0], static_cast<float>(i));
      ASSERT_EQ(t.Row(e)[1], -static_cast<float>(i % 1000));
    }
    for (size_t i = n; i < std::min(keys.size(), n + 1000); ++i) {
      ASSERT_EQ(t.Find(keys[i]), -1) << keys[i];
    }
  };
  // Inserted in batches of varying sizes (MakeRoom for each batch), with a
  // full check whenever the size crosses a power of two.
  size_t i = 0;
  size_t next_check = 1;
  while (i < keys.size()) {
    const size_t batch = std::min<size_t>(keys.size() - i, 1 + rng() % 300);
    ASSERT_EQ(t.MakeRoom(static_cast<int64_t>(batch), 5), 0);
    for (size_t j = 0; j < batch; ++j, ++i) {
      const int64_t e = t.InsertUninitialized(keys[i], 5, true);
      t.MutableRow(e)[0] = static_cast<float>(i);
      t.MutableRow(e)[1] = -static_cast<float>(i % 1000);
    }
    if (i >= next_check) {
      check_prefix(i);
      if (HasFatalFailure()) return;
      while (next_check <= i) next_check *= 2;
    }
  }
  check_prefix(keys.size());
  if (HasFatalFailure()) return;

  // Remove every other key, then check all.
  for (size_t k = 0; k < keys.size(); k += 2) ASSERT_TRUE(t.Remove(keys[k]));
  ASSERT_EQ(t.size(), static_cast<int64_t>(keys.size() / 2));
  for (size_t k = 0; k < keys.size(); ++k) {
    const int64_t e = t.Find(keys[k]);
    if (k % 2 == 0) {
      ASSERT_EQ(e, -1) << keys[k];
    } else {
      ASSERT_GE(e, 0) << keys[k];
      ASSERT_EQ(t.Key(e), keys[k]);
      ASSERT_EQ(t.Row(e)[0], static_cast<float>(k));
    }
  }
}

// ---------------------------------------------------------------- eviction

// Reference MakeRoom: evicts the `excess` smallest entries by (timestamp,
// key) for LRU or (frequency, timestamp, key) for LFU among those whose
// timestamp is not `now`; -1 (and no change) if there are too few.
int64_t RefMakeRoom(RefMap* ref, int64_t limit, int64_t incoming, int64_t now, Eviction ev) {
  const int64_t excess = static_cast<int64_t>(ref->size()) + incoming - limit;
  if (excess <= 0) return 0;
  std::vector<std::tuple<uint64_t, int64_t, int64_t>> candidates;
  for (RefMap::const_iterator it = ref->begin(); it != ref->end(); ++it) {
    if (it->second.timestamp == now) continue;
    candidates.push_back(std::make_tuple(
        ev == Eviction::kLfu ? static_cast<uint64_t>(it->second.frequency) : uint64_t{0},
        it->second.timestamp, it->first));
  }
  if (static_cast<int64_t>(candidates.size()) < excess) return -1;
  std::sort(candidates.begin(), candidates.end());
  for (int64_t i = 0; i < excess; ++i) ref->erase(std::get<2>(candidates[i]));
  return excess;
}

std::set<int64_t> KeysOf(const DynamicTable& t) {
  std::set<int64_t> keys;
  for (int64_t e = 0; e < t.size(); ++e) keys.insert(t.Key(e));
  return keys;
}

// Adds `key` with the given metadata (room must have been made).
void Put(DynamicTable* t, int64_t key, int64_t ts, uint32_t freq) {
  const int64_t e = t->InsertUninitialized(key, ts, false);
  t->SetMetadata(e, ts, freq);
}

TEST(EvictionTest, LruEvictsOldestThenSmallestKey) {
  DynamicTable t(Config(1, 0, 5, Eviction::kLru));
  ASSERT_EQ(t.MakeRoom(5, 1), 0);
  Put(&t, 10, 100, 9);
  Put(&t, 20, 50, 1);
  Put(&t, 30, 50, 1);
  Put(&t, -5, 200, 0);
  Put(&t, 7, 50, 100);
  EXPECT_EQ(t.MakeRoom(0, 300), 0);
  EXPECT_EQ(t.size(), 5);
  EXPECT_EQ(t.MakeRoom(2, 300), 2);
  EXPECT_EQ(KeysOf(t), (std::set<int64_t>{10, 30, -5}));
  EXPECT_EQ(t.evicted_total(), 2);
  EXPECT_EQ(t.Find(7), -1);
  EXPECT_EQ(t.Find(20), -1);
}

TEST(EvictionTest, LfuEvictsLeastFrequentThenOldestThenSmallestKey) {
  DynamicTable t(Config(1, 0, 5, Eviction::kLfu));
  ASSERT_EQ(t.MakeRoom(5, 1), 0);
  Put(&t, 10, 100, 9);
  Put(&t, 20, 50, 1);
  Put(&t, 30, 50, 1);
  Put(&t, -5, 200, 0);
  Put(&t, 7, 50, 100);
  EXPECT_EQ(t.MakeRoom(2, 300), 2);
  EXPECT_EQ(KeysOf(t), (std::set<int64_t>{10, 30, 7}));
  EXPECT_EQ(t.MakeRoom(3, 301), 1);  // 3 + 3 - 5
  EXPECT_EQ(KeysOf(t), (std::set<int64_t>{10, 7}));
  EXPECT_EQ(t.evicted_total(), 3);
  // Saturated frequencies compare as the largest.
  DynamicTable u(Config(1, 0, 3, Eviction::kLfu));
  ASSERT_EQ(u.MakeRoom(3, 1), 0);
  Put(&u, 1, 1, std::numeric_limits<uint32_t>::max());
  Put(&u, 2, 5, std::numeric_limits<uint32_t>::max() - 1);
  Put(&u, 3, 9, 0x80000000u);
  EXPECT_EQ(u.MakeRoom(2, 10), 2);
  EXPECT_EQ(KeysOf(u), (std::set<int64_t>{1}));
}

TEST(EvictionTest, TiesBrokenBySignedKey) {
  for (Eviction ev : {Eviction::kLru, Eviction::kLfu}) {
    DynamicTable t(Config(1, 0, 5, ev));
    ASSERT_EQ(t.MakeRoom(5, 1), 0);
    Put(&t, kI64Max, 7, 2);
    Put(&t, 0, 7, 2);
    Put(&t, kI64Min, 7, 2);
    Put(&t, -1, 7, 2);
    Put(&t, 1, 7, 2);
    EXPECT_EQ(t.MakeRoom(3, 8), 3);
    EXPECT_EQ(KeysOf(t), (std::set<int64_t>{1, kI64Max}));
  }
}

TEST(EvictionTest, EntriesUsedNowAreProtected) {
  for (Eviction ev : {Eviction::kLru, Eviction::kLfu}) {
    DynamicTable t(Config(2, 0, 4, ev));
    const int64_t now = t.Tick(1000);
    ASSERT_EQ(t.MakeRoom(4, now), 0);
    Put(&t, 1, now, 0);
    Put(&t, 2, 10, 60);
    Put(&t, 3, now, 0);
    Put(&t, 4, 5, 50);  // the oldest and the least frequent
    EXPECT_EQ(t.MakeRoom(1, now), 1);
    EXPECT_EQ(KeysOf(t), (std::set<int64_t>{1, 2, 3}));
    t.Insert(5, now, true);
    // 1, 3, 5 are protected: two incoming keys need two victims, only 2 is one.
    EXPECT_EQ(t.MakeRoom(2, now), -1);
    EXPECT_EQ(KeysOf(t), (std::set<int64_t>{1, 2, 3, 5}));
    EXPECT_EQ(t.evicted_total(), 1);
    EXPECT_EQ(t.MakeRoom(1, now), 1);
    EXPECT_EQ(KeysOf(t), (std::set<int64_t>{1, 3, 5}));
    EXPECT_EQ(t.evicted_total(), 2);
    EXPECT_EQ(t.MakeRoom(1, now), 0);  // there is room already
    t.Insert(6, now, true);
    EXPECT_EQ(t.MakeRoom(1, now), -1);  // all four used now
    EXPECT_EQ(t.size(), 4);
    // A touch at `now` protects, whatever the old timestamp.
    const int64_t later = t.Tick(0);
    t.Touch(t.Find(1), later, false);
    t.Touch(t.Find(5), later, true);
    t.Touch(t.Find(6), later, true);
    EXPECT_EQ(t.MakeRoom(1, later), 1);
    EXPECT_EQ(KeysOf(t), (std::set<int64_t>{1, 5, 6}));
    EXPECT_EQ(t.evicted_total(), 3);
  }
}

TEST(EvictionTest, MoreIncomingThanTheLimit) {
  DynamicTable t(Config(1, 0, 3, Eviction::kLru));
  EXPECT_EQ(t.MakeRoom(4, 1), -1);
  EXPECT_EQ(t.MakeRoom(3, 1), 0);
  Put(&t, 1, 0, 0);
  EXPECT_EQ(t.MakeRoom(4, 1), -1);
  EXPECT_EQ(t.size(), 1);
  EXPECT_EQ(t.MakeRoom(3, 1), 1);
  EXPECT_EQ(t.size(), 0);
  EXPECT_EQ(t.evicted_total(), 1);
}

struct EvictionParam {
  Eviction eviction;
  int64_t limit;
  int64_t init_capacity;
};

class EvictionRandomTest : public ::testing::TestWithParam<EvictionParam> {};

TEST_P(EvictionRandomTest, MatchesReferenceModel) {
  const EvictionParam p = GetParam();
  const int64_t dim = 2;
  const TableConfig c = Config(dim, p.init_capacity, p.limit, p.eviction);
  DynamicTable t(c);
  RefMap ref;
  const std::vector<int64_t> pool = KeyPool(60, 500 + static_cast<uint64_t>(p.limit));
  std::mt19937_64 rng(99 + static_cast<uint64_t>(p.limit) * 3 +
                      (p.eviction == Eviction::kLfu ? 1 : 0));
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  int64_t wall = 0;
  int64_t expected_total = 0;
  int failures = 0, evictions = 0;
  for (int round = 0; round < 2500; ++round) {
    wall += static_cast<int64_t>(pick(4)) - 1;
    const int64_t now = t.Tick(wall);
    // Metadata with many ties (small timestamp and frequency ranges), and
    // some entries marked as used now.
    const size_t ops = pick(static_cast<size_t>(p.limit + 3));
    for (size_t i = 0; i < ops && !ref.empty(); ++i) {
      RefMap::iterator it = ref.begin();
      std::advance(it, pick(ref.size()));
      const size_t kind = pick(4);
      if (kind == 0) {
        const int64_t ts = static_cast<int64_t>(pick(3));
        const uint32_t freq = static_cast<uint32_t>(pick(3));
        t.SetMetadata(t.Find(it->first), ts, freq);
        it->second.timestamp = ts;
        it->second.frequency = freq;
      } else {
        const bool accessed = kind != 1;
        t.Touch(t.Find(it->first), now, accessed);
        it->second.timestamp = now;
        if (accessed) ++it->second.frequency;
      }
    }
    if (pick(10) == 0 && !ref.empty()) {
      RefMap::iterator it = ref.begin();
      std::advance(it, pick(ref.size()));
      ASSERT_TRUE(t.Remove(it->first));
      ref.erase(it);
    }
    // Incoming keys: absent ones from the pool.
    std::vector<int64_t> incoming;
    const size_t want = pick(static_cast<size_t>(p.limit / 2 + 3));
    for (size_t tries = 0; tries < 4 * want + 4 && incoming.size() < want; ++tries) {
      const int64_t k = pool[pick(pool.size())];
      if (ref.count(k) == 0 &&
          std::find(incoming.begin(), incoming.end(), k) == incoming.end()) {
        incoming.push_back(k);
      }
    }
    const int64_t m = static_cast<int64_t>(incoming.size());
    RefMap expected = ref;
    const int64_t want_evicted = RefMakeRoom(&expected, p.limit, m, now, p.eviction);
    const int64_t got = t.MakeRoom(m, now);
    ASSERT_EQ(got, want_evicted) << "round " << round;
    if (got < 0) {
      ++failures;
      ASSERT_EQ(Mismatch(t, ref, pool), "") << "round " << round << " (failed MakeRoom)";
    } else {
      if (got > 0) ++evictions;
      expected_total += got;
      ref.swap(expected);
      for (int64_t k : incoming) {
        const bool accessed = rng() & 1;
        t.Insert(k, now, accessed);
        ref[k] = RefEntry{InitialRow(c, k), now, accessed ? 1u : 0u};
      }
      ASSERT_LE(t.size(), p.limit);
      ASSERT_EQ(Mismatch(t, ref, pool), "") << "round " << round;
    }
    ASSERT_EQ(t.evicted_total(), expected_total);
  }
  // The sequence exercised both outcomes.
  EXPECT_GT(evictions, 200);
  EXPECT_GT(failures, 20);
  std::printf("limit %lld: %d rounds evicted, %d could not make room\n",
              static_cast<long long>(p.limit), evictions, failures);
}

INSTANTIATE_TEST_SUITE_P(
    Policies, EvictionRandomTest,
    ::testing::Values(EvictionParam{Eviction::kLru, 16, 0}, EvictionParam{Eviction::kLfu, 16, 0},
                      EvictionParam{Eviction::kLru, 40, 40}, EvictionParam{Eviction::kLfu, 40, 3},
                      EvictionParam{Eviction::kLru, 1, 0}, EvictionParam{Eviction::kLfu, 2, 0}));

// ------------------------------------------------------------------ memory

TEST(MemoryTest, BytesPerKeyAtAFullBoundedTable) {
  const int64_t limit = int64_t{1} << 16;
  const int64_t dim = 16;
  const int64_t budget = dim * 4 + 32;  // the project's per-key budget
  for (int64_t init_capacity : {int64_t{0}, limit}) {
    DynamicTable t(Config(dim, init_capacity, limit, Eviction::kLru));
    int64_t key = 0;
    std::mt19937_64 rng(4);
    while (t.size() < limit) {
      const int64_t batch = std::min<int64_t>(limit - t.size(), 1 + rng() % 1000);
      const int64_t now = t.Tick(0);
      ASSERT_EQ(t.MakeRoom(batch, now), 0);
      for (int64_t i = 0; i < batch; ++i) t.Insert(key++ * 7 - 3, now, true);
    }
    ASSERT_EQ(t.size(), limit);
    const int64_t full_bytes = t.memory_bytes();
    const double per_key = static_cast<double>(full_bytes) / t.size();
    std::printf("memory_bytes at a full table (max_rows %lld, dim %lld, init_capacity %lld): "
                "%lld bytes, %.2f bytes/key (budget %lld)\n",
                static_cast<long long>(limit), static_cast<long long>(dim),
                static_cast<long long>(init_capacity), static_cast<long long>(full_bytes),
                per_key, static_cast<long long>(budget));
    RecordProperty("bytes_per_key", std::to_string(per_key));
    EXPECT_LE(full_bytes, budget * t.size());
    // What must be held: row, key (8), timestamp (8), frequency (4) and at
    // least two index slots of 4 bytes (index at most half full).
    EXPECT_GE(full_bytes, (dim * 4 + 8 + 8 + 4 + 8) * t.size());
    // Replacing keys through eviction does not grow the table.
    for (int round = 0; round < 20; ++round) {
      const int64_t now = t.Tick(0);
      ASSERT_EQ(t.MakeRoom(500, now), 500);
      for (int64_t i = 0; i < 500; ++i) t.Insert(key++ * 7 - 3, now, true);
    }
    EXPECT_EQ(t.size(), limit);
    EXPECT_EQ(t.memory_bytes(), full_bytes);
    EXPECT_EQ(t.evicted_total(), 20 * 500);
  }
}

}  // namespace
}  // namespace core
}  // namespace sok_graph
