// A hash table from int64 keys to float rows, with per-key metadata and an
// optional bound on the number of rows enforced by LRU or LFU eviction.
// TF-independent; C++14. Not synchronised: the TensorFlow resource that owns
// a table (tf_ops/dynamic/kernels) serialises writers and lets readers share.
//
// Layout, chosen for memory per key (at most row bytes + 31 at a full table):
//   entries are dense in [0, size): keys_, rows_ (size x dim floats),
//   timestamps_ (UTC microseconds of the last use or update), frequencies_
//   (uint32 access count); the index is open addressing with linear probing
//   over int32 entry numbers, kept at most three quarters full. Removing an entry moves
//   the last entry into its place, so the entries stay dense and export is a
//   plain copy.
#ifndef SOK_GRAPH_TF_OPS_DYNAMIC_CORE_DYNAMIC_TABLE_H_
#define SOK_GRAPH_TF_OPS_DYNAMIC_CORE_DYNAMIC_TABLE_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "tf_ops/dynamic/core/initializer.h"
#include "tf_ops/util/core/huge_page_allocator.h"
#include "tf_ops/util/core/prefetch.h"
#include "tf_ops/util/core/unique.h"

namespace sok_graph {
namespace core {

enum class Eviction { kLru, kLfu };

struct TableConfig {
  int64_t dim = 1;
  int64_t init_capacity = 0;  // rows to allocate up front
  int64_t max_rows = 0;       // 0: unbounded; else evict to stay within
  Eviction eviction = Eviction::kLru;
  InitializerSpec initializer;
  // Bytes of rows a GPU table keeps in device memory (-1: all); it keeps the
  // rest in host memory. The CPU table keeps every row in host memory.
  int64_t hbm_bytes = -1;
};

class DynamicTable {
 public:
  static constexpr int64_t kMaxEntries = std::numeric_limits<int32_t>::max() / 2;

  explicit DynamicTable(const TableConfig& config) : config_(config) {
    Reserve(std::max<int64_t>(config.init_capacity, 0));
  }

  const TableConfig& config() const { return config_; }
  int64_t dim() const { return config_.dim; }
  int64_t size() const { return static_cast<int64_t>(keys_.size()); }
  // Largest number of rows the table may hold.
  int64_t row_limit() const { return config_.max_rows > 0 ? config_.max_rows : kMaxEntries; }
  int64_t evicted_total() const { return evicted_total_; }

  // Bytes held by rows, keys, metadata and index (allocated, not just used).
  int64_t memory_bytes() const {
    return static_cast<int64_t>(rows_.capacity() * sizeof(float) + keys_.capacity() * 8 +
                                timestamps_.capacity() * 8 + frequencies_.capacity() * 4 +
                                index_.size() * 4);
  }

  // The time of an op call: the wall clock in microseconds, but strictly
  // after every earlier call, so "touched by this call" is exactly
  // "timestamp == now" and LRU order never has ties between calls.
  int64_t Tick(int64_t wall_us) {
    now_ = std::max(wall_us, now_ + 1);
    return now_;
  }

  // Moves the clock to `timestamp` if it is later: rows imported with their
  // timestamps (a dump from a machine whose clock ran ahead, or timestamps
  // given by the caller) are then older than every later call's rows.
  // Without it a row used after such an import looked older than the
  // imported ones, and LRU evicted it first.
  void ClockPast(int64_t timestamp) { now_ = std::max(now_, timestamp); }
  int64_t now() const { return now_; }

  // The entry holding `key`, or -1. Safe for concurrent readers.
  int64_t Find(int64_t key) const {
    uint64_t unused;
    return FindOrFreeSlot(key, &unused);
  }

  // The entry holding `key`; or -1, with *free_slot set to the empty index
  // slot that ended the probe. Until entries are removed or the index
  // grows (index_slots() changes), every slot from the key's home to that
  // one holds another key, so FindOrInsertFrom can start there instead of
  // probing again. Safe for concurrent readers.
  int64_t FindOrFreeSlot(int64_t key, uint64_t* free_slot) const {
    uint64_t pos = Slot(key);
    while (true) {
      const int32_t e = index_[pos];
      if (e < 0) {
        *free_slot = pos;
        return -1;
      }
      if (keys_[e] == key) return e;
      pos = (pos + 1) & mask_;
    }
  }

  // The index's size: it changes exactly when the index is rebuilt.
  uint64_t index_slots() const { return index_.size(); }

  void PrefetchKey(int64_t key) const { __builtin_prefetch(&index_[Slot(key)], 0, 1); }
  void PrefetchSlot(uint64_t slot) const { __builtin_prefetch(&index_[slot], 1, 1); }
  void PrefetchMetadata(int64_t e) const {
    __builtin_prefetch(&timestamps_[e], 1, 1);
    __builtin_prefetch(&frequencies_[e], 1, 1);
  }
  // Second stage of a two-stage prefetch: the key's home slot (fetched by
  // PrefetchKey a little earlier) names its likely entry; fetch that entry's
  // key and row.
  // `with_row`: the row too, for callers that read it next.
  // The keys of the entries after it in the probe, up to the end of the
  // slot's cache line (already fetched), are fetched too: at half load a
  // missing key compares about 1.5 keys, and a key not at its home slot
  // one more.
  void PrefetchEntryOfKey(int64_t key, bool with_row = true) const {
    uint64_t pos = Slot(key);
    const int32_t e = index_[pos];
    if (e < 0) return;
    __builtin_prefetch(&keys_[e], 0, 1);
    if (with_row) PrefetchRow(e);
    constexpr uint64_t kSlotsPerLine = 64 / sizeof(int32_t);
    for (int more = 0; more < 2; ++more) {
      pos = (pos + 1) & mask_;
      if (pos % kSlotsPerLine == 0) return;  // next line: not fetched yet
      const int32_t next = index_[pos];
      if (next < 0) return;
      __builtin_prefetch(&keys_[next], 0, 1);
    }
  }
  // Only the row: callers that know the entry already (copying or updating
  // rows) would waste a memory access on its key.
  void PrefetchRow(int64_t e) const {
    PrefetchSpan(&rows_[e * dim()], dim() * static_cast<int64_t>(sizeof(float)));
  }

  int64_t Key(int64_t e) const { return keys_[e]; }
  int64_t Timestamp(int64_t e) const { return timestamps_[e]; }
  uint32_t Frequency(int64_t e) const { return frequencies_[e]; }
  const float* Row(int64_t e) const { return &rows_[e * dim()]; }
  float* MutableRow(int64_t e) { return &rows_[e * dim()]; }

  // Marks an entry used or updated at `now`; `accessed` also counts a use.
  void Touch(int64_t e, int64_t now, bool accessed) {
    timestamps_[e] = now;
    if (accessed && frequencies_[e] != std::numeric_limits<uint32_t>::max()) ++frequencies_[e];
  }

  void SetMetadata(int64_t e, int64_t timestamp, uint32_t frequency) {
    timestamps_[e] = timestamp;
    frequencies_[e] = frequency;
  }

  // Makes room for `incoming` new keys, evicting the least recently (LRU) or
  // least frequently (LFU; ties by age) used entries; entries touched at
  // `now` are never evicted. Returns how many were evicted, or -1 if room
  // cannot be made (more incoming keys than the bound allows).
  // When `evicted_keys` is given, the evicted keys are appended to it (so
  // tables that shadow this one, such as optimizer slots, can drop them too);
  // when `evicted_rows` is given, their rows (dim floats each, same order),
  // so that a caller can move them elsewhere.
  int64_t MakeRoom(int64_t incoming, int64_t now, std::vector<int64_t>* evicted_keys = nullptr,
                   std::vector<float>* evicted_rows = nullptr) {
    const int64_t excess = size() + incoming - row_limit();
    if (excess > 0) {
      std::vector<int64_t> candidates;
      candidates.reserve(keys_.size());
      for (int64_t e = 0; e < size(); ++e) {
        if (timestamps_[e] != now) candidates.push_back(e);
      }
      if (static_cast<int64_t>(candidates.size()) < excess) return -1;
      auto older = [this](int64_t a, int64_t b) { return EvictsBefore(a, b); };
      std::nth_element(candidates.begin(), candidates.begin() + (excess - 1), candidates.end(),
                       older);
      std::vector<int64_t> victims(candidates.begin(), candidates.begin() + excess);
      // Remove from the highest entry down: RemoveEntry moves the last entry
      // into the hole, which is then never a victim yet to be removed.
      std::sort(victims.begin(), victims.end());
      if (evicted_keys != nullptr) {
        for (int64_t e : victims) evicted_keys->push_back(keys_[e]);
      }
      if (evicted_rows != nullptr) {
        for (int64_t e : victims) evicted_rows->insert(evicted_rows->end(), Row(e), Row(e) + dim());
      }
      for (auto it = victims.rbegin(); it != victims.rend(); ++it) RemoveEntry(*it);
      evicted_total_ += excess;
    }
    Reserve(size() + incoming);
    return excess > 0 ? excess : 0;
  }

  // Adds `key` (which must be absent, with room made) with its initial row;
  // returns its entry.
  int64_t Insert(int64_t key, int64_t now, bool accessed) {
    const int64_t e = AppendEntry(key);
    InitializeRow(config_.initializer, key, dim(), MutableRow(e));
    timestamps_[e] = now;
    frequencies_[e] = accessed ? 1 : 0;
    return e;
  }

  // Adds `key` without touching its row: the caller fills it (import, or
  // new keys whose rows are initialised in parallel afterwards).
  int64_t InsertUninitialized(int64_t key, int64_t now, bool accessed) {
    const int64_t e = AppendEntry(key);
    timestamps_[e] = now;
    frequencies_[e] = accessed ? 1 : 0;
    return e;
  }

  // The entry of `key`; when absent, `key` is added as by
  // InsertUninitialized and *added is set. One probe does both, so a batch
  // of new keys that may repeat needs no set of its own. Room must have been
  // made (MakeRoom) for every key that may be added.
  int64_t FindOrInsertUninitialized(int64_t key, int64_t now, bool accessed, bool* added) {
    return FindOrInsertFrom(Slot(key), key, now, accessed, added);
  }

  // FindOrInsertUninitialized, probing from `pos`: the key's home slot, or
  // the free slot FindOrFreeSlot reported for it (entries added since may
  // have filled it — a repeat of this key among them — so the probe goes on
  // from there).
  int64_t FindOrInsertFrom(uint64_t pos, int64_t key, int64_t now, bool accessed, bool* added) {
    while (true) {
      const int32_t e = index_[pos];
      if (e < 0) break;
      if (keys_[e] == key) {
        *added = false;
        return e;
      }
      pos = (pos + 1) & mask_;
    }
    *added = true;
    const int64_t e = AppendAt(pos, key);
    timestamps_[e] = now;
    frequencies_[e] = accessed ? 1 : 0;
    return e;
  }

  void InitializeEntry(int64_t e) {
    InitializeRow(config_.initializer, keys_[e], dim(), MutableRow(e));
  }

  bool Remove(int64_t key) {
    const int64_t e = Find(key);
    if (e < 0) return false;
    RemoveEntry(e);
    return true;
  }

  // Exchanges the entries (rows, keys, metadata, index) with `other`'s; the
  // configuration, clock and eviction count stay. How a table is replaced
  // whole: the new entries are built aside, then swapped in at once.
  void SwapEntries(DynamicTable& other) {
    keys_.swap(other.keys_);
    rows_.swap(other.rows_);
    timestamps_.swap(other.timestamps_);
    frequencies_.swap(other.frequencies_);
    index_.swap(other.index_);
    std::swap(mask_, other.mask_);
  }

  void Clear() {
    keys_.clear();
    rows_.clear();
    timestamps_.clear();
    frequencies_.clear();
    std::fill(index_.begin(), index_.end(), -1);
  }

  // Whether `a` goes before `b` when evicting.
  bool EvictsBefore(int64_t a, int64_t b) const {
    if (config_.eviction == Eviction::kLfu && frequencies_[a] != frequencies_[b]) {
      return frequencies_[a] < frequencies_[b];
    }
    if (timestamps_[a] != timestamps_[b]) return timestamps_[a] < timestamps_[b];
    return keys_[a] < keys_[b];
  }

 private:
  uint64_t Slot(int64_t key) const { return MixHash(static_cast<uint64_t>(key)) & mask_; }

  // Grows storage (and the index) to hold `entries` rows, never beyond the
  // row limit, doubling so growth is amortised.
  void Reserve(int64_t entries) {
    entries = std::min(entries, row_limit());
    if (entries > static_cast<int64_t>(keys_.capacity())) {
      int64_t cap = std::max<int64_t>(16, static_cast<int64_t>(keys_.capacity()));
      while (cap < entries) cap *= 2;
      cap = std::min(cap, row_limit());
      keys_.reserve(cap);
      timestamps_.reserve(cap);
      frequencies_.reserve(cap);
      rows_.reserve(static_cast<size_t>(cap * dim()));
    }
    // The index stays at most 3/4 full: with 4-byte slots that costs at most
    // 4 * 8/3 bytes per key, which keeps a full table within row bytes + 32.
    uint64_t slots = 16;
    while (3 * slots < 4 * static_cast<uint64_t>(std::max<int64_t>(entries, size()))) slots <<= 1;
    if (slots > index_.size()) Rehash(slots);
  }

  void Rehash(uint64_t slots) {
    index_.assign(slots, -1);
    mask_ = slots - 1;
    for (int64_t e = 0; e < size(); ++e) {
      uint64_t pos = Slot(keys_[e]);
      while (index_[pos] >= 0) pos = (pos + 1) & mask_;
      index_[pos] = static_cast<int32_t>(e);
    }
  }

  int64_t AppendEntry(int64_t key) {
    uint64_t pos = Slot(key);
    while (index_[pos] >= 0) pos = (pos + 1) & mask_;
    return AppendAt(pos, key);
  }

  // Appends an entry for `key` and points the free index slot `pos` at it.
  int64_t AppendAt(uint64_t pos, int64_t key) {
    const int64_t e = size();
    keys_.push_back(key);
    timestamps_.push_back(0);
    frequencies_.push_back(0);
    rows_.resize(rows_.size() + static_cast<size_t>(dim()));
    index_[pos] = static_cast<int32_t>(e);
    return e;
  }

  uint64_t SlotOfEntry(int64_t e) const {
    uint64_t pos = Slot(keys_[e]);
    while (index_[pos] != e) pos = (pos + 1) & mask_;
    return pos;
  }

  // Deletes entry e: backward-shift deletion in the index (no tombstones),
  // then the last entry moves into e's place.
  void RemoveEntry(int64_t e) {
    uint64_t hole = SlotOfEntry(e);
    uint64_t pos = (hole + 1) & mask_;
    while (index_[pos] >= 0) {
      const uint64_t home = Slot(keys_[index_[pos]]);
      // Move index_[pos] into the hole if its home is not in (hole, pos].
      const bool movable = ((pos - home) & mask_) >= ((pos - hole) & mask_);
      if (movable) {
        index_[hole] = index_[pos];
        hole = pos;
      }
      pos = (pos + 1) & mask_;
    }
    index_[hole] = -1;
    const int64_t last = size() - 1;
    if (e != last) {
      index_[SlotOfEntry(last)] = static_cast<int32_t>(e);
      keys_[e] = keys_[last];
      timestamps_[e] = timestamps_[last];
      frequencies_[e] = frequencies_[last];
      std::memcpy(MutableRow(e), Row(last), static_cast<size_t>(dim()) * sizeof(float));
    }
    keys_.pop_back();
    timestamps_.pop_back();
    frequencies_.pop_back();
    rows_.resize(rows_.size() - static_cast<size_t>(dim()));
  }

  template <typename T>
  using Array = std::vector<T, HugePageAllocator<T>>;

  TableConfig config_;
  Array<int64_t> keys_;
  Array<float> rows_;
  Array<int64_t> timestamps_;
  Array<uint32_t> frequencies_;
  Array<int32_t> index_;
  uint64_t mask_ = 0;
  int64_t now_ = 0;
  int64_t evicted_total_ = 0;
};

}  // namespace core
}  // namespace sok_graph

#endif  // SOK_GRAPH_TF_OPS_DYNAMIC_CORE_DYNAMIC_TABLE_H_
