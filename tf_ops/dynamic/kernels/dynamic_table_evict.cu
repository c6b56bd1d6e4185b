// Eviction for the GPU hash table (dynamic_table_internal.cuh): when a
// bounded table's insert needs room, the keys the call does not use go in
// eviction order (LRU: least recently used first, ties by key; LFU: least
// used first, ties by age, then key). Called by the exact insert path
// (dynamic_table_insert.cu), before it inserts.
#include <algorithm>
#include <cstdint>

#include <cuda_runtime.h>

#include "tf_ops/common/cuda_helpers.cuh"
#include "tf_ops/dynamic/kernels/dynamic_table_internal.cuh"
#include "tf_ops/dynamic/kernels/dynamic_table_launcher.h"

namespace sok_graph {
namespace gpu_table {
namespace {

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
      GiveRow(t, s);
    } else {
      t.side[s - t.slots] = 0;
    }
    t.ts[s] = 0;
    t.freq[s] = 0;
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) AddCounter(counters + kSize, -n);
}

}  // namespace

// Evicts `excess` keys not used at `now`, in eviction order.
int Evict(SokGpuTable* t, int64_t excess, int64_t now, int64_t* evicted_keys, float* evicted_rows,
          cudaStream_t s) {
  int rc = EnsureSlotScratch(t);
  if (rc) return rc;
  SOK_CUDA(cudaMemsetAsync(t->counters + kCand, 0, sizeof(long long), s));
  CandidatesKernel<<<Grid(t->dev.slots + 2), 256, 0, s>>>(t->dev, now, t->slot_a, t->counters);
  SOK_CUDA(cudaGetLastError());
  if ((rc = Sync(t, s))) return rc;
  const int64_t ncand = t->host_counters[kCand];
  if (ncand < excess) return SOK_GPU_TABLE_FULL;  // the distinct-key check rules this out
  // Least significant criterion first; radix sorts are stable.
  const int passes = t->config.eviction == 1 ? 3 : 2;
  int64_t* cand = t->slot_a;
  int64_t* other = t->slot_b;
  for (int which = 0; which < passes; ++which) {
    CriterionKernel<<<Grid(ncand), 256, 0, s>>>(t->dev, cand, ncand, which, t->slot_c);
    SOK_CUDA(cudaGetLastError());
    if ((rc = SortPairs(t, t->slot_c, t->slot_d, cand, other, ncand, 64, s))) return rc;
    std::swap(cand, other);
  }
  EvictKernel<<<Grid(excess), 256, 0, s>>>(t->dev, cand, excess, evicted_keys, evicted_rows,
                                           t->counters);
  SOK_CUDA(cudaGetLastError());
  t->evicted_total += excess;
  ++t->removals;
  return 0;
}

}  // namespace gpu_table
}  // namespace sok_graph
