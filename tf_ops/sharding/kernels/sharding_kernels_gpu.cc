// The sharding ops on the GPU: the functors of SokBucketizeByOwner,
// SokLocalRows, SokRouteGroupedKeys and the grouped gather (sharding_op.h) —
// the C launchers of bucketize.cu, local_rows.cu, route_keys.cu and
// grouped_gather.cu on the op's stream.
// Negative ids are found on the device and read back (one wait): an error
// as on the CPU, never a silent -1 row or a wrong owner. The routing of keys,
// the grouped gather and its gradient wait for nothing: their output sizes
// are known on the host. Compiled only when the build found a CUDA toolkit
// (SOK_GRAPH_WITH_CUDA); registering the kernels costs nothing on machines
// without a GPU, where TensorFlow simply never places the ops there.
#if defined(SOK_GRAPH_WITH_CUDA) && SOK_GRAPH_WITH_CUDA

#include <climits>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tf_ops/common/cuda_status.h"
#include "tf_ops/common/gpu_scratch.h"
#include "tf_ops/common/gpu_stream.h"
#include "compat/tf_compat.h"
#include "tf_ops/sharding/kernels/bucketize_launcher.h"
#include "tf_ops/sharding/kernels/grouped_gather_launcher.h"
#include "tf_ops/sharding/kernels/local_rows_launcher.h"
#include "tf_ops/sharding/kernels/route_keys_launcher.h"
#include "tf_ops/sharding/kernels/sharding_args.h"
#include "tf_ops/sharding/kernels/sharding_op.h"
#include "tf_ops/util/kernels/gpu_memory_launcher.h"

namespace sok_graph {
namespace sharding_kernels {

using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace errors = ::tensorflow::errors;

// A stable radix sort by owner (bucketize.cu), int64 ids.
template <>
struct BucketizeFunctor<GpuDevice, TfInt64> {
  Status operator()(OpKernelContext* ctx, const Tensor& ids, int world_size, int fixed_owner,
                    bool check_negative, const Buckets& out) const {
    const int64_t n = ids.NumElements();
    if (n >= INT32_MAX) {
      return errors::InvalidArgument("ids has ", n, " entries; the GPU kernel takes fewer than ",
                                     "2^31");
    }
    void* stream = GpuStreamOf(ctx);
    Tensor neg_dev, temp;
    TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({1}), &neg_dev));
    int64_t* neg = reinterpret_cast<int64_t*>(neg_dev.flat<TfInt64>().data());
    TF_RETURN_IF_ERROR(CudaStatus(sok_gpu_fill_i64(neg, INT64_MAX, 1, stream),
                                  "SokBucketizeByOwner: clearing a flag"));
    const int64_t* in = reinterpret_cast<const int64_t*>(ids.flat<TfInt64>().data());
    int64_t* bucketed = reinterpret_cast<int64_t*>(out.bucketed->flat<TfInt64>().data());
    TF_RETURN_IF_ERROR(LaunchWithScratch(ctx, "SokBucketizeByOwner", &temp,
                                         [&](void* scratch, size_t* bytes) {
                                           return sok_bucketize_by_owner_i64(
                                               in, n, world_size, fixed_owner, bucketed,
                                               out.sizes, out.perm, out.inverse, neg, scratch,
                                               bytes, stream);
                                         }));
    if (!check_negative) return OkStatus();  // ids >= 0 by the caller's construction
    int64_t first = INT64_MAX;
    TF_RETURN_IF_ERROR(CudaStatus(sok_gpu_copy_to_host(&first, neg, sizeof(first), stream),
                                  "SokBucketizeByOwner: read-back"));
    if (first == INT64_MAX) return OkStatus();
    int64_t id = 0;
    TF_RETURN_IF_ERROR(CudaStatus(sok_gpu_copy_to_host(&id, in + first, sizeof(id), stream),
                                  "SokBucketizeByOwner: read-back"));
    return NegativeIdError(id, first);
  }
};

template <>
struct LocalRowsFunctor<GpuDevice, TfInt64> {
  Status operator()(OpKernelContext* ctx, const Tensor& ids, int world_size, Tensor* out) const {
    void* stream = GpuStreamOf(ctx);
    Tensor negative_dev;
    TF_RETURN_IF_ERROR(
        ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({1}), &negative_dev));
    int64_t* negative = reinterpret_cast<int64_t*>(negative_dev.flat<TfInt64>().data());
    TF_RETURN_IF_ERROR(CudaStatus(sok_gpu_fill_i64(negative, 0, 1, stream),
                                  "SokLocalRows: clearing a counter"));
    const int64_t* in = reinterpret_cast<const int64_t*>(ids.flat<TfInt64>().data());
    const int64_t n = ids.NumElements();
    TF_RETURN_IF_ERROR(CudaStatus(
        sok_local_rows_int64(in, n, world_size,
                             reinterpret_cast<int64_t*>(out->flat<TfInt64>().data()), negative,
                             stream),
        "SokLocalRows"));
    int64_t negatives = 0;
    TF_RETURN_IF_ERROR(CudaStatus(
        sok_gpu_copy_to_host(&negatives, negative, sizeof(negatives), stream),
        "SokLocalRows: reading the id check back"));
    if (negatives == 0) return OkStatus();
    // The error path: the ids come to the host to name the first.
    std::vector<int64_t> host(static_cast<size_t>(n));
    TF_RETURN_IF_ERROR(CudaStatus(sok_gpu_copy_to_host(host.data(), in, sizeof(int64_t) * n,
                                                       stream),
                                  "SokLocalRows: reading the ids back"));
    return CheckNonNegative(host.data(), n);
  }
};

// int64 ids only (sok_graph's sharded lookups use int64 ids); int32 ids
// run on the CPU kernels.
REGISTER_KERNEL_BUILDER(
    Name("SokBucketizeByOwner").Device(::tensorflow::DEVICE_GPU).TypeConstraint<TfInt64>("T"),
    BucketizeByOwnerOp<GpuDevice, TfInt64>);
REGISTER_KERNEL_BUILDER(
    Name("SokLocalRows").Device(::tensorflow::DEVICE_GPU).TypeConstraint<TfInt64>("T"),
    LocalRowsOp<GpuDevice, TfInt64>);

template <>
struct RouteFunctor<GpuDevice> {
  Status operator()(OpKernelContext* ctx, const RouteArgs& a) const {
    if (a.n >= (int64_t{1} << 30)) {
      return errors::InvalidArgument("ids has ", a.n, " entries; the GPU kernel takes fewer "
                                     "than 2^30");
    }
    Tensor temp;
    void* stream = GpuStreamOf(ctx);
    return LaunchWithScratch(ctx, "SokRouteGroupedKeys", &temp,
                             [&](void* scratch, size_t* bytes) {
                               return sok_route_grouped_keys(
                                   a.ids, a.tables, a.n, a.num_tables, a.world_size,
                                   a.fixed_owner, a.sent, a.sizes, a.slots, scratch, bytes,
                                   stream);
                             });
  }
};

REGISTER_KERNEL_BUILDER(Name("SokRouteGroupedKeys").Device(::tensorflow::DEVICE_GPU),
                        RouteGroupedKeysOp<GpuDevice>);

// The widest copy unit (16, 8, 4 or 2 bytes) that divides every address.
int MaxUnitBytes(const std::vector<const void*>& buffers) {
  int unit = 16;
  for (const void* p : buffers) {
    while (unit > 2 && reinterpret_cast<uintptr_t>(p) % unit != 0) unit /= 2;
  }
  return unit;
}

// `words` copied to a new device buffer (`holder` keeps it for the op).
Status ToDevice(OpKernelContext* ctx, const std::vector<int64_t>& words, Tensor* holder,
                const char* what) {
  TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_INT64,
                                        TensorShape({static_cast<int64_t>(words.size())}), holder));
  return CudaStatus(sok_gpu_copy_to_device(const_cast<char*>(holder->tensor_data().data()),
                                           words.data(), sizeof(int64_t) * words.size(),
                                           GpuStreamOf(ctx)),
                    what);
}

template <>
struct GroupedGatherFunctor<GpuDevice> {
  Status operator()(OpKernelContext* ctx, const GroupedTables& tables, const Tensor& keys,
                    Tensor* out) const {
    const int num_tables = static_cast<int>(tables.rows.size());
    std::vector<int64_t> words;
    std::vector<const void*> buffers{out->tensor_data().data()};
    for (int t = 0; t < num_tables; ++t) {
      words.push_back(static_cast<int64_t>(reinterpret_cast<uintptr_t>(tables.rows[t])));
      words.push_back(tables.counts[t]);
      buffers.push_back(tables.rows[t]);
    }
    Tensor descs;
    TF_RETURN_IF_ERROR(ToDevice(ctx, words, &descs, "SokGroupedGather: copying the tables"));
    return CudaStatus(
        sok_grouped_gather(reinterpret_cast<const int64_t*>(descs.tensor_data().data()),
                           num_tables,
                           reinterpret_cast<const int64_t*>(keys.tensor_data().data()),
                           keys.NumElements(), tables.row_bytes, MaxUnitBytes(buffers),
                           const_cast<char*>(out->tensor_data().data()), GpuStreamOf(ctx)),
        "SokGroupedGather");
  }
};

template <>
struct GroupedGatherGradFunctor<GpuDevice> {
  Status operator()(OpKernelContext* ctx, const Tensor& keys, const Tensor& grads,
                    const Tensor& permutation, const GroupedGrads& out) const {
    const int num_tables = static_cast<int>(out.indices.size());
    std::vector<int64_t> words(out.offsets.begin(), out.offsets.end());
    std::vector<const void*> buffers{grads.tensor_data().data()};
    for (int t = 0; t < num_tables; ++t) {
      words.push_back(static_cast<int64_t>(reinterpret_cast<uintptr_t>(out.indices[t])));
    }
    for (int t = 0; t < num_tables; ++t) {
      words.push_back(static_cast<int64_t>(reinterpret_cast<uintptr_t>(out.values[t])));
      buffers.push_back(out.values[t]);
    }
    Tensor descs;
    TF_RETURN_IF_ERROR(ToDevice(ctx, words, &descs, "SokGroupedGatherGrad: copying the outputs"));
    return CudaStatus(
        sok_grouped_gather_grad(reinterpret_cast<const int64_t*>(descs.tensor_data().data()),
                                num_tables,
                                reinterpret_cast<const int64_t*>(keys.tensor_data().data()),
                                reinterpret_cast<const int64_t*>(
                                    permutation.tensor_data().data()),
                                keys.NumElements(), grads.tensor_data().data(), out.row_bytes,
                                MaxUnitBytes(buffers), GpuStreamOf(ctx)),
        "SokGroupedGatherGrad");
  }
};

#define SOK_REGISTER_GROUPED_GATHER(T)                                            \
  REGISTER_KERNEL_BUILDER(Name("SokGroupedGather")                                \
                              .Device(::tensorflow::DEVICE_GPU)                   \
                              .TypeConstraint<T>("T"),                            \
                          GroupedGatherOp<GpuDevice, T>);                         \
  REGISTER_KERNEL_BUILDER(Name("SokGroupedGatherGrad")                            \
                              .Device(::tensorflow::DEVICE_GPU)                   \
                              .TypeConstraint<T>("T")                             \
                              .HostMemory("table_sizes"),                         \
                          GroupedGatherGradOp<GpuDevice, T>);
SOK_REGISTER_GROUPED_GATHER(float)
SOK_REGISTER_GROUPED_GATHER(double)
SOK_REGISTER_GROUPED_GATHER(Eigen::half)
SOK_REGISTER_GROUPED_GATHER(::tensorflow::bfloat16)
#undef SOK_REGISTER_GROUPED_GATHER

}  // namespace sharding_kernels
}  // namespace sok_graph

#endif  // SOK_GRAPH_WITH_CUDA
