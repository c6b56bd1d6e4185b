// SokSparseApply on the CPU (the functor of sparse_apply_op.h): every
// table's rows updated in place, the rows spread over the intra-op threads.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "compat/tf_compat.h"
#include "tf_ops/optimizer/core/sparse_apply.h"
#include "tf_ops/optimizer/kernels/apply_rows.h"
#include "tf_ops/optimizer/kernels/sparse_apply_op.h"
#include "tf_ops/optimizer/kernels/sparse_apply_vars.h"
#include "tf_ops/util/core/huge_page_allocator.h"
#include "tf_ops/util/core/prefetch.h"

namespace sok_graph {
namespace optimizer_kernels {
namespace {

using ::tensorflow::OpInputList;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
namespace errors = ::tensorflow::errors;


}  // namespace

template <typename K>
struct SparseApplyFunctor<CpuDevice, K> {
  Status Acquire(OpKernelContext* ctx, const SparseApplyAttrs& attrs,
                 SparseApplyVariables* vars) const {
    // A table and its slots are read and written at random rows, as long as
    // training lasts: on their first update they are given huge pages
    // (fewer TLB misses for the update and for the lookups that read the
    // table; about a fifth off the CPU lookup of rows not in cache).
    return vars->Acquire(
        ctx, attrs,
        [](void* dst, const void* src, size_t bytes) {
          std::memcpy(dst, src, bytes);
          return OkStatus();
        },
        core::AdviseHugePages);
  }

  Status operator()(OpKernelContext* ctx, const SparseApplyAttrs& attrs,
                    SparseApplyVariables& vars, const OpInputList& indices,
                    const OpInputList& grads, const Tensor& hyper_t, const Tensor& step_t) const {
    const int n = attrs.num_tables;
    // Every index is checked before any row changes: a bad one leaves every
    // variable as it was.
    std::vector<int64_t> offsets(n + 1, 0);
    for (int t = 0; t < n; ++t) {
      const K* idx = indices[t].flat<K>().data();
      const int64_t rows = vars.table(t)->dim_size(0);
      for (int64_t i = 0; i < indices[t].NumElements(); ++i) {
        if (idx[i] < 0 || static_cast<int64_t>(idx[i]) >= rows) {
          return errors::InvalidArgument("indices[", t, "] must be in [0, ", rows,
                                         ") (the rows of vars[", t, "]); got ",
                                         static_cast<int64_t>(idx[i]), " at position ", i);
        }
      }
      offsets[t + 1] = offsets[t] + indices[t].NumElements();
    }
    const float* hyper = hyper_t.flat<float>().data();
    const int64_t step = static_cast<int64_t>(step_t.scalar<TfInt64>()());
    const float alpha = core::StepAlpha(attrs.config.algorithm, hyper, step);
    struct Table {
      float* var; float* s0; float* s1; float* s2; const K* idx; const float* g; int64_t dim;
    };
    constexpr int64_t kAhead = 8;
    const auto Prefetch = [](const Table& tb, int64_t i) {
      const int64_t base = static_cast<int64_t>(tb.idx[i]) * tb.dim;
      for (float* p : {tb.var, tb.s0, tb.s1, tb.s2}) {
        if (p == nullptr) continue;
        core::PrefetchSpan(p + base, tb.dim * static_cast<int64_t>(sizeof(float)));
      }
    };
    std::vector<Table> tables(n);
    int64_t max_dim = 1;
    for (int t = 0; t < n; ++t) {
      tables[t] = {vars.table(t)->flat<float>().data(), vars.slot(attrs, t, 0),
                   vars.slot(attrs, t, 1), vars.slot(attrs, t, 2), indices[t].flat<K>().data(),
                   grads[t].flat<float>().data(), vars.table(t)->dim_size(1)};
      max_dim = std::max(max_dim, tables[t].dim);
    }
    const core::SparseApplyConfig config = attrs.config;
    const ApplyRowFn apply_row = ApplyRowFor(config.algorithm);
    if (apply_row == nullptr) {
      return errors::Internal("no CPU update for algorithm ", config.algorithm);
    }
    ParallelFor(ctx, offsets[n], 20 * max_dim, [&](int64_t begin, int64_t end) {
      int t = static_cast<int>(std::upper_bound(offsets.begin(), offsets.end(), begin) -
                               offsets.begin()) - 1;
      for (int64_t r = begin; r < end; ++r) {
        while (r >= offsets[t + 1]) ++t;
        const Table& tb = tables[t];
        const int64_t i = r - offsets[t];
        // The rows are scattered over large tables: fetch a later row's
        // table and slot lines while this one is computed.
        if (r + kAhead < offsets[t + 1]) Prefetch(tb, i + kAhead);
        const int64_t base = static_cast<int64_t>(tb.idx[i]) * tb.dim;
        apply_row(config, hyper, alpha, tb.g + i * tb.dim, tb.var + base,
                  tb.s0 ? tb.s0 + base : nullptr, tb.s1 ? tb.s1 + base : nullptr,
                  tb.s2 ? tb.s2 + base : nullptr, tb.dim);
      }
    });
    return OkStatus();
  }
};

#define SOK_REGISTER_SPARSE_APPLY_CPU(K)                                              \
  REGISTER_KERNEL_BUILDER(Name("SokSparseApply")                                      \
                              .Device(::tensorflow::DEVICE_CPU)                       \
                              .TypeConstraint<float>("T")                             \
                              .TypeConstraint<K>("Tindices"),                         \
                          SparseApplyOp<CpuDevice, K>);
SOK_REGISTER_SPARSE_APPLY_CPU(TfInt64)
SOK_REGISTER_SPARSE_APPLY_CPU(int32_t)
#undef SOK_REGISTER_SPARSE_APPLY_CPU

}  // namespace optimizer_kernels
}  // namespace sok_graph
