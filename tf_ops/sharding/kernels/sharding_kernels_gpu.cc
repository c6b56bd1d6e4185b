// GPU OpKernel of SokLocalRows: takes the op's CUDA stream and calls the C
// launcher in local_rows.cu. Compiled only when the build found a CUDA
// toolkit (SOK_GRAPH_WITH_CUDA); registering it costs nothing on machines
// without a GPU, where TensorFlow simply never places the op there.
#if defined(SOK_GRAPH_WITH_CUDA) && SOK_GRAPH_WITH_CUDA

#include <type_traits>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tf_ops/common/cuda_status.h"
#include "tf_ops/common/gpu_scratch.h"
#include "tf_ops/common/gpu_stream.h"
#include "compat/tf_compat.h"
#include "tf_ops/sharding/kernels/bucketize_launcher.h"
#include "tf_ops/sharding/kernels/local_rows_launcher.h"
#include "tf_ops/sharding/kernels/sharding_args.h"
#include "tf_ops/util/kernels/gpu_memory_launcher.h"

namespace sok_graph {
namespace {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace errors = ::tensorflow::errors;

int LaunchLocalRows(const int64_t* ids, int64_t n, int64_t world, int64_t* out, int64_t* neg,
                    void* stream) {
  return sok_local_rows_int64(ids, n, world, out, neg, stream);
}

template <typename K>
class LocalRowsGpuOp : public DeviceWaitingKernel<> {
 public:
  explicit LocalRowsGpuOp(OpKernelConstruction* ctx) : DeviceWaitingKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("world_size", &world_size_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& ids = ctx->input(0);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, ids.shape(), &out));
    // Negative ids are counted on the device and read back (one wait for
    // the stream): an error as on the CPU, not a silent -1 row.
    void* stream = GpuStreamOf(ctx);
    Tensor negative_dev;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({1}),
                                           &negative_dev));
    int64_t* negative = reinterpret_cast<int64_t*>(negative_dev.flat<TfInt64>().data());
    OP_REQUIRES_OK(ctx, CudaStatus(sok_gpu_fill_i64(negative, 0, 1, stream),
                                   "SokLocalRows: clearing a counter"));
    using C = typename std::conditional<sizeof(K) == 8, int64_t, int32_t>::type;
    const C* in = reinterpret_cast<const C*>(ids.flat<K>().data());
    const int64_t n = ids.NumElements();
    const int rc = LaunchLocalRows(in, n, world_size_, reinterpret_cast<C*>(out->flat<K>().data()),
                                   negative, stream);
    OP_REQUIRES_OK(ctx, CudaStatus(rc, "SokLocalRows"));
    int64_t negatives = 0;
    OP_REQUIRES_OK(ctx, CudaStatus(sok_gpu_copy_to_host(&negatives, negative, sizeof(negatives),
                                                        stream),
                                   "SokLocalRows: reading the id check back"));
    if (negatives > 0) {  // the error path: the ids come to the host to name the first
      std::vector<C> host(static_cast<size_t>(n));
      OP_REQUIRES_OK(ctx, CudaStatus(sok_gpu_copy_to_host(host.data(), in, sizeof(C) * n, stream),
                                     "SokLocalRows: reading the ids back"));
      OP_REQUIRES_OK(ctx, ::sok_graph::CheckNonNegative(host.data(), n));
    }
  }

 private:
  int world_size_ = 1;
};

// int64 only (sok_graph's sharded lookups use int64 ids); int32 ids run on
// the CPU kernel.
REGISTER_KERNEL_BUILDER(
    Name("SokLocalRows").Device(::tensorflow::DEVICE_GPU).TypeConstraint<TfInt64>("T"),
    LocalRowsGpuOp<TfInt64>);

// SokBucketizeByOwner on the GPU: a stable radix sort by owner
// (bucketize.cu). Negative ids are found on the device; their first
// position is read back and reported as the CPU kernel reports it.
class BucketizeByOwnerGpuOp : public DeviceWaitingKernel<> {
 public:
  explicit BucketizeByOwnerGpuOp(OpKernelConstruction* ctx) : DeviceWaitingKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("world_size", &world_size_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("fixed_owner", &fixed_owner_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("check_negative", &check_negative_));
    OP_REQUIRES(ctx, fixed_owner_ < world_size_,
                errors::InvalidArgument("fixed_owner must be < world_size (", world_size_,
                                        "); got ", fixed_owner_));
    OP_REQUIRES(ctx, world_size_ <= (1 << 20),
                errors::InvalidArgument("world_size must be <= ", 1 << 20, "; got ",
                                        world_size_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& ids = ctx->input(0);
    OP_REQUIRES(ctx, ids.dims() == 1,
                errors::InvalidArgument("ids must be a vector; got shape ",
                                        ids.shape().DebugString()));
    const int64_t n = ids.NumElements();
    OP_REQUIRES(ctx, n < INT32_MAX,
                errors::InvalidArgument("ids has ", n, " entries; the GPU kernel takes fewer ",
                                        "than 2^31"));
    Tensor *bucketed = nullptr, *sizes = nullptr, *perm = nullptr, *inverse = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, ids.shape(), &bucketed));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({world_size_}), &sizes));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, ids.shape(), &perm));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, ids.shape(), &inverse));
    void* stream = GpuStreamOf(ctx);
    Tensor neg_dev, temp;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({1}), &neg_dev));
    int64_t* neg = reinterpret_cast<int64_t*>(neg_dev.flat<TfInt64>().data());
    OP_REQUIRES_OK(ctx, CudaStatus(sok_gpu_fill_i64(neg, INT64_MAX, 1, stream),
                                   "SokBucketizeByOwner: clearing a flag"));
    const int64_t* in = reinterpret_cast<const int64_t*>(ids.flat<TfInt64>().data());
    int64_t* out = reinterpret_cast<int64_t*>(bucketed->flat<TfInt64>().data());
    int64_t* sz = reinterpret_cast<int64_t*>(sizes->flat<TfInt64>().data());
    int64_t* p = reinterpret_cast<int64_t*>(perm->flat<TfInt64>().data());
    int64_t* inv = reinterpret_cast<int64_t*>(inverse->flat<TfInt64>().data());
    OP_REQUIRES_OK(ctx, LaunchWithScratch(ctx, "SokBucketizeByOwner", &temp,
                                          [&](void* scratch, size_t* bytes) {
                                            return sok_bucketize_by_owner_i64(
                                                in, n, world_size_, fixed_owner_, out, sz, p, inv,
                                                neg, scratch, bytes, stream);
                                          }));
    if (!check_negative_) return;  // ids >= 0 by the caller's construction
    int64_t first = INT64_MAX;
    int rc = sok_gpu_copy_to_host(&first, neg, sizeof(first), stream);
    OP_REQUIRES_OK(ctx, CudaStatus(rc, "SokBucketizeByOwner: read-back"));
    if (first != INT64_MAX) {
      int64_t id = 0;
      rc = sok_gpu_copy_to_host(&id, in + first, sizeof(id), stream);
      OP_REQUIRES_OK(ctx, CudaStatus(rc, "SokBucketizeByOwner: read-back"));
      ctx->CtxFailure(NegativeIdError(id, first));
    }
  }

 private:
  int world_size_ = 1;
  int fixed_owner_ = -1;
  bool check_negative_ = true;
};

// int64 ids only, as for SokLocalRows above.
REGISTER_KERNEL_BUILDER(
    Name("SokBucketizeByOwner").Device(::tensorflow::DEVICE_GPU).TypeConstraint<TfInt64>("T"),
    BucketizeByOwnerGpuOp);

}  // namespace
}  // namespace sok_graph

#endif  // SOK_GRAPH_WITH_CUDA
