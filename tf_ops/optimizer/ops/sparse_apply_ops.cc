// SokSparseApply: one optimizer step on the rows a sparse gradient touches,
// for N tables (resource variables) and their slots in one op.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "compat/tf_compat.h"
#include "tf_ops/optimizer/core/sparse_apply.h"

namespace sok_graph {
namespace {

using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

::tensorflow::Status SparseApplyShape(InferenceContext* c) {
  int n = 0;
  TF_RETURN_IF_ERROR(c->GetAttr("num_tables", &n));
  int slots = 0;
  TF_RETURN_IF_ERROR(c->GetAttr("num_slot_vars", &slots));
  for (int t = 0; t < n; ++t) {
    ShapeHandle indices, grads, unused;
    TF_RETURN_IF_ERROR(c->WithRank(c->input(n + slots + t), 1, &indices));
    TF_RETURN_IF_ERROR(c->WithRank(c->input(2 * n + slots + t), 2, &grads));
    ::tensorflow::shape_inference::DimensionHandle count;
    TF_RETURN_IF_ERROR(c->Merge(c->Dim(indices, 0), c->Dim(grads, 0), &count));
  }
  ShapeHandle hyper, step;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(3 * n + slots), 1, &hyper));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(3 * n + slots + 1), 0, &step));
  return OkStatus();
}

}  // namespace

REGISTER_OP("SokSparseApply")
    .Input("vars: num_tables * resource")
    .Input("slots: num_slot_vars * resource")
    .Input("indices: num_tables * Tindices")
    .Input("grads: num_tables * T")
    .Input("hyper: T")
    .Input("step: int64")
    .Attr("num_tables: int >= 1")
    .Attr("num_slot_vars: int >= 0")
    .Attr(::sok_graph::core::AlgorithmAttr())
    .Attr(::sok_graph::core::SlotNamesAttr())
    .Attr(::sok_graph::core::HyperNamesAttr())
    .Attr("tf1: bool = false")
    .Attr("keras_optimizer_v2: bool = false")
    .Attr("nesterov: bool = false")
    .Attr("T: {float}")
    .Attr("Tindices: {int32, int64}")
    .SetIsStateful()
    .SetShapeFn(SparseApplyShape)
    .Doc(R"doc(
Updates rows indices[t] of vars[t] (and of its slots) from grads[t] with one
step of `algorithm`, for every table t in one op. slots holds each table's
slots in turn (num_slot_vars = num_tables x the algorithm's slot count:
momentum 1, adagrad 1 (accumulator), adam 2 (m, v), ftrl 2 (accumulator,
linear)). Indices of one table must be distinct and in [0, rows). hyper:
[lr, momentum, epsilon, beta_1, beta_2, lr_power, l1, l2, l2_shrinkage, beta];
step: Adam's 1-based step. tf1 selects tf.compat.v1.train's formulas,
keras_optimizer_v2 those of Keras 2's OptimizerV2 (epsilon added after
Adagrad's and momentum-free RMSprop's root), neither Keras' own
(sok_graph/optimization/algorithms.py has them as TensorFlow ops).
)doc");

}  // namespace sok_graph
