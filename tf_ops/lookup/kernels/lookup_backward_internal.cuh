// CUDA backward of the fused lookup (see lookup_launcher.h). Sort (id,
// position) pairs, find the runs of equal ids, then sum each run's rows in
// position order. sok_unique_segment_sum_f32 is the core on per-position
// gradient rows (ids ascending); sok_lookup_backward_plan/_rows is the whole
// gradient of one table as the TensorFlow op defines it.
//
// Its files:
//   lookup_backward_segment_sum.cu  sok_unique_segment_sum_f32
//   lookup_backward_plan.cu         sok_lookup_backward_plan / _rows
//   lookup_backward_dense.cu        sok_lookup_backward_dense_* (atomics)
//
// This header holds what the ordered plan and the dense gradient in no
// fixed order share: a lookup's sizes, the reads of the tables' arrays, the
// report of a bad id, a sample's combiner factor and a table's check. Each
// .cu file is a translation unit of its own (no relocatable device code),
// so it is compiled into each file that includes it (internal linkage), as
// tf_ops/common/cuda_helpers.cuh is.
#ifndef SOK_GRAPH_TF_OPS_LOOKUP_KERNELS_LOOKUP_BACKWARD_INTERNAL_CUH_
#define SOK_GRAPH_TF_OPS_LOOKUP_KERNELS_LOOKUP_BACKWARD_INTERNAL_CUH_

#include <algorithm>
#include <climits>
#include <cstdint>

#include <cuda_runtime.h>

#include "tf_ops/common/cuda_helpers.cuh"
#include "tf_ops/lookup/core/combiner.h"
#include "tf_ops/lookup/kernels/lookup_launcher.h"

namespace sok_graph {
namespace lookup_backward {
namespace {

using sok_graph::cuda::Grid;

// blockIdx.y is the table; blockIdx.x strides over the table's items, of
// which the largest table has max_items.
inline dim3 TableGrid(int64_t max_items, int num_tables) {
  return dim3(Grid(max_items), static_cast<unsigned>(num_tables));
}

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

inline PlanSizes SizesOf(const SokLookupTable* tables, int num_tables) {
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

// Checks shared by both calls; false for arguments no plan can take.
inline bool Valid(const PlanSizes& z, int num_tables) {
  return num_tables > 0 && num_tables <= 65535 && z.nnz >= 0 && z.nnz < INT_MAX &&
         !z.bad_no_splits;
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

// Whether id (at position j of table tb) lies outside [0, rows); if so,
// *first_bad (the table's) keeps the smallest such position.
__device__ __forceinline__ bool ReportIfBad(const SokLookupTable& tb, int64_t j, int64_t id,
                                            int64_t* first_bad) {
  if (id >= 0 && id < tb.rows) return false;
  atomicMin(reinterpret_cast<unsigned long long*>(first_bad), static_cast<unsigned long long>(j));
  return true;
}

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

// Whether table t's column of the lookup's check (rows 0 and 3, see
// lookup_launcher.h) records a bad id or malformed row_splits: its dense
// gradient is then left as the caller zeroed it (SkipTable, and the
// kernels of lookup_backward_dense.cu).
__device__ __forceinline__ bool CheckFailed(const int64_t* __restrict__ checks, int t,
                                            int num_tables) {
  return checks[t] != INT64_MAX || checks[3 * num_tables + t] != INT64_MAX;
}

}  // namespace
}  // namespace lookup_backward
}  // namespace sok_graph

#endif  // SOK_GRAPH_TF_OPS_LOOKUP_KERNELS_LOOKUP_BACKWARD_INTERNAL_CUH_
