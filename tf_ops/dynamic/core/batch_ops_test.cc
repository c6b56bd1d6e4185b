// Tests for tf_ops/dynamic/core/batch_ops.h: every batch operation against a
// serial std::map reference, with the serial runner and with runners that
// split the work into uneven sub-ranges called in shuffled order (the results
// must be identical).
#include "tf_ops/dynamic/core/batch_ops.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tf_ops/dynamic/core/dynamic_table.h"
#include "tf_ops/dynamic/core/initializer.h"
#include "tf_ops/util/core/unique.h"

namespace sok_graph {
namespace core {
namespace {

constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();
constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();

// ----------------------------------------------------------------- runners

using RangeFn = std::function<void(int64_t, int64_t)>;

// kind 0: SerialRunner; 1, 2: [0, total) cut at random points into uneven
// sub-ranges, called in shuffled order; 3: one unit at a time, last first.
ParallelRunner MakeRunner(int kind) {
  if (kind == 0) return SerialRunner();
  if (kind == 3) {
    return [](int64_t total, int64_t, const RangeFn& fn) {
      for (int64_t i = total - 1; i >= 0; --i) fn(i, i + 1);
    };
  }
  std::shared_ptr<std::mt19937_64> rng = std::make_shared<std::mt19937_64>(1000 * kind + 7);
  return [rng](int64_t total, int64_t, const RangeFn& fn) {
    if (total <= 0) return;
    std::vector<int64_t> cuts = {0, total};
    const int extra = static_cast<int>((*rng)() % 8);
    for (int i = 0; i < extra; ++i) {
      cuts.push_back(static_cast<int64_t>((*rng)() % static_cast<uint64_t>(total)));
    }
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    std::vector<std::pair<int64_t, int64_t>> ranges;
    for (size_t i = 0; i + 1 < cuts.size(); ++i) ranges.push_back(std::make_pair(cuts[i], cuts[i + 1]));
    std::shuffle(ranges.begin(), ranges.end(), *rng);
    for (size_t i = 0; i < ranges.size(); ++i) fn(ranges[i].first, ranges[i].second);
  };
}

const int kRunnerKinds[] = {0, 1, 2, 3};

TEST(TestRunnerTest, CoversEveryUnitOnceInSeveralChunks) {
  for (int kind : kRunnerKinds) {
    ParallelRunner run = MakeRunner(kind);
    int multi_chunk_calls = 0;
    for (int64_t total : {0, 1, 2, 5, 16, 100}) {
      for (int rep = 0; rep < 10; ++rep) {
        std::vector<int> hits(static_cast<size_t>(total), 0);
        int chunks = 0;
        run(total, 1, [&](int64_t b, int64_t e) {
          ASSERT_LE(0, b);
          ASSERT_LT(b, e);
          ASSERT_LE(e, total);
          ++chunks;
          for (int64_t i = b; i < e; ++i) ++hits[i];
        });
        for (int h : hits) EXPECT_EQ(h, 1);
        if (chunks > 1) ++multi_chunk_calls;
      }
    }
    if (kind != 0) {
      EXPECT_GT(multi_chunk_calls, 20) << kind;
    }
  }
}

// --------------------------------------------------------------- reference

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

// The serial meaning of a batch on a table: keys of the batch already present
// are used at `now` (and so never evicted); then the oldest (LRU) or least
// used (LFU) others are evicted to make room for the distinct new keys; then
// keys are processed one after another.
struct RefTable {
  TableConfig config;
  RefMap map;
  int64_t evicted_total = 0;

  int64_t limit() const { return config.max_rows > 0 ? config.max_rows : kI64Max; }

  int64_t MakeRoom(int64_t incoming, int64_t now) {
    const int64_t excess = static_cast<int64_t>(map.size()) + incoming - limit();
    if (excess <= 0) return 0;
    std::vector<std::tuple<uint64_t, int64_t, int64_t>> candidates;
    for (RefMap::const_iterator it = map.begin(); it != map.end(); ++it) {
      if (it->second.timestamp == now) continue;
      candidates.push_back(std::make_tuple(
          config.eviction == Eviction::kLfu ? static_cast<uint64_t>(it->second.frequency)
                                            : uint64_t{0},
          it->second.timestamp, it->first));
    }
    if (static_cast<int64_t>(candidates.size()) < excess) return -1;
    std::sort(candidates.begin(), candidates.end());
    for (int64_t i = 0; i < excess; ++i) map.erase(std::get<2>(candidates[i]));
    evicted_total += excess;
    return excess;
  }

  // Returns the number evicted, or -1 (then nothing is inserted).
  int64_t Ensure(const std::vector<int64_t>& keys, int64_t now, bool accessed) {
    std::vector<int64_t> fresh;
    for (int64_t k : keys) {
      RefMap::iterator it = map.find(k);
      if (it != map.end()) {
        it->second.timestamp = now;
        if (accessed) ++it->second.frequency;
      } else if (std::find(fresh.begin(), fresh.end(), k) == fresh.end()) {
        fresh.push_back(k);
      }
    }
    if (fresh.empty()) return 0;
    const int64_t evicted = MakeRoom(static_cast<int64_t>(fresh.size()), now);
    if (evicted < 0) return -1;
    // Fresh keys in input order: the first occurrence inserts, repeats use.
    std::set<int64_t> inserted;
    for (int64_t k : keys) {
      if (std::find(fresh.begin(), fresh.end(), k) == fresh.end()) continue;
      if (inserted.insert(k).second) {
        map[k] = RefEntry{InitialRow(config, k), now, accessed ? 1u : 0u};
      } else if (accessed) {
        ++map[k].frequency;
      }
    }
    return evicted;
  }
};

// Empty when the table holds exactly the reference's entries.
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
    if (e < 0 || e >= t.size() || seen[e] || t.Key(e) != key) {
      err << "key " << key << ": bad entry " << e;
      return err.str();
    }
    seen[e] = true;
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
      err << "absent key " << key << " found";
      return err.str();
    }
  }
  return "";
}

// Everything in a table, in entry order.
struct Snapshot {
  std::vector<int64_t> keys;
  std::vector<int64_t> timestamps;
  std::vector<uint32_t> frequencies;
  std::vector<float> rows;
};

Snapshot Snap(const DynamicTable& t) {
  Snapshot s;
  for (int64_t e = 0; e < t.size(); ++e) {
    s.keys.push_back(t.Key(e));
    s.timestamps.push_back(t.Timestamp(e));
    s.frequencies.push_back(t.Frequency(e));
    s.rows.insert(s.rows.end(), t.Row(e), t.Row(e) + t.dim());
  }
  return s;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

bool operator==(const Snapshot& a, const Snapshot& b) {
  return a.keys == b.keys && a.timestamps == b.timestamps && a.frequencies == b.frequencies &&
         SameBits(a.rows, b.rows);
}

TableConfig Config(int64_t dim, int64_t max_rows, Eviction eviction) {
  TableConfig c;
  c.dim = dim;
  c.max_rows = max_rows;
  c.eviction = eviction;
  c.initializer.kind = InitKind::kNormal;
  c.initializer.mean = 0.5f;
  c.initializer.stddev = 2.0f;
  c.initializer.seed = 31;
  return c;
}

TableConfig ConstantConfig(int64_t dim, float value) {
  TableConfig c = Config(dim, 0, Eviction::kLru);
  c.initializer.kind = InitKind::kConstant;
  c.initializer.value = value;
  return c;
}

int64_t Freq(const DynamicTable& t, int64_t key) { return t.Find(key) < 0 ? -1 : t.Frequency(t.Find(key)); }
int64_t Ts(const DynamicTable& t, int64_t key) { return t.Find(key) < 0 ? -1 : t.Timestamp(t.Find(key)); }
std::vector<float> RowOf(const DynamicTable& t, int64_t key) {
  const int64_t e = t.Find(key);
  if (e < 0) return std::vector<float>();
  return std::vector<float>(t.Row(e), t.Row(e) + t.dim());
}

// Distinct keys of a table, each once, or a message.
std::string ExportMismatch(const DynamicTable& t, const RefMap& ref, int64_t limit,
                           int64_t updated_after) {
  std::ostringstream err;
  std::set<int64_t> got;
  std::vector<int64_t> chunk;
  int64_t offset = 0;
  int chunks = 0;
  while (offset < t.size()) {
    const int64_t next = ExportEntries(t, offset, limit, updated_after, &chunk);
    if (++chunks > t.size() + 2) return "no progress";
    if (next <= offset || next > t.size()) {
      err << "offset " << offset << " -> " << next;
      return err.str();
    }
    if (static_cast<int64_t>(chunk.size()) > limit) return "chunk over the limit";
    if (static_cast<int64_t>(chunk.size()) < limit && next != t.size()) {
      return "short chunk before the end";
    }
    for (size_t i = 0; i < chunk.size(); ++i) {
      const int64_t e = chunk[i];
      if (e < offset || e >= next || (i > 0 && e <= chunk[i - 1])) {
        err << "entry " << e << " outside [" << offset << ", " << next << ") or out of order";
        return err.str();
      }
      if (t.Timestamp(e) <= updated_after) {
        err << "entry " << e << " has timestamp " << t.Timestamp(e) << " <= " << updated_after;
        return err.str();
      }
      if (!got.insert(t.Key(e)).second) {
        err << "key " << t.Key(e) << " exported twice";
        return err.str();
      }
    }
    offset = next;
  }
  std::set<int64_t> want;
  for (RefMap::const_iterator it = ref.begin(); it != ref.end(); ++it) {
    if (it->second.timestamp > updated_after) want.insert(it->first);
  }
  if (got != want) {
    err << "exported " << got.size() << " keys, want " << want.size();
    return err.str();
  }
  return "";
}

// ------------------------------------------------------- directed, per runner

class BatchOpsTest : public ::testing::TestWithParam<int> {
 protected:
  ParallelRunner run_ = MakeRunner(GetParam());
};

TEST_P(BatchOpsTest, FindOrInsertInsertsRepeatedNewKeysOnce) {
  const TableConfig c = Config(3, 0, Eviction::kLru);
  DynamicTable t(c);
  std::string error;
  const std::vector<int64_t> keys = {5, 5, 5, -3, 7, -3, kI64Min, 0, 0, kI64Max};
  const int64_t n = static_cast<int64_t>(keys.size());
  std::vector<float> out(static_cast<size_t>(n * 3), -99.0f);
  const int64_t now = t.Tick(100);
  ASSERT_EQ(FindOrInsertBatch(t, keys.data(), n, now, out.data(), run_, &error), 0) << error;
  EXPECT_EQ(t.size(), 6);
  std::set<int64_t> entry_keys;
  for (int64_t e = 0; e < t.size(); ++e) entry_keys.insert(t.Key(e));
  EXPECT_EQ(entry_keys, (std::set<int64_t>{5, -3, 7, kI64Min, 0, kI64Max}));
  // Frequencies count every occurrence; timestamps are `now`.
  EXPECT_EQ(Freq(t, 5), 3);
  EXPECT_EQ(Freq(t, -3), 2);
  EXPECT_EQ(Freq(t, 7), 1);
  EXPECT_EQ(Freq(t, kI64Min), 1);
  EXPECT_EQ(Freq(t, 0), 2);
  EXPECT_EQ(Freq(t, kI64Max), 1);
  for (int64_t k : keys) EXPECT_EQ(Ts(t, k), now);
  for (int64_t i = 0; i < n; ++i) {
    const std::vector<float> want = InitialRow(c, keys[i]);
    EXPECT_TRUE(SameBits(std::vector<float>(out.begin() + i * 3, out.begin() + i * 3 + 3), want))
        << "position " << i;
    EXPECT_TRUE(SameBits(RowOf(t, keys[i]), want)) << keys[i];
  }

  // Second batch: existing keys gain every occurrence, new keys start afresh.
  const std::vector<int64_t> keys2 = {7, 8, 7, 8, 8, 5, 7};
  std::vector<float> out2(keys2.size() * 3);
  const int64_t now2 = t.Tick(50);  // clock went back: still later
  ASSERT_EQ(now2, 101);
  ASSERT_EQ(FindOrInsertBatch(t, keys2.data(), 7, now2, out2.data(), run_, &error), 0);
  EXPECT_EQ(t.size(), 7);
  EXPECT_EQ(Freq(t, 7), 4);
  EXPECT_EQ(Freq(t, 8), 3);
  EXPECT_EQ(Freq(t, 5), 4);
  EXPECT_EQ(Freq(t, -3), 2);
  EXPECT_EQ(Ts(t, 7), now2);
  EXPECT_EQ(Ts(t, 8), now2);
  EXPECT_EQ(Ts(t, -3), now);
  for (size_t i = 0; i < keys2.size(); ++i) {
    EXPECT_TRUE(SameBits(std::vector<float>(out2.begin() + i * 3, out2.begin() + i * 3 + 3),
                         InitialRow(c, keys2[i])));
  }
}

// New keys are inserted from the free slot their find ended at. With the
// index near three quarters full and no growth during the batch, many new
// keys end at the same free slots, and repeats of a new key find the entry
// its first occurrence added there.
TEST_P(BatchOpsTest, FindOrInsertIntoACrowdedIndex) {
  TableConfig c = Config(2, 0, Eviction::kLru);
  c.init_capacity = 3000;  // index of 4096 slots: holds 3072 keys without growing
  DynamicTable t(c);
  std::string error;
  // 1700 keys, then 1000 new ones (1334 positions with their repeats:
  // the room made for them) fill it to 3034 of 3072.
  std::vector<int64_t> old_keys(1700);
  for (size_t i = 0; i < old_keys.size(); ++i) old_keys[i] = static_cast<int64_t>(i) * 7919 + 3;
  std::vector<float> out(old_keys.size() * 2);
  ASSERT_EQ(FindOrInsertBatch(t, old_keys.data(), 1700, t.Tick(1), out.data(), run_, &error), 0);
  const uint64_t slots = t.index_slots();
  std::vector<int64_t> batch;
  for (int64_t i = 0; i < 1000; ++i) {
    batch.push_back(-(i * 104729) - 1);                       // new
    if (i % 3 == 0) batch.push_back(-(i * 104729) - 1);       // its repeat
    if (i % 5 == 0) batch.push_back(old_keys[i]);             // an existing key
  }
  const int64_t n = static_cast<int64_t>(batch.size());
  out.assign(static_cast<size_t>(n) * 2, -1.0f);
  ASSERT_EQ(FindOrInsertBatch(t, batch.data(), n, t.Tick(2), out.data(), run_, &error), 0);
  EXPECT_EQ(t.index_slots(), slots) << "the index grew: the case is not the one meant";
  EXPECT_EQ(t.size(), 2700);
  std::set<int64_t> seen;
  for (int64_t e = 0; e < t.size(); ++e) {
    EXPECT_TRUE(seen.insert(t.Key(e)).second) << "key " << t.Key(e) << " twice";
    EXPECT_EQ(t.Find(t.Key(e)), e);
  }
  for (int64_t i = 0; i < 1000; ++i) {
    const int64_t key = -(i * 104729) - 1;
    EXPECT_EQ(Freq(t, key), i % 3 == 0 ? 2 : 1) << key;
    EXPECT_TRUE(SameBits(RowOf(t, key), InitialRow(c, key))) << key;
  }
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_TRUE(SameBits(std::vector<float>(out.begin() + i * 2, out.begin() + i * 2 + 2),
                         RowOf(t, batch[static_cast<size_t>(i)])))
        << "position " << i;
  }
}

TEST_P(BatchOpsTest, FindOrInsertOnlyRepeatsOfOneNewKey) {
  const TableConfig c = Config(2, 0, Eviction::kLfu);
  DynamicTable t(c);
  std::string error;
  const std::vector<int64_t> keys(50, -17);
  std::vector<float> out(100);
  ASSERT_EQ(FindOrInsertBatch(t, keys.data(), 50, t.Tick(1), out.data(), run_, &error), 0);
  EXPECT_EQ(t.size(), 1);
  EXPECT_EQ(Freq(t, -17), 50);
  EXPECT_TRUE(t.Remove(-17));
  EXPECT_EQ(t.size(), 0);
  EXPECT_EQ(t.Find(-17), -1);
}

TEST_P(BatchOpsTest, FindBatchDoesNotInsertOrTouch) {
  const TableConfig c = Config(2, 0, Eviction::kLru);
  DynamicTable t(c);
  std::string error;
  const std::vector<int64_t> present = {1, -1, kI64Min, int64_t{1} << 50};
  std::vector<float> scratch(present.size() * 2);
  ASSERT_EQ(FindOrInsertBatch(t, present.data(), 4, t.Tick(10), scratch.data(), run_, &error), 0);
  const Snapshot before = Snap(t);
  const std::vector<int64_t> keys = {1, 2, kI64Min, kI64Max, 1, 0, int64_t{1} << 50, 2};
  const int64_t n = static_cast<int64_t>(keys.size());
  const float default_row[2] = {-42.5f, 3.25f};
  std::vector<float> out(static_cast<size_t>(2 * n), 7.0f);
  bool found[8];
  std::memset(found, 0, sizeof(found));
  FindBatch(t, keys.data(), n, default_row, out.data(), found, run_);
  const bool want_found[8] = {true, false, true, false, true, false, true, false};
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(found[i], want_found[i]) << i;
    const std::vector<float> want =
        want_found[i] ? InitialRow(c, keys[i]) : std::vector<float>(default_row, default_row + 2);
    EXPECT_TRUE(SameBits(std::vector<float>(out.begin() + 2 * i, out.begin() + 2 * i + 2), want))
        << i;
  }
  EXPECT_TRUE(Snap(t) == before);
  EXPECT_EQ(t.size(), 4);
  // On an empty table every key is missing.
  DynamicTable empty(c);
  FindBatch(empty, keys.data(), n, default_row, out.data(), found, run_);
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_FALSE(found[i]);
    EXPECT_EQ(out[2 * i], -42.5f);
    EXPECT_EQ(out[2 * i + 1], 3.25f);
  }
  EXPECT_EQ(empty.size(), 0);
}

TEST_P(BatchOpsTest, ScatterAppliesRepeatedKeysInInputOrder) {
  // Rows start at 1 (constant initializer), so expected values are by hand.
  const std::vector<int64_t> keys = {4, 4, 9, 4};
  const std::vector<float> rows = {1, 2, 10, 20, 5, 5, 100, 200};
  struct Case {
    ScatterMode mode;
    float k4[2];
    float k9[2];
  };
  const Case cases[] = {
      {ScatterMode::kAdd, {1 + 1 + 10 + 100, 1 + 2 + 20 + 200}, {6, 6}},
      {ScatterMode::kSub, {1 - 1 - 10 - 100, 1 - 2 - 20 - 200}, {-4, -4}},
      {ScatterMode::kUpdate, {100, 200}, {5, 5}},  // the last occurrence wins
  };
  for (const Case& cs : cases) {
    DynamicTable t(ConstantConfig(2, 1.0f));
    std::string error;
    // Key 9 exists (inserted by an earlier batch), key 4 is new.
    const int64_t k9 = 9;
    std::vector<float> tmp(2);
    ASSERT_EQ(FindOrInsertBatch(t, &k9, 1, t.Tick(5), tmp.data(), run_, &error), 0);
    const int64_t now = t.Tick(6);
    ASSERT_EQ(ScatterBatch(t, keys.data(), 4, rows.data(), cs.mode, now, run_, &error), 0);
    EXPECT_EQ(t.size(), 2);
    EXPECT_EQ(RowOf(t, 4), (std::vector<float>{cs.k4[0], cs.k4[1]}));
    EXPECT_EQ(RowOf(t, 9), (std::vector<float>{cs.k9[0], cs.k9[1]}));
    // Updates are not uses: new keys start at 0, existing keep their count.
    EXPECT_EQ(Freq(t, 4), 0);
    EXPECT_EQ(Freq(t, 9), 1);
    EXPECT_EQ(Ts(t, 4), now);
    EXPECT_EQ(Ts(t, 9), now);
  }
}

TEST_P(BatchOpsTest, ScatterAddSumsInInputOrder) {
  // Float addition is not associative: 0 + 1e8 + 1 - 1e8 is 0 in input
  // order and 1 in some other orders (1e8 - 1e8 + 1). Many repeats of each key, spread over
  // the batch, so a runner chunk never holds all of them.
  DynamicTable t(ConstantConfig(1, 0.0f));
  std::string error;
  std::vector<int64_t> keys;
  std::vector<float> rows;
  const int64_t kKeys = 40;
  for (int rep = 0; rep < 3; ++rep) {
    for (int64_t k = 0; k < kKeys; ++k) {
      keys.push_back(k * 1000003);
      rows.push_back(rep == 0 ? 1e8f : (rep == 1 ? 1.0f : -1e8f));
    }
  }
  // An update in the middle, then more adds, for key 0 only.
  keys.push_back(0);
  rows.push_back(0.5f);
  for (int mode = 0; mode < 2; ++mode) {
    DynamicTable u(ConstantConfig(1, 0.0f));
    const int64_t now = u.Tick(1);
    const int64_t n = static_cast<int64_t>(keys.size());
    ASSERT_EQ(ScatterBatch(u, keys.data(), n, rows.data(),
                           mode == 0 ? ScatterMode::kAdd : ScatterMode::kSub, now, run_, &error),
              0);
    ASSERT_EQ(u.size(), kKeys);
    for (int64_t k = 1; k < kKeys; ++k) EXPECT_EQ(RowOf(u, k * 1000003)[0], 0.0f) << k;
    EXPECT_EQ(RowOf(u, 0)[0], mode == 0 ? 0.5f : -0.5f);
  }
  // Update then add in one batch: the add applies after the update.
  const std::vector<int64_t> k2 = {3, 3, 3};
  const std::vector<float> r2 = {10, 20, 30};
  ASSERT_EQ(ScatterBatch(t, k2.data(), 3, r2.data(), ScatterMode::kUpdate, t.Tick(2), run_, &error), 0);
  EXPECT_EQ(RowOf(t, 3)[0], 30.0f);
  ASSERT_EQ(ScatterBatch(t, k2.data(), 3, r2.data(), ScatterMode::kAdd, t.Tick(3), run_, &error), 0);
  EXPECT_EQ(RowOf(t, 3)[0], 90.0f);
}

TEST_P(BatchOpsTest, ScatterInsertsMissingKeysWithInitialRows) {
  const TableConfig c = Config(3, 0, Eviction::kLru);
  DynamicTable t(c);
  std::string error;
  const std::vector<int64_t> keys = {kI64Max, 11, kI64Max};
  const std::vector<float> rows = {1, 2, 3, 4, 5, 6, 0.5f, 0.25f, 0.125f};
  ASSERT_EQ(ScatterBatch(t, keys.data(), 3, rows.data(), ScatterMode::kAdd, t.Tick(9), run_, &error),
            0);
  EXPECT_EQ(t.size(), 2);
  const std::vector<float> init_max = InitialRow(c, kI64Max);
  const std::vector<float> init_11 = InitialRow(c, 11);
  std::vector<float> want_max(3), want_11(3);
  for (int d = 0; d < 3; ++d) {
    want_max[d] = init_max[d];
    want_max[d] += rows[d];
    want_max[d] += rows[6 + d];
    want_11[d] = init_11[d] + rows[3 + d];
  }
  EXPECT_TRUE(SameBits(RowOf(t, kI64Max), want_max));
  EXPECT_TRUE(SameBits(RowOf(t, 11), want_11));
}

TEST_P(BatchOpsTest, ImportOverwritesRowsAndRestoresMetadata) {
  const TableConfig c = Config(2, 0, Eviction::kLru);
  DynamicTable t(c);
  std::string error;
  const std::vector<int64_t> first = {1, 2, 3};
  std::vector<float> tmp(6);
  ASSERT_EQ(FindOrInsertBatch(t, first.data(), 3, t.Tick(1000), tmp.data(), run_, &error), 0);
  // Existing 2 and 3, new -8 and kI64Min; 3 twice (the last wins).
  const std::vector<int64_t> keys = {2, -8, 3, kI64Min, 3};
  const std::vector<float> rows = {1, 1, 2, 2, 3, 3, 4, 4, 5, 5};
  const std::vector<int64_t> ts = {10, 20, 30, 40, 50};
  const std::vector<uint32_t> freq = {7, 0, 9, 4294967295u, 11};
  const int64_t now = t.Tick(2000);
  ASSERT_EQ(ImportBatch(t, keys.data(), 5, rows.data(), ts.data(), freq.data(), now, run_, &error),
            0);
  EXPECT_EQ(t.size(), 5);
  EXPECT_EQ(RowOf(t, 2), (std::vector<float>{1, 1}));
  EXPECT_EQ(RowOf(t, -8), (std::vector<float>{2, 2}));
  EXPECT_EQ(RowOf(t, 3), (std::vector<float>{5, 5}));
  EXPECT_EQ(RowOf(t, kI64Min), (std::vector<float>{4, 4}));
  EXPECT_TRUE(SameBits(RowOf(t, 1), InitialRow(c, 1)));
  EXPECT_EQ(Ts(t, 2), 10);
  EXPECT_EQ(Ts(t, -8), 20);
  EXPECT_EQ(Ts(t, 3), 50);
  EXPECT_EQ(Ts(t, kI64Min), 40);
  EXPECT_EQ(Ts(t, 1), 1000);
  EXPECT_EQ(Freq(t, 2), 7);
  EXPECT_EQ(Freq(t, -8), 0);
  EXPECT_EQ(Freq(t, 3), 11);
  EXPECT_EQ(Freq(t, kI64Min), 4294967295LL);
  EXPECT_EQ(Freq(t, 1), 1);

  // Without metadata: written now; a held key keeps its use count (a write
  // is no use), a new key has none.
  const std::vector<int64_t> keys2 = {1, 99};
  const std::vector<float> rows2 = {-1, -2, -3, -4};
  const int64_t now2 = t.Tick(0);
  ASSERT_EQ(ImportBatch(t, keys2.data(), 2, rows2.data(), nullptr, nullptr, now2, run_, &error), 0);
  EXPECT_EQ(RowOf(t, 1), (std::vector<float>{-1, -2}));
  EXPECT_EQ(RowOf(t, 99), (std::vector<float>{-3, -4}));
  EXPECT_EQ(Ts(t, 1), now2);
  EXPECT_EQ(Ts(t, 99), now2);
  EXPECT_EQ(Freq(t, 1), 1);
  EXPECT_EQ(Freq(t, 99), 0);
  EXPECT_EQ(t.size(), 6);
}

TEST_P(BatchOpsTest, ImportedTimestampsMoveTheClockPastThem) {
  // Rows imported with timestamps later than the clock (a dump from a
  // machine whose clock ran ahead): the next call is later than all of
  // them, so LRU evicts an imported row before one used after the import.
  const TableConfig c = Config(2, 3, Eviction::kLru);
  DynamicTable t(c);
  std::string error;
  const std::vector<int64_t> keys = {1, 2};
  const std::vector<float> rows = {1, 1, 2, 2};
  const std::vector<int64_t> ts = {5000, 9000};
  ASSERT_EQ(ImportBatch(t, keys.data(), 2, rows.data(), ts.data(), nullptr, t.Tick(100), run_,
                        &error),
            0);
  EXPECT_EQ(t.now(), 9000);
  std::vector<float> tmp(2);
  const int64_t three = 3;
  ASSERT_EQ(FindOrInsertBatch(t, &three, 1, t.Tick(200), tmp.data(), run_, &error), 0);
  EXPECT_EQ(Ts(t, 3), 9001);
  // Full: a fourth key evicts the least recently used, 1 (5000), not 3.
  const int64_t four = 4;
  std::vector<int64_t> evicted;
  ASSERT_EQ(FindOrInsertBatch(t, &four, 1, t.Tick(300), tmp.data(), run_, &error, &evicted), 1);
  EXPECT_EQ(evicted, (std::vector<int64_t>{1}));
  // A replacing import (a restore) moves the clock the same way.
  const int64_t five = 5;
  const int64_t later = 20000;
  ASSERT_EQ(ReplaceBatch(t, &five, 1, rows.data(), &later, nullptr, t.Tick(400), run_, &error),
            0);
  EXPECT_EQ(t.Tick(500), later + 1);
}

TEST_P(BatchOpsTest, ScatterAndImportReportTheKeysTheyEvict) {
  // A full table of 3 (1 used first): a write of a held key evicts nothing,
  // a write of a new key evicts the oldest, and both name what they evict.
  const TableConfig c = Config(2, 3, Eviction::kLru);
  DynamicTable t(c);
  std::string error;
  std::vector<float> tmp(2);
  for (int64_t k = 1; k <= 3; ++k) {
    ASSERT_EQ(FindOrInsertBatch(t, &k, 1, t.Tick(10 * k), tmp.data(), run_, &error), 0);
  }
  const std::vector<float> row = {1, 1};
  std::vector<int64_t> evicted;
  const int64_t held = 3, fresh = 9, other = 7;
  ASSERT_EQ(ScatterBatch(t, &held, 1, row.data(), ScatterMode::kAdd, t.Tick(40), run_, &error,
                         &evicted),
            0);
  EXPECT_TRUE(evicted.empty());
  ASSERT_EQ(ScatterBatch(t, &fresh, 1, row.data(), ScatterMode::kAdd, t.Tick(50), run_, &error,
                         &evicted),
            1);
  EXPECT_EQ(evicted, (std::vector<int64_t>{1}));
  evicted.clear();
  ASSERT_EQ(ImportBatch(t, &other, 1, row.data(), nullptr, nullptr, t.Tick(60), run_, &error,
                        &evicted),
            1);
  EXPECT_EQ(evicted, (std::vector<int64_t>{2}));
  EXPECT_EQ(t.size(), 3);
}

TEST_P(BatchOpsTest, ReplaceHoldsExactlyTheRowsOrLeavesTheTableUnchanged) {
  const TableConfig c = Config(2, 4, Eviction::kLru);
  DynamicTable t(c);
  std::string error;
  const std::vector<int64_t> old_keys = {1, 2, 3};
  std::vector<float> tmp(6);
  ASSERT_EQ(FindOrInsertBatch(t, old_keys.data(), 3, t.Tick(10), tmp.data(), run_, &error), 0);
  const Snapshot before = Snap(t);

  // Five distinct keys do not fit in four rows: an error, nothing changed
  // (an import that cleared first would have lost keys 1, 2 and 3).
  const std::vector<int64_t> five = {7, 8, 9, 10, 11};
  const std::vector<float> rows(10, 3.0f);
  EXPECT_EQ(ReplaceBatch(t, five.data(), 5, rows.data(), nullptr, nullptr, t.Tick(20), run_,
                         &error),
            -1);
  EXPECT_FALSE(error.empty());
  EXPECT_TRUE(Snap(t) == before);

  // Two keys, one of them already there: the table holds exactly those two.
  const std::vector<int64_t> two = {2, 5};
  const std::vector<float> rows2 = {1, 2, 3, 4};
  const std::vector<int64_t> ts = {100, 200};
  const int64_t now = t.Tick(30);
  ASSERT_EQ(ReplaceBatch(t, two.data(), 2, rows2.data(), ts.data(), nullptr, now, run_, &error),
            0);
  EXPECT_EQ(t.size(), 2);
  EXPECT_EQ(t.Find(1), -1);
  EXPECT_EQ(t.Find(3), -1);
  EXPECT_EQ(RowOf(t, 2), (std::vector<float>{1, 2}));
  EXPECT_EQ(RowOf(t, 5), (std::vector<float>{3, 4}));
  EXPECT_EQ(Ts(t, 5), 200);
  // The clock goes on from the table's own.
  EXPECT_GT(t.Tick(0), now);
  // The table takes new keys as usual afterwards.
  const std::vector<int64_t> more = {6, 7};
  ASSERT_EQ(FindOrInsertBatch(t, more.data(), 2, t.Tick(40), tmp.data(), run_, &error), 0);
  EXPECT_EQ(t.size(), 4);
  EXPECT_GE(t.Find(2), 0);
  EXPECT_GE(t.Find(6), 0);
}

TEST_P(BatchOpsTest, EnsureEntriesOnABoundedTable) {
  const TableConfig c = Config(2, 8, Eviction::kLru);
  DynamicTable t(c);
  std::string error;
  const std::vector<int64_t> base = {1, 2, 3, 4, 5, 6};
  std::vector<int64_t> entries(64);
  ASSERT_EQ(EnsureEntries(t, base.data(), 6, t.Tick(10), true, true, entries.data(), run_, &error),
            0);
  const Snapshot before = Snap(t);

  // Nine new keys cannot fit in eight rows.
  const std::vector<int64_t> nine = {11, 12, 13, 14, 15, 16, 17, 18, 19};
  EXPECT_EQ(EnsureEntries(t, nine.data(), 9, t.Tick(20), true, true, entries.data(), run_, &error),
            -1);
  EXPECT_NE(error.find("9 distinct keys"), std::string::npos) << error;
  EXPECT_NE(error.find("at most 8 rows"), std::string::npos) << error;
  EXPECT_TRUE(Snap(t) == before);
  for (int64_t k : nine) EXPECT_EQ(t.Find(k), -1);

  // Five keys used now are protected: four new keys need two victims, only
  // one (key 1) can go.
  const std::vector<int64_t> mixed = {2, 21, 3, 22, 4, 23, 5, 24, 6, 21};
  error.clear();
  EXPECT_EQ(EnsureEntries(t, mixed.data(), 10, t.Tick(30), true, true, entries.data(), run_, &error),
            -1);
  EXPECT_FALSE(error.empty());
  EXPECT_EQ(t.size(), 6);
  for (int64_t k : {21, 22, 23, 24}) EXPECT_EQ(t.Find(k), -1);
  for (int64_t k : base) EXPECT_GE(t.Find(k), 0);

  // The other ops report the same failure and change no rows.
  std::vector<float> out(64 * 2);
  const std::vector<float> rows(64 * 2, 1.0f);
  error.clear();
  EXPECT_EQ(FindOrInsertBatch(t, nine.data(), 9, t.Tick(40), out.data(), run_, &error), -1);
  EXPECT_FALSE(error.empty());
  error.clear();
  EXPECT_EQ(ScatterBatch(t, nine.data(), 9, rows.data(), ScatterMode::kAdd, t.Tick(41), run_, &error),
            -1);
  EXPECT_FALSE(error.empty());
  error.clear();
  EXPECT_EQ(ImportBatch(t, nine.data(), 9, rows.data(), nullptr, nullptr, t.Tick(42), run_, &error),
            -1);
  EXPECT_FALSE(error.empty());
  EXPECT_EQ(t.size(), 6);
  for (int64_t k : base) EXPECT_TRUE(SameBits(RowOf(t, k), InitialRow(c, k))) << k;
  EXPECT_EQ(t.evicted_total(), 0);

  // Two used now plus three new: 6 + 3 - 8 = 1 evicted, the oldest unused:
  // key 1 (last used at 10; the others at 10 or later, with larger keys).
  const std::vector<int64_t> ok = {2, 31, 3, 32, 33, 31};
  const int64_t now = t.Tick(50);
  EXPECT_EQ(EnsureEntries(t, ok.data(), 6, now, true, true, entries.data(), run_, &error), 1);
  EXPECT_EQ(t.size(), 8);
  EXPECT_EQ(t.Find(1), -1);
  EXPECT_EQ(t.evicted_total(), 1);
  for (size_t i = 0; i < ok.size(); ++i) {
    ASSERT_GE(entries[i], 0);
    EXPECT_EQ(t.Key(entries[i]), ok[i]) << i;
    EXPECT_EQ(t.Timestamp(entries[i]), now);
  }
  EXPECT_EQ(Freq(t, 31), 2);
  EXPECT_EQ(Freq(t, 32), 1);

  // Repeated new keys count once toward the bound.
  DynamicTable small(Config(2, 4, Eviction::kLfu));
  const std::vector<int64_t> rep = {5, 5, 5, 6, 6, 7, 8, 8};
  EXPECT_EQ(EnsureEntries(small, rep.data(), 8, small.Tick(1), true, true, entries.data(), run_,
                          &error),
            0);
  EXPECT_EQ(small.size(), 4);
  for (size_t i = 0; i < rep.size(); ++i) EXPECT_EQ(small.Key(entries[i]), rep[i]);
  EXPECT_EQ(Freq(small, 5), 3);
  EXPECT_EQ(Freq(small, 8), 2);
}

TEST_P(BatchOpsTest, EnsureEntriesWithoutInitializeOrAccess) {
  // accessed = false: new keys 0 uses, existing keep theirs, all stamped now.
  DynamicTable t(ConstantConfig(2, 3.0f));
  std::string error;
  std::vector<int64_t> entries(8);
  const std::vector<int64_t> a = {1, 1};
  ASSERT_EQ(EnsureEntries(t, a.data(), 2, t.Tick(1), true, true, entries.data(), run_, &error), 0);
  EXPECT_EQ(Freq(t, 1), 2);
  const std::vector<int64_t> b = {1, 2, 2, 1};
  const int64_t now = t.Tick(2);
  ASSERT_EQ(EnsureEntries(t, b.data(), 4, now, false, true, entries.data(), run_, &error), 0);
  EXPECT_EQ(Freq(t, 1), 2);
  EXPECT_EQ(Freq(t, 2), 0);
  EXPECT_EQ(Ts(t, 1), now);
  EXPECT_EQ(Ts(t, 2), now);
  EXPECT_EQ(RowOf(t, 2), (std::vector<float>{3.0f, 3.0f}));
  EXPECT_EQ(t.size(), 2);
  for (size_t i = 0; i < b.size(); ++i) EXPECT_EQ(t.Key(entries[i]), b[i]);
}

TEST_P(BatchOpsTest, ExportCoversEveryEntryOnce) {
  const TableConfig c = Config(1, 0, Eviction::kLru);
  DynamicTable t(c);
  std::string error;
  RefMap ref;
  std::mt19937_64 rng(3);
  std::vector<int64_t> keys;
  std::vector<float> rows;
  std::vector<int64_t> ts;
  std::vector<uint32_t> freq;
  for (int i = 0; i < 1000; ++i) {
    const int64_t k = i < 5 ? std::vector<int64_t>{0, -1, kI64Min, kI64Max, 1}[i]
                            : static_cast<int64_t>(rng());
    keys.push_back(k);
    rows.push_back(static_cast<float>(i));
    ts.push_back(static_cast<int64_t>(rng() % 50));  // many ties
    freq.push_back(static_cast<uint32_t>(i));
    ref[k] = RefEntry{std::vector<float>{static_cast<float>(i)}, ts.back(), freq.back()};
  }
  ASSERT_EQ(ImportBatch(t, keys.data(), 1000, rows.data(), ts.data(), freq.data(), t.Tick(100),
                        run_, &error),
            0);
  ASSERT_EQ(Mismatch(t, ref, keys), "");
  // Removals reorder the entries; export follows.
  for (int i = 0; i < 1000; i += 7) {
    ASSERT_TRUE(t.Remove(keys[i]));
    ref.erase(keys[i]);
  }
  for (int64_t limit : {1, 2, 7, 100, 856, 857, 858, 5000}) {
    for (int64_t after : {kI64Min, int64_t{-1}, int64_t{0}, int64_t{10}, int64_t{25},
                          int64_t{48}, int64_t{49}, kI64Max}) {
      EXPECT_EQ(ExportMismatch(t, ref, limit, after), "") << "limit " << limit << " after " << after;
    }
  }
  std::vector<int64_t> chunk;
  EXPECT_EQ(ExportEntries(t, -5, 3, kI64Min, &chunk), 3);  // a negative offset starts at 0
  EXPECT_EQ(chunk, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(ExportEntries(t, t.size(), 10, kI64Min, &chunk), t.size());
  EXPECT_TRUE(chunk.empty());
  // Everything filtered out: one call reaches the end, exporting nothing.
  EXPECT_EQ(ExportEntries(t, 0, 10, 49, &chunk), t.size());
  EXPECT_TRUE(chunk.empty());
  DynamicTable empty(c);
  EXPECT_EQ(ExportEntries(empty, 0, 10, kI64Min, &chunk), 0);
  EXPECT_TRUE(chunk.empty());
}

INSTANTIATE_TEST_SUITE_P(Runners, BatchOpsTest, ::testing::Values(0, 1, 2, 3));

// --------------------------------------------- random sequences vs reference

std::vector<int64_t> KeyPool(uint64_t seed) {
  std::vector<int64_t> pool = {0, 1, -1, 2, kI64Min, kI64Min + 1, kI64Max, kI64Max - 1};
  for (int64_t m = -4; m <= 4; ++m) {
    if (m != 0) pool.push_back(m * (int64_t{1} << 40));
  }
  // Keys sharing a home slot (the last one, so probes wrap) in small indexes.
  std::mt19937_64 rng(seed);
  for (uint64_t home : {uint64_t{255}, uint64_t{0}}) {
    int found = 0;
    while (found < 12) {
      const int64_t k = static_cast<int64_t>(rng());
      if ((MixHash(static_cast<uint64_t>(k)) & 255) == home) {
        pool.push_back(k);
        ++found;
      }
    }
  }
  for (int i = 0; i < 60; ++i) pool.push_back(static_cast<int64_t>(rng()));
  std::sort(pool.begin(), pool.end());
  pool.erase(std::unique(pool.begin(), pool.end()), pool.end());
  return pool;
}

struct Transcript {
  std::vector<float> floats;
  std::vector<int64_t> ints;
};

// Runs one random sequence of batch ops with runner `kind`, checking every
// step against the reference; records outputs and the final table.
void RunRandomSequence(const TableConfig& c, int kind, uint64_t seed, Transcript* tr,
                       Snapshot* final_state) {
  DynamicTable t(c);
  RefTable ref;
  ref.config = c;
  const ParallelRunner run = MakeRunner(kind);
  const std::vector<int64_t> pool = KeyPool(seed);
  std::mt19937_64 rng(seed);
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  const int64_t dim = c.dim;
  const size_t max_distinct = c.max_rows > 0 ? static_cast<size_t>(c.max_rows) : 40;
  int64_t wall = 0;
  int64_t evicted_sum = 0;
  std::string error;
  const float default_row[4] = {-1.5f, 2.5f, -3.5f, 4.5f};
  for (int step = 0; step < 1200; ++step) {
    wall += static_cast<int64_t>(pick(3));
    const int64_t now = t.Tick(wall);
    // A batch of n keys drawn (with repeats) from d distinct pool keys.
    const size_t d = 1 + pick(std::min<size_t>(max_distinct, 30));
    std::vector<int64_t> distinct;
    while (distinct.size() < d) {
      const int64_t k = pool[pick(pool.size())];
      if (std::find(distinct.begin(), distinct.end(), k) == distinct.end()) distinct.push_back(k);
    }
    const size_t n = 1 + pick(60);
    std::vector<int64_t> keys(n);
    for (size_t i = 0; i < n; ++i) keys[i] = distinct[pick(d)];
    std::vector<float> rows(n * static_cast<size_t>(dim));
    for (float& v : rows) v = static_cast<float>(static_cast<int>(pick(2001)) - 1000) / 64.0f;
    const int64_t nn = static_cast<int64_t>(n);
    const size_t op = pick(100);
    if (op < 30) {
      std::vector<float> out(rows.size(), 1e30f);
      const int64_t want = ref.Ensure(keys, now, true);
      ASSERT_GE(want, 0);
      const int64_t got = FindOrInsertBatch(t, keys.data(), nn, now, out.data(), run, &error);
      ASSERT_EQ(got, want) << "step " << step << ": " << error;
      evicted_sum += got;
      for (size_t i = 0; i < n; ++i) {
        ASSERT_TRUE(SameBits(std::vector<float>(out.begin() + i * dim, out.begin() + (i + 1) * dim),
                             ref.map[keys[i]].row))
            << "step " << step << " position " << i;
      }
      tr->floats.insert(tr->floats.end(), out.begin(), out.end());
      tr->ints.push_back(got);
    } else if (op < 45) {
      std::vector<float> out(rows.size(), 1e30f);
      std::unique_ptr<bool[]> found(new bool[n]);
      FindBatch(t, keys.data(), nn, default_row, out.data(), found.get(), run);
      for (size_t i = 0; i < n; ++i) {
        RefMap::const_iterator it = ref.map.find(keys[i]);
        ASSERT_EQ(found[i], it != ref.map.end()) << "step " << step;
        const std::vector<float> want =
            it != ref.map.end() ? it->second.row : std::vector<float>(default_row, default_row + dim);
        ASSERT_TRUE(SameBits(std::vector<float>(out.begin() + i * dim, out.begin() + (i + 1) * dim),
                             want))
            << "step " << step << " position " << i;
        tr->ints.push_back(found[i]);
      }
      tr->floats.insert(tr->floats.end(), out.begin(), out.end());
    } else if (op < 70) {
      const ScatterMode mode = static_cast<ScatterMode>(pick(3));
      const int64_t want = ref.Ensure(keys, now, false);
      ASSERT_GE(want, 0);
      for (size_t i = 0; i < n; ++i) {
        std::vector<float>& dst = ref.map[keys[i]].row;
        for (int64_t j = 0; j < dim; ++j) {
          const float src = rows[i * dim + j];
          if (mode == ScatterMode::kAdd) dst[j] += src;
          if (mode == ScatterMode::kSub) dst[j] -= src;
          if (mode == ScatterMode::kUpdate) dst[j] = src;
        }
      }
      const int64_t got = ScatterBatch(t, keys.data(), nn, rows.data(), mode, now, run, &error);
      ASSERT_EQ(got, want) << "step " << step << ": " << error;
      evicted_sum += got;
      tr->ints.push_back(got);
    } else if (op < 85) {
      std::vector<int64_t> ts(n);
      std::vector<uint32_t> fr(n);
      for (size_t i = 0; i < n; ++i) {
        ts[i] = now - 1 - static_cast<int64_t>(pick(40));
        fr[i] = static_cast<uint32_t>(pick(6));
      }
      const bool with_ts = pick(2) == 0, with_fr = pick(2) == 0;
      const int64_t want = ref.Ensure(keys, now, false);
      ASSERT_GE(want, 0);
      for (size_t i = 0; i < n; ++i) {
        RefEntry& r = ref.map[keys[i]];
        r.row.assign(rows.begin() + i * dim, rows.begin() + (i + 1) * dim);
        r.timestamp = with_ts ? ts[i] : now;
        if (with_fr) r.frequency = fr[i];  // else a held key keeps its count
      }
      const int64_t got = ImportBatch(t, keys.data(), nn, rows.data(), with_ts ? ts.data() : nullptr,
                                      with_fr ? fr.data() : nullptr, now, run, &error);
      ASSERT_EQ(got, want) << "step " << step << ": " << error;
      evicted_sum += got;
      tr->ints.push_back(got);
    } else if (op < 93) {
      for (size_t i = 0; i < std::min<size_t>(n, 4); ++i) {
        const bool present = ref.map.erase(keys[i]) > 0;
        ASSERT_EQ(t.Remove(keys[i]), present);
      }
    } else {
      const int64_t limit = 1 + static_cast<int64_t>(pick(20));
      const int64_t after = pick(3) == 0 ? kI64Min : now - static_cast<int64_t>(pick(30));
      ASSERT_EQ(ExportMismatch(t, ref.map, limit, after), "") << "step " << step;
    }
    ASSERT_EQ(Mismatch(t, ref.map, pool), "") << "step " << step << " op " << op;
    ASSERT_EQ(t.evicted_total(), ref.evicted_total);
    if (c.max_rows > 0) {
      ASSERT_LE(t.size(), c.max_rows);
    }
  }
  if (c.max_rows > 0) {
    EXPECT_GT(evicted_sum, 100);
  }
  tr->ints.push_back(t.evicted_total());
  *final_state = Snap(t);
}

TEST(BatchOpsRandomTest, MatchesReferenceAndAllRunnersAgree) {
  const TableConfig configs[] = {Config(3, 0, Eviction::kLru), Config(3, 48, Eviction::kLru),
                                 Config(4, 48, Eviction::kLfu), Config(1, 31, Eviction::kLfu)};
  uint64_t seed = 1;
  for (const TableConfig& c : configs) {
    ++seed;
    Transcript first;
    Snapshot first_state;
    for (int kind : kRunnerKinds) {
      SCOPED_TRACE(::testing::Message() << "max_rows " << c.max_rows << " runner " << kind);
      Transcript tr;
      Snapshot state;
      RunRandomSequence(c, kind, seed, &tr, &state);
      if (HasFatalFailure()) return;
      if (kind == 0) {
        first = tr;
        first_state = state;
      } else {
        EXPECT_TRUE(SameBits(tr.floats, first.floats));
        EXPECT_EQ(tr.ints, first.ints);
        EXPECT_TRUE(state == first_state);
      }
    }
  }
}

}  // namespace
}  // namespace core
}  // namespace sok_graph
