// CPU OpKernel of SokSparseApply: every table's rows updated in place, the
// rows spread over the intra-op threads.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "compat/tf_compat.h"
#include "tf_ops/optimizer/core/sparse_apply.h"
#include "tf_ops/optimizer/kernels/apply_rows.h"
#include "tf_ops/optimizer/kernels/sparse_apply_vars.h"
#include "tf_ops/util/core/huge_page_allocator.h"
#include "tf_ops/util/core/prefetch.h"

namespace sok_graph {
namespace {

using ::tensorflow::OpInputList;
using ::tensorflow::OpKernelContext;
namespace errors = ::tensorflow::errors;

using optimizer_kernels::ApplyRowFn;
using optimizer_kernels::ApplyRowFor;

template <typename K>
class SparseApplyCpuOp : public ::tensorflow::OpKernel {
 public:
  explicit SparseApplyCpuOp(::tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Parse(ctx));
  }

  void Compute(OpKernelContext* ctx) override {
    const int n = attrs_.num_tables;
    OpInputList indices, grads;
    OP_REQUIRES_OK(ctx, ctx->input_list("indices", &indices));
    OP_REQUIRES_OK(ctx, ctx->input_list("grads", &grads));
    const ::tensorflow::Tensor& hyper_t = ctx->input(3 * n + attrs_.num_slot_vars);
    const ::tensorflow::Tensor& step_t = ctx->input(3 * n + attrs_.num_slot_vars + 1);
    OP_REQUIRES(ctx, hyper_t.NumElements() == core::kNumHyper,
                errors::InvalidArgument("hyper must have ", static_cast<int>(core::kNumHyper),
                                        " entries; got ", hyper_t.NumElements()));
    SparseApplyVariables vars;
    // A table and its slots are read and written at random rows, as long as
    // training lasts: on their first update they are given huge pages
    // (fewer TLB misses for the update and for the lookups that read the
    // table; about a fifth off the CPU lookup of rows not in cache).
    OP_REQUIRES_OK(ctx, vars.Acquire(
                            ctx, attrs_,
                            [](void* dst, const void* src, size_t bytes) {
                              std::memcpy(dst, src, bytes);
                              return OkStatus();
                            },
                            core::AdviseHugePages));
    // Everything is checked before any row changes: a bad index leaves
    // every variable as it was.
    std::vector<int64_t> offsets(n + 1, 0);
    for (int t = 0; t < n; ++t) {
      const ::tensorflow::Tensor& table = *vars.table(t);
      OP_REQUIRES_OK(ctx, CheckSparseGradient(t, table, indices[t], grads[t]));
      const K* idx = indices[t].flat<K>().data();
      const int64_t rows = table.dim_size(0);
      for (int64_t i = 0; i < indices[t].NumElements(); ++i) {
        OP_REQUIRES(ctx, idx[i] >= 0 && static_cast<int64_t>(idx[i]) < rows,
                    errors::InvalidArgument("indices[", t, "] must be in [0, ", rows,
                                            ") (the rows of vars[", t, "]); got ",
                                            static_cast<int64_t>(idx[i]), " at position ", i));
      }
      offsets[t + 1] = offsets[t] + indices[t].NumElements();
    }
    const float* hyper = hyper_t.flat<float>().data();
    const int64_t step = static_cast<int64_t>(step_t.scalar<TfInt64>()());
    const float alpha = core::StepAlpha(attrs_.config.algorithm, hyper, step);
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
      tables[t] = {vars.table(t)->flat<float>().data(), vars.slot(attrs_, t, 0),
                   vars.slot(attrs_, t, 1), vars.slot(attrs_, t, 2), indices[t].flat<K>().data(),
                   grads[t].flat<float>().data(), vars.table(t)->dim_size(1)};
      max_dim = std::max(max_dim, tables[t].dim);
    }
    const core::SparseApplyConfig config = attrs_.config;
    const ApplyRowFn apply_row = ApplyRowFor(config.algorithm);
    OP_REQUIRES(ctx, apply_row != nullptr,
                errors::Internal("no CPU update for algorithm ", config.algorithm));
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
  }

 private:
  SparseApplyAttrs attrs_;
};

#define SOK_REGISTER_SPARSE_APPLY_CPU(K)                                              \
  REGISTER_KERNEL_BUILDER(Name("SokSparseApply")                                      \
                              .Device(::tensorflow::DEVICE_CPU)                       \
                              .TypeConstraint<float>("T")                             \
                              .TypeConstraint<K>("Tindices"),                         \
                          SparseApplyCpuOp<K>);
SOK_REGISTER_SPARSE_APPLY_CPU(TfInt64)
SOK_REGISTER_SPARSE_APPLY_CPU(int32_t)
#undef SOK_REGISTER_SPARSE_APPLY_CPU

}  // namespace
}  // namespace sok_graph
