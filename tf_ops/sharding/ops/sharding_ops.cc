// Placement of ids for model parallelism: bucketing by owning worker and the
// mapping from global ids to rows of the owner's shard.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "compat/tf_compat.h"

namespace sok_graph {

using ::tensorflow::Status;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

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
      int world_size = 0, fixed_owner = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("world_size", &world_size));
      TF_RETURN_IF_ERROR(c->GetAttr("fixed_owner", &fixed_owner));
      if (fixed_owner >= world_size) {
        return ::tensorflow::errors::InvalidArgument("fixed_owner must be < world_size (",
                                                     world_size, "); got ", fixed_owner);
      }
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

}  // namespace sok_graph
