// CUDA backward of the fused lookup (see lookup_launcher.h). Sort (id,
// position) pairs, find the runs of equal ids, then sum each run's rows in
// position order. sok_unique_segment_sum_f32 is the core on per-position
// gradient rows (ids ascending); sok_lookup_backward_plan/_rows is the whole
// gradient of one table as the TensorFlow op defines it.
#include <algorithm>
#include <climits>

#include <cub/cub.cuh>
#include <cuda_runtime.h>

#include "tf_ops/lookup/core/combiner.h"
#include "tf_ops/lookup/kernels/lookup_launcher.h"

namespace {

__global__ void Iota(int64_t* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = i;
  }
}

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

size_t Align(size_t x) { return (x + 255) & ~size_t{255}; }

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

// ---------------------------------------------------------------------------
// The whole gradient of one table: plan (sort, runs, order of first
// appearance, per-position factors), then rows.

namespace {

#define SOK_FOR_EACH(i, n)                                                             \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

inline unsigned Grid(int64_t items) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((items + 255) / 256, 8192)));
}

int BitsFor(int64_t max_value) {
  int bits = 1;
  while (bits < 63 && (int64_t{1} << bits) <= max_value) ++bits;
  return bits;
}

// The plan's scratch, carved from one block in a fixed order (both calls
// compute the same layout from nnz and the sort sizes).
struct Plan {
  int64_t* keys;          // ids as int64
  int64_t* sorted_keys;
  int32_t* pos;           // 0..n-1, then reused for run numbers
  int32_t* sorted_pos;
  int32_t* head;
  int32_t* run_of;        // 1-based run of each sorted index
  int32_t* run_start;
  int32_t* first_pos;     // per run; n for unused entries
  int32_t* first_sorted;
  int32_t* order;         // runs in order of first appearance
  int32_t* rank_of;       // run -> its index in the output
  int32_t* sample_of;     // position -> sample
  float* factor;          // position -> weight * combiner factor
  float* piece_sum;       // [n, dim]: a run's piece within a chunk, at its first sorted index
  int64_t* num_runs;
  void* cub;
  size_t cub_bytes;
  size_t total;
};

size_t Align256(size_t x) { return (x + 255) & ~size_t{255}; }

cudaError_t LayPlan(char* base, int64_t n, int dim, int key_bits, Plan* p, cudaStream_t s) {
  const int num = static_cast<int>(n);
  size_t a = 0, b = 0, c = 0;
  cudaError_t err = cub::DeviceRadixSort::SortPairs(
      nullptr, a, static_cast<const int64_t*>(nullptr), static_cast<int64_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), num, 0, key_bits, s);
  if (err != cudaSuccess) return err;
  err = cub::DeviceRadixSort::SortPairs(nullptr, b, static_cast<const int32_t*>(nullptr),
                                        static_cast<int32_t*>(nullptr),
                                        static_cast<const int32_t*>(nullptr),
                                        static_cast<int32_t*>(nullptr), num, 0, 32, s);
  if (err != cudaSuccess) return err;
  err = cub::DeviceScan::InclusiveSum(nullptr, c, static_cast<int32_t*>(nullptr),
                                      static_cast<int32_t*>(nullptr), num, s);
  if (err != cudaSuccess) return err;
  p->cub_bytes = std::max(a, std::max(b, c));
  size_t off = 0;
  auto take = [&](size_t bytes) {
    char* q = base ? base + off : nullptr;
    off += Align256(bytes > 0 ? bytes : 1);
    return q;
  };
  const size_t m = static_cast<size_t>(n > 0 ? n : 1);
  p->keys = reinterpret_cast<int64_t*>(take(8 * m));
  p->sorted_keys = reinterpret_cast<int64_t*>(take(8 * m));
  int32_t** ints[] = {&p->pos, &p->sorted_pos, &p->head, &p->run_of, &p->run_start,
                      &p->first_pos, &p->first_sorted, &p->order, &p->rank_of, &p->sample_of};
  for (int32_t** q : ints) *q = reinterpret_cast<int32_t*>(take(4 * m));
  p->factor = reinterpret_cast<float*>(take(4 * m));
  p->piece_sum = reinterpret_cast<float*>(take(4 * m * static_cast<size_t>(dim > 0 ? dim : 1)));
  p->num_runs = reinterpret_cast<int64_t*>(take(8));
  p->cub = take(p->cub_bytes);
  p->total = off;
  return cudaSuccess;
}

__device__ __forceinline__ int64_t LoadId(const SokLookupTable& t, int64_t j) {
  return t.id_bytes == 4 ? static_cast<int64_t>(static_cast<const int32_t*>(t.ids)[j])
                         : static_cast<const int64_t*>(t.ids)[j];
}

__global__ void PlanKeys(SokLookupTable t, int64_t n, int64_t* __restrict__ keys,
                         int32_t* __restrict__ pos, int64_t* first_bad) {
  SOK_FOR_EACH(j, n) {
    const int64_t id = LoadId(t, j);
    if (id < 0 || id >= t.rows) {
      atomicMin(reinterpret_cast<unsigned long long*>(first_bad),
                static_cast<unsigned long long>(j));
    }
    keys[j] = id;
    pos[j] = static_cast<int32_t>(j);
  }
}

__global__ void PlanHeads(const int64_t* __restrict__ sorted, int64_t n, int32_t* __restrict__ head,
                          int32_t* __restrict__ first_pos) {
  SOK_FOR_EACH(j, n) {
    head[j] = (j == 0 || sorted[j] != sorted[j - 1]) ? 1 : 0;
    first_pos[j] = static_cast<int32_t>(n);
  }
}

__global__ void PlanRuns(const int32_t* __restrict__ head, const int32_t* __restrict__ run_of,
                         const int32_t* __restrict__ sorted_pos, int64_t n,
                         int32_t* __restrict__ run_start, int32_t* __restrict__ first_pos,
                         int32_t* __restrict__ runs_iota, int64_t* num_runs) {
  SOK_FOR_EACH(j, n) {
    if (head[j]) {
      const int32_t r = run_of[j] - 1;
      run_start[r] = static_cast<int32_t>(j);
      first_pos[r] = sorted_pos[j];
    }
    runs_iota[j] = static_cast<int32_t>(j);
    if (j == n - 1) *num_runs = run_of[j];
  }
}

__global__ void PlanRanks(const int32_t* __restrict__ order, const int64_t* num_runs,
                          int32_t* __restrict__ rank_of) {
  const int64_t runs = *num_runs;
  SOK_FOR_EACH(k, runs) rank_of[order[k]] = static_cast<int32_t>(k);
}

// One thread per sample: its combiner factor (weights summed in order, as
// the CPU kernel does), then each of its positions' factor and sample.
__global__ void PlanSamples(SokLookupTable t, int32_t* __restrict__ sample_of,
                            float* __restrict__ factor) {
  SOK_FOR_EACH(b, t.batch) {
    // Clamped as in the forward: malformed row_splits (reported before the
    // rows are written) never lead outside the ids.
    const int64_t s0 = t.row_splits[b], s1 = t.row_splits[b + 1];
    const int64_t j0 = s0 < 0 ? 0 : (s0 > t.nnz ? t.nnz : s0);
    const int64_t j1 = s1 < j0 ? j0 : (s1 > t.nnz ? t.nnz : s1);
    float sum = 0.0f, sq = 0.0f;
    for (int64_t j = j0; j < j1; ++j) {
      const float w = t.weights ? t.weights[j] : 1.0f;
      sum += w;
      sq += w * w;
    }
    const float scale =
        sok_graph::core::CombinerScale(static_cast<sok_graph::core::Combiner>(t.combiner), sum, sq);
    for (int64_t j = j0; j < j1; ++j) {
      sample_of[j] = static_cast<int32_t>(b);
      factor[j] = (t.weights ? t.weights[j] : 1.0f) * scale;
    }
  }
}

template <typename K>
__global__ void RowsIds(const int64_t* __restrict__ sorted_keys,
                        const int32_t* __restrict__ run_start, const int32_t* __restrict__ rank_of,
                        const int64_t* num_runs, K* __restrict__ unique_ids) {
  const int64_t runs = *num_runs;
  SOK_FOR_EACH(r, runs) unique_ids[rank_of[r]] = static_cast<K>(sorted_keys[run_start[r]]);
}

// A run's gradient row is the sum over its sorted positions, in order. A
// hot id (a Zipf-skewed feature's head, or a small vocabulary) has
// thousands of positions, so the sum is taken in two deterministic steps:
// the sorted positions are cut into chunks of kChunk, and a run's piece in
// each chunk is summed in order (RowsPieces), then a run's pieces are added
// in order (RowsSum). A run inside one chunk is summed exactly as one loop
// over its positions would sum it.
constexpr int64_t kChunk = 32;

// One thread per (chunk, column): each piece's sum, at its first index.
__global__ void RowsPieces(const float* __restrict__ grads, const int32_t* __restrict__ sorted_pos,
                           const int32_t* __restrict__ head, const int32_t* __restrict__ sample_of,
                           const float* __restrict__ factor, int64_t n, int dim,
                           float* __restrict__ piece_sum) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  SOK_FOR_EACH(i, chunks * dim) {
    const int64_t c = i / dim;
    const int d = static_cast<int>(i - c * dim);
    const int64_t k0 = c * kChunk, k1 = k0 + kChunk < n ? k0 + kChunk : n;
    int64_t first = k0;
    float acc = 0.0f;
    for (int64_t k = k0; k < k1; ++k) {
      if (k > k0 && head[k]) {
        piece_sum[first * dim + d] = acc;
        acc = 0.0f;
        first = k;
      }
      const int32_t p = sorted_pos[k];
      acc += factor[p] * grads[static_cast<int64_t>(sample_of[p]) * dim + d];
    }
    piece_sum[first * dim + d] = acc;
  }
}

// One thread per (run, column): the run's pieces, in order.
__global__ void RowsSum(const float* __restrict__ piece_sum, const int32_t* __restrict__ run_start,
                        const int32_t* __restrict__ rank_of, const int64_t* num_runs, int64_t n,
                        int dim, float* __restrict__ grad_rows) {
  const int64_t runs = *num_runs;
  SOK_FOR_EACH(i, runs * dim) {
    const int64_t r = i / dim;
    const int d = static_cast<int>(i - r * dim);
    const int64_t k0 = run_start[r], k1 = r + 1 < runs ? run_start[r + 1] : n;
    float acc = 0.0f;
    for (int64_t k = k0; k < k1; k = (k / kChunk + 1) * kChunk) acc += piece_sum[k * dim + d];
    grad_rows[static_cast<int64_t>(rank_of[r]) * dim + d] = acc;
  }
}

// max_norm's clip, backwards, on each unique row (a warp per row):
// g <- (m / |x|) (g - x (x.g) / |x|^2) where |x| > m.
__global__ void RowsClip(SokLookupTable t, const int64_t* __restrict__ sorted_keys,
                         const int32_t* __restrict__ run_start, const int32_t* __restrict__ rank_of,
                         const int64_t* num_runs, float* __restrict__ grad_rows) {
  const int64_t runs = *num_runs;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  const int lane = threadIdx.x % 32;
  for (int64_t r = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; r < runs;
       r += warps) {
    const int64_t id = sorted_keys[run_start[r]];
    const float* x = t.params + id * t.dim;
    float* g = grad_rows + static_cast<int64_t>(rank_of[r]) * t.dim;
    float sq = 0.0f, dot = 0.0f;
    for (int d = lane; d < t.dim; d += 32) {
      sq += x[d] * x[d];
      dot += x[d] * g[d];
    }
    for (int off = 16; off > 0; off /= 2) {
      sq += __shfl_xor_sync(0xffffffffu, sq, off);
      dot += __shfl_xor_sync(0xffffffffu, dot, off);
    }
    const float norm = sqrtf(sq);
    if (!(norm > t.max_norm)) continue;
    const float scale = t.max_norm / norm, proj = dot / sq;
    for (int d = lane; d < t.dim; d += 32) g[d] = scale * (g[d] - x[d] * proj);
  }
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int sok_lookup_backward_plan(
    const SokLookupTable* table, int64_t nnz, int key_bits, int64_t* num_unique,
    int64_t* first_bad, void* temp, size_t* temp_bytes, void* stream) {
  if (nnz < 0 || nnz >= INT_MAX) return static_cast<int>(cudaErrorInvalidValue);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int bits = key_bits > 0 && key_bits < 64 ? key_bits : 64;
  Plan p;
  cudaError_t err = LayPlan(static_cast<char*>(temp), nnz, table->dim, bits, &p, s);
  if (err != cudaSuccess) return static_cast<int>(err);
  if (temp == nullptr) {
    *temp_bytes = p.total;
    return 0;
  }
  if (*temp_bytes < p.total) return static_cast<int>(cudaErrorInvalidValue);
  const SokLookupTable t = *table;
  if (nnz == 0) {
    err = cudaMemsetAsync(p.num_runs, 0, sizeof(int64_t), s);
    if (err == cudaSuccess) err = cudaMemsetAsync(num_unique, 0, sizeof(int64_t), s);
    return static_cast<int>(err);
  }
  const int num = static_cast<int>(nnz);
  PlanKeys<<<Grid(nnz), 256, 0, s>>>(t, nnz, p.keys, p.pos, first_bad);
  size_t bytes = p.cub_bytes;
  err = cub::DeviceRadixSort::SortPairs(p.cub, bytes, p.keys, p.sorted_keys, p.pos, p.sorted_pos,
                                        num, 0, bits, s);
  if (err != cudaSuccess) return static_cast<int>(err);
  PlanHeads<<<Grid(nnz), 256, 0, s>>>(p.sorted_keys, nnz, p.head, p.first_pos);
  bytes = p.cub_bytes;
  err = cub::DeviceScan::InclusiveSum(p.cub, bytes, p.head, p.run_of, num, s);
  if (err != cudaSuccess) return static_cast<int>(err);
  PlanRuns<<<Grid(nnz), 256, 0, s>>>(p.head, p.run_of, p.sorted_pos, nnz, p.run_start,
                                     p.first_pos, p.pos, p.num_runs);
  bytes = p.cub_bytes;
  err = cub::DeviceRadixSort::SortPairs(p.cub, bytes, p.first_pos, p.first_sorted, p.pos, p.order,
                                        num, 0, BitsFor(nnz), s);
  if (err != cudaSuccess) return static_cast<int>(err);
  PlanRanks<<<Grid(nnz), 256, 0, s>>>(p.order, p.num_runs, p.rank_of);
  PlanSamples<<<Grid(t.batch), 256, 0, s>>>(t, p.sample_of, p.factor);
  err = cudaMemcpyAsync(num_unique, p.num_runs, sizeof(int64_t), cudaMemcpyDeviceToDevice, s);
  if (err != cudaSuccess) return static_cast<int>(err);
  return static_cast<int>(cudaGetLastError());
}

extern "C" __attribute__((visibility("default"))) int sok_lookup_backward_rows(
    const SokLookupTable* table, int64_t nnz, const float* grads, void* temp, void* unique_ids,
    float* grad_rows, void* stream) {
  if (nnz <= 0) return 0;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const SokLookupTable t = *table;
  Plan p;
  // Same layout as the plan call: the key bits only change CUB's scratch
  // size, which comes last, so any value lays the pieces out the same way.
  cudaError_t err = LayPlan(static_cast<char*>(temp), nnz, t.dim, 64, &p, s);
  if (err != cudaSuccess) return static_cast<int>(err);
  if (t.id_bytes == 4) {
    RowsIds<int32_t><<<Grid(nnz), 256, 0, s>>>(p.sorted_keys, p.run_start, p.rank_of, p.num_runs,
                                                static_cast<int32_t*>(unique_ids));
  } else {
    RowsIds<int64_t><<<Grid(nnz), 256, 0, s>>>(p.sorted_keys, p.run_start, p.rank_of, p.num_runs,
                                                static_cast<int64_t*>(unique_ids));
  }
  RowsPieces<<<Grid((nnz + kChunk - 1) / kChunk * t.dim), 256, 0, s>>>(
      grads, p.sorted_pos, p.head, p.sample_of, p.factor, nnz, t.dim, p.piece_sum);
  RowsSum<<<Grid(nnz * t.dim), 256, 0, s>>>(p.piece_sum, p.run_start, p.rank_of, p.num_runs,
                                             nnz, t.dim, grad_rows);
  if (t.max_norm > 0.0f) {
    RowsClip<<<Grid(nnz * 32), 256, 0, s>>>(t, p.sorted_keys, p.run_start, p.rank_of, p.num_runs,
                                             grad_rows);
  }
  return static_cast<int>(cudaGetLastError());
}
