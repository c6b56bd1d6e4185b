// Finding and inserting keys of the GPU hash table
// (dynamic_table_internal.cuh): the read-only find, and making a batch's
// keys present (Ensure) for find_or_insert, ensure_distinct + gather_ensured
// and the scatters and import of dynamic_table_update.cu, new keys getting
// their initial rows. Eviction and growth, which an insert calls when it
// needs room, are dynamic_table_evict.cu and dynamic_table_storage.cu.
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
#include <cstdint>

#include <cub/cub.cuh>
#include <cuda_runtime.h>

#include "tf_ops/common/cuda_helpers.cuh"
#include "tf_ops/dynamic/core/random_draws.h"
#include "tf_ops/dynamic/kernels/dynamic_table_internal.cuh"
#include "tf_ops/dynamic/kernels/dynamic_table_launcher.h"

namespace sok_graph {
namespace gpu_table {
namespace {

// ---------------------------------------------------------------------------
// The seeded initializer: core/random_draws.h, the code the CPU table's
// core/initializer.h draws with, so rows are bit-identical to the CPU's:
// correctly rounded operations only (explicit __fadd_rn-style intrinsics,
// never fused) and no transcendental library function.

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
// Kernels.

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
    if (claimed) TakeRow(t, slot, counters);
    if (slot >= 0) {
      t.ts[slot] = now;
      if (accessed) atomicAdd(t.freq + slot, 1ULL);
    }
  }
  WarpCount(i < n && slot < 0, counters + kFail, lane);
  WarpCount(claimed, counters + kSize, lane);
  WarpCount(claimed && slot < t.slots, counters + kOcc, lane);
  if (!initialize) return;
  __syncwarp();  // the rows the claiming lanes took, seen by the whole warp
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
      TakeRow(t, slot, counters);
      t.ts[slot] = now;
      t.freq[slot] = 0;
    }
  }
  WarpCount(j < n && slot < 0, counters + kFail, lane);
  WarpCount(j < n && slot >= 0, counters + kSize, lane);
  WarpCount(from_empty, counters + kOcc, lane);
  if (!initialize) return;
  __syncwarp();
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

int ExactAfterWait(SokGpuTable* t, const int64_t* keys, int64_t n, int64_t now, bool accessed,
                   bool initialize, int64_t* evicted_keys, float* evicted_rows,
                   SokGpuTableResult* result, cudaStream_t s);

}  // namespace

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
        // Grow, or (a bounded table at its bound's slots) drop tombstones.
        const int64_t slots =
            GrownSlots(t->dev.slots, size + n, t->config.max_rows > 0, t->row_limit);
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
  ProbeKernel<<<Grid(n), 256, 0, s>>>(t->dev, keys, n, t->slot_of);
  sok_graph::cuda::Iota<<<Grid(n), 256, 0, s>>>(t->buf_b, n);
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

namespace {

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
    const int64_t slots =
        GrownSlots(t->dev.slots, kept + num_new, t->config.max_rows > 0, t->row_limit);
    if ((rc = AllocFresh(t, slots, &fresh))) return rc;
  }
  TouchKernel<<<Grid(n), 256, 0, s>>>(t->dev, t->slot_of, n, now, accessed);
  SOK_CUDA(cudaGetLastError());
  const int64_t excess = size + num_new - t->row_limit;
  if (excess > 0) {
    if ((rc = Evict(t, excess, now, evicted_keys, evicted_rows, s))) {
      if (rehash) FreeReplaced(t->allocator, &fresh);
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
  FinishKernel<<<Grid(n), 256, 0, s>>>(t->dev, keys, n, accessed, rehashed, t->slot_of,
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

}  // namespace
}  // namespace gpu_table
}  // namespace sok_graph

// The names the C launchers below use, from the namespace above.
using sok_graph::cuda::Grid;
using sok_graph::gpu_table::BadTable;
using sok_graph::gpu_table::BlocksFor;
using sok_graph::gpu_table::Ensure;
using sok_graph::gpu_table::EnsureCubTemp;
using sok_graph::gpu_table::EnsureScratch;
using sok_graph::gpu_table::ExactAfterWait;
using sok_graph::gpu_table::FindKernel;
using sok_graph::gpu_table::GatherKernel;
using sok_graph::gpu_table::kDistinct;
using sok_graph::gpu_table::kNew;
using sok_graph::gpu_table::kThreads;
using sok_graph::gpu_table::MaybeRebalance;
using sok_graph::gpu_table::ProbeCountedKernel;
using sok_graph::gpu_table::StreamOf;
using sok_graph::gpu_table::Sync;
using sok_graph::gpu_table::VecOk;

extern "C" {

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
  if (out != nullptr) {
    if (VecOk(t->dev.dim, out)) {
      GatherKernel<true><<<BlocksFor(n), kThreads, 0, s>>>(t->dev, t->slot_of, t->flags8, n, out);
    } else {
      GatherKernel<false><<<BlocksFor(n), kThreads, 0, s>>>(t->dev, t->slot_of, t->flags8, n,
                                                            out);
    }
    SOK_CUDA(cudaGetLastError());
  }
  return MaybeRebalance(t, false, s);
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
  ProbeCountedKernel<<<Grid(m), 256, 0, s>>>(t->dev, keys, count, m, t->slot_of, t->flags8);
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
  SOK_CUDA(cudaGetLastError());
  return MaybeRebalance(t, false, s);
}

}  // extern "C"
