// The CPU update of whole rows, shared by the fused sparse optimizer ops of
// static tables (SokSparseApply) and of dynamic tables
// (SokDynamicSparseApply): one row of `dim` elements with the algorithm
// fixed at compile time.
#ifndef SOK_GRAPH_TF_OPS_OPTIMIZER_KERNELS_APPLY_ROWS_H_
#define SOK_GRAPH_TF_OPS_OPTIMIZER_KERNELS_APPLY_ROWS_H_

#include <cstdint>

#include "tf_ops/optimizer/core/sparse_apply.h"

namespace sok_graph {
namespace optimizer_kernels {

// The switch in ApplyElement folds away and, the pointers being restrict,
// the element loop vectorizes (Adam's square roots and divisions four or
// eight at a time instead of one). Not inlined, so the restrict qualifiers
// hold.
template <core::SparseAlgorithm A>
__attribute__((noinline)) void ApplyRow(core::SparseApplyConfig c, const float* __restrict__ h,
                                        float alpha, const float* __restrict__ g,
                                        float* __restrict__ w, float* __restrict__ s0,
                                        float* __restrict__ s1, float* __restrict__ s2,
                                        int64_t dim) {
  c.algorithm = static_cast<int32_t>(A);
  const int slots = core::SlotCount(A);
  for (int64_t d = 0; d < dim; ++d) {
    core::ApplyElement(c, h, alpha, g[d], w + d, slots > 0 ? s0 + d : nullptr,
                       slots > 1 ? s1 + d : nullptr, slots > 2 ? s2 + d : nullptr);
  }
}

using ApplyRowFn = void (*)(core::SparseApplyConfig, const float*, float, const float*, float*,
                            float*, float*, float*, int64_t);

// The row update of `algorithm` (a core::SparseAlgorithm), or nullptr.
inline ApplyRowFn ApplyRowFor(int32_t algorithm) {
  switch (static_cast<core::SparseAlgorithm>(algorithm)) {
    case core::SparseAlgorithm::kSgd: return ApplyRow<core::SparseAlgorithm::kSgd>;
    case core::SparseAlgorithm::kMomentum: return ApplyRow<core::SparseAlgorithm::kMomentum>;
    case core::SparseAlgorithm::kAdagrad: return ApplyRow<core::SparseAlgorithm::kAdagrad>;
    case core::SparseAlgorithm::kAdam: return ApplyRow<core::SparseAlgorithm::kAdam>;
    case core::SparseAlgorithm::kFtrl: return ApplyRow<core::SparseAlgorithm::kFtrl>;
    case core::SparseAlgorithm::kRmsprop: return ApplyRow<core::SparseAlgorithm::kRmsprop>;
    case core::SparseAlgorithm::kRmspropMomentum:
      return ApplyRow<core::SparseAlgorithm::kRmspropMomentum>;
    case core::SparseAlgorithm::kRmspropCentered:
      return ApplyRow<core::SparseAlgorithm::kRmspropCentered>;
    case core::SparseAlgorithm::kRmspropMomentumCentered:
      return ApplyRow<core::SparseAlgorithm::kRmspropMomentumCentered>;
    case core::SparseAlgorithm::kAdadelta: return ApplyRow<core::SparseAlgorithm::kAdadelta>;
    case core::SparseAlgorithm::kAdamax: return ApplyRow<core::SparseAlgorithm::kAdamax>;
  }
  return nullptr;
}

}  // namespace optimizer_kernels
}  // namespace sok_graph

#endif  // SOK_GRAPH_TF_OPS_OPTIMIZER_KERNELS_APPLY_ROWS_H_
