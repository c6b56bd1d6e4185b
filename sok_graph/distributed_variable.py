"""`sok.Variable`: a static embedding table that behaves like a ``tf.Variable``.

mode="distributed": global row i lives on worker i % N as local row i // N
  (2 workers, 15 rows: worker 0 holds 8 rows, worker 1 holds 7).
mode="localized:<rank>": the whole table lives on worker <rank>.

The Python object holds this worker's shard; `global_shape` is the shape of
the whole table. With one worker the shard is the whole table. Under a
MirroredStrategy whose replicas are the workers (one process), the
constructor returns a ReplicaShards holding every replica's shard
(sok_graph/replica_shards.py).
"""

import numpy as np
import tensorflow as tf

from sok_graph import compat, context, replica_shards

_ResourceVariable = compat.resource_variable_class()


def parse_mode(mode, world_size):
    """("distributed", None) or ("localized", rank) from a mode string."""
    if not isinstance(mode, str):
        raise TypeError(f"mode must be a string; got {mode!r}")
    if mode == "distributed":
        return "distributed", None
    if mode.startswith("localized:"):
        text = mode[len("localized:"):]
        try:
            rank = int(text)
        except ValueError:
            rank = None
        if rank is None or not 0 <= rank < world_size:
            raise ValueError(
                f"mode={mode!r}: the rank after 'localized:' must be an integer in "
                f"[0, {world_size}) (the number of workers)"
            )
        return "localized", rank
    raise ValueError(
        f"mode must be 'distributed' or 'localized:<rank>'; got {mode!r}"
    )


class Variable(_ResourceVariable):
    """A sok embedding table: ``Variable(initial_value, mode="distributed", **tf.Variable kwargs)``.

    initial_value: [rows, dim] of the whole table (or a callable giving it).
    """

    def __new__(cls, initial_value=None, mode="distributed", *args, **kwargs):
        comm = context.active()
        if replica_shards.replicates(comm) and callable(initial_value):
            initial_value = initial_value()  # one whole table for every replica's shard
        shards = replica_shards.replicate(cls, (initial_value, mode) + args, kwargs, comm)
        return shards if shards is not None else super().__new__(cls)

    def __init__(self, initial_value=None, mode="distributed", *args, **kwargs):
        comm = context.communicator("creating a sok.Variable")
        self._sok_mode, self._sok_target_rank = parse_mode(mode, comm.world_size)
        value = initial_value() if callable(initial_value) else initial_value
        if value is None:
            raise ValueError("initial_value must be given (a [rows, dim] array or tensor)")
        shape = tuple(tf.TensorShape(np.shape(value) if not isinstance(value, tf.Tensor)
                                     else value.shape).as_list())
        if len(shape) != 2:
            raise ValueError(
                f"initial_value must be a [rows, dim] matrix; got shape {list(shape)}"
            )
        self._sok_global_shape = tf.TensorShape(shape)
        self._sok_world_size, self._sok_rank = comm.world_size, comm.rank
        if comm.world_size > 1:
            value = self._shard_of(value)
        super().__init__(initial_value=value, *args, **kwargs)

    def _shard_of(self, value):
        """The rows of the whole table's initial value that this worker holds."""
        n, rank = self._sok_world_size, self._sok_rank
        if self._sok_target_rank is None:
            return value[rank::n]
        if rank == self._sok_target_rank:
            return value
        return value[:0]  # a localized table lives on one worker; the others hold no rows

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
    def is_sok_variable(self):
        return True

    @property
    def placement(self):
        """Where rows live: (world_size, rank, fixed_owner); fixed_owner is -1
        for a distributed table (row i on worker i % world_size as local row
        i // world_size) and the owning rank for a localized one."""
        owner = -1 if self._sok_target_rank is None else self._sok_target_rank
        return self._sok_world_size, self._sok_rank, owner


def is_sok_variable(value):
    """True for sok.Variable and sok.DynamicVariable (both say so)."""
    return getattr(value, "is_sok_variable", False) is True


def owner_of(var, ids):
    """The worker holding each of the global ids or keys `ids` (int64 tensor):
    id mod N for a distributed table, the owning rank for a localized one."""
    world_size, _, fixed_owner = var.placement
    ids = tf.cast(ids, tf.int64)
    if fixed_owner >= 0:
        return tf.fill(tf.shape(ids), tf.constant(fixed_owner, tf.int64))
    return tf.math.floormod(ids, world_size)


def local_rows(var, ids):
    """The row numbers in their owner's shard of global row ids `ids` of a
    sok.Variable: i // N for a distributed table, i for a localized one."""
    world_size, _, fixed_owner = var.placement
    return ids if fixed_owner >= 0 else tf.math.floordiv(ids, world_size)


def owned_rows(var, ids, rows):
    """The entries of (global ids or keys, rows) that this worker holds, as
    (local ids, rows): local row numbers for a sok.Variable (global row i of a
    distributed table is local row i // N on worker i % N), keys for a
    sok.DynamicVariable (key k on worker k mod N). With one worker, all."""
    world_size, rank, _ = var.placement
    if world_size == 1:
        return ids, rows
    ids = tf.convert_to_tensor(ids)
    keep = tf.equal(owner_of(var, ids), rank)
    ids, rows = tf.boolean_mask(ids, keep), tf.boolean_mask(rows, keep)
    if not hasattr(var, "key_type"):  # keys of a DynamicVariable stay keys
        ids = local_rows(var, ids)
    return ids, rows


def owned_mask(var, ids):
    """numpy: which of the global ids or keys `ids` this worker holds."""
    world_size, rank, fixed_owner = var.placement
    ids = np.asarray(ids)
    if world_size == 1:
        return np.ones(ids.shape, bool)
    if fixed_owner >= 0:
        return np.full(ids.shape, fixed_owner == rank)
    return np.mod(ids.astype(np.int64), world_size) == rank
