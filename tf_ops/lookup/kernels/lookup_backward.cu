// CUDA backward of the fused lookup (see lookup_launcher.h). Sort (id,
// position) pairs, find the runs of equal ids, then sum each run's rows in
// position order. sok_unique_segment_sum_f32 is the core on per-position
// gradient rows (ids ascending); sok_lookup_backward_plan/_rows is the whole
// gradient of one table as the TensorFlow op defines it.
#include <algorithm>
#include <climits>

#include <cub/cub.cuh>
#include <cuda_runtime.h>

#include "tf_ops/common/cuda_helpers.cuh"
#include "tf_ops/lookup/core/combiner.h"
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

// ---------------------------------------------------------------------------
// The whole gradient of every table of a lookup, all tables in one launch
// sequence (a launch per step, not per step and table: with 26 small tables
// the launches, not the arithmetic, were the gradient's cost). A sort key
// is (table, id), so after the sort a table's ids fill one contiguous
// stretch of the sorted keys — the stretch its positions fill,
// [pos_begin, pos_begin + nnz) — and its distinct ids one contiguous stretch
// of the runs. Ranking the runs by their first (global) position — a flag
// at each run's first position and a prefix sum over the flags, not a
// second sort — gives every table's runs in order of first appearance,
// tables one after the other, so a run's place in its table's output is its
// rank minus the table's first run.

namespace {

#define SOK_FOR_EACH(i, n)                                                             \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

inline unsigned Grid(int64_t items) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((items + 255) / 256, 8192)));
}

// blockIdx.y is the table; blockIdx.x strides over the table's items, of
// which the largest table has max_items.
inline dim3 TableGrid(int64_t max_items, int num_tables) {
  return dim3(Grid(max_items), static_cast<unsigned>(num_tables));
}

int BitsFor(int64_t max_value) {
  int bits = 1;
  while (bits < 63 && (int64_t{1} << bits) <= max_value) ++bits;
  return bits;
}

// A position's sample (in its table) and its weight times the sample's
// combiner factor: read together, in the positions' sorted order, which is
// random order in memory — one sector per position, not two.
struct SampleFactor {
  int32_t sample;
  float factor;
};

// Where a table's pieces lie in the plan (device, one per table).
struct PlanTable {
  int64_t pos_begin;    // its first global position, and its first sorted index
  int64_t piece_begin;  // its first element of piece_sum ([nnz, dim] per table)
  int64_t run_begin;    // its first run, and its first rank
  int64_t runs;         // its distinct ids
  // 1 when the plan ranked the runs in order of first appearance, which
  // only a sparse gradient's rows use (a plan for dense gradients alone,
  // called with num_unique NULL, does not); the rows step writes no sparse
  // rows without it.
  int64_t ranked;
  // 1 when sample b's one id is at position b, for every b, and there are
  // no weights (DemoModel-style inputs): a position's sample is then the
  // position and its factor 1, so the rows step need not read them.
  // PlanTables sets it from the sizes, PlanSamples clears it.
  int64_t one_id;
};

// Sizes of the whole lookup, from the host copies of the descriptors.
struct PlanSizes {
  int64_t nnz = 0;          // all tables' ids
  int64_t piece_elems = 0;  // sum of nnz * dim
  int64_t max_nnz = 0, max_batch = 0, max_elems = 0, max_chunk_elems = 0;
  int64_t max_rows = 0;
  bool any_max_norm = false;
  bool any_splits = false;  // a table given with row_splits (not one id per sample)
  // a table without row_splits that is not one unweighted id per sample
  bool bad_no_splits = false;
};

// A run's gradient row is the sum over its sorted positions, in order. A
// hot id (a Zipf-skewed feature's head, or a small vocabulary) has
// thousands of positions, so the sum is taken in two deterministic steps:
// a table's sorted positions are cut into chunks of kChunk, and a run's
// piece in each chunk is summed in order (RowsPieces), then a run's pieces
// are added in order (RowsSum). A run inside one chunk is summed exactly as
// one loop over its positions would sum it.
constexpr int64_t kChunk = 32;

// A run of more pieces than this (a hot id: more than about 2048
// positions) is summed by a block (RowsSumLong), not by one thread per
// column: half of the DemoModel's 8.2M positions on one padding id made
// 131,072 pieces in a row per thread, 47 ms.
constexpr int64_t kLongRunPieces = 64;

PlanSizes SizesOf(const SokLookupTable* tables, int num_tables) {
  PlanSizes z;
  for (int t = 0; t < num_tables; ++t) {
    const SokLookupTable& v = tables[t];
    const int64_t dim = v.dim > 0 ? v.dim : 0;
    z.nnz += v.nnz;
    z.piece_elems += v.nnz * dim;
    z.max_nnz = std::max(z.max_nnz, v.nnz);
    z.max_batch = std::max(z.max_batch, v.batch);
    z.max_elems = std::max(z.max_elems, v.nnz * dim);
    z.max_chunk_elems = std::max(z.max_chunk_elems, (v.nnz + kChunk - 1) / kChunk * dim);
    z.max_rows = std::max(z.max_rows, v.rows);
    z.any_max_norm = z.any_max_norm || (v.max_norm > 0.0f && v.nnz > 0);
    z.any_splits = z.any_splits || v.row_splits != nullptr;
    z.bad_no_splits = z.bad_no_splits ||
                      (v.row_splits == nullptr && (v.batch != v.nnz || v.weights != nullptr));
  }
  return z;
}

// The plan's scratch, carved from one block in a fixed order (both calls
// compute the same layout from the sizes and the sort sizes).
struct Plan {
  // (table, id) sort keys: uint32_t when they fit 32 bits (the DemoModel's
  // 13, DLRM's 22), else uint64_t — half the bytes through every pass of
  // the sort.
  void* keys;
  void* sorted_keys;
  bool narrow_keys;
  int32_t* pos;  // global positions 0..n-1
  int32_t* sorted_pos;
  int32_t* head;
  int32_t* run_of;  // 1-based run of each sorted index
  int32_t* run_start;
  int32_t* first_flag;  // per position: 1 where a run first appears
  int32_t* first_rank;  // inclusive prefix sum of first_flag
  int32_t* rank_of;     // run -> its index in order of first appearance
  SampleFactor* sample_factor;  // per position
  float* piece_sum;    // a run's piece within a chunk, at its first sorted index
  int64_t* num_runs;
  // The runs of more than kLongRunPieces pieces, as (table, run) pairs
  // (RowsSum lists them, RowsSumLong sums them), and their number.
  int2* long_runs;
  int64_t* num_long;
  PlanTable* per_table;
  void* cub;
  size_t cub_bytes;
  size_t total;
};

size_t Align256(size_t x) { return (x + 255) & ~size_t{255}; }

// The stable sort of (key, position) pairs on the key's low key_bits; with
// temp == nullptr, its scratch size.
template <typename KeyT>
cudaError_t SortKeys(void* temp, size_t* bytes, const void* keys, void* sorted_keys,
                     const int32_t* pos, int32_t* sorted_pos, int num, int key_bits,
                     cudaStream_t s) {
  return cub::DeviceRadixSort::SortPairs(temp, *bytes, static_cast<const KeyT*>(keys),
                                         static_cast<KeyT*>(sorted_keys), pos, sorted_pos, num, 0,
                                         key_bits, s);
}

cudaError_t LayPlan(char* base, const PlanSizes& z, int num_tables, int key_bits, Plan* p,
                    cudaStream_t s) {
  const int64_t n = z.nnz;
  const int num = static_cast<int>(n);
  p->narrow_keys = key_bits <= 32;
  size_t a = 0, c = 0;
  cudaError_t err =
      p->narrow_keys
          ? SortKeys<uint32_t>(nullptr, &a, nullptr, nullptr, nullptr, nullptr, num, key_bits, s)
          : SortKeys<uint64_t>(nullptr, &a, nullptr, nullptr, nullptr, nullptr, num, key_bits, s);
  if (err != cudaSuccess) return err;
  err = cub::DeviceScan::InclusiveSum(nullptr, c, static_cast<int32_t*>(nullptr),
                                      static_cast<int32_t*>(nullptr), num, s);
  if (err != cudaSuccess) return err;
  p->cub_bytes = std::max(a, c);
  size_t off = 0;
  auto take = [&](size_t bytes) {
    char* q = base ? base + off : nullptr;
    off += Align256(bytes > 0 ? bytes : 1);
    return q;
  };
  const size_t m = static_cast<size_t>(n > 0 ? n : 1);
  const size_t key_bytes = p->narrow_keys ? 4 : 8;
  p->keys = take(key_bytes * m);
  p->sorted_keys = take(key_bytes * m);
  int32_t** ints[] = {&p->pos,        &p->sorted_pos, &p->head,    &p->run_of,   &p->run_start,
                      &p->first_flag, &p->first_rank, &p->rank_of};
  for (int32_t** q : ints) *q = reinterpret_cast<int32_t*>(take(4 * m));
  p->sample_factor = reinterpret_cast<SampleFactor*>(take(sizeof(SampleFactor) * m));
  p->piece_sum = reinterpret_cast<float*>(take(4 * static_cast<size_t>(z.piece_elems)));
  p->num_runs = reinterpret_cast<int64_t*>(take(8));
  // A long run spans more than kLongRunPieces chunks of a table: at most
  // nnz / ((kLongRunPieces - 1) * kChunk) of them, and one per table more.
  p->long_runs = reinterpret_cast<int2*>(
      take(sizeof(int2) * (static_cast<size_t>(n / ((kLongRunPieces - 1) * kChunk)) +
                           static_cast<size_t>(num_tables))));
  p->num_long = reinterpret_cast<int64_t*>(take(8));
  p->per_table = reinterpret_cast<PlanTable*>(take(sizeof(PlanTable) * num_tables));
  p->cub = take(p->cub_bytes);
  p->total = off;
  return cudaSuccess;
}

// The tables' arrays (ids, weights, row_splits, gradients) are read with
// LoadGlobal: their pointers come out of structs, where clang cannot tell
// they point to global memory, and a plain read there is a generic load
// (nvcc emitted global loads for most of them). Global loads under clang,
// H100: samples of 4 ids 0.104 -> 0.099 ms, the rest unchanged; the
// shared-memory slices' slowness under clang, which this was first meant
// to mend, stayed. (Read-only cached loads, __ldg, were slower under both
// compilers: H200, the DemoModel's slices 0.415 -> 0.528 ms under nvcc.)
template <typename T>
__device__ __forceinline__ T LoadGlobal(const T* p) {
#if defined(__clang__)
  return *(const __attribute__((address_space(1))) T*)p;
#else
  return *p;
#endif
}
#if defined(__clang__)
// (A struct cannot be copied out of another address space.)
template <>
__device__ __forceinline__ float4 LoadGlobal(const float4* p) {
  typedef float Floats4 __attribute__((ext_vector_type(4)));
  const Floats4 v = *(const __attribute__((address_space(1))) Floats4*)p;
  return make_float4(v.x, v.y, v.z, v.w);
}
#endif

__device__ __forceinline__ int64_t LoadId(const SokLookupTable& t, int64_t j) {
  if (t.id_bytes == 4) return LoadGlobal(static_cast<const int32_t*>(t.ids) + j);
  return LoadGlobal(static_cast<const int64_t*>(t.ids) + j);
}

// Each table's first position and first piece element (a prefix sum over a
// handful of tables: one thread).
__global__ void PlanTables(const SokLookupTable* __restrict__ tables, int num_tables,
                           PlanTable* __restrict__ per_table) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  int64_t pos = 0, piece = 0;
  for (int t = 0; t < num_tables; ++t) {
    per_table[t].pos_begin = pos;
    per_table[t].piece_begin = piece;
    per_table[t].one_id = tables[t].nnz == tables[t].batch && tables[t].weights == nullptr;
    pos += tables[t].nnz;
    piece += tables[t].nnz * (tables[t].dim > 0 ? tables[t].dim : 0);
  }
}

// Whether id (at position j of table tb) lies outside [0, rows); if so,
// *first_bad (the table's) keeps the smallest such position.
__device__ __forceinline__ bool ReportIfBad(const SokLookupTable& tb, int64_t j, int64_t id,
                                            int64_t* first_bad) {
  if (id >= 0 && id < tb.rows) return false;
  atomicMin(reinterpret_cast<unsigned long long*>(first_bad), static_cast<unsigned long long>(j));
  return true;
}

// Sort keys (table << id_bits | id) and global positions. An id outside
// [0, rows) is reported at its table's first such position and sorted as
// id 0, so the keys stay well formed (the rows are never computed then).
template <typename KeyT>
__global__ void PlanKeys(const SokLookupTable* __restrict__ tables,
                         const PlanTable* __restrict__ per_table, int id_bits,
                         KeyT* __restrict__ keys, int32_t* __restrict__ pos,
                         int64_t* first_bad) {
  const int t = blockIdx.y;
  const SokLookupTable tb = tables[t];
  const int64_t base = per_table[t].pos_begin;
  SOK_FOR_EACH(j, tb.nnz) {
    int64_t id = LoadId(tb, j);
    if (ReportIfBad(tb, j, id, first_bad + t)) id = 0;
    keys[base + j] = (static_cast<KeyT>(t) << id_bits) | static_cast<KeyT>(id);
    pos[base + j] = static_cast<int32_t>(base + j);
  }
}

// first_flag is NULL when the runs are not to be ranked (here and in
// PlanRuns).
template <typename KeyT>
__global__ void PlanHeads(const KeyT* __restrict__ sorted, int64_t n, int32_t* __restrict__ head,
                          int32_t* __restrict__ first_flag) {
  SOK_FOR_EACH(j, n) {
    head[j] = (j == 0 || sorted[j] != sorted[j - 1]) ? 1 : 0;
    if (first_flag != nullptr) first_flag[j] = 0;
  }
}

// Per run (run_of[j] = r + 1 at its head): its first sorted index, and a
// flag at its first position (a run's positions ascend: the sort is stable).
__global__ void PlanRuns(const int32_t* __restrict__ head, const int32_t* __restrict__ run_of,
                         const int32_t* __restrict__ sorted_pos, int64_t n,
                         int32_t* __restrict__ run_start, int32_t* __restrict__ first_flag,
                         int64_t* num_runs) {
  SOK_FOR_EACH(j, n) {
    if (head[j]) {
      run_start[run_of[j] - 1] = static_cast<int32_t>(j);
      if (first_flag != nullptr) first_flag[sorted_pos[j]] = 1;
    }
    if (j == n - 1) *num_runs = run_of[j];
  }
}

// A run's rank in order of first appearance: the number of runs that first
// appear at or before its first position, minus one.
__global__ void PlanRanks(const int32_t* __restrict__ run_start,
                          const int32_t* __restrict__ sorted_pos,
                          const int32_t* __restrict__ first_rank, const int64_t* num_runs,
                          int32_t* __restrict__ rank_of) {
  const int64_t runs = *num_runs;
  SOK_FOR_EACH(r, runs) rank_of[r] = first_rank[sorted_pos[run_start[r]]] - 1;
}

// The plan's first steps, for sort keys of type KeyT (Plan::narrow_keys):
// the keys, their stable sort with the positions, and the run heads.
template <typename KeyT>
cudaError_t SortedRunHeads(const SokLookupTable* tables, const PlanSizes& z, int num_tables,
                           int id_bits, int key_bits, const Plan& p, bool ranked,
                           int64_t* first_bad, cudaStream_t s) {
  PlanKeys<<<TableGrid(z.max_nnz, num_tables), 256, 0, s>>>(
      tables, p.per_table, id_bits, static_cast<KeyT*>(p.keys), p.pos, first_bad);
  size_t bytes = p.cub_bytes;
  const cudaError_t err = SortKeys<KeyT>(p.cub, &bytes, p.keys, p.sorted_keys, p.pos,
                                         p.sorted_pos, static_cast<int>(z.nnz), key_bits, s);
  if (err != cudaSuccess) return err;
  PlanHeads<<<Grid(z.nnz), 256, 0, s>>>(static_cast<const KeyT*>(p.sorted_keys), z.nnz, p.head,
                                        ranked ? p.first_flag : nullptr);
  return cudaGetLastError();
}

// Each table's runs: its stretch of sorted indices starts a run (the keys
// before it belong to another table), so its first run and its count of
// runs come from the run numbers at the stretch's two ends. num_unique
// NULL: a plan for dense gradients alone (no ranks, no counts to report).
__global__ void PlanCounts(const SokLookupTable* __restrict__ tables, int num_tables,
                           const int32_t* __restrict__ run_of, PlanTable* __restrict__ per_table,
                           int64_t* __restrict__ num_unique) {
  SOK_FOR_EACH(t, num_tables) {
    const int64_t nnz = tables[t].nnz;
    const int64_t b = per_table[t].pos_begin;
    const int64_t first = nnz > 0 ? run_of[b] - 1 : 0;
    const int64_t runs = nnz > 0 ? run_of[b + nnz - 1] - first : 0;
    per_table[t].run_begin = first;
    per_table[t].runs = runs;
    per_table[t].ranked = num_unique != nullptr;
    if (num_unique != nullptr) num_unique[t] = runs;
  }
}

// One thread per sample: its combiner factor (weights summed in order, as
// the CPU kernel does), then each of its positions' factor and sample. A
// table given without row_splits is one id per sample and unweighted: its
// one_id (PlanTables) stands, and nothing reads its sample_factor.
// Sample b's ids [*j0, *j1) — row_splits read clamped as in the forward,
// so malformed ones (reported before any rows are used) never lead outside
// the ids — and its combiner scale (weights summed in order, as the CPU
// kernel sums them). A position j of it has factor Weight(t, j) * scale.
__device__ __forceinline__ float Weight(const SokLookupTable& t, int64_t j) {
  return t.weights ? LoadGlobal(t.weights + j) : 1.0f;
}
__device__ __forceinline__ float SampleScale(const SokLookupTable& t, int64_t b, int64_t* j0,
                                             int64_t* j1) {
  const int64_t s0 = LoadGlobal(t.row_splits + b), s1 = LoadGlobal(t.row_splits + b + 1);
  *j0 = s0 < 0 ? 0 : (s0 > t.nnz ? t.nnz : s0);
  *j1 = s1 < *j0 ? *j0 : (s1 > t.nnz ? t.nnz : s1);
  float sum = 0.0f, sq = 0.0f;
  for (int64_t j = *j0; j < *j1; ++j) {
    const float w = Weight(t, j);
    sum += w;
    sq += w * w;
  }
  return sok_graph::core::CombinerScale(static_cast<sok_graph::core::Combiner>(t.combiner), sum,
                                        sq);
}

__global__ void PlanSamples(const SokLookupTable* __restrict__ tables, PlanTable* per_table,
                            SampleFactor* __restrict__ sample_factor) {
  const SokLookupTable t = tables[blockIdx.y];
  if (t.row_splits == nullptr) return;
  const int64_t base = per_table[blockIdx.y].pos_begin;
  SOK_FOR_EACH(b, t.batch) {
    int64_t j0 = 0, j1 = 0;
    const float scale = SampleScale(t, b, &j0, &j1);
    // Every thread that sees a sample other than "one id, at its own
    // position" writes the same 0.
    if (j0 != b || j1 != b + 1) per_table[blockIdx.y].one_id = 0;
    for (int64_t j = j0; j < j1; ++j) {
      sample_factor[base + j] = SampleFactor{static_cast<int32_t>(b), Weight(t, j) * scale};
    }
  }
}

// The id of the run that starts at sorted index `start`: the id at its
// first position (an id outside [0, rows) reads as 0, as it was sorted; the
// op never asks for rows then).
__device__ __forceinline__ int64_t RunId(const SokLookupTable& t, const PlanTable& pt,
                                         const int32_t* __restrict__ sorted_pos, int32_t start) {
  const int64_t id = LoadId(t, sorted_pos[start] - pt.pos_begin);
  return id < 0 || id >= t.rows ? 0 : id;
}

// Each table's distinct ids, in order of first appearance.
__global__ void RowsIds(const SokLookupTable* __restrict__ tables,
                        const PlanTable* __restrict__ per_table,
                        const SokLookupGradTable* __restrict__ outs,
                        const int32_t* __restrict__ sorted_pos,
                        const int32_t* __restrict__ run_start, const int32_t* __restrict__ rank_of) {
  const int t = blockIdx.y;
  if (outs[t].dense || !per_table[t].ranked) return;
  const PlanTable pt = per_table[t];
  const bool narrow = tables[t].id_bytes == 4;
  void* out = outs[t].unique_ids;
  SOK_FOR_EACH(i, pt.runs) {
    const int64_t r = pt.run_begin + i;
    const int64_t id = RunId(tables[t], pt, sorted_pos, run_start[r]);
    const int64_t k = rank_of[r] - pt.run_begin;
    if (narrow) {
      static_cast<int32_t*>(out)[k] = static_cast<int32_t>(id);
    } else {
      static_cast<int64_t*>(out)[k] = id;
    }
  }
}

// A chunk's positions in groups of kUnroll: the group's loads are issued
// before its sums, so a thread has kUnroll rows in flight (the loads of one
// position depend on each other: sorted position, then sample, then row).
constexpr int kUnroll = 4;

__device__ __forceinline__ void AddScaled(float* acc, float f, float g) { *acc += f * g; }
__device__ __forceinline__ void AddScaled(float4* acc, float f, float4 g) {
  acc->x += f * g.x;
  acc->y += f * g.y;
  acc->z += f * g.z;
  acc->w += f * g.w;
}
__device__ __forceinline__ void StorePiece(float* at, float v) { *at = v; }
__device__ __forceinline__ void StorePiece(float* at, float4 v) {
  at[0] = v.x;
  at[1] = v.y;
  at[2] = v.z;
  at[3] = v.w;
}
__device__ __forceinline__ float Zero(float*) { return 0.0f; }
__device__ __forceinline__ float4 Zero(float4*) { return make_float4(0.0f, 0.0f, 0.0f, 0.0f); }

// The pieces of one chunk [k0, k1) for the columns of V at column c:
// V = float (one column) or float4 (four, when dim % 4 == 0). The sums are
// the same float operations in the same order either way.
// With one_id (see PlanTable), a position's sample is the position less the
// table's base, and its factor 1: sample_factor, a random read per
// position, is not read (the product 1 * g is g, so the sums are the same).
template <typename V>
__device__ __forceinline__ void ChunkPieces(const float* __restrict__ grads,
                                            const int32_t* __restrict__ sorted_pos,
                                            const int32_t* __restrict__ head,
                                            const SampleFactor* __restrict__ sample_factor,
                                            bool one_id, int64_t base, int64_t k0,
                                            int64_t k1, int dim, int c, float* __restrict__ pieces) {
  int64_t first = k0;
  V acc = Zero(static_cast<V*>(nullptr));
  for (int64_t k = k0; k < k1; k += kUnroll) {
    V g[kUnroll];
    float f[kUnroll];
    int32_t h[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (k + u < k1) {
        const int32_t p = sorted_pos[k + u];
        h[u] = head[k + u];
        const SampleFactor sf = one_id ? SampleFactor{static_cast<int32_t>(p - base), 1.0f}
                                       : sample_factor[p];
        f[u] = sf.factor;
        const float* at = grads + static_cast<int64_t>(sf.sample) * dim + c;
        g[u] = LoadGlobal(reinterpret_cast<const V*>(at));
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (k + u < k1) {
        if (k + u > k0 && h[u]) {
          StorePiece(pieces + first * dim + c, acc);
          acc = Zero(static_cast<V*>(nullptr));
          first = k + u;
        }
        AddScaled(&acc, f[u], g[u]);
      }
    }
  }
  StorePiece(pieces + first * dim + c, acc);
}

// One thread per (chunk, column) of a table — per (chunk, four columns)
// when the table's dim is a multiple of 4 — each piece's sum, at its first
// index.
__global__ void RowsPieces(const SokLookupTable* __restrict__ tables,
                           const PlanTable* __restrict__ per_table,
                           const SokLookupGradTable* __restrict__ outs,
                           const int32_t* __restrict__ sorted_pos,
                           const int32_t* __restrict__ head,
                           const SampleFactor* __restrict__ sample_factor,
                           float* __restrict__ piece_sum) {
  const int t = blockIdx.y;
  const int64_t n = tables[t].nnz;
  const int dim = tables[t].dim;
  const int64_t base = per_table[t].pos_begin;
  float* pieces = piece_sum + per_table[t].piece_begin;
  const float* __restrict__ grads = outs[t].grads;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  // (A gradient that is a slice of a larger tensor may start anywhere.)
  const bool vec = dim % 4 == 0 && reinterpret_cast<uintptr_t>(grads) % 16 == 0;
  const int lanes = vec ? dim / 4 : dim;  // threads per chunk
  const bool one_id = per_table[t].one_id != 0;
  SOK_FOR_EACH(i, chunks * lanes) {
    const int64_t ch = i / lanes;
    const int c = static_cast<int>(i - ch * lanes) * (vec ? 4 : 1);
    const int64_t k0 = ch * kChunk, k1 = k0 + kChunk < n ? k0 + kChunk : n;
    if (vec) {
      ChunkPieces<float4>(grads, sorted_pos + base, head + base, sample_factor, one_id, base, k0,
                          k1, dim, c, pieces);
    } else {
      ChunkPieces<float>(grads, sorted_pos + base, head + base, sample_factor, one_id, base, k0,
                         k1, dim, c, pieces);
    }
  }
}

// The row of grad_rows that run r of table t fills: its rank among the
// table's runs (order of first appearance), or its id when the table's
// gradient is dense.
__device__ __forceinline__ int64_t OutRow(const SokLookupTable& tb, const PlanTable& pt,
                                          const SokLookupGradTable& out,
                                          const int32_t* __restrict__ sorted_pos,
                                          const int32_t* __restrict__ run_start,
                                          const int32_t* __restrict__ rank_of, int64_t r) {
  return out.dense ? RunId(tb, pt, sorted_pos, run_start[r]) : rank_of[r] - pt.run_begin;
}

// Whether table t's gradient is left as it is: a dense table whose check
// (`checks`, may be NULL) records a bad id or malformed row_splits, left as
// the caller zeroed it (nothing reads the check before this gradient is
// used); a sparse one whose runs the plan did not rank (no rows to place).
__device__ __forceinline__ bool CheckFailed(const int64_t* __restrict__ checks, int t,
                                            int num_tables) {
  return checks[t] != INT64_MAX || checks[3 * num_tables + t] != INT64_MAX;
}
__device__ __forceinline__ bool SkipTable(const SokLookupGradTable& out, const PlanTable& pt,
                                          const int64_t* checks, int t, int num_tables) {
  if (!out.dense) return pt.ranked == 0;
  return checks != nullptr && CheckFailed(checks, t, num_tables);
}

// A run's pieces: one at its first sorted index k0, then one at each
// chunk boundary before k1.
__device__ __forceinline__ int64_t PieceCount(int64_t k0, int64_t k1) {
  return (k1 - 1) / kChunk - k0 / kChunk + 1;
}
__device__ __forceinline__ int64_t PieceAt(int64_t k0, int64_t i) {
  return i == 0 ? k0 : (k0 / kChunk + i) * kChunk;
}

// The sorted stretch [k0, k1) of run ri of a table (relative to the table's
// first sorted index, where its chunks start).
__device__ __forceinline__ void RunBounds(const PlanTable& pt,
                                          const int32_t* __restrict__ run_start, int64_t n,
                                          int64_t ri, int64_t* k0, int64_t* k1) {
  *k0 = run_start[pt.run_begin + ri] - pt.pos_begin;
  *k1 = ri + 1 < pt.runs ? run_start[pt.run_begin + ri + 1] - pt.pos_begin : n;
}

// One thread per (run, column) of a table: the run's pieces, in order
// (runs of more than kLongRunPieces are RowsSumLong's).
__global__ void RowsSum(const SokLookupTable* __restrict__ tables,
                        const PlanTable* __restrict__ per_table,
                        const SokLookupGradTable* __restrict__ outs,
                        const float* __restrict__ piece_sum,
                        const int32_t* __restrict__ sorted_pos,
                        const int32_t* __restrict__ run_start,
                        const int32_t* __restrict__ rank_of, const int64_t* checks,
                        int2* __restrict__ long_runs, int64_t* num_long) {
  const int t = blockIdx.y;
  if (SkipTable(outs[t], per_table[t], checks, t, gridDim.y)) return;
  const SokLookupTable tb = tables[t];
  const int64_t n = tb.nnz;
  const int dim = tb.dim;
  const PlanTable pt = per_table[t];
  const SokLookupGradTable out = outs[t];
  const float* __restrict__ pieces = piece_sum + pt.piece_begin;
  float* __restrict__ grad_rows = out.grad_rows;
  SOK_FOR_EACH(i, pt.runs * dim) {
    const int64_t ri = i / dim;
    const int d = static_cast<int>(i - ri * dim);
    const int64_t r = pt.run_begin + ri;
    int64_t k0 = 0, k1 = 0;
    RunBounds(pt, run_start, n, ri, &k0, &k1);
    if (PieceCount(k0, k1) > kLongRunPieces) {
      if (d == 0) {
        const auto at = atomicAdd(reinterpret_cast<unsigned long long*>(num_long), 1ull);
        long_runs[at] = make_int2(t, static_cast<int>(ri));
      }
      continue;
    }
    float acc = 0.0f;
    for (int64_t k = k0; k < k1; k = (k / kChunk + 1) * kChunk) acc += pieces[k * dim + d];
    grad_rows[OutRow(tb, pt, out, sorted_pos, run_start, rank_of, r) * dim + d] = acc;
  }
}

// The runs RowsSum listed, a block per run (blocks stride over the list;
// its order varies, each run's sum does not). The block's threads are
// (lane, column) for up to 256 columns at a time: lane l adds pieces l,
// l + lanes, ... in order, then lane 0 adds the lanes' sums in lane order:
// a fixed order, so the same bits on every run.
__global__ void RowsSumLong(const SokLookupTable* __restrict__ tables,
                            const PlanTable* __restrict__ per_table,
                            const SokLookupGradTable* __restrict__ outs,
                            const float* __restrict__ piece_sum,
                            const int32_t* __restrict__ sorted_pos,
                            const int32_t* __restrict__ run_start,
                            const int32_t* __restrict__ rank_of,
                            const int2* __restrict__ long_runs, const int64_t* num_long) {
  __shared__ float lane_sum[256];
  const int64_t listed = *num_long;
  for (int64_t e = blockIdx.x; e < listed; e += gridDim.x) {
    const int t = long_runs[e].x;
    const int64_t ri = long_runs[e].y;
    const SokLookupTable tb = tables[t];
    const int dim = tb.dim;
    const PlanTable pt = per_table[t];
    const SokLookupGradTable out = outs[t];
    const float* __restrict__ pieces = piece_sum + pt.piece_begin;
    const int cols = dim < 256 ? dim : 256;
    const int lanes = static_cast<int>(blockDim.x) / cols;  // dim > 0: the run has rows
    const int lane = static_cast<int>(threadIdx.x) / cols;
    const int col = static_cast<int>(threadIdx.x) % cols;
    int64_t k0 = 0, k1 = 0;
    RunBounds(pt, run_start, tb.nnz, ri, &k0, &k1);
    const int64_t count = PieceCount(k0, k1);
    const int64_t row = OutRow(tb, pt, out, sorted_pos, run_start, rank_of, pt.run_begin + ri);
    for (int c0 = 0; c0 < dim; c0 += cols) {
      const int d = c0 + col;
      float acc = 0.0f;
      if (lane < lanes && d < dim) {
        for (int64_t i = lane; i < count; i += lanes) acc += pieces[PieceAt(k0, i) * dim + d];
      }
      lane_sum[threadIdx.x] = acc;
      __syncthreads();
      if (lane == 0 && d < dim) {
        float total = 0.0f;
        for (int l = 0; l < lanes; ++l) total += lane_sum[l * cols + col];
        out.grad_rows[row * dim + d] = total;
      }
      __syncthreads();
    }
  }
}

// max_norm's clip, backwards, on each distinct row of the tables that clip
// (a warp per row): g <- (m / |x|) (g - x (x.g) / |x|^2) where |x| > m.
__global__ void RowsClip(const SokLookupTable* __restrict__ tables,
                         const PlanTable* __restrict__ per_table,
                         const SokLookupGradTable* __restrict__ outs,
                         const int32_t* __restrict__ sorted_pos,
                         const int32_t* __restrict__ run_start, const int32_t* __restrict__ rank_of,
                         const int64_t* checks) {
  const SokLookupTable tb = tables[blockIdx.y];
  if (!(tb.max_norm > 0.0f)) return;
  if (SkipTable(outs[blockIdx.y], per_table[blockIdx.y], checks, blockIdx.y, gridDim.y)) return;
  const PlanTable pt = per_table[blockIdx.y];
  const SokLookupGradTable out = outs[blockIdx.y];
  float* __restrict__ grad_rows = out.grad_rows;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  const int lane = threadIdx.x % 32;
  for (int64_t ri = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
       ri < pt.runs; ri += warps) {
    const int64_t r = pt.run_begin + ri;
    const int64_t id = RunId(tb, pt, sorted_pos, run_start[r]);
    const float* x = tb.params + id * tb.dim;
    float* g = grad_rows + OutRow(tb, pt, out, sorted_pos, run_start, rank_of, r) * tb.dim;
    float sq = 0.0f, dot = 0.0f;
    for (int d = lane; d < tb.dim; d += 32) {
      sq += x[d] * x[d];
      dot += x[d] * g[d];
    }
    for (int off = 16; off > 0; off /= 2) {
      sq += __shfl_xor_sync(0xffffffffu, sq, off);
      dot += __shfl_xor_sync(0xffffffffu, dot, off);
    }
    const float norm = sqrtf(sq);
    if (!(norm > tb.max_norm)) continue;
    const float scale = tb.max_norm / norm, proj = dot / sq;
    for (int d = lane; d < tb.dim; d += 32) g[d] = scale * (g[d] - x[d] * proj);
  }
}

// ---------------------------------------------------------------------------
// Dense gradients in no fixed order (sok_lookup_backward_dense_unordered):
// no sort and no plan. Each (sample, column) adds its factor times its
// upstream row straight into the rows of its ids with float atomics, as
// TensorFlow's own scatter-add and unsorted segment sum do on the GPU; only
// the order of the additions, so the rounding, differs from the ordered
// plan. A DemoModel step's 8.2M positions read their gradient rows in
// order (coalesced) instead of in sorted order (a random read each) after a
// sort of all positions.

// Row 0 of the check: each table's first position of an id outside
// [0, rows), before any row is written, so that such a table is left whole
// (CheckFailed) rather than summed in part.
__global__ void DenseCheckIds(const SokLookupTable* __restrict__ tables,
                              int64_t* __restrict__ first_bad) {
  const SokLookupTable tb = tables[blockIdx.y];
  SOK_FOR_EACH(j, tb.nnz) ReportIfBad(tb, j, LoadId(tb, j), first_bad + blockIdx.y);
}

// Whether a table's batch x dim gradient items, and the overshoot of a
// grid-stride index past them, fit the 32-bit index loops of the dense
// kernels (64-bit division is emulated; those loops are otherwise a load
// and an atomic).
__device__ __forceinline__ bool NarrowItems(const SokLookupTable& tb) {
  return tb.batch * tb.dim < UINT32_MAX / 2;
}

// A float addition into global memory whose result nothing reads. nvcc
// compiles atomicAdd so to a reduction (RED); clang, which builds the
// package, kept an atomic that returns the old value, and the package's
// dense gradients took 1.4-1.7x nvcc's time on an H100 (8.2M one-id
// positions into 8192 rows 0.54 against 0.38 ms; 64 samples of 4096 ids
// 0.54 against 0.31). Under clang the reduction is written out in PTX
// (0.44 and 0.45 ms); under nvcc that was slower (0.44 against 0.38), so
// nvcc keeps atomicAdd. No memory clobber: nothing in the kernels that add
// this way reads the rows they add to. (Shared memory keeps atomicAdd: a
// PTX reduction there gained nothing under clang and lost under nvcc.)
__device__ __forceinline__ void AddToGlobal(float* p, float v) {
#if defined(__clang__)
  asm volatile("red.global.add.f32 [%0], %1;" ::"l"(p), "f"(v));
#else
  atomicAdd(p, v);
#endif
}

// Hot ids among one-id samples (a table without row_splits). Each of a
// row's atomics queues on the same place in L2, so a hot id serialises
// DenseTable (H100, 8.2M positions in 200,000 rows, half on one id: 8.4 ms,
// a tenth on one id: 2.1 ms, against 0.4 for uniform ids). DenseRepeats
// takes such tables: a warp takes 32 samples at a time (a window) and finds
// those that share an id (__match_any_sync, once per window); the lowest
// sample of each group adds the group's rows, summed in registers, with one
// atomic per column, so a hot id costs an atomic per column per window
// (1.2 and 0.93 ms; Zipf(1.2) ids in 1M rows 4.7 -> 1.8 ms). For ids that
// seldom repeat it was slower than DenseTable (0.53 against 0.39 ms,
// unexplained: not its instruction count, registers, the match or the
// order it reads the gradient in), so a probe of a few windows decides.
//
// R holds an id: 32 bits when every id and the padding lanes' stand-ins
// fit (FitsRow32), else 64.
template <typename R>
__device__ __forceinline__ R PaddingId(unsigned lane);
template <>
__device__ __forceinline__ unsigned PaddingId<unsigned>(unsigned lane) {
  return 0xffffffffu - lane;
}
template <>
__device__ __forceinline__ long long PaddingId<long long>(unsigned lane) {
  return -1 - static_cast<long long>(lane);
}
__device__ __forceinline__ bool FitsRow32(const SokLookupTable& tb) {
  return tb.rows <= 0xffffffffLL - 32;
}

constexpr unsigned kWarpLanes = 0xffffffffu;

// The id of sample b, or (b past the batch) the lane's stand-in that no id
// (checked ids are in [0, rows)) and no other lane has; and which lanes of
// the warp lead a group of equal ids (the lowest lane of each).
template <typename R>
__device__ __forceinline__ R WindowId(const SokLookupTable& tb, int64_t b, unsigned lane) {
  return b < tb.batch ? static_cast<R>(LoadId(tb, b)) : PaddingId<R>(lane);
}
template <typename R>
__device__ __forceinline__ unsigned WindowLeaders(R id, unsigned lane, unsigned* group) {
  *group = __match_any_sync(kWarpLanes, id);
  return __ballot_sync(kWarpLanes, (*group & ((1u << lane) - 1u)) == 0u);
}

// The probe (ProbeRepeats, a warp per table): kProbeWindows windows of 32
// samples spread over the batch; DenseRepeats when their samples that
// repeat an earlier one of their window number at least kProbeRepeats (one
// a window on average) more than twice what uniform ids would give. Those
// repeat about 32 x 31 / 2 / R = 496 / R times a window on R rows (at most
// 31) and are summed faster by the slices or DenseTable (400 rows x 128:
// 0.28 ms in slices, 0.52 in DenseRepeats); an id on a tenth of the
// samples repeats about 2.2 times a window. The probe writes its choice to
// the table's SokLookupGradTable.path, which the three kernels read (a
// probe in every block of DenseRows slowed it by half, even for the tables
// it skipped).
constexpr int kProbeWindows = 8;
constexpr int kProbeRepeats = 8;
constexpr int32_t kPathRepeats = 1;
// Tables of fewer items are not probed (path 0): a probe and a launch cost
// about 13 us, what half of 2^20 items on one id costs DenseTable.
constexpr int64_t kProbeItems = int64_t{1} << 20;
__host__ __device__ inline bool Probed(const SokLookupTable& tb) {
  return tb.row_splits == nullptr && tb.batch * tb.dim >= kProbeItems;
}
__device__ __forceinline__ bool TakesRepeats(const SokLookupTable& tb,
                                             const SokLookupGradTable& out) {
  return Probed(tb) && out.path == kPathRepeats;
}
__device__ __forceinline__ double RepeatsNeeded(int64_t rows) {
  const double uniform = rows > 16 ? 496.0 / static_cast<double>(rows) : 31.0;
  return kProbeRepeats + 2.0 * kProbeWindows * uniform;
}
template <typename R>
__device__ __forceinline__ int WindowsRepeats(const SokLookupTable& tb) {
  const unsigned lane = threadIdx.x & 31u;
  const int64_t last = tb.batch > 32 ? tb.batch - 32 : 0;
  R ids[kProbeWindows];
#pragma unroll
  for (int q = 0; q < kProbeWindows; ++q) {
    ids[q] = WindowId<R>(tb, last * q / (kProbeWindows - 1) + lane, lane);
  }
  int repeats = 0;
#pragma unroll
  for (int q = 0; q < kProbeWindows; ++q) {
    unsigned group = 0;
    repeats += 32 - __popc(WindowLeaders(ids[q], lane, &group));
  }
  return repeats;
}

// A window's 32 samples x dim items, 32 at a time: lane k of pass p takes
// item 32p + k, (sample, column) side by side as DenseTable lays them out;
// a pass's loads are issued kRepeatLoads at a time (a whole window of dim
// 16, 512 floats, at once: 0.56 -> 0.52 ms on the DemoModel's shape).
constexpr int kRepeatLoads = 16;
template <typename I, typename R>
__device__ __forceinline__ void DenseRepeats(const SokLookupTable& tb,
                                             const float* __restrict__ grads,
                                             float* __restrict__ rows) {
  const unsigned lane = threadIdx.x & 31u;
  const I batch = static_cast<I>(tb.batch), dim = static_cast<I>(tb.dim);
  // The warp's lane-0 thread index is its first window's first sample, so
  // the windows of all warps tile the samples. The loop is uniform over a
  // warp (the block is whole warps), as __match_any_sync and __shfl_sync
  // need.
  for (I w0 = static_cast<I>(blockIdx.x) * blockDim.x + (threadIdx.x & ~31u); w0 < batch;
       w0 += static_cast<I>(gridDim.x) * blockDim.x) {
    const R id = WindowId<R>(tb, w0 + lane, lane);
    unsigned group = 0;
    const unsigned leaders = WindowLeaders(id, lane, &group);
    const I items = (batch - w0 < 32 ? batch - w0 : 32) * dim;
    const float* g = grads + w0 * dim;
    for (I p = 0; p < items; p += 32 * kRepeatLoads) {
      float v[kRepeatLoads];
#pragma unroll
      for (int u = 0; u < kRepeatLoads; ++u) {
        const I k = p + 32 * u + lane;
        v[u] = k < items ? LoadGlobal(g + k) : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kRepeatLoads; ++u) {
        const I k = p + 32 * u + lane;
        const unsigned s = k < items ? static_cast<unsigned>(k / dim) : 0u;
        const I c = k - s * dim;
        const R row = __shfl_sync(kWarpLanes, id, s);
        const unsigned members = __shfl_sync(kWarpLanes, group, s);
        if (k < items && ((leaders >> s) & 1u) != 0u) {
          float sum = v[u];
          for (unsigned m = members & (members - 1u); m != 0u; m &= m - 1u) {
            sum += LoadGlobal(g + static_cast<I>(__ffs(m) - 1) * dim + c);
          }
          AddToGlobal(rows + static_cast<int64_t>(row) * tb.dim + c, sum);
        }
      }
    }
  }
}

// One thread per (sample, column) of a table, adding weight_j * combiner
// factor * grads[b, c] to column c of the rows of the sample's ids: the
// lanes of a warp add to whole rows side by side (a float4 per lane, four
// atomics 16 bytes apart, took twice as long for the DemoModel). A table
// without row_splits is one unweighted id per sample (factor 1); row_splits
// are read clamped, as in the forward. I is the index type (NarrowItems).
constexpr int kOneIdLoads = 2;
template <typename I>
__device__ __forceinline__ void DenseTable(const SokLookupTable& tb,
                                           const float* __restrict__ grads,
                                           float* __restrict__ rows) {
  const I items = static_cast<I>(tb.batch * tb.dim), dim = static_cast<I>(tb.dim);
  const I stride = static_cast<I>(gridDim.x) * blockDim.x;
  I i = blockIdx.x * blockDim.x + threadIdx.x;
  if (tb.row_splits == nullptr) {
    // kOneIdLoads items per thread at a time, their loads before their
    // additions, then the rest one by one: rolled, clang's loop had one
    // gradient load in flight per thread (with the registers capped, H100:
    // the DemoModel's shape 0.40 -> 0.39 ms, 2000 rows x 64 0.35 -> 0.34;
    // 4 at a time were no faster). No wrap: the grid is at most 2^21
    // threads, and a narrow I holds below 2^31 items.
    for (; i + (kOneIdLoads - 1) * stride < items; i += kOneIdLoads * stride) {
      float g[kOneIdLoads];
      int64_t at[kOneIdLoads];
#pragma unroll
      for (int u = 0; u < kOneIdLoads; ++u) {
        const I k = i + u * stride;
        const I b = k / dim;
        g[u] = LoadGlobal(grads + k);
        at[u] = LoadId(tb, b) * tb.dim + (k - b * dim);
      }
#pragma unroll
      for (int u = 0; u < kOneIdLoads; ++u) AddToGlobal(rows + at[u], g[u]);
    }
    for (; i < items; i += stride) {
      const I b = i / dim;
      AddToGlobal(rows + LoadId(tb, b) * tb.dim + (i - b * dim), LoadGlobal(grads + i));
    }
    return;
  }
  for (; i < items; i += stride) {
    const I b = i / dim;
    const I c = i - b * dim;
    const float g = LoadGlobal(grads + i);
    int64_t j0 = 0, j1 = 0;
    const float scale = SampleScale(tb, b, &j0, &j1);
    for (int64_t j = j0; j < j1; ++j) {
      AddToGlobal(rows + LoadId(tb, j) * tb.dim + c, Weight(tb, j) * scale * g);
    }
  }
}

// Few rows, many one-id samples (the DemoModel: 8.2M positions into the
// 8192 distinct rows of its batch): global atomics cost each position's row
// dim of them. Here a block
// sums a slice of `width` columns of every row of its table in shared
// memory (a grid of one block per SM, each slice as wide as a block's
// shared memory allows), over its share of the samples, then adds its slice to
// grad_rows once. The blocks of a table take its column slices in turn, so
// the `slices` blocks that read a stretch of samples run side by side and
// share its gradient rows in L2. Shared-memory float atomics bound it
// (H100, against DenseRows): 1.05x for the DemoModel's uniform ids,
// 1.13-1.41x on 2000 and 400 rows of dims 64 and 128. Slices of 4 columns
// with float4 loads took twice as long (a warp's rows 4 floats apart fall
// on 8 of the 32 banks). A hot id queues on one row of shared memory
// (half the positions on one id: 2.5 ms against 7.4 with DenseTable), so
// the probe gives such a table to DenseRepeats (0.66 ms).
struct SharedSlices {
  int width = 0;   // columns per slice; 0: the table takes DenseRows
  int slices = 0;  // ceil(dim / width)
};

// The threads of a shared-slice block, and the samples whose loads a
// thread has in flight at once (8 and 16 were no faster).
constexpr int kSliceThreads = 1024;
constexpr int kSliceUnroll = 4;

// Whether and how table tb takes the shared-slice path, for `blocks`
// blocks per table of `slice_floats` floats of shared memory each. Host
// and device decide alike from the same arguments. Only tables of one id
// per sample given without row_splits (the DemoModel's): samples of 4 ids
// on 1000 rows took 0.111 ms here against 0.091 with DenseRows. A slice
// narrower than 4 columns (or the whole row) reads too little of each
// 32-byte sector. The blocks' final additions (blocks x rows x width) must
// stay an eighth of the atomics they save (the table's ids x dim).
__host__ __device__ inline SharedSlices SlicesOf(const SokLookupTable& tb, int64_t slice_floats,
                                                 int blocks) {
  SharedSlices s;
  if (tb.row_splits != nullptr || tb.rows <= 0 || tb.dim <= 0 || tb.nnz <= 0) return s;
  int64_t width = slice_floats / tb.rows;
  if (width > tb.dim) width = tb.dim;
  if (width > kSliceThreads) width = kSliceThreads;  // a thread per column of a sample
  if (width < (tb.dim < 4 ? tb.dim : 4)) return s;
  const int64_t slices = (tb.dim + width - 1) / width;
  // As even as that count allows (the last may still be narrower).
  width = (tb.dim + slices - 1) / slices;
  if (blocks < slices || static_cast<int64_t>(blocks) * tb.rows * width * 8 > tb.nnz * tb.dim) {
    return s;
  }
  s.width = static_cast<int>(width);
  s.slices = static_cast<int>(slices);
  return s;
}

// Thread (pos, col) of a block adds column c0 + col of the one-id samples
// first + pos, + step, ... into acc [rows, width]: kSliceUnroll samples'
// loads first, then their additions. I is the index type (NarrowItems).
template <typename I>
__device__ __forceinline__ void SliceSamples(const SokLookupTable& tb,
                                             const float* __restrict__ grads, float* acc,
                                             int width, int c0, I first, I step, int pos,
                                             int col) {
  const I batch = static_cast<I>(tb.batch), dim = static_cast<I>(tb.dim);
  const uint64_t rows = static_cast<uint64_t>(tb.rows);
  for (I b = first + pos; b < batch; b += kSliceUnroll * step) {
    int row[kSliceUnroll];
    float g[kSliceUnroll];
#pragma unroll
    for (int u = 0; u < kSliceUnroll; ++u) {
      const I bu = b + u * step;
      // (Bad ids were checked before; the bound keeps any stray one out of
      // the neighbouring rows' shared memory all the same.)
      const int64_t id = bu < batch ? LoadId(tb, bu) : -1;
      row[u] = static_cast<uint64_t>(id) < rows ? static_cast<int>(id) : -1;
      g[u] = bu < batch ? LoadGlobal(grads + bu * dim + c0 + col) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kSliceUnroll; ++u) {
      if (row[u] >= 0) atomicAdd(acc + row[u] * width + col, g[u]);
    }
  }
}

__global__ void __launch_bounds__(kSliceThreads, 1)
    DenseRowsShared(const SokLookupTable* __restrict__ tables,
                    const SokLookupGradTable* __restrict__ outs,
                    const int64_t* __restrict__ checks, int64_t slice_floats) {
  extern __shared__ float acc[];
  const int t = blockIdx.y;
  const SokLookupTable tb = tables[t];
  const SharedSlices s = SlicesOf(tb, slice_floats, gridDim.x);
  if (s.width == 0 || TakesRepeats(tb, outs[t]) || CheckFailed(checks, t, gridDim.y)) return;
  // Block k of its slice's gridDim.x / slices blocks; the samples go round
  // them a tile (the samples one pass of the block's threads covers) at a
  // time.
  const int slice = blockIdx.x % s.slices;
  const int k = blockIdx.x / s.slices, blocks = gridDim.x / s.slices;
  if (k >= blocks) return;
  const int c0 = slice * s.width;
  const int width = min(s.width, static_cast<int>(tb.dim) - c0);  // the last may be narrower
  const int64_t floats = tb.rows * s.width;
  for (int64_t e = threadIdx.x; e < floats; e += blockDim.x) acc[e] = 0.0f;
  __syncthreads();
  const int tile = kSliceThreads / s.width;
  const int pos = threadIdx.x / s.width, col = threadIdx.x - pos * s.width;
  if (pos < tile && col < width) {
    const int64_t first = static_cast<int64_t>(k) * tile;
    const int64_t step = static_cast<int64_t>(blocks) * tile;
    if (NarrowItems(tb)) {
      SliceSamples<uint32_t>(tb, outs[t].grads, acc, s.width, c0, static_cast<uint32_t>(first),
                             static_cast<uint32_t>(step), pos, col);
    } else {
      SliceSamples<int64_t>(tb, outs[t].grads, acc, s.width, c0, first, step, pos, col);
    }
  }
  __syncthreads();
  float* rows = outs[t].grad_rows;
  for (int64_t e = threadIdx.x; e < floats; e += blockDim.x) {
    const float v = acc[e];
    const int64_t r = e / s.width;
    const int c = static_cast<int>(e - r * s.width);
    if (v != 0.0f && c < width) AddToGlobal(rows + r * tb.dim + c0 + c, v);
  }
}

// The tables that DenseRowsShared and DenseRowsRepeats leave: with
// row_splits, or one id per sample that seldom repeats.
// 8 blocks of kDenseRowsThreads per SM, a whole SM's threads: registers
// capped at 32. nvcc kept it to 32 by itself; clang took 40 (a block of
// threads fewer per SM), and the package's global atomics ran 1.1-1.2x
// nvcc's time (H100: the DemoModel's shape 0.45 -> 0.39 ms with the cap
// and the loads above, 64 samples of 4096 ids 0.46 -> 0.44).
constexpr int kDenseRowsThreads = 256;
__global__ void __launch_bounds__(kDenseRowsThreads, 8)
    DenseRows(const SokLookupTable* __restrict__ tables,
              const SokLookupGradTable* __restrict__ outs, const int64_t* __restrict__ checks,
              int64_t slice_floats, int slice_blocks) {
  const int t = blockIdx.y;
  // A table whose check failed keeps the zero gradient the caller wrote,
  // as the ordered rows step leaves it (SkipTable).
  if (CheckFailed(checks, t, gridDim.y)) return;
  const SokLookupTable tb = tables[t];
  // (Written so, DenseTable's loop ran as fast as before the probe; with
  // the path read first, 10% slower on uniform ids.)
  if (tb.row_splits == nullptr) {
    if (SlicesOf(tb, slice_floats, slice_blocks).width != 0) return;
    if (TakesRepeats(tb, outs[t])) return;
  }
  if (NarrowItems(tb)) {
    DenseTable<uint32_t>(tb, outs[t].grads, outs[t].grad_rows);
  } else {
    DenseTable<int64_t>(tb, outs[t].grads, outs[t].grad_rows);
  }
}

// outs[t].path of every table: kPathRepeats for a probed one-id table whose
// ids repeat often, else 0. Such a table takes DenseRepeats even where it
// would take the shared-memory slices: half the DemoModel's positions on
// one id took 0.66 ms there against 2.46 in slices. A warp per table
// (blockIdx.x).
__global__ void ProbeRepeats(const SokLookupTable* __restrict__ tables,
                             SokLookupGradTable* outs) {
  const int t = blockIdx.x;
  const SokLookupTable tb = tables[t];
  int32_t path = 0;
  if (Probed(tb)) {
    const int repeats =
        FitsRow32(tb) ? WindowsRepeats<unsigned>(tb) : WindowsRepeats<long long>(tb);
    if (repeats >= RepeatsNeeded(tb.rows)) path = kPathRepeats;
  }
  if (threadIdx.x == 0) outs[t].path = path;
}

// The tables ProbeRepeats gave to DenseRepeats.
__global__ void DenseRowsRepeats(const SokLookupTable* __restrict__ tables,
                                 const SokLookupGradTable* __restrict__ outs,
                                 const int64_t* __restrict__ checks) {
  const int t = blockIdx.y;
  const SokLookupTable tb = tables[t];
  if (!TakesRepeats(tb, outs[t]) || CheckFailed(checks, t, gridDim.y)) return;
  const float* grads = outs[t].grads;
  float* rows = outs[t].grad_rows;
  if (NarrowItems(tb)) {
    if (FitsRow32(tb)) {
      DenseRepeats<uint32_t, unsigned>(tb, grads, rows);
    } else {
      DenseRepeats<uint32_t, long long>(tb, grads, rows);
    }
  } else if (FitsRow32(tb)) {
    DenseRepeats<int64_t, unsigned>(tb, grads, rows);
  } else {
    DenseRepeats<int64_t, long long>(tb, grads, rows);
  }
}

// The sort's key layout: the id in the low id_bits (enough for the largest
// table), the table above it. Fails (false) when they do not fit 63 bits.
bool KeyBits(const PlanSizes& z, int num_tables, int* id_bits, int* key_bits) {
  *id_bits = BitsFor(z.max_rows > 0 ? z.max_rows - 1 : 0);
  *key_bits = *id_bits + BitsFor(num_tables > 0 ? num_tables - 1 : 0);
  return *key_bits <= 63;
}

// Checks shared by both calls; false for arguments no plan can take.
bool Valid(const PlanSizes& z, int num_tables) {
  return num_tables > 0 && num_tables <= 65535 && z.nnz >= 0 && z.nnz < INT_MAX &&
         !z.bad_no_splits;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int sok_lookup_backward_plan(
    const SokLookupTable* host_tables, const SokLookupTable* tables, int num_tables,
    int64_t* num_unique, int64_t* first_bad, void* temp, size_t* temp_bytes, void* stream) {
  const PlanSizes z = SizesOf(host_tables, num_tables);
  int id_bits = 0, key_bits = 0;
  if (!Valid(z, num_tables) || !KeyBits(z, num_tables, &id_bits, &key_bits)) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  Plan p;
  cudaError_t err = LayPlan(static_cast<char*>(temp), z, num_tables, key_bits, &p, s);
  if (err != cudaSuccess) return static_cast<int>(err);
  if (temp == nullptr) {
    *temp_bytes = p.total;
    return 0;
  }
  if (*temp_bytes < p.total) return static_cast<int>(cudaErrorInvalidValue);
  PlanTables<<<1, 32, 0, s>>>(tables, num_tables, p.per_table);
  if (z.nnz == 0) {
    err = cudaMemsetAsync(p.num_runs, 0, sizeof(int64_t), s);
    if (err == cudaSuccess && num_unique != nullptr) {
      err = cudaMemsetAsync(num_unique, 0, sizeof(int64_t) * num_tables, s);
    }
    // The rows call reads each table's runs (none).
    if (err == cudaSuccess) {
      PlanCounts<<<Grid(num_tables), 256, 0, s>>>(tables, num_tables, p.run_of, p.per_table,
                                                   num_unique);
      err = cudaGetLastError();
    }
    return static_cast<int>(err);
  }
  const int64_t nnz = z.nnz;
  const int num = static_cast<int>(nnz);
  const bool ranked = num_unique != nullptr;
  err = p.narrow_keys ? SortedRunHeads<uint32_t>(tables, z, num_tables, id_bits, key_bits, p,
                                                   ranked, first_bad, s)
                      : SortedRunHeads<uint64_t>(tables, z, num_tables, id_bits, key_bits, p,
                                                 ranked, first_bad, s);
  if (err != cudaSuccess) return static_cast<int>(err);
  size_t bytes = p.cub_bytes;
  err = cub::DeviceScan::InclusiveSum(p.cub, bytes, p.head, p.run_of, num, s);
  if (err != cudaSuccess) return static_cast<int>(err);
  PlanRuns<<<Grid(nnz), 256, 0, s>>>(p.head, p.run_of, p.sorted_pos, nnz, p.run_start,
                                     ranked ? p.first_flag : nullptr, p.num_runs);
  if (ranked) {
    bytes = p.cub_bytes;
    err = cub::DeviceScan::InclusiveSum(p.cub, bytes, p.first_flag, p.first_rank, num, s);
    if (err != cudaSuccess) return static_cast<int>(err);
    PlanRanks<<<Grid(nnz), 256, 0, s>>>(p.run_start, p.sorted_pos, p.first_rank, p.num_runs,
                                        p.rank_of);
  }
  PlanCounts<<<Grid(num_tables), 256, 0, s>>>(tables, num_tables, p.run_of, p.per_table,
                                               num_unique);
  if (z.any_splits) {
    PlanSamples<<<TableGrid(z.max_batch, num_tables), 256, 0, s>>>(tables, p.per_table,
                                                                   p.sample_factor);
  }
  return static_cast<int>(cudaGetLastError());
}

extern "C" __attribute__((visibility("default"))) int sok_lookup_backward_rows(
    const SokLookupTable* host_tables, const SokLookupTable* tables, int num_tables,
    const SokLookupGradTable* outs, const int64_t* checks, void* temp, void* stream) {
  const PlanSizes z = SizesOf(host_tables, num_tables);
  int id_bits = 0, key_bits = 0;
  if (!Valid(z, num_tables) || !KeyBits(z, num_tables, &id_bits, &key_bits)) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  if (z.nnz == 0) return 0;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  Plan p;
  // Same layout as the plan call (same sizes and key bits).
  cudaError_t err = LayPlan(static_cast<char*>(temp), z, num_tables, key_bits, &p, s);
  if (err != cudaSuccess) return static_cast<int>(err);
  RowsIds<<<TableGrid(z.max_nnz, num_tables), 256, 0, s>>>(tables, p.per_table, outs,
                                                           p.sorted_pos, p.run_start, p.rank_of);
  RowsPieces<<<TableGrid(z.max_chunk_elems, num_tables), 256, 0, s>>>(
      tables, p.per_table, outs, p.sorted_pos, p.head, p.sample_factor, p.piece_sum);
  err = cudaMemsetAsync(p.num_long, 0, sizeof(int64_t), s);
  if (err != cudaSuccess) return static_cast<int>(err);
  RowsSum<<<TableGrid(z.max_elems, num_tables), 256, 0, s>>>(
      tables, p.per_table, outs, p.piece_sum, p.sorted_pos, p.run_start, p.rank_of, checks,
      p.long_runs, p.num_long);
  RowsSumLong<<<264, 256, 0, s>>>(tables, p.per_table, outs, p.piece_sum, p.sorted_pos,
                                  p.run_start, p.rank_of, p.long_runs, p.num_long);
  if (z.any_max_norm) {
    RowsClip<<<TableGrid(z.max_nnz * 32, num_tables), 256, 0, s>>>(
        tables, p.per_table, outs, p.sorted_pos, p.run_start, p.rank_of, checks);
  }
  return static_cast<int>(cudaGetLastError());
}


namespace {

// Whether the unordered gradient takes the shared-memory slices at all in
// this build. clang's build of DenseRowsShared (the package's) ran slower
// than its own global atomics on every shape timed (H100: the DemoModel's
// 0.52 against 0.39 ms, 400 rows x 128 0.59 against 0.37, 2000 x 64 0.61
// against 0.33), for a cause not found: its loads are global and issued
// ahead of the additions, as nvcc's are, and its registers are fewer.
// nvcc's build wins where each row takes thousands of ids (400 x 128: 0.29
// against 0.37 ms), so the checks and timings built by nvcc keep it.
#if defined(__clang__)
constexpr bool kSlicesBuilt = false;
#else
constexpr bool kSlicesBuilt = true;
#endif

// The shared-slice launch on the current device: a block per SM, each with
// the most shared memory a block may have (none where the build takes no
// slices: then SlicesOf gives every table width 0).
struct SliceLaunch {
  int blocks = 0;
  int64_t slice_floats = 0;
};
cudaError_t SliceLaunchOf(SliceLaunch* l) {
  // A build without slices asks the device nothing (zero floats: no table
  // takes them, whatever the block count).
  if (!kSlicesBuilt) return cudaSuccess;
  int device = 0, sms = 0, per_block = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  }
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  }
  l->blocks = sms;
  l->slice_floats = per_block / static_cast<int64_t>(sizeof(float));
  return err;
}

int DenseUnordered(const SokLookupTable* host_tables, const SokLookupTable* tables,
                   int num_tables, SokLookupGradTable* outs, int64_t* checks,
                   bool slices, void* stream) {
  const PlanSizes z = SizesOf(host_tables, num_tables);
  // max_norm's clip needs each distinct id once (the ordered rows step).
  if (!Valid(z, num_tables) || z.any_max_norm || checks == nullptr) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  if (z.nnz == 0) return 0;
  SliceLaunch sl;
  if (slices) {
    const cudaError_t err = SliceLaunchOf(&sl);
    if (err != cudaSuccess) return static_cast<int>(err);
  }
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  DenseCheckIds<<<TableGrid(z.max_nnz, num_tables), 256, 0, s>>>(tables, checks);
  // The largest table's work in DenseRows, DenseRowsShared and
  // DenseRowsRepeats (the probed one-id tables: which of the three such a
  // table takes, ProbeRepeats decides on the device).
  int64_t max_items = 0, max_one_ids = 0, shared_floats = 0;
  for (int t = 0; t < num_tables; ++t) {
    const SokLookupTable& tb = host_tables[t];
    const SharedSlices sv = SlicesOf(tb, sl.slice_floats, sl.blocks);
    if (sv.width != 0) {
      shared_floats = std::max(shared_floats, tb.rows * sv.width);
    } else {
      max_items = std::max(max_items, tb.batch * tb.dim);
    }
    if (Probed(tb)) max_one_ids = std::max(max_one_ids, tb.batch * tb.dim);
  }
  if (shared_floats > 0) {
    // Always the device's whole limit, not this call's need: ops on other
    // host threads set it too, between this call's setting and its launch.
    const cudaError_t err =
        cudaFuncSetAttribute(DenseRowsShared, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(sl.slice_floats * sizeof(float)));
    if (err != cudaSuccess) return static_cast<int>(err);
  }
  if (max_one_ids > 0) {
    ProbeRepeats<<<num_tables, 32, 0, s>>>(tables, outs);
  }
  if (max_items > 0) {
    DenseRows<<<TableGrid(max_items, num_tables), kDenseRowsThreads, 0, s>>>(
        tables, outs, checks, sl.slice_floats, sl.blocks);
  }
  if (max_one_ids > 0) {
    // Its warps stride over the windows; a grid of one wave or so, as most
    // calls' blocks return at once (path 0).
    const dim3 grid(std::min(Grid(max_one_ids), 1024u), static_cast<unsigned>(num_tables));
    DenseRowsRepeats<<<grid, 256, 0, s>>>(tables, outs, checks);
  }
  if (shared_floats > 0) {
    DenseRowsShared<<<dim3(sl.blocks, num_tables), kSliceThreads,
                      static_cast<size_t>(shared_floats) * sizeof(float), s>>>(
        tables, outs, checks, sl.slice_floats);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int sok_lookup_backward_dense_unordered(
    const SokLookupTable* host_tables, const SokLookupTable* tables, int num_tables,
    SokLookupGradTable* outs, int64_t* checks, void* stream) {
  return DenseUnordered(host_tables, tables, num_tables, outs, checks, true, stream);
}

extern "C" __attribute__((visibility("default"))) int sok_lookup_backward_dense_atomics(
    const SokLookupTable* host_tables, const SokLookupTable* tables, int num_tables,
    SokLookupGradTable* outs, int64_t* checks, void* stream) {
  return DenseUnordered(host_tables, tables, num_tables, outs, checks, false, stream);
}

extern "C" __attribute__((visibility("default"))) int sok_lookup_backward_dense_slices_built() {
  return kSlicesBuilt ? 1 : 0;
}

extern "C" __attribute__((visibility("default"))) int sok_lookup_backward_dense_slice_width(
    const SokLookupTable* host_table, int* width) {
  SliceLaunch sl;
  const cudaError_t err = SliceLaunchOf(&sl);
  *width = err == cudaSuccess ? SlicesOf(*host_table, sl.slice_floats, sl.blocks).width : 0;
  return static_cast<int>(err);
}
