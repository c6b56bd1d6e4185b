"""`sok.Variable`: a static embedding table that behaves like a ``tf.Variable``.

mode="distributed": global row i lives on worker i % N as local row i // N
  (2 workers, 15 rows: worker 0 holds 8 rows, worker 1 holds 7).
mode="localized:<rank>": the whole table lives on worker <rank>.

The Python object holds this worker's shard; `global_shape` is the shape of
the whole table. With one worker the shard is the whole table. Under a
MirroredStrategy whose replicas are the workers (one process), the
constructor returns a ReplicaShards holding every replica's shard
(sok_graph/tables/replica_shards.py).
"""

import numpy as np
import tensorflow as tf

from sok_graph import compat, context, placement
from sok_graph.tables import replica_shards, STATIC
from sok_graph.initializers import static_initializer

_ResourceVariable = compat.resource_variable_class()


def _is_localized(mode):
    return isinstance(mode, str) and mode.startswith(placement.LOCALIZED_PREFIX)


def _whole_value(initial_value, kwargs):
    """The whole table's value from initial_value, or (as SOK allows) from
    shape= and initializer= (a Keras / tf initializer called with the shape
    and dtype) when initial_value is None.

    A vector is refused: SOK means it as one row [1, dim], but its
    distributed path fails on it (a misspelt attribute) and its localized
    path makes a 1-D variable whose global_shape says [1, dim]; here a table
    is always [rows, dim]."""
    shape = kwargs.pop("shape", None)
    initializer = kwargs.pop("initializer", None)
    value = initial_value() if callable(initial_value) else initial_value
    if value is None and initializer is not None:
        if shape is None:
            raise ValueError("sok.Variable(initializer=...) needs shape=[rows, dim]")
        dtype = kwargs.get("dtype") or tf.float32
        initializer = static_initializer(initializer)
        value = initializer(shape=tf.TensorShape(shape).as_list(), dtype=tf.as_dtype(dtype))
    if value is None:
        raise ValueError("initial_value must be given (a [rows, dim] array or tensor), or "
                         "shape= and initializer=")
    if isinstance(value, list):
        value = np.asarray(value)
    return value


def _shard_from_initializer(kwargs, where):
    """(the whole table's shape, this worker's rows made by the initializer)
    for shape= and initializer= on several workers: a table larger than one
    device's memory never exists whole. A deterministic initializer (zeros,
    a constant) gives the table it gives on one worker; a random one gives
    rows of the same distribution, drawn per shard (as SOK's shards draw
    theirs)."""
    shape = kwargs.pop("shape", None)
    initializer = kwargs.pop("initializer")
    if shape is None:
        raise ValueError("sok.Variable(initializer=...) needs shape=[rows, dim]")
    shape = tuple(tf.TensorShape(shape).as_list())
    if len(shape) != 2 or None in shape:
        raise ValueError(f"shape must be a known [rows, dim]; got {list(shape)}")
    dtype = tf.as_dtype(kwargs.get("dtype") or tf.float32)
    initializer = static_initializer(initializer)
    local = placement.shard_rows(shape[0], *where)
    return shape, lambda: initializer(shape=[local, shape[1]], dtype=dtype)


class Variable(_ResourceVariable):
    """A sok embedding table: ``Variable(initial_value, mode="distributed", **tf.Variable kwargs)``.

    initial_value: [rows, dim] of the whole table (or a callable giving it).
      Without it, shape=[rows, dim]
      and initializer= (a Keras / tf initializer or its name) make it.
    mode: "distributed" or "localized:<rank>". The object is a
      DistributedVariable or a LocalizedVariable, as SOK's sok.Variable
      returns; both are sok.Variable subclasses.
    """

    def __new__(cls, initial_value=None, mode="distributed", *args, **kwargs):
        if cls is Variable:
            cls = LocalizedVariable if _is_localized(mode) else DistributedVariable
        comm = context.active()
        if replica_shards.replicates(comm) and callable(initial_value):
            # one whole table for every replica's shard
            kwargs = dict(kwargs)
            initial_value = _whole_value(initial_value, kwargs)
        shards = replica_shards.replicate(cls, (initial_value, mode) + args, kwargs, comm)
        return shards if shards is not None else super().__new__(cls)

    def __init__(self, initial_value=None, mode="distributed", *args, **kwargs):
        comm = context.communicator("creating a sok.Variable")
        self._sok_mode, self._sok_target_rank = placement.parse_mode(mode, comm.world_size)
        self._sok_world_size, self._sok_rank = comm.world_size, comm.rank
        if initial_value is None and kwargs.get("initializer") is not None and \
                comm.world_size > 1:
            # shape= and initializer=: each worker makes only its own rows.
            shape, value = _shard_from_initializer(kwargs, self.placement)
        else:
            value = _whole_value(initial_value, kwargs)
            shape = tuple(tf.TensorShape(np.shape(value) if not isinstance(value, tf.Tensor)
                                         else value.shape).as_list())
            if comm.world_size > 1 and len(shape) == 2:
                value = placement.shard_of(value, *self.placement)
        if len(shape) != 2:
            raise ValueError(
                f"initial_value must be a [rows, dim] matrix; got shape {list(shape)}"
            )
        self._sok_global_shape = tf.TensorShape(shape)
        with comm.table_scope():
            super().__init__(initial_value=value, *args, **kwargs)

    @property
    def mode(self):
        return self._sok_mode if self._sok_target_rank is None else (
            f"localized:{self._sok_target_rank}")

    @property
    def target_gpu(self):
        """The worker holding a localized table; -1 for distributed ones (SOK's name)."""
        return -1 if self._sok_target_rank is None else self._sok_target_rank

    @property
    def global_shape(self):
        """Shape of the whole table across workers."""
        return self._sok_global_shape

    @property
    def num_gpus(self):
        """The number of workers the table is placed over (SOK's name)."""
        return self._sok_world_size

    @property
    def global_gpu_id(self):
        """This worker's rank (SOK's name)."""
        return self._sok_rank

    def key_map(self, indices):
        """The local row numbers, in their owner's shard, of global row ids
        `indices` (SOK's name): id // workers for a distributed table, the
        ids themselves for a localized one."""
        return placement.local_rows(self, indices)

    @property
    def is_sok_variable(self):
        return True

    table_kind = STATIC  # what sok_graph/tables/__init__.py asks

    @property
    def dimension(self):
        """The width of the table's rows."""
        return int(self._sok_global_shape[1])

    def row_count(self):
        """The number of rows this shard holds (an int64 scalar; the table
        protocol, sok_graph/tables/__init__.py)."""
        return tf.shape(self, out_type=tf.int64)[0]

    def export_chunk(self, offset, limit, updated_after=None):
        """(global row numbers, rows, next_offset) of this shard's local rows
        [offset, offset + limit) (the table protocol). A static table keeps
        no write times: updated_after must be None."""
        if updated_after is not None:
            raise ValueError("a sok.Variable keeps no write times: updated_after applies to "
                             f"sok.DynamicVariable only; got updated_after={updated_after!r}")
        offset = tf.cast(offset, tf.int64)
        end = tf.minimum(offset + tf.cast(limit, tf.int64), self.row_count())
        local = tf.range(offset, tf.maximum(end, offset), dtype=tf.int64)
        return placement.global_rows(self, local), tf.gather(self, local), end

    # What dump, load and the Saver ask (sok_graph/tables/__init__.py).
    key_dtype = tf.int64  # keys are global row numbers
    key_metadata = ()  # no write times or use counts are kept
    admission = None  # every row exists from the start: none is admitted
    replace_can_fail = False  # replace_rows assigns in place

    @property
    def fixed_rows(self):
        """The rows of the whole table (each row number below it exists on
        its owner)."""
        return int(self._sok_global_shape[0])

    def row_limit(self):
        """This shard's own rows, which it holds and never more (an int64
        scalar: a constant, not a read, so that a load, whose assignments
        need no initialized variable, can check it on one not initialized)."""
        return tf.constant(self._local_rows(), tf.int64)

    def _local_rows(self):
        return placement.shard_rows(self.fixed_rows, *self.placement)

    def read_all(self):
        """(global row numbers, rows, {}) of every row this shard holds: a
        static table keeps no per-key metadata."""
        keys, rows, _ = self.export_chunk(0, 1 << 62)
        return keys, rows, {}

    def read_slot(self, slot, keys, initial_value):
        """The rows of optimizer slot `slot` (make_slot's: one row per row of
        this shard) for global row numbers `keys`; every row has its slot
        row, so initial_value is never needed."""
        del initial_value
        return tf.gather(slot, placement.local_rows(self, keys))

    def replace_rows(self, keys, rows):
        """This shard holds `rows` afterwards. A static shard can neither
        drop nor add rows, so `keys` are every one of its global row numbers
        in local order, as export_chunk gives them; ValueError (or, for keys
        known only when the graph runs, a failing assertion) otherwise. An
        assignment in place: it needs no initialized variable."""
        with tf.control_dependencies(self._every_row(keys, "replace_rows")):
            return self.assign(rows)

    def replace_slot(self, slot, keys, rows):
        """replace_rows for optimizer slot `slot` (make_slot's)."""
        with tf.control_dependencies(self._every_row(keys, "replace_slot")):
            return slot.assign(rows)

    def _every_row(self, keys, method):
        """[] where `keys` are this shard's global row numbers in local order
        (checked now where they are known); else, for keys known only when
        the graph runs, the assertion that checks them then."""
        count = self._local_rows()
        known = tf.get_static_value(keys) if tf.is_tensor(keys) else np.asarray(keys)
        if known is None:
            want = placement.global_rows(self, tf.range(count, dtype=tf.int64))
            return [tf.debugging.assert_equal(
                tf.cast(keys, tf.int64), want,
                message=f"sok.Variable {self.name}: {method} takes every global row number of "
                        f"this shard in local order")]
        want = placement.global_rows(self, np.arange(count, dtype=np.int64))
        if np.shape(known) != (count,) or not np.array_equal(known, want):
            raise ValueError(
                f"sok.Variable {self.name}: {method} takes every one of this shard's {count} "
                f"global row numbers in local order (as export_chunk gives them; a static "
                f"table can neither drop nor add rows); got {np.size(known)} keys that are "
                f"not those")
        return []

    def import_rows(self, keys, rows):
        """Writes `rows` for global row numbers `keys` of this shard; every
        other row stays."""
        return self.scatter_update(tf.IndexedSlices(rows, placement.local_rows(self, keys)))

    def global_ids(self, ids):
        """The global row numbers of this shard's local row numbers `ids`
        (key_map's inverse)."""
        return placement.global_rows(self, ids)

    def make_slot(self, name, initial_value, start=None):
        """An optimizer slot of this shard (sok_graph/tables/__init__.py): a variable of
        its shape, from `start` (rows a native optimizer kept) or filled with
        `initial_value`; a plain resource variable while a replica's shard is
        built."""
        if start is None:
            start = tf.fill(tf.shape(self), tf.cast(initial_value, self.dtype))
        return replica_shards.new_variable(start, trainable=False,
                                           name=f"{self.name.split(':')[0]}/{name}")

    @property
    def placement(self):
        """Where rows live: (world_size, rank, fixed_owner), the triple
        sok_graph/placement.py reads (fixed_owner -1: distributed)."""
        owner = -1 if self._sok_target_rank is None else self._sok_target_rank
        return self._sok_world_size, self._sok_rank, owner


class DistributedVariable(Variable):
    """A sok.Variable with mode="distributed" (what SOK's sok.Variable
    returns for that mode): global row i on worker i % N."""

    def __init__(self, initial_value=None, mode="distributed", *args, **kwargs):
        if _is_localized(mode):
            raise ValueError(f"a DistributedVariable has mode='distributed'; got {mode!r} "
                             f"(use sok.Variable or sok.LocalizedVariable)")
        super().__init__(initial_value, mode, *args, **kwargs)


class LocalizedVariable(Variable):
    """A sok.Variable with mode="localized:<rank>" (what SOK's sok.Variable
    returns for that mode): every row on worker <rank>. Made directly,
    ``LocalizedVariable(value, mode="localized:0")``."""

    def __init__(self, initial_value=None, mode="distributed", *args, **kwargs):
        if not _is_localized(mode):
            raise ValueError(f"a LocalizedVariable needs mode='localized:<rank>'; got {mode!r}")
        super().__init__(initial_value, mode, *args, **kwargs)


def is_sok_variable(value):
    """True for sok.Variable and sok.DynamicVariable (both say so)."""
    return getattr(value, "is_sok_variable", False) is True
