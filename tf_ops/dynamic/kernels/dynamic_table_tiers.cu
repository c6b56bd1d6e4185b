// Tiered rows of the GPU hash table (dynamic_table_internal.cuh): a table
// whose rows do not all fit its device-memory budget keeps the rest in mapped
// host memory, and every slot reaches its row through a slot -> row map
// (RowSpace::loc). Placing rows by the hash of their key would send a share
// of every step's reads over the host link equal to the share of rows kept
// there; on a skewed (Zipf) key stream most reads go to a few rows, so this
// pass moves the most used rows into device memory instead:
//
//   1. histogram of the live slots' use counts (log2 bins), per tier;
//   2. on the device, the lowest bin T whose keys (bin >= T) all fit in
//      device memory;
//   3. host-memory rows of bin >= T are swapped, row contents and map
//      entries, with device-memory rows of bin < T or of free slots (there
//      are enough: every key of bin >= T fits in device memory).
//
// A pooled table (RowSpace) has fewer rows than slots: there step 3 swaps
// with device-memory rows that are free or whose owner is of bin < T, found
// through a row -> owner map the pass builds first, and the stack of free
// rows is built again after (host-memory rows at the bottom, so inserts
// take device-memory rows first). Its side slots keep rows 0 and 1.
//
// A row moves only to make room for a hotter one, so while T stays the
// same no row goes back and forth between passes. The pass never waits for
// the device (the counts stay there; its scratch comes with the table),
// swaps at most a sixteenth of the device-memory rows (at least 2^16), and
// runs every kTierPeriod training lookups (more for tables of more than
// kTierPeriodSlots slots: TierPeriod)
// (find-or-insert, gather_ensured). Rows keep their values; only where they
// live changes, so results are those of an untiered table.
#include <algorithm>
#include <cstdint>

#include <cuda_runtime.h>

#include "tf_ops/common/cuda_helpers.cuh"
#include "tf_ops/dynamic/kernels/dynamic_table_internal.cuh"
#include "tf_ops/dynamic/kernels/dynamic_table_launcher.h"

namespace sok_graph {
namespace gpu_table {
namespace {

constexpr int kBins = 64;
constexpr int64_t kTierPeriod = 16;
// Scratch layout (long long): histograms [2][kBins] (device-memory rows,
// host-memory rows), then the threshold bin, the promote count, the demote
// count.
constexpr int kThreshold = 2 * kBins, kPromoted = kThreshold + 1, kDemoted = kThreshold + 2;
// A pooled table's free rows in host and in device memory, counted, then
// placed on the stack.
constexpr int kFreeFar = kDemoted + 1, kFreeNear = kFreeFar + 1;
constexpr int kPlacedFar = kFreeNear + 1, kPlacedNear = kPlacedFar + 1;
constexpr int kTierScratch = kPlacedNear + 1;

__device__ __forceinline__ int BinOf(unsigned long long uses) {
  return uses == 0 ? 0 : min(kBins - 1, 64 - __clzll(static_cast<long long>(uses)));
}

__device__ __forceinline__ bool InDeviceMemory(const DevTable& t, int64_t s) {
  return t.rows.loc[s] < t.rows.split;
}

__global__ void TierHistogramKernel(DevTable t, long long* scratch) {
  __shared__ unsigned long long bins[2 * kBins];
  for (int i = threadIdx.x; i < 2 * kBins; i += blockDim.x) bins[i] = 0;
  __syncthreads();
  const int64_t total = t.slots + 2;
  const int lane = threadIdx.x % kWarp;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  // Most keys share a few bins (use counts 1, 2-3, ...): one shared-memory
  // add per bin a warp saw, not one per key, or a table of 2^29 slots
  // spends its pass queued on a few counters.
  for (int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x - lane;
       first < total; first += stride) {
    const int64_t s = first + lane;
    int bin = -1;
    if (s < total && SlotLive(t, s)) {
      bin = (InDeviceMemory(t, s) ? 0 : kBins) + BinOf(t.freq[s]);
    }
    const unsigned peers = __match_any_sync(kFull, bin);
    if (bin >= 0 && lane == __ffs(peers) - 1) {
      atomicAdd(bins + bin, static_cast<unsigned long long>(__popc(peers)));
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 2 * kBins; i += blockDim.x) {
    if (bins[i]) atomicAdd(reinterpret_cast<unsigned long long*>(scratch + i), bins[i]);
  }
}

// One thread: the lowest bin whose keys, with every hotter bin's, fit in the
// device-memory rows; counters reset for the next kernel.
__global__ void TierThresholdKernel(long long* scratch, int64_t near_rows) {
  long long held = 0;
  int threshold = kBins;
  for (int b = kBins - 1; b >= 0; --b) {
    const long long keys = scratch[b] + scratch[kBins + b];
    if (held + keys > near_rows) break;
    held += keys;
    threshold = b;
  }
  scratch[kThreshold] = threshold;
  scratch[kPromoted] = 0;
  scratch[kDemoted] = 0;
}

// Adds a warp's flagged items to a list: one atomic per warp. Every lane
// calls it.
template <typename T>
__device__ __forceinline__ void WarpAppend(bool flag, int64_t item, long long* count, T* list,
                                           int64_t cap, int lane) {
  const unsigned flags = __ballot_sync(kFull, flag);
  long long base = 0;
  if (lane == 0 && flags) {
    base = static_cast<long long>(atomicAdd(reinterpret_cast<unsigned long long*>(count),
                                            static_cast<unsigned long long>(__popc(flags))));
  }
  base = __shfl_sync(kFull, base, 0);
  if (flag) {
    const long long i = base + __popc(flags & ((1u << lane) - 1u));
    if (i < cap) list[i] = static_cast<T>(item);
  }
}

// Lists the slots to promote (live, host memory, bin >= T) and to demote
// (device memory, free or bin < T), at most `cap` of each.
__global__ void TierCandidatesKernel(DevTable t, long long* scratch, int64_t* promote,
                                     int64_t* demote, int64_t cap) {
  const int threshold = static_cast<int>(scratch[kThreshold]);
  const int64_t total = t.slots + 2;
  const int lane = threadIdx.x % kWarp;
  // Every lane of a warp runs the same number of iterations (ballots).
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x - lane;
       first < total; first += stride) {
    const int64_t s = first + lane;
    bool up = false, down = false;
    if (s < total) {
      const bool live = SlotLive(t, s);
      const int bin = live ? BinOf(t.freq[s]) : -1;
      if (InDeviceMemory(t, s)) {
        down = !live || bin < threshold;
      } else {
        up = live && bin >= threshold;
      }
    }
    WarpAppend(up, s, scratch + kPromoted, promote, cap, lane);
    WarpAppend(down, s, scratch + kDemoted, demote, cap, lane);
  }
}

__device__ __forceinline__ int64_t SwapCount(const long long* scratch, int64_t cap) {
  return min(cap, static_cast<int64_t>(min(scratch[kPromoted], scratch[kDemoted])));
}

// Swaps the contents of slot promote[j]'s row and demote[j]'s (one column
// a thread): a slot's row, or in a pooled table a device-memory row itself
// (a free row's contents are nothing). The map is changed after, by
// TierSwapMapKernel or PoolSwapMapKernel.
__global__ void TierSwapRowsKernel(DevTable t, const long long* scratch,
                                   const int64_t* __restrict__ promote,
                                   const int64_t* __restrict__ demote, int64_t cap) {
  const int64_t pairs = SwapCount(scratch, cap);
  const int dim = t.dim;
  const int64_t items = pairs * dim;
  const bool demote_rows = t.pool_rows > 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < items;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = i / dim;
    const int d = static_cast<int>(i - j * dim);
    float* up = t.rows.Row(promote[j], dim) + d;
    float* down = (demote_rows ? t.rows.Phys(demote[j], dim) : t.rows.Row(demote[j], dim)) + d;
    const float v = *up;
    *up = *down;
    *down = v;
  }
}

__global__ void TierSwapMapKernel(DevTable t, const long long* scratch,
                                  const int64_t* __restrict__ promote,
                                  const int64_t* __restrict__ demote, int64_t cap) {
  const int64_t pairs = SwapCount(scratch, cap);
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < pairs;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t p = promote[j], q = demote[j];
    const int32_t r = t.rows.loc[p];
    t.rows.loc[p] = t.rows.loc[q];
    t.rows.loc[q] = r;
  }
}

// Pooled tables. owner[r] <- the live main slot whose row is r (-1: none).
__global__ void PoolOwnersKernel(DevTable t, int32_t* __restrict__ owner) {
  for (int64_t s = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; s < t.slots;
       s += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t r = t.rows.loc[s];
    if (r >= kFirstPoolRow && SlotLive(t, s)) owner[r] = static_cast<int32_t>(s);
  }
}

// Candidates of a pooled table: main slots to promote (live, host memory,
// bin >= T), device-memory pool rows to take (free, or their owner's bin < T).
__global__ void PoolCandidatesKernel(DevTable t, const int32_t* __restrict__ owner,
                                     long long* scratch, int64_t* promote, int64_t* demote,
                                     int64_t cap) {
  const int threshold = static_cast<int>(scratch[kThreshold]);
  const int64_t total = t.slots > t.rows.split ? t.slots : t.rows.split;
  const int lane = threadIdx.x % kWarp;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x - lane;
       first < total; first += stride) {
    const int64_t i = first + lane;
    bool up = false, down = false;
    if (i < t.slots && SlotLive(t, i) && !InDeviceMemory(t, i)) {
      up = BinOf(t.freq[i]) >= threshold;
    }
    if (i >= kFirstPoolRow && i < t.rows.split) {
      const int32_t o = owner[i];
      down = o < 0 || BinOf(t.freq[o]) < threshold;
    }
    WarpAppend(up, i, scratch + kPromoted, promote, cap, lane);
    WarpAppend(down, i, scratch + kDemoted, demote, cap, lane);
  }
}

// Pair j (after TierSwapRowsKernel): slot promote[j] takes device-memory
// row demote[j]; its host-memory row goes to that row's owner, if any, or
// becomes free.
__global__ void PoolSwapMapKernel(DevTable t, const long long* scratch,
                                  const int64_t* __restrict__ promote,
                                  const int64_t* __restrict__ demote, int64_t cap,
                                  int32_t* __restrict__ owner) {
  const int64_t pairs = SwapCount(scratch, cap);
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < pairs;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t p = promote[j];
    const int32_t near = static_cast<int32_t>(demote[j]), far = t.rows.loc[p];
    const int32_t o = owner[near];
    t.rows.loc[p] = near;
    owner[near] = static_cast<int32_t>(p);
    owner[far] = o;
    if (o >= 0) t.rows.loc[o] = far;
  }
}

// The free pool rows (no owner), counted per tier (far: 0, near: 1) ...
__global__ void PoolCountFreeKernel(DevTable t, const int32_t* __restrict__ owner,
                                    long long* scratch) {
  const int lane = threadIdx.x % kWarp;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x - lane;
       first < t.pool_rows; first += stride) {
    const int64_t r = first + lane;
    const bool free = r >= kFirstPoolRow && r < t.pool_rows && owner[r] < 0;
    WarpCount(free && r >= t.rows.split, scratch + kFreeFar, lane);
    WarpCount(free && r < t.rows.split, scratch + kFreeNear, lane);
  }
}

// ... then stacked: host-memory rows below device-memory rows.
__global__ void PoolStackFreeKernel(DevTable t, const int32_t* __restrict__ owner,
                                    long long* scratch) {
  const int lane = threadIdx.x % kWarp;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const long long far_count = scratch[kFreeFar];
  for (int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x - lane;
       first < t.pool_rows; first += stride) {
    const int64_t r = first + lane;
    const bool free = r >= kFirstPoolRow && r < t.pool_rows && owner[r] < 0;
    const bool near = r < t.rows.split;
    WarpAppend(free && !near, r, scratch + kPlacedFar, t.free_rows, t.pool_rows, lane);
    WarpAppend(free && near, r, scratch + kPlacedNear, t.free_rows + far_count,
               t.pool_rows - far_count, lane);
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    *t.free_top = far_count + scratch[kFreeNear];
  }
}

__global__ void InDeviceMemoryKernel(DevTable t, const int64_t* __restrict__ keys, int64_t n,
                                     uint8_t* __restrict__ out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t s = FindSlot(t, keys[i]);
    out[i] = s < 0 ? 0 : (t.rows.loc != nullptr ? (InDeviceMemory(t, s) ? 1 : 2)
                                                 : (s < t.rows.split ? 1 : 2));
  }
}

}  // namespace

// Whether rows are in both tiers, so that a pass has rows to move: a
// pooled table's whole budget may hold all its rows (or none of its pool).
bool Tiered(const SokGpuTable* t) {
  const DevTable& d = t->dev;
  if (d.rows.loc == nullptr || t->tier_cap == 0) return false;
  if (d.pool_rows == 0) return true;
  return d.rows.split > kFirstPoolRow && d.rows.split < d.pool_rows;
}

int AllocTierScratch(SokGpuTable* t) {
  if (t->near_rows <= 0) return 0;  // every row in one tier, whatever the size
  // Swaps a pass may make: a sixteenth of the device-memory rows (at least
  // 2^16), so a table settles within a few passes while one stays short.
  const int64_t cap = std::max<int64_t>(int64_t{1} << 16, t->near_rows / 16);
  int rc = Alloc(t->allocator, &t->tier_scratch, kTierScratch);
  if (!rc) rc = Alloc(t->allocator, &t->tier_promote, cap);
  if (!rc) rc = Alloc(t->allocator, &t->tier_demote, cap);
  if (!rc) rc = Alloc(t->allocator, &t->tier_owner, t->dev.pool_rows);
  if (!rc) t->tier_cap = cap;
  return rc;
}

void FreeTierScratch(SokGpuTable* t) {
  Free(t->allocator, &t->tier_scratch);
  Free(t->allocator, &t->tier_promote);
  Free(t->allocator, &t->tier_demote);
  Free(t->allocator, &t->tier_owner);
  t->tier_cap = 0;
}

// A pooled table's pass (the steps of the file's comment).
int RebalancePool(SokGpuTable* t, cudaStream_t s) {
  const DevTable& d = t->dev;
  const int64_t cap = t->tier_cap;
  SOK_CUDA(cudaMemsetAsync(t->tier_scratch, 0, sizeof(long long) * kTierScratch, s));
  SOK_CUDA(cudaMemsetAsync(t->tier_owner, 0xff, sizeof(int32_t) * d.pool_rows, s));
  PoolOwnersKernel<<<Grid(d.slots), 256, 0, s>>>(d, t->tier_owner);
  TierHistogramKernel<<<Grid(d.slots + 2), 256, 0, s>>>(d, t->tier_scratch);
  // Device-memory rows for keys: all but the sink (the side keys' rows are
  // there too, and counted as keys).
  TierThresholdKernel<<<1, 1, 0, s>>>(t->tier_scratch, d.rows.split - 1);
  PoolCandidatesKernel<<<Grid(std::max(d.slots, d.rows.split)), 256, 0, s>>>(
      d, t->tier_owner, t->tier_scratch, t->tier_promote, t->tier_demote, cap);
  TierSwapRowsKernel<<<Grid(cap * d.dim), 256, 0, s>>>(d, t->tier_scratch, t->tier_promote,
                                                       t->tier_demote, cap);
  PoolSwapMapKernel<<<Grid(cap), 256, 0, s>>>(d, t->tier_scratch, t->tier_promote,
                                              t->tier_demote, cap, t->tier_owner);
  PoolCountFreeKernel<<<Grid(d.pool_rows), 256, 0, s>>>(d, t->tier_owner, t->tier_scratch);
  PoolStackFreeKernel<<<Grid(d.pool_rows), 256, 0, s>>>(d, t->tier_owner, t->tier_scratch);
  return static_cast<int>(cudaGetLastError());
}

// Lookups between passes. A pass reads the whole index (and a pool's
// owners): 20-40 bytes a slot, where a lookup's work grows with its batch,
// not with the table. Past kTierPeriodSlots slots the period grows with the
// slots, so that a pass costs a lookup no more than at that size (on an
// H200, a pass over 2^29 slots and 2^28 pool rows took ~0.5 ms a lookup
// every 16 lookups, a tenth of the step).
constexpr int64_t kTierPeriodSlots = int64_t{1} << 25;

int64_t TierPeriod(const SokGpuTable* t) {
  return kTierPeriod * std::max<int64_t>(1, (t->dev.slots + kTierPeriodSlots - 1) /
                                                kTierPeriodSlots);
}

int MaybeRebalance(SokGpuTable* t, bool force, cudaStream_t s) {
  if (!Tiered(t)) return 0;
  if (!force && ++t->tier_calls < TierPeriod(t)) return 0;
  t->tier_calls = 0;
  if (t->dev.pool_rows > 0) return RebalancePool(t, s);
  const int64_t cap = t->tier_cap;
  const int64_t total = t->dev.slots + 2;
  SOK_CUDA(cudaMemsetAsync(t->tier_scratch, 0, sizeof(long long) * 2 * kBins, s));
  TierHistogramKernel<<<Grid(total), 256, 0, s>>>(t->dev, t->tier_scratch);
  TierThresholdKernel<<<1, 1, 0, s>>>(t->tier_scratch, t->dev.rows.split);
  TierCandidatesKernel<<<Grid(total), 256, 0, s>>>(t->dev, t->tier_scratch, t->tier_promote,
                                                   t->tier_demote, cap);
  TierSwapRowsKernel<<<Grid(cap * t->dev.dim), 256, 0, s>>>(t->dev, t->tier_scratch,
                                                            t->tier_promote, t->tier_demote, cap);
  TierSwapMapKernel<<<Grid(cap), 256, 0, s>>>(t->dev, t->tier_scratch, t->tier_promote,
                                              t->tier_demote, cap);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace gpu_table
}  // namespace sok_graph

using sok_graph::gpu_table::BadTable;
using sok_graph::gpu_table::InDeviceMemoryKernel;
using sok_graph::gpu_table::MaybeRebalance;
using sok_graph::gpu_table::StreamOf;

extern "C" {

__attribute__((visibility("default"))) int sok_gpu_table_rebalance(SokGpuTable* t,
                                                                   void* stream) {
  if (BadTable(t)) return SOK_GPU_TABLE_BAD_ARGUMENT;
  return MaybeRebalance(t, true, StreamOf(stream));
}

__attribute__((visibility("default"))) int sok_gpu_table_row_tiers(SokGpuTable* t,
                                                                   const int64_t* keys, int64_t n,
                                                                   uint8_t* tiers, void* stream) {
  if (BadTable(t) || n < 0 || (n > 0 && (keys == nullptr || tiers == nullptr))) {
    return SOK_GPU_TABLE_BAD_ARGUMENT;
  }
  if (n == 0) return 0;
  InDeviceMemoryKernel<<<sok_graph::cuda::Grid(n), 256, 0, StreamOf(stream)>>>(t->dev, keys, n,
                                                                              tiers);
  return static_cast<int>(cudaGetLastError());
}

}  // extern "C"
