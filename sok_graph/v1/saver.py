"""`sok.Saver`, the SOK 1.x way to save and restore one embedding table.

    saver = sok.Saver()
    saver.dump_to_file(layer.embedding_variable, "/ckpt/user_table")
    saver.restore_from_file(layer.embedding_variable, "/ckpt/user_table")
    saver.load_embedding_values(layer.embedding_variable, initial_rows)

Files use sok.dump's format (a directory per table: checked headers,
manifest, written aside and swapped in). Eagerly each call does its work at
once; in graph mode each returns an op that does it when a Session runs it,
so it can sit in a graph next to the training op.
"""

import numpy as np
import tensorflow as tf

from sok_graph import placement
from sok_graph.tables import dimension_of, kind_of, replica_shards
from sok_graph.tables.static import is_sok_variable
from sok_graph.dump_load import check_keys_fit, read_dump, write_dump

_TABLE = "table"  # the one variable in a Saver's dump directory


def _check(var, method):
    if not is_sok_variable(var):
        raise TypeError(f"Saver.{method} takes a sok embedding variable (a layer's "
                        f"embedding_variable, sok.Variable or DynamicVariable); got "
                        f"{getattr(var, 'name', type(var).__name__)!r}")


# A Saver writes one shard as a table of its own, keys in the shard's own
# numbering (key_map: a static shard's local row numbers 0..n-1, a dynamic
# table's keys), as its files always held them.


def _rows(var):
    """(keys, rows) tensors of the whole shard, keys in its own numbering."""
    keys, rows, _ = var.read_all()
    return tf.cast(var.key_map(keys), tf.int64), rows


def _assign(var, keys, rows):
    """Replaces the shard's contents with `rows` of `keys` in its own
    numbering (as _rows gives them): it holds exactly those afterwards."""
    return var.replace_rows(tf.cast(var.global_ids(keys), var.key_dtype), rows)


class Saver:
    """Saves and restores single sok embedding tables (see the module docstring)."""

    def dump_to_file(self, embedding_variable, filepath):
        """Writes the table's keys and rows to the directory `filepath`."""
        _check(embedding_variable, "dump_to_file")
        # One shard: that of the replica being built (inside strategy.run).
        embedding_variable = replica_shards.resolve(embedding_variable, "Saver.dump_to_file")
        path = str(filepath)
        kind = kind_of(embedding_variable)

        def write(keys, rows):
            keys = keys.numpy() if hasattr(keys, "numpy") else keys
            rows = rows.numpy() if hasattr(rows, "numpy") else rows
            write_dump(path, {_TABLE: (kind, {"keys": keys, "values": rows})})
            return np.int32(0)

        keys, rows = _rows(embedding_variable)
        if tf.executing_eagerly():
            write(keys, rows)
            return None
        return tf.group(tf.compat.v1.py_func(write, [keys, rows], tf.int32, stateful=True),
                        name="sok_saver_dump")

    def restore_from_file(self, embedding_variable, filepath):
        """Replaces the table's contents with what dump_to_file wrote to
        `filepath` (checked before anything changes)."""
        _check(embedding_variable, "restore_from_file")
        # One shard: that of the replica being built (inside strategy.run).
        embedding_variable = replica_shards.resolve(embedding_variable, "Saver.restore_from_file")
        var = embedding_variable
        path = str(filepath)
        dim = dimension_of(var)
        # A table of fixed rows holds exactly the shard's rows, numbered 0..n-1.
        fixed = var.fixed_rows
        static_rows = {} if fixed is None else {
            _TABLE: placement.shard_rows(fixed, *var.placement)}

        key_dtype = var.key_dtype

        def read():
            arrays = read_dump(path, {_TABLE: dim}, static_rows)[1][_TABLE]
            keys = arrays["keys"].astype(np.int64)
            check_keys_fit(keys, key_dtype, f"the table restored from {path}")
            return keys, arrays["values"].astype(np.float32)

        if tf.executing_eagerly():
            keys, rows = read()
            _assign(var, tf.constant(keys), tf.constant(rows))
            return None
        keys, rows = tf.compat.v1.py_func(read, [], [tf.int64, tf.float32], stateful=True)
        keys.set_shape([None])
        rows.set_shape([None, dim])
        return tf.group(_assign(var, keys, rows), name="sok_saver_restore")

    def load_embedding_values(self, embedding_variable, tensors):
        """Sets the table from `tensors` (one [rows, dim] tensor or a list of
        them, concatenated): row i becomes key i's embedding. A static table
        must have exactly that many rows."""
        _check(embedding_variable, "load_embedding_values")
        var = embedding_variable
        table = replica_shards.shards_of(var)[0]  # the kind, dimension and rows of every shard
        parts = list(tensors) if isinstance(tensors, (list, tuple)) else [tensors]
        if not parts:
            raise ValueError("tensors must hold at least one [rows, dim] tensor")
        dim = dimension_of(table)
        values = []
        for i, t in enumerate(parts):
            t = tf.convert_to_tensor(t, tf.float32)
            if t.shape.rank != 2 or (t.shape[1] is not None and t.shape[1] != dim):
                raise ValueError(f"tensors[{i}] must be [rows, {dim}] (the table's dimension); "
                                 f"got shape {t.shape}")
            values.append(t)
        rows = tf.concat(values, 0) if len(values) > 1 else values[0]
        n = tf.compat.dimension_value(rows.shape[0])  # a Dimension on TF 1.15
        fixed = table.fixed_rows
        if fixed is not None and n is not None and n != fixed:
            raise ValueError(f"the table has {fixed} rows; tensors hold {n}")
        if fixed is not None and n is None:
            # Known only when the graph runs: checked before any row moves.
            check = tf.debugging.assert_equal(
                tf.shape(rows, out_type=tf.int64)[0], tf.constant(fixed, tf.int64),
                message=f"load_embedding_values: the table has {fixed} rows; tensors must "
                        f"hold as many")
            with tf.control_dependencies([check]):
                rows = tf.identity(rows)
        all_keys = tf.range(tf.shape(rows, out_type=tf.int64)[0])
        ops = []
        # Each worker keeps the rows it owns (each replica's shard, when the
        # replicas of a MirroredStrategy are the workers).
        for shard in replica_shards.shards_of(var):
            keys, owned = placement.owned_rows(shard, all_keys, rows)
            ops.append(shard.import_rows(tf.cast(keys, shard.key_dtype), owned))
        return None if tf.executing_eagerly() else tf.group(*ops,
                                                             name="sok_load_embedding_values")
