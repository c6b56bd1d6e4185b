// CUDA kernels of the util family: unique-with-counts and a deterministic
// unsorted segment sum (see util_launcher.h). Both group equal keys with a
// stable radix sort of (key, position) pairs, so within a group positions
// stay in input order: the first is the first appearance, and sums run in
// position order as on the CPU.
#include <algorithm>
#include <climits>
#include <cstdint>

#include <cub/cub.cuh>
#include <cuda_runtime.h>

#include "tf_ops/util/kernels/util_launcher.h"

namespace {

#define SOK_CUDA(expr)                                              \
  do {                                                              \
    const cudaError_t sok_err_ = (expr);                            \
    if (sok_err_ != cudaSuccess) return static_cast<int>(sok_err_); \
  } while (0)

inline unsigned Grid(int64_t items) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((items + 255) / 256, 8192)));
}

#define SOK_FOR_EACH(i, n)                                                             \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

size_t Align(size_t x) { return (x + 255) & ~size_t{255}; }

int BitsFor(int64_t max_value) {
  int bits = 1;
  while (bits < 63 && (int64_t{1} << bits) <= max_value) ++bits;
  return bits;
}

// Carves aligned pieces out of one scratch block; with base == nullptr it
// only adds up the size.
class Carver {
 public:
  explicit Carver(void* base) : base_(static_cast<char*>(base)) {}
  template <typename T>
  T* Take(int64_t count) {
    T* p = base_ ? reinterpret_cast<T*>(base_ + used_) : nullptr;
    used_ += Align(sizeof(T) * static_cast<size_t>(count > 0 ? count : 1));
    return p;
  }
  size_t used() const { return used_; }

 private:
  char* base_;
  size_t used_ = 0;
};

__global__ void Iota(int64_t* out, int64_t n) {
  SOK_FOR_EACH(i, n) out[i] = i;
}

// ---------------------------------------------------------------------------
// Unique with counts.

// Positions, run numbers and ranks are int32 (n < 2^31): half the bytes
// of int64 through every sort and gather.

__global__ void Iota32(int32_t* out, int64_t n) {
  SOK_FOR_EACH(i, n) out[i] = static_cast<int32_t>(i);
}

// head[j] = 1 where sorted key j starts a run; first_flag is cleared.
template <typename K>
__global__ void RunHeads(const K* __restrict__ sorted, int64_t n, int32_t* __restrict__ head,
                         int32_t* __restrict__ first_flag) {
  SOK_FOR_EACH(j, n) {
    head[j] = (j == 0 || sorted[j] != sorted[j - 1]) ? 1 : 0;
    first_flag[j] = 0;
  }
}

// Per run r (run_of[j] = r + 1 at its head): its first sorted index, and a
// flag at its first position (positions of a run are ascending: the sort is
// stable).
__global__ void Runs(const int32_t* __restrict__ sorted_pos, const int32_t* __restrict__ head,
                     const int32_t* __restrict__ run_of, int64_t n,
                     int32_t* __restrict__ run_start, int32_t* __restrict__ first_flag,
                     int64_t* __restrict__ num_runs) {
  SOK_FOR_EACH(j, n) {
    if (head[j]) {
      run_start[run_of[j] - 1] = static_cast<int32_t>(j);
      first_flag[sorted_pos[j]] = 1;
    }
    if (j == n - 1) *num_runs = run_of[j];
  }
}

// Each run's rank k in order of first appearance — the number of runs that
// first appear at or before its first position (first_rank, the prefix sum
// of the flags), minus one — then y[k], count[k] and the run's rank.
template <typename K, typename I>
__global__ void UniqueOut(const int32_t* __restrict__ first_rank,
                          const int32_t* __restrict__ sorted_pos, const K* __restrict__ sorted,
                          const int32_t* __restrict__ run_start,
                          const int64_t* __restrict__ num_runs, int64_t n, K* __restrict__ y,
                          I* __restrict__ count, int32_t* __restrict__ rank_of) {
  const int64_t runs = *num_runs;
  SOK_FOR_EACH(r, runs) {
    const int32_t start = run_start[r];
    const int32_t k = first_rank[sorted_pos[start]] - 1;
    y[k] = sorted[start];
    count[k] = static_cast<I>((r + 1 < runs ? run_start[r + 1] : n) - start);
    rank_of[r] = k;
  }
}

template <typename I>
__global__ void UniqueIdx(const int32_t* __restrict__ sorted_pos,
                          const int32_t* __restrict__ run_of,
                          const int32_t* __restrict__ rank_of, int64_t n, I* __restrict__ idx) {
  SOK_FOR_EACH(j, n) idx[sorted_pos[j]] = static_cast<I>(rank_of[run_of[j] - 1]);
}

template <typename K, typename I>
int UniqueWithCounts(const K* x, int64_t n, K* y, I* idx, I* count, int64_t* num_unique,
                     void* temp, size_t* temp_bytes, cudaStream_t s) {
  if (n >= INT_MAX) return static_cast<int>(cudaErrorInvalidValue);  // CUB counts are int
  const int num = static_cast<int>(n);
  size_t sort_bytes = 0, scan_bytes = 0;
  SOK_CUDA(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, x, static_cast<K*>(nullptr),
                                           static_cast<const int32_t*>(nullptr),
                                           static_cast<int32_t*>(nullptr), num, 0,
                                           static_cast<int>(8 * sizeof(K)), s));
  SOK_CUDA(cub::DeviceScan::InclusiveSum(nullptr, scan_bytes, static_cast<int32_t*>(nullptr),
                                         static_cast<int32_t*>(nullptr), num, s));
  const size_t cub_bytes = std::max(sort_bytes, scan_bytes);
  Carver c(temp);
  K* sorted = c.Take<K>(n);
  int32_t* pos = c.Take<int32_t>(n);
  int32_t* sorted_pos = c.Take<int32_t>(n);
  int32_t* head = c.Take<int32_t>(n);
  int32_t* run_of = c.Take<int32_t>(n);
  int32_t* run_start = c.Take<int32_t>(n);
  int32_t* first_flag = c.Take<int32_t>(n);
  int32_t* first_rank = c.Take<int32_t>(n);
  int32_t* rank_of = c.Take<int32_t>(n);
  void* cub_temp = c.Take<char>(static_cast<int64_t>(cub_bytes));
  if (temp == nullptr) {
    *temp_bytes = c.used();
    return 0;
  }
  if (*temp_bytes < c.used()) return static_cast<int>(cudaErrorInvalidValue);
  if (n <= 0) return static_cast<int>(cudaMemsetAsync(num_unique, 0, sizeof(int64_t), s));
  Iota32<<<Grid(n), 256, 0, s>>>(pos, n);
  size_t bytes = cub_bytes;
  SOK_CUDA(cub::DeviceRadixSort::SortPairs(cub_temp, bytes, x, sorted, pos, sorted_pos, num, 0,
                                           static_cast<int>(8 * sizeof(K)), s));
  RunHeads<<<Grid(n), 256, 0, s>>>(sorted, n, head, first_flag);
  bytes = cub_bytes;
  SOK_CUDA(cub::DeviceScan::InclusiveSum(cub_temp, bytes, head, run_of, num, s));
  Runs<<<Grid(n), 256, 0, s>>>(sorted_pos, head, run_of, n, run_start, first_flag, num_unique);
  // Runs in order of first appearance: a prefix sum over the flags at their
  // first positions ranks them (no second sort).
  bytes = cub_bytes;
  SOK_CUDA(cub::DeviceScan::InclusiveSum(cub_temp, bytes, first_flag, first_rank, num, s));
  UniqueOut<<<Grid(n), 256, 0, s>>>(first_rank, sorted_pos, sorted, run_start, num_unique, n, y,
                                    count, rank_of);
  UniqueIdx<<<Grid(n), 256, 0, s>>>(sorted_pos, run_of, rank_of, n, idx);
  return static_cast<int>(cudaGetLastError());
}

// ---------------------------------------------------------------------------
// Unsorted segment sum.

// Sort key of each position: its segment, or num_segments (sorted last and
// never summed) for dropped (negative) and bad (too large) ids.
template <typename I>
__global__ void SegmentKeys(const I* __restrict__ ids, int64_t n, int64_t num_segments,
                            int64_t* __restrict__ keys, unsigned long long* first_bad) {
  SOK_FOR_EACH(i, n) {
    const int64_t id = static_cast<int64_t>(ids[i]);
    if (id >= num_segments) atomicMin(first_bad, static_cast<unsigned long long>(i));
    keys[i] = (id < 0 || id >= num_segments) ? num_segments : id;
  }
}

// start[s] = first sorted index whose segment is >= s, for s in [0, num_segments].
__global__ void SegmentStarts(const int64_t* __restrict__ sorted, int64_t n,
                              int64_t num_segments, int64_t* __restrict__ start) {
  SOK_FOR_EACH(s, num_segments + 1) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (sorted[mid] < s) lo = mid + 1; else hi = mid;
    }
    start[s] = lo;
  }
}

// One thread per (segment, column), adding its segment's rows in position
// order; neighbouring threads read neighbouring columns of one row.
__global__ void SumSegments(const float* __restrict__ data, const int64_t* __restrict__ order,
                            const int64_t* __restrict__ start, int64_t num_segments,
                            int64_t width, float* __restrict__ out) {
  SOK_FOR_EACH(i, num_segments * width) {
    const int64_t seg = i / width;
    const int64_t col = i - seg * width;
    float acc = 0.0f;
    for (int64_t k = start[seg]; k < start[seg + 1]; ++k) acc += data[order[k] * width + col];
    out[i] = acc;
  }
}

template <typename I>
int SegmentSum(const float* data, const I* ids, int64_t n, int64_t width, int64_t num_segments,
               float* out, int64_t* first_bad, void* temp, size_t* temp_bytes, cudaStream_t s) {
  if (n > INT_MAX || num_segments < 0 || width < 0) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  const int num = static_cast<int>(n);
  const int bits = BitsFor(num_segments);
  size_t sort_bytes = 0;
  SOK_CUDA(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, static_cast<int64_t*>(nullptr),
                                           static_cast<int64_t*>(nullptr),
                                           static_cast<const int64_t*>(nullptr),
                                           static_cast<int64_t*>(nullptr), num, 0, bits, s));
  Carver c(temp);
  int64_t* keys = c.Take<int64_t>(n);
  int64_t* pos = c.Take<int64_t>(n);
  int64_t* sorted = c.Take<int64_t>(n);
  int64_t* order = c.Take<int64_t>(n);
  // Segment starts only when there is something to sum (no scratch for the
  // 2^60 empty segments a zero-width call may ask for).
  int64_t* start = c.Take<int64_t>(num_segments == 0 || width == 0 ? 0 : num_segments + 1);
  void* cub_temp = c.Take<char>(static_cast<int64_t>(sort_bytes));
  if (temp == nullptr) {
    *temp_bytes = c.used();
    return 0;
  }
  if (*temp_bytes < c.used()) return static_cast<int>(cudaErrorInvalidValue);
  if (num_segments == 0 || width == 0) {
    if (n > 0) {
      SegmentKeys<I><<<Grid(n), 256, 0, s>>>(ids, n, num_segments, keys,
                                             reinterpret_cast<unsigned long long*>(first_bad));
    }
    return static_cast<int>(cudaGetLastError());
  }
  if (n > 0) {
    SegmentKeys<I><<<Grid(n), 256, 0, s>>>(ids, n, num_segments, keys,
                                           reinterpret_cast<unsigned long long*>(first_bad));
    Iota<<<Grid(n), 256, 0, s>>>(pos, n);
    size_t bytes = sort_bytes;
    SOK_CUDA(cub::DeviceRadixSort::SortPairs(cub_temp, bytes, keys, sorted, pos, order, num, 0,
                                             bits, s));
  }
  SegmentStarts<<<Grid(num_segments + 1), 256, 0, s>>>(sorted, n, num_segments, start);
  SumSegments<<<Grid(num_segments * width), 256, 0, s>>>(data, order, start, num_segments,
                                                         width, out);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

#define SOK_EXPORT extern "C" __attribute__((visibility("default")))

#define SOK_UNIQUE(NAME, K, I)                                                               \
  SOK_EXPORT int NAME(const K* x, int64_t n, K* y, I* idx, I* count, int64_t* num_unique,    \
                      void* temp, size_t* temp_bytes, void* stream) {                        \
    return UniqueWithCounts<K, I>(x, n, y, idx, count, num_unique, temp, temp_bytes,         \
                                  static_cast<cudaStream_t>(stream));                        \
  }
SOK_UNIQUE(sok_unique_with_counts_i64_i32, int64_t, int32_t)
SOK_UNIQUE(sok_unique_with_counts_i64_i64, int64_t, int64_t)
SOK_UNIQUE(sok_unique_with_counts_i32_i32, int32_t, int32_t)
SOK_UNIQUE(sok_unique_with_counts_i32_i64, int32_t, int64_t)
#undef SOK_UNIQUE

SOK_EXPORT int sok_unsorted_segment_sum_f32_i32(const float* data, const int32_t* segment_ids,
                                                int64_t n, int64_t width, int64_t num_segments,
                                                float* out, int64_t* first_bad, void* temp,
                                                size_t* temp_bytes, void* stream) {
  return SegmentSum<int32_t>(data, segment_ids, n, width, num_segments, out, first_bad, temp,
                             temp_bytes, static_cast<cudaStream_t>(stream));
}

SOK_EXPORT int sok_unsorted_segment_sum_f32_i64(const float* data, const int64_t* segment_ids,
                                                int64_t n, int64_t width, int64_t num_segments,
                                                float* out, int64_t* first_bad, void* temp,
                                                size_t* temp_bytes, void* stream) {
  return SegmentSum<int64_t>(data, segment_ids, n, width, num_segments, out, first_bad, temp,
                             temp_bytes, static_cast<cudaStream_t>(stream));
}
