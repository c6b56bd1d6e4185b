// GPU hash table for dynamic embeddings (see dynamic_table_launcher.h for
// the semantics, which are those of tf_ops/dynamic/core/batch_ops.h).
//
// Slots: keys_[S] (S = 2^k) hold a key, kEmpty or kTomb. The two keys whose
// values are the sentinels live in two side slots S and S + 1, flagged in
// side_[2], so every int64 is a valid key. Row, timestamp and use count of a
// key sit at its slot's index in rows_, ts_ and freq_ (S + 2 entries each).
// Free slots keep timestamp 0 and count 0, so a claimed slot starts clean.
//
// A call that inserts runs one of two paths:
//   fast: the host's upper bounds on keys and occupied slots show there is
//     room without evicting. One kernel probes each key and claims an empty
//     slot with compare-and-swap when it is missing; the claiming lane's warp
//     writes the new row. Keys repeated in the batch find the claimed slot.
//   exact (a bound may be hit): read the counts, find which batch keys are
//     missing, count distinct keys (sorting the batch), fail before changing
//     anything if they cannot fit, touch the present keys, evict the oldest /
//     least used of the rest, then insert the distinct missing keys (reusing
//     tombstones).
#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <new>

#include <cub/cub.cuh>
#include <cuda_runtime.h>

#include "tf_ops/common/cuda_helpers.cuh"
#include "tf_ops/util/core/hash_mix.h"
#include "tf_ops/dynamic/core/random_draws.h"
#include "tf_ops/dynamic/kernels/dynamic_table_launcher.h"

namespace {

constexpr int64_t kEmpty = INT64_MIN;
constexpr int64_t kTomb = INT64_MIN + 1;
constexpr unsigned kFull = 0xffffffffu;
constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 8;
constexpr int kThreads = kWarp * kWarpsPerBlock;
// An unbounded GPU table stays at most half full: 2^30 slots hold 2^29 rows
// (the CPU table's bound, core::DynamicTable::kMaxEntries, is 2^30 - 1).
constexpr int64_t kUnboundedRows = SOK_GPU_TABLE_MAX_UNBOUNDED_ROWS;

// Device counters, one int64 each.
enum Counter { kSize = 0, kOcc, kDistinct, kNew, kCand, kFail, kNumCounters };

// ---------------------------------------------------------------------------
// The seeded initializer: core/random_draws.h, the code the CPU table's
// core/initializer.h draws with, so rows are bit-identical to the CPU's:
// correctly rounded operations only (explicit __fadd_rn-style intrinsics,
// never fused) and no transcendental library function.

struct DevInit {
  int kind;
  float mean, stddev, minval, maxval, value;
  uint64_t seed_mix;  // draw::SeedMix(seed): the part shared by all keys
};

// Writes the initial row of `key` to dst (and dst2 when not null), the warp
// working together; every lane calls it with the same arguments.
__device__ void WarpInitRow(const DevInit& in, int64_t key, int dim, float* __restrict__ dst,
                            float* __restrict__ dst2, int lane) {
  namespace draw = sok_graph::core::draw;
  const uint64_t seed_key = in.seed_mix ^ draw::KeyMix(key);
  switch (in.kind) {
    case SOK_INIT_ZEROS:
    case SOK_INIT_CONSTANT: {
      const float v = in.kind == SOK_INIT_ZEROS ? 0.0f : in.value;
      for (int d = lane; d < dim; d += kWarp) {
        dst[d] = v;
        if (dst2) dst2[d] = v;
      }
      return;
    }
    case SOK_INIT_UNIFORM: {
      const float span = __fsub_rn(in.maxval, in.minval);
      for (int d = lane; d < dim; d += kWarp) {
        const double u = draw::UniformOpen(seed_key, static_cast<uint64_t>(d));
        float v = static_cast<float>(
            draw::DAdd(static_cast<double>(in.minval), draw::DMul(static_cast<double>(span), u)));
        if (v >= in.maxval && in.maxval > in.minval) v = nextafterf(in.maxval, in.minval);
        dst[d] = v;
        if (dst2) dst2[d] = v;
      }
      return;
    }
    case SOK_INIT_NORMAL: {
      // Lane p draws pair p: values 2p and 2p + 1.
      for (int p = lane; 2 * p < dim; p += kWarp) {
        float z0, z1;
        draw::NormalPair(draw::DrawBits(seed_key, static_cast<uint64_t>(p)), &z0, &z1);
        const float a = draw::Affine(in.mean, in.stddev, z0);
        dst[2 * p] = a;
        if (dst2) dst2[2 * p] = a;
        if (2 * p + 1 < dim) {
          const float b = draw::Affine(in.mean, in.stddev, z1);
          dst[2 * p + 1] = b;
          if (dst2) dst2[2 * p + 1] = b;
        }
      }
      return;
    }
    case SOK_INIT_TRUNCATED_NORMAL: {
      // Draws beyond two standard deviations are redrawn with draws that
      // continue past dim, in column order: the lanes draw a chunk of columns
      // at once, then the few redraws run one column at a time, in order.
      uint64_t counter = static_cast<uint64_t>(dim);
      for (int d0 = 0; d0 < dim; d0 += kWarp) {
        const int d = d0 + lane;
        float z = d < dim ? draw::NormalDraw(seed_key, static_cast<uint64_t>(d)) : 0.0f;
        unsigned bad = __ballot_sync(kFull, fabsf(z) > 2.0f);
        while (bad) {
          const int l = __ffs(bad) - 1;
          bad &= bad - 1;
          if (lane == l) {
            while (fabsf(z) > 2.0f) z = draw::NormalDraw(seed_key, counter++);
          }
          counter = __shfl_sync(kFull, counter, l);
        }
        if (d < dim) {
          const float v = draw::Affine(in.mean, in.stddev, z);
          dst[d] = v;
          if (dst2) dst2[d] = v;
        }
      }
      return;
    }
  }
}

// ---------------------------------------------------------------------------
// Slots.

// Row storage addressed by row number: rows [0, split) at `near` (device
// memory), the rest at `far` (mapped pinned host memory, which the kernels
// read and write directly). A plain buffer is all `near`.
struct RowSpace {
  float* near;
  float* far;
  int64_t split;
  __device__ __forceinline__ float* Row(int64_t r, int dim) const {
    return r < split ? near + r * dim : far + (r - split) * dim;
  }
};

__host__ __device__ inline RowSpace Plain(float* p) {
  return RowSpace{p, nullptr, INT64_MAX};
}

__host__ __device__ inline RowSpace Plain(const float* p) {
  return Plain(const_cast<float*>(p));
}

struct DevTable {
  int64_t* keys;  // [S]
  RowSpace rows;  // [S + 2] rows of dim
  int64_t* ts;    // [S + 2]
  unsigned long long* freq;  // [S + 2]
  int* side;      // [2]: whether kEmpty / kTomb (as keys) are present
  uint64_t mask;  // S - 1
  int64_t slots;  // S
  int dim;
};

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
__device__ int64_t FindSlot(const DevTable& t, int64_t key) {
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
__device__ int64_t FindOrClaimSlot(const DevTable& t, int64_t key, bool* claimed) {
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
__device__ int64_t InsertAbsent(const DevTable& t, int64_t key, bool* from_empty) {
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

// ---------------------------------------------------------------------------
// Kernels.

__global__ void FillKernel(DevTable t) {
  const int64_t total = t.slots + 2;
  for (int64_t s = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; s < total;
       s += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (s < t.slots) t.keys[s] = kEmpty;
    t.ts[s] = 0;
    t.freq[s] = 0;
  }
}

template <bool kVec>
__global__ void FindKernel(DevTable t, const int64_t* __restrict__ keys, int64_t n,
                           const float* __restrict__ default_row, float* __restrict__ out,
                           uint8_t* __restrict__ found) {
  int64_t base;
  int lane;
  if (!WarpTile(n, &base, &lane)) return;
  const int64_t i = base + lane;
  int64_t slot = -1;
  if (i < n) {
    slot = FindSlot(t, keys[i]);
    if (found) found[i] = slot >= 0;
  }
  WarpCopyRows<kVec>(t.rows, slot, Plain(out), i < n ? i : -1, t.dim, default_row, lane);
}

// The fast path of every inserting call: slot_of[i] <- slot of keys[i],
// claiming missing keys. is_new[i] marks the position that claimed its slot;
// that position's warp writes the initial row (and out[i], if out) when
// `initialize`. Every position marks its slot used at `now` and, when
// `accessed`, counts one use.
__global__ void ClaimKernel(DevTable t, const int64_t* __restrict__ keys, int64_t n, int64_t now,
                            int accessed, int initialize, DevInit init,
                            int64_t* __restrict__ slot_of, uint8_t* __restrict__ is_new,
                            float* __restrict__ out, long long* counters) {
  int64_t base;
  int lane;
  if (!WarpTile(n, &base, &lane)) return;
  const int64_t i = base + lane;
  bool claimed = false;
  int64_t key = 0, slot = -1;
  if (i < n) {
    key = keys[i];
    slot = FindOrClaimSlot(t, key, &claimed);
    slot_of[i] = slot;
    is_new[i] = claimed;
    if (slot >= 0) {
      t.ts[slot] = now;
      if (accessed) atomicAdd(t.freq + slot, 1ULL);
    }
  }
  WarpCount(i < n && slot < 0, counters + kFail, lane);
  WarpCount(claimed, counters + kSize, lane);
  WarpCount(claimed && slot < t.slots, counters + kOcc, lane);
  if (!initialize) return;
  unsigned todo = __ballot_sync(kFull, claimed);
  while (todo) {
    const int l = __ffs(todo) - 1;
    todo &= todo - 1;
    const int64_t k = __shfl_sync(kFull, key, l);
    const int64_t s = __shfl_sync(kFull, slot, l);
    WarpInitRow(init, k, t.dim, t.rows.Row(s, t.dim), out ? out + (base + l) * t.dim : nullptr,
                lane);
  }
}

// out[i] <- row of slot_of[i] for positions that did not write their row
// already (is_new[i] == 0; is_new may be null).
template <bool kVec>
__global__ void GatherKernel(DevTable t, const int64_t* __restrict__ slot_of,
                             const uint8_t* __restrict__ is_new, int64_t n,
                             float* __restrict__ out) {
  int64_t base;
  int lane;
  if (!WarpTile(n, &base, &lane)) return;
  const int64_t i = base + lane;
  const bool need = i < n && !(is_new && is_new[i]);
  WarpCopyRows<kVec>(t.rows, need ? slot_of[i] : -1, Plain(out), need ? i : -1, t.dim, nullptr,
                     lane);
}

// Exact path, step 1: slot_of[i] <- slot of keys[i] or -1 (nothing changes).
__global__ void ProbeKernel(DevTable t, const int64_t* __restrict__ keys, int64_t n,
                            int64_t* __restrict__ slot_of) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    slot_of[i] = FindSlot(t, keys[i]);
  }
}

// Scatter of keys the caller knows are present: slot_of[i] <- slot of
// keys[i], used at `now` (as the fast path marks them). A key that is
// missing after all breaks the caller's promise: it counts as a failure,
// which the next wait reports, and its row is skipped (slot -1).
__global__ void ProbePresentKernel(DevTable t, const int64_t* __restrict__ keys, int64_t n,
                                   int64_t now, int64_t* __restrict__ slot_of,
                                   long long* counters) {
  int64_t base;
  int lane;
  if (!WarpTile(n, &base, &lane)) return;
  const int64_t i = base + lane;
  int64_t slot = -1;
  if (i < n) {
    slot = FindSlot(t, keys[i]);
    slot_of[i] = slot;
    if (slot >= 0) t.ts[slot] = now;
  }
  WarpCount(i < n && slot < 0, counters + kFail, lane);
}

// The exact path's first step for distinct keys [0, *count) (a count on the
// device, at most m; a negative one: none): slot_of[i] <- slot or -1, and
// missing[i] flags the keys to insert; positions past the count are
// neither found nor missing.
__global__ void ProbeCountedKernel(DevTable t, const int64_t* __restrict__ keys,
                                   const int64_t* __restrict__ count, int64_t m,
                                   int64_t* __restrict__ slot_of, uint8_t* __restrict__ missing) {
  const int64_t c = *count;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < m;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t slot = i < c ? FindSlot(t, keys[i]) : -1;
    slot_of[i] = slot;
    missing[i] = i < c && slot < 0;
  }
}

// Exact path, step 2, over the batch sorted by key: counts distinct keys and
// flags the first occurrence of each missing one.
__global__ void MarkDistinctKernel(const int64_t* __restrict__ sorted_keys,
                                   const int64_t* __restrict__ sorted_pos,
                                   const int64_t* __restrict__ slot_of, int64_t n,
                                   uint8_t* __restrict__ missing_head, long long* counters) {
  int64_t base;
  int lane;
  if (!WarpTile(n, &base, &lane)) return;
  const int64_t j = base + lane;
  bool head = false, missing = false;
  if (j < n) {
    head = j == 0 || sorted_keys[j] != sorted_keys[j - 1];
    missing = head && slot_of[sorted_pos[j]] < 0;
    missing_head[j] = missing;
  }
  WarpCount(head, counters + kDistinct, lane);
}

// Exact path, step 3: the keys already present are used at `now`.
__global__ void TouchKernel(DevTable t, const int64_t* __restrict__ slot_of, int64_t n,
                            int64_t now, int accessed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t s = slot_of[i];
    if (s < 0) continue;
    t.ts[s] = now;
    if (accessed) atomicAdd(t.freq + s, 1ULL);
  }
}

// Eviction candidates: live slots not used at `now`.
__global__ void CandidatesKernel(DevTable t, int64_t now, int64_t* __restrict__ cand,
                                 long long* counters) {
  const int64_t total = t.slots + 2;
  for (int64_t s = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; s < total;
       s += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (SlotLive(t, s) && t.ts[s] != now) {
      cand[atomicAdd(reinterpret_cast<unsigned long long*>(counters + kCand), 1ULL)] = s;
    }
  }
}

// One criterion of the eviction order for each candidate, least significant
// first: 0 the key, 1 the timestamp, 2 the use count (as the CPU table's
// saturating uint32).
__global__ void CriterionKernel(DevTable t, const int64_t* __restrict__ cand, int64_t n,
                                int which, int64_t* __restrict__ crit) {
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < n;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t s = cand[j];
    if (which == 0) {
      crit[j] = SlotKey(t, s);
    } else if (which == 1) {
      crit[j] = t.ts[s];
    } else {
      const unsigned long long f = t.freq[s];
      crit[j] = static_cast<int64_t>(f > 0xffffffffULL ? 0xffffffffULL : f);
    }
  }
}

// Removes the slots victims[0, n): tombstones in the index, clean metadata.
// evicted_keys / evicted_rows (either may be NULL) receive the victims' keys
// and rows, in victim order.
__global__ void EvictKernel(DevTable t, const int64_t* __restrict__ victims, int64_t n,
                            int64_t* __restrict__ evicted_keys, float* __restrict__ evicted_rows,
                            long long* counters) {
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < n;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t s = victims[j];
    if (evicted_keys) evicted_keys[j] = SlotKey(t, s);
    if (evicted_rows) {
      const float* row = t.rows.Row(s, t.dim);
      for (int d = 0; d < t.dim; ++d) evicted_rows[j * t.dim + d] = row[d];
    }
    if (s < t.slots) {
      t.keys[s] = kTomb;
    } else {
      t.side[s - t.slots] = 0;
    }
    t.ts[s] = 0;
    t.freq[s] = 0;
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) AddCounter(counters + kSize, -n);
}

// Exact path, last insert step: the distinct missing keys, known absent.
__global__ void InsertAbsentKernel(DevTable t, const int64_t* __restrict__ new_keys, int64_t n,
                                   int64_t now, int initialize, DevInit init,
                                   long long* counters) {
  int64_t base;
  int lane;
  if (!WarpTile(n, &base, &lane)) return;
  const int64_t j = base + lane;
  int64_t key = 0, slot = -1;
  bool from_empty = false;
  if (j < n) {
    key = new_keys[j];
    slot = InsertAbsent(t, key, &from_empty);
    if (slot >= 0) {
      t.ts[slot] = now;
      t.freq[slot] = 0;
    }
  }
  WarpCount(j < n && slot < 0, counters + kFail, lane);
  WarpCount(j < n && slot >= 0, counters + kSize, lane);
  WarpCount(from_empty, counters + kOcc, lane);
  if (!initialize) return;
  unsigned todo = __ballot_sync(kFull, slot >= 0);
  while (todo) {
    const int l = __ffs(todo) - 1;
    todo &= todo - 1;
    const int64_t k = __shfl_sync(kFull, key, l);
    const int64_t s = __shfl_sync(kFull, slot, l);
    WarpInitRow(init, k, t.dim, t.rows.Row(s, t.dim), nullptr, lane);
  }
}

// Exact path, end: positions of keys that were missing find their new slot
// and count their use; after a rehash every position looks its slot up again.
__global__ void FinishKernel(DevTable t, const int64_t* __restrict__ keys, int64_t n,
                             int accessed, int rehashed, int64_t* __restrict__ slot_of,
                             long long* counters) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const bool was_missing = slot_of[i] < 0;
    if (!was_missing && !rehashed) continue;
    const int64_t s = FindSlot(t, keys[i]);
    slot_of[i] = s;
    if (s < 0) {
      AddCounter(counters + kFail, 1);
    } else if (accessed && was_missing) {
      atomicAdd(t.freq + s, 1ULL);
    }
  }
}

// Applies rows to their slots in batch order. Positions are sorted by slot
// (a stable sort, so a run of one slot is in batch order); the first thread
// of each run and column walks the run. mode: 0 add, 1 subtract, 2 assign
// the last; 3 import (assign the last row and its metadata).
__global__ void ApplyRunsKernel(DevTable t, const int64_t* __restrict__ sorted_slot,
                                const int64_t* __restrict__ sorted_pos, int64_t n,
                                const float* __restrict__ rows, int mode,
                                const int64_t* __restrict__ ts_in,
                                const int64_t* __restrict__ freq_in, int64_t now) {
  const int dim = t.dim;
  const int64_t items = n * dim;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < items;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = i / dim;
    const int d = static_cast<int>(i - j * dim);
    const int64_t s = sorted_slot[j];
    if (s < 0 || (j > 0 && sorted_slot[j - 1] == s)) continue;  // s < 0: see Ensure's end
    float* dst = t.rows.Row(s, dim) + d;
    if (mode <= 1) {
      float acc = *dst;
      for (int64_t k = j; k < n && sorted_slot[k] == s; ++k) {
        const float r = rows[sorted_pos[k] * dim + d];
        acc = mode == 0 ? acc + r : acc - r;
      }
      *dst = acc;
    } else {
      int64_t last = j;
      while (last + 1 < n && sorted_slot[last + 1] == s) ++last;
      const int64_t p = sorted_pos[last];
      *dst = rows[p * dim + d];
      if (mode == 3 && d == 0) {
        t.ts[s] = ts_in ? ts_in[p] : now;
        t.freq[s] = freq_in ? static_cast<unsigned long long>(freq_in[p]) : 0ULL;
      }
    }
  }
}

// ApplyRunsKernel (modes 0-2) for positions whose slots are all distinct:
// each row goes straight to its slot, no sort needed (a run of one).
__global__ void ApplyDistinctKernel(DevTable t, const int64_t* __restrict__ slot_of, int64_t n,
                                    const float* __restrict__ rows, int mode) {
  const int dim = t.dim;
  const int64_t items = n * dim;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < items;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = i / dim;
    const int64_t s = slot_of[j];
    if (s < 0) continue;
    float* dst = t.rows.Row(s, dim) + (i - j * dim);
    const float r = rows[i];
    *dst = mode == 0 ? *dst + r : mode == 1 ? *dst - r : r;
  }
}

__global__ void RemoveKernel(DevTable t, const int64_t* __restrict__ keys, int64_t n,
                             long long* removed, long long* counters) {
  int64_t base;
  int lane;
  if (!WarpTile(n, &base, &lane)) return;
  const int64_t i = base + lane;
  bool gone = false;
  if (i < n) {
    const int64_t key = keys[i];
    const int side = SideOf(key);
    int64_t s = -1;
    if (side >= 0) {
      if (atomicExch(t.side + side, 0) == 1) {
        gone = true;
        s = t.slots + side;
      }
    } else {
      s = FindSlot(t, key);
      // A key repeated in the batch is removed once: the swap settles it.
      gone = s >= 0 &&
             atomicCAS(reinterpret_cast<unsigned long long*>(t.keys + s),
                       static_cast<unsigned long long>(key),
                       static_cast<unsigned long long>(kTomb)) ==
                 static_cast<unsigned long long>(key);
    }
    if (gone) {
      t.ts[s] = 0;
      t.freq[s] = 0;
    }
  }
  const int c = __popc(__ballot_sync(kFull, gone));
  if (lane == 0 && c) {
    AddCounter(counters + kSize, -static_cast<long long>(c));
    if (removed) atomicAdd(reinterpret_cast<unsigned long long*>(removed),
                           static_cast<unsigned long long>(c));
  }
}

// Moves every live key of `from` into `to` (an empty table of the same dim).
template <bool kVec>
__global__ void RehashKernel(DevTable from, DevTable to, long long* counters) {
  int64_t base;
  int lane;
  if (!WarpTile(from.slots, &base, &lane)) return;
  const int64_t s = base + lane;
  int64_t dst = -1;
  if (s < from.slots) {
    const int64_t key = from.keys[s];
    if (key != kEmpty && key != kTomb) {
      bool from_empty;
      dst = InsertAbsent(to, key, &from_empty);
      if (dst >= 0) {
        to.ts[dst] = from.ts[s];
        to.freq[dst] = from.freq[s];
      }
    }
  }
  WarpCount(dst >= 0, counters + kOcc, lane);
  WarpCount(s < from.slots && dst < 0 && SlotLive(from, s), counters + kFail, lane);
  WarpCopyRows<kVec>(from.rows, dst >= 0 ? s : -1, to.rows, dst, from.dim, nullptr, lane);
}

// The rows of the side slots (keys kEmpty and kTomb) of `from`, copied to
// those of `to`: one block per side slot.
__global__ void CopySideRowsKernel(DevTable from, DevTable to) {
  const float* src = from.rows.Row(from.slots + blockIdx.x, from.dim);
  float* dst = to.rows.Row(to.slots + blockIdx.x, to.dim);
  for (int d = threadIdx.x; d < from.dim; d += blockDim.x) dst[d] = src[d];
}

// live[s] <- whether slot s holds a key: a row's position in an export is
// the number of live slots before its own.
__global__ void LiveFlagsKernel(DevTable t, int64_t* __restrict__ live) {
  const int64_t total = t.slots + 2;
  for (int64_t s = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; s < total;
       s += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    live[s] = SlotLive(t, s);
  }
}

// flags[s] <- whether slot s holds a row at a position >= offset that was
// last updated after updated_after.
__global__ void ExportFlagsKernel(DevTable t, const int64_t* __restrict__ live,
                                  const int64_t* __restrict__ position, int64_t offset,
                                  int64_t updated_after, int64_t* __restrict__ flags) {
  const int64_t total = t.slots + 2;
  for (int64_t s = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; s < total;
       s += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    flags[s] = live[s] && position[s] >= offset && t.ts[s] > updated_after;
  }
}

template <bool kVec>
__global__ void ExportKernel(DevTable t, const int64_t* __restrict__ position,
                             const int64_t* __restrict__ flags, const int64_t* __restrict__ index,
                             int64_t capacity, int64_t* __restrict__ keys,
                             float* __restrict__ rows, int64_t* __restrict__ ts,
                             int64_t* __restrict__ freq, int64_t* __restrict__ counts) {
  const int64_t total = t.slots + 2;
  int64_t base;
  int lane;
  if (!WarpTile(total, &base, &lane)) return;
  const int64_t s = base + lane;
  int64_t dst = -1;
  if (s < total && flags[s]) {
    dst = index[s];
    if (dst >= capacity) dst = -1;
  }
  if (dst >= 0) {
    keys[dst] = SlotKey(t, s);
    if (ts) ts[dst] = t.ts[s];
    if (freq) {
      const unsigned long long f = t.freq[s];
      freq[dst] = static_cast<int64_t>(f > 0xffffffffULL ? 0xffffffffULL : f);
    }
    if (dst == capacity - 1) counts[1] = position[s] + 1;
  }
  if (s == total - 1) counts[0] = index[s] + flags[s];
  if (rows) {
    WarpCopyRows<kVec>(t.rows, dst >= 0 ? s : -1, Plain(rows), dst, t.dim, nullptr, lane);
  }
}

}  // namespace

// ---------------------------------------------------------------------------
// Host side.

struct SokGpuTable {
  SokGpuTableConfig config;
  SokGpuAllocator allocator{};  // all device memory below comes from it
  // Rows kept in device memory (config.hbm_bytes over a row's bytes; < 0:
  // all); the rest of a table's rows live in mapped host memory.
  int64_t near_rows = -1;
  DevInit init;
  int64_t row_limit = 0;
  DevTable dev{};
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
  void* cub_temp = nullptr;
  size_t cub_bytes = 0;
};

namespace {

inline cudaStream_t StreamOf(void* s) { return static_cast<cudaStream_t>(s); }

inline bool VecOk(int dim, const void* p) {
  return dim % 4 == 0 && (reinterpret_cast<uintptr_t>(p) % 16) == 0;
}

inline unsigned GridStride(int64_t items) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((items + 255) / 256, 8192)));
}

int64_t MaxOccupied(int64_t slots) { return slots / 2 + slots / 4; }

// Slots for `keys` at most half full (so that a table keeps room to grow).
int64_t SlotsFor(int64_t keys) {
  int64_t s = 64;
  while (s < 2 * keys) s *= 2;
  return s;
}

// Device memory through the table's allocator (SokGpuAllocator).
int AllocBytes(const SokGpuAllocator& a, void** p, size_t bytes) {
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

// `count` floats of pinned host memory mapped into the device's address
// space. With unified addressing (every 64-bit platform CUDA supports) the
// device address is the host address, which frees it.
int AllocMapped(float** p, int64_t count) {
  *p = nullptr;
  if (count <= 0) return 0;
  void* host = nullptr;
  SOK_CUDA(cudaHostAlloc(&host, sizeof(float) * count,
                         cudaHostAllocMapped | cudaHostAllocPortable));
  void* device = nullptr;
  cudaError_t e = cudaHostGetDevicePointer(&device, host, 0);
  if (e == cudaSuccess && device != host) e = cudaErrorNotSupported;
  if (e != cudaSuccess) {
    cudaFreeHost(host);
    return static_cast<int>(e);
  }
  *p = static_cast<float*>(host);
  return 0;
}

// A table of `slots` slots and slots + 2 rows: the first `near_rows` (all
// when < 0) in device memory from the allocator, the others in mapped host
// memory. Rows are 16-byte aligned in both tiers when dim % 4 == 0.
int AllocTable(const SokGpuAllocator& a, DevTable* t, int64_t slots, int dim,
               int64_t near_rows) {
  t->slots = slots;
  t->mask = static_cast<uint64_t>(slots - 1);
  t->dim = dim;
  const int64_t rows = slots + 2;
  const int64_t near = near_rows < 0 ? rows : std::min(near_rows, rows);
  t->rows = RowSpace{nullptr, nullptr, near};
  int rc = Alloc(a, &t->keys, slots);
  if (!rc) rc = Alloc(a, &t->rows.near, near * dim);
  if (!rc) rc = AllocMapped(&t->rows.far, (rows - near) * dim);
  if (!rc) rc = Alloc(a, &t->ts, rows);
  if (!rc) rc = Alloc(a, &t->freq, rows);
  return rc;
}

void FreeTable(const SokGpuAllocator& a, DevTable* t) {
  Free(a, &t->keys);
  Free(a, &t->rows.near);
  if (t->rows.far) cudaFreeHost(t->rows.far);
  t->rows.far = nullptr;
  Free(a, &t->ts);
  Free(a, &t->freq);
}

int Sync(SokGpuTable* t, cudaStream_t s) {
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
void FreeScratch(SokGpuTable* t) {
  Free(t->allocator, &t->slot_of);
  Free(t->allocator, &t->buf_a);
  Free(t->allocator, &t->buf_b);
  Free(t->allocator, &t->buf_c);
  Free(t->allocator, &t->buf_d);
  Free(t->allocator, &t->flags8);
  t->scratch_n = 0;
}

void FreeSlotScratch(SokGpuTable* t) {
  Free(t->allocator, &t->slot_a);
  Free(t->allocator, &t->slot_b);
  Free(t->allocator, &t->slot_c);
  Free(t->allocator, &t->slot_d);
  t->slot_scratch_n = 0;
}

int EnsureScratch(SokGpuTable* t, int64_t n) {
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
int EnsureSlotScratch(SokGpuTable* t) {
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

int EnsureCubTemp(SokGpuTable* t, size_t bytes) {
  if (bytes <= t->cub_bytes) return 0;
  SOK_CUDA(cudaDeviceSynchronize());
  Free(t->allocator, reinterpret_cast<char**>(&t->cub_temp));
  t->cub_bytes = 0;
  SOK_CUDA(static_cast<cudaError_t>(AllocBytes(t->allocator, &t->cub_temp, bytes)));
  t->cub_bytes = bytes;
  return 0;
}

// A small batch's sort in one block (kSmallSortThreads x kSmallSortItems
// pairs): the device-wide radix sort takes a pass per 8 key bits, each a
// kernel and a memset — eight of each for int64 keys, about 90 us for the
// 8192 keys of a DemoModel batch on an H200, all launch and wait. Both are
// stable LSD radix sorts on the same key bits (cub twiddles the sign bit the
// same way), so they order every batch identically. Pads are INT64_MAX,
// after every real key of the sorted bits (stability keeps an equal real
// key first) and never stored.
constexpr int kSmallSortThreads = 512;
constexpr int kSmallSortItems = 16;
constexpr int64_t kSmallSortMax = kSmallSortThreads * kSmallSortItems;
using SmallSort = cub::BlockRadixSort<int64_t, kSmallSortThreads, kSmallSortItems, int64_t>;

__global__ void __launch_bounds__(kSmallSortThreads)
    SmallSortKernel(const int64_t* __restrict__ keys_in, int64_t* __restrict__ keys_out,
                    const int64_t* __restrict__ vals_in, int64_t* __restrict__ vals_out, int n,
                    int end_bit) {
  extern __shared__ __align__(16) char small_sort_storage[];
  auto& storage = *reinterpret_cast<SmallSort::TempStorage*>(small_sort_storage);
  int64_t k[kSmallSortItems], v[kSmallSortItems];
#pragma unroll
  for (int i = 0; i < kSmallSortItems; ++i) {
    const int idx = threadIdx.x * kSmallSortItems + i;
    k[i] = idx < n ? keys_in[idx] : INT64_MAX;
    v[i] = idx < n ? vals_in[idx] : 0;
  }
  SmallSort(storage).Sort(k, v, 0, end_bit);
#pragma unroll
  for (int i = 0; i < kSmallSortItems; ++i) {
    const int idx = threadIdx.x * kSmallSortItems + i;
    if (idx < n) {
      keys_out[idx] = k[i];
      vals_out[idx] = v[i];
    }
  }
}

// Stable sort of (key, value) pairs of int64, on the key bits [0, end_bit).
int SortPairs(SokGpuTable* t, const int64_t* keys_in, int64_t* keys_out, const int64_t* vals_in,
              int64_t* vals_out, int64_t n, int end_bit, cudaStream_t s) {
  if (n <= 0) return 0;
  if (n <= kSmallSortMax) {
    const int bytes = static_cast<int>(sizeof(SmallSort::TempStorage));
    // Above the default 48 KB of shared memory: allowed on every call, for
    // whichever device is current (a cheap, idempotent attribute).
    SOK_CUDA(cudaFuncSetAttribute(SmallSortKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  bytes));
    SmallSortKernel<<<1, kSmallSortThreads, bytes, s>>>(keys_in, keys_out, vals_in, vals_out,
                                                         static_cast<int>(n), end_bit);
    return static_cast<int>(cudaGetLastError());
  }
  size_t bytes = 0;
  const int num = static_cast<int>(n);
  SOK_CUDA(cub::DeviceRadixSort::SortPairs(nullptr, bytes, keys_in, keys_out, vals_in, vals_out,
                                           num, 0, end_bit, s));
  int rc = EnsureCubTemp(t, bytes);
  if (rc) return rc;
  bytes = t->cub_bytes;
  SOK_CUDA(cub::DeviceRadixSort::SortPairs(t->cub_temp, bytes, keys_in, keys_out, vals_in,
                                           vals_out, num, 0, end_bit, s));
  return 0;
}

int BitsFor(int64_t max_value) {
  int bits = 1;
  while (bits < 63 && (int64_t{1} << bits) <= max_value) ++bits;
  return bits;
}

// A fresh, empty index of `slots` slots for Rehash, allocated before
// anything changes, so that running out of memory leaves the table as it
// was. A table never has more than SOK_GPU_TABLE_MAX_SLOTS slots.
int AllocFresh(SokGpuTable* t, int64_t slots, DevTable* fresh) {
  *fresh = DevTable{};
  if (slots > SOK_GPU_TABLE_MAX_SLOTS) return SOK_GPU_TABLE_TOO_MANY_KEYS;
  fresh->side = t->dev.side;
  const int rc = AllocTable(t->allocator, fresh, slots, t->dev.dim, t->near_rows);
  if (rc) FreeTable(t->allocator, fresh);
  return rc;
}

// Moves every key into `fresh` (from AllocFresh), dropping tombstones.
int MoveInto(SokGpuTable* t, DevTable fresh, cudaStream_t s) {
  const int64_t slots = fresh.slots;
  FillKernel<<<GridStride(slots + 2), 256, 0, s>>>(fresh);
  const int64_t dim = t->dev.dim;
  // The side slots (keys kEmpty and kTomb) keep their rows and metadata.
  CopySideRowsKernel<<<2, 256, 0, s>>>(t->dev, fresh);
  SOK_CUDA(cudaMemcpyAsync(fresh.ts + fresh.slots, t->dev.ts + t->dev.slots, sizeof(int64_t) * 2,
                           cudaMemcpyDeviceToDevice, s));
  SOK_CUDA(cudaMemcpyAsync(fresh.freq + fresh.slots, t->dev.freq + t->dev.slots,
                           sizeof(unsigned long long) * 2, cudaMemcpyDeviceToDevice, s));
  SOK_CUDA(cudaMemsetAsync(t->counters + kOcc, 0, sizeof(long long), s));
  const bool vec = dim % 4 == 0;
  if (vec) {
    RehashKernel<true><<<BlocksFor(t->dev.slots), kThreads, 0, s>>>(t->dev, fresh, t->counters);
  } else {
    RehashKernel<false><<<BlocksFor(t->dev.slots), kThreads, 0, s>>>(t->dev, fresh, t->counters);
  }
  SOK_CUDA(cudaGetLastError());
  SOK_CUDA(cudaStreamSynchronize(s));
  FreeTable(t->allocator, &t->dev);
  t->dev = fresh;
  FreeSlotScratch(t);  // sized by the old index
  return Sync(t, s);
}

int Rehash(SokGpuTable* t, int64_t slots, cudaStream_t s) {
  DevTable fresh;
  const int rc = AllocFresh(t, slots, &fresh);
  return rc ? rc : MoveInto(t, fresh, s);
}

// Evicts `excess` keys not used at `now`, in eviction order.
int Evict(SokGpuTable* t, int64_t excess, int64_t now, int64_t* evicted_keys, float* evicted_rows,
          cudaStream_t s) {
  int rc = EnsureSlotScratch(t);
  if (rc) return rc;
  SOK_CUDA(cudaMemsetAsync(t->counters + kCand, 0, sizeof(long long), s));
  CandidatesKernel<<<GridStride(t->dev.slots + 2), 256, 0, s>>>(t->dev, now, t->slot_a,
                                                                t->counters);
  SOK_CUDA(cudaGetLastError());
  if ((rc = Sync(t, s))) return rc;
  const int64_t ncand = t->host_counters[kCand];
  if (ncand < excess) return SOK_GPU_TABLE_FULL;  // the distinct-key check rules this out
  // Least significant criterion first; radix sorts are stable.
  const int passes = t->config.eviction == 1 ? 3 : 2;
  int64_t* cand = t->slot_a;
  int64_t* other = t->slot_b;
  for (int which = 0; which < passes; ++which) {
    CriterionKernel<<<GridStride(ncand), 256, 0, s>>>(t->dev, cand, ncand, which, t->slot_c);
    SOK_CUDA(cudaGetLastError());
    if ((rc = SortPairs(t, t->slot_c, t->slot_d, cand, other, ncand, 64, s))) return rc;
    std::swap(cand, other);
  }
  EvictKernel<<<GridStride(excess), 256, 0, s>>>(t->dev, cand, excess, evicted_keys,
                                                 evicted_rows, t->counters);
  SOK_CUDA(cudaGetLastError());
  t->evicted_total += excess;
  ++t->removals;
  return 0;
}

int ExactAfterWait(SokGpuTable* t, const int64_t* keys, int64_t n, int64_t now, bool accessed,
                   bool initialize, int64_t* evicted_keys, float* evicted_rows,
                   SokGpuTableResult* result, cudaStream_t s);

// Makes every batch key present: t->slot_of[i] <- its slot. flags8[i] = 1
// where position i wrote its own new row to out (fast path), else 0.
int Ensure(SokGpuTable* t, const int64_t* keys, int64_t n, int64_t now, bool accessed,
           bool initialize, float* out, int64_t* evicted_keys, float* evicted_rows,
           SokGpuTableResult* result, cudaStream_t s) {
  if (result) {
    result->num_evicted = 0;
    result->distinct_keys = -1;
  }
  int rc = EnsureScratch(t, n);
  if (rc) return rc;
  bool fast = t->size_ub + n <= t->row_limit && t->occ_ub + n <= MaxOccupied(t->dev.slots);
  // A full bounded table whose size is known exactly (a table that holds
  // its whole vocabulary, called every step) goes straight to the exact
  // path, which reads the counters once itself: waiting for them here
  // would only tell what is known.
  const bool known_full = t->size_exact && t->size_ub + n > t->row_limit;
  if (!fast && !known_full) {
    if ((rc = Sync(t, s))) return rc;
    const int64_t size = t->size_ub, occ = t->occ_ub;
    if (size + n <= t->row_limit) {
      if (occ + n > MaxOccupied(t->dev.slots)) {
        // Grow (unbounded tables stay at most half full) or just drop tombstones.
        int64_t slots = t->dev.slots;
        if (t->config.max_rows <= 0) slots = std::max(slots, SlotsFor(size + n));
        while (MaxOccupied(slots) < size + n) slots *= 2;
        if ((rc = Rehash(t, slots, s))) return rc;
      }
      fast = true;
    }
  }
  if (fast) {
    ClaimKernel<<<BlocksFor(n), kThreads, 0, s>>>(t->dev, keys, n, now, accessed, initialize,
                                                  t->init, t->slot_of, t->flags8, out,
                                                  t->counters);
    SOK_CUDA(cudaGetLastError());
    t->size_ub += n;
    t->occ_ub += n;
    t->size_exact = false;
    return 0;
  }

  // Exact path: the table may have to evict. Its one wait for the device
  // (below) reads the size and occupancy too: nothing before it changes
  // them.
  ProbeKernel<<<GridStride(n), 256, 0, s>>>(t->dev, keys, n, t->slot_of);
  sok_graph::cuda::Iota<<<GridStride(n), 256, 0, s>>>(t->buf_b, n);
  if ((rc = SortPairs(t, keys, t->buf_a, t->buf_b, t->buf_c, n, 64, s))) return rc;
  SOK_CUDA(cudaMemsetAsync(t->counters + kDistinct, 0, 2 * sizeof(long long), s));
  MarkDistinctKernel<<<BlocksFor(n), kThreads, 0, s>>>(t->buf_a, t->buf_c, t->slot_of, n,
                                                       t->flags8, t->counters);
  SOK_CUDA(cudaGetLastError());
  size_t bytes = 0;
  SOK_CUDA(cub::DeviceSelect::Flagged(nullptr, bytes, t->buf_a, t->flags8, t->buf_d,
                                      t->counters + kNew, static_cast<int>(n), s));
  if ((rc = EnsureCubTemp(t, bytes))) return rc;
  bytes = t->cub_bytes;
  SOK_CUDA(cub::DeviceSelect::Flagged(t->cub_temp, bytes, t->buf_a, t->flags8, t->buf_d,
                                      t->counters + kNew, static_cast<int>(n), s));
  if ((rc = Sync(t, s))) return rc;
  const int64_t distinct = t->host_counters[kDistinct];
  if (result) result->distinct_keys = distinct;
  if (distinct > t->row_limit) return SOK_GPU_TABLE_TOO_MANY_KEYS;
  return ExactAfterWait(t, keys, n, now, accessed, initialize, evicted_keys, evicted_rows, result,
                        s);
}

// The exact path after its wait (Sync), which read the size, the occupancy
// and counters[kNew], the number of distinct missing keys, now in buf_d:
// touches the present keys, evicts, inserts the missing ones and finds
// every position's slot.
int ExactAfterWait(SokGpuTable* t, const int64_t* keys, int64_t n, int64_t now, bool accessed,
                   bool initialize, int64_t* evicted_keys, float* evicted_rows,
                   SokGpuTableResult* result, cudaStream_t s) {
  int rc = 0;
  const int64_t size = t->size_ub, occ = t->occ_ub;
  const int64_t num_new = t->host_counters[kNew];
  // A rehash after evicting gets its memory first: if there is none, the
  // call fails before any key is evicted or touched.
  const bool rehash = occ + num_new > MaxOccupied(t->dev.slots);
  DevTable fresh{};
  if (rehash) {
    const int64_t kept = std::min(size, t->row_limit - num_new);  // the size after evicting
    int64_t slots = t->dev.slots;
    while (MaxOccupied(slots) < kept + num_new) slots *= 2;
    if ((rc = AllocFresh(t, slots, &fresh))) return rc;
  }
  TouchKernel<<<GridStride(n), 256, 0, s>>>(t->dev, t->slot_of, n, now, accessed);
  SOK_CUDA(cudaGetLastError());
  const int64_t excess = size + num_new - t->row_limit;
  if (excess > 0) {
    if ((rc = Evict(t, excess, now, evicted_keys, evicted_rows, s))) {
      if (rehash) FreeTable(t->allocator, &fresh);
      return rc;
    }
    if (result) result->num_evicted = excess;
  }
  // Inserts take tombstones first but may still fill empty slots.
  if (rehash && (rc = MoveInto(t, fresh, s))) return rc;
  const bool rehashed = rehash;
  if (num_new > 0) {
    InsertAbsentKernel<<<BlocksFor(num_new), kThreads, 0, s>>>(t->dev, t->buf_d, num_new, now,
                                                               initialize, t->init, t->counters);
  }
  FinishKernel<<<GridStride(n), 256, 0, s>>>(t->dev, keys, n, accessed, rehashed, t->slot_of,
                                             t->counters);
  SOK_CUDA(cudaMemsetAsync(t->flags8, 0, n, s));
  SOK_CUDA(cudaGetLastError());
  // No second wait: the size after the call is what was there, less what
  // was evicted, plus the new keys; every new key takes at most one more
  // occupied slot (a tombstone it reuses takes none). A broken invariant
  // (kFail) is reported by the next wait, as on the fast path; a slot that
  // was not found is -1, which the gather writes as zeros and the scatter
  // skips, so nothing outside the table is touched meanwhile.
  t->size_ub = size - (excess > 0 ? excess : 0) + num_new;
  t->occ_ub = (rehashed ? t->occ_ub : occ) + num_new;
  t->size_exact = true;
  return 0;
}

// Applies rows in batch order after Ensure (mode 0-2: scatter; 3: import).
int ApplyRows(SokGpuTable* t, int64_t n, const float* rows, int mode, const int64_t* ts_in,
              const int64_t* freq_in, int64_t now, cudaStream_t s) {
  sok_graph::cuda::Iota<<<GridStride(n), 256, 0, s>>>(t->buf_b, n);
  int rc = SortPairs(t, t->slot_of, t->buf_a, t->buf_b, t->buf_c, n,
                     BitsFor(t->dev.slots + 1), s);
  if (rc) return rc;
  const int64_t items = n * t->dev.dim;
  ApplyRunsKernel<<<GridStride(items), 256, 0, s>>>(t->dev, t->buf_a, t->buf_c, n, rows, mode,
                                                    ts_in, freq_in, now);
  return static_cast<int>(cudaGetLastError());
}

bool BadTable(const SokGpuTable* t) { return t == nullptr || t->dev.keys == nullptr; }

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int sok_gpu_table_create(
    const SokGpuTableConfig* config, const SokGpuAllocator* allocator, void* stream,
    SokGpuTable** table) {
  if (table == nullptr) return SOK_GPU_TABLE_BAD_ARGUMENT;
  *table = nullptr;
  if (config == nullptr || config->dim < 1 || config->dim > INT32_MAX / 4 ||
      config->init_capacity < 0 || config->max_rows < 0 ||
      config->max_rows > SOK_GPU_TABLE_MAX_ROWS ||
      config->init_capacity >
          (config->max_rows > 0 ? config->max_rows : SOK_GPU_TABLE_MAX_UNBOUNDED_ROWS) ||
      (allocator != nullptr && (allocator->alloc == nullptr) != (allocator->free == nullptr)) ||
      config->eviction < 0 ||
      config->eviction > 1 || config->init_kind < 0 || config->init_kind > SOK_INIT_CONSTANT ||
      config->hbm_bytes < -1) {
    return SOK_GPU_TABLE_BAD_ARGUMENT;
  }
  SokGpuTable* t = new (std::nothrow) SokGpuTable();
  if (t == nullptr) return static_cast<int>(cudaErrorMemoryAllocation);
  t->config = *config;
  if (allocator != nullptr) t->allocator = *allocator;
  t->init.kind = config->init_kind;
  t->init.mean = config->mean;
  t->init.stddev = config->stddev;
  t->init.minval = config->minval;
  t->init.maxval = config->maxval;
  t->init.value = config->value;
  t->init.seed_mix = sok_graph::core::draw::SeedMix(config->seed);
  t->row_limit = config->max_rows > 0 ? config->max_rows : kUnboundedRows;
  int64_t slots = 64;
  if (config->max_rows > 0) {
    // A full bounded table is at most 3/4 occupied; it never grows.
    while (MaxOccupied(slots) < t->row_limit) slots *= 2;
  } else {
    slots = SlotsFor(config->init_capacity);
  }
  cudaStream_t s = StreamOf(stream);
  if (config->hbm_bytes >= 0) t->near_rows = config->hbm_bytes / (4 * config->dim);
  int rc = AllocTable(t->allocator, &t->dev, slots, static_cast<int>(config->dim),
                      t->near_rows);
  if (!rc) rc = Alloc(t->allocator, &t->dev.side, 2);
  if (!rc) rc = Alloc(t->allocator, &t->counters, kNumCounters);
  if (!rc) {
    rc = static_cast<int>(cudaMallocHost(reinterpret_cast<void**>(&t->host_counters),
                                         sizeof(long long) * kNumCounters));
  }
  if (!rc) rc = sok_gpu_table_clear(t, stream);
  if (!rc) rc = static_cast<int>(cudaStreamSynchronize(s));
  if (rc) {
    sok_gpu_table_destroy(t, stream);
    return rc;
  }
  *table = t;
  return 0;
}

__attribute__((visibility("default"))) int sok_gpu_table_destroy(SokGpuTable* t, void* stream) {
  if (t == nullptr) return 0;
  cudaStreamSynchronize(StreamOf(stream));
  FreeTable(t->allocator, &t->dev);
  Free(t->allocator, &t->dev.side);
  Free(t->allocator, &t->counters);
  if (t->host_counters) cudaFreeHost(t->host_counters);
  FreeScratch(t);
  FreeSlotScratch(t);
  Free(t->allocator, reinterpret_cast<char**>(&t->cub_temp));
  delete t;
  return 0;
}

__attribute__((visibility("default"))) int sok_gpu_table_clear(SokGpuTable* t, void* stream) {
  if (BadTable(t)) return SOK_GPU_TABLE_BAD_ARGUMENT;
  cudaStream_t s = StreamOf(stream);
  FillKernel<<<GridStride(t->dev.slots + 2), 256, 0, s>>>(t->dev);
  SOK_CUDA(cudaGetLastError());
  SOK_CUDA(cudaMemsetAsync(t->dev.side, 0, 2 * sizeof(int), s));
  SOK_CUDA(cudaMemsetAsync(t->counters, 0, kNumCounters * sizeof(long long), s));
  t->size_ub = t->occ_ub = 0;
  t->size_exact = true;
  ++t->removals;
  return 0;
}

__attribute__((visibility("default"))) int sok_gpu_table_size(SokGpuTable* t, int64_t* size,
                                                              int64_t* slots, void* stream) {
  if (BadTable(t)) return SOK_GPU_TABLE_BAD_ARGUMENT;
  const int rc = Sync(t, StreamOf(stream));
  if (rc) return rc;
  if (size) *size = t->size_ub;
  if (slots) *slots = t->dev.slots;
  return 0;
}

__attribute__((visibility("default"))) int64_t sok_gpu_table_row_limit(const SokGpuTable* t) {
  return t ? t->row_limit : 0;
}

__attribute__((visibility("default"))) int64_t sok_gpu_table_evicted_total(const SokGpuTable* t) {
  return t ? t->evicted_total : 0;
}

__attribute__((visibility("default"))) int64_t sok_gpu_table_memory_bytes(const SokGpuTable* t) {
  if (t == nullptr) return 0;
  const int64_t slots = t->dev.slots;
  return slots * 8 + (slots + 2) * (4 * t->dev.dim + 16) + t->scratch_n * 41 +
         t->slot_scratch_n * 32 + static_cast<int64_t>(t->cub_bytes);
}

__attribute__((visibility("default"))) int sok_gpu_table_find(SokGpuTable* t,
                                                              const int64_t* keys, int64_t n,
                                                              const float* default_row,
                                                              float* out, uint8_t* found,
                                                              void* stream) {
  if (BadTable(t) || n < 0) return SOK_GPU_TABLE_BAD_ARGUMENT;
  if (n == 0) return 0;
  cudaStream_t s = StreamOf(stream);
  const int dim = t->dev.dim;
  if (VecOk(dim, out) && (default_row == nullptr || VecOk(dim, default_row))) {
    FindKernel<true><<<BlocksFor(n), kThreads, 0, s>>>(t->dev, keys, n, default_row, out, found);
  } else {
    FindKernel<false><<<BlocksFor(n), kThreads, 0, s>>>(t->dev, keys, n, default_row, out, found);
  }
  return static_cast<int>(cudaGetLastError());
}

__attribute__((visibility("default"))) int sok_gpu_table_find_or_insert(
    SokGpuTable* t, const int64_t* keys, int64_t n, int64_t now, float* out,
    int64_t* evicted_keys, float* evicted_rows, SokGpuTableResult* result, void* stream) {
  if (BadTable(t) || n < 0) return SOK_GPU_TABLE_BAD_ARGUMENT;
  if (result) {
    result->num_evicted = 0;
    result->distinct_keys = -1;
  }
  if (n == 0) return 0;
  cudaStream_t s = StreamOf(stream);
  int rc = Ensure(t, keys, n, now, true, true, out, evicted_keys, evicted_rows, result, s);
  if (rc) return rc;
  if (out == nullptr) return 0;
  if (VecOk(t->dev.dim, out)) {
    GatherKernel<true><<<BlocksFor(n), kThreads, 0, s>>>(t->dev, t->slot_of, t->flags8, n, out);
  } else {
    GatherKernel<false><<<BlocksFor(n), kThreads, 0, s>>>(t->dev, t->slot_of, t->flags8, n, out);
  }
  return static_cast<int>(cudaGetLastError());
}

__attribute__((visibility("default"))) int sok_gpu_table_ensure_distinct(
    SokGpuTable* t, const int64_t* keys, const int64_t* count, int64_t max_n, int64_t now,
    int64_t* evicted_keys, SokGpuTableResult* result, int64_t* n, void* stream) {
  if (BadTable(t) || max_n < 0 || count == nullptr || n == nullptr) {
    return SOK_GPU_TABLE_BAD_ARGUMENT;
  }
  if (result) {
    result->num_evicted = 0;
    result->distinct_keys = -1;
  }
  *n = 0;
  if (max_n == 0) return 0;
  cudaStream_t s = StreamOf(stream);
  if (t->config.max_rows <= 0) {
    // Unbounded: the count alone, then the usual insert, which has room
    // (no wait) unless the table must grow.
    SOK_CUDA(cudaMemcpyAsync(t->host_counters + kDistinct, count, sizeof(long long),
                             cudaMemcpyDeviceToHost, s));
    SOK_CUDA(cudaStreamSynchronize(s));
    *n = t->host_counters[kDistinct];
    if (*n <= 0) return 0;
    if (result) result->distinct_keys = *n;
    return Ensure(t, keys, *n, now, true, true, nullptr, evicted_keys, nullptr, result, s);
  }
  // Bounded: the exact path, its one wait reading the count as well. A
  // batch of more distinct keys than the bound fails after the wait, so
  // the keys past the bound need no probe.
  const int64_t m = std::min(max_n, t->row_limit);
  int rc = EnsureScratch(t, m);
  if (rc) return rc;
  ProbeCountedKernel<<<GridStride(m), 256, 0, s>>>(t->dev, keys, count, m, t->slot_of,
                                                   t->flags8);
  SOK_CUDA(cudaGetLastError());
  size_t bytes = 0;
  SOK_CUDA(cub::DeviceSelect::Flagged(nullptr, bytes, keys, t->flags8, t->buf_d,
                                      t->counters + kNew, static_cast<int>(m), s));
  if ((rc = EnsureCubTemp(t, bytes))) return rc;
  bytes = t->cub_bytes;
  SOK_CUDA(cub::DeviceSelect::Flagged(t->cub_temp, bytes, keys, t->flags8, t->buf_d,
                                      t->counters + kNew, static_cast<int>(m), s));
  SOK_CUDA(cudaMemcpyAsync(t->counters + kDistinct, count, sizeof(long long),
                           cudaMemcpyDeviceToDevice, s));
  if ((rc = Sync(t, s))) return rc;
  *n = t->host_counters[kDistinct];
  if (*n <= 0) return 0;
  if (result) result->distinct_keys = *n;
  if (*n > t->row_limit) return SOK_GPU_TABLE_TOO_MANY_KEYS;
  return ExactAfterWait(t, keys, *n, now, true, true, evicted_keys, nullptr, result, s);
}

__attribute__((visibility("default"))) int sok_gpu_table_gather_ensured(SokGpuTable* t,
                                                                        int64_t n, float* out,
                                                                        void* stream) {
  if (BadTable(t) || n < 0 || n > t->scratch_n) return SOK_GPU_TABLE_BAD_ARGUMENT;
  if (n == 0) return 0;
  cudaStream_t s = StreamOf(stream);
  if (VecOk(t->dev.dim, out)) {
    GatherKernel<true><<<BlocksFor(n), kThreads, 0, s>>>(t->dev, t->slot_of, nullptr, n, out);
  } else {
    GatherKernel<false><<<BlocksFor(n), kThreads, 0, s>>>(t->dev, t->slot_of, nullptr, n, out);
  }
  return static_cast<int>(cudaGetLastError());
}

__attribute__((visibility("default"))) int sok_gpu_table_scatter(SokGpuTable* t,
                                                                 const int64_t* keys, int64_t n,
                                                                 const float* rows, int mode,
                                                                 int64_t now,
                                                                 SokGpuTableResult* result,
                                                                 void* stream) {
  if (BadTable(t) || n < 0 || mode < 0 || mode > 2) return SOK_GPU_TABLE_BAD_ARGUMENT;
  if (result) {
    result->num_evicted = 0;
    result->distinct_keys = -1;
  }
  if (n == 0) return 0;
  cudaStream_t s = StreamOf(stream);
  int rc = Ensure(t, keys, n, now, false, true, nullptr, nullptr, nullptr, result, s);
  if (rc) return rc;
  return ApplyRows(t, n, rows, mode, nullptr, nullptr, now, s);
}

__attribute__((visibility("default"))) int sok_gpu_table_scatter_present(
    SokGpuTable* t, const int64_t* keys, int64_t n, const float* rows, int mode, int distinct,
    int64_t now, void* stream) {
  if (BadTable(t) || n < 0 || mode < 0 || mode > 2) return SOK_GPU_TABLE_BAD_ARGUMENT;
  if (n == 0) return 0;
  cudaStream_t s = StreamOf(stream);
  int rc = EnsureScratch(t, n);
  if (rc) return rc;
  ProbePresentKernel<<<BlocksFor(n), kThreads, 0, s>>>(t->dev, keys, n, now, t->slot_of,
                                                       t->counters);
  SOK_CUDA(cudaGetLastError());
  if (!distinct) return ApplyRows(t, n, rows, mode, nullptr, nullptr, now, s);
  ApplyDistinctKernel<<<GridStride(n * t->dev.dim), 256, 0, s>>>(t->dev, t->slot_of, n, rows,
                                                                 mode);
  return static_cast<int>(cudaGetLastError());
}

__attribute__((visibility("default"))) int64_t sok_gpu_table_removals(const SokGpuTable* t) {
  return t ? t->removals : 0;
}

__attribute__((visibility("default"))) int sok_gpu_table_remove(SokGpuTable* t,
                                                                const int64_t* keys, int64_t n,
                                                                int64_t* num_removed,
                                                                void* stream) {
  if (BadTable(t) || n < 0) return SOK_GPU_TABLE_BAD_ARGUMENT;
  cudaStream_t s = StreamOf(stream);
  if (num_removed) SOK_CUDA(cudaMemsetAsync(num_removed, 0, sizeof(int64_t), s));
  if (n == 0) return 0;
  t->size_exact = false;  // size_ub stays an upper bound
  ++t->removals;
  RemoveKernel<<<BlocksFor(n), kThreads, 0, s>>>(
      t->dev, keys, n, reinterpret_cast<long long*>(num_removed), t->counters);
  return static_cast<int>(cudaGetLastError());
}

__attribute__((visibility("default"))) int sok_gpu_table_import(
    SokGpuTable* t, const int64_t* keys, int64_t n, const float* rows, const int64_t* timestamps,
    const int64_t* frequencies, int64_t now, SokGpuTableResult* result, void* stream) {
  if (BadTable(t) || n < 0) return SOK_GPU_TABLE_BAD_ARGUMENT;
  if (result) {
    result->num_evicted = 0;
    result->distinct_keys = -1;
  }
  if (n == 0) return 0;
  cudaStream_t s = StreamOf(stream);
  int rc = Ensure(t, keys, n, now, false, false, nullptr, nullptr, nullptr, result, s);
  if (rc) return rc;
  return ApplyRows(t, n, rows, 3, timestamps, frequencies, now, s);
}

__attribute__((visibility("default"))) int sok_gpu_table_export(
    SokGpuTable* t, int64_t offset, int64_t updated_after, int64_t* keys, float* rows,
    int64_t* timestamps, int64_t* frequencies, int64_t capacity, int64_t* counts, void* stream) {
  if (BadTable(t) || offset < 0 || (keys == nullptr && capacity > 0) || counts == nullptr ||
      capacity < 0) {
    return SOK_GPU_TABLE_BAD_ARGUMENT;
  }
  cudaStream_t s = StreamOf(stream);
  int rc = EnsureSlotScratch(t);
  if (rc) return rc;
  const int64_t total = t->dev.slots + 2;
  const int n = static_cast<int>(total);
  size_t bytes = 0;
  SOK_CUDA(cub::DeviceScan::ExclusiveSum(nullptr, bytes, t->slot_a, t->slot_b, n, s));
  if ((rc = EnsureCubTemp(t, bytes))) return rc;
  bytes = t->cub_bytes;
  // slot_a: live flags, slot_b: positions, slot_c: export flags, slot_d: chunk indices.
  LiveFlagsKernel<<<GridStride(total), 256, 0, s>>>(t->dev, t->slot_a);
  SOK_CUDA(cub::DeviceScan::ExclusiveSum(t->cub_temp, bytes, t->slot_a, t->slot_b, n, s));
  ExportFlagsKernel<<<GridStride(total), 256, 0, s>>>(t->dev, t->slot_a, t->slot_b, offset,
                                                      updated_after, t->slot_c);
  SOK_CUDA(cub::DeviceScan::ExclusiveSum(t->cub_temp, bytes, t->slot_c, t->slot_d, n, s));
  if (rows == nullptr || VecOk(t->dev.dim, rows)) {
    ExportKernel<true><<<BlocksFor(total), kThreads, 0, s>>>(
        t->dev, t->slot_b, t->slot_c, t->slot_d, capacity, keys, rows, timestamps, frequencies,
        counts);
  } else {
    ExportKernel<false><<<BlocksFor(total), kThreads, 0, s>>>(
        t->dev, t->slot_b, t->slot_c, t->slot_d, capacity, keys, rows, timestamps, frequencies,
        counts);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // extern "C"
