// The util ops on the CPU: the functors of SokUnique, SokUniqueWithCounts,
// SokUniquePadded and SokUnsortedSegmentSum (util_op.h)
// over tf_ops/util/core.
#include <algorithm>
#include <limits>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"
#include "compat/tf_compat.h"
#include "tf_ops/util/kernels/util_op.h"
#include "tf_ops/util/core/segment_sum.h"
#include "tf_ops/util/core/unique.h"

namespace sok_graph {
namespace util_kernels {
namespace {

using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace errors = ::tensorflow::errors;

template <typename T>
struct Accumulator {
  using type = float;
};
template <>
struct Accumulator<double> {
  using type = double;
};

}  // namespace

template <typename K, typename I>
struct UniqueFunctor<CpuDevice, K, I> {
  Status operator()(OpKernelContext* ctx, const Tensor& x, bool with_counts, int64_t groups,
                    bool padded) const {
    const int64_t n = x.NumElements();
    Tensor* idx = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(1, x.shape(), &idx));
    std::vector<K> unique;
    std::vector<I> counts;
    core::UniqueWithInverse<K, I>(x.flat<K>().data(), n, &unique, idx->flat<I>().data(),
                                  with_counts ? &counts : nullptr);
    const int64_t u = static_cast<int64_t>(unique.size());
    Tensor* y = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(0, padded ? x.shape() : TensorShape({u}), &y));
    std::copy(unique.begin(), unique.end(), y->flat<K>().data());
    if (padded) {
      std::fill(y->flat<K>().data() + u, y->flat<K>().data() + n, K(-1));
      Tensor* count = nullptr;
      TF_RETURN_IF_ERROR(ctx->allocate_output(2, TensorShape({}), &count));
      count->scalar<TfInt64>()() = u;
    }
    if (with_counts) {
      Tensor* count = nullptr;
      TF_RETURN_IF_ERROR(ctx->allocate_output(2, TensorShape({u}), &count));
      std::copy(counts.begin(), counts.end(), count->flat<I>().data());
    }
    if (padded) {
      // The distinct values per group (v mod groups); none when groups = 0.
      Tensor* sizes = nullptr;
      TF_RETURN_IF_ERROR(ctx->allocate_output(3, TensorShape({groups}), &sizes));
      auto out = sizes->flat<TfInt64>();
      for (int64_t g = 0; g < groups; ++g) out(g) = 0;
      for (size_t k = 0; groups > 0 && k < unique.size(); ++k) {
        int64_t g = static_cast<int64_t>(unique[k]) % groups;
        if (g < 0) g += groups;
        ++out(g);
      }
    }
    return OkStatus();
  }
};

template <typename T, typename I>
struct SegmentSumFunctor<CpuDevice, T, I> {
  // check_ids is not needed here: the check costs no wait on the CPU, and
  // GroupBySegment relies on it.
  Status operator()(OpKernelContext* ctx, const Tensor& data, const Tensor& ids,
                    int64_t num_segments, int64_t width, bool /*check_ids*/,
                    Tensor* out) const {
    const int64_t n = ids.NumElements();
    const I* seg = ids.flat<I>().data();
    for (int64_t i = 0; i < n; ++i) {
      if (static_cast<int64_t>(seg[i]) >= num_segments) {
        return errors::InvalidArgument("segment_ids must be < num_segments (", num_segments,
                                       "); got ", static_cast<int64_t>(seg[i]), " at position ",
                                       i);
      }
    }
    // Segments nobody maps to still get their zero row from SumSegments.
    if (num_segments == 0 || width == 0) return OkStatus();
    core::SegmentGroups groups;
    core::GroupBySegment(seg, n, num_segments, &groups);
    using Acc = typename Accumulator<T>::type;
    const T* src = data.flat<T>().data();
    T* dst = out->flat<T>().data();
    const int64_t per_segment = (n + num_segments - 1) / num_segments + 1;
    ParallelFor(ctx, num_segments, per_segment * (width + 4) * 2, [&](int64_t s0, int64_t s1) {
      std::vector<Acc> scratch(static_cast<size_t>(2 * width));
      core::SumSegments<T, Acc>(src, width, groups, s0, s1, dst, scratch.data());
    });
    return OkStatus();
  }
};

namespace {

SOK_REGISTER_UNIQUE_OPS(DEVICE_CPU, CpuDevice, int32_t, int32_t)
SOK_REGISTER_UNIQUE_OPS(DEVICE_CPU, CpuDevice, int32_t, TfInt64)
SOK_REGISTER_UNIQUE_OPS(DEVICE_CPU, CpuDevice, TfInt64, int32_t)
SOK_REGISTER_UNIQUE_OPS(DEVICE_CPU, CpuDevice, TfInt64, TfInt64)

#define SOK_REGISTER_SEGMENT_SUM(T, I, N)                         \
  REGISTER_KERNEL_BUILDER(Name("SokUnsortedSegmentSum")           \
                              .Device(::tensorflow::DEVICE_CPU)   \
                              .TypeConstraint<T>("T")             \
                              .TypeConstraint<I>("Tindices")      \
                              .TypeConstraint<N>("Tnumsegments")  \
                              .HostMemory("num_segments"),        \
                          UnsortedSegmentSumOp<CpuDevice, T, I, N>);
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
}  // namespace util_kernels
}  // namespace sok_graph
