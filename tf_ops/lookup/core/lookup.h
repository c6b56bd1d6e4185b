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
#include <vector>

#include "tf_ops/lookup/core/combiner.h"
#include "tf_ops/util/core/segment_sum.h"
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

// The combiner's factor for each sample in [b0, b1).
template <typename T, typename K>
void SampleScales(const TableView<T, K>& t, int64_t b0, int64_t b1, float* scales) {
  for (int64_t b = b0; b < b1; ++b) {
    float sum = 0.0f, sq = 0.0f;
    for (int64_t j = t.row_splits[b]; j < t.row_splits[b + 1]; ++j) {
      const float w = t.weight(j);
      sum += w;
      sq += w * w;
    }
    scales[b] = CombinerScale(t.combiner, sum, sq);
  }
}

// out[b, :] for samples [b0, b1). `acc` is scratch of t.dim floats.
template <typename T, typename K>
void LookupForward(const TableView<T, K>& t, int64_t b0, int64_t b1, T* out, float* acc) {
  for (int64_t b = b0; b < b1; ++b) {
    std::fill(acc, acc + t.dim, 0.0f);
    float wsum = 0.0f, wsq = 0.0f;
    for (int64_t j = t.row_splits[b]; j < t.row_splits[b + 1]; ++j) {
      const T* row = t.params + static_cast<int64_t>(t.ids[j]) * t.dim;
      const float w = t.weight(j);
      const float scale = w * MaxNormScale(row, t.dim, t.max_norm);
      for (int64_t d = 0; d < t.dim; ++d) acc[d] += scale * static_cast<float>(row[d]);
      wsum += w;
      wsq += w * w;
    }
    const float s = CombinerScale(t.combiner, wsum, wsq);
    T* dst = out + b * t.dim;
    for (int64_t d = 0; d < t.dim; ++d) dst[d] = static_cast<T>(acc[d] * s);
  }
}

// What the backward pass of one table needs before it can sum gradient rows:
// the unique ids (first-appearance order, as tf.unique) and, for each unique
// id, the positions where it occurs together with their samples.
template <typename K>
struct BackwardPlan {
  std::vector<K> unique_ids;
  SegmentGroups occurrences;       // positions grouped by unique id
  std::vector<int64_t> sample_of;  // position -> sample
};

template <typename T, typename K>
void PlanBackward(const TableView<T, K>& t, int64_t nnz, BackwardPlan<K>* plan) {
  std::vector<int64_t> inverse(static_cast<size_t>(nnz));
  UniqueWithInverse<K, int64_t>(t.ids, nnz, &plan->unique_ids, inverse.data(), nullptr);
  GroupBySegment(inverse.data(), nnz, static_cast<int64_t>(plan->unique_ids.size()),
                 &plan->occurrences);
  plan->sample_of.resize(static_cast<size_t>(nnz));
  for (int64_t b = 0; b < t.batch; ++b) {
    for (int64_t j = t.row_splits[b]; j < t.row_splits[b + 1]; ++j) plan->sample_of[j] = b;
  }
}

// grad_rows[u, :] for unique ids [u0, u1): the sum over the id's occurrences
// of weight * combiner factor * grads[sample, :], then through the max_norm
// clip. Deterministic: occurrences are summed in position order.
template <typename T, typename K>
void LookupBackward(const TableView<T, K>& t, const BackwardPlan<K>& plan, const float* scales,
                    const T* grads, int64_t u0, int64_t u1, T* grad_rows, float* acc) {
  const SegmentGroups& g = plan.occurrences;
  for (int64_t u = u0; u < u1; ++u) {
    std::fill(acc, acc + t.dim, 0.0f);
    for (int64_t k = g.offsets[u]; k < g.offsets[u + 1]; ++k) {
      const int64_t j = g.order[k];
      const int64_t b = plan.sample_of[j];
      const float s = t.weight(j) * scales[b];
      const T* g_row = grads + b * t.dim;
      for (int64_t d = 0; d < t.dim; ++d) acc[d] += s * static_cast<float>(g_row[d]);
    }
    if (t.max_norm > 0.0f) {
      const T* row = t.params + static_cast<int64_t>(plan.unique_ids[u]) * t.dim;
      MaxNormBackward(row, t.dim, t.max_norm, acc);
    }
    T* dst = grad_rows + u * t.dim;
    for (int64_t d = 0; d < t.dim; ++d) dst[d] = static_cast<T>(acc[d]);
  }
}

}  // namespace core
}  // namespace sok_graph

#endif  // SOK_GRAPH_TF_OPS_LOOKUP_CORE_LOOKUP_H_
