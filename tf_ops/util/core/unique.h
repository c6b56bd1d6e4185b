// Unique keys in order of first appearance (the order tf.unique uses), with
// the inverse mapping and optional counts. TF-independent; C++14.
#ifndef SOK_GRAPH_TF_OPS_UTIL_CORE_UNIQUE_H_
#define SOK_GRAPH_TF_OPS_UTIL_CORE_UNIQUE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tf_ops/util/core/hash_mix.h"

namespace sok_graph {
namespace core {

// Gives each distinct key a dense index 0, 1, 2, ... in order of first
// appearance. Open addressing with linear probing over a power-of-two table
// kept at most half full, storing key and index side by side so a probe
// touches one cache line.
template <typename K>
class FirstOccurrenceIndex {
 public:
  explicit FirstOccurrenceIndex(int64_t expected_keys) {
    Rehash(CapacityFor(expected_keys));
    keys_.reserve(static_cast<size_t>(expected_keys > 0 ? expected_keys : 0));
  }

  // Returns the index of `key`, giving it the next free index if it is new.
  int64_t Insert(K key) {
    if (2 * (static_cast<uint64_t>(keys_.size()) + 1) > mask_ + 1) {
      Rehash(2 * (mask_ + 1));
    }
    uint64_t pos = MixHash(static_cast<uint64_t>(key)) & mask_;
    while (true) {
      Slot& slot = slots_[pos];
      if (slot.index < 0) {
        slot.key = key;
        slot.index = static_cast<int64_t>(keys_.size());
        keys_.push_back(key);
        return slot.index;
      }
      if (slot.key == key) return slot.index;
      pos = (pos + 1) & mask_;
    }
  }

  int64_t size() const { return static_cast<int64_t>(keys_.size()); }
  // The distinct keys, in index order.
  const std::vector<K>& keys() const { return keys_; }
  std::vector<K>& mutable_keys() { return keys_; }

 private:
  struct Slot {
    K key;
    int64_t index;
  };

  static uint64_t CapacityFor(int64_t keys) {
    uint64_t cap = 16;
    while (cap < 2 * static_cast<uint64_t>(keys > 0 ? keys : 0)) cap <<= 1;
    return cap;
  }

  void Rehash(uint64_t capacity) {
    std::vector<Slot> old;
    old.swap(slots_);
    slots_.assign(capacity, Slot{K(), -1});
    mask_ = capacity - 1;
    for (const Slot& s : old) {
      if (s.index < 0) continue;
      uint64_t pos = MixHash(static_cast<uint64_t>(s.key)) & mask_;
      while (slots_[pos].index >= 0) pos = (pos + 1) & mask_;
      slots_[pos] = s;
    }
  }

  std::vector<Slot> slots_;
  std::vector<K> keys_;
  uint64_t mask_ = 0;
};

// unique <- distinct keys in order of first appearance; inverse[i] <- index
// of keys[i] in unique; counts (if given) <- occurrences of each unique key.
template <typename K, typename I>
void UniqueWithInverse(const K* keys, int64_t n, std::vector<K>* unique, I* inverse,
                       std::vector<I>* counts) {
  FirstOccurrenceIndex<K> index(n);
  for (int64_t i = 0; i < n; ++i) inverse[i] = static_cast<I>(index.Insert(keys[i]));
  unique->swap(index.mutable_keys());
  if (counts != nullptr) {
    counts->assign(unique->size(), I(0));
    for (int64_t i = 0; i < n; ++i) ++(*counts)[static_cast<size_t>(inverse[i])];
  }
}

// UniqueWithInverse for keys that should lie in [0, range), without
// hashing: `slot_of` (at least `range` entries, all zero on entry) maps a key
// to its index + 1 and is all zero again on return, so a caller can keep one
// such buffer per thread and reuse it. Same results as UniqueWithInverse,
// with one direct memory access per key instead of a hash probe. Returns -1,
// or the first position whose key is outside [0, range) (then `unique` and
// `inverse` are incomplete).
template <typename K, typename I>
int64_t UniqueWithInverseInRange(const K* keys, int64_t n, int64_t range, int32_t* slot_of,
                                 std::vector<K>* unique, I* inverse) {
  unique->clear();
  int64_t bad = -1;
  constexpr int64_t kAhead = 16;  // slot_of is read at random: fetch ahead
  for (int64_t i = 0; i < n; ++i) {
    const int64_t key = static_cast<int64_t>(keys[i]);
    if (key < 0 || key >= range) {
      bad = i;
      break;
    }
    if (i + kAhead < n) {
      const uint64_t ahead = static_cast<uint64_t>(keys[i + kAhead]);
      if (ahead < static_cast<uint64_t>(range)) __builtin_prefetch(slot_of + ahead, 1, 3);
    }
    int32_t& slot = slot_of[key];
    if (slot == 0) {
      unique->push_back(keys[i]);
      slot = static_cast<int32_t>(unique->size());
    }
    inverse[i] = static_cast<I>(slot - 1);
  }
  for (K key : *unique) slot_of[static_cast<size_t>(key)] = 0;
  return bad;
}

}  // namespace core
}  // namespace sok_graph

#endif  // SOK_GRAPH_TF_OPS_UTIL_CORE_UNIQUE_H_
