// Fused multi-table embedding lookup: one op for N tables.
#include <string>
#include <vector>

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "compat/tf_compat.h"
#include "tf_ops/lookup/core/combiner.h"

namespace sok_graph {
namespace {

using ::tensorflow::Status;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

// Checks the per-table attributes against num_tables; shared by forward and
// backward so both reject the same graphs at construction time. Gives the
// tables' input types (Tparams).
Status CheckTableAttrs(InferenceContext* c, int num_tables,
                       std::vector<::tensorflow::DataType>* param_types) {
  std::vector<std::string> combiners;
  std::vector<bool> weighted;
  std::vector<float> max_norms;
  std::vector<std::string> names;
  TF_RETURN_IF_ERROR(c->GetAttr("combiners", &combiners));
  TF_RETURN_IF_ERROR(c->GetAttr("weighted", &weighted));
  TF_RETURN_IF_ERROR(c->GetAttr("max_norms", &max_norms));
  TF_RETURN_IF_ERROR(c->GetAttr("table_names", &names));
  TF_RETURN_IF_ERROR(c->GetAttr("Tparams", param_types));
  if (static_cast<int>(param_types->size()) != num_tables) {
    return ::tensorflow::errors::InvalidArgument("params must have num_tables=", num_tables,
                                                 " entries; got ", param_types->size());
  }
  if (static_cast<int>(combiners.size()) != num_tables ||
      static_cast<int>(weighted.size()) != num_tables ||
      static_cast<int>(max_norms.size()) != num_tables ||
      (!names.empty() && static_cast<int>(names.size()) != num_tables)) {
    return ::tensorflow::errors::InvalidArgument(
        "combiners, weighted, max_norms and table_names must each have num_tables=", num_tables,
        " entries; got ", combiners.size(), ", ", weighted.size(), ", ", max_norms.size(), ", ",
        names.size());
  }
  for (int t = 0; t < num_tables; ++t) {
    core::Combiner parsed;
    if (!core::ParseCombiner(combiners[t], &parsed)) {
      return ::tensorflow::errors::InvalidArgument("combiners[", t, "] must be one of ",
                                                   core::QuotedCombinerNames(), "; got '",
                                                   combiners[t], "'");
    }
  }
  return OkStatus();
}

// The shape of table t: a [rows, dim] tensor input, or the shape recorded on
// a resource variable's handle (unknown [rows, dim] where none is recorded).
Status TableShape(InferenceContext* c, int t, ::tensorflow::DataType type, ShapeHandle* shape) {
  if (type != ::tensorflow::DT_RESOURCE) return c->WithRank(c->input(t), 2, shape);
  const auto* handle = c->input_handle_shapes_and_types(t);
  if (handle != nullptr && !handle->empty()) return c->WithRank((*handle)[0].shape, 2, shape);
  *shape = c->UnknownShapeOfRank(2);
  return OkStatus();
}

// dense_grads: empty (no table dense) or one flag per table.
Status DenseGrads(InferenceContext* c, int num_tables, std::vector<bool>* dense) {
  TF_RETURN_IF_ERROR(c->GetAttr("dense_grads", dense));
  if (dense->empty()) dense->assign(num_tables, false);
  if (static_cast<int>(dense->size()) != num_tables) {
    return ::tensorflow::errors::InvalidArgument("dense_grads must be empty or have num_tables=",
                                                 num_tables, " entries; got ", dense->size());
  }
  return OkStatus();
}

// Output t is [batch_t, dim_t] with batch_t = len(row_splits[t]) - 1.
Status LookupShape(InferenceContext* c) {
  int n = 0;
  TF_RETURN_IF_ERROR(c->GetAttr("num_tables", &n));
  std::vector<::tensorflow::DataType> param_types;
  TF_RETURN_IF_ERROR(CheckTableAttrs(c, n, &param_types));
  for (int t = 0; t < n; ++t) {
    ShapeHandle params, ids, splits, weights;
    TF_RETURN_IF_ERROR(TableShape(c, t, param_types[t], &params));
    TF_RETURN_IF_ERROR(c->WithRank(c->input(n + t), 1, &ids));
    TF_RETURN_IF_ERROR(c->WithRank(c->input(2 * n + t), 1, &splits));
    TF_RETURN_IF_ERROR(c->WithRank(c->input(3 * n + t), 1, &weights));
    ::tensorflow::shape_inference::DimensionHandle batch;
    TF_RETURN_IF_ERROR(c->Subtract(c->Dim(splits, 0), 1, &batch));
    c->set_output(t, c->Matrix(batch, c->Dim(params, 1)));
  }
  c->set_output(n, c->Matrix(7, n));  // checks: FusedLookupAttrs::kCheckRows x num_tables
  std::vector<bool> dense;
  return DenseGrads(c, n, &dense);
}

// unique_ids[t] is [num_unique_t]; grad_rows[t] is [num_unique_t, dim_t].
Status LookupGradShape(InferenceContext* c) {
  int n = 0;
  TF_RETURN_IF_ERROR(c->GetAttr("num_tables", &n));
  std::vector<::tensorflow::DataType> param_types;
  TF_RETURN_IF_ERROR(CheckTableAttrs(c, n, &param_types));
  std::vector<bool> dense;
  TF_RETURN_IF_ERROR(DenseGrads(c, n, &dense));
  for (int t = 0; t < n; ++t) {
    ShapeHandle params, grads;
    TF_RETURN_IF_ERROR(TableShape(c, t, param_types[t], &params));
    TF_RETURN_IF_ERROR(c->WithRank(c->input(4 * n + t), 2, &grads));
    if (dense[t]) {  // no ids; the gradient of every row of the table
      c->set_output(t, c->Vector(0));
      c->set_output(n + t, params);
      continue;
    }
    auto unique = c->UnknownDim();
    c->set_output(t, c->Vector(unique));
    c->set_output(n + t, c->Matrix(unique, c->Dim(params, 1)));
  }
  return OkStatus();
}

}  // namespace

REGISTER_OP("SokFusedLookup")
    .Input("params: Tparams")
    .Input("ids: num_tables * Tindices")
    .Input("row_splits: num_tables * int64")
    .Input("weights: num_tables * T")
    .Output("embeddings: num_tables * T")
    .Output("checks: int64")
    .Attr("num_tables: int >= 1")
    .Attr(core::CombinersAttr())
    .Attr("weighted: list(bool)")
    .Attr("max_norms: list(float)")
    .Attr("table_names: list(string) = []")
    .Attr("dense_grads: list(bool) = []")
    .Attr("T: {float, half, bfloat16}")
    .Attr("Tparams: list({float, half, bfloat16, resource})")
    .Attr("Tindices: {int32, int64}")
    .SetShapeFn(LookupShape)
    .Doc(R"doc(
Looks up and combines embedding rows of several tables in one op.

For table t and sample b, with ids j in [row_splits[t][b], row_splits[t][b+1]):
  embeddings[t][b] = combine_j(weights[t][j] * clip(params[t][ids[t][j]]))
as tf.nn.embedding_lookup_sparse computes it. A sample with no ids gives a
zero row.

params: tables, each a [rows, dim] tensor or a resource variable of one
  (read in place under a shared lock, without copying the table).
ids: row ids, each [nnz]; must lie in [0, rows).
row_splits: ragged row partitions, each [batch + 1].
weights: per-id weights [nnz] where weighted[t], else ignored (pass [0]).
combiners: per table, one of the combiner names (tf_ops/lookup/core/combiner.h).
max_norms: per table; rows whose L2 norm exceeds it are scaled down to it
  before combining. <= 0 disables clipping.
table_names: names used in error messages.
dense_grads: empty, or per table whether its gradient (SokFusedLookupGrad)
  is a dense [rows, dim] tensor rather than sparse rows; the forward only
  carries it to the gradient.
checks: the input check, int64 [7, num_tables], for SokLookupCheck. The CPU
  kernel rejects bad ids and row_splits at once (its check is clear); the GPU
  kernel checks them on the device and leaves the finding here instead of
  waiting for it, so the lookup's consumers never wait for the host:
  SokLookupCheck, which sok_graph adds next to every lookup, reports it.
)doc");

REGISTER_OP("SokLookupCheck")
    .Input("checks: int64")
    .Attr("num_tables: int >= 1")
    .Attr("table_names: list(string) = []")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs)
    .Doc(R"doc(
Fails with the error SokFusedLookup's CPU kernel gives for the same input
(a bad id, malformed row_splits) when `checks` (a SokFusedLookup's check
output) records one. Runs on the host.
)doc");

REGISTER_OP("SokFusedLookupGrad")
    .Input("params: Tparams")
    .Input("ids: num_tables * Tindices")
    .Input("row_splits: num_tables * int64")
    .Input("weights: num_tables * T")
    .Input("grads: num_tables * T")
    .Output("unique_ids: num_tables * Tindices")
    .Output("grad_rows: num_tables * T")
    .Attr("num_tables: int >= 1")
    .Attr(core::CombinersAttr())
    .Attr("weighted: list(bool)")
    .Attr("max_norms: list(float)")
    .Attr("table_names: list(string) = []")
    .Attr("dense_grads: list(bool) = []")
    .Attr("T: {float, half, bfloat16}")
    .Attr("Tparams: list({float, half, bfloat16, resource})")
    .Attr("Tindices: {int32, int64}")
    .SetShapeFn(LookupGradShape)
    .Doc(R"doc(
Gradient of SokFusedLookup with respect to params, as sparse rows.

unique_ids[t] lists each id of table t once (in order of first appearance);
grad_rows[t][u] is the summed gradient of the row unique_ids[t][u]. Together
they form an IndexedSlices with no duplicate indices.

row_splits[t] may be empty here (not in SokFusedLookup) for an unweighted
table, to say one id per sample, as the splits 0, 1, ..., len(ids[t])
would, with no splits to make or check (all2all_dense_embedding's samples).

A table marked in dense_grads instead gets unique_ids[t] empty and
grad_rows[t] [rows, dim]: row r holds the summed gradient of id r (zero for
an id that does not occur). For a small table whose every row is looked up
(rows gathered for the batch's distinct ids), this is the same gradient
without a count of distinct ids: a GPU kernel whose tables are all dense
never waits for the device. Its input check is then the forward's
(SokLookupCheck); a table whose ids or row_splits fail it gets a zero
gradient here.
)doc");

}  // namespace sok_graph
