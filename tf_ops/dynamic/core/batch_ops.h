// Batch operations on a DynamicTable: what the TensorFlow ops do, with the
// parallel parts handed to a runner (the op's thread pool in the kernels, a
// plain loop in tests). TF-independent; C++14.
//
// Each function runs with the table locked by the caller: shared for
// FindBatch, exclusive for the others. A batch then behaves as one step of
// some serial order of calls, and within a batch keys are processed as if
// one after another in input order (so a key repeated in a batch is
// inserted once, and repeated updates apply in input order).
#ifndef SOK_GRAPH_TF_OPS_DYNAMIC_CORE_BATCH_OPS_H_
#define SOK_GRAPH_TF_OPS_DYNAMIC_CORE_BATCH_OPS_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "tf_ops/dynamic/core/dynamic_table.h"
#include "tf_ops/util/core/scratch.h"

namespace sok_graph {
namespace core {

// Scratch slots (tf_ops/util/core/scratch.h) of the arrays below.
enum ScratchSlot { kEntriesSlot, kMissingSlot, kFreshSlot, kPositionsSlot, kFreeSlotsSlot };

// runner(total, cost_per_unit, fn): calls fn(begin, end) over [0, total).
using ParallelRunner =
    std::function<void(int64_t, int64_t, const std::function<void(int64_t, int64_t)>&)>;

inline ParallelRunner SerialRunner() {
  return [](int64_t total, int64_t, const std::function<void(int64_t, int64_t)>& fn) {
    if (total > 0) fn(0, total);
  };
}

// Lookups prefetch in two stages: the index slot of the key kTablePrefetch
// * 2 ahead, then the entry (key and row) of the key kTablePrefetch ahead,
// whose slot has arrived by then. The second stage reads the slot, so it
// must come late enough for the first to have landed: 16 (slot 32 keys
// ahead) found the entries of 65,536 keys in a 1M-key table 15-25% faster
// than 4 did (one thread, dim 16).
constexpr int64_t kTablePrefetch = 16;

inline void PrefetchAhead(const DynamicTable& t, const int64_t* keys, int64_t i, int64_t end,
                          bool with_row = true) {
  if (i + 2 * kTablePrefetch < end) t.PrefetchKey(keys[i + 2 * kTablePrefetch]);
  if (i + kTablePrefetch < end) t.PrefetchEntryOfKey(keys[i + kTablePrefetch], with_row);
}

// Loops that know their entries already (copying or updating rows) fetch
// only rows, further ahead: measured 3-4x faster than the two-stage
// prefetch of key and row four ahead; 32 ahead a little faster again than 16.
constexpr int64_t kRowPrefetch = 32;

// The loops over a batch are plain functions of [begin, end), which the
// runners' lambdas call, so the serial paths and the threads share them.

inline void FindEntriesIn(const DynamicTable& t, const int64_t* keys, int64_t begin, int64_t end,
                          int64_t* entries, uint64_t* free_slots = nullptr) {
  uint64_t unused = 0;
  for (int64_t i = begin; i < end; ++i) {
    PrefetchAhead(t, keys, i, end, false);
    entries[i] = t.FindOrFreeSlot(keys[i], free_slots != nullptr ? &free_slots[i] : &unused);
  }
}

// entries[i] <- entry of keys[i] or -1, in parallel; where given,
// free_slots[i] <- the free index slot that ended a missing key's probe.
inline void FindEntries(const DynamicTable& t, const int64_t* keys, int64_t n, int64_t* entries,
                        const ParallelRunner& run, uint64_t* free_slots = nullptr) {
  run(n, 200, [&](int64_t begin, int64_t end) {
    FindEntriesIn(t, keys, begin, end, entries, free_slots);
  });
}

// out[i] <- row of entries[i] for i in [begin, end); entries < 0 (missing
// keys) get `default_row` and found[i] = false (when `found` is given).
inline void CopyRowsIn(const DynamicTable& t, const int64_t* entries, int64_t begin, int64_t end,
                       const float* default_row, float* out, bool* found) {
  const size_t row_bytes = static_cast<size_t>(t.dim()) * sizeof(float);
  for (int64_t i = begin; i < end; ++i) {
    if (i + kRowPrefetch < end && entries[i + kRowPrefetch] >= 0) {
      t.PrefetchRow(entries[i + kRowPrefetch]);
    }
    const int64_t e = entries[i];
    if (found != nullptr) found[i] = e >= 0;
    std::memcpy(out + i * t.dim(), e >= 0 ? t.Row(e) : default_row, row_bytes);
  }
}

// out[i] <- row of keys[i] ([n, dim]); missing keys get `default_row`
// (dim floats) and found[i] = false. Nothing is inserted or touched.
// Entries first, then rows: the copy then knows its rows far ahead, which
// measured 10-20% faster than fetching key and row together.
inline void FindBatch(const DynamicTable& t, const int64_t* keys, int64_t n,
                      const float* default_row, float* out, bool* found,
                      const ParallelRunner& run) {
  Scratch<int64_t, kEntriesSlot> entries(static_cast<size_t>(n));
  int64_t* e = entries->data();
  run(n, 200 + 2 * t.dim(), [&](int64_t begin, int64_t end) {
    FindEntriesIn(t, keys, begin, end, e);
    CopyRowsIn(t, e, begin, end, default_row, out, found);
  });
}

// Touches the entries of a batch in input order (a repeated key counts
// each use). Serial: repeats may fall anywhere in the batch.
inline void TouchEntries(DynamicTable& t, const int64_t* entries, int64_t n, int64_t now,
                         bool accessed) {
  constexpr int64_t kAhead = 8;
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n && entries[i + kAhead] >= 0) t.PrefetchMetadata(entries[i + kAhead]);
    if (entries[i] >= 0) t.Touch(entries[i], now, accessed);
  }
}

// How many distinct keys the batch has, and how many of them are missing
// from the table (entries[i] < 0). Only needed near the table's bound: far
// from it, the number of missing positions bounds both well enough.
inline void CountDistinct(const int64_t* keys, int64_t n, const int64_t* entries,
                          int64_t* distinct_keys, int64_t* distinct_missing) {
  FirstOccurrenceIndex<int64_t> distinct(n);
  *distinct_missing = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t before = distinct.size();
    distinct.Insert(keys[i]);
    if (distinct.size() > before && entries[i] < 0) ++*distinct_missing;
  }
  *distinct_keys = distinct.size();
}

// Makes sure every key of the batch has an entry: existing keys are touched
// at `now` (accessed: counted as a use), missing ones inserted after evicting
// as needed, with rows from the initializer unless `initialize` is false.
// entries[i] <- entry of keys[i]. Returns the number evicted, or -1 with
// `error` set when the batch has more new keys than the table may hold.
inline int64_t EnsureEntries(DynamicTable& t, const int64_t* keys, int64_t n, int64_t now,
                             bool accessed, bool initialize, int64_t* entries,
                             const ParallelRunner& run, std::string* error,
                             std::vector<int64_t>* evicted_keys = nullptr,
                             std::vector<float>* evicted_rows = nullptr) {
  // Where each missing key's probe ended: its insertion below starts there.
  Scratch<uint64_t, kFreeSlotsSlot> free_slots(static_cast<size_t>(n));
  FindEntries(t, keys, n, entries, run, free_slots->data());
  Scratch<int64_t, kMissingSlot> missing;  // positions whose key the table lacks
  for (int64_t i = 0; i < n; ++i) {
    if (entries[i] < 0) missing->push_back(i);
  }
  // Checked before anything changes: a batch that cannot fit leaves the
  // table as it was. Repeats make the counts of positions upper bounds.
  int64_t incoming = static_cast<int64_t>(missing->size());
  if (n > t.row_limit() || t.size() + incoming > t.row_limit()) {
    int64_t distinct_keys = 0;
    CountDistinct(keys, n, entries, &distinct_keys, &incoming);
    if (distinct_keys > t.row_limit()) {
      *error = "the batch has " + std::to_string(distinct_keys) +
               " distinct keys but the table holds at most " + std::to_string(t.row_limit()) +
               (t.config().max_rows > 0
                    ? " rows, its max_capacity (keys used in this batch are never evicted)"
                    : " rows, the most a table holds");
      return -1;
    }
  }
  TouchEntries(t, entries, n, now, accessed);
  if (missing->empty()) return 0;
  // Cannot fail: every key the batch protects is one of its distinct keys.
  const uint64_t slots_before = t.index_slots();
  const int64_t evicted = t.MakeRoom(incoming, now, evicted_keys, evicted_rows);
  if (evicted > 0 || t.index_slots() != slots_before) {
    // Evictions move entries and free slots; a larger index moves every key.
    FindEntries(t, keys, n, entries, run, free_slots->data());
  }
  // New keys in input order; a repeat of a new key within the batch finds
  // the entry its first occurrence added and counts as another use, as it
  // would in a serial loop.
  Scratch<int64_t, kFreshSlot> fresh;  // entries added, in order
  const int64_t* miss = missing->data();
  const uint64_t* slot = free_slots->data();
  const int64_t m = static_cast<int64_t>(missing->size());
  for (int64_t k = 0; k < m; ++k) {
    if (k + kTablePrefetch < m) t.PrefetchSlot(slot[miss[k + kTablePrefetch]]);
    bool added = false;
    const int64_t i = miss[k];
    // From the slot where its probe ended: the slots before it held other
    // keys and still do (nothing was removed since), so no key is compared
    // twice — unless a key added just before filled that slot.
    entries[i] = t.FindOrInsertFrom(slot[i], keys[i], now, accessed, &added);
    if (added) {
      fresh->push_back(entries[i]);
    } else if (accessed) {
      t.Touch(entries[i], now, true);
    }
  }
  if (initialize) {
    const int64_t* added = fresh->data();
    run(static_cast<int64_t>(fresh->size()), 40 * t.dim(), [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) t.InitializeEntry(added[k]);
    });
  }
  return evicted;
}

// Training lookup: out[i] <- row of keys[i], inserting missing keys; the
// keys evicted to make room (and their rows) are appended to `evicted_keys`
// (`evicted_rows`) when given.
inline int64_t FindOrInsertBatch(DynamicTable& t, const int64_t* keys, int64_t n, int64_t now,
                                 float* out, const ParallelRunner& run, std::string* error,
                                 std::vector<int64_t>* evicted_keys = nullptr,
                                 std::vector<float>* evicted_rows = nullptr) {
  Scratch<int64_t, kEntriesSlot> entries(static_cast<size_t>(n));
  const int64_t evicted = EnsureEntries(t, keys, n, now, true, true, entries->data(), run, error,
                                        evicted_keys, evicted_rows);
  if (evicted < 0) return -1;
  const int64_t* e = entries->data();
  run(n, 2 * t.dim() + 20,
      [&](int64_t begin, int64_t end) { CopyRowsIn(t, e, begin, end, nullptr, out, nullptr); });
  return evicted;
}

enum class ScatterMode { kAdd, kSub, kUpdate };

// Applies rows[pos] to the row of entries[pos] for pos in positions[0, m),
// in that order.
inline void ScatterIn(DynamicTable& t, const int64_t* entries, const int64_t* positions, int64_t m,
                      const float* rows, ScatterMode mode) {
  const int64_t dim = t.dim();
  for (int64_t k = 0; k < m; ++k) {
    if (k + kRowPrefetch < m) {
      const int64_t ahead = positions[k + kRowPrefetch];
      t.PrefetchRow(entries[ahead]);
      PrefetchSpan(rows + ahead * dim, dim * static_cast<int64_t>(sizeof(float)));
    }
    const int64_t i = positions[k];
    float* dst = t.MutableRow(entries[i]);
    const float* src = rows + i * dim;
    switch (mode) {
      case ScatterMode::kAdd:
        for (int64_t d = 0; d < dim; ++d) dst[d] += src[d];
        break;
      case ScatterMode::kSub:
        for (int64_t d = 0; d < dim; ++d) dst[d] -= src[d];
        break;
      case ScatterMode::kUpdate:
        std::memcpy(dst, src, static_cast<size_t>(dim) * sizeof(float));
        break;
    }
  }
}

// rows [n, dim] applied to the rows of keys: row += r, row -= r or row = r.
// Missing keys are inserted first (with their initial rows; the keys evicted
// to make room are appended to `evicted_keys` when given). Updates of one
// key apply in input order: positions are bucketed by entry (a stable
// counting sort), and each bucket goes to one thread, so no two threads
// write one row.
inline int64_t ScatterBatch(DynamicTable& t, const int64_t* keys, int64_t n, const float* rows,
                            ScatterMode mode, int64_t now, const ParallelRunner& run,
                            std::string* error, std::vector<int64_t>* evicted_keys = nullptr) {
  Scratch<int64_t, kEntriesSlot> entries(static_cast<size_t>(n));
  const int64_t* e = entries->data();
  const int64_t evicted =
      EnsureEntries(t, keys, n, now, false, true, entries->data(), run, error, evicted_keys);
  if (evicted < 0) return -1;
  constexpr int64_t kParts = 16;
  int64_t starts[kParts + 1] = {0};
  for (int64_t i = 0; i < n; ++i) ++starts[e[i] % kParts + 1];
  for (int64_t p = 0; p < kParts; ++p) starts[p + 1] += starts[p];
  Scratch<int64_t, kPositionsSlot> positions(static_cast<size_t>(n));
  int64_t* pos = positions->data();
  {
    int64_t next[kParts];
    std::copy(starts, starts + kParts, next);
    for (int64_t i = 0; i < n; ++i) pos[next[e[i] % kParts]++] = i;
  }
  run(kParts, (n / kParts + 1) * (t.dim() + 20), [&](int64_t p0, int64_t p1) {
    ScatterIn(t, e, pos + starts[p0], starts[p1] - starts[p0], rows, mode);
  });
  return evicted;
}

// Inserts or overwrites keys with the given rows. Metadata is restored from
// `timestamps` / `frequencies` when given; else the write time is now, and
// the use count stays: a write is no use, so a key the table holds keeps the
// count its reads gave it (what LFU eviction ranks by) and a new key has none.
// The keys evicted to make room are appended to `evicted_keys` when given.
inline int64_t ImportBatch(DynamicTable& t, const int64_t* keys, int64_t n, const float* rows,
                           const int64_t* timestamps, const uint32_t* frequencies, int64_t now,
                           const ParallelRunner& run, std::string* error,
                           std::vector<int64_t>* evicted_keys = nullptr) {
  Scratch<int64_t, kEntriesSlot> entries(static_cast<size_t>(n));
  const int64_t evicted =
      EnsureEntries(t, keys, n, now, false, false, entries->data(), run, error, evicted_keys);
  if (evicted < 0) return -1;
  const int64_t dim = t.dim();
  // Serial: the last occurrence of a repeated key wins, as in a serial loop.
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(t.MutableRow((*entries)[i]), rows + i * dim,
                static_cast<size_t>(dim) * sizeof(float));
    const int64_t e = (*entries)[i];
    t.SetMetadata(e, timestamps ? timestamps[i] : now, frequencies ? frequencies[i] : t.Frequency(e));
    if (timestamps) t.ClockPast(timestamps[i]);
  }
  return evicted;
}

// The table holds exactly the given rows afterwards (ImportBatch into an
// empty table of the same configuration, then swapped in): on an error the
// table is unchanged, and a reader holding the table's lock sees the old
// entries or the new ones, never an empty or partial table.
inline int64_t ReplaceBatch(DynamicTable& t, const int64_t* keys, int64_t n, const float* rows,
                            const int64_t* timestamps, const uint32_t* frequencies, int64_t now,
                            const ParallelRunner& run, std::string* error) {
  DynamicTable staged(t.config());
  staged.Tick(now);
  const int64_t evicted =
      ImportBatch(staged, keys, n, rows, timestamps, frequencies, now, run, error);
  if (evicted < 0) return -1;
  t.SwapEntries(staged);
  t.ClockPast(staged.now());  // the imported rows' latest timestamp
  return evicted;
}

// Entries [offset, offset + limit) in the table's order, or only those
// updated after `updated_after` (microseconds; pass INT64_MIN for all).
// Returns the offset to continue from (size() when done).
inline int64_t ExportEntries(const DynamicTable& t, int64_t offset, int64_t limit,
                             int64_t updated_after, std::vector<int64_t>* entries) {
  entries->clear();
  int64_t e = std::max<int64_t>(offset, 0);
  for (; e < t.size() && static_cast<int64_t>(entries->size()) < limit; ++e) {
    if (t.Timestamp(e) > updated_after) entries->push_back(e);
  }
  return e;
}

}  // namespace core
}  // namespace sok_graph

#endif  // SOK_GRAPH_TF_OPS_DYNAMIC_CORE_BATCH_OPS_H_
