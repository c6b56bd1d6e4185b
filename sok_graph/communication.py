"""The one interface through which sok_graph talks between workers.

Model parallelism needs all-to-all with uneven splits (ids one way, rows
back), all-reduce, all-gather and broadcast, inside the graph and with
gradients. Every engine implements `Communicator`; the rest of the package
only ever calls these methods, so supporting another engine means adding a
class here and nothing else.

Engines: `SingleProcess` (world size 1; no communication). Horovod and
tf.distribute engines plug in here for multi-worker training.
"""

import abc


class Communicator(abc.ABC):
    """What an engine provides. Tensors are TensorFlow tensors; `splits` are
    per-destination row counts ([world_size] int)."""

    name = "abstract"

    @property
    @abc.abstractmethod
    def world_size(self):
        """Number of workers."""

    @property
    @abc.abstractmethod
    def rank(self):
        """This worker's index in [0, world_size)."""

    @abc.abstractmethod
    def alltoall(self, tensor, splits):
        """Sends rows [sum(splits[:w]), sum(splits[:w+1])) of tensor to worker w;
        returns (received rows, received splits)."""

    @abc.abstractmethod
    def allreduce(self, tensor):
        """Sum of tensor over workers."""

    @abc.abstractmethod
    def allgather(self, tensor):
        """Concatenation along axis 0 of tensor from every worker, in rank order."""

    @abc.abstractmethod
    def broadcast(self, tensor, root_rank=0):
        """root_rank's tensor, on every worker."""


class SingleProcess(Communicator):
    """World size 1: every collective is the identity."""

    name = "none"

    @property
    def world_size(self):
        return 1

    @property
    def rank(self):
        return 0

    def alltoall(self, tensor, splits):
        return tensor, splits

    def allreduce(self, tensor):
        return tensor

    def allgather(self, tensor):
        return tensor

    def broadcast(self, tensor, root_rank=0):
        if root_rank != 0:
            raise ValueError(f"root_rank must be 0 with a single worker; got {root_rank}")
        return tensor


COMM_TOOLS = ("horovod", "tf", "none")


def _horovod_world_size():
    """Horovod's world size if Horovod is importable and initialized, else None."""
    try:
        import horovod.tensorflow as hvd
    except ImportError:
        return None
    try:
        return hvd.size()
    except ValueError:  # "Horovod has not been initialized"
        return None


def create(comm_tool):
    """The communicator for `comm_tool` ("horovod", "tf", "none" or None).

    SOK's default is "horovod"; when Horovod is absent or not initialized, or
    runs a single worker, that means one process and no communication.
    """
    if comm_tool is None:
        comm_tool = "horovod"
    if comm_tool not in COMM_TOOLS:
        raise ValueError(f"comm_tool must be one of {COMM_TOOLS}; got {comm_tool!r}")
    if comm_tool == "none":
        return SingleProcess()
    if comm_tool == "horovod":
        size = _horovod_world_size()
        if size is None or size == 1:
            return SingleProcess()
        raise NotImplementedError(
            f"Horovod runs {size} workers, but this sok_graph build supports a single "
            "worker only; run one process or pass comm_tool='none'"
        )
    import tensorflow as tf

    strategy = tf.distribute.get_strategy()
    if strategy.num_replicas_in_sync == 1:
        return SingleProcess()
    raise NotImplementedError(
        f"the tf.distribute strategy has {strategy.num_replicas_in_sync} replicas, but this "
        "sok_graph build supports a single worker only"
    )
