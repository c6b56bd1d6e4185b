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
// A row moves only to make room for a hotter one, so while T stays the
// same no row goes back and forth between passes. The pass never waits for
// the device (the counts stay there; its scratch comes with the table),
// swaps at most a sixteenth of the device-memory rows (at least 2^16), and
// runs every kTierPeriod training lookups
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
constexpr int kTierScratch = kDemoted + 1;

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
  for (int64_t s = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; s < total;
       s += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (!SlotLive(t, s)) continue;
    const int tier = InDeviceMemory(t, s) ? 0 : 1;
    atomicAdd(bins + tier * kBins + BinOf(t.freq[s]), 1ULL);
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
    const unsigned ups = __ballot_sync(kFull, up), downs = __ballot_sync(kFull, down);
    long long up_base = 0, down_base = 0;
    if (lane == 0 && ups) {
      up_base = static_cast<long long>(atomicAdd(
          reinterpret_cast<unsigned long long*>(scratch + kPromoted),
          static_cast<unsigned long long>(__popc(ups))));
    }
    if (lane == 0 && downs) {
      down_base = static_cast<long long>(atomicAdd(
          reinterpret_cast<unsigned long long*>(scratch + kDemoted),
          static_cast<unsigned long long>(__popc(downs))));
    }
    up_base = __shfl_sync(kFull, up_base, 0);
    down_base = __shfl_sync(kFull, down_base, 0);
    const unsigned below = (1u << lane) - 1u;
    if (up) {
      const long long i = up_base + __popc(ups & below);
      if (i < cap) promote[i] = s;
    }
    if (down) {
      const long long i = down_base + __popc(downs & below);
      if (i < cap) demote[i] = s;
    }
  }
}

__device__ __forceinline__ int64_t SwapCount(const long long* scratch, int64_t cap) {
  return min(cap, static_cast<int64_t>(min(scratch[kPromoted], scratch[kDemoted])));
}

// Swaps the contents of the rows of promote[j] and demote[j] (one column a
// thread); the map is swapped after, by TierSwapMapKernel.
__global__ void TierSwapRowsKernel(DevTable t, const long long* scratch,
                                   const int64_t* __restrict__ promote,
                                   const int64_t* __restrict__ demote, int64_t cap) {
  const int64_t pairs = SwapCount(scratch, cap);
  const int dim = t.dim;
  const int64_t items = pairs * dim;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < items;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = i / dim;
    const int d = static_cast<int>(i - j * dim);
    float* up = t.rows.Row(promote[j], dim) + d;
    float* down = t.rows.Row(demote[j], dim) + d;
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

int AllocTierScratch(SokGpuTable* t) {
  if (t->near_rows <= 0) return 0;  // every row in one tier, whatever the size
  // Swaps a pass may make: a sixteenth of the device-memory rows (at least
  // 2^16), so a table settles within a few passes while one stays short.
  const int64_t cap = std::max<int64_t>(int64_t{1} << 16, t->near_rows / 16);
  int rc = Alloc(t->allocator, &t->tier_scratch, kTierScratch);
  if (!rc) rc = Alloc(t->allocator, &t->tier_promote, cap);
  if (!rc) rc = Alloc(t->allocator, &t->tier_demote, cap);
  if (!rc) t->tier_cap = cap;
  return rc;
}

void FreeTierScratch(SokGpuTable* t) {
  Free(t->allocator, &t->tier_scratch);
  Free(t->allocator, &t->tier_promote);
  Free(t->allocator, &t->tier_demote);
  t->tier_cap = 0;
}

int MaybeRebalance(SokGpuTable* t, bool force, cudaStream_t s) {
  if (t->dev.rows.loc == nullptr || t->tier_cap == 0) return 0;
  if (!force && ++t->tier_calls < kTierPeriod) return 0;
  t->tier_calls = 0;
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
