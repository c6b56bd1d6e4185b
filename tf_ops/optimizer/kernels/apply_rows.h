// The CPU update of whole rows, shared by the fused sparse optimizer ops of
// static tables (SokSparseApply) and of dynamic tables
// (SokDynamicSparseApply): one row of `dim` elements with the algorithm
// fixed at compile time.
#ifndef SOK_GRAPH_TF_OPS_OPTIMIZER_KERNELS_APPLY_ROWS_H_
#define SOK_GRAPH_TF_OPS_OPTIMIZER_KERNELS_APPLY_ROWS_H_

#include <cstddef>
#include <cstdint>
#include <utility>

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

// One ApplyRow per algorithm of core::kAlgorithmSpecs, instantiated from
// that list: a new fused algorithm needs no line here.
template <size_t... I>
ApplyRowFn ApplyRowIn(int32_t algorithm, std::index_sequence<I...>) {
  constexpr core::SparseAlgorithm kAlgorithms[] = {core::kAlgorithmSpecs[I].algorithm...};
  constexpr ApplyRowFn kRows[] = {ApplyRow<core::kAlgorithmSpecs[I].algorithm>...};
  for (size_t i = 0; i < sizeof...(I); ++i) {
    if (static_cast<int32_t>(kAlgorithms[i]) == algorithm) return kRows[i];
  }
  return nullptr;
}

// The row update of `algorithm` (a core::SparseAlgorithm), or nullptr.
inline ApplyRowFn ApplyRowFor(int32_t algorithm) {
  constexpr size_t kCount = sizeof(core::kAlgorithmSpecs) / sizeof(core::kAlgorithmSpecs[0]);
  return ApplyRowIn(algorithm, std::make_index_sequence<kCount>());
}

}  // namespace optimizer_kernels
}  // namespace sok_graph

#endif  // SOK_GRAPH_TF_OPS_OPTIMIZER_KERNELS_APPLY_ROWS_H_
