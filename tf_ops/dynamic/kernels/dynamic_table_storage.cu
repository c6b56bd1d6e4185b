// The GPU hash table's storage (dynamic_table_internal.cuh): create,
// destroy, clear, the size and memory queries, and growth: a rehash moves
// every key into a fresh index (more slots, or the same without
// tombstones). Apart from the insert path, which calls Rehash when a call
// needs more room than the index has (dynamic_table_insert.cu).
#include <algorithm>
#include <cstdint>
#include <new>

#include <cuda_runtime.h>

#include "tf_ops/common/cuda_helpers.cuh"
#include "tf_ops/dynamic/core/random_draws.h"
#include "tf_ops/dynamic/kernels/dynamic_table_internal.cuh"
#include "tf_ops/dynamic/kernels/dynamic_table_launcher.h"

namespace sok_graph {
namespace gpu_table {
namespace {

// Empties every slot; a tiered table's slots own their rows again, a pooled
// table's main slots own none and its side slots rows 0 and 1 (a cleared
// slot's row holds nothing: an insert writes the key's initial row). The
// pool's stack is ResetPoolKernel's.
__global__ void FillKernel(DevTable t) {
  const int64_t total = t.slots + 2;
  for (int64_t s = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; s < total;
       s += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (s < t.slots) t.keys[s] = kEmpty;
    t.ts[s] = 0;
    t.freq[s] = 0;
    if (t.pool_rows > 0) {
      t.rows.loc[s] = s < t.slots ? -1 : static_cast<int32_t>(s - t.slots);
    } else if (t.rows.loc != nullptr) {
      t.rows.loc[s] = static_cast<int32_t>(s);
    }
  }
}

// Every pool row free, stacked so that inserts take the lowest first: rows
// in device memory before rows in host memory.
__global__ void ResetPoolKernel(DevTable t) {
  const int64_t free = t.pool_rows - kFirstPoolRow;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < free;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    t.free_rows[i] = static_cast<int32_t>(t.pool_rows - 1 - i);
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) *t.free_top = free;
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
  if (to.pool_rows > 0) {  // the rows stay where they are; the map moves
    if (dst >= 0) to.rows.loc[dst] = from.rows.loc[s];
    return;
  }
  WarpCopyRows<kVec>(from.rows, dst >= 0 ? s : -1, to.rows, dst, from.dim, nullptr, lane);
}

// The rows of the side slots (keys kEmpty and kTomb) of `from`, copied to
// those of `to` (a pooled table's map entries): one block per side slot.
__global__ void CopySideRowsKernel(DevTable from, DevTable to) {
  if (to.pool_rows > 0) {
    if (threadIdx.x == 0) to.rows.loc[to.slots + blockIdx.x] = from.rows.loc[from.slots + blockIdx.x];
    return;
  }
  const float* src = from.rows.Row(from.slots + blockIdx.x, from.dim);
  float* dst = to.rows.Row(to.slots + blockIdx.x, to.dim);
  for (int d = threadIdx.x; d < from.dim; d += blockDim.x) dst[d] = src[d];
}

// `count` floats of pinned host memory mapped into the device's address
// space. With unified addressing (every 64-bit platform CUDA supports) the
// device address is the host address, which frees it.
int AllocMapped(float** p, int64_t count) {
  *p = nullptr;
  if (count <= 0) return 0;
  void* host = nullptr;
  if (cudaHostAlloc(&host, sizeof(float) * count, cudaHostAllocMapped | cudaHostAllocPortable) !=
      cudaSuccess) {
    cudaGetLastError();  // not the device's fault: later calls must not see it
    return SOK_GPU_TABLE_HOST_MEMORY;
  }
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

// The index of a table of `slots` slots: keys, timestamps, counts and,
// when `with_loc`, the slot -> row map.
int AllocIndex(const SokGpuAllocator& a, DevTable* t, int64_t slots, bool with_loc) {
  t->slots = slots;
  t->mask = static_cast<uint64_t>(slots - 1);
  int rc = Alloc(a, &t->keys, slots);
  if (!rc && with_loc) rc = Alloc(a, &t->rows.loc, slots + 2);
  if (!rc) rc = Alloc(a, &t->ts, slots + 2);
  if (!rc) rc = Alloc(a, &t->freq, slots + 2);
  return rc;
}

// A table of `slots` slots and its rows: `pool_rows` rows and their stack
// when > 0 (pooled), else slots + 2. The first `near_rows` rows (all when
// < 0) are in device memory from the allocator, the others in mapped host
// memory, with a slot -> row map when pooled or when there are both
// (FillKernel sets it). Rows are 16-byte aligned in both tiers when
// dim % 4 == 0.
int AllocTable(const SokGpuAllocator& a, DevTable* t, int64_t slots, int dim,
               int64_t near_rows, int64_t pool_rows) {
  t->dim = dim;
  t->pool_rows = pool_rows;
  const int64_t rows = pool_rows > 0 ? pool_rows : slots + 2;
  const int64_t near = near_rows < 0 ? rows : std::min(near_rows, rows);
  t->rows = RowSpace{nullptr, nullptr, near, nullptr};
  int rc = AllocIndex(a, t, slots, pool_rows > 0 || (near > 0 && near < rows));
  if (!rc) rc = Alloc(a, &t->rows.near, near * dim);
  if (!rc) rc = AllocMapped(&t->rows.far, (rows - near) * dim);
  if (!rc && pool_rows > 0) rc = Alloc(a, &t->free_rows, pool_rows);
  if (!rc && pool_rows > 0) rc = Alloc(a, &t->free_top, 1);
  return rc;
}

}  // namespace

// A fresh, empty index of `slots` slots for Rehash, allocated before
// anything changes, so that running out of memory leaves the table as it
// was. A table never has more than SOK_GPU_TABLE_MAX_SLOTS slots.
int AllocFresh(SokGpuTable* t, int64_t slots, DevTable* fresh) {
  *fresh = DevTable{};
  if (slots > SOK_GPU_TABLE_MAX_SLOTS) return SOK_GPU_TABLE_TOO_MANY_KEYS;
  int rc = 0;
  if (t->dev.pool_rows > 0) {  // a new index over the same rows
    *fresh = t->dev;
    fresh->keys = nullptr;
    fresh->rows.loc = nullptr;
    fresh->ts = nullptr;
    fresh->freq = nullptr;
    rc = AllocIndex(t->allocator, fresh, slots, true);
  } else {
    fresh->side = t->dev.side;
    rc = AllocTable(t->allocator, fresh, slots, t->dev.dim, t->near_rows, 0);
  }
  if (rc) FreeReplaced(t->allocator, fresh);
  return rc;
}

// Moves every key into `fresh` (from AllocFresh), dropping tombstones.
int MoveInto(SokGpuTable* t, DevTable fresh, cudaStream_t s) {
  const int64_t slots = fresh.slots;
  FillKernel<<<Grid(slots + 2), 256, 0, s>>>(fresh);
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
  FreeReplaced(t->allocator, &t->dev);
  t->dev = fresh;
  FreeSlotScratch(t);  // sized by the old index
  return Sync(t, s);
}

int Rehash(SokGpuTable* t, int64_t slots, cudaStream_t s) {
  DevTable fresh;
  const int rc = AllocFresh(t, slots, &fresh);
  return rc ? rc : MoveInto(t, fresh, s);
}

}  // namespace gpu_table
}  // namespace sok_graph

// The names the C launchers below use, from the namespace above.
using sok_graph::cuda::Grid;
using sok_graph::gpu_table::Alloc;
using sok_graph::gpu_table::AllocTable;
using sok_graph::gpu_table::BadTable;
using sok_graph::gpu_table::BoundSlots;
using sok_graph::gpu_table::FillKernel;
using sok_graph::gpu_table::Free;
using sok_graph::gpu_table::FreeScratch;
using sok_graph::gpu_table::FreeSlotScratch;
using sok_graph::gpu_table::FreeTable;
using sok_graph::gpu_table::kFirstPoolRow;
using sok_graph::gpu_table::ResetPoolKernel;
using sok_graph::gpu_table::kNumCounters;
using sok_graph::gpu_table::kUnboundedRows;
using sok_graph::gpu_table::SlotsFor;
using sok_graph::gpu_table::StreamOf;
using sok_graph::gpu_table::Sync;

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
  // Every table starts with room for its init_capacity and grows as keys
  // come (a bounded one up to its bound's slots): a bounded table made at
  // its bound took 2^27 slots for SOK's default max_capacity of 2^26 keys,
  // 11 GiB of a GPU at dim 16 before its first key.
  int64_t slots = SlotsFor(config->init_capacity);
  if (config->max_rows > 0) slots = std::min(slots, BoundSlots(t->row_limit));
  cudaStream_t s = StreamOf(stream);
  if (config->hbm_bytes >= 0) t->near_rows = config->hbm_bytes / (4 * config->dim);
  // A bounded table given a device-memory budget (SOK's hybrid) keeps
  // max_rows rows in a pool (RowSpace), not a row per slot: its rows are
  // what may not fit the GPU, so it allocates no more of them than it holds.
  const int64_t pool_rows = config->max_rows > 0 && config->hbm_bytes >= 0
                                ? config->max_rows + kFirstPoolRow
                                : 0;
  int rc = AllocTable(t->allocator, &t->dev, slots, static_cast<int>(config->dim),
                      t->near_rows, pool_rows);
  if (!rc) rc = Alloc(t->allocator, &t->dev.side, 2);
  if (!rc) rc = sok_graph::gpu_table::AllocTierScratch(t);
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
  sok_graph::gpu_table::FreeTierScratch(t);
  Free(t->allocator, reinterpret_cast<char**>(&t->cub_temp));
  delete t;
  return 0;
}

__attribute__((visibility("default"))) int sok_gpu_table_clear(SokGpuTable* t, void* stream) {
  if (BadTable(t)) return SOK_GPU_TABLE_BAD_ARGUMENT;
  cudaStream_t s = StreamOf(stream);
  FillKernel<<<Grid(t->dev.slots + 2), 256, 0, s>>>(t->dev);
  if (t->dev.pool_rows > 0) {
    ResetPoolKernel<<<Grid(t->dev.pool_rows), 256, 0, s>>>(t->dev);
  }
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
  const int64_t pool = t->dev.pool_rows;
  const int64_t rows = pool > 0 ? pool : slots + 2;
  return slots * 8 + (slots + 2) * (16 + (t->dev.rows.loc ? 4 : 0)) + rows * 4 * t->dev.dim +
         pool * 4 * (t->tier_owner != nullptr ? 2 : 1) +
         t->scratch_n * 41 + t->slot_scratch_n * 32 + t->tier_cap * 16 +
         static_cast<int64_t>(t->cub_bytes);
}

}  // extern "C"
