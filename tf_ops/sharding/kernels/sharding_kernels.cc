// CPU kernels of SokBucketizeByOwner and SokLocalRows.
#include <atomic>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "compat/tf_compat.h"
#include "tf_ops/sharding/core/bucketize.h"
#include "tf_ops/sharding/kernels/sharding_args.h"

namespace sok_graph {
namespace {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace errors = ::tensorflow::errors;

template <typename K>
::tensorflow::Status CheckNonNegative(const Tensor& ids) {
  return ::sok_graph::CheckNonNegative(ids.flat<K>().data(), ids.NumElements());
}

constexpr int kMaxWorldSize = 1 << 20;

template <typename K>
class BucketizeByOwnerOp : public OpKernel {
 public:
  explicit BucketizeByOwnerOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("world_size", &world_size_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("fixed_owner", &fixed_owner_));
    OP_REQUIRES(ctx, fixed_owner_ < world_size_,
                errors::InvalidArgument("fixed_owner must be < world_size (", world_size_,
                                        "); got ", fixed_owner_));
    // bucket_sizes and the scratch of the counting sort hold world_size
    // entries each: an absurd world_size would allocate gigabytes.
    OP_REQUIRES(ctx, world_size_ <= kMaxWorldSize,
                errors::InvalidArgument("world_size must be <= ", kMaxWorldSize, "; got ",
                                        world_size_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& ids = ctx->input(0);
    OP_REQUIRES(ctx, ids.dims() == 1,
                errors::InvalidArgument("ids must be a vector; got shape ",
                                        ids.shape().DebugString()));
    OP_REQUIRES_OK(ctx, CheckNonNegative<K>(ids));
    const int64_t n = ids.NumElements();
    Tensor *bucketed = nullptr, *sizes = nullptr, *perm = nullptr, *inverse = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, ids.shape(), &bucketed));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({world_size_}), &sizes));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, ids.shape(), &perm));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, ids.shape(), &inverse));
    core::BucketizeByOwner(ids.flat<K>().data(), n, world_size_, fixed_owner_,
                           bucketed->flat<K>().data(), AsInt64(sizes), AsInt64(perm),
                           AsInt64(inverse));
  }

 private:
  static int64_t* AsInt64(Tensor* t) {
    return reinterpret_cast<int64_t*>(t->flat<TfInt64>().data());
  }
  int world_size_ = 1;
  int fixed_owner_ = -1;
};

template <typename K>
class LocalRowsOp : public OpKernel {
 public:
  explicit LocalRowsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("world_size", &world_size_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& ids = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckNonNegative<K>(ids));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, ids.shape(), &out));
    const K* in = ids.flat<K>().data();
    K* dst = out->flat<K>().data();
    ParallelFor(ctx, ids.NumElements(), 4, [&](int64_t begin, int64_t end) {
      core::LocalRows(in, begin, end, world_size_, dst);
    });
  }

 private:
  int world_size_ = 1;
};

#define SOK_REGISTER_SHARDING(K)                                                          \
  REGISTER_KERNEL_BUILDER(                                                                \
      Name("SokBucketizeByOwner").Device(::tensorflow::DEVICE_CPU).TypeConstraint<K>("T"), \
      BucketizeByOwnerOp<K>);                                                             \
  REGISTER_KERNEL_BUILDER(                                                                \
      Name("SokLocalRows").Device(::tensorflow::DEVICE_CPU).TypeConstraint<K>("T"),        \
      LocalRowsOp<K>);
SOK_REGISTER_SHARDING(int32_t)
SOK_REGISTER_SHARDING(TfInt64)
#undef SOK_REGISTER_SHARDING

}  // namespace
}  // namespace sok_graph
