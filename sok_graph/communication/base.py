"""What every communication engine shares: the `Communicator` interface,
the single-process engine, byte counting, and the helpers the engines use to
pack uneven exchanges into equal blocks. Engines import this module, never
the package, so the package can import every engine."""


import abc
import contextlib
import threading

import numpy as np

COMM_TOOLS = ("horovod", "tf", "none", "single")
# Names of the one-process engine: "none" is sok_graph's, "single" what SOK's
# own single-process scripts pass to sok.init.
SINGLE_PROCESS_TOOLS = ("none", "single")

_count_lock = threading.Lock()
_count_enabled = False
_bytes_sent = 0


def count_bytes(enabled=True):
    """Turns byte counting on or off for all-to-alls built from now on.

    Counting adds a small host callback per exchange (tf.numpy_function), so
    it is off by default; graphs built while it was on keep counting.
    """
    global _count_enabled
    _count_enabled = bool(enabled)


def bytes_sent():
    """Bytes this process has sent to other workers through counted all-to-alls."""
    return _bytes_sent


def reset_bytes_sent():
    global _bytes_sent
    with _count_lock:
        _bytes_sent = 0


def _add_bytes(n):
    global _bytes_sent
    with _count_lock:
        _bytes_sent += int(n)
    return np.int64(0)


class Communicator(abc.ABC):
    """What an engine provides. Tensors are TensorFlow tensors; `splits` are
    per-destination row counts ([world_size] int32/int64 tensor)."""

    name = "abstract"
    # True when every worker is a replica in this process (MirroredReplicas):
    # the process holds every shard, and `rank` depends on the replica being
    # built.
    in_process = False
    # Whether _alltoall itself checks that the splits add up to the rows (the
    # NCCL exchange does, in its kernel), so alltoall adds no check of its own.
    checks_splits = False

    def __init__(self, world_size, rank):
        self._size, self._rank = int(world_size), int(rank)

    @property
    def world_size(self):
        """Number of workers (a Python int)."""
        return self._size

    @property
    def rank(self):
        """This worker's index in [0, world_size) (a Python int)."""
        return self._rank

    def alltoall(self, tensor, splits, name=None, check_splits=True, padded=False):
        """Sends rows [sum(splits[:w]), sum(splits[:w+1])) of `tensor` to worker w;
        returns (received rows in sender order, received splits [world_size] int64).
        Differentiable with respect to `tensor`. check_splits=False skips the
        check that the splits add up to the rows, for callers whose splits do
        by construction (a bucketing op's sizes, the splits of a reply): the
        check is read on the host, a wait for the device. padded: `tensor`
        may have rows past the splits' sum (the padding of
        util.unique_padded), which are not sent: an engine that cannot skip
        them takes a slice, which on a GPU waits for the splits."""
        import tensorflow as tf

        tensor = tf.convert_to_tensor(tensor)
        splits = tf.cast(splits, tf.int64)
        size = self.world_size
        if tensor.shape.rank == 0:
            raise ValueError(f"alltoall needs a tensor of rank >= 1 (the rows to send); got "
                             f"a scalar: {tensor}")
        if splits.shape.rank is not None and (splits.shape.rank != 1 or (
                splits.shape[0] is not None and splits.shape[0] != size)):
            raise ValueError(f"splits must have shape [world_size] = [{size}]; got shape "
                             f"{splits.shape}")
        # Checked before any exchange, in every engine, so this worker's error
        # says what is wrong (its peers then fail or time out in the exchange);
        # by the exchange itself where it checks (checks_splits).
        if check_splits and not self.checks_splits:
            assert_fits = tf.debugging.assert_less_equal if padded else tf.debugging.assert_equal
            check = assert_fits(
                tf.reduce_sum(splits), tf.shape(tensor, out_type=tf.int64)[0],
                message="alltoall: splits must add up to the tensor's number of rows"
                        + (" or fewer (padded)" if padded else ""))
            with tf.control_dependencies([check]):
                splits = tf.identity(splits)
        if padded and self.sends_padded_rows():
            received, received_splits = self._alltoall(tensor, splits, name, padded=True)
        else:
            if padded:
                tensor = tensor[:tf.reduce_sum(splits)]
            received, received_splits = self._alltoall(tensor, splits, name)
        received_splits = tf.cast(received_splits, tf.int64)
        if _count_enabled and self.world_size > 1:
            row_bytes = tensor.dtype.size
            for d in tensor.shape[1:]:
                row_bytes *= int(d)
            to_others = tf.reduce_sum(splits) - splits[self.rank]
            # numpy_function is stateful (never pruned or merged) by default.
            with tf.device("/device:CPU:0"):  # a host callback: no GPU kernel
                counted = tf.numpy_function(_add_bytes, [to_others * row_bytes], tf.int64)
            with tf.control_dependencies([counted]):
                received = tf.identity(received)
        return received, received_splits

    def sends_padded_rows(self):
        """Whether _alltoall takes padded=True: rows past the splits' sum,
        left out by the exchange itself (sok_graph's NCCL op)."""
        return False

    @abc.abstractmethod
    def _alltoall(self, tensor, splits, name):
        """The engine's uneven all-to-all; splits is int64."""

    @abc.abstractmethod
    def allreduce(self, tensor, name=None):
        """Sum of `tensor` over workers."""

    @abc.abstractmethod
    def allgather(self, tensor, name=None):
        """Concatenation along axis 0 of `tensor` from every worker, in rank
        order; first dimensions may differ between workers."""

    @abc.abstractmethod
    def broadcast(self, tensor, root_rank=0, name=None):
        """root_rank's `tensor`, on every worker."""

    def barrier(self):
        """Returns once every worker has called it (eager; for dump/load)."""
        import tensorflow as tf

        self.allreduce(tf.zeros([], tf.float32), name="sok_barrier").numpy()

    def describe(self):
        return f"{self.name} (rank {self.rank} of {self.world_size})"

    # --- which shard this process builds and sees -------------------------
    # A worker process holds one shard of each table: nothing to choose. The
    # in-process engine (MirroredReplicas) holds one shard per replica and
    # overrides these.

    def replicates(self):
        """Whether sok tables made now are split into one shard per replica of
        this process."""
        return False

    def in_replica(self):
        """Whether one replica's ops are being built (so per-shard work knows
        its shard)."""
        return False

    def shard_scope(self, rank):
        """A context in which what belongs with worker `rank`'s shard (its
        optimizer state) is built as that shard is."""
        del rank
        return self.table_scope()

    def table_scope(self):
        """A context in which this worker's shard of a sok table is made:
        on the worker's device where the engine names one, else where
        TensorFlow places it."""
        return contextlib.nullcontext()


def copied_session_config(config):
    """A copy of `config` (a tf.compat.v1.ConfigProto, or a new one) for an
    engine to complete with what its Session needs, seeing the GPUs this
    process's eager context sees.

    A Session made from a ConfigProto makes its own devices: without the
    context's GPU settings it has one device per physical GPU, whatever
    tf.config.set_logical_device_configuration or set_visible_devices said.
    Replicas on two logical GPUs of one physical GPU then land on one device,
    where the strategy's collectives wait for each other forever. Settings
    `config` makes itself are kept."""
    import tensorflow as tf

    updated = tf.compat.v1.ConfigProto()
    if config is not None:
        if not isinstance(config, tf.compat.v1.ConfigProto):
            raise TypeError(f"config must be a tf.compat.v1.ConfigProto or None; got "
                            f"{type(config).__name__}")
        updated.CopyFrom(config)
    context_gpus = _context_gpu_options()
    if context_gpus is not None:
        if not updated.gpu_options.visible_device_list:
            updated.gpu_options.visible_device_list = context_gpus.visible_device_list
        if not updated.gpu_options.experimental.virtual_devices:
            updated.gpu_options.experimental.virtual_devices.extend(
                context_gpus.experimental.virtual_devices)
    return updated


def _context_gpu_options():
    """The eager context's GPUOptions (logical GPUs, visible GPUs), or None
    where the context has no config to give (TF 1.15's graph-mode start)."""
    from tensorflow.python.eager import context as eager_context

    try:
        return eager_context.context().config.gpu_options
    except (AttributeError, ValueError, RuntimeError):
        return None


def valid_rows(counts, chunk):
    """Indices of the first counts[w] rows of every block w of a
    [len(counts) * chunk, ...] buffer, in order (a padded exchange's valid
    rows). A few ops: tf.repeat builds many more, which slowed traces with
    many exchanges."""
    import tensorflow as tf

    valid = tf.range(chunk)[None, :] < counts[:, None]
    return tf.where(tf.reshape(valid, [-1]))[:, 0]


def pack_chunks(tensor, splits, chunk, size):
    """[size, chunk, ...]: the rows of `tensor` (sorted by destination,
    splits[w] of them for worker w) with each destination's chunk padded with
    zeros to `chunk` rows — the equal-sized blocks that all-to-all and
    all-gather collectives exchange."""
    import tensorflow as tf

    row_shape = tf.shape(tensor, out_type=tf.int64)[1:]
    # The valid slots of the buffer, in order, are where rows 0, 1, 2, ... go.
    slots = valid_rows(splits, chunk)
    buffer = tf.scatter_nd(slots[:, None], tensor, tf.concat([[size * chunk], row_shape], 0))
    return tf.reshape(buffer, tf.concat([[size, chunk], row_shape], 0))


class SingleProcess(Communicator):
    """World size 1: every collective is the identity."""

    name = "none"

    def __init__(self):
        super().__init__(world_size=1, rank=0)

    def _alltoall(self, tensor, splits, name):
        return tensor, splits

    def allreduce(self, tensor, name=None):
        return tensor

    def allgather(self, tensor, name=None):
        return tensor

    def broadcast(self, tensor, root_rank=0, name=None):
        if root_rank != 0:
            raise ValueError(f"root_rank must be 0 with a single worker; got {root_rank}")
        return tensor

    def barrier(self):
        return None
