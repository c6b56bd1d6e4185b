// The check both fused updates (SokSparseApply, SokDynamicSparseApply) make
// when their kernel is built: the graph's `slot_names` and `hyper_names`
// attributes, the lists the graph's builder took from the registered op,
// must be this library's (tf_ops/optimizer/core/sparse_apply.h). A graph
// saved against a library whose lists differ fails here, loudly, instead of
// updating the wrong slot or reading the wrong hyperparameter.
#ifndef SOK_GRAPH_TF_OPS_OPTIMIZER_KERNELS_SPARSE_APPLY_SPEC_H_
#define SOK_GRAPH_TF_OPS_OPTIMIZER_KERNELS_SPARSE_APPLY_SPEC_H_

#include <string>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/lib/core/errors.h"
#include "compat/tf_compat.h"
#include "tf_ops/optimizer/core/sparse_apply.h"

namespace sok_graph {

inline ::tensorflow::Status CheckSparseApplySpec(::tensorflow::OpKernelConstruction* ctx) {
  std::vector<std::string> slot_names, hyper_names;
  TF_RETURN_IF_ERROR(ctx->GetAttr("slot_names", &slot_names));
  TF_RETURN_IF_ERROR(ctx->GetAttr("hyper_names", &hyper_names));
  const std::string mismatch = core::SpecMismatch(slot_names, hyper_names);
  if (!mismatch.empty()) {
    return ::tensorflow::errors::InvalidArgument(
        mismatch, ": the graph was built against another build of sok_graph; build it again");
  }
  return OkStatus();
}

// The formulas (core::SparseFormulas) the attributes `tf1` and
// `keras_optimizer_v2` select; both set is an error.
inline ::tensorflow::Status ParseSparseFormulas(::tensorflow::OpKernelConstruction* ctx,
                                                int32_t* formulas) {
  bool tf1 = false, keras_optimizer_v2 = false;
  TF_RETURN_IF_ERROR(ctx->GetAttr("tf1", &tf1));
  TF_RETURN_IF_ERROR(ctx->GetAttr("keras_optimizer_v2", &keras_optimizer_v2));
  if (tf1 && keras_optimizer_v2) {
    return ::tensorflow::errors::InvalidArgument(
        "tf1 and keras_optimizer_v2 select different formulas; set at most one");
  }
  *formulas = tf1 ? core::kTf1Formulas
                  : (keras_optimizer_v2 ? core::kKerasV2Formulas : core::kKerasFormulas);
  return OkStatus();
}

}  // namespace sok_graph

#endif  // SOK_GRAPH_TF_OPS_OPTIMIZER_KERNELS_SPARSE_APPLY_SPEC_H_
