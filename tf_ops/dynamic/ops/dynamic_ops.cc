// Dynamic embedding tables: a hash-table resource keyed by int32/int64 ids
// with float rows, growing as new ids arrive, optionally bounded with LRU or
// LFU eviction.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "compat/tf_compat.h"
#include "tf_ops/optimizer/core/sparse_apply.h"

namespace sok_graph {

using ::tensorflow::Status;
using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

namespace {

// [n, dim] for keys [n] at input `keys_input` and attr dim.
Status RowsShape(InferenceContext* c, int keys_input, int output) {
  ShapeHandle keys;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(keys_input), 1, &keys));
  int dim = 0;
  TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
  c->set_output(output, c->Matrix(c->Dim(keys, 0), dim));
  return OkStatus();
}

}  // namespace

REGISTER_OP("SokDynamicTableHandle")
    .Output("table: resource")
    .Attr("container: string = ''")
    .Attr("shared_name: string = ''")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc("A handle to a dynamic table, created by SokDynamicTableCreate.");

REGISTER_OP("SokDynamicTableCreate")
    .Input("table: resource")
    .SetIsStateful()
    .Attr("key_dtype: {int32, int64}")
    .Attr("dim: int >= 1")
    .Attr("initializer: string = 'normal'")
    .Attr("init_mean: float = 0.0")
    .Attr("init_stddev: float = 1.0")
    .Attr("init_minval: float = 0.0")
    .Attr("init_maxval: float = 1.0")
    .Attr("init_value: float = 0.0")
    .Attr("seed: int = 0")
    .Attr("init_capacity: int = 0")
    .Attr("max_capacity: int = 0")
    .Attr("max_bytes: int = 0")
    .Attr("hbm_bytes: int = -1")
    .Attr("eviction: string = 'lru'")
    .Attr("table_name: string = ''")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs)
    .Doc(R"doc(
Creates the table behind `table` unless it exists already (running it again,
as a re-run initializer does, keeps the table and its rows).

initializer: rows of new keys: "normal" (init_mean, init_stddev),
  "truncated_normal" (redrawn beyond 2 stddev), "uniform" ([init_minval,
  init_maxval)), "zeros", "constant" (init_value). Values depend only on
  (seed, key, position), never on batch or thread.
init_capacity: rows allocated up front (the table grows past it).
max_capacity: 0 for no bound, else the most rows kept.
max_bytes: 0 for no bound, else a budget for row storage (rows of dim
  floats); the bound is the smaller of the two.
hbm_bytes: -1 to keep every row in device memory, else how many bytes of
  rows a GPU table keeps there; its other rows live in pinned host memory
  that its kernels read and write in place (nothing is evicted for it). A
  CPU table keeps all rows in host memory.
eviction: "lru" or "lfu": which rows go when a bounded table is full.
table_name: the name the table's errors give it (its variable's); empty: the
  handle's.
)doc");

REGISTER_OP("SokDynamicTableIsInitialized")
    .Input("table: resource")
    .SetIsStateful()
    .Output("is_initialized: bool")
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape);

REGISTER_OP("SokDynamicTableFindOrInsert")
    .Input("table: resource")
    .SetIsStateful()
    .Input("keys: Tkeys")
    .Output("rows: float")
    .Output("num_evicted: int64")
    .Output("evicted_keys: Tkeys")
    .Output("evicted_rows: float")
    .Attr("Tkeys: {int32, int64}")
    .Attr("dim: int >= 1")
    .SetShapeFn([](InferenceContext* c) -> Status {
      TF_RETURN_IF_ERROR(RowsShape(c, 1, 0));
      c->set_output(1, c->Scalar());
      c->set_output(2, c->Vector(c->UnknownDim()));
      int dim = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
      c->set_output(3, c->Matrix(c->UnknownDim(), dim));
      return OkStatus();
    })
    .Doc(R"doc(
Rows of `keys` [n] as [n, dim], inserting missing keys with rows from the
table's initializer. Counts a use of each key (LRU time, LFU frequency).
num_evicted / evicted_keys / evicted_rows: the entries evicted to make room
(tables that shadow this one, such as optimizer slots, drop those keys too;
sok.sparse_read_and_evict hands keys and rows to its caller).
)doc");

REGISTER_OP("SokDynamicTableUniqueFindOrInsert")
    .Input("table: resource")
    .SetIsStateful()
    .Input("keys: Tkeys")
    .Output("unique_keys: Tkeys")
    .Output("positions: int64")
    .Output("rows: float")
    .Output("num_evicted: int64")
    .Output("evicted_keys: Tkeys")
    .Attr("Tkeys: {int32, int64}")
    .Attr("dim: int >= 1")
    .SetShapeFn([](InferenceContext* c) -> Status {
      ShapeHandle keys;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &keys));
      int dim = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
      const DimensionHandle distinct = c->UnknownDim();
      c->set_output(0, c->Vector(distinct));
      c->set_output(1, keys);
      c->set_output(2, c->Matrix(distinct, dim));
      c->set_output(3, c->Scalar());
      c->set_output(4, c->Vector(c->UnknownDim()));
      return OkStatus();
    })
    .Doc(R"doc(
The distinct keys of `keys` [n] in order of first appearance (as tf.unique)
with each key's position among them, and their rows [u, dim] as
SokDynamicTableFindOrInsert gives them for the distinct keys (one use of
each). On a GPU the count of distinct keys and the table's own check for
room are read back from the device together: one wait where tf.unique and
a find-or-insert of a full table wait once each.
)doc");

REGISTER_OP("SokDynamicTableFind")
    .Input("table: resource")
    .SetIsStateful()
    .Input("keys: Tkeys")
    .Input("default_value: float")
    .Output("rows: float")
    .Output("found: bool")
    .Attr("Tkeys: {int32, int64}")
    .Attr("dim: int >= 1")
    .SetShapeFn([](InferenceContext* c) -> Status {
      TF_RETURN_IF_ERROR(RowsShape(c, 1, 0));
      c->set_output(1, c->input(1));
      return OkStatus();
    })
    .Doc(R"doc(
Rows of `keys` for inference: missing keys get default_value (a scalar or a
[dim] row) and found=false; nothing is inserted and no metadata changes.
)doc");

REGISTER_OP("SokDynamicTableScatter")
    .Input("table: resource")
    .SetIsStateful()
    .Input("keys: Tkeys")
    .Input("rows: float")
    .Output("num_evicted: int64")
    .Attr("Tkeys: {int32, int64}")
    .Attr("mode: {'add', 'sub', 'update'}")
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
row(key) += rows[i] / -= rows[i] / = rows[i] for each keys[i], in input
order. Missing keys are inserted first with their initial rows.
)doc");

REGISTER_OP("SokDynamicTableRemove")
    .Input("table: resource")
    .SetIsStateful()
    .Input("keys: Tkeys")
    .Output("num_removed: int64")
    .Attr("Tkeys: {int32, int64}")
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape);

REGISTER_OP("SokDynamicTableAddShadow")
    .Input("table: resource")
    .Input("shadow: resource")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs)
    .Doc(R"doc(
Makes `shadow`, a table of the same key type on the same device (an
optimizer's slot table of `table`), drop every key that `table` evicts or
removes, in the op that evicts or removes it: find-or-insert, unique
find-or-insert, scatter, a non-replacing import, remove and the fused
update. A replacing import (a restore) leaves the shadows to the caller.
`table` holds a reference to `shadow`; adding it again does nothing.
)doc");

REGISTER_OP("SokDynamicTableStats")
    .Input("table: resource")
    .SetIsStateful()
    .Output("size: int64")
    .Output("row_limit: int64")
    .Output("evicted_total: int64")
    .Output("memory_bytes: int64")
    .SetShapeFn([](InferenceContext* c) -> Status {
      for (int i = 0; i < 4; ++i) c->set_output(i, c->Scalar());
      return OkStatus();
    })
    .Doc("Rows held, the most rows allowed, rows evicted so far, bytes allocated.");

REGISTER_OP("SokDynamicTableExport")
    .Input("table: resource")
    .SetIsStateful()
    .Input("offset: int64")
    .Input("limit: int64")
    .Input("updated_after: int64")
    .Output("keys: Tkeys")
    .Output("rows: float")
    .Output("timestamps: int64")
    .Output("frequencies: int64")
    .Output("next_offset: int64")
    .Attr("Tkeys: {int32, int64}")
    .Attr("dim: int >= 1")
    .SetShapeFn([](InferenceContext* c) -> Status {
      auto n = c->UnknownDim();
      int dim = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
      c->set_output(0, c->Vector(n));
      c->set_output(1, c->Matrix(n, dim));
      c->set_output(2, c->Vector(n));
      c->set_output(3, c->Vector(n));
      c->set_output(4, c->Scalar());
      return OkStatus();
    })
    .Doc(R"doc(
Up to `limit` entries from position `offset` of the table, keeping only those
last updated after `updated_after` (UTC microseconds; INT64_MIN for all):
keys, rows, last-update times and use counts. Call again from next_offset
until it equals the table's size, so memory stays bounded by `limit`.
)doc");

REGISTER_OP("SokDynamicTableImport")
    .Input("table: resource")
    .SetIsStateful()
    .Input("keys: Tkeys")
    .Input("rows: float")
    .Input("timestamps: int64")
    .Input("frequencies: int64")
    .Output("num_evicted: int64")
    .Attr("Tkeys: {int32, int64}")
    .Attr("replace: bool = false")
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
Inserts or overwrites keys with rows [n, dim]. timestamps and frequencies
restore metadata when given ([n] each), or are empty ([0]).

replace: the table holds exactly these rows afterwards, replaced in one step
under the table's lock, so no other op sees it empty or half-loaded. On the
CPU the rows are imported into a new table that is swapped in, and an error
leaves the table unchanged; on a GPU the table is emptied and filled in one
step of its stream.
)doc");

REGISTER_OP("SokDynamicSparseApply")
    .Input("table: resource")
    .Input("keys: Tkeys")
    .Input("grads: float")
    .Input("hyper: float")
    .Input("step: int64")
    .Input("slots: num_slots * resource")
    .SetIsStateful()
    .Attr("Tkeys: {int32, int64}")
    .Attr("num_slots: int >= 0")
    .Attr(::sok_graph::core::AlgorithmAttr())
    .Attr(::sok_graph::core::SlotNamesAttr())
    .Attr(::sok_graph::core::HyperNamesAttr())
    .Attr("tf1: bool = false")
    .Attr("keras_optimizer_v2: bool = false")
    .Attr("nesterov: bool = false")
    .SetShapeFn([](InferenceContext* c) -> Status {
      ShapeHandle keys, grads, hyper, step;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &keys));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 2, &grads));
      ::tensorflow::shape_inference::DimensionHandle n;
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(keys, 0), c->Dim(grads, 0), &n));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 1, &hyper));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(4), 0, &step));
      return OkStatus();
    })
    .Doc(R"doc(
One optimizer step of `algorithm` for distinct keys of a dynamic table, in
one op, as these table ops in turn would take it: the keys' rows are found
(a missing key, evicted since its lookup, reads as zeros and is inserted
again; the keys that insert evicts are removed from every slot table), each
slot table's rows found or inserted (with the slot table's initializer),
the rows and slots updated from grads [n, dim] (the formulas of
SokSparseApply; hyper: [lr, momentum, epsilon, beta_1, beta_2, lr_power,
l1, l2, l2_shrinkage, beta], step: Adam's 1-based step), then written back
with scatter "update". slots: the algorithm's slot tables in its order
(momentum 1, adagrad 1, adam 2: m, v, ftrl 2: accumulator, linear).
)doc");

// Empties the table and its shadows (SokDynamicTableAddShadow).
REGISTER_OP("SokDynamicTableClear")
    .Input("table: resource")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs);

}  // namespace sok_graph
