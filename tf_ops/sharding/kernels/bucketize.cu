// CUDA bucketing of ids by owning worker (see bucketize_launcher.h): a
// stable radix sort of (owner, position) pairs on the few bits an owner
// needs, then gathers; bucket sizes come from the sorted owners by binary
// search, so no global atomics pile up on a handful of counters.
#include <algorithm>
#include <climits>
#include <cstdint>

#include <cub/cub.cuh>
#include <cuda_runtime.h>

#include "tf_ops/common/cuda_helpers.cuh"
#include "tf_ops/sharding/kernels/bucketize_launcher.h"

namespace {

using sok_graph::cuda::Align;
using sok_graph::cuda::Grid;

template <typename K>
__global__ void Owners(const K* __restrict__ ids, int64_t n, int64_t world_size,
                       int64_t fixed_owner, int32_t* __restrict__ owner,
                       int64_t* __restrict__ pos, unsigned long long* first_negative) {
  SOK_FOR_EACH(i, n) {
    const int64_t id = static_cast<int64_t>(ids[i]);
    if (id < 0) atomicMin(first_negative, static_cast<unsigned long long>(i));
    owner[i] = static_cast<int32_t>(fixed_owner >= 0 ? fixed_owner
                                                     : (id < 0 ? 0 : id % world_size));
    pos[i] = i;
  }
}

template <typename K>
__global__ void Place(const K* __restrict__ ids, const int64_t* __restrict__ perm, int64_t n,
                      K* __restrict__ bucketed, int64_t* __restrict__ inverse) {
  SOK_FOR_EACH(k, n) {
    const int64_t i = perm[k];
    bucketed[k] = ids[i];
    inverse[i] = k;
  }
}

__global__ void Sizes(const int32_t* __restrict__ sorted_owner, int64_t n, int64_t world_size,
                      int64_t* __restrict__ sizes) {
  SOK_FOR_EACH(w, world_size) {
    int64_t lo = 0, hi = n;  // first index with owner >= w
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (sorted_owner[mid] < w) lo = mid + 1; else hi = mid;
    }
    int64_t lo2 = lo, hi2 = n;  // first index with owner > w
    while (lo2 < hi2) {
      const int64_t mid = (lo2 + hi2) / 2;
      if (sorted_owner[mid] <= w) lo2 = mid + 1; else hi2 = mid;
    }
    sizes[w] = lo2 - lo;
  }
}

template <typename K>
int Bucketize(const K* ids, int64_t n, int64_t world_size, int64_t fixed_owner, K* bucketed,
              int64_t* sizes, int64_t* permutation, int64_t* inverse, int64_t* first_negative,
              void* temp, size_t* temp_bytes, cudaStream_t s) {
  if (n > INT_MAX || world_size < 1 || world_size > INT_MAX || fixed_owner >= world_size) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  const int num = static_cast<int>(n);
  int bits = 1;
  while (bits < 31 && (int64_t{1} << bits) < world_size) ++bits;
  size_t sort_bytes = 0;
  cudaError_t err = cub::DeviceRadixSort::SortPairs(
      nullptr, sort_bytes, static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
      static_cast<const int64_t*>(nullptr), static_cast<int64_t*>(nullptr), num, 0, bits, s);
  if (err != cudaSuccess) return static_cast<int>(err);
  const size_t n4 = Align(sizeof(int32_t) * (n > 0 ? n : 1));
  const size_t n8 = Align(sizeof(int64_t) * (n > 0 ? n : 1));
  const size_t total = 2 * n4 + n8 + Align(sort_bytes);
  if (temp == nullptr) {
    *temp_bytes = total;
    return 0;
  }
  if (*temp_bytes < total) return static_cast<int>(cudaErrorInvalidValue);
  char* p = static_cast<char*>(temp);
  int32_t* owner = reinterpret_cast<int32_t*>(p);
  int32_t* sorted_owner = reinterpret_cast<int32_t*>(p + n4);
  int64_t* pos = reinterpret_cast<int64_t*>(p + 2 * n4);
  void* cub_temp = p + 2 * n4 + n8;
  if (n > 0) {
    Owners<K><<<Grid(n), 256, 0, s>>>(ids, n, world_size, fixed_owner, owner, pos,
                                      reinterpret_cast<unsigned long long*>(first_negative));
    size_t bytes = sort_bytes;
    err = cub::DeviceRadixSort::SortPairs(cub_temp, bytes, owner, sorted_owner, pos, permutation,
                                          num, 0, bits, s);
    if (err != cudaSuccess) return static_cast<int>(err);
    Place<K><<<Grid(n), 256, 0, s>>>(ids, permutation, n, bucketed, inverse);
  }
  Sizes<<<Grid(world_size), 256, 0, s>>>(sorted_owner, n, world_size, sizes);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int sok_bucketize_by_owner_i64(
    const int64_t* ids, int64_t n, int64_t world_size, int64_t fixed_owner, int64_t* bucketed,
    int64_t* sizes, int64_t* permutation, int64_t* inverse, int64_t* first_negative, void* temp,
    size_t* temp_bytes, void* stream) {
  return Bucketize<int64_t>(ids, n, world_size, fixed_owner, bucketed, sizes, permutation,
                            inverse, first_negative, temp, temp_bytes,
                            static_cast<cudaStream_t>(stream));
}

extern "C" __attribute__((visibility("default"))) int sok_bucketize_by_owner_i32(
    const int32_t* ids, int64_t n, int64_t world_size, int64_t fixed_owner, int32_t* bucketed,
    int64_t* sizes, int64_t* permutation, int64_t* inverse, int64_t* first_negative, void* temp,
    size_t* temp_bytes, void* stream) {
  return Bucketize<int32_t>(ids, n, world_size, fixed_owner, bucketed, sizes, permutation,
                            inverse, first_negative, temp, temp_bytes,
                            static_cast<cudaStream_t>(stream));
}
