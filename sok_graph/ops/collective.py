"""The collective ops (tf_ops/collective): an all-to-all of rows between the
GPUs of a model-parallel exchange, on NCCL, with its gradient.

`alltoall` sends `send_splits[r]` consecutive rows to rank r and returns
(received rows in rank order, received splits, sent splits); both splits
come back in host memory. `alltoall_sized` is the same exchange when both
splits are already known on the host (the reply to an all-to-all, and every
gradient): it reads nothing back from the device before it can start. The
gradient of either is the reverse exchange, sized.

Each rank's NCCL work runs on a stream of its own. For the GPUs of one
process an op completes when that stream has finished; for one process per
GPU, as soon as it is queued, with the compute stream waiting for the NCCL
stream on the GPU (tf_ops/collective/kernels/nccl_kernels_gpu.cc says why).

NCCL matches the operations of a communicator by their order, so every rank
must run its all-to-alls in one order. Inside a graph TensorFlow would run
independent ones in any order; each op built here therefore waits (a
control dependency) for the one built before it for the same rank of the
same clique in the same graph. Every rank builds the same program, so the
build order is the same everywhere. Eagerly, ops run as they are called.
In a tf.function TensorFlow would also order the op after every side effect
built before it, other ranks' included; compat.order_side_effects_per_replica
limits that to the op's own replica.
"""


import tensorflow as tf

from sok_graph import compat
from sok_graph.ops import library



def _ordered(clique, rank, build):
    """build() under a control dependency on the previous all-to-all of
    (clique, rank) in this graph; records the new one."""
    if tf.executing_eagerly():
        return build()
    graph = tf.compat.v1.get_default_graph()
    # In a tf.function, keep TensorFlow from ordering this rank's exchange
    # after another rank's side effects (see compat).
    compat.order_side_effects_per_replica(graph)
    # {(clique, rank): the last all-to-all op built in this graph}
    chain = compat.graph_state(graph, "last_alltoall")
    previous = chain.get((clique, rank))
    # An empty list keeps the caller's control dependencies (None would
    # clear them).
    with tf.control_dependencies([previous] if previous is not None else []):
        out = build()
    first = out[0] if isinstance(out, (list, tuple)) else out
    chain[(clique, rank)] = first.op
    return out


def _attrs(clique, rank, world_size):
    return dict(clique=str(clique), rank=int(rank), world_size=int(world_size))


def alltoall(tensor, send_splits, clique, rank, world_size, padded=False, name=None):
    """(received, received_splits, sent_splits); see the module's docstring.
    padded: `tensor` may have rows past the splits' sum, which stay here."""
    return _ordered(clique, rank, lambda: tuple(library.load().sok_nccl_all_to_all(
        tensor, tf.cast(send_splits, tf.int64), padded=bool(padded), name=name,
        **_attrs(clique, rank, world_size))))


def alltoall_sized(tensor, send_splits, receive_splits, clique, rank, world_size, name=None):
    """The rows received, when both splits are known (host memory)."""
    return _ordered(clique, rank, lambda: library.load().sok_nccl_all_to_all_sized(
        tensor, send_splits, receive_splits, name=name, **_attrs(clique, rank, world_size)))


def _reverse(op, dy, send_splits, receive_splits):
    if dy is None:  # every rank runs the reverse exchange, used or not
        dy = tf.zeros_like(op.outputs[0])
    clique = op.get_attr("clique")
    clique = clique.decode() if isinstance(clique, bytes) else clique
    return alltoall_sized(tf.convert_to_tensor(dy), send_splits, receive_splits, clique,
                          op.get_attr("rank"), op.get_attr("world_size"))


@tf.RegisterGradient("SokNcclAllToAll")
def _alltoall_grad(op, dy, *unused):
    # What came from rank r goes back to it: send the received splits,
    # receive the sent ones.
    grad = _reverse(op, dy, op.outputs[1], op.outputs[2])
    if op.get_attr("padded"):  # the rows that were not sent get a zero gradient
        unsent = tf.shape(op.inputs[0])[:1] - tf.shape(grad)[:1]
        grad = tf.concat([grad, tf.zeros(tf.concat([unsent, tf.shape(grad)[1:]], 0),
                                         grad.dtype)], 0)
    return [grad, None]


@tf.RegisterGradient("SokNcclAllToAllSized")
def _alltoall_sized_grad(op, dy):
    return [_reverse(op, dy, op.inputs[2], op.inputs[1]), None, None]
