// SokSparseApply on the GPU (float tables; the functor of
// sparse_apply_op.h, which looks up, locks and checks the variables): the
// rows updated by one CUDA launch on the op's stream (sparse_apply.cu). Nothing is read back: the hyperparameters and
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
#include "tf_ops/optimizer/kernels/sparse_apply_op.h"
#include "tf_ops/optimizer/kernels/sparse_apply_vars.h"
#include "tf_ops/util/kernels/gpu_memory_launcher.h"

namespace sok_graph {
namespace optimizer_kernels {

using ::tensorflow::OpInputList;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace errors = ::tensorflow::errors;

template <typename K>
struct SparseApplyFunctor<GpuDevice, K> {
  Status Acquire(OpKernelContext* ctx, const SparseApplyAttrs& attrs,
                 SparseApplyVariables* vars) const {
    void* stream = GpuStreamOf(ctx);
    return vars->Acquire(ctx, attrs, [stream](void* dst, const void* src, size_t bytes) {
      return CudaStatus(sok_gpu_copy_on_device(dst, src, bytes, stream),
                        "copying a shared variable before its update");
    });
  }

  Status operator()(OpKernelContext* ctx, const SparseApplyAttrs& attrs,
                    SparseApplyVariables& vars, const OpInputList& indices,
                    const OpInputList& grads, const Tensor& hyper, const Tensor& step) const {
    const int n = attrs.num_tables;
    void* stream = GpuStreamOf(ctx);
    std::vector<SokSparseApplyTable> tables(n);
    std::vector<int64_t> offsets(n + 1, 0);
    for (int t = 0; t < n; ++t) {
      Tensor& table = *vars.table(t);
      if (table.dim_size(1) > INT32_MAX) {
        return errors::InvalidArgument("vars[", t, "] has dim ", table.dim_size(1),
                                       "; the GPU kernel takes at most ", INT32_MAX);
      }
      SokSparseApplyTable& d = tables[t];
      d.var = table.flat<float>().data();
      d.slot0 = vars.slot(attrs, t, 0);
      d.slot1 = vars.slot(attrs, t, 1);
      d.slot2 = vars.slot(attrs, t, 2);
      d.indices = indices[t].flat<K>().data();
      d.grads = grads[t].flat<float>().data();
      d.rows = table.dim_size(0);
      d.count = indices[t].NumElements();
      d.dim = static_cast<int32_t>(table.dim_size(1));
      d.index_bytes = static_cast<int32_t>(sizeof(K));
      offsets[t + 1] = offsets[t] + d.count;
    }
    if (offsets[n] == 0) return OkStatus();
    Tensor descs, offsets_dev;
    TF_RETURN_IF_ERROR(ctx->allocate_temp(
        ::tensorflow::DT_INT8,
        TensorShape({static_cast<int64_t>(sizeof(SokSparseApplyTable) * n)}), &descs));
    TF_RETURN_IF_ERROR(
        ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({n + 1}), &offsets_dev));
    void* descs_ptr = const_cast<char*>(descs.tensor_data().data());
    void* offsets_ptr = const_cast<char*>(offsets_dev.tensor_data().data());
    TF_RETURN_IF_ERROR(CudaStatus(sok_gpu_copy_to_device(descs_ptr, tables.data(),
                                                         sizeof(SokSparseApplyTable) * n, stream),
                                  "copying table descriptors"));
    TF_RETURN_IF_ERROR(CudaStatus(sok_gpu_copy_to_device(offsets_ptr, offsets.data(),
                                                         sizeof(int64_t) * (n + 1), stream),
                                  "copying row offsets"));
    return CudaStatus(
        sok_sparse_apply_f32(static_cast<const SokSparseApplyTable*>(descs_ptr),
                             static_cast<const int64_t*>(offsets_ptr), n, offsets[n],
                             attrs.config.algorithm, attrs.config.formulas, attrs.config.nesterov,
                             hyper.flat<float>().data(),
                             reinterpret_cast<const int64_t*>(step.tensor_data().data()), stream),
        "sok_sparse_apply_f32");
  }
};

#define SOK_REGISTER_SPARSE_APPLY_GPU(K)                                 \
  REGISTER_KERNEL_BUILDER(Name("SokSparseApply")                         \
                              .Device(::tensorflow::DEVICE_GPU)          \
                              .TypeConstraint<float>("T")                \
                              .TypeConstraint<K>("Tindices"),            \
                          SparseApplyOp<GpuDevice, K>);
SOK_REGISTER_SPARSE_APPLY_GPU(TfInt64)
SOK_REGISTER_SPARSE_APPLY_GPU(int32_t)
#undef SOK_REGISTER_SPARSE_APPLY_GPU

}  // namespace optimizer_kernels
}  // namespace sok_graph

#endif  // SOK_GRAPH_WITH_CUDA
