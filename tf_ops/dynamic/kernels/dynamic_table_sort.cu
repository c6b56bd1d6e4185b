// The stable sort of (key, value) int64 pairs for the GPU hash table
// (dynamic_table_internal.cuh): of a batch by key (the exact insert path's
// distinct keys), of eviction candidates by each criterion, and of a
// batch's positions by slot (rows applied in batch order). Its own file as
// three parts call it.
#include <cstdint>

#include <cub/cub.cuh>
#include <cuda_runtime.h>

#include "tf_ops/common/cuda_helpers.cuh"
#include "tf_ops/dynamic/kernels/dynamic_table_internal.cuh"

namespace sok_graph {
namespace gpu_table {
namespace {

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

}  // namespace

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

}  // namespace gpu_table
}  // namespace sok_graph
