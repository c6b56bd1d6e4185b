"""Serving tables: what stands for a sok table in a servable model, built
from stock TensorFlow ops only.

StaticTable   a sok.Variable's whole table as one plain variable [rows, dim];
              ids are global row numbers, read with tf.gather.
DynamicTable  a sok.DynamicVariable as three plain variables:
                keys   [n]        every key, sorted ascending
                index  [n]        the row of rows holding keys[i]
                rows   [m, dim]   row 0 is the default row (keys the table
                                  does not hold), then every key's row
              A lookup is a binary search (tf.searchsorted) in keys, then a
              gather in rows. A delta (apply_delta, plain TF too) appends
              its rows and then points keys and index at them, so that a
              lookup running meanwhile sees the table before it or after
              it (DynamicTable.find, apply_delta say how).

Both answer the read part of the table protocol (sok_graph/tables/__init__.py)
as the training tables do: dimension, dtype, key_dtype, row_count() and
export_chunk(offset, limit) -> (keys, rows, next offset), keys being a
StaticTable's row numbers (int64) and a DynamicTable's keys in the order it
holds them (ascending). They keep no write times, so updated_after is
refused. They say no table_kind: that names the training code path a table
takes (optimizer, dump and load, the fused lookup), which a serving table
cannot take; `kind` is what a served model's manifest records.

`combine` is the forward pass of sok.lookup_sparse (sum / mean / sqrtn,
weights, max_norm) from gather and segment ops, as the fused kernel computes
it (float32 accumulation; samples without ids, or whose weights sum to zero,
give zero rows).
"""

import uuid

import numpy as np
import tensorflow as tf

from sok_graph import compat, dump_load


def _variable(initial_value, shape, name):
    """A plain resource variable (also in TF1 graphs), not trainable."""
    return compat.resource_variable_class()(initial_value=initial_value, shape=shape,
                                            trainable=False, name=name)


def safe_name(name):
    """`name` with only characters variable and file names take: the file
    stem a dump gives it (dump_load._file_stem, the one place that cleanup
    is written), "table" for an empty name."""
    return dump_load._file_stem(name) or "table"


def scope_name(name):
    """safe_name(name) with only the characters a TensorFlow name scope
    takes (ASCII letters, digits, "._-"), every other one "_": the name
    scope of a serving table's variables. A table named "café" or "用户" (a
    name a file, JSON and a delta keep) failed its export with TensorFlow's
    "not a valid root scope name" after the tables were read. ASCII names
    are safe_name's, so variable names stay what they were."""
    return "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_"
                   for c in safe_name(name))


def default_row_value(default_row, name, dim, dtype):
    """The row a DynamicTable returns for a key it does not hold: zeros, or
    default_row (a number, a [dim] vector, or {table name: either})."""
    if isinstance(default_row, dict):
        default_row = default_row.get(name)
    if default_row is None:
        default_row = 0.0
    row = np.asarray(default_row, dtype=np.float64)
    if row.ndim == 0:
        row = np.full([dim], float(row))
    if row.shape != (dim,):
        raise ValueError(f"default row of table {name!r} must be a number or a vector of "
                         f"{dim} (the table's dimension); got shape {list(row.shape)}")
    with np.errstate(over="ignore"):
        served = row.astype(tf.as_dtype(dtype).as_numpy_dtype)
    if not (np.isfinite(row).all() and np.isfinite(served.astype(np.float64)).all()):
        # Every key the table lacks was served inf or nan (1e39 overflows
        # float32), as no filter_default or delta row may be.
        raise ValueError(f"default_row of table {name!r} must be finite in the table's dtype "
                         f"{tf.as_dtype(dtype).name}; got {default_row!r}")
    return served


# What apply_delta_fn (apply_delta, as the function a TF2 export holds for
# each table) does not do that apply_serving_delta does, and why.
_NO_RECORD = """
As the export's apply_delta_fn it records no delta and cannot refuse one
applied twice, out of order or after a gap, as apply_serving_delta does:
it runs in the serving process on the loaded model's variables, in memory
(the export on disk, where apply_serving_delta keeps its record in
assets.extra/sok_deltas.json, is not written, and a reload starts from the
export again), and its signature, (keys, rows), which servers without
sok_graph call, carries no delta's id, since or created to check. The
server keeps that order: apply a delta once, deltas in the order they were
exported (created ascending), and only one whose since is at or before the
created of the last one applied, or of the export
(assets.extra/sok_serving.json)."""


def _traced(method, signatures):
    """A tf.function of `method`, traced for each signature in order: the
    SavedModel keeps them in that order, and a loaded model's call takes the
    first whose types its arguments have, else the first they convert to."""
    function = tf.function(method)
    for signature in signatures:
        function.get_concrete_function(*signature)
    return function


def _keeps_no_record(apply_delta):
    """Adds _NO_RECORD to the docstring of a serving table's apply_delta."""
    apply_delta.__doc__ = apply_delta.__doc__.rstrip() + "\n" + \
        "\n".join("        " + line if line else line for line in _NO_RECORD.split("\n"))
    return apply_delta


class StaticTable(tf.Module):
    """A sok.Variable's whole table, served from a plain variable."""

    kind = "static"

    def __init__(self, table_name, variable=None, shape=None, dtype=tf.float32):
        super().__init__()
        self.table_name = table_name
        if variable is None:
            with tf.name_scope("sok_serving/" + scope_name(table_name)):
                shape = tf.TensorShape(shape)
                start = [0 if d is None else d for d in shape.as_list()]
                variable = _variable(tf.zeros(start, dtype), shape, "rows")
        self.rows = variable
        self.dimension = int(self.rows.shape[1])
        self.key_dtype = tf.int64
        self.dtype = tf.as_dtype(self.rows.dtype).base_dtype

    def variables_by_role(self):
        return {"rows": self.rows}

    def lookup(self, ids):
        """Rows [n, dim] of global row numbers `ids` [n]; an id outside
        [0, rows) fails, as in training, on any device (a GPU's tf.gather
        gives zeros for it)."""
        ids = tf.cast(ids, tf.int64)
        rows = tf.shape(self.rows, out_type=tf.int64)[0]
        outside = tf.logical_or(ids < 0, ids >= rows)
        check = tf.debugging.Assert(
            tf.logical_not(tf.reduce_any(outside)),
            [f"ids of served table {self.table_name!r} must be in [0, rows) (rows:", rows,
             "); got", tf.boolean_mask(ids, outside)], summarize=3)
        with tf.control_dependencies([check]):
            return tf.gather(self.rows, ids)

    @_keeps_no_record
    def apply_delta(self, keys, rows):
        """Overwrites the rows of global row numbers `keys`; returns their
        number. Refuses (InvalidArgumentError naming the table, nothing
        written) what apply_serving_delta refuses of the keys and rows
        themselves: keys and rows that do not pair, a row id outside
        [0, rows) or given twice, a NaN or infinite value (also one that
        becomes infinite in the table's dtype)."""
        keys = _distinct(tf.cast(keys, tf.int64), self.table_name, "row ids")
        rows = _finite(tf.cast(_paired(keys, rows, self.table_name), self.dtype),
                       self.table_name)
        count = self.row_count()
        inside = tf.debugging.Assert(
            tf.reduce_all(tf.logical_and(keys >= 0, keys < count)),
            [f"apply_delta_fn of table '{self.table_name}': delta row ids must be in "
             f"[0, rows of the table); the rows of the table and the smallest and largest "
             f"id are", count, tf.reduce_min(keys), tf.reduce_max(keys)])
        with tf.control_dependencies([inside]):
            update = self.rows.scatter_update(tf.IndexedSlices(rows, keys))
        with tf.control_dependencies([_as_op(update)]):
            return tf.size(keys, out_type=tf.int64)

    def serving_functions(self):
        """(lookup_fn, apply_delta_fn) of the loaded model (_traced)."""
        return (_traced(self.lookup, [[tf.TensorSpec([None], tf.int64, name="keys")]]),
                _traced(self.apply_delta, [[tf.TensorSpec([None], tf.int64, name="keys"),
                                            tf.TensorSpec([None, self.dimension], self.dtype,
                                                          name="rows")]]))

    def row_count(self):
        """The rows the table holds, an int64 scalar (the table protocol)."""
        return tf.shape(self.rows, out_type=tf.int64)[0]

    def export_chunk(self, offset, limit, updated_after=None):
        """(row numbers int64, rows, next_offset) of rows [offset, offset +
        limit), as a sok.Variable gives them: next_offset is min(offset +
        limit, row_count()). The table is whole, so its row numbers are the
        global ones a sok.Variable gives. updated_after must be None."""
        _refuse_updated_after(self, updated_after)
        offset = tf.cast(offset, tf.int64)
        # min(offset + limit, count) without the sum, which a limit meant
        # as "everything" (1 << 62 and up) would overflow.
        end = offset + tf.minimum(tf.cast(limit, tf.int64), self.row_count() - offset)
        numbers = tf.range(offset, tf.maximum(end, offset), dtype=tf.int64)
        return numbers, tf.gather(self.rows, numbers), end


def _refuse_updated_after(table, updated_after):
    """ValueError unless updated_after is None. A serving table keeps no
    write times (an export copies rows only and apply_delta stamps none), so
    "the rows written since" has no answer; giving every row instead would
    pass a whole table off as a delta."""
    if updated_after is not None:
        raise ValueError(f"serving table {table.table_name!r} keeps no write times: "
                         f"updated_after must be None; got updated_after={updated_after!r}")


def _paired(keys, rows, table):
    """rows, after a check that there is one row per key (a delta's keys [n]
    and rows [n, dimension])."""
    check = tf.debugging.assert_equal(
        tf.size(keys, out_type=tf.int64), tf.shape(rows, out_type=tf.int64)[0],
        message=f"apply_delta_fn of table '{table}': keys and rows must pair one to one "
                f"(keys [n], rows [n, dimension]); the numbers of keys and of rows are")
    with tf.control_dependencies([check]):
        return tf.identity(rows)


def _distinct(keys, table, what):
    """keys, after a check that none is given twice: apply_serving_delta
    refuses a delta that repeats one (which of its rows is meant cannot be
    told; a new key of a dynamic table was added twice)."""
    unique, _, counts = tf.unique_with_counts(keys)
    repeated = tf.boolean_mask(unique, counts > 1)
    check = tf.debugging.Assert(
        tf.equal(tf.size(repeated), 0),
        [f"apply_delta_fn of table '{table}': {what} must be distinct (a delta holds each "
         f"once); the repeated {what} (up to 10) are", repeated], summarize=10)
    with tf.control_dependencies([check]):
        return tf.identity(keys)


def _finite(rows, table):
    """rows, after a check that every value is finite: apply_serving_delta
    refuses a delta's NaN or infinite value, and a float32 value a float16
    table would hold as inf."""
    values = rows if rows.dtype in (tf.float16, tf.float32, tf.float64) \
        else tf.cast(rows, tf.float32)  # bfloat16, exactly
    check = tf.debugging.Assert(
        tf.reduce_all(tf.math.is_finite(values)),
        [f"apply_delta_fn of table '{table}': rows must be finite (a NaN or infinite value, "
         f"or one beyond the table's dtype)"])
    with tf.control_dependencies([check]):
        return tf.identity(rows)


def _as_op(value):
    return value.op if hasattr(value, "op") and value.op is not None else value


def _search(sorted_keys, keys):
    """(position, found): where each of `keys` is, or would go, in the
    ascending `sorted_keys`, and whether it is there."""
    n = tf.size(sorted_keys, out_type=tf.int64)
    position = tf.searchsorted(sorted_keys, keys, side="left", out_type=tf.int64)
    probe = tf.minimum(position, tf.maximum(n - 1, 0))
    candidate = _held_at(sorted_keys, probe)
    found = tf.logical_and(position < n, tf.equal(candidate, keys))
    return probe, found


def _held_at(vector, probe):
    """vector[probe] for a position _search gave; zeros where `vector` is
    empty. tf.gather of an empty vector fails on a CPU even at the clipped
    position 0, and a table holding no keys (never trained, or not yet
    given a delta) must still serve its default row and take deltas."""
    vector = tf.convert_to_tensor(vector)
    return tf.cond(tf.size(vector) > 0, lambda: tf.gather(vector, probe),
                   lambda: tf.zeros_like(probe, dtype=vector.dtype))


# How often a lookup reads a dynamic table's keys and index for a pair of
# one state (DynamicTable._held).
_STATE_READS = 1000

_RESOURCE = getattr(tf.saved_model.experimental, "TrackableResource", None)


if _RESOURCE is not None:
    class _WritersTakeTurns(_RESOURCE):
        """A mutex that apply_delta calls of one table take in turn, saved
        with a TF2 SavedModel (a resource it tracks, made again when it is
        loaded: MutexV2, a stock op)."""

        def __init__(self):
            # Named: a mutex of an empty name is one resource for every
            # table of the process. Two loads of one export share it, which
            # only makes their deltas take turns too.
            self._shared_name = "sok_serving_writers_" + uuid.uuid4().hex
            super().__init__()

        def _create_resource(self):
            return tf.raw_ops.MutexV2(shared_name=self._shared_name)


def _writers_lock():
    """A table's _WritersTakeTurns, made eagerly (not inside the function
    that first takes it); None in a TF1 graph, whose exports hold no delta
    function, and on TensorFlow 1.x, which cannot save one."""
    if _RESOURCE is None or not tf.executing_eagerly():
        return None
    lock = _WritersTakeTurns()
    lock.resource_handle  # pylint: disable=pointless-statement
    return lock


class DynamicTable(tf.Module):
    """A sok.DynamicVariable's rows, served from plain variables (see the
    module docstring)."""

    kind = "dynamic"

    def __init__(self, table_name, key_dtype, dimension, dtype=tf.float32, default_row=None):
        super().__init__()
        self.table_name = table_name
        self.key_dtype = tf.as_dtype(key_dtype)
        self.dimension = int(dimension)
        self.dtype = tf.as_dtype(dtype)
        default = default_row_value(default_row, table_name, self.dimension, self.dtype)
        with tf.name_scope("sok_serving/" + scope_name(table_name)):
            self.keys = _variable(tf.zeros([0], self.key_dtype), tf.TensorShape([None]), "keys")
            self.index = _variable(tf.zeros([0], tf.int64), tf.TensorShape([None]), "index")
            self.rows = _variable(tf.constant(default[None, :]),
                                  tf.TensorShape([None, self.dimension]), "rows")
        self._writers = _writers_lock()

    def variables_by_role(self):
        return {"keys": self.keys, "index": self.index, "rows": self.rows}

    def _keys(self, keys):
        keys = tf.convert_to_tensor(keys)
        if keys.dtype == tf.int64 and self.key_dtype == tf.int32:
            # As training's lookup: narrowed, id 2^32 + 5 would serve key 5's row.
            raise TypeError(f"keys of table '{self.table_name}' must be int32 (the key_type of "
                            f"its DynamicVariable); got int64: give the model int32 ids, as "
                            f"in training")
        if keys.dtype != self.key_dtype:
            keys = tf.cast(keys, self.key_dtype)
        return keys

    def _served_keys(self, keys):
        """Keys given to the loaded model's lookup_fn / apply_delta_fn (see
        serving_functions): an int32 table's int64 keys checked against
        int32's range, then narrowed."""
        keys = tf.convert_to_tensor(keys)
        if keys.dtype != tf.int64 or self.key_dtype != tf.int32:
            return keys
        low, high = tf.int32.min, tf.int32.max
        outside = tf.logical_or(keys < low, keys > high)
        check = tf.debugging.Assert(
            tf.logical_not(tf.reduce_any(outside)),
            [f"keys of table '{self.table_name}' must be in int32's range [{low}, {high}] "
             f"(the key_type of its DynamicVariable); got", tf.boolean_mask(keys, outside)],
            summarize=3)
        with tf.control_dependencies([check]):
            return tf.cast(keys, tf.int32)

    def lookup(self, keys):
        """Rows [n, dim] of keys [n]; the default row for keys not held."""
        return self.find(keys)[0]

    def _held(self):
        """(keys, index) of one state of the table, read together: a delta
        applied meanwhile (apply_delta) assigns them one after the other, and
        keys of one state with the index of another sent a lookup to other
        keys' rows. Keys are only ever added, so the two are of one state
        exactly when they are of one length (one state's keys with a later
        state's index of the same length: no key was added between, and that
        index is the later state's, for the same keys); a pair of two
        lengths is read again (up to _STATE_READS reads in all)."""
        def read():  # a list, as the loop's variables (eagerly, a tuple failed the loop)
            return [tf.convert_to_tensor(self.keys), tf.convert_to_tensor(self.index)]

        def mixed(keys, index, reads):
            return tf.logical_and(tf.not_equal(tf.size(keys), tf.size(index)),
                                  reads < _STATE_READS)

        def again(keys, index, reads):
            return read() + [reads + 1]

        # Bounded: under XLA (which reads each variable once) or after a
        # delta that stopped between its two assigns, the lengths never
        # agree, and the lookup fails naming the table rather than spinning.
        # The bound is an int64 loop variable and the failure CheckNumerics'
        # (its message an attribute), not maximum_iterations (an int32
        # counter) and tf.debugging.assert_equal (string constants): the
        # lookup is placed with the served rows (tf.nn.embedding_lookup
        # colocates with its table), and with those on a GPU the model could
        # not be placed ("no supported kernel for GPU devices" at every call).
        keys, index, _ = tf.while_loop(
            mixed, again, read() + [tf.constant(1, tf.int64)],
            shape_invariants=[tf.TensorShape([None]), tf.TensorShape([None]),
                              tf.TensorShape([])])
        agree = tf.equal(tf.size(keys), tf.size(index))
        check = tf.debugging.check_numerics(
            tf.where(agree, tf.constant(0.0), tf.constant(float("nan"))),
            f"sok serving table '{self.table_name}': its keys and index did not agree in "
            f"{_STATE_READS} reads (a delta stopped halfway, or the lookup runs under XLA, "
            f"which reads each variable once): reload the model")
        with tf.control_dependencies([check]):
            return tf.identity(keys), tf.identity(index)

    def find(self, keys, default_value=None):
        """(rows [n, dim], found [n]) of keys [n], as DynamicVariable.find
        reads them: keys not held get default_value in every column (None:
        the table's default row). A delta applied meanwhile (apply_delta)
        is seen whole or not at all: keys and index are read as one state
        (_held), and the rows after them (the gather takes the rows their
        index gives), which hold every row that index points at, as it
        was: apply_delta writes the rows before the index and never
        overwrites a row."""
        keys = self._keys(keys)
        sorted_keys, index = self._held()
        probe, found = _search(sorted_keys, keys)
        row = tf.where(found, _held_at(index, probe), tf.zeros_like(probe))
        rows = tf.gather(self.rows, row)
        if default_value is not None:
            fill = tf.fill(tf.shape(rows), tf.cast(default_value, rows.dtype))
            rows = tf.where(tf.broadcast_to(found[:, None], tf.shape(rows)), rows, fill)
        return rows, found

    @_keeps_no_record
    def apply_delta(self, keys, rows):
        """Sets the rows of `keys`: held keys get their new rows, new keys
        are added. Returns the number of new keys. Refuses
        (InvalidArgumentError naming the table, nothing written) keys and
        rows that do not pair, a key given twice (a new one was added twice)
        and a NaN or infinite value (also one that becomes infinite in the
        table's dtype), as apply_serving_delta does.

        A lookup running meanwhile sees the table before the delta or after
        it, never a mix: every row of the delta is appended (a held key's
        previous row stays, unreferenced: a lookup that read the previous
        index reads it whole), the rows are written before the keys and the
        index, and lookups read keys and index as one state (find). So
        the loaded model's rows grow by every delta's rows until it is
        loaded again (apply_serving_delta writes an export's rows in place).
        Calls take turns (a mutex of the table, where TensorFlow can save
        one: TF2), so two deltas applied at once do not write over each
        other's rows."""
        keys = _distinct(self._keys(keys), self.table_name, "keys")
        rows = _finite(tf.cast(_paired(keys, rows, self.table_name), self.dtype),
                       self.table_name)
        lock = None
        if self._writers is not None:
            lock = tf.raw_ops.MutexLock(mutex=self._writers.resource_handle)
        with tf.control_dependencies([] if lock is None else [lock]):
            # Read under the lock: another delta's writes are all in.
            sorted_keys = tf.convert_to_tensor(self.keys)
            index = tf.convert_to_tensor(self.index)
            # One read of the rows gives both the delta's first row and what
            # it is appended to: in a TF1 graph a second read may run after
            # the append, and the index would point past it.
            held = tf.convert_to_tensor(self.rows)
        order = tf.argsort(keys, stable=True)
        keys, rows = tf.gather(keys, order), tf.gather(rows, order)
        probe, found = _search(sorted_keys, keys)
        first_row = tf.shape(held, out_type=tf.int64)[0]
        at = first_row + tf.range(tf.size(keys, out_type=tf.int64), dtype=tf.int64)
        # Held keys point at their appended rows; their previous rows stay.
        index = tf.tensor_scatter_nd_update(index, tf.boolean_mask(probe, found)[:, None],
                                            tf.boolean_mask(at, found))
        new = tf.logical_not(found)
        new_keys, new_at = tf.boolean_mask(keys, new), tf.boolean_mask(at, new)
        n = tf.size(sorted_keys, out_type=tf.int64)
        m = tf.size(new_keys, out_type=tf.int64)
        # Where each entry of the merged key list comes from: held key i
        # moves up by the number of new keys below it, new key j goes
        # after the held keys below it and the new keys before it.
        held_to = tf.range(n, dtype=tf.int64) + tf.searchsorted(
            new_keys, sorted_keys, side="left", out_type=tf.int64)
        new_to = tf.searchsorted(sorted_keys, new_keys, side="left",
                                 out_type=tf.int64) + tf.range(m, dtype=tf.int64)
        source = tf.math.invert_permutation(tf.concat([held_to, new_to], 0))
        merged_keys = tf.gather(tf.concat([sorted_keys, new_keys], 0), source)
        merged_index = tf.gather(tf.concat([index, new_at], 0), source)
        grown = self.rows.assign(tf.concat([held, rows], 0))
        with tf.control_dependencies([_as_op(grown)]):
            assigned = [self.keys.assign(merged_keys), self.index.assign(merged_index)]
        with tf.control_dependencies([_as_op(a) for a in assigned]):
            if lock is not None:
                # Releases the lock once everything is written.
                with tf.control_dependencies([tf.raw_ops.ConsumeMutexLock(mutex_lock=lock)]):
                    return tf.identity(m)
            return tf.identity(m)

    def serving_functions(self):
        """(lookup_fn, apply_delta_fn) of the loaded model (_traced). An
        int32-keyed table's take int64 keys too, checked (_served_keys),
        and that signature comes first: a loaded function converts a call's
        arguments to the first signature they convert to, and int64 numpy
        keys given the int32 one alone were narrowed, wrapping around
        (apply_delta_fn of key 2^32 + 9 overwrote key 9's row)."""
        key_dtypes = [tf.int64] + ([tf.int32] if self.key_dtype == tf.int32 else [])
        rows = tf.TensorSpec([None, self.dimension], self.dtype, name="rows")
        return (_traced(lambda keys: self.lookup(self._served_keys(keys)),
                        [[tf.TensorSpec([None], d, name="keys")] for d in key_dtypes]),
                _traced(lambda keys, rows: self.apply_delta(self._served_keys(keys), rows),
                        [[tf.TensorSpec([None], d, name="keys"), rows] for d in key_dtypes]))

    def row_count(self):
        """The keys the table holds, an int64 scalar (the table protocol;
        the default row is not one of them)."""
        return tf.size(self.keys, out_type=tf.int64)

    def export_chunk(self, offset, limit, updated_after=None):
        """(keys of key_dtype, rows, next_offset) of up to `limit` keys from
        position `offset` of the ascending keys, as a sok.DynamicVariable
        gives them: offset >= 0 and limit >= 1 or InvalidArgumentError,
        next_offset min(offset + limit, row_count()), or offset itself from
        past the end. updated_after must be None."""
        _refuse_updated_after(self, updated_after)
        offset = tf.cast(offset, tf.int64)
        limit = tf.cast(limit, tf.int64)
        # The checks of the training table's export op, so that a caller
        # written against one kind fails the same way on the other.
        checks = [tf.debugging.assert_non_negative(offset, message="offset must be >= 0"),
                  tf.debugging.assert_positive(limit, message="limit must be >= 1")]
        # Keys, index and their count of one state (_held), as a lookup
        # reads them: a delta applied meanwhile paired keys with other keys'
        # rows.
        held_keys, index = self._held()
        with tf.control_dependencies(checks):
            left = tf.maximum(tf.size(held_keys, out_type=tf.int64) - offset, 0)
            end = offset + tf.minimum(limit, left)  # no offset + limit: it may overflow
        positions = tf.range(offset, end, dtype=tf.int64)
        keys = tf.gather(held_keys, positions)
        # index maps a key's position to its row (rows are appended as keys
        # arrive, not kept in key order).
        rows = tf.gather(self.rows, tf.gather(index, positions))
        return keys, rows, end


def combine(table, ids, row_splits, weights, combiner, max_norm, dtype):
    """sok.lookup_sparse's result for one table: [batch, dim] of `dtype`."""
    row_splits = tf.cast(row_splits, tf.int64)
    batch = tf.shape(row_splits, out_type=tf.int64)[0] - 1
    segments = tf.ragged.row_splits_to_segment_ids(row_splits, out_type=tf.int64)
    rows = tf.cast(table.lookup(ids), tf.float32)
    if weights is None:
        w = tf.ones(tf.shape(ids)[:1], tf.float32)
    else:
        # the fused op gets weights in the table's dtype
        w = tf.cast(tf.cast(weights, dtype), tf.float32)
    scale = w
    if max_norm is not None and max_norm > 0:
        norm = tf.sqrt(tf.reduce_sum(rows * rows, axis=1))
        limit = tf.constant(float(max_norm), tf.float32)
        scale = w * tf.where(norm > limit, limit / tf.maximum(norm, limit),
                             tf.ones_like(norm))
    total = tf.math.unsorted_segment_sum(rows * scale[:, None], segments, batch)
    if combiner == "sum":
        out = total
    else:
        if combiner == "mean":
            denominator = tf.math.unsorted_segment_sum(w, segments, batch)
        else:
            denominator = tf.sqrt(tf.math.unsorted_segment_sum(w * w, segments, batch))
        out = total * tf.math.divide_no_nan(tf.ones_like(denominator), denominator)[:, None]
    return tf.cast(out, dtype)
