// Placement of ids for model parallelism: bucketing by owning worker, the
// mapping from global ids to rows of the owner's shard, and the owner's read
// of the rows of several tables for the keys it received (the grouped
// exchange of sok_graph/exchange.py).
#include <vector>

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "compat/tf_compat.h"

namespace sok_graph {

using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

// world_size and fixed_owner of an op that places ids on workers, checked:
// a fixed owner must be one of the workers.
Status OwnerAttrs(InferenceContext* c, int* world_size) {
  int fixed_owner = 0;
  TF_RETURN_IF_ERROR(c->GetAttr("world_size", world_size));
  TF_RETURN_IF_ERROR(c->GetAttr("fixed_owner", &fixed_owner));
  if (fixed_owner >= *world_size) {
    return ::tensorflow::errors::InvalidArgument("fixed_owner must be < world_size (",
                                                 *world_size, "); got ", fixed_owner);
  }
  return OkStatus();
}

REGISTER_OP("SokBucketizeByOwner")
    .Input("ids: T")
    .Output("bucketed_ids: T")
    .Output("bucket_sizes: int64")
    .Output("permutation: int64")
    .Output("inverse_permutation: int64")
    .Attr("world_size: int >= 1")
    .Attr("fixed_owner: int = -1")
    .Attr("check_negative: bool = true")
    .Attr("T: {int32, int64}")
    .SetShapeFn([](InferenceContext* c) -> Status {
      ShapeHandle ids;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &ids));
      int world_size = 0;
      TF_RETURN_IF_ERROR(OwnerAttrs(c, &world_size));
      c->set_output(0, ids);
      c->set_output(1, c->Vector(world_size));
      c->set_output(2, ids);
      c->set_output(3, ids);
      return OkStatus();
    })
    .Doc(R"doc(
Groups ids by the worker that owns them, keeping input order within a group.

The owner of id is fixed_owner if fixed_owner >= 0 (localized tables), else
id % world_size (distributed tables). bucketed_ids = ids[permutation];
bucket_sizes[w] counts ids owned by worker w; gathering bucketed rows with
inverse_permutation restores input order. Ids must be >= 0.
check_negative=false: the caller guarantees ids >= 0 (owners computed with
floormod, keys that passed a check), so the GPU kernel skips the read-back
that reports a negative id: no wait for the device. A negative id is then
grouped with worker 0 there; the CPU kernel checks in any case (it waits
for nothing).
)doc");

REGISTER_OP("SokLocalRows")
    .Input("ids: T")
    .Output("local_rows: T")
    .Attr("world_size: int >= 1")
    .Attr("T: {int32, int64}")
    .SetShapeFn(::tensorflow::shape_inference::UnchangedShape)
    .Doc(R"doc(
The row each id occupies in its owner's shard of a distributed table:
id // world_size. Ids must be >= 0.
)doc");

REGISTER_OP("SokRouteGroupedKeys")
    .Input("ids: int64")
    .Input("tables: int64")
    .Output("sent_keys: int64")
    .Output("send_sizes: int64")
    .Output("slots: int64")
    .Attr("num_tables: int >= 1")
    .Attr("world_size: int >= 1")
    .Attr("fixed_owner: int = -1")
    .SetShapeFn([](InferenceContext* c) -> Status {
      ShapeHandle ids, tables;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &ids));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &tables));
      TF_RETURN_IF_ERROR(c->Merge(ids, tables, &ids));
      int world_size = 0;
      TF_RETURN_IF_ERROR(OwnerAttrs(c, &world_size));
      c->set_output(0, ids);
      c->set_output(1, c->Vector(world_size));
      c->set_output(2, ids);
      return OkStatus();
    })
    .Doc(R"doc(
The sender's side of a grouped exchange in one op: the keys of ids of
num_tables tables, deduplicated, grouped by owning worker and written as
their owners read them (tf_ops/sharding/core/route_keys.h).

ids: [n] row ids, ids[i] a row of table tables[i]. Not checked against the
  tables (the caller's range check does that; a bad id still gets a key).
tables: [n] table of each id, each in [0, num_tables) (checked on the CPU;
  the GPU kernel reads an out-of-range table modulo num_tables).
sent_keys: [n] the d distinct keys id * num_tables + table (wrapping on
  overflow), grouped by owner ((key // num_tables) mod world_size, or
  fixed_owner; floor division), in order of first appearance within an
  owner, each as its owner reads it ((key // (num_tables * world_size)) *
  num_tables + key mod num_tables, or the key itself with a fixed owner);
  -1 after them.
send_sizes: [world_size] how many of the d keys go to each worker; they add
  up to d, so an all-to-all of sent_keys with these splits leaves the
  padding unsent.
slots: [n] the position in sent_keys of ids[i]'s key.
On a GPU the op reads nothing back: it does not wait for the device.
)doc");

// The [n, dim] rows of SokGroupedGather: dim from the first table whose
// shape says it (a tensor, or a variable's recorded handle shape).
Status GroupedGatherShape(InferenceContext* c) {
  int n = 0;
  TF_RETURN_IF_ERROR(c->GetAttr("num_tables", &n));
  ShapeHandle keys, sizes;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(n), 1, &keys));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(n + 1), 1, &sizes));
  ::tensorflow::shape_inference::DimensionHandle count;
  TF_RETURN_IF_ERROR(c->WithValue(c->Dim(sizes, 0), n, &count));
  std::vector<::tensorflow::DataType> types;
  TF_RETURN_IF_ERROR(c->GetAttr("Tparams", &types));
  if (static_cast<int>(types.size()) != n) {
    return ::tensorflow::errors::InvalidArgument("params must have num_tables=", n,
                                                 " entries; got ", types.size());
  }
  auto dim = c->UnknownDim();
  for (int t = 0; t < n; ++t) {
    ShapeHandle table;
    if (types[t] != ::tensorflow::DT_RESOURCE) {
      TF_RETURN_IF_ERROR(c->WithRank(c->input(t), 2, &table));
    } else if (c->input_handle_shapes_and_types(t) != nullptr &&
               !c->input_handle_shapes_and_types(t)->empty()) {
      TF_RETURN_IF_ERROR(c->WithRank((*c->input_handle_shapes_and_types(t))[0].shape, 2, &table));
    } else {
      continue;  // a variable whose handle records no shape
    }
    TF_RETURN_IF_ERROR(c->Merge(dim, c->Dim(table, 1), &dim));
  }
  c->set_output(0, c->Matrix(c->Dim(keys, 0), dim));
  return OkStatus();
}

REGISTER_OP("SokGroupedGather")
    .Input("params: Tparams")
    .Input("keys: int64")
    .Input("table_sizes: int64")
    .Output("rows: T")
    .Attr("num_tables: int >= 1")
    .Attr("table_names: list(string) = []")
    .Attr("distinct_keys: bool = false")
    .Attr("padded_keys: bool = false")
    .Attr("T: {float, half, bfloat16, double}")
    .Attr("Tparams: list({float, half, bfloat16, double, resource})")
    .SetShapeFn(GroupedGatherShape)
    .Doc(R"doc(
The rows of several tables for keys that name their table: for key k,
rows[i] = params[k % num_tables][k // num_tables]. The owner's read in the
grouped exchange, where each received key is (local row) * num_tables +
(table), in one op for all tables.

params: num_tables tables of one dtype T and one dimension, each a
  [rows, dim] tensor or a resource variable (read in place under a shared
  lock, as the fused lookup reads it).
keys: distinct keys, each >= 0 with a row k // num_tables inside its table.
  The CPU kernel reports a bad key; the GPU kernel reads a zero row for it
  (the exchange's keys passed the senders' range checks).
table_sizes: [num_tables], how many keys name each table, for the gradient
  (SokGroupedGatherGrad takes it in host memory and sizes its outputs from
  it). The CPU kernel checks that it adds up to the keys; the GPU kernel
  takes it in device memory and does not read it (no wait for the device).
table_names: empty, or a name per table for error messages.
distinct_keys: the caller vouches that the keys are distinct (the exchange's
  come from a unique): the gradient's indices are then marked so for the
  sparse optimizers, which skip their own dedup. Not read by the kernels.
padded_keys: the keys end in padding (SokUniquePadded's -1s) that
  table_sizes does not count: any key that names no row reads a zero row on
  every device, with no error (the exchange's keys passed the senders'
  range checks, whose failure fails the step).
)doc");

REGISTER_OP("SokGroupedGatherGrad")
    .Input("keys: int64")
    .Input("grads: T")
    .Input("permutation: int64")
    .Input("table_sizes: int64")
    .Output("indices: num_tables * int64")
    .Output("values: num_tables * T")
    .Attr("num_tables: int >= 1")
    .Attr("padded_keys: bool = false")
    .Attr("T: {float, half, bfloat16, double}")
    .SetShapeFn([](InferenceContext* c) -> Status {
      int n = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("num_tables", &n));
      ShapeHandle keys, grads, permutation, sizes;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &keys));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &grads));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &permutation));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 1, &sizes));
      ::tensorflow::shape_inference::DimensionHandle count;
  TF_RETURN_IF_ERROR(c->WithValue(c->Dim(sizes, 0), n, &count));
      const Tensor* known = c->input_tensor(3);
      for (int t = 0; t < n; ++t) {
        if (known != nullptr && known->flat<TfInt64>()(t) < 0) {
          return ::tensorflow::errors::InvalidArgument(
              "table_sizes must be counts >= 0; got ", known->flat<TfInt64>()(t), " at table ",
              t);
        }
        auto size = known != nullptr ? c->MakeDim(known->flat<TfInt64>()(t)) : c->UnknownDim();
        c->set_output(t, c->Vector(size));
        c->set_output(n + t, c->Matrix(size, c->Dim(grads, 1)));
      }
      return OkStatus();
    })
    .Doc(R"doc(
The gradient of SokGroupedGather as one (indices, values) pair per table:
table t's keys in their order among `keys` (local rows k // num_tables) and
the rows of `grads` [n, dim] for them. permutation: `keys` grouped by table,
stably (SokBucketizeByOwner of keys over num_tables); table_sizes: how many
keys name each table (host memory on a GPU), which must add up to n, or
with padded_keys to at most n, the positions past them in the permutation
being padding that no table gets. The keys being distinct, each table's
indices are too. The CPU kernel reports a
permutation or table_sizes that do not group the keys so; on a GPU such a
position gets the index -1 and a zero row (dropped by every scatter).
)doc");

}  // namespace sok_graph
