// CUDA kernel behind SokLocalRows (see local_rows_launcher.h).
#include <cuda_runtime.h>

#include "tf_ops/sharding/kernels/local_rows_launcher.h"

namespace {

template <typename K>
__global__ void LocalRowsKernel(const K* __restrict__ ids, int64_t n, int64_t world_size,
                                K* __restrict__ out, unsigned long long* negative_count) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    const K id = ids[i];
    if (id < 0) {
      if (negative_count != nullptr) atomicAdd(negative_count, 1ULL);
      out[i] = K(-1);
    } else {
      out[i] = static_cast<K>(id / world_size);
    }
  }
}

template <typename K>
int Launch(const K* ids, int64_t n, int64_t world_size, K* out, int64_t* negative_count,
           void* stream) {
  if (n <= 0) return 0;
  const int threads = 256;
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks > 65535) blocks = 65535;
  LocalRowsKernel<K><<<static_cast<unsigned>(blocks), threads, 0,
                       static_cast<cudaStream_t>(stream)>>>(
      ids, n, world_size, out, reinterpret_cast<unsigned long long*>(negative_count));
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int sok_local_rows_int32(
    const int32_t* ids, int64_t n, int64_t world_size, int32_t* out,
    int64_t* device_negative_count, void* stream) {
  return Launch(ids, n, world_size, out, device_negative_count, stream);
}

__attribute__((visibility("default"))) int sok_local_rows_int64(
    const int64_t* ids, int64_t n, int64_t world_size, int64_t* out,
    int64_t* device_negative_count, void* stream) {
  return Launch(ids, n, world_size, out, device_negative_count, stream);
}

}  // extern "C"
