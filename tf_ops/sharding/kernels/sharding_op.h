// The one OpKernel of SokBucketizeByOwner and of SokLocalRows for every
// device: attributes and input shapes checked once here, the work in the
// device's functor — the CPU's in sharding_kernels.cc
// (tf_ops/sharding/core), the GPU's in sharding_kernels_gpu.cc (the
// launchers of bucketize.cu and local_rows.cu). Each device file registers
// the kernels with its functor.
#ifndef SOK_GRAPH_TF_OPS_SHARDING_KERNELS_SHARDING_OP_H_
#define SOK_GRAPH_TF_OPS_SHARDING_KERNELS_SHARDING_OP_H_

#include <cstdint>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "compat/tf_compat.h"
#include "tf_ops/common/gpu_stream.h"
#include "tf_ops/sharding/kernels/sharding_args.h"

namespace sok_graph {
namespace sharding_kernels {

struct CpuDevice {};
struct GpuDevice {};

// SokBucketizeByOwner's outputs, allocated by the op.
struct Buckets {
  ::tensorflow::Tensor* bucketed = nullptr;  // ids in owner order
  int64_t* sizes = nullptr;                  // [world_size]
  int64_t* perm = nullptr;                   // bucketed[i] = ids[perm[i]]
  int64_t* inverse = nullptr;                // ids[i] = bucketed[inverse[i]]
};

// The devices' work:
//   BucketizeFunctor: Status operator()(ctx, ids, world_size, fixed_owner,
//     check_negative, buckets); a negative id is an error (NegativeIdError)
//     unless the caller vouches for the ids (check_negative false: the GPU
//     then skips its read-back; the CPU checks anyway, at no cost).
//   LocalRowsFunctor: Status operator()(ctx, ids, world_size, out).
template <typename Device, typename K>
struct BucketizeFunctor;
template <typename Device, typename K>
struct LocalRowsFunctor;

constexpr int kMaxWorldSize = 1 << 20;

template <typename Device, typename K>
class BucketizeByOwnerOp : public DeviceWaitingKernel<> {
 public:
  explicit BucketizeByOwnerOp(::tensorflow::OpKernelConstruction* ctx)
      : DeviceWaitingKernel(ctx) {
    namespace errors = ::tensorflow::errors;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("world_size", &world_size_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("fixed_owner", &fixed_owner_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("check_negative", &check_negative_));
    OP_REQUIRES(ctx, fixed_owner_ < world_size_,
                errors::InvalidArgument("fixed_owner must be < world_size (", world_size_,
                                        "); got ", fixed_owner_));
    // bucket_sizes and the scratch of the counting sort hold world_size
    // entries each: an absurd world_size would allocate gigabytes.
    OP_REQUIRES(ctx, world_size_ <= kMaxWorldSize,
                errors::InvalidArgument("world_size must be <= ", kMaxWorldSize, "; got ",
                                        world_size_));
  }

  void Compute(::tensorflow::OpKernelContext* ctx) override {
    const ::tensorflow::Tensor& ids = ctx->input(0);
    OP_REQUIRES(ctx, ids.dims() == 1,
                ::tensorflow::errors::InvalidArgument("ids must be a vector; got shape ",
                                                      ids.shape().DebugString()));
    Buckets out;
    ::tensorflow::Tensor *sizes = nullptr, *perm = nullptr, *inverse = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, ids.shape(), &out.bucketed));
    OP_REQUIRES_OK(ctx,
                   ctx->allocate_output(1, ::tensorflow::TensorShape({world_size_}), &sizes));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, ids.shape(), &perm));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, ids.shape(), &inverse));
    out.sizes = AsInt64(sizes);
    out.perm = AsInt64(perm);
    out.inverse = AsInt64(inverse);
    OP_REQUIRES_OK(ctx, (BucketizeFunctor<Device, K>()(ctx, ids, world_size_, fixed_owner_,
                                                       check_negative_, out)));
  }

 private:
  static int64_t* AsInt64(::tensorflow::Tensor* t) {
    return reinterpret_cast<int64_t*>(t->flat<TfInt64>().data());
  }
  int world_size_ = 1;
  int fixed_owner_ = -1;
  bool check_negative_ = true;
};

template <typename Device, typename K>
class LocalRowsOp : public DeviceWaitingKernel<> {
 public:
  explicit LocalRowsOp(::tensorflow::OpKernelConstruction* ctx) : DeviceWaitingKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("world_size", &world_size_));
  }

  void Compute(::tensorflow::OpKernelContext* ctx) override {
    const ::tensorflow::Tensor& ids = ctx->input(0);
    ::tensorflow::Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, ids.shape(), &out));
    OP_REQUIRES_OK(ctx, (LocalRowsFunctor<Device, K>()(ctx, ids, world_size_, out)));
  }

 private:
  int world_size_ = 1;
};

}  // namespace sharding_kernels
}  // namespace sok_graph

#endif  // SOK_GRAPH_TF_OPS_SHARDING_KERNELS_SHARDING_OP_H_
