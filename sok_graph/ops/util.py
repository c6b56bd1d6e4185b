"""Unique-with-counts and a deterministic unsorted segment sum (tf_ops/util)."""

import tensorflow as tf

from sok_graph import _ops
from sok_graph.compat import register_gradient


def unique_with_counts(x, out_idx=tf.int32, name=None):
    """As ``tf.unique_with_counts``: (y, idx, count), y in order of first appearance.

    x: [n] int32/int64.
    """
    return _ops.load().sok_unique_with_counts(x, out_idx=out_idx, name=name)


def unsorted_segment_sum(data, segment_ids, num_segments, name=None):
    """As ``tf.math.unsorted_segment_sum`` with 1-D segment_ids, deterministic.

    data: [n, ...]; segment_ids: [n] (negative ids are dropped); returns
    [num_segments, ...].
    """
    return _ops.load().sok_unsorted_segment_sum(data, segment_ids, num_segments, name=name)


@register_gradient("SokUnsortedSegmentSum")
def _unsorted_segment_sum_grad(op, grad):
    ids = op.inputs[1]
    rows = tf.gather(grad, tf.maximum(ids, 0))
    keep = tf.cast(ids >= 0, grad.dtype)
    keep = tf.reshape(keep, tf.concat([tf.shape(ids), tf.ones([tf.rank(grad) - 1], tf.int32)], 0))
    return [rows * keep, None, None]
