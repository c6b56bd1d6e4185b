// Export of the GPU hash table (dynamic_table_internal.cuh): a chunk of
// rows in slot order, filtered by the time of their last update, each
// row's position the number of live slots before its own (prefix sums over
// the slots). Read-only, apart from the parts that change the table.
#include <cstdint>

#include <cub/cub.cuh>
#include <cuda_runtime.h>

#include "tf_ops/common/cuda_helpers.cuh"
#include "tf_ops/dynamic/kernels/dynamic_table_internal.cuh"
#include "tf_ops/dynamic/kernels/dynamic_table_launcher.h"

namespace sok_graph {
namespace gpu_table {
namespace {

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
}  // namespace gpu_table
}  // namespace sok_graph

// The names the C launchers below use, from the namespace above.
using sok_graph::cuda::Grid;
using sok_graph::gpu_table::BadTable;
using sok_graph::gpu_table::BlocksFor;
using sok_graph::gpu_table::EnsureCubTemp;
using sok_graph::gpu_table::EnsureSlotScratch;
using sok_graph::gpu_table::ExportFlagsKernel;
using sok_graph::gpu_table::ExportKernel;
using sok_graph::gpu_table::kThreads;
using sok_graph::gpu_table::LiveFlagsKernel;
using sok_graph::gpu_table::StreamOf;
using sok_graph::gpu_table::VecOk;

extern "C" {

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
  LiveFlagsKernel<<<Grid(total), 256, 0, s>>>(t->dev, t->slot_a);
  SOK_CUDA(cub::DeviceScan::ExclusiveSum(t->cub_temp, bytes, t->slot_a, t->slot_b, n, s));
  ExportFlagsKernel<<<Grid(total), 256, 0, s>>>(t->dev, t->slot_a, t->slot_b, offset, updated_after,
                                                t->slot_c);
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
