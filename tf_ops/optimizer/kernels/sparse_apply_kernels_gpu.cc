// GPU OpKernel of SokSparseApply (float tables): the variables are looked up,
// locked and checked here, the rows updated by one CUDA launch on the op's
// stream (sparse_apply.cu). Nothing is read back: the hyperparameters and
// step stay in device memory, and indices are the caller's checked ones (an
// index outside the table is skipped, never written through). Compiled only
// when the build found a CUDA toolkit (SOK_GRAPH_WITH_CUDA).
#if defined(SOK_GRAPH_WITH_CUDA) && SOK_GRAPH_WITH_CUDA

#include <cstdint>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tf_ops/common/cuda_status.h"
#include "tf_ops/common/gpu_stream.h"
#include "compat/tf_compat.h"
#include "tf_ops/optimizer/core/sparse_apply.h"
#include "tf_ops/optimizer/kernels/sparse_apply_launcher.h"
#include "tf_ops/optimizer/kernels/sparse_apply_vars.h"
#include "tf_ops/util/kernels/gpu_memory_launcher.h"

namespace sok_graph {
namespace {

using ::tensorflow::OpInputList;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace errors = ::tensorflow::errors;

template <typename K>
class SparseApplyGpuOp : public ::tensorflow::OpKernel {
 public:
  explicit SparseApplyGpuOp(::tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Parse(ctx));
  }

  void Compute(OpKernelContext* ctx) override {
    const int n = attrs_.num_tables;
    void* stream = GpuStreamOf(ctx);
    OpInputList indices, grads;
    OP_REQUIRES_OK(ctx, ctx->input_list("indices", &indices));
    OP_REQUIRES_OK(ctx, ctx->input_list("grads", &grads));
    const Tensor& hyper = ctx->input(3 * n + attrs_.num_slot_vars);
    const Tensor& step = ctx->input(3 * n + attrs_.num_slot_vars + 1);
    OP_REQUIRES(ctx, hyper.NumElements() == core::kNumHyper,
                errors::InvalidArgument("hyper must have ", static_cast<int>(core::kNumHyper),
                                        " entries; got ", hyper.NumElements()));
    OP_REQUIRES(ctx, step.NumElements() == 1,
                errors::InvalidArgument("step must be a scalar; got shape ",
                                        step.shape().DebugString()));
    SparseApplyVariables vars;
    OP_REQUIRES_OK(ctx, vars.Acquire(ctx, attrs_, [stream](void* dst, const void* src,
                                                           size_t bytes) {
      return CudaStatus(sok_gpu_copy_on_device(dst, src, bytes, stream),
                        "copying a shared variable before its update");
    }));
    std::vector<SokSparseApplyTable> tables(n);
    std::vector<int64_t> offsets(n + 1, 0);
    for (int t = 0; t < n; ++t) {
      Tensor& table = *vars.table(t);
      OP_REQUIRES_OK(ctx, CheckSparseGradient(t, table, indices[t], grads[t]));
      OP_REQUIRES(ctx, table.dim_size(1) <= INT32_MAX,
                  errors::InvalidArgument("vars[", t, "] has dim ", table.dim_size(1),
                                          "; the GPU kernel takes at most ", INT32_MAX));
      SokSparseApplyTable& d = tables[t];
      d.var = table.flat<float>().data();
      d.slot0 = vars.slot(attrs_, t, 0);
      d.slot1 = vars.slot(attrs_, t, 1);
      d.slot2 = vars.slot(attrs_, t, 2);
      d.indices = indices[t].flat<K>().data();
      d.grads = grads[t].flat<float>().data();
      d.rows = table.dim_size(0);
      d.count = indices[t].NumElements();
      d.dim = static_cast<int32_t>(table.dim_size(1));
      d.index_bytes = static_cast<int32_t>(sizeof(K));
      offsets[t + 1] = offsets[t] + d.count;
    }
    if (offsets[n] == 0) return;
    Tensor descs, offsets_dev;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_INT8,
                                           TensorShape({static_cast<int64_t>(
                                               sizeof(SokSparseApplyTable) * n)}),
                                           &descs));
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({n + 1}),
                                           &offsets_dev));
    void* descs_ptr = const_cast<char*>(descs.tensor_data().data());
    void* offsets_ptr = const_cast<char*>(offsets_dev.tensor_data().data());
    OP_REQUIRES_OK(ctx, CudaStatus(sok_gpu_copy_to_device(descs_ptr, tables.data(),
                                                          sizeof(SokSparseApplyTable) * n, stream),
                                   "copying table descriptors"));
    OP_REQUIRES_OK(ctx, CudaStatus(sok_gpu_copy_to_device(offsets_ptr, offsets.data(),
                                                          sizeof(int64_t) * (n + 1), stream),
                                   "copying row offsets"));
    OP_REQUIRES_OK(ctx, CudaStatus(sok_sparse_apply_f32(
                                       static_cast<const SokSparseApplyTable*>(descs_ptr),
                                       static_cast<const int64_t*>(offsets_ptr), n, offsets[n],
                                       attrs_.config.algorithm, attrs_.config.tf1,
                                       attrs_.config.nesterov, hyper.flat<float>().data(),
                                       reinterpret_cast<const int64_t*>(
                                           step.tensor_data().data()),
                                       stream),
                                   "sok_sparse_apply_f32"));
  }

 private:
  SparseApplyAttrs attrs_;
};

#define SOK_REGISTER_SPARSE_APPLY_GPU(K)                                 \
  REGISTER_KERNEL_BUILDER(Name("SokSparseApply")                         \
                              .Device(::tensorflow::DEVICE_GPU)          \
                              .TypeConstraint<float>("T")                \
                              .TypeConstraint<K>("Tindices"),            \
                          SparseApplyGpuOp<K>);
SOK_REGISTER_SPARSE_APPLY_GPU(TfInt64)
SOK_REGISTER_SPARSE_APPLY_GPU(int32_t)
#undef SOK_REGISTER_SPARSE_APPLY_GPU

}  // namespace
}  // namespace sok_graph

#endif  // SOK_GRAPH_WITH_CUDA
