// The sharding ops on the CPU: the functors of SokBucketizeByOwner and
// SokLocalRows (sharding_op.h) over tf_ops/sharding/core.
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "compat/tf_compat.h"
#include "tf_ops/sharding/core/bucketize.h"
#include "tf_ops/sharding/kernels/sharding_args.h"
#include "tf_ops/sharding/kernels/sharding_op.h"

namespace sok_graph {
namespace sharding_kernels {

using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;

template <typename K>
struct BucketizeFunctor<CpuDevice, K> {
  Status operator()(OpKernelContext* ctx, const Tensor& ids, int world_size, int fixed_owner,
                    bool check_negative, const Buckets& out) const {
    TF_RETURN_IF_ERROR(CheckNonNegative(ids.flat<K>().data(), ids.NumElements()));
    core::BucketizeByOwner(ids.flat<K>().data(), ids.NumElements(), world_size, fixed_owner,
                           out.bucketed->flat<K>().data(), out.sizes, out.perm, out.inverse);
    return OkStatus();
  }
};

template <typename K>
struct LocalRowsFunctor<CpuDevice, K> {
  Status operator()(OpKernelContext* ctx, const Tensor& ids, int world_size, Tensor* out) const {
    TF_RETURN_IF_ERROR(CheckNonNegative(ids.flat<K>().data(), ids.NumElements()));
    const K* in = ids.flat<K>().data();
    K* dst = out->flat<K>().data();
    ParallelFor(ctx, ids.NumElements(), 4, [&](int64_t begin, int64_t end) {
      core::LocalRows(in, begin, end, world_size, dst);
    });
    return OkStatus();
  }
};

#define SOK_REGISTER_SHARDING(K)                                                          \
  REGISTER_KERNEL_BUILDER(                                                                \
      Name("SokBucketizeByOwner").Device(::tensorflow::DEVICE_CPU).TypeConstraint<K>("T"), \
      BucketizeByOwnerOp<CpuDevice, K>);                                                  \
  REGISTER_KERNEL_BUILDER(                                                                \
      Name("SokLocalRows").Device(::tensorflow::DEVICE_CPU).TypeConstraint<K>("T"),        \
      LocalRowsOp<CpuDevice, K>);
SOK_REGISTER_SHARDING(int32_t)
SOK_REGISTER_SHARDING(TfInt64)
#undef SOK_REGISTER_SHARDING

}  // namespace sharding_kernels
}  // namespace sok_graph
