// All-to-all of rows between the GPUs of a model-parallel exchange, on NCCL.
// Only GPU kernels exist: sok_graph/communication/nccl.py builds these ops
// where every rank is a GPU and NCCL loads, and the engines' own
// all-to-all everywhere else.
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "compat/tf_compat.h"

namespace sok_graph {

using ::tensorflow::Status;
using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

namespace {

// received: [?] + input.shape[1:]; the splits: [world_size].
Status AllToAllShape(InferenceContext* c, int split_outputs) {
  ShapeHandle input, rows;
  TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 1, &input));
  TF_RETURN_IF_ERROR(c->ReplaceDim(input, 0, c->UnknownDim(), &rows));
  c->set_output(0, rows);
  int world_size = 0;
  TF_RETURN_IF_ERROR(c->GetAttr("world_size", &world_size));
  for (int i = 1; i <= split_outputs; ++i) c->set_output(i, c->Vector(world_size));
  return OkStatus();
}

}  // namespace

// The communicator attributes, shared by both ops: a clique of ranks named
// by `clique` (the hex of an ncclUniqueId for one rank per process, or
// "local:<devices>" for the GPUs of this process), this op's `rank` in it
// and the `world_size`.
#define SOK_NCCL_ATTRS                                     \
  Attr("T: {float, half, bfloat16, double, int32, int64}") \
      .Attr("clique: string")                              \
      .Attr("rank: int >= 0")                              \
      .Attr("world_size: int >= 1")

REGISTER_OP("SokNcclAllToAll")
    .Input("input: T")
    .Input("send_splits: int64")
    .Output("received: T")
    .Output("received_splits: int64")
    .Output("sent_splits: int64")
    .SOK_NCCL_ATTRS
    .Attr("padded: bool = false")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return AllToAllShape(c, 2); })
    .Doc(R"doc(
Rows of input sent to every rank of the clique: send_splits[r] consecutive
rows to rank r, in rank order. received holds what ranks 0..N-1 sent here, in
rank order; received_splits says how many rows came from each, and
sent_splits repeats send_splits. Both splits are in host memory, so the
reply (SokNcclAllToAllSized with the splits swapped) and the gradient need
no wait for the device. send_splits is read in host memory. The splits
travel first, on the rows' NCCL stream before it waits for the compute
stream (one wait, for the peers' splits and this rank's earlier exchanges:
the output's size; not for the kernels queued on this GPU since); then the
rows, GPU to GPU. padded: input may have more
rows than send_splits add up to (the padding of a unique that did not wait
for its count); those are not sent.
)doc");

REGISTER_OP("SokNcclAllToAllSized")
    .Input("input: T")
    .Input("send_splits: int64")
    .Input("receive_splits: int64")
    .Output("received: T")
    .SOK_NCCL_ATTRS
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return AllToAllShape(c, 0); })
    .Doc(R"doc(
SokNcclAllToAll where both splits are known (host memory): the reply to an
all-to-all and the gradients. No wait for the device.
)doc");

#undef SOK_NCCL_ATTRS

}  // namespace sok_graph
