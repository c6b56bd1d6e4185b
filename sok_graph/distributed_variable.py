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

from sok_graph import compat, context, placement, replica_shards

_ResourceVariable = compat.resource_variable_class()


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
        self._sok_mode, self._sok_target_rank = placement.parse_mode(mode, comm.world_size)
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
            value = placement.shard_of(value, *self.placement)
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
    def is_sok_variable(self):
        return True

    @property
    def placement(self):
        """Where rows live: (world_size, rank, fixed_owner), the triple
        sok_graph/placement.py reads (fixed_owner -1: distributed)."""
        owner = -1 if self._sok_target_rank is None else self._sok_target_rank
        return self._sok_world_size, self._sok_rank, owner


def is_sok_variable(value):
    """True for sok.Variable and sok.DynamicVariable (both say so)."""
    return getattr(value, "is_sok_variable", False) is True
