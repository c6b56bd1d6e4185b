"""The in-process engine: the replicas of a tf.distribute.MirroredStrategy
with several devices in one process, each acting as one worker.

`sok.init(comm_tool="tf")` (or `sok.Init`) under such a strategy's scope
picks it. Worker r is replica r (on the strategy's r-th device): it holds
shard r of every sok table (see sok_graph/tables/replica_shards.py) and talks to the
other replicas through the strategy's merge_call (see _merged), so it works
wherever that does: inside `strategy.run`, eagerly, in a tf.function and in
a tf.compat.v1 Session graph.

- `rank` is the replica id of the replica context being built (a Python int:
  MirroredStrategy builds each replica's ops separately); outside a replica
  context it is only defined while a shard is being created for one replica.
- Uneven all-to-all: replicas on GPUs use NCCL (sok_graph/communication/
  nccl.py) where it is found. Otherwise each replica cuts its rows into one
  piece per receiver and each receiver concatenates the pieces addressed to
  it: only those rows move between devices (TensorFlow's peer copies),
  unpadded. The gradient is the reverse exchange.
- A Session must see every replica's device (logical CPUs exist for eager
  execution only): `comm.session_config()` / `comm.session()`.
- barrier() has nothing to wait for: the replicas share one Python process.
"""

import contextlib
import threading

import tensorflow as tf

from sok_graph.communication import nccl
from sok_graph.communication.base import Communicator, copied_session_config
from sok_graph.ops import util as util_ops

_not_converted = tf.autograph.experimental.do_not_convert

# The replica whose shard is being created in this thread (see building_shard).
_building = threading.local()


def building_rank():
    """The replica whose shard is being created in this thread, or None."""
    return getattr(_building, "rank", None)


def _with_gradient(x, result, gradient):
    """`result` (built from x and the other replicas' tensors), whose gradient
    with respect to x is gradient(dy) and which passes none to the other
    replicas' tensors: each replica's own gradient carries what flows to
    them. `result` enters as an argument: in Session graphs
    tf.custom_gradient searches the forward for variables upstream of its
    captures, which would reach into the other replicas' subgraphs."""
    @tf.custom_gradient
    def attach(x, result):
        return tf.identity(result), lambda dy: (gradient(tf.convert_to_tensor(dy)), None)

    return attach(x, result)


class MirroredReplicas(Communicator):
    """Collectives among the replicas of one process's MirroredStrategy; see
    the module's docstring. Made by tf_distribute.create()."""

    name = "replicas"
    in_process = True

    def __init__(self, strategy):
        self._strategy = strategy
        self._devices = tuple(strategy.extended.worker_devices)
        super().__init__(world_size=len(self._devices), rank=0)
        # Replicas on GPUs exchange rows through NCCL where it is found.
        self._nccl = nccl.Transport.local(self._devices) if nccl.usable(self._devices) else None

    @property
    def checks_splits(self):
        return self._nccl is not None and not tf.executing_eagerly()

    @property
    def devices(self):
        """The device of each replica, in replica order."""
        return self._devices

    @property
    def rank(self):
        """The replica whose ops are being built (inside strategy.run), or the
        one whose shard is being created."""
        building = building_rank()
        if building is not None:
            return building
        return self.replica_id("rank")

    def replica_id(self, what="this"):
        """The id of the replica being built; a RuntimeError naming `what`
        outside strategy.run."""
        return self._replica_context(what)[1]

    def in_replica(self):
        """Whether a replica of this strategy is being built (inside
        strategy.run)."""
        ctx = tf.distribute.get_replica_context()
        return ctx is not None and ctx.strategy is self._strategy

    def replicates(self):
        """Whether sok tables made now get one shard per replica: yes, unless
        one replica's shard is being built already."""
        return building_rank() is None

    @contextlib.contextmanager
    def building_shard(self, rank):
        """Variables made inside are replica `rank`'s shard, on its device:
        sok.Variable and DynamicVariable made there are plain shards, and
        `rank` is `rank` meanwhile."""
        previous = building_rank()
        _building.rank = rank
        try:
            with tf.device(self._devices[rank]):
                yield
        finally:
            _building.rank = previous

    def shard_scope(self, rank):
        """What belongs with replica `rank`'s shard (its optimizer state) is
        built as that shard is."""
        return self.building_shard(rank)

    def _replica_context(self, what="this"):
        """(replica context, replica id) of the replica being built; a clear
        error outside strategy.run."""
        ctx = tf.distribute.get_replica_context()
        if ctx is None or ctx.strategy is not self._strategy:
            raise RuntimeError(
                f"sok_graph runs on the {self.world_size} replicas of a MirroredStrategy: "
                f"{what} needs a replica context; call it inside strategy.run(...) of the "
                f"strategy sok.init was called under")
        replica = tf.get_static_value(ctx.replica_id_in_sync_group)
        if replica is None:
            raise RuntimeError("the replica id of this MirroredStrategy replica context is not "
                               "known while building; sok_graph needs it as a constant")
        return ctx, int(replica)

    def describe(self):
        return (f"MirroredStrategy replicas in one process ({self.world_size}: "
                f"{', '.join(self._devices)})")

    # --- graph-mode sessions ----------------------------------------------

    def session_config(self, config=None):
        """A copy of `config` (a tf.compat.v1.ConfigProto, or a new one) whose
        Session sees every replica's device: logical CPUs made with
        tf.config.set_logical_device_configuration exist for eager execution
        only, and a Session makes as many as its device_count says. With GPU
        replicas, soft placement is on."""
        updated = copied_session_config(config)
        kinds = [tf.DeviceSpec.from_string(d).device_type for d in self._devices]
        cpus = kinds.count("CPU")
        if cpus > updated.device_count.get("CPU", 1):
            updated.device_count["CPU"] = cpus
        if "GPU" in kinds:
            # As in a tf.function: an op with no GPU kernel (a host callback,
            # a check's message) runs on the CPU rather than failing.
            updated.allow_soft_placement = True
        return updated

    def session(self, config=None, graph=None):
        """A tf.compat.v1.Session with session_config(config)."""
        return tf.compat.v1.Session(graph=graph, config=self.session_config(config))

    # --- the two primitives ----------------------------------------------------
    #
    # Built with merge_call: the merge function sees every replica's tensor
    # and builds, on each replica's device, the concatenation or the sum;
    # replica r takes the r-th. The result is plain dataflow between the
    # devices of one graph (copies and adds, no collective kernels, no
    # instance keys), the same in tf.function, eagerly and in a Session.

    def _merged(self, ctx, rank, tensor, combine):
        def merge(strategy, value):
            parts = strategy.experimental_local_results(value)
            out = []
            for device in self._devices:
                with tf.device(device):
                    out.append(combine(parts))
            return out

        return ctx.merge_call(merge, args=(tensor,))[rank]

    def _gather(self, ctx, rank, tensor):
        """Every replica's tensor, concatenated along axis 0 in replica order
        (first dimensions may differ). Not differentiated: callers give the
        gradient."""
        return self._merged(ctx, rank, tensor, lambda parts: tf.concat(list(parts), 0))

    def _sum(self, ctx, rank, tensor):
        return self._merged(ctx, rank, tensor, lambda parts: tf.add_n(list(parts)))

    # --- all-to-all ---------------------------------------------------------
    #
    # Within one process nothing needs equal blocks: each replica cuts its
    # rows into one piece per receiver (on its own device), and each receiver
    # concatenates the pieces addressed to it, in sender order. Only those
    # bytes cross between devices (GPU to GPU where the replicas are GPUs),
    # with no padding and no all-gather of the split matrix.

    def _transposed(self, ctx, rank, pieces):
        """pieces: this replica's tensors for receivers 0..N-1. Returns the
        tensors that senders 0..N-1 addressed to this replica."""
        size = self.world_size

        def merge(strategy, *per_receiver):
            out = []
            for r, device in enumerate(self._devices):
                sent = strategy.experimental_local_results(per_receiver[r])
                with tf.device(device):
                    out.append([tf.identity(sent[s]) for s in range(size)])
            return out

        return ctx.merge_call(merge, args=tuple(pieces))[rank]

    def _route(self, ctx, rank, tensor, splits):
        """(rows received, in sender order; rows from each sender [N] int64)."""
        pieces = util_ops.split(tensor, splits, self.world_size)
        received = self._transposed(ctx, rank, pieces)
        counts = tf.stack([tf.shape(p, out_type=tf.int64)[0] for p in received])
        out = tf.concat(received, 0)
        out.set_shape(tf.TensorShape([None]).concatenate(tensor.shape[1:]))
        return out, counts

    def _uses_nccl(self):
        # Eagerly the replicas run one after another (each until its next
        # merge_call), so an exchange that waits for its peers inside the op
        # would wait forever: NCCL only in graphs, which run the replicas' ops
        # concurrently.
        return self._nccl is not None and not tf.executing_eagerly()

    def sends_padded_rows(self):
        return self._uses_nccl()

    @_not_converted
    def _alltoall(self, tensor, splits, name, padded=False):
        ctx, rank = self._replica_context("an all-to-all")
        if self._uses_nccl():
            return self._nccl.alltoall(tensor, splits, rank, name=name or "sok_alltoall",
                                       padded=padded)
        with tf.name_scope(name or "sok_alltoall"):
            received, received_splits = self._route(ctx, rank, tensor, splits)
            # The gradient: the reverse exchange.
            return _with_gradient(tensor, received, lambda dy: self._route(
                ctx, rank, dy, received_splits)[0]), received_splits

    # --- all-reduce, all-gather, broadcast --------------------------------------

    @_not_converted
    def allreduce(self, tensor, name=None):
        """Sum over replicas; gradient: the sum of the replicas' gradients."""
        ctx, rank = self._replica_context("allreduce")
        with tf.name_scope(name or "sok_allreduce"):
            tensor = tf.convert_to_tensor(tensor)
            return _with_gradient(tensor, self._sum(ctx, rank, tensor),
                                  lambda dy: self._sum(ctx, rank, dy))

    @_not_converted
    def allgather(self, tensor, name=None):
        """Every replica's tensor along axis 0 in replica order (first
        dimensions may differ); gradient: this replica's rows of the sum of
        the replicas' gradients."""
        ctx, rank = self._replica_context("allgather")
        tensor = tf.convert_to_tensor(tensor)
        if tensor.shape.rank == 0:
            raise ValueError(f"allgather needs a tensor of rank >= 1; got a scalar: {tensor}")
        with tf.name_scope(name or "sok_allgather"):
            rows = tf.shape(tensor, out_type=tf.int64)[:1]
            start = tf.reduce_sum(self._gather(ctx, rank, rows)[:rank])
            return _with_gradient(tensor, self._gather(ctx, rank, tensor),
                                  lambda dy: self._sum(ctx, rank, dy)[start:start + rows[0]])

    @_not_converted
    def broadcast(self, tensor, root_rank=0, name=None):
        """root_rank's tensor: a sum to which only the root contributes. Its
        gradient, as Horovod's: the sum of the replicas' gradients on the
        root, zeros elsewhere."""
        if isinstance(root_rank, bool) or not isinstance(root_rank, int) or \
                not 0 <= root_rank < self.world_size:
            raise ValueError(f"root_rank must be an int in [0, {self.world_size}); got "
                             f"{root_rank!r}")
        ctx, rank = self._replica_context("broadcast")
        is_root = rank == root_rank

        def grad(dy):
            summed = self._sum(ctx, rank, dy)
            if is_root:
                return summed
            # The root waits for this replica's share of the sum.
            with tf.control_dependencies([summed]):
                return tf.zeros_like(dy)

        with tf.name_scope(name or "sok_broadcast"):
            tensor = tf.convert_to_tensor(tensor)
            sent = tensor if is_root else tf.zeros_like(tensor)
            return _with_gradient(tensor, self._sum(ctx, rank, sent), grad)

    def barrier(self):
        return None
