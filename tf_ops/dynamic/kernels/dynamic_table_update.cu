// Writing rows of the GPU hash table (dynamic_table_internal.cuh): scatter
// (add, subtract, assign) and import (rows with their metadata), applied in
// batch order, and remove. Scatter and import first make missing keys
// present through the insert path (Ensure, dynamic_table_insert.cu);
// scatter_present takes keys a call already made present.
#include <cstdint>

#include <cuda_runtime.h>

#include "tf_ops/common/cuda_helpers.cuh"
#include "tf_ops/dynamic/kernels/dynamic_table_internal.cuh"
#include "tf_ops/dynamic/kernels/dynamic_table_launcher.h"

namespace sok_graph {
namespace gpu_table {
namespace {

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
        // Without counts a write keeps the key's use count (a new key's is 0).
        if (freq_in) t.freq[s] = static_cast<unsigned long long>(freq_in[p]);
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
      GiveRow(t, s);
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

int BitsFor(int64_t max_value) {
  int bits = 1;
  while (bits < 63 && (int64_t{1} << bits) <= max_value) ++bits;
  return bits;
}

// Applies rows in batch order after Ensure (mode 0-2: scatter; 3: import).
int ApplyRows(SokGpuTable* t, int64_t n, const float* rows, int mode, const int64_t* ts_in,
              const int64_t* freq_in, int64_t now, cudaStream_t s) {
  sok_graph::cuda::Iota<<<Grid(n), 256, 0, s>>>(t->buf_b, n);
  int rc = SortPairs(t, t->slot_of, t->buf_a, t->buf_b, t->buf_c, n,
                     BitsFor(t->dev.slots + 1), s);
  if (rc) return rc;
  const int64_t items = n * t->dev.dim;
  ApplyRunsKernel<<<Grid(items), 256, 0, s>>>(t->dev, t->buf_a, t->buf_c, n, rows, mode, ts_in,
                                              freq_in, now);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace
}  // namespace gpu_table
}  // namespace sok_graph

// The names the C launchers below use, from the namespace above.
using sok_graph::cuda::Grid;
using sok_graph::gpu_table::ApplyDistinctKernel;
using sok_graph::gpu_table::ApplyRows;
using sok_graph::gpu_table::BadTable;
using sok_graph::gpu_table::BlocksFor;
using sok_graph::gpu_table::Ensure;
using sok_graph::gpu_table::EnsureScratch;
using sok_graph::gpu_table::kThreads;
using sok_graph::gpu_table::ProbePresentKernel;
using sok_graph::gpu_table::RemoveKernel;
using sok_graph::gpu_table::StreamOf;

extern "C" {

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

__attribute__((visibility("default"))) int sok_gpu_table_insert_missing(
    SokGpuTable* t, const int64_t* keys, int64_t n, int64_t now, int64_t* evicted_keys,
    SokGpuTableResult* result, void* stream) {
  if (BadTable(t) || n < 0) return SOK_GPU_TABLE_BAD_ARGUMENT;
  if (result) {
    result->num_evicted = 0;
    result->distinct_keys = -1;
  }
  if (n == 0) return 0;
  return Ensure(t, keys, n, now, false, true, nullptr, evicted_keys, nullptr, result,
                StreamOf(stream));
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
  ApplyDistinctKernel<<<Grid(n * t->dev.dim), 256, 0, s>>>(t->dev, t->slot_of, n, rows, mode);
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
    const int64_t* frequencies, int64_t now, int64_t* evicted_keys, SokGpuTableResult* result,
    void* stream) {
  if (BadTable(t) || n < 0) return SOK_GPU_TABLE_BAD_ARGUMENT;
  if (result) {
    result->num_evicted = 0;
    result->distinct_keys = -1;
  }
  if (n == 0) return 0;
  cudaStream_t s = StreamOf(stream);
  int rc = Ensure(t, keys, n, now, false, false, nullptr, evicted_keys, nullptr, result, s);
  if (rc) return rc;
  return ApplyRows(t, n, rows, 3, timestamps, frequencies, now, s);
}

}  // extern "C"
