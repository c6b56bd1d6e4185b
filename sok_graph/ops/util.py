"""Unique (with or without counts) and a deterministic unsorted segment sum
(tf_ops/util)."""

import tensorflow as tf

from sok_graph.ops import library
from sok_graph.compat import register_gradient


def unique(x, out_idx=tf.int32, name=None):
    """As ``tf.unique``: (y, idx), y in order of first appearance.

    x: [n] int32/int64. Cheaper than unique_with_counts on a GPU (no counts).
    """
    return library.load().sok_unique(x, out_idx=out_idx, name=name)


def unique_with_counts(x, out_idx=tf.int32, name=None):
    """As ``tf.unique_with_counts``: (y, idx, count), y in order of first appearance.

    x: [n] int32/int64.
    """
    return library.load().sok_unique_with_counts(x, out_idx=out_idx, name=name)


def unsorted_segment_sum(data, segment_ids, num_segments, name=None):
    """As ``tf.math.unsorted_segment_sum`` with 1-D segment_ids, deterministic.

    data: [n, ...]; segment_ids: [n] (negative ids are dropped); returns
    [num_segments, ...].
    """
    return library.load().sok_unsorted_segment_sum(data, segment_ids, num_segments, name=name)


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
