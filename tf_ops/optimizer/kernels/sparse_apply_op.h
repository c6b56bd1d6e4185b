// The one OpKernel of SokSparseApply for every device: it reads the index
// and gradient lists, checks hyper and step, locks and checks every
// variable (sparse_apply_vars.h) and hands the tables to the device's
// functor — the CPU's in sparse_apply_kernels.cc (the rows spread over the
// op's threads), the GPU's in sparse_apply_kernels_gpu.cc (one launch of
// sparse_apply.cu). Each device file registers the kernel with its functor.
#ifndef SOK_GRAPH_TF_OPS_OPTIMIZER_KERNELS_SPARSE_APPLY_OP_H_
#define SOK_GRAPH_TF_OPS_OPTIMIZER_KERNELS_SPARSE_APPLY_OP_H_

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "compat/tf_compat.h"
#include "tf_ops/optimizer/core/sparse_apply.h"
#include "tf_ops/optimizer/kernels/sparse_apply_vars.h"

namespace sok_graph {
namespace optimizer_kernels {

struct CpuDevice {};
struct GpuDevice {};

// The device's work:
//   Status Acquire(ctx, attrs, vars): vars.Acquire with the device's copy
//     (and, on the CPU, its advice for a table's first update);
//   Status operator()(ctx, attrs, vars, indices, grads, hyper, step): every
//     table's rows updated in place, after the gradients' shapes were
//     checked (an index outside its table is an error on the CPU, read on
//     the host; the GPU, which reads nothing back, skips it).
template <typename Device, typename K>
struct SparseApplyFunctor;

template <typename Device, typename K>
class SparseApplyOp : public ::tensorflow::OpKernel {
 public:
  explicit SparseApplyOp(::tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Parse(ctx));
  }

  void Compute(::tensorflow::OpKernelContext* ctx) override {
    namespace errors = ::tensorflow::errors;
    const int n = attrs_.num_tables;
    ::tensorflow::OpInputList indices, grads;
    OP_REQUIRES_OK(ctx, ctx->input_list("indices", &indices));
    OP_REQUIRES_OK(ctx, ctx->input_list("grads", &grads));
    const ::tensorflow::Tensor& hyper = ctx->input(3 * n + attrs_.num_slot_vars);
    const ::tensorflow::Tensor& step = ctx->input(3 * n + attrs_.num_slot_vars + 1);
    OP_REQUIRES(ctx, hyper.NumElements() == core::kNumHyper,
                errors::InvalidArgument("hyper must have ", static_cast<int>(core::kNumHyper),
                                        " entries; got ", hyper.NumElements()));
    OP_REQUIRES(ctx, ::tensorflow::TensorShapeUtils::IsScalar(step.shape()),
                errors::InvalidArgument("step must be a scalar; got shape ",
                                        step.shape().DebugString()));
    SparseApplyFunctor<Device, K> functor;
    SparseApplyVariables vars;
    OP_REQUIRES_OK(ctx, functor.Acquire(ctx, attrs_, &vars));
    // Everything is checked before any row changes: a bad gradient leaves
    // every variable as it was.
    for (int t = 0; t < n; ++t) {
      OP_REQUIRES_OK(ctx, CheckSparseGradient(t, *vars.table(t), indices[t], grads[t]));
    }
    OP_REQUIRES_OK(ctx, functor(ctx, attrs_, vars, indices, grads, hyper, step));
  }

 private:
  SparseApplyAttrs attrs_;
};

}  // namespace optimizer_kernels
}  // namespace sok_graph

#endif  // SOK_GRAPH_TF_OPS_OPTIMIZER_KERNELS_SPARSE_APPLY_OP_H_
