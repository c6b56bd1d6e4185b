// Forward and backward of one table of the fused lookup, on raw pointers.
// The kernels validate inputs, allocate outputs and split the work over
// threads; everything numeric lives here so C++ tests can check it directly.
// TF-independent; C++14.
//
// Shapes:  params [rows, dim]   ids [nnz]   row_splits [batch + 1]
//          weights [nnz] or none          out / grads [batch, dim]
#ifndef SOK_GRAPH_TF_OPS_LOOKUP_CORE_LOOKUP_H_
#define SOK_GRAPH_TF_OPS_LOOKUP_CORE_LOOKUP_H_

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "tf_ops/lookup/core/combiner.h"
#include "tf_ops/util/core/prefetch.h"
#include "tf_ops/util/core/unique.h"

namespace sok_graph {
namespace core {

template <typename T, typename K>
struct TableView {
  const T* params = nullptr;
  int64_t rows = 0;
  int64_t dim = 0;
  const K* ids = nullptr;
  const int64_t* row_splits = nullptr;
  int64_t batch = 0;
  const T* weights = nullptr;  // nullptr: every weight is 1
  Combiner combiner = Combiner::kMean;
  float max_norm = 0.0f;  // <= 0: no clipping

  float weight(int64_t j) const { return weights ? static_cast<float>(weights[j]) : 1.0f; }
};

// The first position whose id is outside [0, rows), or -1. Positions are
// checked in [begin, end).
template <typename T, typename K>
int64_t FirstBadId(const TableView<T, K>& t, int64_t begin, int64_t end) {
  for (int64_t j = begin; j < end; ++j) {
    const int64_t id = static_cast<int64_t>(t.ids[j]);
    if (id < 0 || id >= t.rows) return j;
  }
  return -1;
}

// The combiner's factor of the sample whose ids are positions [j0, j1).
template <typename T, typename K>
float SampleScale(const TableView<T, K>& t, int64_t j0, int64_t j1) {
  if (t.weights == nullptr) {  // the sums of j1 - j0 ones, exactly
    const float count = static_cast<float>(j1 - j0);
    return CombinerScale(t.combiner, count, count);
  }
  float sum = 0.0f, sq = 0.0f;
  for (int64_t j = j0; j < j1; ++j) {
    const float w = t.weight(j);
    sum += w;
    sq += w * w;
  }
  return CombinerScale(t.combiner, sum, sq);
}

// The combiner's factor for each sample in [b0, b1).
template <typename T, typename K>
void SampleScales(const TableView<T, K>& t, int64_t b0, int64_t b1, float* scales) {
  for (int64_t b = b0; b < b1; ++b) scales[b] = SampleScale(t, t.row_splits[b], t.row_splits[b + 1]);
}

// How many ids ahead the forward pass prefetches rows. Rows are read at
// random from tables far larger than the caches; without prefetching every
// row costs a full memory latency.
constexpr int64_t kPrefetchDistance = 32;

template <typename T>
inline void PrefetchRow(const T* row, int64_t dim) {
  PrefetchSpan(row, dim * static_cast<int64_t>(sizeof(T)));
}

// out[b, :] for samples [b0, b1). `acc` is scratch of t.dim floats.
// Returns -1, or the first position in the range whose id is outside
// [0, rows): then it stops, leaving later samples unwritten. Checking here
// rather than in a pass of its own saves reading the ids twice.
template <typename T, typename K>
int64_t LookupForward(const TableView<T, K>& t, int64_t b0, int64_t b1, T* out, float* acc) {
  const int64_t dim = t.dim;
  const int64_t last = b1 > b0 ? t.row_splits[b1] : 0;  // prefetch within this range
  for (int64_t b = b0; b < b1; ++b) {
    std::fill(acc, acc + dim, 0.0f);
    float wsum = 0.0f, wsq = 0.0f;
    for (int64_t j = t.row_splits[b]; j < t.row_splits[b + 1]; ++j) {
      if (j + kPrefetchDistance < last) {
        // Not yet range-checked: a bad id must not even form an address.
        const int64_t ahead = static_cast<int64_t>(t.ids[j + kPrefetchDistance]);
        if (ahead >= 0 && ahead < t.rows) PrefetchRow(t.params + ahead * dim, dim);
      }
      const int64_t id = static_cast<int64_t>(t.ids[j]);
      if (id < 0 || id >= t.rows) return j;
      const T* __restrict__ row = t.params + id * dim;
      const float w = t.weight(j);
      const float scale = w * MaxNormScale(row, dim, t.max_norm);
      float* __restrict__ a = acc;
      for (int64_t d = 0; d < dim; ++d) a[d] += scale * static_cast<float>(row[d]);
      wsum += w;
      wsq += w * w;
    }
    const float s = CombinerScale(t.combiner, wsum, wsq);
    T* dst = out + b * dim;
    for (int64_t d = 0; d < dim; ++d) dst[d] = static_cast<T>(acc[d] * s);
  }
  return -1;
}

// What the backward pass of one table needs before it can sum gradient rows:
// the unique ids (first-appearance order, as tf.unique) and the unique index
// of every position.
template <typename K>
struct BackwardPlan {
  std::vector<K> unique_ids;
  std::vector<int64_t> inverse;  // position -> index into unique_ids
};

// Fills `plan` for the table's nnz ids. Returns -1, or the first position
// whose id is outside [0, t.rows) (then the plan is unusable). When the
// caller offers a zeroed `dense_scratch` of at least t.rows entries (see
// UniqueWithInverseInRange), unique ids are found by direct indexing instead
// of hashing.
template <typename T, typename K>
int64_t PlanBackward(const TableView<T, K>& t, int64_t nnz, BackwardPlan<K>* plan,
                     int32_t* dense_scratch = nullptr) {
  plan->inverse.resize(static_cast<size_t>(nnz));
  if (dense_scratch != nullptr && nnz < INT32_MAX) {
    return UniqueWithInverseInRange<K, int64_t>(t.ids, nnz, t.rows, dense_scratch,
                                                &plan->unique_ids, plan->inverse.data());
  }
  const int64_t bad = FirstBadId(t, 0, nnz);
  if (bad >= 0) return bad;
  UniqueWithInverse<K, int64_t>(t.ids, nnz, &plan->unique_ids, plan->inverse.data(), nullptr);
  return -1;
}

// grad_rows[u, :] for unique ids [u0, u1): the sum over the id's occurrences
// of weight * combiner factor * grads[sample, :], then through the max_norm
// clip. `scales`: each sample's combiner factor (SampleScales), or nullptr
// to compute it here, sample by sample (the same values, without a pass of
// its own). One pass over the table's ids in position order, adding each into
// its unique row when that row is in [u0, u1): the gradient buffers stay in
// cache, and every row is summed in position order however [0, U) is split,
// so results are deterministic.
template <typename T, typename K>
void LookupBackward(const TableView<T, K>& t, const BackwardPlan<K>& plan, const float* scales,
                    const T* grads, int64_t u0, int64_t u1, T* grad_rows) {
  if (u1 <= u0) return;
  const int64_t dim = t.dim;
  const bool whole = u0 == 0 && u1 == static_cast<int64_t>(plan.unique_ids.size());
  // float rows accumulate in place; half types in a float buffer.
  const bool in_place = std::is_same<T, float>::value;
  std::vector<float> buffer(in_place ? 0 : static_cast<size_t>((u1 - u0) * dim));
  float* const acc_base =
      in_place ? reinterpret_cast<float*>(grad_rows + u0 * dim) : buffer.data();
  // Unique indices are numbered in order of first appearance, so scanning
  // positions in order meets the rows of [u0, u1) first in increasing order:
  // a row is written at its first occurrence and added to afterwards, with
  // no separate zeroing pass over the buffer.
  int64_t next_new = u0;
  const int64_t nnz = t.row_splits[t.batch];
  for (int64_t b = 0; b < t.batch; ++b) {
    const T* __restrict__ g_row = grads + b * dim;
    const int64_t j0 = t.row_splits[b], j1 = t.row_splits[b + 1];
    const float scale = scales != nullptr ? scales[b] : SampleScale(t, j0, j1);
    for (int64_t j = j0; j < j1; ++j) {
      if (j + kPrefetchDistance < nnz) {  // the row updated a few ids from now
        const int64_t ahead = plan.inverse[j + kPrefetchDistance];
        if (whole || (ahead >= u0 && ahead < u1)) {
          PrefetchRow(acc_base + (ahead - u0) * dim, dim);
        }
      }
      const int64_t u = plan.inverse[j];
      if (!whole && (u < u0 || u >= u1)) continue;
      const float s = t.weight(j) * scale;
      float* __restrict__ a = acc_base + (u - u0) * dim;
      if (u == next_new) {
        for (int64_t d = 0; d < dim; ++d) a[d] = s * static_cast<float>(g_row[d]);
        ++next_new;
      } else {
        for (int64_t d = 0; d < dim; ++d) a[d] += s * static_cast<float>(g_row[d]);
      }
    }
  }
  for (int64_t u = u0; u < u1; ++u) {
    float* a = acc_base + (u - u0) * dim;
    if (t.max_norm > 0.0f) {
      const T* row = t.params + static_cast<int64_t>(plan.unique_ids[u]) * dim;
      MaxNormBackward(row, dim, t.max_norm, a);
    }
    if (!in_place) {
      T* dst = grad_rows + u * dim;
      for (int64_t d = 0; d < dim; ++d) dst[d] = static_cast<T>(a[d]);
    }
  }
}

}  // namespace core
}  // namespace sok_graph

#endif  // SOK_GRAPH_TF_OPS_LOOKUP_CORE_LOOKUP_H_
