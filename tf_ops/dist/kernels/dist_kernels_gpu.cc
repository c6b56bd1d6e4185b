// GPU OpKernel of SokLocalRows: takes the op's CUDA stream and calls the C
// launcher in local_rows.cu. Compiled only when the build found a CUDA
// toolkit (SOK_GRAPH_WITH_CUDA); registering it costs nothing on machines
// without a GPU, where TensorFlow simply never places the op there.
#if defined(SOK_GRAPH_WITH_CUDA) && SOK_GRAPH_WITH_CUDA

#include "tensorflow/core/framework/op_kernel.h"
#include "tf_ops/common/gpu_stream.h"
#include "tf_ops/common/tf_compat.h"
#include "tf_ops/dist/kernels/local_rows_launcher.h"

namespace sok_graph {
namespace {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace errors = ::tensorflow::errors;

int LaunchLocalRows(const int32_t* ids, int64_t n, int64_t world, int32_t* out, int64_t* neg,
                    void* stream) {
  return sok_local_rows_int32(ids, n, world, out, neg, stream);
}
int LaunchLocalRows(const int64_t* ids, int64_t n, int64_t world, int64_t* out, int64_t* neg,
                    void* stream) {
  return sok_local_rows_int64(ids, n, world, out, neg, stream);
}

template <typename K>
class LocalRowsGpuOp : public OpKernel {
 public:
  explicit LocalRowsGpuOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("world_size", &world_size_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& ids = ctx->input(0);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, ids.shape(), &out));
    // Negative ids give -1 rows here: checking them would need a host
    // synchronisation, and the bucketing op before this one rejects them.
    using C = typename std::conditional<sizeof(K) == 8, int64_t, int32_t>::type;
    const int rc = LaunchLocalRows(reinterpret_cast<const C*>(ids.flat<K>().data()),
                                   ids.NumElements(), world_size_,
                                   reinterpret_cast<C*>(out->flat<K>().data()), nullptr,
                                   GpuStreamOf(ctx));
    OP_REQUIRES(ctx, rc == 0, errors::Internal("SokLocalRows CUDA launch failed (cudaError ",
                                               rc, ")"));
  }

 private:
  int world_size_ = 1;
};

REGISTER_KERNEL_BUILDER(
    Name("SokLocalRows").Device(::tensorflow::DEVICE_GPU).TypeConstraint<int32_t>("T"),
    LocalRowsGpuOp<int32_t>);
REGISTER_KERNEL_BUILDER(
    Name("SokLocalRows").Device(::tensorflow::DEVICE_GPU).TypeConstraint<TfInt64>("T"),
    LocalRowsGpuOp<TfInt64>);

}  // namespace
}  // namespace sok_graph

#endif  // SOK_GRAPH_WITH_CUDA
