// The ordered backward of the fused lookup (see lookup_launcher.h):
// sok_lookup_backward_plan sorts the (table, id) keys of all tables with
// their positions and finds the runs of equal ids; sok_lookup_backward_rows
// sums each run's gradient rows in position order (deterministic), places
// the sums and clips them. Apart from the dense gradient in no fixed order
// (lookup_backward_dense.cu), which needs neither; what both use is in
// lookup_backward_internal.cuh.
//
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
#include <algorithm>
#include <cstdint>

#include <cub/cub.cuh>
#include <cuda_runtime.h>

#include "tf_ops/common/cuda_helpers.cuh"
#include "tf_ops/lookup/kernels/lookup_backward_internal.cuh"
#include "tf_ops/lookup/kernels/lookup_launcher.h"

namespace sok_graph {
namespace lookup_backward {
namespace {

using sok_graph::cuda::Align;

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

// A run of more pieces than this (a hot id: more than about 2048
// positions) is summed by a block (RowsSumLong), not by one thread per
// column: half of the DemoModel's 8.2M positions on one padding id made
// 131,072 pieces in a row per thread, 47 ms.
constexpr int64_t kLongRunPieces = 64;

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
    off += Align(bytes > 0 ? bytes : 1);
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
    if (norm <= tb.max_norm) continue;  // a NaN norm goes on (MaxNormBackward)
    const float scale = tb.max_norm / norm, proj = dot / sq;
    for (int d = lane; d < tb.dim; d += 32) g[d] = scale * (g[d] - x[d] * proj);
  }
}

// The sort's key layout: the id in the low id_bits (enough for the largest
// table), the table above it. Fails (false) when they do not fit 63 bits.
bool KeyBits(const PlanSizes& z, int num_tables, int* id_bits, int* key_bits) {
  *id_bits = BitsFor(z.max_rows > 0 ? z.max_rows - 1 : 0);
  *key_bits = *id_bits + BitsFor(num_tables > 0 ? num_tables - 1 : 0);
  return *key_bits <= 63;
}

}  // namespace
}  // namespace lookup_backward
}  // namespace sok_graph

// The names the C launchers below use, from the namespace above.
using sok_graph::cuda::Grid;
using sok_graph::lookup_backward::KeyBits;
using sok_graph::lookup_backward::LayPlan;
using sok_graph::lookup_backward::Plan;
using sok_graph::lookup_backward::PlanCounts;
using sok_graph::lookup_backward::PlanRanks;
using sok_graph::lookup_backward::PlanRuns;
using sok_graph::lookup_backward::PlanSamples;
using sok_graph::lookup_backward::PlanSizes;
using sok_graph::lookup_backward::PlanTables;
using sok_graph::lookup_backward::RowsClip;
using sok_graph::lookup_backward::RowsIds;
using sok_graph::lookup_backward::RowsPieces;
using sok_graph::lookup_backward::RowsSum;
using sok_graph::lookup_backward::RowsSumLong;
using sok_graph::lookup_backward::SizesOf;
using sok_graph::lookup_backward::SortedRunHeads;
using sok_graph::lookup_backward::TableGrid;
using sok_graph::lookup_backward::Valid;

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
