// The one OpKernel of each util op (SokUnique, SokUniqueWithCounts,
// SokUniquePadded, SokUnsortedSegmentSum) for every device: it checks the
// inputs once and hands them to the device's functor — the CPU's in
// util_kernels.cc (tf_ops/util/core), the GPU's in util_kernels_gpu.cc (the
// launchers of util_kernels.cu). Each device file registers the kernels
// with its functor.
#ifndef SOK_GRAPH_TF_OPS_UTIL_KERNELS_UTIL_OP_H_
#define SOK_GRAPH_TF_OPS_UTIL_KERNELS_UTIL_OP_H_

#include <climits>
#include <cstdint>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "compat/tf_compat.h"
#include "tf_ops/common/gpu_stream.h"
#include "tf_ops/util/kernels/segment_sum_args.h"

namespace sok_graph {
namespace util_kernels {

struct CpuDevice {};
struct GpuDevice {};

// The devices' work, each a member of its op (a functor may keep state
// across calls, as the GPU's unique keeps its hash set's size):
//   UniqueFunctor: Status operator()(ctx, x, with_counts, groups, padded)
//     writes y (0), idx (1) and, with_counts, counts (2); padded
//     (SokUniquePadded): y of x's length (-1 past the distinct values), idx
//     (1), count (2, a scalar) and group_sizes (3, `groups` of them), with
//     no wait for the device.
//   SegmentSumFunctor: Status operator()(ctx, data, ids, num_segments,
//     width, check_ids, out) fills the allocated output, failing on an id
//     >= num_segments (a GPU functor with check_ids false drops it
//     instead, reading nothing back).
template <typename Device, typename K, typename I>
struct UniqueFunctor;
template <typename Device, typename T, typename I>
struct SegmentSumFunctor;

// SokUniqueWithCounts (kCounts), SokUnique and SokUniquePadded (kPadded,
// with a `groups` attribute). On the GPU all but
// the padded one wait to learn the number of distinct values.
template <typename Device, typename K, typename I, bool kCounts, bool kPadded = false>
class UniqueOp : public DeviceWaitingKernel<> {
 public:
  // The padded unique waits for nothing on a GPU: inline on the
  // executor's thread there. (A CPU kernel computes: expensive, as
  // TensorFlow takes every CPU kernel to be.)
  explicit UniqueOp(::tensorflow::OpKernelConstruction* ctx)
      : DeviceWaitingKernel(ctx,
                            !kPadded || ctx->device_type() != ::tensorflow::DEVICE_GPU) {
    if (ctx->HasAttr("groups")) {
      TfInt64 groups = 0;
      OP_REQUIRES_OK(ctx, ctx->GetAttr("groups", &groups));
      groups_ = groups;
    }
  }

  void Compute(::tensorflow::OpKernelContext* ctx) override {
    namespace errors = ::tensorflow::errors;
    const ::tensorflow::Tensor& x = ctx->input(0);
    OP_REQUIRES(ctx, x.dims() == 1,
                errors::InvalidArgument("x must be a vector; got shape ", x.shape().DebugString()));
    const int64_t n = x.NumElements();
    OP_REQUIRES(ctx, sizeof(I) == 8 || n <= INT32_MAX,
                errors::InvalidArgument("x has ", n, " elements, too many for out_idx=int32; ",
                                        "use out_idx=int64"));
    OP_REQUIRES_OK(ctx, functor_(ctx, x, kCounts, groups_, kPadded));
  }

 private:
  UniqueFunctor<Device, K, I> functor_;
  int64_t groups_ = 0;
};

template <typename Device, typename T, typename I, typename N>
class UnsortedSegmentSumOp : public DeviceWaitingKernel<> {
 public:
  explicit UnsortedSegmentSumOp(::tensorflow::OpKernelConstruction* ctx)
      : DeviceWaitingKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("check_ids", &check_ids_));
  }

  void Compute(::tensorflow::OpKernelContext* ctx) override {
    int64_t num_segments = 0, width = 1;
    ::tensorflow::TensorShape out_shape;
    OP_REQUIRES_OK(ctx, SegmentSumArgs<N>(ctx, &num_segments, &width, &out_shape));
    ::tensorflow::Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, out_shape, &out));
    OP_REQUIRES_OK(ctx, (SegmentSumFunctor<Device, T, I>()(ctx, ctx->input(0), ctx->input(1),
                                                            num_segments, width, check_ids_,
                                                            out)));
  }

 private:
  bool check_ids_ = true;
};

}  // namespace util_kernels
}  // namespace sok_graph

// Registers the three unique ops on DEVICE_TYPE (DEVICE_CPU or DEVICE_GPU,
// with its functor tag TAG) for values K and indices I.
#define SOK_REGISTER_UNIQUE_OPS(DEVICE_TYPE, TAG, K, I)                                \
  REGISTER_KERNEL_BUILDER(Name("SokUniqueWithCounts")                                  \
                              .Device(::tensorflow::DEVICE_TYPE)                       \
                              .TypeConstraint<K>("T")                                  \
                              .TypeConstraint<I>("out_idx"),                           \
                          ::sok_graph::util_kernels::UniqueOp<TAG, K, I, true>);       \
  REGISTER_KERNEL_BUILDER(Name("SokUnique")                                            \
                              .Device(::tensorflow::DEVICE_TYPE)                       \
                              .TypeConstraint<K>("T")                                  \
                              .TypeConstraint<I>("out_idx"),                           \
                          ::sok_graph::util_kernels::UniqueOp<TAG, K, I, false>);      \
  REGISTER_KERNEL_BUILDER(Name("SokUniquePadded")                                      \
                              .Device(::tensorflow::DEVICE_TYPE)                       \
                              .TypeConstraint<K>("T")                                  \
                              .TypeConstraint<I>("out_idx"),                           \
                          ::sok_graph::util_kernels::UniqueOp<TAG, K, I, false, true>);

#endif  // SOK_GRAPH_TF_OPS_UTIL_KERNELS_UTIL_OP_H_
