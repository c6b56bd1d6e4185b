// CUDA side of SokRouteGroupedKeys (see route_keys_launcher.h): the keys
// formed, the unique of util_kernels.cu, each distinct key's owner and key on
// its owner, the bucketing of bucketize.cu over those owners (padding past the
// distinct keys goes to an owner after the last, so it sorts last), then the
// keys placed in owner order and each id's slot. One launcher, so the op is one
// step of TensorFlow's executor however many kernels it queues.
#include <algorithm>
#include <climits>
#include <cstdint>

#include <cuda_runtime.h>

#include "tf_ops/common/cuda_helpers.cuh"
#include "tf_ops/sharding/core/route_keys.h"
#include "tf_ops/sharding/kernels/bucketize_launcher.h"
#include "tf_ops/sharding/kernels/route_keys_launcher.h"
#include "tf_ops/util/kernels/util_launcher.h"

namespace {

using sok_graph::cuda::Align;
using sok_graph::cuda::Grid;
namespace core = sok_graph::core;

__global__ void Keys(const int64_t* __restrict__ ids, const int64_t* __restrict__ tables,
                     int64_t n, int64_t num_tables, int64_t* __restrict__ keys) {
  SOK_FOR_EACH(i, n) {
    keys[i] = core::GroupedKey(ids[i], core::FloorMod(tables[i], num_tables), num_tables);
  }
}

// Past the *num_distinct distinct keys: owner world_size, key -1.
__global__ void Owners(const int64_t* __restrict__ distinct,
                       const int64_t* __restrict__ num_distinct, int64_t n, int64_t num_tables,
                       int64_t world_size, int64_t fixed_owner, int64_t* __restrict__ owners,
                       int64_t* __restrict__ on_owner) {
  const int64_t d = *num_distinct;
  SOK_FOR_EACH(j, n) {
    if (j < d) {
      const int64_t key = distinct[j];
      owners[j] = core::GroupedKeyOwner(key, num_tables, world_size, fixed_owner);
      on_owner[j] = core::GroupedKeyOnOwner(key, num_tables, world_size, fixed_owner);
    } else {
      owners[j] = world_size;
      on_owner[j] = -1;
    }
  }
}

// sent[k] = on_owner[permutation[k]]; slots[i] (an index among the distinct
// keys on entry) becomes that key's place in `sent`.
__global__ void Place(const int64_t* __restrict__ on_owner,
                      const int64_t* __restrict__ permutation,
                      const int64_t* __restrict__ inverse, int64_t n,
                      int64_t* __restrict__ sent, int64_t* __restrict__ slots) {
  SOK_FOR_EACH(i, n) {
    sent[i] = on_owner[permutation[i]];
    slots[i] = inverse[slots[i]];
  }
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int sok_route_grouped_keys(
    const int64_t* ids, const int64_t* tables, int64_t n, int64_t num_tables,
    int64_t world_size, int64_t fixed_owner, int64_t* sent, int64_t* sizes, int64_t* slots,
    void* temp, size_t* temp_bytes, void* stream) {
  if (n < 0 || n >= (int64_t{1} << 30) || num_tables < 1 || world_size < 1 ||
      world_size >= INT_MAX || fixed_owner >= world_size) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  // The unique and the bucketing run one after the other: they share a scratch.
  size_t unique_bytes = 0, bucket_bytes = 0;
  int err = sok_unique_in_set_i64_i64(nullptr, n, 0, nullptr, nullptr, nullptr, nullptr,
                                      nullptr, &unique_bytes, stream);
  if (err != 0) return err;
  err = sok_bucketize_by_owner_i64(nullptr, n, world_size + 1, -1, nullptr, nullptr, nullptr,
                                   nullptr, nullptr, nullptr, &bucket_bytes, stream);
  if (err != 0) return err;
  const size_t n8 = Align(sizeof(int64_t) * static_cast<size_t>(n > 0 ? n : 1));
  const size_t total = 5 * n8 + Align(sizeof(int64_t) * static_cast<size_t>(world_size + 3)) +
                       Align(std::max(unique_bytes, bucket_bytes));
  if (temp == nullptr) {
    *temp_bytes = total;
    return 0;
  }
  if (*temp_bytes < total) return static_cast<int>(cudaErrorInvalidValue);
  char* p = static_cast<char*>(temp);
  int64_t* keys = reinterpret_cast<int64_t*>(p);  // then each distinct key's owner
  int64_t* on_owner = reinterpret_cast<int64_t*>(p + n8);
  int64_t* bucketed = reinterpret_cast<int64_t*>(p + 2 * n8);
  int64_t* permutation = reinterpret_cast<int64_t*>(p + 3 * n8);
  int64_t* inverse = reinterpret_cast<int64_t*>(p + 4 * n8);
  int64_t* all_sizes = reinterpret_cast<int64_t*>(p + 5 * n8);  // [world_size + 1]
  int64_t* num_distinct = all_sizes + world_size + 1;
  int64_t* first_negative = num_distinct + 1;  // owners are never negative: unused
  void* shared = p + 5 * n8 + Align(sizeof(int64_t) * static_cast<size_t>(world_size + 3));
  if (n > 0) {
    Keys<<<Grid(n), 256, 0, s>>>(ids, tables, n, num_tables, keys);
    // The distinct keys go to `sent` for now, each id's index among them to
    // `slots`; Place overwrites both.
    size_t bytes = unique_bytes;
    err = sok_unique_in_set_i64_i64(keys, n, 0, sent, slots, nullptr, num_distinct, shared,
                                    &bytes, stream);
    if (err != 0) return err;
    Owners<<<Grid(n), 256, 0, s>>>(sent, num_distinct, n, num_tables, world_size, fixed_owner,
                                   keys, on_owner);
  }
  size_t bytes = bucket_bytes;
  err = sok_bucketize_by_owner_i64(keys, n, world_size + 1, -1, bucketed, all_sizes,
                                   permutation, inverse, first_negative, shared, &bytes, stream);
  if (err != 0) return err;
  if (n > 0) Place<<<Grid(n), 256, 0, s>>>(on_owner, permutation, inverse, n, sent, slots);
  err = static_cast<int>(cudaMemcpyAsync(sizes, all_sizes, sizeof(int64_t) * world_size,
                                         cudaMemcpyDeviceToDevice, s));
  if (err != 0) return err;
  return static_cast<int>(cudaGetLastError());
}
