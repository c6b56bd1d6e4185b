// The backward's core on one table's per-position gradient rows
// (sok_unique_segment_sum_f32, see lookup_launcher.h): sort (id, position)
// pairs, find the runs of equal ids, then sum each run's rows in position
// order. Self-contained; the whole gradient of a lookup's tables is
// lookup_backward_plan.cu's (lookup_backward_internal.cuh lists the files).
#include <algorithm>
#include <cstdint>

#include <cub/cub.cuh>
#include <cuda_runtime.h>

#include "tf_ops/common/cuda_helpers.cuh"
#include "tf_ops/lookup/kernels/lookup_launcher.h"

namespace {

using sok_graph::cuda::Align;
using sok_graph::cuda::Iota;

// One thread per (distinct id, column): most ids occur once or twice, so a
// warp per id would leave most lanes idle at small dimensions. A thread adds
// the run's rows in ascending position (a stable sort keeps them so).
__global__ void SumRuns(const float* __restrict__ grads, const int64_t* __restrict__ sorted_pos,
                        const int64_t* __restrict__ run_starts, const int* __restrict__ run_lengths,
                        const int64_t* __restrict__ num_runs, int dim, float* __restrict__ summed) {
  const int64_t items = *num_runs * dim;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < items;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t run = i / dim;
    const int d = static_cast<int>(i % dim);
    const int64_t start = run_starts[run];
    const int len = run_lengths[run];
    float acc = 0.0f;
    for (int k = 0; k < len; ++k) acc += __ldg(grads + sorted_pos[start + k] * dim + d);
    summed[i] = acc;
  }
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int sok_unique_segment_sum_f32(
    const int64_t* ids, const float* grads, int64_t n, int dim, int key_bits,
    int64_t* unique_ids, float* summed, int64_t* num_unique, void* temp, size_t* temp_bytes,
    void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int num = static_cast<int>(n);  // CUB's item counts are int
  // Scratch: positions, sorted ids, sorted positions, run lengths, run
  // starts, and CUB's own temporary storage (the larger of its two uses).
  size_t sort_bytes = 0, rle_bytes = 0, scan_bytes = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, ids, static_cast<int64_t*>(nullptr),
                                  static_cast<const int64_t*>(nullptr),
                                  static_cast<int64_t*>(nullptr), num, 0, 64, s);
  cub::DeviceRunLengthEncode::Encode(nullptr, rle_bytes, ids, unique_ids, (int*)nullptr,
                                     num_unique, num, s);
  cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, (int*)nullptr, (int64_t*)nullptr, num, s);
  const size_t cub_bytes = Align(std::max(sort_bytes, std::max(rle_bytes, scan_bytes)));
  const size_t n8 = Align(sizeof(int64_t) * (n > 0 ? n : 1));
  const size_t n4 = Align(sizeof(int) * (n > 0 ? n : 1));
  const size_t total = 3 * n8 + n4 + n8 + cub_bytes;
  if (temp == nullptr) {
    *temp_bytes = total;
    return 0;
  }
  if (*temp_bytes < total) return static_cast<int>(cudaErrorInvalidValue);
  char* p = static_cast<char*>(temp);
  int64_t* positions = reinterpret_cast<int64_t*>(p);
  int64_t* sorted_ids = reinterpret_cast<int64_t*>(p + n8);
  int64_t* sorted_pos = reinterpret_cast<int64_t*>(p + 2 * n8);
  int* run_lengths = reinterpret_cast<int*>(p + 3 * n8);
  int64_t* run_starts = reinterpret_cast<int64_t*>(p + 3 * n8 + n4);
  void* cub_temp = p + 4 * n8 + n4;
  if (n <= 0) return static_cast<int>(cudaMemsetAsync(num_unique, 0, sizeof(int64_t), s));
  Iota<<<static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 4096)), 256, 0, s>>>(positions, n);
  size_t bytes = cub_bytes;
  cudaError_t err = cub::DeviceRadixSort::SortPairs(cub_temp, bytes, ids, sorted_ids, positions,
                                                    sorted_pos, num, 0, 64, s);
  if (err != cudaSuccess) return static_cast<int>(err);
  bytes = cub_bytes;
  err = cub::DeviceRunLengthEncode::Encode(cub_temp, bytes, sorted_ids, unique_ids, run_lengths,
                                           num_unique, num, s);
  if (err != cudaSuccess) return static_cast<int>(err);
  bytes = cub_bytes;
  err = cub::DeviceScan::ExclusiveSum(cub_temp, bytes, run_lengths, run_starts, num, s);
  if (err != cudaSuccess) return static_cast<int>(err);
  // Sized for n runs (the most there can be); the loop bound is the count
  // on the device, so no host synchronisation is needed.
  const int64_t blocks = std::min<int64_t>((n * dim + 255) / 256, 65535 * 8);
  SumRuns<<<static_cast<unsigned>(blocks), 256, 0, s>>>(grads, sorted_pos, run_starts,
                                                         run_lengths, num_unique, dim, summed);
  return static_cast<int>(cudaGetLastError());
}
