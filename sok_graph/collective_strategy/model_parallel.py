"""embedding_scope()'s patch: a partitioned get_variable of a [rows, dim]
table makes one sok.Variable sharded over the workers (an ordinary one on export).
"""

import tensorflow as tf

from sok_graph import context
from sok_graph.tables.static import Variable as _SokVariable
from sok_graph.tables.static import is_sok_variable

from .export import _exporting
from .patching import _bound, _originals, _tf_modules


def _store_get_variable(store, *args, **kwargs):
    orig = _originals()["store_get_variable"]
    a = _bound(orig, (store,) + args, kwargs)
    shape = a["shape"]
    partitioner = a["partitioner"]
    if partitioner is None or shape is None or len(tf.TensorShape(shape)) != 2:
        return orig(store, *args, **kwargs)
    parts = _partition_rows(partitioner, shape, a["dtype"])
    if _exporting():
        # The serving graph holds the whole table as one ordinary variable.
        a["partitioner"] = None
        a.pop("self")
        var = orig(store, **a)
        var._sok_partition_rows = parts
        return var
    from tensorflow.python.ops import variable_scope

    name, dtype = a["name"], tf.as_dtype(a["dtype"])
    reuse = a["reuse"]
    existing = store._vars.get(name)
    if existing is not None:
        if reuse is True or reuse == variable_scope.AUTO_REUSE:
            if not is_sok_variable(existing):
                raise ValueError(f"variable {name!r} exists and is not a sok variable; it "
                                 "cannot be reused as a model-parallel table")
            _refuse_another_shape_or_dtype(existing, name, shape, dtype)
            return existing
        raise ValueError(f"Variable {name} already exists, disallowed. Did you mean to set "
                         "reuse=True or reuse=tf.compat.v1.AUTO_REUSE in VarScope?")
    if reuse is True:
        raise ValueError(f"Variable {name} does not exist, or was not created with "
                         "tf.compat.v1.get_variable(). Did you mean to set "
                         "reuse=tf.compat.v1.AUTO_REUSE in VarScope?")
    if dtype.base_dtype not in _TABLE_DTYPES:
        # It was made, and its first lookup failed naming neither it nor
        # the argument; plain TensorFlow looks up a float64 table.
        raise TypeError(f"variable {name!r}: a model-parallel table (a partitioned "
                        f"get_variable under CollectiveStrategy.embedding_scope) holds "
                        f"{', '.join(d.name for d in _TABLE_DTYPES)} rows; got dtype "
                        f"{dtype.base_dtype.name}")
    full_shape = tf.TensorShape(shape).as_list()
    if None in full_shape:
        raise ValueError(f"variable {name!r}: a model-parallel table needs a fully defined "
                         f"[rows, dim] shape; got {full_shape}")
    initializer = a["initializer"]
    with tf.compat.v1.name_scope(None), tf.compat.v1.name_scope(name + "/Initializer/"):
        if initializer is None:
            initializer = tf.compat.v1.glorot_uniform_initializer()
        if isinstance(initializer, type):
            initializer = initializer(dtype=dtype)
        if callable(initializer):
            value = initializer(full_shape, dtype=dtype)
        else:
            value = tf.convert_to_tensor(initializer, dtype=dtype)
            if value.shape.as_list() != full_shape:
                raise ValueError(f"variable {name!r}: the initializer's value has shape "
                                 f"{value.shape.as_list()}, the variable {full_shape}")
        value = tf.convert_to_tensor(value, dtype=dtype)
    trainable = a["trainable"]
    if trainable is None:
        trainable = a["synchronization"] != tf.VariableSynchronization.ON_READ
    with tf.compat.v1.name_scope(None):
        var = _SokVariable(initial_value=value, mode="distributed", name=name, dtype=dtype,
                           trainable=trainable, collections=a["collections"],
                           caching_device=a["caching_device"], constraint=a["constraint"])
    var._sok_partition_rows = parts
    var._sok_full_shape = full_shape
    store._vars[name] = var
    if a["regularizer"] is not None:
        with tf.compat.v1.name_scope(None), tf.compat.v1.name_scope(name + "/Regularizer/"):
            loss = a["regularizer"](var)
            if loss is not None:
                # The regularizer sees this worker's shard, and the sok
                # table's gradient is divided by the workers' number
                # (data_parallel._average_gradients: the all-to-all summed
                # every worker's batch into it). N times the shard's loss
                # makes the workers' mean loss the whole table's, and its
                # gradient one process's: with N workers the table was
                # regularized N times weaker, without a word.
                comm = context.active()
                world = 1 if comm is None else comm.world_size
                if world > 1:
                    loss = loss * tf.cast(world, loss.dtype)
        if loss is not None:
            tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.REGULARIZATION_LOSSES, loss)
    return var


_TABLE_DTYPES = (tf.float32, tf.float16, tf.bfloat16)


def _refuse_another_shape_or_dtype(existing, name, shape, dtype):
    """ValueError where a reuse asks for another shape or dtype than the
    table has, as plain TensorFlow refuses the reuse of a partitioned
    variable (the table was returned as it was: a [16, 8] request got the
    [10, 3] table, a float16 one the float32 table)."""
    full = getattr(existing, "_sok_full_shape", None)
    if full is not None and not tf.TensorShape(shape).is_compatible_with(full):
        raise ValueError(f"Trying to reuse partitioned variable {name}, but specified shape "
                         f"{tf.TensorShape(shape)} and found shape {tf.TensorShape(full)}.")
    found = tf.as_dtype(existing.dtype).base_dtype
    if not dtype.base_dtype.is_compatible_with(found):
        raise ValueError(f"Trying to reuse partitioned variable {name}, but specified dtype "
                         f"{dtype.base_dtype.name} and found dtype {found.name}.")


def _partition_rows(partitioner, shape, dtype):
    """The row counts of the parts plain TensorFlow would make: the table's rows
    split in order, the first `rows % n` parts one row longer. A 'mod' lookup
    addresses rows through this layout (lookups.partitioned_rows)."""
    shape = tf.TensorShape(shape)
    try:
        counts = list(partitioner(shape=shape, dtype=tf.as_dtype(dtype or tf.float32)))
    except (TypeError, ValueError):
        return None  # the partitioner itself rejects the call later, as plain TF
    n = int(counts[0]) if counts else 1
    rows = shape.as_list()[0]
    if rows is None or n <= 1:
        return None
    return [rows // n + (1 if i < rows % n else 0) for i in range(n)]


def _embedding_patches():
    variable_scope = _tf_modules()[1]
    return [(variable_scope._VariableStore, "get_variable", _store_get_variable)]
