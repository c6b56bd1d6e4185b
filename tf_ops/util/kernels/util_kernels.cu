// CUDA kernels of the util family: unique-with-counts (by hashing) and a
// deterministic unsorted segment sum (see util_launcher.h), which groups
// equal ids with a stable radix sort of (id, position) pairs, so that a
// segment's rows are added in position order as on the CPU.
#include <algorithm>
#include <climits>
#include <cstdint>

#include <cub/cub.cuh>
#include <cuda_runtime.h>

#include "tf_ops/common/cuda_helpers.cuh"
#include "tf_ops/util/core/segment_sum.h"
#include "tf_ops/util/kernels/util_launcher.h"

namespace {

using sok_graph::cuda::Align;
using sok_graph::cuda::Grid;
using sok_graph::core::kSegmentPiece;

int BitsFor(int64_t max_value) {
  int bits = 1;
  while (bits < 63 && (int64_t{1} << bits) <= max_value) ++bits;
  return bits;
}

// Carves aligned pieces out of one scratch block; with base == nullptr it
// only adds up the size.
class Carver {
 public:
  explicit Carver(void* base) : base_(static_cast<char*>(base)) {}
  template <typename T>
  T* Take(int64_t count) {
    T* p = base_ ? reinterpret_cast<T*>(base_ + used_) : nullptr;
    used_ += Align(sizeof(T) * static_cast<size_t>(count > 0 ? count : 1));
    return p;
  }
  size_t used() const { return used_; }

 private:
  char* base_;
  size_t used_ = 0;
};


// ---------------------------------------------------------------------------
// Unique with counts, by hashing: every key is put in an open-addressing
// set of at least 2n slots (linear probing; a new key claims an empty slot
// by compare-and-swap), and each slot keeps its key's first position
// (atomicMin) and count (atomicAdd). A flag at every first position and a
// prefix sum over the flags rank the keys in order of first appearance.
// Four passes over the keys and a fill of the slots, where a sort needed a
// pass per 8 key bits (8 for int64): a batch of many repeated keys — a
// dense layer's inputs, a hot feature — costs little more than reading it.
// Which key wins a contested slot varies from run to run, but no output
// depends on it: ranks, counts and first positions are integers.
//
// A caller that expects few distinct keys (an op that saw its last batch)
// may give a smaller set: clearing 2n slots is the largest single cost of
// a batch of 8M keys with 8192 distinct ones (256 MB), and a small set stays
// in the L2 cache. A key that finds the set more than half full, or no free
// slot, marks the call as overflowed: the outputs are then not written and
// *num_unique is -1, for the caller to call again with the full set.

// A slot: its key, and the first position and count of that key, side by
// side so that a key new to the set costs one sector of memory, not three.
template <typename K>
struct HashSlot {
  K key;
  int32_t first;
  int32_t count;
};

// Positions and slots are 32-bit (n < 2^30, so 2n rounded up to a power of
// two, plus the side slot, fits); half the bytes of int64 in every pass.
constexpr int64_t kMaxUniqueKeys = int64_t{1} << 30;

// The key that marks an empty slot; a key equal to it lives in the side
// slot (index `slots`) instead.
template <typename K>
struct EmptyKeyOf;
template <>
struct EmptyKeyOf<int64_t> {
  static constexpr int64_t value = LLONG_MIN;
};
template <>
struct EmptyKeyOf<int32_t> {
  static constexpr int32_t value = INT_MIN;
};
template <typename K>
__device__ __forceinline__ K EmptyKey() {
  return EmptyKeyOf<K>::value;
}

__device__ __forceinline__ uint64_t MixBits(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

__device__ __forceinline__ int64_t SwapIfEmpty(int64_t* at, int64_t empty, int64_t key) {
  return static_cast<int64_t>(atomicCAS(reinterpret_cast<unsigned long long*>(at),
                                        static_cast<unsigned long long>(empty),
                                        static_cast<unsigned long long>(key)));
}
__device__ __forceinline__ int32_t SwapIfEmpty(int32_t* at, int32_t empty, int32_t key) {
  return atomicCAS(at, empty, key);
}

// slot_of of a key that found no slot (an overflowed call; also lanes past
// the end inside HashInsert).
constexpr uint32_t kNoSlot = 0xffffffffu;

// Claims of a bounded set: [0] slots claimed, [1] overflowed (0 or 1).
template <typename K>
__global__ void ClearSlots(HashSlot<K>* __restrict__ slot, int64_t slots,
                           uint32_t* __restrict__ claims) {
  SOK_FOR_EACH(i, slots + 1) {
    slot[i] = HashSlot<K>{EmptyKey<K>(), INT_MAX, 0};
    if (i < 2) claims[i] = 0;
  }
}

// slot_of[p] <- the slot of x[p], claimed if new; the slot's first position
// and count (kCount) are updated once per warp for the lanes that share it
// (a hot key appears many times in a warp). Without counts a warp whose
// keys were all seen before changes nothing: a batch of few distinct keys
// (8M keys of 8192, DemoModel-style) then inserts without an atomic.
// kBounded: a set smaller than 2n (see above): claims are counted, and a
// probe sequence ends after visiting every slot. The count is added once
// per block at the end, not once per claim: a million claims of a batch on
// one counter were a million atomics on one address, taken one at a time.
// Past half full the set still works (fuller, slower probes, bounded by
// the probe limit), and the overflow flag then sends the batch to the full
// set, as before.
template <typename K, bool kCount, bool kBounded>
__global__ void HashInsert(const K* __restrict__ x, int64_t n, HashSlot<K>* set, uint32_t mask,
                           uint32_t* __restrict__ slot_of, uint32_t* __restrict__ claims) {
  const int lane = threadIdx.x & 31;
  uint32_t claimed_here = 0;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  for (int64_t base = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32 * 32;
       base < n; base += warps * 32) {
    const int64_t p = base + lane;
    uint32_t slot = kNoSlot;  // lanes past the end share no slot
    if (p < n) {
      const K k = x[p];
      if (k == EmptyKey<K>()) {
        slot = mask + 1;
      } else {
        uint32_t h = static_cast<uint32_t>(MixBits(static_cast<uint64_t>(k))) & mask;
        for (uint32_t probes = 0;; ++probes) {
          if (kBounded && probes > mask) {  // every slot visited: none left
            claims[1] = 1;
            h = kNoSlot;
            break;
          }
          // A plain (cacheable) load: a slot's key changes once, from
          // empty, and a stale empty only costs a compare-and-swap that
          // returns the key. A batch of few hot keys then reads them from
          // L1 instead of L2.
          const K seen = set[h].key;
          if (seen == k) break;
          if (seen == EmptyKey<K>()) {
            const K prev = SwapIfEmpty(&set[h].key, EmptyKey<K>(), k);
            if (prev == EmptyKey<K>()) {
              if (kBounded) ++claimed_here;
              break;
            }
            if (prev == k) break;
          }
          h = (h + 1) & mask;  // an unbounded set is at most half full: ends
        }
        slot = h;
      }
      slot_of[p] = slot;
    }
    const unsigned peers = __match_any_sync(0xffffffffu, slot);
    // The lowest lane of a group holds its smallest position.
    if (p < n && slot != kNoSlot && lane == __ffs(peers) - 1) {
      if (kCount) atomicAdd(&set[slot].count, __popc(peers));
      // Plain load as well: `first` only decreases, so a stale value is
      // larger and costs at most an atomicMin that changes nothing.
      if (static_cast<int32_t>(p) < set[slot].first) {
        atomicMin(&set[slot].first, static_cast<int32_t>(p));
      }
    }
  }
  if (kBounded) {
    // Every thread of the block is past its loop here.
    __shared__ uint32_t block_claims;
    if (threadIdx.x == 0) block_claims = 0;
    __syncthreads();
    for (int offset = 16; offset > 0; offset /= 2) {
      claimed_here += __shfl_down_sync(0xffffffffu, claimed_here, offset);
    }
    if (lane == 0 && claimed_here != 0) atomicAdd(&block_claims, claimed_here);
    __syncthreads();
    if (threadIdx.x == 0 && block_claims != 0 &&
        atomicAdd(claims, block_claims) + block_claims > (mask + 1) / 2) {
      claims[1] = 1;
    }
  }
}

template <typename K>
__global__ void FirstFlags(const uint32_t* __restrict__ slot_of,
                           const HashSlot<K>* __restrict__ set, int64_t n,
                           int32_t* __restrict__ flag) {
  SOK_FOR_EACH(p, n) {
    const uint32_t slot = slot_of[p];
    flag[p] = slot != kNoSlot && set[slot].first == static_cast<int32_t>(p) ? 1 : 0;
  }
}

// rank[p]: first positions at or before p (the prefix sum of the flags).
// (The side slot's key was never written: it is EmptyKey, its key.)
template <typename K, typename I>
__global__ void HashUniqueOut(int64_t n, const uint32_t* __restrict__ slot_of,
                              const HashSlot<K>* __restrict__ set,
                              const int32_t* __restrict__ rank, K* __restrict__ y,
                              I* __restrict__ idx, I* __restrict__ count_out,
                              int64_t* __restrict__ num_unique,
                              const uint32_t* __restrict__ claims) {
  if (claims[1] != 0) {  // overflowed: nothing is written but the sign
    if (blockIdx.x == 0 && threadIdx.x == 0) *num_unique = -1;
    return;
  }
  SOK_FOR_EACH(p, n) {
    const HashSlot<K> slot = set[slot_of[p]];
    const int32_t k = rank[slot.first] - 1;
    idx[p] = static_cast<I>(k);
    if (slot.first == static_cast<int32_t>(p)) {
      y[k] = slot.key;
      if (count_out != nullptr) count_out[k] = static_cast<I>(slot.count);
    }
    if (p == n - 1) *num_unique = rank[p];
  }
}

// Ranking by slots. A bounded set much smaller than the batch (an op's hint
// from its last batch: few distinct keys, the DemoModel's 8192 of 8.2M) is
// ranked by a stable sort of its slots by first position, slots + 1 items,
// instead of a flag per position and a prefix sum over n; each position's
// output is then one read of its slot's rank (L2-resident), not of its
// slot and then of the rank at the slot's first position (random over n).
// Empty slots sort last, under the key n (no position reaches it).
template <typename K>
__global__ void SlotFirsts(const HashSlot<K>* __restrict__ set, int64_t items,
                           int32_t empty_first, int32_t* __restrict__ first,
                           int32_t* __restrict__ slot_index) {
  SOK_FOR_EACH(i, items) {
    const int32_t f = set[i].first;
    first[i] = f == INT_MAX ? empty_first : f;
    slot_index[i] = static_cast<int32_t>(i);
  }
}

// From the sorted slots: each occupied slot's rank, the distinct keys (and
// counts) in order of first appearance, and their number (the index of the
// first empty slot in sorted order).
template <typename K, typename I>
__global__ void SlotRanks(const int32_t* __restrict__ sorted_first,
                          const int32_t* __restrict__ sorted_slot, int64_t items,
                          int32_t empty_first, const HashSlot<K>* __restrict__ set,
                          int32_t* __restrict__ slot_rank, K* __restrict__ y,
                          I* __restrict__ count_out, int64_t* __restrict__ num_unique,
                          const uint32_t* __restrict__ claims) {
  if (claims[1] != 0) {  // overflowed: nothing is written but the sign
    if (blockIdx.x == 0 && threadIdx.x == 0) *num_unique = -1;
    return;
  }
  SOK_FOR_EACH(i, items) {
    if (sorted_first[i] == empty_first) {
      if (i == 0 || sorted_first[i - 1] != empty_first) *num_unique = i;
      continue;
    }
    const int32_t slot = sorted_slot[i];
    slot_rank[slot] = static_cast<int32_t>(i);
    y[i] = set[slot].key;  // the side slot's key is EmptyKey, its key
    if (count_out != nullptr) count_out[i] = static_cast<I>(set[slot].count);
    if (i == items - 1) *num_unique = items;
  }
}

template <typename I>
__global__ void SlotRankOut(int64_t n, const uint32_t* __restrict__ slot_of,
                            const int32_t* __restrict__ slot_rank, I* __restrict__ idx,
                            const uint32_t* __restrict__ claims) {
  if (claims[1] != 0) return;
  SOK_FOR_EACH(p, n) idx[p] = static_cast<I>(slot_rank[slot_of[p]]);
}

// set_slots: 0 for the full set (2n slots or more), else a power of two of
// at least 64 (a smaller one is not bounded: it is the full set).
template <typename K, typename I>
int UniqueWithCounts(const K* x, int64_t n, int64_t set_slots, K* y, I* idx, I* count,
                     int64_t* num_unique, void* temp, size_t* temp_bytes, cudaStream_t s) {
  if (n < 0 || n >= kMaxUniqueKeys) return static_cast<int>(cudaErrorInvalidValue);
  if (set_slots < 0 || (set_slots > 0 && (set_slots < 64 || (set_slots & (set_slots - 1)) != 0))) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  int64_t slots = 64;
  while (slots < 2 * n) slots *= 2;
  const bool bounded = set_slots > 0 && set_slots < slots;
  if (bounded) slots = set_slots;
  const int num = static_cast<int>(n);
  // Ranked by slots (above) when sorting the set's slots + 1 items costs
  // well under the two passes over n positions it replaces.
  const int64_t items = slots + 1;
  const bool by_slots = bounded && items * 8 <= n;
  const int first_bits = BitsFor(n);
  size_t cub_bytes = 0;
  if (by_slots) {
    SOK_CUDA(cub::DeviceRadixSort::SortPairs(
        nullptr, cub_bytes, static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
        static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
        static_cast<int>(items), 0, first_bits, s));
  } else {
    SOK_CUDA(cub::DeviceScan::InclusiveSum(nullptr, cub_bytes, static_cast<int32_t*>(nullptr),
                                           static_cast<int32_t*>(nullptr), num, s));
  }
  Carver c(temp);
  HashSlot<K>* set = c.Take<HashSlot<K>>(slots + 1);
  uint32_t* claims = c.Take<uint32_t>(2);
  uint32_t* slot_of = c.Take<uint32_t>(n);
  // Per position: the flags of first appearance and their prefix sum. Or
  // per slot: its first position and number, both before and after the
  // sort, and its rank.
  int32_t* flag = by_slots ? nullptr : c.Take<int32_t>(n);
  int32_t* rank = by_slots ? nullptr : c.Take<int32_t>(n);
  int32_t* first = by_slots ? c.Take<int32_t>(items) : nullptr;
  int32_t* slot_index = by_slots ? c.Take<int32_t>(items) : nullptr;
  int32_t* sorted_first = by_slots ? c.Take<int32_t>(items) : nullptr;
  int32_t* sorted_slot = by_slots ? c.Take<int32_t>(items) : nullptr;
  int32_t* slot_rank = by_slots ? c.Take<int32_t>(items) : nullptr;
  void* cub_temp = c.Take<char>(static_cast<int64_t>(cub_bytes));
  if (temp == nullptr) {
    *temp_bytes = c.used();
    return 0;
  }
  if (*temp_bytes < c.used()) return static_cast<int>(cudaErrorInvalidValue);
  if (n == 0) return static_cast<int>(cudaMemsetAsync(num_unique, 0, sizeof(int64_t), s));
  ClearSlots<K><<<Grid(slots + 1), 256, 0, s>>>(set, slots, claims);
  const uint32_t mask = static_cast<uint32_t>(slots - 1);
  if (count != nullptr) {
    if (bounded) {
      HashInsert<K, true, true><<<Grid(n), 256, 0, s>>>(x, n, set, mask, slot_of, claims);
    } else {
      HashInsert<K, true, false><<<Grid(n), 256, 0, s>>>(x, n, set, mask, slot_of, claims);
    }
  } else if (bounded) {
    HashInsert<K, false, true><<<Grid(n), 256, 0, s>>>(x, n, set, mask, slot_of, claims);
  } else {
    HashInsert<K, false, false><<<Grid(n), 256, 0, s>>>(x, n, set, mask, slot_of, claims);
  }
  if (by_slots) {
    const int32_t empty_first = static_cast<int32_t>(n);
    SlotFirsts<K><<<Grid(items), 256, 0, s>>>(set, items, empty_first, first, slot_index);
    size_t bytes = cub_bytes;
    SOK_CUDA(cub::DeviceRadixSort::SortPairs(cub_temp, bytes, first, sorted_first, slot_index,
                                             sorted_slot, static_cast<int>(items), 0,
                                             first_bits, s));
    SlotRanks<K, I><<<Grid(items), 256, 0, s>>>(sorted_first, sorted_slot, items, empty_first,
                                                set, slot_rank, y, count, num_unique, claims);
    SlotRankOut<I><<<Grid(n), 256, 0, s>>>(n, slot_of, slot_rank, idx, claims);
    return static_cast<int>(cudaGetLastError());
  }
  FirstFlags<K><<<Grid(n), 256, 0, s>>>(slot_of, set, n, flag);
  size_t bytes = cub_bytes;
  SOK_CUDA(cub::DeviceScan::InclusiveSum(cub_temp, bytes, flag, rank, num, s));
  HashUniqueOut<K, I><<<Grid(n), 256, 0, s>>>(n, slot_of, set, rank, y, idx, count,
                                              num_unique, claims);
  return static_cast<int>(cudaGetLastError());
}

// ---------------------------------------------------------------------------
// Unsorted segment sum.

// Sort key of each position: its segment, or num_segments (sorted last and
// never summed) for dropped (negative) and bad (too large) ids; keys and
// positions are int32 (the caller keeps n and num_segments + 1 within
// INT_MAX), half the bytes the sort moves with int64; pos[i] = i, the
// values the sort carries. first_bad, if not null, receives the smallest
// position of an id >= num_segments.
template <typename I>
__global__ void SegmentKeys(const I* __restrict__ ids, int64_t n, int64_t num_segments,
                            int32_t* __restrict__ keys, int32_t* __restrict__ pos,
                            unsigned long long* first_bad) {
  SOK_FOR_EACH(i, n) {
    pos[i] = static_cast<int32_t>(i);
    const int64_t id = static_cast<int64_t>(ids[i]);
    if (id >= num_segments && first_bad != nullptr) {
      atomicMin(first_bad, static_cast<unsigned long long>(i));
    }
    keys[i] = static_cast<int32_t>((id < 0 || id >= num_segments) ? num_segments : id);
  }
}

// Only the check of SegmentKeys, for a sum with nothing to add.
template <typename I>
__global__ void CheckSegmentIds(const I* __restrict__ ids, int64_t n, int64_t num_segments,
                                unsigned long long* first_bad) {
  SOK_FOR_EACH(i, n) {
    if (static_cast<int64_t>(ids[i]) >= num_segments) {
      atomicMin(first_bad, static_cast<unsigned long long>(i));
    }
  }
}

// start[s] = first sorted index whose segment is >= s, for s in [0, num_segments].
__global__ void SegmentStarts(const int32_t* __restrict__ sorted, int64_t n,
                              int64_t num_segments, int64_t* __restrict__ start) {
  SOK_FOR_EACH(s, num_segments + 1) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (sorted[mid] < s) lo = mid + 1; else hi = mid;
    }
    start[s] = lo;
  }
}

// A long segment is summed in pieces of kSegmentPiece sorted positions
// (tf_ops/util/core/segment_sum.h: the CPU kernel adds in the same
// association, so both give the same bits). pieces[s] is the number of
// pieces of segment s when it has more than one, else 0; an exclusive scan
// of it numbers the pieces.
__global__ void SegmentPieces(const int64_t* __restrict__ start, int64_t num_segments,
                              int64_t* __restrict__ pieces) {
  SOK_FOR_EACH(s, num_segments) {
    const int64_t len = start[s + 1] - start[s];
    pieces[s] = len > kSegmentPiece ? (len + kSegmentPiece - 1) / kSegmentPiece : 0;
  }
}

// Columns are added V at a time (float4 loads where the rows allow: a
// row of 16 floats is then four loads a thread, not sixteen threads' one),
// each column still its own float32 sum in position order, so V does not
// change a bit of the result.
template <int V> struct Lanes;
template <> struct Lanes<1> {
  using T = float;
  __device__ static T Zero() { return 0.0f; }
  __device__ static void Add(T& acc, T v) { acc += v; }
};
template <> struct Lanes<4> {
  using T = float4;
  __device__ static T Zero() { return make_float4(0.0f, 0.0f, 0.0f, 0.0f); }
  __device__ static void Add(T& acc, T v) {
    acc.x += v.x;
    acc.y += v.y;
    acc.z += v.z;
    acc.w += v.w;
  }
};

// data[order[k] * width + col] added for k in [first, last) in that order,
// the association the CPU kernel uses (width and col in units of V floats).
// The loads are issued kBatch at a time before their adds: one thread adds
// up to a piece's 1024 rows, and with the compiler's four loads in flight a
// Zipf stream's hot keys made the sum wait on a memory latency per four
// rows while most of the GPU idled (bench/hash_path_bench.py on an H200,
// 8.2M rows of 16 floats into 1M keys: 0.92 ms with four, 0.85 with 16,
// 0.80 with 32 single floats). A batch past `last` is predicated, not
// left to a loop of one load at a time: most segments of a Zipf stream are
// shorter than a batch, and their rows then came one latency each.
template <int V, int kBatch>
__device__ __forceinline__ typename Lanes<V>::T SumInOrder(
    const typename Lanes<V>::T* __restrict__ data, const int32_t* __restrict__ order,
    int64_t first, int64_t last, int64_t width, int64_t col) {
  using L = Lanes<V>;
  typename L::T acc = L::Zero();
  for (int64_t k = first; k < last; k += kBatch) {
    const int64_t count = last - k;
    int32_t at[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) at[j] = j < count ? __ldg(order + k + j) : 0;
    typename L::T v[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      v[j] = j < count ? __ldg(data + int64_t{at[j]} * width + col) : L::Zero();
    }
    // Only the rows that exist are added: adding a zero would turn a sum of
    // -0.0 into +0.0.
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      if (j < count) L::Add(acc, v[j]);
    }
  }
  return acc;
}

// The same for rows [first, last) of data: a long segment's piece sums.
template <int V, int kBatch>
__device__ __forceinline__ typename Lanes<V>::T SumRowsInOrder(
    const typename Lanes<V>::T* __restrict__ data, int64_t first, int64_t last, int64_t width,
    int64_t col) {
  using L = Lanes<V>;
  typename L::T acc = L::Zero();
  int64_t k = first;
  for (; k + kBatch <= last; k += kBatch) {
    typename L::T v[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) v[j] = __ldg(data + (k + j) * width + col);
#pragma unroll
    for (int j = 0; j < kBatch; ++j) L::Add(acc, v[j]);
  }
  for (; k < last; ++k) L::Add(acc, data[k * width + col]);
  return acc;
}

// The segment of piece `piece` (< piece_start[num_segments]): the last s
// with piece_start[s] <= piece.
__device__ __forceinline__ int64_t SegmentOfPiece(const int64_t* __restrict__ piece_start,
                                                  int64_t num_segments, int64_t piece) {
  int64_t lo = 0, hi = num_segments;
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (piece_start[mid] <= piece) lo = mid; else hi = mid;
  }
  return lo;
}

// The piece sums of the long segments, one thread per (piece, column), and
// the short segments' sums, one thread per (segment, VS columns), in one
// launch: its first `piece_blocks` blocks take the pieces, the rest the
// short segments. The pieces are few and each thread adds up to 1024 rows
// in order, a chain of memory latencies that kept a launch of their own
// at a sixth of the GPU's warps while the short segments waited behind it
// (bench/RESULTS.md); side by side the short segments fill the GPU
// meanwhile. A long segment's piece sums are added by SumLongSegments
// after it. Each sum keeps its association, so the bits do not change.
// max_pieces bounds the pieces (at most 2n / kSegmentPiece); widths are in
// floats for the pieces and in units of VS floats for the segments.
template <int VS, int kBatchS>
__global__ void SumPiecesAndShortSegments(
    const float* __restrict__ data, const int32_t* __restrict__ order,
    const int64_t* __restrict__ start, const int64_t* __restrict__ piece_start,
    int64_t num_segments, int64_t max_pieces, int64_t width, unsigned piece_blocks,
    float* __restrict__ partial, typename Lanes<VS>::T* __restrict__ out) {
  if (blockIdx.x < piece_blocks) {
    const int64_t total = piece_start[num_segments];
    const int64_t stride = static_cast<int64_t>(piece_blocks) * blockDim.x;
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
         i < max_pieces * width; i += stride) {
      const int64_t piece = i / width;
      if (piece >= total) break;  // i only grows
      const int64_t col = i - piece * width;
      const int64_t lo = SegmentOfPiece(piece_start, num_segments, piece);
      const int64_t first = start[lo] + (piece - piece_start[lo]) * kSegmentPiece;
      const int64_t end = first + kSegmentPiece;
      const int64_t last = end < start[lo + 1] ? end : start[lo + 1];
      partial[i] = SumInOrder<1, 32>(data, order, first, last, width, col);
    }
    return;
  }
  using T = typename Lanes<VS>::T;
  const int64_t lanes = width / VS;
  const int64_t stride = static_cast<int64_t>(gridDim.x - piece_blocks) * blockDim.x;
  for (int64_t i = (blockIdx.x - piece_blocks) * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < num_segments * lanes; i += stride) {
    const int64_t seg = i / lanes;
    if (piece_start[seg + 1] > piece_start[seg]) continue;  // a long one: SumLongSegments
    out[i] = SumInOrder<VS, kBatchS>(reinterpret_cast<const T*>(data), order, start[seg],
                                     start[seg + 1], lanes, i - seg * lanes);
  }
}

// A long segment's piece sums added in order, by the threads of its first
// piece (one per column): threads over the pieces, not over every segment,
// so a stream of many short segments (uniform keys) pays nothing here.
// width: in floats (the pieces' partial sums are a float per column).
__global__ void SumLongSegments(const float* __restrict__ partial,
                                const int64_t* __restrict__ piece_start, int64_t num_segments,
                                int64_t max_pieces, int64_t width, float* __restrict__ out) {
  const int64_t total = piece_start[num_segments];
  SOK_FOR_EACH(i, max_pieces * width) {
    const int64_t piece = i / width;
    if (piece >= total) break;  // i only grows
    const int64_t seg = SegmentOfPiece(piece_start, num_segments, piece);
    if (piece != piece_start[seg]) continue;
    const int64_t col = i - piece * width;
    out[seg * width + col] =
        SumRowsInOrder<1, 32>(partial, piece_start[seg], piece_start[seg + 1], width, col);
  }
}

// Both kernels above for a sum whose rows are VS floats' multiples.
template <int VS, int kBatchS>
void LaunchSums(const float* data, const int32_t* order, const int64_t* start,
                const int64_t* piece_start, float* partial, int64_t num_segments,
                int64_t max_pieces, int64_t width, bool has_pieces, float* out,
                cudaStream_t s) {
  using T = typename Lanes<VS>::T;
  const unsigned piece_blocks = has_pieces ? Grid(max_pieces * width) : 0;
  const unsigned segment_blocks = Grid(num_segments * (width / VS));
  SumPiecesAndShortSegments<VS, kBatchS><<<piece_blocks + segment_blocks, 256, 0, s>>>(
      data, order, start, piece_start, num_segments, max_pieces, width, piece_blocks, partial,
      reinterpret_cast<T*>(out));
  if (has_pieces) {
    SumLongSegments<<<piece_blocks, 256, 0, s>>>(partial, piece_start, num_segments,
                                                 max_pieces, width, out);
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <typename I>
int SegmentSum(const float* data, const I* ids, int64_t n, int64_t width, int64_t num_segments,
               float* out, int64_t* first_bad, void* temp, size_t* temp_bytes, cudaStream_t s) {
  if (n > INT_MAX || num_segments < 0 || width < 0) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  unsigned long long* bad = reinterpret_cast<unsigned long long*>(first_bad);
  const bool summing = num_segments > 0 && width > 0;
  if (summing && num_segments + 1 > INT_MAX) return static_cast<int>(cudaErrorInvalidValue);
  const int num = static_cast<int>(n);
  // Pieces of segments longer than one piece: at most n / kSegmentPiece
  // whole pieces plus one partial piece per such segment.
  const int64_t max_pieces = 2 * (n / kSegmentPiece) + 1;
  size_t sort_bytes = 0, scan_bytes = 0;
  if (summing) {
    SOK_CUDA(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, static_cast<int32_t*>(nullptr),
                                             static_cast<int32_t*>(nullptr),
                                             static_cast<const int32_t*>(nullptr),
                                             static_cast<int32_t*>(nullptr), num, 0,
                                             BitsFor(num_segments), s));
    SOK_CUDA(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, static_cast<int64_t*>(nullptr),
                                           static_cast<int64_t*>(nullptr),
                                           static_cast<int>(num_segments + 1), s));
  }
  // Scratch only when there is something to sum (none for the 2^60 empty
  // segments a zero-width call may ask for).
  const int64_t rows = summing ? n : 0, segs = summing ? num_segments + 1 : 0;
  Carver c(temp);
  int32_t* keys = c.Take<int32_t>(rows);
  int32_t* pos = c.Take<int32_t>(rows);
  int32_t* sorted = c.Take<int32_t>(rows);
  int32_t* order = c.Take<int32_t>(rows);
  int64_t* start = c.Take<int64_t>(segs);
  int64_t* pieces = c.Take<int64_t>(segs);
  int64_t* piece_start = c.Take<int64_t>(segs);
  float* partial = c.Take<float>(summing ? max_pieces * width : 0);
  void* cub_temp = c.Take<char>(static_cast<int64_t>(std::max(sort_bytes, scan_bytes)));
  if (temp == nullptr) {
    *temp_bytes = c.used();
    return 0;
  }
  if (*temp_bytes < c.used()) return static_cast<int>(cudaErrorInvalidValue);
  if (!summing) {
    if (n > 0 && bad != nullptr) {
      CheckSegmentIds<I><<<Grid(n), 256, 0, s>>>(ids, n, num_segments, bad);
    }
    return static_cast<int>(cudaGetLastError());
  }
  if (n > 0) {
    SegmentKeys<I><<<Grid(n), 256, 0, s>>>(ids, n, num_segments, keys, pos, bad);
    size_t bytes = sort_bytes;
    SOK_CUDA(cub::DeviceRadixSort::SortPairs(cub_temp, bytes, keys, sorted, pos, order, num, 0,
                                             BitsFor(num_segments), s));
  }
  SegmentStarts<<<Grid(num_segments + 1), 256, 0, s>>>(sorted, n, num_segments, start);
  SegmentPieces<<<Grid(num_segments), 256, 0, s>>>(start, num_segments, pieces);
  SOK_CUDA(cudaMemsetAsync(pieces + num_segments, 0, sizeof(int64_t), s));
  size_t bytes = scan_bytes;
  SOK_CUDA(cub::DeviceScan::ExclusiveSum(cub_temp, bytes, pieces, piece_start,
                                         static_cast<int>(num_segments + 1), s));
  // Pieces a column a thread (four columns a thread, with fewer threads,
  // had fewer loads in flight: Zipf 0.79 -> 0.97 ms), short segments four
  // columns a thread where the rows allow (uniform keys: 1.26 -> 0.97 ms),
  // in predicated batches of four rows (a Zipf stream's sum 0.79 -> 0.73
  // ms on an H200; batches of 8 and 16 held registers its short segments
  // did not fill); both in one launch (Zipf 0.77 -> 0.71 ms, the Bazel
  // build on an H200).
  const bool has_pieces = n > kSegmentPiece;
  if (width % 4 == 0 && Aligned16(data) && Aligned16(out)) {
    LaunchSums<4, 4>(data, order, start, piece_start, partial, num_segments, max_pieces, width,
                     has_pieces, out, s);
  } else {
    LaunchSums<1, 32>(data, order, start, piece_start, partial, num_segments, max_pieces, width,
                      has_pieces, out, s);
  }
  return static_cast<int>(cudaGetLastError());
}

__device__ __forceinline__ int64_t GroupOf(int64_t value, int64_t groups) {
  const int64_t g = value % groups;
  return g < 0 ? g + groups : g;
}

__global__ void GroupSizes(const int64_t* __restrict__ y, const int64_t* __restrict__ num,
                           int64_t n, int64_t groups, unsigned long long* sizes) {
  const int64_t count = *num < n ? *num : n;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    atomicAdd(sizes + GroupOf(y[i], groups), 1ull);
  }
}

// GroupSizes for few groups: each block counts into shared memory and adds
// its counts once. With a few dozen groups (the tables of a grouped
// exchange) every thread of the global version adds to the same few
// counters: 70 us for 200k values on an H200, in the wait of the unique
// that counts them.
__global__ void GroupSizesShared(const int64_t* __restrict__ y, const int64_t* __restrict__ num,
                                 int64_t n, int groups, unsigned long long* sizes) {
  extern __shared__ unsigned int block_sizes[];
  for (int g = threadIdx.x; g < groups; g += blockDim.x) block_sizes[g] = 0;
  __syncthreads();
  const int64_t count = *num < n ? *num : n;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    atomicAdd(block_sizes + GroupOf(y[i], groups), 1u);
  }
  __syncthreads();
  for (int g = threadIdx.x; g < groups; g += blockDim.x) {
    if (block_sizes[g] != 0) atomicAdd(sizes + g, static_cast<unsigned long long>(block_sizes[g]));
  }
}

// y[i] <- value past the *num distinct values a unique wrote (its padding).
__global__ void PadPastCount(int64_t* __restrict__ y, const int64_t* __restrict__ num, int64_t n,
                             int64_t value) {
  const int64_t count = *num < 0 ? 0 : *num;
  for (int64_t i = count + blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = value;
  }
}

constexpr int64_t kSharedGroupLimit = 8192;  // 32 KiB of shared counters

}  // namespace

#define SOK_EXPORT extern "C" __attribute__((visibility("default")))

SOK_EXPORT int sok_unique_group_sizes_i64(const int64_t* y, const int64_t* num_unique, int64_t n,
                                          int64_t groups, int64_t* sizes, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  SOK_CUDA(cudaMemsetAsync(sizes, 0, sizeof(int64_t) * groups, s));
  if (n > 0 && groups <= kSharedGroupLimit) {
    // At most 512 blocks: each adds its counts to the global ones once.
    const unsigned blocks = Grid(n) < 512 ? Grid(n) : 512;
    GroupSizesShared<<<blocks, 256, sizeof(unsigned int) * groups, s>>>(
        y, num_unique, n, static_cast<int>(groups),
        reinterpret_cast<unsigned long long*>(sizes));
  } else if (n > 0) {
    GroupSizes<<<Grid(n), 256, 0, s>>>(y, num_unique, n, groups,
                                       reinterpret_cast<unsigned long long*>(sizes));
  }
  return static_cast<int>(cudaGetLastError());
}

// sok_unique_set_slots_after, for callers outside C++ (bench/hash_path_bench.py).
SOK_EXPORT int64_t sok_unique_set_slots_hint(int64_t last, int64_t n) {
  return sok_unique_set_slots_after(last, n);
}

SOK_EXPORT int sok_unique_pad_i64(int64_t* y, const int64_t* num_unique, int64_t n,
                                  int64_t value, void* stream) {
  if (n > 0) {
    const unsigned blocks = Grid(n) < 1024 ? Grid(n) : 1024;
    PadPastCount<<<blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(y, num_unique, n, value);
  }
  return static_cast<int>(cudaGetLastError());
}

#define SOK_UNIQUE(NAME, IN_SET, K, I)                                                       \
  SOK_EXPORT int NAME(const K* x, int64_t n, K* y, I* idx, I* count, int64_t* num_unique,    \
                      void* temp, size_t* temp_bytes, void* stream) {                        \
    return UniqueWithCounts<K, I>(x, n, 0, y, idx, count, num_unique, temp, temp_bytes,      \
                                  static_cast<cudaStream_t>(stream));                        \
  }                                                                                          \
  SOK_EXPORT int IN_SET(const K* x, int64_t n, int64_t set_slots, K* y, I* idx, I* count,    \
                        int64_t* num_unique, void* temp, size_t* temp_bytes, void* stream) { \
    return UniqueWithCounts<K, I>(x, n, set_slots, y, idx, count, num_unique, temp,          \
                                  temp_bytes, static_cast<cudaStream_t>(stream));            \
  }
SOK_UNIQUE(sok_unique_with_counts_i64_i32, sok_unique_in_set_i64_i32, int64_t, int32_t)
SOK_UNIQUE(sok_unique_with_counts_i64_i64, sok_unique_in_set_i64_i64, int64_t, int64_t)
SOK_UNIQUE(sok_unique_with_counts_i32_i32, sok_unique_in_set_i32_i32, int32_t, int32_t)
SOK_UNIQUE(sok_unique_with_counts_i32_i64, sok_unique_in_set_i32_i64, int32_t, int64_t)
#undef SOK_UNIQUE

SOK_EXPORT int sok_unsorted_segment_sum_f32_i32(const float* data, const int32_t* segment_ids,
                                                int64_t n, int64_t width, int64_t num_segments,
                                                float* out, int64_t* first_bad, void* temp,
                                                size_t* temp_bytes, void* stream) {
  return SegmentSum<int32_t>(data, segment_ids, n, width, num_segments, out, first_bad, temp,
                             temp_bytes, static_cast<cudaStream_t>(stream));
}

SOK_EXPORT int sok_unsorted_segment_sum_f32_i64(const float* data, const int64_t* segment_ids,
                                                int64_t n, int64_t width, int64_t num_segments,
                                                float* out, int64_t* first_bad, void* temp,
                                                size_t* temp_bytes, void* stream) {
  return SegmentSum<int64_t>(data, segment_ids, n, width, num_segments, out, first_bad, temp,
                             temp_bytes, static_cast<cudaStream_t>(stream));
}
