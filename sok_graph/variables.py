"""Functions over sok variables that SOK exposes at top level: assign,
export, filter_variables, sparse_read_and_evict.

assign / export act on this worker's shard (with one worker, the table).
A table sharded over the replicas of a MirroredStrategy in one process: the
replica's shard inside strategy.run; outside, export gives every shard's rows
(the process holds them all) and assign needs a replica.
"""

import tensorflow as tf

from sok_graph import placement
from sok_graph.tables import dimension_of, is_dynamic, replica_shards, rows_from_user
from sok_graph.tables.static import is_sok_variable


class BackendError(TypeError, ValueError):
    """A table of the wrong var_type for an operation: SOK raises TypeError
    there; sok_graph raised ValueError before, so it is both."""


def _check_sok(var, fn):
    if not is_sok_variable(var):
        raise TypeError(f"sok.{fn} takes a sok.Variable or sok.DynamicVariable; got "
                        f"{type(var).__name__}")


def assign(var, indices, values):
    """Sets rows: var[indices[i]] = values[i].

    var: sok.Variable (indices are row numbers of this worker's shard) or
      sok.DynamicVariable (indices are keys; missing keys are inserted).
    indices: a vector.
    values: [len(indices), dim], numbers or a tensor of the table's dtype
      (numbers beyond its range are refused, not written as inf).
    """
    _check_sok(var, "assign")
    var = replica_shards.resolve(var, "sok.assign")
    values = rows_from_user(values, tf.as_dtype(var.dtype).base_dtype, "values for sok.assign")
    # An empty Python list becomes float32 in TensorFlow ("indices must be
    # integers; got float32" for no rows at all): no rows are int64 ones.
    indices = tf.convert_to_tensor(indices, tf.int64 if _empty_sequence(indices) else None)
    if is_dynamic(var) and indices.dtype == tf.int32 and var.key_type == tf.int64:
        # A list of small Python ints becomes int32: widened, as
        # sparse_read and sparse_read_and_evict widen them (it was refused).
        indices = tf.cast(indices, tf.int64)
    if indices.shape.rank is not None and indices.shape.rank != 1:
        raise ValueError(f"indices for sok.assign must be a vector of "
                         f"{'keys' if is_dynamic(var) else 'row numbers'}; got shape "
                         f"{indices.shape}")
    # TensorFlow's scatter does not check an empty update's row width.
    dim = dimension_of(var)
    # Plain ints or None: TF 1.15's shapes hold Dimension objects, and its
    # Dimension(None) is not None, so values of unknown shape (a placeholder,
    # a tf.function's [None, None] signature) were refused there.
    n = tf.compat.dimension_value(indices.shape[0]) if indices.shape.rank == 1 else None
    width = tf.compat.dimension_value(values.shape[1]) if values.shape.rank == 2 else None
    count = tf.compat.dimension_value(values.shape[0]) if values.shape.rank == 2 else None
    if values.shape.rank is not None and (
            values.shape.rank != 2 or width not in (None, dim)
            or None not in (n, count) and count != n):
        raise ValueError(f"values for sok.assign must have shape [len(indices), {dim}] "
                         f"(indices has shape {indices.shape}); got shape {values.shape}")
    if is_dynamic(var):
        indices = placement.checked_owned(var, indices, "sok.assign",
                                          "assign each key on the worker that owns it")
        # Its slots drop a key the write evicted (see DynamicVariable._scatter).
        return var.scatter_update(indices, values)
    if not indices.dtype.is_integer:
        raise TypeError(f"indices must be integers; got {indices.dtype.name}")
    if indices.dtype not in (tf.int32, tf.int64):
        # TensorFlow's scatter takes no other: numpy's uint8 / uint64 row
        # numbers failed there with "Value for attr 'Tindices' of uint8 is
        # not in the list of allowed values", naming no argument.
        raise TypeError(f"indices for sok.assign must be int32 or int64 row numbers; got "
                        f"{indices.dtype.name}: cast them first")
    rows = var.shape[0]
    words = f"indices for sok.assign must be in [0, {rows}) (the rows of the variable); got"
    if tf.executing_eagerly():
        if indices.shape[0]:
            bad = tf.logical_or(indices < 0, indices >= rows).numpy()
            if bad.any():
                first = int(bad.argmax())
                raise ValueError(f"{words} {int(indices[first])} at position {first}")
    else:
        # Known when the graph runs: TensorFlow's scatter names no argument
        # on a CPU and drops the write on a GPU.
        check = tf.debugging.Assert(
            tf.reduce_all(tf.logical_and(indices >= 0, indices < rows)), [words, indices],
            summarize=16)
        checks = [check]
        if not (indices.shape.is_fully_defined() and values.shape.is_fully_defined()):
            # Shapes known only when the graph runs (a placeholder, a
            # tf.function's [None, None] signature): TensorFlow's CPU scatter
            # takes rows of another width without a word, writing the values
            # one after another from the row's start (rows [n, dim + 1]
            # spill into the next row, rows [n, 1] set only the first
            # column); vector indices and [len(indices), dim] values are
            # checked before the write. Shapes are padded with -1 so that
            # every rank compares.
            got = tf.concat([tf.shape(indices, out_type=tf.int64), tf.constant([-1], tf.int64),
                             tf.shape(values, out_type=tf.int64),
                             tf.constant([-1] * 5, tf.int64)], 0)[:5]
            want = tf.stack([tf.size(indices, out_type=tf.int64), tf.constant(-1, tf.int64),
                             tf.size(indices, out_type=tf.int64), tf.constant(dim, tf.int64),
                             tf.constant(-1, tf.int64)])
            checks.append(tf.debugging.Assert(
                tf.reduce_all(tf.equal(got, want)),
                [f"sok.assign takes indices as a vector and values of shape [len(indices), "
                 f"{dim}] (one row of the table's dimension per index); the shapes of indices "
                 f"and values are", tf.shape(indices), tf.shape(values)]))
        with tf.control_dependencies(checks):
            indices = tf.identity(indices)
            values = tf.identity(values)
    return var.scatter_update(tf.IndexedSlices(values, indices))


def _empty_sequence(value):
    return isinstance(value, (list, tuple)) and len(value) == 0


def export(var):
    """(indices, values) of every row this worker holds: global row numbers
    and rows of a sok.Variable (local row r of a distributed table on worker
    w of N is global row r * N + w), keys and rows of a sok.DynamicVariable."""
    _check_sok(var, "export")
    if isinstance(var, replica_shards.ReplicaShards):
        if not replica_shards.in_replica():
            parts = [export(shard) for shard in var.shards]
            return (tf.concat([k for k, _ in parts], 0), tf.concat([v for _, v in parts], 0))
        var = var.shard("sok.export")
    keys, rows, _ = var.export_chunk(0, 1 << 62)
    return keys, rows


def filter_variables(vars):  # noqa: A002 (SOK's argument name)
    """(sok_variables, other_variables) from a list of variables, each
    variable once."""
    return split_variables(vars, "sok.filter_variables", "vars")


def split_variables(variables, what, argument):
    """The sok variables among `variables` and the others, as lists in their
    order, each variable once (`what` and `argument` name the caller and its
    argument in errors).

    TF 1.15's Keras lists a variable that a model holds in a list attribute
    twice in model.trainable_variables (at its place and at the end): the
    same gradient was then applied twice, a double step without an error."""
    # One variable, tensor, string or dict in place of the list was iterated
    # without an error: a sok.Variable gave its rows as "other variables" and
    # no sok variable (an optimizer then trained neither), a dict its keys.
    if (isinstance(variables, (str, bytes, dict)) or tf.is_tensor(variables)
            or is_sok_variable(variables) or isinstance(variables, tf.Variable)
            or variables is None or not hasattr(variables, "__iter__")):
        single = (is_sok_variable(variables) or isinstance(variables, tf.Variable)
                  or tf.is_tensor(variables))
        raise TypeError(f"{what} takes a list of variables (e.g. "
                        f"model.trainable_variables); got {type(variables).__name__}"
                        + (": put a single variable in a list" if single else ""))
    sok_vars, others, seen = [], [], set()
    for i, v in enumerate(variables):
        # A nested list (a list of the lists of two models) put every sok
        # variable inside it among the others.
        if isinstance(v, (list, tuple, dict, str, bytes)):
            raise TypeError(f"{what} takes a flat list of variables; {argument}[{i}] "
                            f"is a {type(v).__name__}" + (
                                ": concatenate the lists first" if isinstance(v, (list, tuple))
                                else ""))
        if id(v) not in seen:
            seen.add(id(v))
            (sok_vars if is_sok_variable(v) else others).append(v)
    return sok_vars, others


def sparse_read_and_evict(var, indices, name=None):
    """SOK's read of a bounded table that hands back what it evicted:
    (rows, evicted_keys, evicted_rows).

    var: a DynamicVariable with var_type="hybrid" (a bounded table).
    indices: keys of any shape (int32 keys of an int64 table are widened), or
      a RaggedTensor of keys.
    rows: the rows of `indices` (indices' shape + [dimension], ragged for
      ragged indices), missing keys inserted as a lookup does;
      differentiable, like a lookup.
    evicted_keys [m], evicted_rows [m, dimension]: the entries the table
      evicted to make room for the new keys (keys of this call are never
      evicted), e.g. to move them to another store; optimizer slots of the
      table drop those keys as they do on any eviction.
    """
    # A table sharded over MirroredStrategy replicas: the replica's shard.
    var = replica_shards.resolve(var, "sok.sparse_read_and_evict")
    if not is_dynamic(var):
        raise TypeError("sok.sparse_read_and_evict takes a sok.DynamicVariable; got "
                        f"{type(var).__name__}")
    if var.var_type != "hybrid":
        raise BackendError("sok.sparse_read_and_evict needs a bounded table "
                           "(var_type='hybrid'); got var_type='hbm'")
    ragged = indices if isinstance(indices, tf.RaggedTensor) else None
    with tf.name_scope(name or "sparse_read_and_evict"):
        rows, evicted_keys, evicted_rows = var.read_evicting(
            ragged.flat_values if ragged is not None else indices)
        if ragged is not None:
            rows = ragged.with_flat_values(rows)
        return rows, evicted_keys, evicted_rows
