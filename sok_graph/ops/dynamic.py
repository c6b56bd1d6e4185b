"""The dynamic-table ops (tf_ops/dynamic): a hash-table resource from int32 /
int64 keys to float rows, plus the gradient that turns a lookup's gradient
into (unique keys, summed rows) for the table."""

import tensorflow as tf

from sok_graph import compat, initializers
from sok_graph.ops import library
from sok_graph.ops import util as util_ops
from sok_graph.compat import IndexedSlices, register_gradient

INT64_MIN = -(2 ** 63)
# The most rows one table can hold (kMaxEntries of tf_ops/dynamic/core/dynamic_table.h).
MAX_ROWS = (2 ** 31 - 1) // 2


def _warn_if_local_time_is_not_utc(value, what):
    """A naive datetime is UTC here (SOK's convention: datetime.utcnow()),
    where Python's own timestamp() takes it as local time: on a machine
    whose local time is not UTC, datetime.now() given by mistake shifted the
    threshold by the UTC offset without a word (a dump of nothing, or of too
    much). A warning there, naming the offset."""
    import warnings

    offset = value.astimezone().utcoffset() if value.year > 1970 else None
    if offset:
        hours = offset.total_seconds() / 3600
        warnings.warn(
            f"{what}={value!r} has no time zone and is taken as UTC (SOK's convention, "
            f"datetime.utcnow()); this machine's local time is UTC{hours:+g} h, so a "
            f"datetime.now() would be {abs(hours):g} h off: pass an aware datetime "
            f"(datetime.now(timezone.utc)) to mean a moment unambiguously", stacklevel=4)


def utc_micros(value, what):
    """A time for the tables' per-key timestamps, as int64 UTC microseconds:
    a datetime (naive ones are taken as UTC, with a warning where the
    machine's local time is not UTC), or a number of microseconds
    since the epoch (an int, or a finite float such as time.time() * 1e6,
    taken down to the microsecond). `what` names the argument in errors."""
    import datetime
    import math

    import numpy as np

    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            _warn_if_local_time_is_not_utc(value, what)
            value = value.replace(tzinfo=datetime.timezone.utc)
        return int(round(value.timestamp() * 1e6))
    # bool is an int to Python, but True / False as a time is a mistake.
    if isinstance(value, (bool, np.bool_)) or not isinstance(
            value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{what} must be a datetime (UTC) or a number of microseconds since "
                        f"the epoch; got {type(value).__name__}")
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(value):
            raise ValueError(f"{what} must be a finite number of microseconds since the epoch; "
                             f"got {value}")
        value = math.floor(value)
    micros = int(value)
    if not INT64_MIN <= micros < 2 ** 63:
        raise ValueError(f"{what} must fit in int64 microseconds since the epoch; got {micros}")
    return micros
INITIALIZERS = ("normal", "truncated_normal", "uniform", "zeros", "constant")
EVICTIONS = ("lru", "lfu")


def handle(shared_name, container=""):
    """A resource handle [] for the table named `shared_name`."""
    return library.load().sok_dynamic_table_handle(container=container, shared_name=shared_name)


def create(table, key_dtype, dim, init=None, init_capacity=0, max_capacity=0, max_bytes=0,
           eviction="lru", hbm_bytes=-1, table_name=""):
    """Creates the table behind `table` if it does not exist yet (an op in graph mode).
    init: the rows' initializer, a spec of sok_graph/initializers.py (what
    initializer_spec gives; keys it lacks take DEFAULT's values).
    max_capacity / max_bytes bound the rows (0: no bound); hbm_bytes is how
    many bytes of rows a GPU table keeps in device memory (-1: all), the rest
    in pinned host memory. table_name: what the table's errors call it (its
    variable's name; an eager table's handle has a random one)."""
    unknown = sorted(set(init or {}) - set(initializers.DEFAULT))
    if unknown:
        raise ValueError(f"init has keys {unknown} that no initializer spec has; its keys are "
                         f"{sorted(initializers.DEFAULT)}")
    init = dict(initializers.DEFAULT, **(init or {}))
    return library.load().sok_dynamic_table_create(
        table, key_dtype=key_dtype, dim=int(dim), initializer=init["initializer"],
        init_mean=float(init["mean"]), init_stddev=float(init["stddev"]),
        init_minval=float(init["minval"]), init_maxval=float(init["maxval"]),
        init_value=float(init["value"]), seed=int(init["seed"]),
        init_capacity=int(init_capacity), max_capacity=int(max_capacity),
        max_bytes=int(max_bytes), hbm_bytes=int(hbm_bytes), eviction=eviction,
        table_name=str(table_name))


def is_initialized(table):
    return library.load().sok_dynamic_table_is_initialized(table)


def find_or_insert(table, keys, dim):
    """(rows [n, dim] float32, num_evicted): rows of keys, missing ones inserted."""
    return find_or_insert_evicting(table, keys, dim)[:2]


def find_or_insert_evicting(table, keys, dim):
    """(rows, num_evicted, evicted_keys, evicted_rows [m, dim]): as
    find_or_insert, plus the entries that were evicted to make room."""
    return library.load().sok_dynamic_table_find_or_insert(table, keys, dim=int(dim))


def unique_find_or_insert(table, keys, dim, name=None):
    """(unique_keys [u], positions [n] int64, rows [u, dim], num_evicted,
    evicted_keys): tf.unique of 1-D keys and find_or_insert of the distinct
    ones, in one op (one wait for the device on a GPU)."""
    return library.load().sok_dynamic_table_unique_find_or_insert(table, keys, dim=int(dim),
                                                                   name=name)


def find(table, keys, dim, default_value=0.0):
    """(rows [n, dim], found [n] bool) for inference; inserts nothing."""
    return library.load().sok_dynamic_table_find(
        table, keys, tf.cast(default_value, tf.float32), dim=int(dim))


def scatter(table, keys, rows, mode):
    """row(key) += / -= / = rows ('add' / 'sub' / 'update'); returns num_evicted."""
    return library.load().sok_dynamic_table_scatter(table, keys, rows, mode=mode)


def sparse_apply(table, slots, keys, grads, hyper, step, algorithm, tf1=False,
                 keras_optimizer_v2=False, nesterov=False):
    """One fused optimizer step for distinct `keys` of `table` and its slot
    tables (SokDynamicSparseApply; see sok_graph/optimization/fused_apply.py)."""
    return library.load().sok_dynamic_sparse_apply(
        table, keys, grads, hyper, step, list(slots), algorithm=algorithm, tf1=bool(tf1),
        keras_optimizer_v2=bool(keras_optimizer_v2), nesterov=bool(nesterov))


def add_shadow(table, shadow):
    """Makes dynamic table `shadow` drop every key `table` evicts or removes
    (SokDynamicTableAddShadow)."""
    return library.load().sok_dynamic_table_add_shadow(table, shadow)


def remove(table, keys):
    return library.load().sok_dynamic_table_remove(table, keys)


def stats(table):
    """(size, row_limit, evicted_total, memory_bytes), int64 scalars."""
    return library.load().sok_dynamic_table_stats(table)


def export(table, key_dtype, dim, offset=0, limit=1 << 20, updated_after=INT64_MIN):
    """(keys, rows, timestamps, frequencies, next_offset) of one chunk;
    offset, limit and updated_after numbers or int64 scalar tensors."""
    return library.load().sok_dynamic_table_export(
        table, tf.cast(offset, tf.int64), tf.cast(limit, tf.int64),
        tf.cast(updated_after, tf.int64), Tkeys=key_dtype, dim=int(dim))


def import_rows(table, keys, rows, timestamps=None, frequencies=None, replace=False):
    """Inserts or overwrites rows; with replace=True the table holds exactly
    these rows afterwards, swapped in at once (no op sees it empty)."""
    empty = tf.zeros([0], tf.int64)
    return library.load().sok_dynamic_table_import(
        table, keys, rows,
        empty if timestamps is None else tf.cast(timestamps, tf.int64),
        empty if frequencies is None else tf.cast(frequencies, tf.int64), replace=bool(replace))


def clear(table):
    return library.load().sok_dynamic_table_clear(table)


def _rows_grad(grad, keys):
    """The gradient of rows [k, dim] of `keys` [k]: the table's IndexedSlices.
    Built in a graph of its own (a tf.function differentiated by a tape
    outside it), its indices are made there (an identity of the keys): the
    forward tensor returned as it is failed the gradient's build ("Node with
    id 4 is different from the passed in node")."""
    if isinstance(grad, tf.IndexedSlices):
        return IndexedSlices(grad.values, tf.gather(keys, grad.indices))
    if not tf.executing_eagerly() and _graph_of(keys) not in (None,
                                                              tf.compat.v1.get_default_graph()):
        keys = tf.identity(keys)
    return IndexedSlices(grad, keys)


def _graph_of(tensor):
    """A graph tensor's graph; None for an eager tensor (an eager read's
    keys, differentiated inside a tf.function), which is captured as it is."""
    try:
        return tensor.graph
    except AttributeError:
        return None


def _refuse_unsupported_control_flow(op):
    """A NotImplementedError where the gradient of `op`, a read of a dynamic
    table, goes through a loop or a cond that cannot carry it:

    - a TF1 (control flow v1) tf.while_loop sums a variable's gradient from
      a first zero row at index 0, in a buffer whose row width it reads from
      the variable's recorded shape: tf.gradients failed with "Operation
      '.../SokDynamicTableHandle' has no attr named 'shape'", and that zero
      row would insert key 0 into the table;
    - a TF1 tf.cond merges its branches' gradients, a dynamic table's
      IndexedSlices with the other branch's zeros or IndexedSlices:
      TensorFlow's "The two structures don't have the same nested structure";
    - a tf.cond of v2 control flow (an `if` on a tensor in a tf.function)
      differentiated by a GradientTape around it makes a zero gradient of
      the variable's dense shape for the branch not taken: TensorFlow's
      "Internal error: Tried to take gradients (or similar) of a variable
      without handle data".

    (A v2 tf.while_loop gives such a table no gradient at all, without
    calling this one: sok's optimizers refuse that None, see
    DynamicVariable.refuse_a_gradient_lost_in_a_loop.)"""
    if compat.in_v1_while_loop(op):
        raise NotImplementedError(
            f"the gradient of a dynamic table read inside a TF1 tf.while_loop (op "
            f"'{op.name}') is not supported: TensorFlow's loop sums a variable's gradient "
            f"in a buffer of the variable's dense shape, which a dynamic table has not. "
            f"Read its rows outside the loop (one lookup of all the keys, then tf.gather "
            f"inside), or unroll the loop in Python")
    if compat.in_v1_cond(op):
        # TensorFlow's v1 cond gradient failed merging the branches'
        # gradients ("The two structures don't have the same nested
        # structure"), naming neither the table nor the read.
        raise NotImplementedError(
            f"the gradient of a dynamic table read inside a TF1 tf.cond branch (op "
            f"'{op.name}') is not supported: TensorFlow's cond gradient merges the branches' "
            f"gradients as dense tensors of the variable's shape, which a dynamic table has "
            f"not. Read its rows before the tf.cond (and tf.gather them in the branch)")
    if compat.building_a_cond_gradient():
        raise NotImplementedError(
            f"the gradient of a dynamic table read inside a tf.cond branch (op '{op.name}'), "
            f"taken by a GradientTape around the tf.cond, is not supported: TensorFlow's "
            f"cond gradient makes a zero gradient of the variable's dense shape, which a "
            f"dynamic table has not. Read its rows before the tf.cond (and tf.gather them "
            f"in the branch), or take the gradient inside the branch")


@register_gradient("SokDynamicTableFind")
def _find_grad(op, *unused_grads):
    """A find reads rows for inference (DynamicVariable.find, and the reads
    inside a Keras model's predict_step / test_step): it inserts nothing,
    so there is nothing to train. TensorFlow's "gradient registry has no
    entry" named neither the table nor why."""
    raise LookupError(
        f"the rows of a dynamic table read for inference (op '{op.name}': DynamicVariable.find, "
        f"or a read inside a Keras model's predict_step or test_step, which inserts no key) "
        f"have no gradient: read the rows for training outside predict and evaluate (a "
        f"tf.function traced there and reused in training keeps its inference reads: give "
        f"training a tf.function of its own)")


@register_gradient("SokDynamicTableFindOrInsert")
def _find_or_insert_grad(op, grad, *unused_grads_of_eviction_outputs):
    """The gradient of the rows, addressed by key. With keys deduplicated
    before the lookup the indices are unique. The keys are taken once the
    lookup has run (util_ops.after_read): the table's update, which waits
    for them, then never runs before the read of the same step."""
    _refuse_unsupported_control_flow(op)
    with util_ops.after_read(op):
        keys = tf.identity(op.inputs[1])
    return [_rows_grad(grad, keys), None]


@register_gradient("SokDynamicTableUniqueFindOrInsert")
def _unique_find_or_insert_grad(op, unused_keys_grad, unused_positions_grad, grad,
                                *unused_grads_of_eviction_outputs):
    """The gradient of the rows, addressed by the op's distinct keys (its
    output 0, which the GPU table also remembers as present: the optimizer's
    write-back of exactly that tensor needs no insert)."""
    _refuse_unsupported_control_flow(op)
    return [_rows_grad(grad, op.outputs[0]), None]
