// General sparse helpers the sparse optimizers and the distributed lookup
// need: unique (with or without counts) and a deterministic unsorted
// segment sum.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "compat/tf_compat.h"

namespace sok_graph {

using ::tensorflow::Status;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

REGISTER_OP("SokUniqueWithCounts")
    .Input("x: T")
    .Output("y: T")
    .Output("idx: out_idx")
    .Output("count: out_idx")
    .Attr("T: {int32, int64}")
    .Attr("out_idx: {int32, int64} = DT_INT32")
    .SetShapeFn([](InferenceContext* c) -> Status {
      ShapeHandle x;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &x));
      auto unique = c->UnknownDim();
      c->set_output(0, c->Vector(unique));
      c->set_output(1, x);
      c->set_output(2, c->Vector(unique));
      return OkStatus();
    })
    .Doc(R"doc(
Distinct values of x in order of first appearance, as tf.unique_with_counts:
y[idx[i]] == x[i], count[k] = occurrences of y[k].
)doc");

REGISTER_OP("SokUnique")
    .Input("x: T")
    .Output("y: T")
    .Output("idx: out_idx")
    .Attr("T: {int32, int64}")
    .Attr("out_idx: {int32, int64} = DT_INT32")
    .SetShapeFn([](InferenceContext* c) -> Status {
      ShapeHandle x;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &x));
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, x);
      return OkStatus();
    })
    .Doc(R"doc(
Distinct values of x in order of first appearance, as tf.unique: y[idx[i]] ==
x[i]. SokUniqueWithCounts without the counts, which cost the GPU kernel an
atomic per warp of keys.
)doc");

REGISTER_OP("SokUniquePadded")
    .Input("x: T")
    .Output("y: T")
    .Output("idx: out_idx")
    .Output("count: int64")
    .Output("group_sizes: int64")
    .Attr("T: {int32, int64}")
    .Attr("out_idx: {int32, int64} = DT_INT32")
    .Attr("groups: int >= 0 = 0")
    .SetShapeFn([](InferenceContext* c) -> Status {
      ShapeHandle x;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &x));
      TfInt64 groups = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("groups", &groups));
      c->set_output(0, x);
      c->set_output(1, x);
      c->set_output(2, c->Scalar());
      c->set_output(3, c->Vector(groups));
      return OkStatus();
    })
    .Doc(R"doc(
SokUnique with outputs of a size known before it runs: y has the length of
x, its first `count` entries the distinct values in the order SokUnique
gives them, the rest -1. idx, as SokUnique's, points into those first
`count`. group_sizes (empty when groups = 0) counts the distinct values per
group, a value v in group v mod groups (floor modulo, so in [0, groups) for
any v). On a GPU every output stays in device
memory and the op never waits for the device: the ops after it are queued
while it runs (the model-parallel exchange's dedups, whose counts only the
all-to-all's one read of its sizes and a later gradient need on the host).
)doc");

REGISTER_OP("SokUnsortedSegmentSum")
    .Input("data: T")
    .Input("segment_ids: Tindices")
    .Input("num_segments: Tnumsegments")
    .Output("output: T")
    .Attr("T: {float, double, half, bfloat16}")
    .Attr("Tindices: {int32, int64}")
    .Attr("Tnumsegments: {int32, int64} = DT_INT32")
    .Attr("check_ids: bool = true")
    .SetShapeFn([](InferenceContext* c) -> Status {
      ShapeHandle data, ids, rest;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 1, &data));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &ids));
      ::tensorflow::shape_inference::DimensionHandle unused;
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(data, 0), c->Dim(ids, 0), &unused));
      ShapeHandle num;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 0, &num));
      ::tensorflow::shape_inference::DimensionHandle segments;
      TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(2, &segments));
      TF_RETURN_IF_ERROR(c->Subshape(data, 1, &rest));
      ShapeHandle out;
      TF_RETURN_IF_ERROR(c->Concatenate(c->Vector(segments), rest, &out));
      c->set_output(0, out);
      return OkStatus();
    })
    .Doc(R"doc(
output[s] = sum of data[i] over i with segment_ids[i] == s, for s in
[0, num_segments), as tf.math.unsorted_segment_sum with 1-D segment_ids:
negative ids are dropped, ids >= num_segments are an error. Deterministic: each
segment is summed in increasing position order (a long one in pieces, whose
sums are added in order) whatever the device and thread count.
check_ids=false: the caller vouches that every id is < num_segments (positions
from a unique): the GPU kernel then does not read its check back (no wait for
the device) and drops such ids; the CPU kernel checks all the same.
)doc");

}  // namespace sok_graph
