// GPU hash table for dynamic embeddings (see dynamic_table_launcher.h for
// the semantics, which are those of tf_ops/dynamic/core/batch_ops.h): what
// its .cu files share. Each .cu file is a translation unit of its own (no
// relocatable device code), so the types, the slot layout and probing, and
// the warp and host helpers that several of them use live here, compiled
// into each file that includes them (internal linkage); the few functions
// that one part calls in another are declared at the end, each defined in
// one file:
//
//   dynamic_table_storage.cu  create, destroy, clear, size; growth (rehash)
//   dynamic_table_insert.cu   find; find-or-insert: the fast and exact paths
//   dynamic_table_evict.cu    eviction (least recently / frequently used)
//   dynamic_table_sort.cu     the stable sort of (key, value) pairs
//   dynamic_table_update.cu   scatter, import, remove
//   dynamic_table_export.cu   export
//
// Slots: keys_[S] (S = 2^k) hold a key, kEmpty or kTomb. The two keys whose
// values are the sentinels live in two side slots S and S + 1, flagged in
// side_[2], so every int64 is a valid key. Timestamp and use count of a key
// sit at its slot's index in ts_ and freq_ (S + 2 entries each); its row at
// the same index of the row storage, or, in a pooled table, wherever the
// slot -> row map says (RowSpace below). Free slots keep timestamp 0 and
// count 0, so a claimed slot starts clean.
#ifndef SOK_GRAPH_TF_OPS_DYNAMIC_KERNELS_DYNAMIC_TABLE_INTERNAL_CUH_
#define SOK_GRAPH_TF_OPS_DYNAMIC_KERNELS_DYNAMIC_TABLE_INTERNAL_CUH_

#include <algorithm>
#include <climits>
#include <cstdint>

#include <cuda_runtime.h>

#include "tf_ops/common/cuda_helpers.cuh"
#include "tf_ops/util/core/hash_mix.h"
#include "tf_ops/dynamic/kernels/dynamic_table_launcher.h"

namespace sok_graph {
namespace gpu_table {

constexpr int64_t kEmpty = INT64_MIN;
constexpr int64_t kTomb = INT64_MIN + 1;
constexpr unsigned kFull = 0xffffffffu;
constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 8;
constexpr int kThreads = kWarp * kWarpsPerBlock;
// An unbounded GPU table stays at most half full: 2^30 slots hold 2^29 rows
// (the CPU table's bound, core::DynamicTable::kMaxEntries, is 2^30 - 1).
constexpr int64_t kUnboundedRows = SOK_GPU_TABLE_MAX_UNBOUNDED_ROWS;

// A pooled table's fixed rows (DevTable::pool_rows).
constexpr int32_t kSinkRow = 2;
constexpr int32_t kFirstPoolRow = 3;

// Device counters, one int64 each.
enum Counter { kSize = 0, kOcc, kDistinct, kNew, kCand, kFail, kNumCounters };

// The seeded initializer's parameters, from the table's config (the rows
// themselves: WarpInitRow, dynamic_table_insert.cu).
struct DevInit {
  int kind;
  float mean, stddev, minval, maxval, value;
  uint64_t seed_mix;  // draw::SeedMix(seed): the part shared by all keys
};

// ---------------------------------------------------------------------------
// Slots.

// Row storage: physical rows [0, split) at `near` (device memory), the rest
// at `far` (mapped pinned host memory, which the kernels read and write
// directly). A plain buffer is all `near`. Without `loc` slot s owns row s.
// With `loc`, each slot reaches its row through the map, in one of two ways:
//   - tiered (an unbounded table with both tiers): one row per slot, `loc`
//     a permutation of them;
//   - pooled (a bounded table given a device-memory budget, SOK's hybrid):
//     max_rows + 3 rows however many slots the index has, a live slot's row
//     taken from a stack of free rows when its key is inserted and given
//     back when the key goes (TakeRow, GiveRow); a free slot's entry is -1.
//     An index keeps at most 3/4 of its slots occupied, so one row per slot
//     would be 1.3-2.7 rows per key: the pool is what lets a table whose
//     rows are larger than the GPU's memory keep max_rows rows, no more.
// dynamic_table_tiers.cu changes the map to keep the most used rows in
// device memory. Every kernel reaches a slot's row through Row(), so only
// the insert, removal, rehash and tier code know rows move.
struct RowSpace {
  float* near;
  float* far;
  int64_t split;
  int32_t* loc;  // [slots + 2] or null
  __device__ __forceinline__ float* Phys(int64_t r, int dim) const {
    return r < split ? near + r * dim : far + (r - split) * dim;
  }
  __device__ __forceinline__ float* Row(int64_t s, int dim) const {
    return Phys(loc != nullptr ? static_cast<int64_t>(loc[s]) : s, dim);
  }
};

__host__ __device__ inline RowSpace Plain(float* p) {
  return RowSpace{p, nullptr, INT64_MAX, nullptr};
}

__host__ __device__ inline RowSpace Plain(const float* p) {
  return Plain(const_cast<float*>(p));
}

struct DevTable {
  int64_t* keys;  // [S]
  RowSpace rows;  // [S + 2] rows of dim, or [pool_rows] when pooled
  int64_t* ts;    // [S + 2]
  unsigned long long* freq;  // [S + 2]
  int* side;      // [2]: whether kEmpty / kTomb (as keys) are present
  uint64_t mask;  // S - 1
  int64_t slots;  // S
  int dim;
  // Pooled rows (RowSpace): 0 when rows are per slot. The free rows are
  // free_rows[0, *free_top); the stack's top is taken (popped) by inserts
  // and given back (pushed) by removals and evictions, never both in one
  // kernel. The side slots own rows 0 and 1 for good (a sentinel key's
  // removal only clears its flag, as without a pool); row 2 is the sink of
  // TakeRow; rows 3.. are the pool proper (max_rows of them). A rehash moves
  // the map's entries, not the rows: the fresh index shares rows and stack.
  int64_t pool_rows;
  int32_t* free_rows;  // [pool_rows]
  long long* free_top;  // device [1]
};

namespace {

// The CPU table's slot hash (tf_ops/util/core/hash_mix.h), so both tables
// lay keys out alike.
__device__ __forceinline__ uint64_t Hash(int64_t key) {
  return sok_graph::core::MixHash(static_cast<uint64_t>(key));
}

__device__ __forceinline__ int SideOf(int64_t key) {
  return key == kEmpty ? 0 : (key == kTomb ? 1 : -1);
}

__device__ __forceinline__ int64_t LoadKey(const int64_t* p) {
  return *reinterpret_cast<const volatile long long*>(p);
}

__device__ __forceinline__ bool SlotLive(const DevTable& t, int64_t s) {
  if (s < t.slots) {
    const int64_t k = t.keys[s];
    return k != kEmpty && k != kTomb;
  }
  return t.side[s - t.slots] != 0;
}

__device__ __forceinline__ int64_t SlotKey(const DevTable& t, int64_t s) {
  return s < t.slots ? t.keys[s] : (s == t.slots ? kEmpty : kTomb);
}

// The slot of `key`, or -1. Read-only calls only (no concurrent inserts).
__device__ inline int64_t FindSlot(const DevTable& t, int64_t key) {
  const int side = SideOf(key);
  if (side >= 0) return t.side[side] ? t.slots + side : -1;
  uint64_t pos = Hash(key) & t.mask;
  for (uint64_t step = 0; step <= t.mask; ++step) {
    const int64_t k = t.keys[pos];
    if (k == key) return static_cast<int64_t>(pos);
    if (k == kEmpty) return -1;
    pos = (pos + 1) & t.mask;
  }
  return -1;
}

// The slot of `key`, claiming an empty one if it is missing (*claimed).
// Safe against other threads of the same kernel doing the same: keys only
// go from kEmpty to a key here, and compare-and-swap settles every race.
// Tombstones are skipped, never claimed, since the key may sit beyond one.
// Returns -1 if no empty slot exists (the host keeps that from happening).
__device__ inline int64_t FindOrClaimSlot(const DevTable& t, int64_t key, bool* claimed) {
  *claimed = false;
  const int side = SideOf(key);
  if (side >= 0) {
    *claimed = atomicCAS(t.side + side, 0, 1) == 0;
    return t.slots + side;
  }
  uint64_t pos = Hash(key) & t.mask;
  for (uint64_t step = 0; step <= t.mask; ++step) {
    int64_t k = LoadKey(t.keys + pos);
    if (k == kEmpty) {
      k = static_cast<int64_t>(atomicCAS(reinterpret_cast<unsigned long long*>(t.keys + pos),
                                         static_cast<unsigned long long>(kEmpty),
                                         static_cast<unsigned long long>(key)));
      if (k == kEmpty) {
        *claimed = true;
        return static_cast<int64_t>(pos);
      }
    }
    if (k == key) return static_cast<int64_t>(pos);
    pos = (pos + 1) & t.mask;
  }
  return -1;
}

// Inserts a key known to be absent (and distinct among the concurrent
// inserts), taking the first tombstone or empty slot of its probe sequence.
// *from_empty: whether the slot was empty (occupancy grows) or a tombstone.
__device__ inline int64_t InsertAbsent(const DevTable& t, int64_t key, bool* from_empty) {
  *from_empty = false;
  const int side = SideOf(key);
  if (side >= 0) {
    t.side[side] = 1;
    return t.slots + side;
  }
  uint64_t pos = Hash(key) & t.mask;
  for (uint64_t step = 0; step <= t.mask; ++step) {
    const int64_t k = LoadKey(t.keys + pos);
    if (k == kEmpty || k == kTomb) {
      const int64_t old = static_cast<int64_t>(
          atomicCAS(reinterpret_cast<unsigned long long*>(t.keys + pos),
                    static_cast<unsigned long long>(k), static_cast<unsigned long long>(key)));
      if (old == k) {
        *from_empty = k == kEmpty;
        return static_cast<int64_t>(pos);
      }
    }
    pos = (pos + 1) & t.mask;
  }
  return -1;
}

__device__ __forceinline__ void AddCounter(long long* counter, long long v) {
  atomicAdd(reinterpret_cast<unsigned long long*>(counter), static_cast<unsigned long long>(v));
}

// A pooled table's main slot s, just claimed, takes a free row (a side slot
// keeps its own; a table without a pool has its row already). The host's
// bound on keys keeps the pool from running dry; if it did, the slot gets
// the pool's sink row (written, never read as anyone's) and the call a
// failure, which the host reports as a full table.
__device__ __forceinline__ void TakeRow(const DevTable& t, int64_t s, long long* counters) {
  if (t.pool_rows == 0 || s >= t.slots) return;
  const long long top = static_cast<long long>(atomicAdd(
      reinterpret_cast<unsigned long long*>(t.free_top), static_cast<unsigned long long>(-1LL)));
  if (top <= 0) {
    AddCounter(t.free_top, 1);
    AddCounter(counters + kFail, 1);
    t.rows.loc[s] = kSinkRow;
    return;
  }
  t.rows.loc[s] = t.free_rows[top - 1];
}

// A pooled table's main slot s, whose key is gone, gives its row back.
__device__ __forceinline__ void GiveRow(const DevTable& t, int64_t s) {
  if (t.pool_rows == 0 || s >= t.slots) return;
  const int32_t r = t.rows.loc[s];
  if (r < kFirstPoolRow) return;  // the sink is nobody's to give
  t.rows.loc[s] = -1;
  const long long top = static_cast<long long>(
      atomicAdd(reinterpret_cast<unsigned long long*>(t.free_top), 1ULL));
  t.free_rows[top] = r;
}

// Adds a warp's count to a device counter with one atomic.
__device__ __forceinline__ void WarpCount(bool pred, long long* counter, int lane) {
  const int c = __popc(__ballot_sync(kFull, pred));
  if (lane == 0 && c) atomicAdd(reinterpret_cast<unsigned long long*>(counter),
                                static_cast<unsigned long long>(c));
}

// Copies 32 rows, one named by each lane: src row `src` of `from` (or
// `fallback`, or zeros, when src < 0) to row `dst` of `to` (skipped when
// dst < 0). The lanes of the warp cover the rows together (16-byte accesses
// when kVec: both spaces' bases 16-byte aligned), several loads in flight
// before the stores.
template <bool kVec>
__device__ void WarpCopyRows(RowSpace from, int64_t src, RowSpace to, int64_t dst, int dim,
                             const float* __restrict__ fallback, int lane) {
  if (kVec) {
    const int chunks = dim >> 2;
    const float4* fb4 = reinterpret_cast<const float4*>(fallback);
    if (chunks <= kWarp && (kWarp % chunks) == 0) {
      const int per = kWarp / chunks;  // rows per pass
      const int sub = lane / chunks, c = lane % chunks;
      constexpr int kUnroll = 4;
      for (int p0 = 0; p0 < kWarp; p0 += per * kUnroll) {
        float4 v[kUnroll];
        int64_t d[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          // p passes 31 only for rows per pass > 8; every lane shuffles.
          const int p = p0 + u * per + sub;
          const int64_t s = __shfl_sync(kFull, src, p & (kWarp - 1));
          d[u] = __shfl_sync(kFull, dst, p & (kWarp - 1));
          if (p >= kWarp) d[u] = -1;
          v[u] = make_float4(0.f, 0.f, 0.f, 0.f);
          if (d[u] >= 0) {
            if (s >= 0) {
              v[u] = reinterpret_cast<const float4*>(from.Row(s, dim))[c];
            } else if (fb4) {
              v[u] = fb4[c];
            }
          }
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          if (d[u] >= 0) reinterpret_cast<float4*>(to.Row(d[u], dim))[c] = v[u];
        }
      }
    } else {
      for (int p = 0; p < kWarp; ++p) {
        const int64_t s = __shfl_sync(kFull, src, p);
        const int64_t d = __shfl_sync(kFull, dst, p);
        if (d < 0) continue;
        const float4* f4 = s >= 0 ? reinterpret_cast<const float4*>(from.Row(s, dim)) : nullptr;
        float4* t4 = reinterpret_cast<float4*>(to.Row(d, dim));
        for (int c = lane; c < chunks; c += kWarp) {
          t4[c] = f4 ? f4[c] : (fb4 ? fb4[c] : make_float4(0.f, 0.f, 0.f, 0.f));
        }
      }
    }
  } else {
    for (int p = 0; p < kWarp; ++p) {
      const int64_t s = __shfl_sync(kFull, src, p);
      const int64_t d = __shfl_sync(kFull, dst, p);
      if (d < 0) continue;
      const float* f = s >= 0 ? from.Row(s, dim) : nullptr;
      float* t = to.Row(d, dim);
      for (int c = lane; c < dim; c += kWarp) {
        t[c] = f ? f[c] : (fallback ? fallback[c] : 0.0f);
      }
    }
  }
}

// Kernels below give each warp 32 consecutive items (positions or slots):
// lane l owns item base + l, and every lane stays to the end, so the warp can
// cooperate on rows.
__device__ __forceinline__ bool WarpTile(int64_t n, int64_t* base, int* lane) {
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  *lane = static_cast<int>(threadIdx.x % kWarp);
  *base = warp * kWarp;
  return *base < n;
}

inline unsigned BlocksFor(int64_t items) {
  return static_cast<unsigned>((items + kThreads - 1) / kThreads);
}

}  // namespace
}  // namespace gpu_table
}  // namespace sok_graph

// ---------------------------------------------------------------------------
// Host side.

struct SokGpuTable {
  SokGpuTableConfig config;
  SokGpuAllocator allocator{};  // all device memory below comes from it
  // Rows kept in device memory (config.hbm_bytes over a row's bytes; < 0:
  // all); the rest of a table's rows live in mapped host memory.
  int64_t near_rows = -1;
  sok_graph::gpu_table::DevInit init;
  int64_t row_limit = 0;
  sok_graph::gpu_table::DevTable dev{};
  long long* counters = nullptr;       // device [kNumCounters]
  long long* host_counters = nullptr;  // pinned copy
  // Upper bounds on the size and on occupied main slots (live + tombstones),
  // kept without waiting for the device; exact after Sync().
  int64_t size_ub = 0, occ_ub = 0;
  // Whether size_ub is the size itself: after Sync() and after the exact
  // path (which knows what it inserted and evicted), not after the fast
  // path or a remove, which change the size on the device only.
  bool size_exact = true;
  int64_t evicted_total = 0;
  // Calls that may have taken keys out (evictions, removes, clears): keys
  // made present while it stays the same are still present.
  int64_t removals = 0;
  // Scratch, grown on demand.
  int64_t scratch_n = 0;
  int64_t *slot_of = nullptr, *buf_a = nullptr, *buf_b = nullptr, *buf_c = nullptr,
          *buf_d = nullptr;
  uint8_t* flags8 = nullptr;
  int64_t slot_scratch_n = 0;
  int64_t *slot_a = nullptr, *slot_b = nullptr, *slot_c = nullptr, *slot_d = nullptr;
  // Tiered rows (dynamic_table_tiers.cu): training lookups since the last
  // pass that moved the most used rows into device memory, and that pass's
  // device scratch, allocated with the table (TierScratch) so that a pass
  // neither allocates nor waits: use-count histograms and counters, and
  // the slots to promote and to demote (tier_cap each).
  int64_t tier_calls = 0;
  int64_t tier_cap = 0;
  long long* tier_scratch = nullptr;
  int64_t *tier_promote = nullptr, *tier_demote = nullptr;
  int32_t* tier_owner = nullptr;  // a pooled table's row -> owner [pool_rows]
  void* cub_temp = nullptr;
  size_t cub_bytes = 0;
};

namespace sok_graph {
namespace gpu_table {
namespace {

inline cudaStream_t StreamOf(void* s) { return static_cast<cudaStream_t>(s); }

inline bool VecOk(int dim, const void* p) {
  return dim % 4 == 0 && (reinterpret_cast<uintptr_t>(p) % 16) == 0;
}

using sok_graph::cuda::Grid;

inline int64_t MaxOccupied(int64_t slots) { return slots / 2 + slots / 4; }

// Slots for `keys` at most half full (so that a table keeps room to grow).
inline int64_t SlotsFor(int64_t keys) {
  int64_t s = 64;
  while (s < 2 * keys) s *= 2;
  return s;
}

// The slots of a bounded table at its bound: `row_limit` keys at most 3/4
// full (between 4/3 and 8/3 slots a key). It never has more.
inline int64_t BoundSlots(int64_t row_limit) {
  int64_t s = 64;
  while (MaxOccupied(s) < row_limit) s *= 2;
  return s;
}

// The slots a table of `slots` grows to, to hold `keys` keys: half full as
// it grows (every table starts at its init_capacity), a bounded table
// (`bounded`, keys <= row_limit) no further than its bound's slots, where
// it stays at most 3/4 full and evicts instead.
inline int64_t GrownSlots(int64_t slots, int64_t keys, bool bounded, int64_t row_limit) {
  int64_t want = SlotsFor(keys);
  if (bounded) want = std::min(want, BoundSlots(row_limit));
  slots = std::max(slots, want);
  while (MaxOccupied(slots) < keys) slots *= 2;
  return slots;
}

// Device memory through the table's allocator (SokGpuAllocator).
inline int AllocBytes(const SokGpuAllocator& a, void** p, size_t bytes) {
  if (a.alloc == nullptr) return static_cast<int>(cudaMalloc(p, bytes));
  *p = a.alloc(a.context, bytes);
  return *p != nullptr ? 0 : static_cast<int>(cudaErrorMemoryAllocation);
}

template <typename T>
int Alloc(const SokGpuAllocator& a, T** p, int64_t count) {
  *p = nullptr;
  if (count <= 0) return 0;
  return AllocBytes(a, reinterpret_cast<void**>(p), sizeof(T) * count);
}

template <typename T>
void Free(const SokGpuAllocator& a, T** p) {
  if (*p) {
    if (a.free == nullptr) {
      cudaFree(*p);
    } else {
      a.free(a.context, *p);
    }
  }
  *p = nullptr;
}

// The index of a table: keys, slot -> row map, timestamps and counts.
inline void FreeIndex(const SokGpuAllocator& a, DevTable* t) {
  Free(a, &t->keys);
  Free(a, &t->rows.loc);
  Free(a, &t->ts);
  Free(a, &t->freq);
}

// The index and the rows (which a pooled table's rehash keeps).
inline void FreeTable(const SokGpuAllocator& a, DevTable* t) {
  FreeIndex(a, t);
  Free(a, &t->rows.near);
  if (t->rows.far) cudaFreeHost(t->rows.far);
  t->rows.far = nullptr;
  Free(a, &t->free_rows);
  Free(a, &t->free_top);
}

// An index replaced by a rehash (or a fresh one not used): with its rows,
// unless the rows are a pool that the other index keeps.
inline void FreeReplaced(const SokGpuAllocator& a, DevTable* t) {
  if (t->pool_rows > 0) {
    FreeIndex(a, t);
  } else {
    FreeTable(a, t);
  }
}

inline int Sync(SokGpuTable* t, cudaStream_t s) {
  SOK_CUDA(cudaMemcpyAsync(t->host_counters, t->counters, sizeof(long long) * kNumCounters,
                           cudaMemcpyDeviceToHost, s));
  SOK_CUDA(cudaStreamSynchronize(s));
  if (t->host_counters[kFail] != 0) return SOK_GPU_TABLE_FULL;
  t->size_ub = t->host_counters[kSize];
  t->occ_ub = t->host_counters[kOcc];
  t->size_exact = true;
  return 0;
}

// The per-key scratch of a call, and the per-slot scratch, freed.
inline void FreeScratch(SokGpuTable* t) {
  Free(t->allocator, &t->slot_of);
  Free(t->allocator, &t->buf_a);
  Free(t->allocator, &t->buf_b);
  Free(t->allocator, &t->buf_c);
  Free(t->allocator, &t->buf_d);
  Free(t->allocator, &t->flags8);
  t->scratch_n = 0;
}

inline void FreeSlotScratch(SokGpuTable* t) {
  Free(t->allocator, &t->slot_a);
  Free(t->allocator, &t->slot_b);
  Free(t->allocator, &t->slot_c);
  Free(t->allocator, &t->slot_d);
  t->slot_scratch_n = 0;
}

inline int EnsureScratch(SokGpuTable* t, int64_t n) {
  if (n <= t->scratch_n) return 0;
  SOK_CUDA(cudaDeviceSynchronize());  // earlier calls may still use the old buffers
  const int64_t m = std::max<int64_t>(n, 2 * t->scratch_n);
  FreeScratch(t);
  int rc = Alloc(t->allocator, &t->slot_of, m);
  if (!rc) rc = Alloc(t->allocator, &t->buf_a, m);
  if (!rc) rc = Alloc(t->allocator, &t->buf_b, m);
  if (!rc) rc = Alloc(t->allocator, &t->buf_c, m);
  if (!rc) rc = Alloc(t->allocator, &t->buf_d, m);
  if (!rc) rc = Alloc(t->allocator, &t->flags8, m);
  if (!rc) t->scratch_n = m;
  return rc;
}

// Scratch of one entry per slot (eviction candidates, export).
inline int EnsureSlotScratch(SokGpuTable* t) {
  const int64_t n = t->dev.slots + 2;
  if (n <= t->slot_scratch_n) return 0;
  SOK_CUDA(cudaDeviceSynchronize());
  FreeSlotScratch(t);
  int rc = Alloc(t->allocator, &t->slot_a, n);
  if (!rc) rc = Alloc(t->allocator, &t->slot_b, n);
  if (!rc) rc = Alloc(t->allocator, &t->slot_c, n);
  if (!rc) rc = Alloc(t->allocator, &t->slot_d, n);
  if (!rc) t->slot_scratch_n = n;
  return rc;
}

inline int EnsureCubTemp(SokGpuTable* t, size_t bytes) {
  if (bytes <= t->cub_bytes) return 0;
  SOK_CUDA(cudaDeviceSynchronize());
  Free(t->allocator, reinterpret_cast<char**>(&t->cub_temp));
  t->cub_bytes = 0;
  SOK_CUDA(static_cast<cudaError_t>(AllocBytes(t->allocator, &t->cub_temp, bytes)));
  t->cub_bytes = bytes;
  return 0;
}

inline bool BadTable(const SokGpuTable* t) { return t == nullptr || t->dev.keys == nullptr; }

}  // namespace

// Entry points of one part that another part calls.

// dynamic_table_sort.cu: the stable sort of (key, value) pairs.
int SortPairs(SokGpuTable* t, const int64_t* keys_in, int64_t* keys_out, const int64_t* vals_in,
              int64_t* vals_out, int64_t n, int end_bit, cudaStream_t s);

// dynamic_table_storage.cu: a fresh index (AllocFresh), every key moved
// into it (MoveInto); Rehash does both.
int AllocFresh(SokGpuTable* t, int64_t slots, DevTable* fresh);
int MoveInto(SokGpuTable* t, DevTable fresh, cudaStream_t s);
int Rehash(SokGpuTable* t, int64_t slots, cudaStream_t s);

// dynamic_table_evict.cu: evicts `excess` keys not used at `now`.
int Evict(SokGpuTable* t, int64_t excess, int64_t now, int64_t* evicted_keys, float* evicted_rows,
          cudaStream_t s);

// dynamic_table_tiers.cu: every kTierPeriod training lookups of a table
// with rows in both tiers, moves its most used rows into device memory
// (force: now, whatever the count).
int MaybeRebalance(SokGpuTable* t, bool force, cudaStream_t s);
// The pass's scratch for a table whose rows may come to be in both tiers
// (a device-memory budget of rows > 0), at creation; freed by FreeTierScratch.
int AllocTierScratch(SokGpuTable* t);
void FreeTierScratch(SokGpuTable* t);

// dynamic_table_insert.cu: makes every batch key present (t->slot_of).
int Ensure(SokGpuTable* t, const int64_t* keys, int64_t n, int64_t now, bool accessed,
           bool initialize, float* out, int64_t* evicted_keys, float* evicted_rows,
           SokGpuTableResult* result, cudaStream_t s);

}  // namespace gpu_table
}  // namespace sok_graph

#endif  // SOK_GRAPH_TF_OPS_DYNAMIC_KERNELS_DYNAMIC_TABLE_INTERNAL_CUH_
