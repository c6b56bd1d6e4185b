// CPU kernels of SokUnique, SokUniqueWithCounts and SokUnsortedSegmentSum.
#include <algorithm>
#include <limits>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"
#include "compat/tf_compat.h"
#include "tf_ops/util/kernels/segment_sum_args.h"
#include "tf_ops/util/core/segment_sum.h"
#include "tf_ops/util/core/unique.h"

namespace sok_graph {
namespace {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace errors = ::tensorflow::errors;

// SokUniqueWithCounts (kCounts) and SokUnique.
template <typename K, typename I, bool kCounts>
class UniqueOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    OP_REQUIRES(ctx, x.dims() == 1,
                errors::InvalidArgument("x must be a vector; got shape ", x.shape().DebugString()));
    const int64_t n = x.NumElements();
    OP_REQUIRES(ctx, sizeof(I) == 8 || n <= INT32_MAX,
                errors::InvalidArgument("x has ", n, " elements, too many for out_idx=int32; ",
                                        "use out_idx=int64"));
    Tensor* idx = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, x.shape(), &idx));
    std::vector<K> unique;
    std::vector<I> counts;
    core::UniqueWithInverse<K, I>(x.flat<K>().data(), n, &unique, idx->flat<I>().data(),
                                  kCounts ? &counts : nullptr);
    const int64_t u = static_cast<int64_t>(unique.size());
    Tensor* y = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({u}), &y));
    std::copy(unique.begin(), unique.end(), y->flat<K>().data());
    if (kCounts) {
      Tensor* count = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({u}), &count));
      std::copy(counts.begin(), counts.end(), count->flat<I>().data());
    }
  }
};

// SokUniqueGrouped: SokUnique, and the distinct values per group (v mod groups).
template <typename K, typename I>
class UniqueGroupedOp : public UniqueOp<K, I, false> {
 public:
  explicit UniqueGroupedOp(OpKernelConstruction* ctx) : UniqueOp<K, I, false>(ctx) {
    TfInt64 groups = 1;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("groups", &groups));
    groups_ = groups;
  }

  void Compute(OpKernelContext* ctx) override {
    UniqueOp<K, I, false>::Compute(ctx);
    if (!ctx->status().ok()) return;
    Tensor* sizes = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({groups_}), &sizes));
    auto out = sizes->flat<TfInt64>();
    for (int64_t g = 0; g < groups_; ++g) out(g) = 0;
    const auto y = ctx->mutable_output(0)->flat<K>();
    for (int64_t i = 0; i < y.size(); ++i) {
      const int64_t v = static_cast<int64_t>(y(i));
      int64_t g = v % groups_;
      if (g < 0) g += groups_;
      ++out(g);
    }
  }

 private:
  int64_t groups_ = 1;
};

template <typename T>
struct Accumulator {
  using type = float;
};
template <>
struct Accumulator<double> {
  using type = double;
};

template <typename T, typename I, typename N>
class UnsortedSegmentSumOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& data = ctx->input(0);
    const Tensor& ids = ctx->input(1);
    int64_t num_segments = 0, width = 1;
    TensorShape out_shape;
    OP_REQUIRES_OK(ctx, SegmentSumArgs<N>(ctx, &num_segments, &width, &out_shape));
    const int64_t n = ids.NumElements();
    const I* seg = ids.flat<I>().data();
    for (int64_t i = 0; i < n; ++i) {
      OP_REQUIRES(ctx, static_cast<int64_t>(seg[i]) < num_segments,
                  errors::InvalidArgument("segment_ids must be < num_segments (", num_segments,
                                          "); got ", static_cast<int64_t>(seg[i]),
                                          " at position ", i));
    }
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, out_shape, &out));
    // Segments nobody maps to still get their zero row from SumSegments.
    if (num_segments == 0 || width == 0) return;
    core::SegmentGroups groups;
    core::GroupBySegment(seg, n, num_segments, &groups);
    using Acc = typename Accumulator<T>::type;
    const T* src = data.flat<T>().data();
    T* dst = out->flat<T>().data();
    const int64_t per_segment = (n + num_segments - 1) / num_segments + 1;
    ParallelFor(ctx, num_segments, per_segment * (width + 4) * 2, [&](int64_t s0, int64_t s1) {
      std::vector<Acc> scratch(static_cast<size_t>(width));
      core::SumSegments<T, Acc>(src, width, groups, s0, s1, dst, scratch.data());
    });
  }
};

#define SOK_REGISTER_UNIQUE(K, I)                                 \
  REGISTER_KERNEL_BUILDER(Name("SokUniqueWithCounts")             \
                              .Device(::tensorflow::DEVICE_CPU)   \
                              .TypeConstraint<K>("T")             \
                              .TypeConstraint<I>("out_idx"),      \
                          UniqueOp<K, I, true>);              \
  REGISTER_KERNEL_BUILDER(Name("SokUnique")                       \
                              .Device(::tensorflow::DEVICE_CPU)   \
                              .TypeConstraint<K>("T")             \
                              .TypeConstraint<I>("out_idx"),      \
                          UniqueOp<K, I, false>);              \
  REGISTER_KERNEL_BUILDER(Name("SokUniqueGrouped")                \
                              .Device(::tensorflow::DEVICE_CPU)   \
                              .TypeConstraint<K>("T")             \
                              .TypeConstraint<I>("out_idx"),      \
                          UniqueGroupedOp<K, I>);
SOK_REGISTER_UNIQUE(int32_t, int32_t)
SOK_REGISTER_UNIQUE(int32_t, TfInt64)
SOK_REGISTER_UNIQUE(TfInt64, int32_t)
SOK_REGISTER_UNIQUE(TfInt64, TfInt64)
#undef SOK_REGISTER_UNIQUE

#define SOK_REGISTER_SEGMENT_SUM(T, I, N)                         \
  REGISTER_KERNEL_BUILDER(Name("SokUnsortedSegmentSum")           \
                              .Device(::tensorflow::DEVICE_CPU)   \
                              .TypeConstraint<T>("T")             \
                              .TypeConstraint<I>("Tindices")      \
                              .TypeConstraint<N>("Tnumsegments")  \
                              .HostMemory("num_segments"),        \
                          UnsortedSegmentSumOp<T, I, N>);
#define SOK_REGISTER_SEGMENT_SUM_ALL(T)                                  \
  SOK_REGISTER_SEGMENT_SUM(T, int32_t, int32_t) \
  SOK_REGISTER_SEGMENT_SUM(T, int32_t, TfInt64)             \
  SOK_REGISTER_SEGMENT_SUM(T, TfInt64, int32_t)             \
  SOK_REGISTER_SEGMENT_SUM(T, TfInt64, TfInt64)
SOK_REGISTER_SEGMENT_SUM_ALL(float)
SOK_REGISTER_SEGMENT_SUM_ALL(double)
SOK_REGISTER_SEGMENT_SUM_ALL(Eigen::half)
SOK_REGISTER_SEGMENT_SUM_ALL(::tensorflow::bfloat16)
#undef SOK_REGISTER_SEGMENT_SUM_ALL
#undef SOK_REGISTER_SEGMENT_SUM

}  // namespace
}  // namespace sok_graph
