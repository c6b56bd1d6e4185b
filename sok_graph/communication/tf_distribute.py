"""The tf.distribute engine: TensorFlow's own collective ops across the
workers of a MultiWorkerMirroredStrategy (one replica per worker process).

Use it with `sok.init(comm_tool="tf")` (or `sok.Init`) called under the
strategy's scope. Every collective runs on the worker's CPU over gRPC, in
three settings, all checked by tests/test_tf_distribute_comm.py:

- tf.function, called inside `strategy.run` or directly (cross-replica
  context; with one replica per worker both are the same collective);
- eagerly (each call is a new collective: fine for set-up, barrier(),
  dump/load; use tf.function for training steps);
- tf.compat.v1 graph mode: the Session must be one of this worker's gRPC
  server, e.g. ``comm.session()`` or
  ``tf.compat.v1.Session(comm.session_target(), config=comm.session_config())``.
  A plain ``tf.compat.v1.Session()`` is local to the process and cannot
  reach the other workers. No special RunOptions are needed (see below).

How collectives are matched across workers
------------------------------------------
A collective is identified by a (group key, instance key) pair. This engine
uses one group key of its own (all workers' CPUs, far from the small keys
MultiWorkerMirroredStrategy allocates) and takes instance keys from a
process-wide counter in graph-construction order. Every worker must
therefore build the same collectives in the same order -- the same tables,
lookups and layers, and the same tf.function traces (a function that
retraces on one worker only, e.g. for a batch of another shape, desynchronizes
the keys; give steps an input_signature or equal shapes). The gradient of
an op uses a key reserved when the op is built, so the order in which
gradients are built does not matter.

Sessions and collective_graph_key
---------------------------------
A distributed Session runs collectives only in steps that carry a collective
graph key, which TensorFlow computes itself from the `instance_key`
attributes of the graph's "v1" collective ops (CollectiveReduce,
CollectiveGather, CollectiveBcastSend/Recv); "v2" ops (keys as tensors)
contribute none. So in graphs this engine builds v1 ops, and its one v2 op
(CollectiveAllToAllV2; there is no v1 all-to-all) always depends on a v1
gather of the splits. Every step that runs one of these collectives thus
gets its graph key without RunOptions.experimental.collective_graph_key.
Eagerly, the v2 ops are used (their keys are inputs, so no kernel is cached
per call).

Uneven all-to-all
-----------------
CollectiveAllToAllV2 exchanges equal chunks only ([world_size, ...] in, one
chunk per peer). So: all-gather every worker's splits (a [world, world]
matrix, known to all), pad each outgoing chunk to the largest entry of the
matrix, exchange, and keep the valid rows of each received chunk. The
buffers hold world_size x max(splits) rows, so a very skewed exchange costs
up to world_size times the data actually sent. The gradient is the reverse
exchange with the transposed matrix, which needs no second gather.
all-gather with uneven first dimensions is padded the same way.

Stalls and failures
-------------------
Every collective gets a completion timeout of SOK_GRAPH_STALL_TIMEOUT seconds
(default 120; 0 waits forever): a peer that died or never reaches the
collective gives a DeadlineExceededError (or UnavailableError) instead of a
hang. TensorFlow then aborts every collective of the process: the process
cannot run another one and should exit (the launcher stops the others).
"""

import os
import threading

from sok_graph.communication import Communicator, SingleProcess

STALL_TIMEOUT_ENV = "SOK_GRAPH_STALL_TIMEOUT"
DEFAULT_STALL_TIMEOUT_S = 120.0

# MultiWorkerMirroredStrategy numbers its groups from 1 (+100000 per strategy
# object); keys of this magnitude never meet them. Both keys are int32 attrs.
GROUP_KEY = 0x50C06000
_INSTANCE_KEY_START = 1_000_000_000

_key_lock = threading.Lock()
_next_instance_key = _INSTANCE_KEY_START

# The gRPC server this module started for TF1-style graph mode (eager
# MultiWorkerMirroredStrategy starts its own); one per process.
_server_lock = threading.Lock()
_server = None


def _new_instance_key():
    global _next_instance_key
    with _key_lock:
        key = _next_instance_key
        _next_instance_key += 1
    if key > 0x7FFFFFFF:
        raise RuntimeError("sok_graph's tf.distribute engine ran out of collective instance keys")
    return key


def stall_timeout():
    """Seconds a collective may wait for its peers ($SOK_GRAPH_STALL_TIMEOUT)."""
    raw = os.environ.get(STALL_TIMEOUT_ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_STALL_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"{STALL_TIMEOUT_ENV} must be a number of seconds >= 0 (0: no "
                         f"timeout); got {raw!r}")
    return value


class _GradientKey:
    """An instance key reserved when a forward op is built, for the first
    gradient built from it; any later gradient of the same op (a second
    tf.gradients call) takes a fresh key."""

    def __init__(self):
        self._key = _new_instance_key()

    def take(self):
        key, self._key = self._key, None
        return key if key is not None else _new_instance_key()


class TFDistribute(Communicator):
    name = "tf"

    def __init__(self, strategy):
        from tensorflow.python.distribute import multi_worker_util

        resolver = strategy.cluster_resolver
        self._cluster_spec = multi_worker_util.normalize_cluster_spec(resolver.cluster_spec())
        self._task_type = resolver.task_type
        self._task_id = resolver.task_id
        self._rpc_layer = resolver.rpc_layer or "grpc"
        self._size = multi_worker_util.worker_count(self._cluster_spec, self._task_type)
        # TensorFlow ranks a group's members by job name, then task index;
        # id_in_cluster counts the same way (chief first, then the workers).
        self._rank = multi_worker_util.id_in_cluster(self._cluster_spec, self._task_type,
                                                     self._task_id)
        self._device = f"/job:{self._task_type}/replica:0/task:{self._task_id}/device:CPU:0"
        self._timeout = stall_timeout()

    @property
    def world_size(self):
        return self._size

    @property
    def rank(self):
        return self._rank

    @property
    def timeout(self):
        """The completion timeout of every collective, in seconds (0: none)."""
        return self._timeout

    def describe(self):
        return f"{super().describe()}, CPU collectives over {self._rpc_layer}"

    # --- graph-mode sessions --------------------------------------------

    def session_config(self, config=None):
        """A copy of `config` (a tf.compat.v1.ConfigProto, or a new one) that
        names the collective group leader and keeps this worker's session to
        its own devices -- what a Session running this engine's ops needs."""
        import tensorflow as tf
        from tensorflow.python.distribute import multi_worker_util

        updated = tf.compat.v1.ConfigProto()
        if config is not None:
            if not isinstance(config, tf.compat.v1.ConfigProto):
                raise TypeError(f"config must be a tf.compat.v1.ConfigProto or None; got "
                                f"{type(config).__name__}")
            updated.CopyFrom(config)
        updated.experimental.collective_group_leader = multi_worker_util.collective_leader(
            self._cluster_spec, self._task_type, self._task_id)
        del updated.device_filters[:]
        updated.device_filters.append(f"/job:{self._task_type}/task:{self._task_id}")
        return updated

    def session_target(self):
        """The target of this worker's gRPC server, for tf.compat.v1.Session.

        With eager execution on, MultiWorkerMirroredStrategy has started the
        server already; with it disabled (TF1 style) the first call starts
        one, configured with session_config().
        """
        global _server
        import tensorflow as tf
        from tensorflow.python.eager import context as eager_context

        server_def = getattr(eager_context.context(), "_collective_ops_server_def", None)
        if server_def is not None:
            address = self._cluster_spec.task_address(self._task_type, self._task_id)
            return f"{self._rpc_layer}://{address}"
        with _server_lock:
            if _server is None:
                _server = tf.distribute.Server(self._cluster_spec, job_name=self._task_type,
                                               task_index=self._task_id,
                                               protocol=self._rpc_layer,
                                               config=self.session_config(), start=True)
            return _server.target

    def session(self, config=None, graph=None):
        """A tf.compat.v1.Session of this worker's server (see session_target)."""
        import tensorflow as tf

        return tf.compat.v1.Session(self.session_target(), graph=graph,
                                    config=self.session_config(config))

    # --- the collectives, one op each -----------------------------------

    def _gather_equal(self, tensor, key):
        """Concatenation along axis 0 of equally shaped tensors, rank order."""
        import tensorflow as tf
        from tensorflow.python.ops import collective_ops

        if tf.executing_eagerly():
            return collective_ops.all_gather_v2(tensor, self._size, GROUP_KEY, key,
                                                timeout=self._timeout)
        return collective_ops.all_gather(tensor, self._size, GROUP_KEY, key,
                                         timeout=self._timeout)

    def _reduce(self, tensor, key):
        import tensorflow as tf
        from tensorflow.python.ops import collective_ops

        if tf.executing_eagerly():
            return collective_ops.all_reduce_v2(tensor, self._size, GROUP_KEY, key, "Add", "Id",
                                                timeout=self._timeout)
        return collective_ops.all_reduce(tensor, self._size, GROUP_KEY, key, "Add", "Id",
                                         timeout=self._timeout)

    def _valid_rows(self, counts, chunk):
        """Row indices of the first counts[w] rows of every block w of a
        [world * chunk, ...] buffer."""
        import tensorflow as tf

        total = tf.reduce_sum(counts)
        block = tf.range(self._size, dtype=tf.int64)
        starts = tf.cumsum(counts, exclusive=True)
        return (tf.repeat(block * chunk - starts, counts)
                + tf.range(total, dtype=tf.int64))

    # --- all-to-all -------------------------------------------------------

    def _exchange(self, tensor, send_splits, recv_splits, chunk, key):
        """Rows to every worker, each chunk padded to `chunk` rows, through
        one CollectiveAllToAllV2; the received valid rows in sender order."""
        import tensorflow as tf
        from tensorflow.python.ops import collective_ops

        size = self._size
        tensor = tf.convert_to_tensor(tensor)
        shape = tf.shape(tensor, out_type=tf.int64)
        rows, row_shape = shape[0], shape[1:]
        # Slot of every outgoing row in the [size * chunk] send buffer.
        slots = self._valid_rows(send_splits, chunk)
        buffer = tf.scatter_nd(slots[:, None], tensor, tf.concat([[size * chunk], row_shape], 0))
        buffer = tf.reshape(buffer, tf.concat([[size, chunk], row_shape], 0))
        received = collective_ops.all_to_all_v2(buffer, size, GROUP_KEY, key,
                                                timeout=self._timeout)
        received = tf.reshape(received, tf.concat([[size * chunk], row_shape], 0))
        out = tf.gather(received, self._valid_rows(recv_splits, chunk))
        out.set_shape(tf.TensorShape([None]).concatenate(tensor.shape[1:]))
        del rows
        return out

    def _alltoall(self, tensor, splits, name):
        import tensorflow as tf

        size = self._size
        tensor = tf.convert_to_tensor(tensor)
        if tensor.shape.rank == 0:
            raise ValueError(f"alltoall needs a tensor of rank >= 1 (rows to send); got a "
                             f"scalar {tensor}")
        if splits.shape.rank is not None and (splits.shape.rank != 1 or (
                splits.shape[0] is not None and splits.shape[0] != size)):
            raise ValueError(f"splits must have shape [world_size] = [{size}]; got "
                             f"{splits.shape}")
        with tf.name_scope(name or "sok_alltoall"), tf.device(self._device):
            check = tf.debugging.assert_equal(
                tf.reduce_sum(splits), tf.shape(tensor, out_type=tf.int64)[0],
                message="alltoall: splits must add up to the number of rows of the tensor")
            with tf.control_dependencies([check]):
                splits = tf.identity(splits)
            # [sender, receiver] -> rows; every worker holds the whole matrix.
            matrix = tf.reshape(self._gather_equal(tf.reshape(splits, [1, size]),
                                                   _new_instance_key()), [size, size])
            recv_splits = matrix[:, self._rank]
            # At least one row per chunk, so no buffer is ever empty.
            chunk = tf.maximum(tf.reduce_max(matrix), 1)
            forward_key = _new_instance_key()
            gradient_key = _GradientKey()
            device = self._device

            @tf.custom_gradient
            def exchange(x):
                def grad(dy):
                    with tf.device(device):
                        return self._exchange(tf.convert_to_tensor(dy), recv_splits, splits,
                                              chunk, gradient_key.take())

                return self._exchange(x, splits, recv_splits, chunk, forward_key), grad

            return exchange(tensor), recv_splits

    # --- all-reduce, all-gather, broadcast -------------------------------

    def allreduce(self, tensor, name=None):
        """Sum over workers. Its gradient is the sum of the gradients (as
        Horovod's)."""
        import tensorflow as tf

        with tf.name_scope(name or "sok_allreduce"), tf.device(self._device):
            tensor = tf.convert_to_tensor(tensor)
            key, gradient_key = _new_instance_key(), _GradientKey()
            device = self._device

            @tf.custom_gradient
            def reduce(x):
                def grad(dy):
                    with tf.device(device):
                        return self._reduce(tf.convert_to_tensor(dy), gradient_key.take())

                return self._reduce(x, key), grad

            return reduce(tensor)

    def allgather(self, tensor, name=None):
        """Rank-ordered concatenation; first dimensions may differ. Gradient:
        this worker's rows of the summed gradient (as Horovod's)."""
        import tensorflow as tf

        with tf.name_scope(name or "sok_allgather"), tf.device(self._device):
            tensor = tf.convert_to_tensor(tensor)
            if tensor.shape.rank == 0:
                raise ValueError(f"allgather needs a tensor of rank >= 1; got a scalar {tensor}")
            shape = tf.shape(tensor, out_type=tf.int64)
            counts = tf.reshape(self._gather_equal(shape[:1], _new_instance_key()),
                                [self._size])
            chunk = tf.maximum(tf.reduce_max(counts), 1)
            key, gradient_key = _new_instance_key(), _GradientKey()
            start = tf.reduce_sum(counts[:self._rank])
            device = self._device

            @tf.custom_gradient
            def gather(x):
                padding = tf.zeros(tf.concat([[chunk - shape[0]], shape[1:]], 0), x.dtype)
                gathered = self._gather_equal(tf.concat([x, padding], 0), key)
                out = tf.gather(gathered, self._valid_rows(counts, chunk))
                out.set_shape(tf.TensorShape([None]).concatenate(x.shape[1:]))

                def grad(dy):
                    with tf.device(device):
                        summed = self._reduce(tf.convert_to_tensor(dy), gradient_key.take())
                        return summed[start:start + shape[0]]

                return out, grad

            return gather(tensor)

    def broadcast(self, tensor, root_rank=0, name=None):
        """root_rank's `tensor` on every worker; every worker passes a tensor
        of the same shape and dtype. Gradient (as Horovod's): the summed
        gradient on the root, zeros elsewhere."""
        import tensorflow as tf
        from tensorflow.python.ops import collective_ops

        if isinstance(root_rank, bool) or not isinstance(root_rank, int) or \
                not 0 <= root_rank < self._size:
            raise ValueError(f"root_rank must be an int in [0, {self._size}); got {root_rank!r}")
        with tf.name_scope(name or "sok_broadcast"), tf.device(self._device):
            tensor = tf.convert_to_tensor(tensor)
            is_root = self._rank == root_rank
            key, gradient_key = _new_instance_key(), _GradientKey()
            device = self._device

            def send_receive(x):
                size, timeout = self._size, self._timeout
                if tf.executing_eagerly():
                    if is_root:
                        return collective_ops.broadcast_send_v2(x, size, GROUP_KEY, key,
                                                                timeout=timeout)
                    return collective_ops.broadcast_recv_v2(tf.shape(x), x.dtype, size,
                                                            GROUP_KEY, key, timeout=timeout)
                if x.shape.is_fully_defined():
                    if is_root:
                        return collective_ops.broadcast_send(x, x.shape, x.dtype, size,
                                                             GROUP_KEY, key, timeout=timeout)
                    return collective_ops.broadcast_recv(x.shape, x.dtype, size, GROUP_KEY,
                                                         key, timeout=timeout)
                # The v1 ops need a static shape: gather the root's flattened
                # tensor (the others contribute no rows) and give it their shape.
                flat = tf.reshape(x, [-1])
                rows = flat if is_root else flat[:0]
                counts = tf.reshape(self._gather_equal(tf.shape(rows, out_type=tf.int64),
                                                       key), [size])
                chunk = tf.maximum(tf.reduce_max(counts), 1)
                padding = tf.zeros(tf.reshape(chunk - tf.size(rows, out_type=tf.int64), [1]),
                                   x.dtype)
                gathered = self._gather_equal(tf.concat([rows, padding], 0),
                                              _new_instance_key())
                root_rows = gathered[root_rank * chunk:root_rank * chunk + counts[root_rank]]
                return tf.reshape(root_rows, tf.shape(x))

            @tf.custom_gradient
            def broadcast(x):
                def grad(dy):
                    with tf.device(device):
                        summed = self._reduce(tf.convert_to_tensor(dy), gradient_key.take())
                        return summed if is_root else tf.zeros_like(summed)

                out = send_receive(x)
                out.set_shape(x.shape)
                return out, grad

            return broadcast(tensor)

    def barrier(self):
        """Returns once every worker has called it; works eagerly and, with
        eager execution disabled, through a one-op graph in a Session of this
        worker's server."""
        import tensorflow as tf

        with tf.init_scope():
            if tf.executing_eagerly():
                with tf.device(self._device):
                    self._reduce(tf.zeros([], tf.float32), _new_instance_key()).numpy()
                return
        with tf.Graph().as_default() as graph:
            with tf.device(self._device):
                done = self._reduce(tf.zeros([], tf.float32), _new_instance_key())
            with self.session(graph=graph) as sess:
                sess.run(done)


def create():
    """The communicator for the active tf.distribute strategy (call it under
    the strategy's scope): a single process when the strategy has one replica
    (no strategy, or MirroredStrategy on one device), TFDistribute under a
    MultiWorkerMirroredStrategy with one replica per worker."""
    import tensorflow as tf
    from tensorflow.python.distribute import collective_all_reduce_strategy as mwms

    strategy = tf.distribute.get_strategy()
    replicas = strategy.num_replicas_in_sync
    if replicas == 1:
        return SingleProcess()
    name = type(strategy).__name__
    if not isinstance(strategy.extended, mwms.CollectiveAllReduceExtended) or \
            strategy.cluster_resolver is None or \
            not strategy.cluster_resolver.cluster_spec().as_dict():
        raise NotImplementedError(
            f"comm_tool='tf' supports MultiWorkerMirroredStrategy with one replica per "
            f"worker process; the active {name} has {replicas} replicas in one process, "
            f"which is not supported yet. Run one process per device (python -m "
            f"sok_graph.launch -np N) under MultiWorkerMirroredStrategy, or use "
            f"comm_tool='horovod'.")
    comm = TFDistribute(strategy)
    if replicas != comm.world_size:
        raise NotImplementedError(
            f"comm_tool='tf' supports one replica per worker process; the active {name} has "
            f"{replicas} replicas over {comm.world_size} workers (several devices per worker "
            f"are not supported yet). Give each worker one device, e.g. with python -m "
            f"sok_graph.launch.")
    return comm
