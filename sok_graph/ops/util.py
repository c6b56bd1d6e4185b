"""Unique (with or without counts) and a deterministic unsorted segment sum
(tf_ops/util), and what the gradients of table reads build on them: sums
of repeated rows by position, and whether a tensor of row ids is distinct
by the way the graph made it."""

import contextlib

import numpy as np
import tensorflow as tf

from sok_graph.ops import library
from sok_graph.compat import register_gradient


def unique(x, out_idx=tf.int32, name=None):
    """As ``tf.unique``: (y, idx), y in order of first appearance.

    x: [n] int32/int64. Cheaper than unique_with_counts on a GPU (no counts).
    """
    return library.load().sok_unique(x, out_idx=out_idx, name=name)


# The most groups unique_padded counts: the most workers (the sharding ops'
# kMaxWorldSize), whose number its groups are.
MAX_GROUPS = 1 << 20


def unique_padded(x, groups=0, out_idx=tf.int64, name=None):
    """(y, idx, count, group_sizes) with sizes known before the op runs: y
    [n] holds unique(x)'s distinct values in its first `count` entries (an
    int64 scalar) and -1 after them, idx [n] points into those; group_sizes
    [groups] counts them per group (v mod groups; empty for groups=0). On a
    GPU nothing is read back: the op does not wait for the device, and
    every output stays in device memory."""
    if isinstance(groups, bool) or not isinstance(groups, (int, np.integer)) or groups < 0:
        raise ValueError(f"groups must be an int >= 0 (the number of groups, a value v in "
                         f"group v mod groups; 0 for none); got {groups!r}")
    if groups > MAX_GROUPS:
        # group_sizes holds `groups` int64s: 2^31 groups took 16 GiB, and the
        # process was killed for memory.
        raise ValueError(f"groups must be <= {MAX_GROUPS} (the most workers a table is "
                         f"sharded over; group_sizes holds one count per group); got {groups}")
    return library.load().sok_unique_padded(x, groups=int(groups), out_idx=out_idx, name=name)


def unique_with_counts(x, out_idx=tf.int32, name=None):
    """As ``tf.unique_with_counts``: (y, idx, count), y in order of first appearance.

    x: [n] int32/int64.
    """
    return library.load().sok_unique_with_counts(x, out_idx=out_idx, name=name)


def unsorted_segment_sum(data, segment_ids, num_segments, name=None, check_ids=True):
    """As ``tf.math.unsorted_segment_sum`` with 1-D segment_ids, deterministic
    (the same bits on every run, on a CPU and a GPU).

    data: [n, ...]; segment_ids: [n] (negative ids are dropped, ids >=
    num_segments an error); returns [num_segments, ...]. check_ids=False is
    for ids in range by construction (a unique's positions): a GPU then
    reads no check back and does not wait for the device.
    """
    return library.load().sok_unsorted_segment_sum(data, segment_ids, num_segments,
                                                   check_ids=bool(check_ids), name=name)


@register_gradient("SokUnsortedSegmentSum")
def _unsorted_segment_sum_grad(op, grad):
    # Dropped positions (negative ids) read an appended zero row: multiplying
    # by a 0/1 mask instead would turn NaN/Inf gradients into NaN there, and
    # gathering from an empty grad (num_segments = 0) would fail.
    ids = op.inputs[1]
    padded = tf.concat([grad, tf.zeros(tf.concat([[1], tf.shape(grad)[1:]], 0), grad.dtype)], 0)
    num = tf.cast(tf.shape(grad)[0], ids.dtype)
    # tf.fill: TF 1.x's tf.where does not broadcast.
    return [tf.gather(padded, tf.where(ids >= 0, ids, tf.fill(tf.shape(ids), num))), None, None]


# TensorFlow's GPU split (SplitV) takes floating-point tensors only: integer
# tensors are split as the floats of the same width and bits.
_SPLIT_CARRIERS = {tf.int64: tf.float64, tf.int32: tf.float32}


def split(tensor, sizes, num, name=None):
    """tf.split(tensor, sizes, num=num) along axis 0 that also runs on a GPU
    for int32 and int64 tensors (bits unchanged)."""
    with tf.name_scope(name or "sok_split"):
        tensor = tf.convert_to_tensor(tensor)
        carrier = _SPLIT_CARRIERS.get(tensor.dtype)
        if carrier is None:
            return tf.split(tensor, sizes, num=num)
        parts = tf.split(tf.bitcast(tensor, carrier), sizes, num=num)
        return [tf.bitcast(p, tensor.dtype) for p in parts]


# Tensors whose values are known to be distinct (the rows an owner reads for
# the distinct keys it received): a sparse optimizer then skips its own
# unique and segment sum of their gradient's indices. Kept per graph, by
# tensor name; eager tensors are never marked.
_DISTINCT_ATTR = "_sok_distinct_tensors"


def mark_distinct(tensor):
    """Records that `tensor` (a graph tensor) holds distinct values; returns it."""
    if not tf.executing_eagerly() and hasattr(tensor, "graph"):
        graph = tensor.graph
        if not hasattr(graph, _DISTINCT_ATTR):
            setattr(graph, _DISTINCT_ATTR, set())
        getattr(graph, _DISTINCT_ATTR).add(tensor.name)
    return tensor


def marked_distinct(tensor):
    """Whether mark_distinct recorded `tensor`."""
    graph = getattr(tensor, "graph", None)
    return graph is not None and tensor.name in getattr(graph, _DISTINCT_ATTR, ())


def gather_by_position(rows, positions):
    """tf.gather(rows, positions) along axis 0 for a unique's outputs (rows
    [u, ...] of its distinct values, positions [n] int64, each row read at
    least once), with a gradient of one row per distinct value: each row's
    repeats summed (sum_by_position), in eager and graph mode alike.
    tf.gather's own gradient carries a row per position, which an
    optimizer would deduplicate again, and whose norm (gradient clipping)
    is not the gradient's."""

    @tf.custom_gradient
    def gather(rows):
        def grad(upstream):
            count = tf.shape(rows, out_type=tf.int64)[0]
            if isinstance(upstream, tf.IndexedSlices):  # only some positions' rows
                return sum_by_position(upstream.values, tf.gather(positions, upstream.indices),
                                       count)
            return sum_by_position(upstream, positions, count)

        return tf.gather(rows, positions), grad

    return gather(rows)


def sum_by_position(values, position, count):
    """values [n, ...] summed into `count` rows by position [n], a unique's
    positions (each in [0, count)): the gradient of rows read at repeated
    positions. sok's segment sum, deterministic and the same bits on a CPU
    and a GPU, where it reads nothing back; a hot key repeated hundreds of
    thousands of times in a step (a Zipf stream's) is added in pieces summed
    in parallel. On an H200 it is as fast as TensorFlow's atomic segment sum
    (bench/segment_sum_bench.py)."""
    return unsorted_segment_sum(values, position, count, check_ids=False)


# Ops whose output 0 never repeats a value (the unique ops, and a dynamic
# table's unique find-or-insert).
_UNIQUE_OPS = ("SokUnique", "SokUniqueWithCounts", "Unique", "UniqueWithCounts",
               "SokDynamicTableUniqueFindOrInsert")


def distinct_by_construction(indices):
    """Whether the graph that makes `indices` guarantees distinct values
    (always False for eager tensors): a table's ids from the fused lookup's
    gradient (its first num_tables outputs), output 0 of a unique op, a
    tensor marked with mark_distinct, an identity or reshape of such, or a
    gather of distinct values at distinct positions along axis 0 (the
    gradient of a dynamic table looked up through lookup_sparse: its unique
    keys gathered at the fused gradient's distinct positions). A sparse
    optimizer then needs no unique and segment sum of its own."""
    if tf.executing_eagerly():
        return False
    op = getattr(indices, "op", None)
    if op is None:
        return False
    if op.type == "SokFusedLookupGrad":
        return indices.value_index < op.get_attr("num_tables")
    if op.type in _UNIQUE_OPS:
        return indices.value_index == 0
    if marked_distinct(indices):
        return True
    if op.type in ("Identity", "Reshape"):  # Reshape: a gather's gradient flattens them
        return distinct_by_construction(op.inputs[0])
    if op.type == "GatherV2":
        axis = tf.get_static_value(op.inputs[2])
        batch_dims = op.node_def.attr["batch_dims"].i if "batch_dims" in op.node_def.attr else 0
        return (axis is not None and int(axis) == 0 and batch_dims == 0
                and distinct_by_construction(op.inputs[0])
                and distinct_by_construction(op.inputs[1]))
    return False


def after_read(op):
    """A context whose ops run only after `op`, a forward op that reads rows
    of a table (graph mode): its gradient function builds the gradient in
    it.

    In a TF1 graph nothing else orders that read before the table's update
    in the same step: the update waits for the gradient, and the gradient of
    a read takes the table's handle or keys, not the rows read, so when the
    loss's gradient does not need the forward values either (a loss linear
    in the embeddings, static shapes) the update could run first and the
    read - the loss fetched with the train op - see this step's new rows.
    A tf.function orders them by itself (ops on one resource run in program
    order); eagerly the forward has run already. A GradientTape hands the
    gradient a record of the op, whose outputs lead to it. Skipped where the
    gradient is built in another graph (a while_v2 body) or the read sits in
    a TF1 control-flow context, where a control edge from it cannot be
    drawn."""
    if tf.executing_eagerly():
        return contextlib.nullcontext()
    read = op if hasattr(op, "graph") else _recorded_op(op)
    if read is None or read.graph is not tf.compat.v1.get_default_graph():
        return contextlib.nullcontext()
    context_of = getattr(read, "_get_control_flow_context", None)
    if context_of is not None and context_of() is not None:
        return contextlib.nullcontext()
    return tf.control_dependencies([read])


def _recorded_op(record):
    """The graph op behind a GradientTape's record of it (its outputs are
    that op's), or None."""
    for output in getattr(record, "outputs", None) or ():
        op = getattr(output, "op", None) if output is not None else None
        if op is not None and hasattr(op, "graph"):
            return op
    return None
