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
#include <memory>
#include <type_traits>
#include <vector>

#include "tf_ops/lookup/core/combiner.h"
#include "tf_ops/lookup/core/row_ops.h"
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

// The combiner's factor of the weighted sample whose ids are positions
// [j0, j1).
template <typename T, typename K>
float WeightedSampleScale(const TableView<T, K>& t, int64_t j0, int64_t j1) {
  float sum = 0.0f, sq = 0.0f;
  for (int64_t j = j0; j < j1; ++j) {
    const float w = t.weight(j);
    sum += w;
    sq += w * w;
  }
  return CombinerScale(t.combiner, sum, sq);
}

// The combiner's factor of the sample whose ids are positions [j0, j1).
// Small enough to inline into the per-sample loops of the backward (it is
// called once per sample there).
template <typename T, typename K>
inline float SampleScale(const TableView<T, K>& t, int64_t j0, int64_t j1) {
  if (t.weights != nullptr) return WeightedSampleScale(t, j0, j1);
  const float count = static_cast<float>(j1 - j0);  // the sums of j1 - j0 ones, exactly
  return CombinerScale(t.combiner, count, count);
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

// LookupForward for rows of width type W (FixedWidth or int64_t: row_ops.h).
template <typename W, typename T, typename K>
int64_t LookupForwardRows(const TableView<T, K>& t, W dim, int64_t b0, int64_t b1, T* out,
                          float* scratch) {
  const int64_t last = b1 > b0 ? t.row_splits[b1] : 0;  // prefetch within this range
  const bool clip = t.max_norm > 0.0f;
  for (int64_t b = b0; b < b1; ++b) {
    RowBuffer<W> acc(scratch);
    SetZero(&acc, dim);
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
      const float scale = clip ? w * MaxNormScale(row, dim, t.max_norm) : w;
      AddScaled(&acc, scale, row, dim);
      wsum += w;
      wsq += w * w;
    }
    const float s = CombinerScale(t.combiner, wsum, wsq);
    StoreScaled(acc, s, out + b * dim, dim);
  }
  return -1;
}

// out[b, :] for samples [b0, b1). `acc` is scratch of t.dim floats.
// Returns -1, or the first position in the range whose id is outside
// [0, rows): then it stops, leaving later samples unwritten. Checking here
// rather than in a pass of its own saves reading the ids twice.
template <typename T, typename K>
int64_t LookupForward(const TableView<T, K>& t, int64_t b0, int64_t b1, T* out, float* acc) {
  return WithRowWidth(t.dim, [&](auto dim) {
    return LookupForwardRows(t, dim, b0, b1, out, acc);
  });
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

// LookupBackward for rows of width type W (FixedWidth or int64_t: row_ops.h).
template <typename W, typename T, typename K>
void LookupBackwardRows(const TableView<T, K>& t, W dim, const BackwardPlan<K>& plan,
                        const float* scales, const T* grads, int64_t u0, int64_t u1,
                        T* grad_rows) {
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
  std::vector<float> scratch(std::is_integral<W>::value ? static_cast<size_t>(dim) : 0);
  for (int64_t b = 0; b < t.batch; ++b) {
    const int64_t j0 = t.row_splits[b], j1 = t.row_splits[b + 1];
    if (j0 == j1) continue;
    // The sample's gradient row, read once for all its ids.
    RowBuffer<W> g(scratch.data());
    Load(&g, grads + b * dim, dim);
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
      float* a = acc_base + (u - u0) * dim;
      if (u == next_new) {
        SetToScaled(a, s, g, dim);
        ++next_new;
      } else {
        AddScaledTo(a, s, g, dim);
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
  WithRowWidth(t.dim, [&](auto dim) {
    LookupBackwardRows(t, dim, plan, scales, grads, u0, u1, grad_rows);
  });
}

// SumGradientRows for rows of width type W (FixedWidth or int64_t: row_ops.h).
template <typename W, typename T, typename K>
int64_t SumGradientRowsOf(const TableView<T, K>& t, W dim, const T* grads, int32_t* slot_of,
                          std::vector<K>* unique_ids, float* rows) {
  unique_ids->clear();
  const int64_t nnz = t.row_splits[t.batch];
  // Without a slot table the ids are hashed (the index keeps its own list
  // of unique ids).
  std::unique_ptr<FirstOccurrenceIndex<K>> hashed;
  if (slot_of == nullptr) hashed.reset(new FirstOccurrenceIndex<K>(nnz));
  constexpr int64_t kAhead = 16;  // slot_of is read at random: fetch ahead
  std::vector<float> scratch(std::is_integral<W>::value ? static_cast<size_t>(dim) : 0);
  int64_t next_new = 0, bad = -1;
  for (int64_t b = 0; b < t.batch && bad < 0; ++b) {
    const int64_t j0 = t.row_splits[b], j1 = t.row_splits[b + 1];
    if (j0 == j1) continue;
    RowBuffer<W> g(scratch.data());  // the sample's gradient row
    Load(&g, grads + b * dim, dim);
    const float scale = SampleScale(t, j0, j1);
    for (int64_t j = j0; j < j1; ++j) {
      const int64_t id = static_cast<int64_t>(t.ids[j]);
      if (id < 0 || id >= t.rows) {
        bad = j;
        break;
      }
      int64_t u;
      if (slot_of != nullptr) {
        if (j + kAhead < nnz) {
          const uint64_t ahead = static_cast<uint64_t>(t.ids[j + kAhead]);
          if (ahead < static_cast<uint64_t>(t.rows)) {
            PrefetchLine(reinterpret_cast<uintptr_t>(slot_of + ahead));
          }
        }
        int32_t& slot = slot_of[id];
        if (slot == 0) {
          unique_ids->push_back(t.ids[j]);
          slot = static_cast<int32_t>(unique_ids->size());
        }
        u = slot - 1;
      } else {
        u = hashed->Insert(t.ids[j]);
      }
      // New indices come in increasing order: a row is written at its first
      // occurrence and added to afterwards.
      const float s = t.weight(j) * scale;
      if (u == next_new) {
        SetToScaled(rows + u * dim, s, g, dim);
        ++next_new;
      } else {
        AddScaledTo(rows + u * dim, s, g, dim);
      }
    }
  }
  if (slot_of != nullptr) {
    for (K id : *unique_ids) slot_of[static_cast<int64_t>(id)] = 0;
  } else {
    unique_ids->swap(hashed->mutable_keys());
  }
  if (bad >= 0 || t.max_norm <= 0.0f) return bad;
  for (int64_t u = 0; u < next_new; ++u) {
    const T* row = t.params + static_cast<int64_t>((*unique_ids)[u]) * dim;
    MaxNormBackward(row, dim, t.max_norm, rows + u * dim);
  }
  return -1;
}

// The gradient of one whole table in a single pass over its positions: each
// id's unique index is found (in order of first appearance, as PlanBackward
// numbers them) and the position's gradient added into that row at once, so
// no inverse map is written and read back. The sums are those of
// PlanBackward + LookupBackward over [0, U), added in the same order: the
// same bits. For a table that one thread sums; a table split over threads
// takes the plan.
//
// `unique_ids` gets the U unique ids; `rows` (room for nnz * t.dim floats)
// the U summed rows, as floats. `slot_of`: as PlanBackward's dense_scratch
// (a zeroed scratch of at least t.rows entries, left zeroed), or nullptr to
// hash the ids. Returns -1, or the first position whose id is outside
// [0, t.rows) (then the outputs are incomplete).
template <typename T, typename K>
int64_t SumGradientRows(const TableView<T, K>& t, const T* grads, int32_t* slot_of,
                        std::vector<K>* unique_ids, float* rows) {
  if (t.row_splits[t.batch] >= INT32_MAX) slot_of = nullptr;  // slots are int32
  return WithRowWidth(t.dim, [&](auto dim) {
    return SumGradientRowsOf(t, dim, grads, slot_of, unique_ids, rows);
  });
}

}  // namespace core
}  // namespace sok_graph

#endif  // SOK_GRAPH_TF_OPS_LOOKUP_CORE_LOOKUP_H_
