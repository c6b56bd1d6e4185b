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

namespace sok_graph {
namespace core {

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
// whose slot has arrived by then.
constexpr int64_t kTablePrefetch = 4;

inline void PrefetchAhead(const DynamicTable& t, const int64_t* keys, int64_t i, int64_t end) {
  if (i + 2 * kTablePrefetch < end) t.PrefetchKey(keys[i + 2 * kTablePrefetch]);
  if (i + kTablePrefetch < end) t.PrefetchEntryOfKey(keys[i + kTablePrefetch]);
}

// entries[i] <- entry of keys[i] or -1, in parallel.
inline void FindEntries(const DynamicTable& t, const int64_t* keys, int64_t n, int64_t* entries,
                        const ParallelRunner& run) {
  run(n, 200, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      PrefetchAhead(t, keys, i, end);
      entries[i] = t.Find(keys[i]);
    }
  });
}

// out[i] <- row of keys[i] ([n, dim]); missing keys get `default_row`
// (dim floats) and found[i] = false. Nothing is inserted or touched.
inline void FindBatch(const DynamicTable& t, const int64_t* keys, int64_t n,
                      const float* default_row, float* out, bool* found,
                      const ParallelRunner& run) {
  const int64_t dim = t.dim();
  run(n, 200 + 2 * dim, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      PrefetchAhead(t, keys, i, end);
      const int64_t e = t.Find(keys[i]);
      found[i] = e >= 0;
      std::memcpy(out + i * dim, e >= 0 ? t.Row(e) : default_row,
                  static_cast<size_t>(dim) * sizeof(float));
    }
  });
}

// Makes sure every key of the batch has an entry: existing keys are touched
// at `now` (accessed: counted as a use), missing ones inserted after evicting
// as needed, with rows from the initializer unless `initialize` is false.
// entries[i] <- entry of keys[i]. Returns the number evicted, or -1 with
// `error` set when the batch has more new keys than the table may hold.
inline int64_t EnsureEntries(DynamicTable& t, const int64_t* keys, int64_t n, int64_t now,
                             bool accessed, bool initialize, int64_t* entries,
                             const ParallelRunner& run, std::string* error,
                             std::vector<int64_t>* evicted_keys = nullptr) {
  FindEntries(t, keys, n, entries, run);
  // Distinct keys of the batch (`which[i]`: the distinct key at position i)
  // and the first position of each missing one. Checked before anything
  // changes: a batch that cannot fit leaves the table as it was.
  std::vector<int64_t> missing;
  std::vector<int64_t> which(static_cast<size_t>(n));
  FirstOccurrenceIndex<int64_t> distinct(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t before = distinct.size();
    which[i] = distinct.Insert(keys[i]);
    if (distinct.size() > before && entries[i] < 0) missing.push_back(i);
  }
  if (distinct.size() > t.row_limit()) {
    *error = "the batch has " + std::to_string(distinct.size()) +
             " distinct keys but the table holds at most " + std::to_string(t.row_limit()) +
             " rows (keys used in this batch are never evicted)";
    return -1;
  }
  for (int64_t i = 0; i < n; ++i) {
    if (entries[i] >= 0) t.Touch(entries[i], now, accessed);
  }
  if (missing.empty()) return 0;
  // Cannot fail: every key the batch protects is one of its distinct keys.
  const int64_t evicted = t.MakeRoom(static_cast<int64_t>(missing.size()), now, evicted_keys);
  if (evicted > 0) FindEntries(t, keys, n, entries, run);  // evictions move entries
  std::vector<int64_t> fresh;  // entry of each missing key, in `missing` order
  std::vector<int64_t> entry_of(static_cast<size_t>(distinct.size()), -1);
  fresh.reserve(missing.size());
  for (int64_t i : missing) {
    fresh.push_back(t.InsertUninitialized(keys[i], now, accessed));
    entry_of[which[i]] = fresh.back();
  }
  if (initialize) {
    run(static_cast<int64_t>(fresh.size()), 40 * t.dim(), [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) t.InitializeEntry(fresh[k]);
    });
  }
  // Entries of new keys; a repeat of a new key within the batch counts as
  // another use, as it would in a serial loop.
  size_t next_missing = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (entries[i] >= 0) continue;
    entries[i] = entry_of[which[i]];
    if (next_missing < missing.size() && missing[next_missing] == i) {
      ++next_missing;  // the insertion itself, counted by InsertUninitialized
    } else if (accessed) {
      t.Touch(entries[i], now, true);
    }
  }
  return evicted;
}

// Training lookup: out[i] <- row of keys[i], inserting missing keys; the
// keys evicted to make room are appended to `evicted_keys` when given.
inline int64_t FindOrInsertBatch(DynamicTable& t, const int64_t* keys, int64_t n, int64_t now,
                                 float* out, const ParallelRunner& run, std::string* error,
                                 std::vector<int64_t>* evicted_keys = nullptr) {
  std::vector<int64_t> entries(static_cast<size_t>(n));
  const int64_t evicted =
      EnsureEntries(t, keys, n, now, true, true, entries.data(), run, error, evicted_keys);
  if (evicted < 0) return -1;
  const int64_t dim = t.dim();
  run(n, 2 * dim + 20, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (i + kTablePrefetch < end) t.PrefetchEntry(entries[i + kTablePrefetch]);
      std::memcpy(out + i * dim, t.Row(entries[i]), static_cast<size_t>(dim) * sizeof(float));
    }
  });
  return evicted;
}

enum class ScatterMode { kAdd, kSub, kUpdate };

// rows [n, dim] applied to the rows of keys: row += r, row -= r or row = r.
// Missing keys are inserted first (with their initial rows). Updates of one
// key apply in input order; keys are split over threads by entry, so no two
// threads write one row.
inline int64_t ScatterBatch(DynamicTable& t, const int64_t* keys, int64_t n, const float* rows,
                            ScatterMode mode, int64_t now, const ParallelRunner& run,
                            std::string* error) {
  std::vector<int64_t> entries(static_cast<size_t>(n));
  const int64_t evicted = EnsureEntries(t, keys, n, now, false, true, entries.data(), run, error);
  if (evicted < 0) return -1;
  const int64_t dim = t.dim();
  const int64_t parts = 16;
  run(parts, (n / parts + 1) * (dim + 4), [&](int64_t p0, int64_t p1) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t e = entries[i];
      if (e % parts < p0 || e % parts >= p1) continue;
      float* dst = t.MutableRow(e);
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
  });
  return evicted;
}

// Inserts or overwrites keys with the given rows. Metadata is restored from
// `timestamps` / `frequencies` when given (else: updated now, no accesses).
inline int64_t ImportBatch(DynamicTable& t, const int64_t* keys, int64_t n, const float* rows,
                           const int64_t* timestamps, const uint32_t* frequencies, int64_t now,
                           const ParallelRunner& run, std::string* error) {
  std::vector<int64_t> entries(static_cast<size_t>(n));
  const int64_t evicted =
      EnsureEntries(t, keys, n, now, false, false, entries.data(), run, error);
  if (evicted < 0) return -1;
  const int64_t dim = t.dim();
  // Serial: the last occurrence of a repeated key wins, as in a serial loop.
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(t.MutableRow(entries[i]), rows + i * dim, static_cast<size_t>(dim) * sizeof(float));
    t.SetMetadata(entries[i], timestamps ? timestamps[i] : now, frequencies ? frequencies[i] : 0);
  }
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
