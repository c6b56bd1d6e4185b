// Per-sample combination of embedding rows (sum / mean / sqrtn, optional
// per-id weights, optional max_norm clipping) and its gradient, with the
// semantics of tf.nn.embedding_lookup_sparse. TF-independent; C++14.
#ifndef SOK_GRAPH_TF_OPS_LOOKUP_CORE_COMBINER_H_
#define SOK_GRAPH_TF_OPS_LOOKUP_CORE_COMBINER_H_

#include <cmath>
#include <cstdint>
#include <string>

namespace sok_graph {
namespace core {

enum class Combiner { kSum = 0, kMean = 1, kSqrtn = 2 };

// The one list of combiner names, indexed by Combiner. The lookup ops'
// `combiners` attribute allows exactly these (CombinersAttr), and
// sok_graph's Python side reads them back from the registered op
// (sok_graph/ops/lookup.py combiner_names): adding a combiner is a name
// here, its case in CombinerScale, and its tests.
constexpr const char* kCombinerNames[] = {"sum", "mean", "sqrtn"};
constexpr int kNumCombiners = static_cast<int>(sizeof(kCombinerNames) / sizeof(kCombinerNames[0]));

inline bool ParseCombiner(const std::string& name, Combiner* out) {
  for (int c = 0; c < kNumCombiners; ++c) {
    if (name == kCombinerNames[c]) {
      *out = static_cast<Combiner>(c);
      return true;
    }
  }
  return false;
}

// "'sum', 'mean', 'sqrtn'": the names for messages and the op attribute.
inline std::string QuotedCombinerNames() {
  std::string out;
  for (int c = 0; c < kNumCombiners; ++c) {
    out += std::string(c == 0 ? "'" : ", '") + kCombinerNames[c] + "'";
  }
  return out;
}

// The lookup ops' attribute: a list of the names above.
inline std::string CombinersAttr() { return "combiners: list({" + QuotedCombinerNames() + "})"; }

// Compiled for the host and, in the CUDA launchers (which include this
// header), for the device too: one formula for the CPU and GPU kernels.
#if defined(__CUDACC__)
#define SOK_HOST_DEVICE __host__ __device__
#else
#define SOK_HOST_DEVICE
#endif

// The factor that turns a sample's weighted sum of rows into its output:
// 1, 1 / sum(w), or 1 / sqrt(sum(w^2)). A sample with no ids (or weights that
// sum to zero) gets 0, so its output is a zero row rather than NaN; a NaN
// weight gives NaN, as in TensorFlow (a test `> 0` made sqrtn's factor 0,
// and the gradient of the sample's other rows 0 instead of NaN). The GPU
// launchers pass the combiner as its int (kSum 0, kMean 1, kSqrtn 2).
SOK_HOST_DEVICE inline float CombinerScale(Combiner c, float weight_sum, float weight_sq_sum) {
  switch (c) {
    case Combiner::kSum:
      return 1.0f;
    case Combiner::kMean:
      return weight_sum != 0.0f ? 1.0f / weight_sum : 0.0f;
    case Combiner::kSqrtn:
      return weight_sq_sum != 0.0f ? 1.0f / sqrtf(weight_sq_sum) : 0.0f;
  }
  return 0.0f;
}

// tf.clip_by_norm's factor for one row: max_norm / max(||row||, max_norm).
// max_norm <= 0 means no clipping. A row holding a NaN has a NaN norm, and
// TensorFlow's maximum keeps it: the factor is NaN, as the whole clipped row
// is there (asked as "norm <= max_norm", which a NaN fails; "norm >
// max_norm" left such a row unclipped, its other values and its gradient
// finite).
template <typename T>
float MaxNormScale(const T* row, int64_t dim, float max_norm) {
  if (max_norm <= 0.0f) return 1.0f;
  float sq = 0.0f;
  for (int64_t d = 0; d < dim; ++d) {
    const float v = static_cast<float>(row[d]);
    sq += v * v;
  }
  const float norm = std::sqrt(sq);
  return norm <= max_norm ? 1.0f : max_norm / norm;
}

// Gradient through the clip, in place: for y = x * m / ||x|| (when ||x|| > m)
// dL/dx = (m / ||x||) * (g - x * (x . g) / ||x||^2); identity otherwise.
template <typename T>
void MaxNormBackward(const T* row, int64_t dim, float max_norm, float* grad) {
  if (max_norm <= 0.0f) return;
  float sq = 0.0f, dot = 0.0f;
  for (int64_t d = 0; d < dim; ++d) {
    const float v = static_cast<float>(row[d]);
    sq += v * v;
    dot += v * grad[d];
  }
  const float norm = std::sqrt(sq);
  if (norm <= max_norm) return;  // a NaN norm goes on: a NaN gradient, as TF's
  const float scale = max_norm / norm;
  const float proj = dot / sq;
  for (int64_t d = 0; d < dim; ++d) {
    grad[d] = scale * (grad[d] - static_cast<float>(row[d]) * proj);
  }
}

// What is wrong with a row_splits vector, if anything.
struct SplitsProblem {
  enum Kind { kNone, kFirstNotZero, kDecreasing, kLastNotNnz };
  Kind kind = kNone;
  int64_t position = -1;  // index into row_splits
};

// row_splits must start at 0, never decrease, and end at nnz.
template <typename S>
SplitsProblem CheckRowSplits(const S* splits, int64_t num_splits, int64_t nnz) {
  SplitsProblem p;
  if (num_splits == 0) return p;  // shape checks reject this before
  if (splits[0] != 0) {
    p.kind = SplitsProblem::kFirstNotZero;
    p.position = 0;
    return p;
  }
  for (int64_t i = 1; i < num_splits; ++i) {
    if (splits[i] < splits[i - 1]) {
      p.kind = SplitsProblem::kDecreasing;
      p.position = i;
      return p;
    }
  }
  if (static_cast<int64_t>(splits[num_splits - 1]) != nnz) {
    p.kind = SplitsProblem::kLastNotNnz;
    p.position = num_splits - 1;
  }
  return p;
}

}  // namespace core
}  // namespace sok_graph

#endif  // SOK_GRAPH_TF_OPS_LOOKUP_CORE_COMBINER_H_
