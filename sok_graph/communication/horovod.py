"""The Horovod engine: horovod.tensorflow's collectives (Gloo on CPU, NCCL on
GPU clusters), SOK's own default.

Horovod matches a collective across workers by its op name, so every worker
must build the same graph (the same tables, lookups and layers in the same
order) — as any Horovod program must. Horovod's alltoall has a registered
gradient (the reverse exchange), so lookups differentiate through it. The
barrier is the base class's all-reduce: horovod.tensorflow has no
hvd.barrier (horovod.torch has).
"""

from sok_graph.communication.base import Communicator, SingleProcess


def _initialized_horovod():
    """horovod.tensorflow if it is importable and hvd.init() has run, else None."""
    try:
        import horovod.tensorflow as hvd
    except ImportError:
        return None
    try:
        hvd.size()
    except ValueError:  # "Horovod has not been initialized; use hvd.init()."
        return None
    return hvd


class Horovod(Communicator):
    name = "horovod"

    def __init__(self, hvd):
        super().__init__(world_size=hvd.size(), rank=hvd.rank())
        self._hvd = hvd

    def _alltoall(self, tensor, splits, name):
        import tensorflow as tf

        received, received_splits = self._hvd.alltoall(
            tensor, splits=tf.cast(splits, tf.int32), name=name)
        return received, received_splits

    def allreduce(self, tensor, name=None):
        return self._hvd.allreduce(tensor, op=self._hvd.Sum, name=name)

    def allgather(self, tensor, name=None):
        return self._hvd.allgather(tensor, name=name)

    def broadcast(self, tensor, root_rank=0, name=None):
        if not 0 <= root_rank < self._size:
            raise ValueError(f"root_rank must be in [0, {self._size}); got {root_rank}")
        return self._hvd.broadcast(tensor, root_rank, name=name)


def create():
    """Horovod's communicator when Horovod runs several workers; a single
    process when Horovod is absent, not initialized, or runs one worker."""
    hvd = _initialized_horovod()
    if hvd is None or hvd.size() == 1:
        return SingleProcess()
    return Horovod(hvd)
