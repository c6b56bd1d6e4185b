"""The tf.distribute engine: TensorFlow's own collective ops across the
workers of a MultiWorkerMirroredStrategy (one replica per worker process).

Use it through `sok.init(comm_tool="tf")` (or `sok.Init`) called under the
strategy's scope; `python -m sok_graph.launch -np N` gives each worker the
TF_CONFIG the strategy reads. Every collective runs on the worker's CPU over
gRPC, in each of these settings (tests/test_tf_distribute_comm.py checks them
on 2 and 3 workers):

- tf.function, called inside `strategy.run` or directly (cross-replica
  context): with one replica per worker both build the same collectives;
- eagerly: each call is a collective of its own (right for set-up, barrier(),
  dump/load; put training steps in a tf.function);
- tf.compat.v1 graph mode, with eager execution disabled before the strategy
  is built or with a tf.Graph in a TF2 program. The Session must be one of
  this worker's gRPC server: ``comm.session()``, or
  ``tf.compat.v1.Session(comm.session_target(), config=comm.session_config())``.
  A plain ``tf.compat.v1.Session()`` is local to its process: it cannot reach
  the other workers (placing the ops fails, as they name this worker's
  device). No RunOptions are needed (see "Sessions" below).

Matching collectives across workers
-----------------------------------
TensorFlow matches a collective by (group key, instance key). This engine uses
one group key of its own (every worker's CPU; far from the small keys that
MultiWorkerMirroredStrategy allocates) and instance keys from a process-wide
counter:

- in a tf.function, keys are fed at every call (as MultiWorkerMirroredStrategy
  does for its own collectives: `capture_call_time_value`), so no key is used
  twice, shapes may change from call to call, and a function retraced on one
  worker only (say, for a batch of another shape) still matches its peers;
- eagerly, every call takes new keys;
- in a Session graph keys are fixed when the graph is built (see below).

So every worker must build its collectives in the same order (the same
tables, lookups and layers) and run the same ones in every step: a Session
that fetches an exchange on one worker only, or a value that one worker
leaves unused so that TensorFlow prunes its op, leaves the others waiting.
A gradient takes keys reserved when its forward op is built, so the order in
which gradients are built does not matter.

Sessions
--------
A distributed Session runs collectives only in steps that carry a collective
graph key. TensorFlow derives that key itself from the `instance_key`
attributes of the "v1" collective ops (CollectiveReduce, CollectiveGather,
CollectiveBcastSend/Recv) a step runs; "v2" ops (keys as input tensors) give
none, and a step of v2 ops alone fails with "Failed to get CollectiveExecutor"
unless RunOptions.experimental.collective_graph_key is set. So Session graphs
get v1 ops, which also accept new shapes in every step; the one v2 op
(CollectiveAllToAllV2: there is no v1 all-to-all) always depends on a v1
gather of the splits in the same step. An all-to-all's instance key stays
tied to the first shape it saw, so in a Session graph each exchange holds a
block of keys, one per padded chunk size (chunks are padded to one of 17
sizes per power of two, at most 1/16 more rows; see _bucket).

Uneven all-to-all
-----------------
CollectiveAllToAllV2 exchanges equal chunks only (a [world_size, ...] input,
chunk w to worker w; CollectiveAllToAllV3 does not work across processes).
So: gather every worker's splits (a [world, world] matrix that all hold), pad
every outgoing chunk to the largest entry of the matrix, exchange, keep the
valid rows of each received chunk. The buffers hold world_size x max(splits)
rows: a very skewed exchange moves up to world_size times the data sent. The
gradient is the reverse exchange with the transposed matrix (no second
gather). allgather with uneven first dimensions is padded the same way.

Stalls and failures
-------------------
Every collective gets a completion timeout of SOK_GRAPH_STALL_TIMEOUT seconds
(default 120; 0 waits forever): a peer that died or never reaches the
collective gives a DeadlineExceededError (or UnavailableError) instead of a
hang. TensorFlow then aborts every collective of the process, which can run
no other one and should exit (the launcher then stops the other workers).

Workers with one GPU each
------------------------
When the strategy was made eagerly and every worker has one GPU and NCCL
(communication/nccl.py; SOK_GRAPH_NCCL), the all-to-all runs on NCCL, GPU
to GPU: the workers agree on it and share rank 0's NCCL unique id when the
engine is made. The other collectives stay on the CPU.
Limits: one replica (device) per worker process (a MirroredStrategy with
several replicas in one process gets MirroredReplicas, replicas.py); the collectives run on the
worker's CPU (except the NCCL all-to-all above; otherwise on a GPU worker
the rows pass through host memory); a
tf.function holding these collectives cannot be saved in a SavedModel (its
keys are fed at call time); TensorFlow 1.15 has none of the v2 ops, so
create() refuses comm_tool "tf" there.
"""

import os
import threading

import tensorflow as tf
from tensorflow.python.distribute import (
    collective_all_reduce_strategy,
    mirrored_strategy,
    multi_worker_util,
)
from tensorflow.python.eager import context as eager_context
from tensorflow.python.ops import collective_ops

from sok_graph import compat
from sok_graph.communication import nccl
from sok_graph.communication.base import (Communicator, SingleProcess, copied_session_config,
                                          pack_chunks, valid_rows)
from sok_graph.communication.replicas import MirroredReplicas
# The launcher sets the variable; its name and default are the launcher's
# (its environment module alone: not the supervisor).
from sok_graph.launch.environment import DEFAULT_STALL_TIMEOUT_S, ENV_NCCL_NVLS
from sok_graph.launch.environment import ENV_STALL_TIMEOUT as STALL_TIMEOUT_ENV

# MultiWorkerMirroredStrategy numbers its groups from 1 (+100000 per strategy
# object); keys of this size never meet them. Keys are int32.
GROUP_KEY = 0x50C06000
_INSTANCE_KEY_START = 1 << 20
_INT32_MAX = 0x7FFFFFFF
# A Session's all-to-all takes one instance key per padded chunk size (see
# _bucket): a block of this many keys.
_BUCKETS = 1024

_key_lock = threading.Lock()
_next_instance_key = _INSTANCE_KEY_START

# The gRPC server started here for TF1-style graph mode (eager
# MultiWorkerMirroredStrategy starts its own); one per process.
_server_lock = threading.Lock()
_server = None

# These methods have no Python control flow on tensors; AutoGraph converting
# them (it converts whatever a tf.function calls) would only cost trace time.
_not_converted = tf.autograph.experimental.do_not_convert

# Where collectives are being built (see _mode).
_EAGER, _FUNCTION, _SESSION = "eager", "function", "session"


def _new_instance_keys(count):
    """The first of `count` consecutive instance keys never handed out before."""
    global _next_instance_key
    with _key_lock:
        first = _next_instance_key
        _next_instance_key += count
    if first + count - 1 > _INT32_MAX:
        raise RuntimeError("sok_graph's tf.distribute engine ran out of collective instance "
                           "keys (2^31 - 1)")
    return first


def _outermost_graph():
    """The default graph, or the function graph a control-flow branch or
    loop body being built belongs to."""
    graph = tf.compat.v1.get_default_graph()
    while getattr(graph, "is_control_flow_graph", False):
        graph = graph.outer_graph
    return graph


def _mode():
    """_EAGER, _FUNCTION (building a tf.function) or _SESSION (building a
    graph for tf.compat.v1.Session)."""
    if tf.executing_eagerly():
        return _EAGER
    return _FUNCTION if _outermost_graph().building_function else _SESSION


def _call_time_keys(count):
    """In a tf.function being built: an int32 placeholder that every call of
    the function feeds with the first of `count` fresh keys (in a function
    called by another, the outer one's call feeds it). Eagerly: that key."""
    graph = _outermost_graph()
    if not tf.executing_eagerly() and graph.building_function:
        with graph.as_default():
            return graph.capture_call_time_value(lambda: _call_time_keys(count),
                                                 tf.TensorSpec([], tf.int32))
    return tf.constant(_new_instance_keys(count), tf.int32)


def _keys(count):
    """`count` instance keys for collectives built now.

    Eagerly and in Session graphs, Python ints, fixed from now on. In a
    tf.function, int32 tensors with fresh values at every call (as
    MultiWorkerMirroredStrategy's own collectives): no key is ever used
    twice, so shapes may change from call to call and a retrace on one
    worker only does not put the workers' keys out of step.
    """
    if _mode() == _FUNCTION:
        first = _call_time_keys(count)
    else:
        first = _new_instance_keys(count)
    return [first] + [first + i for i in range(1, count)]


def _bucket(chunk):
    """(padded, index) for a chunk of `chunk` rows (1 <= chunk < 2^41; also
    elementwise): padded is chunk rounded up to one of 17 steps from 2^b to
    2^(b+1), b = floor(log2 chunk) (exact below 16 rows, at most 1/16 more
    above); index < _BUCKETS names it. A Session's all-to-all keeps one instance key per padded size:
    TensorFlow ties an all-to-all's instance key to its first shape for good,
    and a Session graph's keys are fixed."""
    powers = tf.constant([1 << b for b in range(1, 41)], tf.int64)
    bits = tf.reduce_sum(tf.cast(chunk[..., None] >= powers, tf.int64), axis=-1)
    one = tf.constant(1, tf.int64)
    low = tf.bitwise.left_shift(one, bits)
    step = tf.bitwise.left_shift(one, tf.maximum(bits - 4, 0))
    k = (chunk - low + step - 1) // step
    return low + k * step, 17 * bits + k


def stall_timeout():
    """Seconds a collective may wait for its peers: $SOK_GRAPH_STALL_TIMEOUT,
    default 120; 0 means no timeout. TensorFlow counts the timeout in whole
    microseconds and takes less as 0, so a value under 1e-06 is no timeout
    either (the launcher refuses one)."""
    raw = os.environ.get(STALL_TIMEOUT_ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_STALL_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):  # also refuses nan
        raise ValueError(f"{STALL_TIMEOUT_ENV} must be a number of seconds >= 0 (0: no "
                         f"timeout); got {raw!r}")
    return value


class _GradientKey:
    """The key (or key block) reserved when a forward op is built, for the
    first gradient built from it, so the order in which gradients are built
    does not matter; a later gradient of the same op (tf.gradients called
    again) gets fresh ones from `fresh()`."""

    def __init__(self, reserved, fresh):
        self._reserved, self._fresh = reserved, fresh

    def take(self):
        key, self._reserved = self._reserved, None
        return key if key is not None else self._fresh()


class TFDistribute(Communicator):
    """Collectives among the workers of a MultiWorkerMirroredStrategy; see the
    module's docstring. Made by create()."""

    name = "tf"

    def __init__(self, strategy):
        resolver = strategy.cluster_resolver
        self._cluster_spec = multi_worker_util.normalize_cluster_spec(resolver.cluster_spec())
        self._task_type = resolver.task_type
        self._task_id = resolver.task_id
        self._rpc_layer = resolver.rpc_layer or "grpc"
        # TensorFlow orders a group's members by job name, then task index;
        # id_in_cluster counts the same way (a chief first, then the workers).
        super().__init__(
            world_size=multi_worker_util.worker_count(self._cluster_spec, self._task_type),
            rank=multi_worker_util.id_in_cluster(self._cluster_spec, self._task_type,
                                                 self._task_id))
        self._device = f"/job:{self._task_type}/replica:0/task:{self._task_id}/device:CPU:0"
        # This worker's shards live on its replica's device (its GPU): made
        # eagerly under the strategy without one, a variable lands on the
        # host (measured: every table of a 2-GPU DLRM in host memory, its
        # gather and update on the CPU).
        devices = list(strategy.extended.worker_devices)
        self._table_device = devices[0] if len(devices) == 1 else None
        self._timeout = stall_timeout()
        self._nccl, self._gpu = None, None
        self._start_nccl(strategy)

    def table_scope(self):
        if self._table_device is None:
            return super().table_scope()
        return tf.device(self._table_device)

    def _start_nccl(self, strategy):
        """One GPU per worker: the all-to-all goes GPU to GPU through NCCL
        (communication/nccl.py) when every worker can use it. Decided when
        the engine is made, eagerly (a Session program keeps the CPU
        collectives): the workers vote, and rank 0's NCCL unique id is
        broadcast to the others."""
        if nccl.mode() == "0":
            return
        gpus = [d for d in strategy.extended.worker_devices
                if tf.DeviceSpec.from_string(d).device_type == "GPU"]
        # "auto" takes workers alike: where this one has no GPU, none has,
        # and no vote is needed.
        if not gpus and nccl.mode() == "auto":
            return
        with tf.init_scope():
            if not tf.executing_eagerly():
                return
            ok = len(gpus) == 1 and nccl.usable(gpus, self._size)
            # The workers' clique of an earlier engine over the same cluster
            # is used again where every worker still has it: a communicator
            # per engine would hold NCCL's buffers (outside TensorFlow's
            # allocator) once per engine made.
            key = (repr(sorted(self._cluster_spec.as_dict().items())), self._task_type,
                   self._task_id, gpus[0] if ok else None)
            known = nccl.known_clique(key) if ok else None
            votes = self.allreduce(tf.constant([int(ok), int(known is not None)], tf.int32),
                                   name="sok_nccl_vote").numpy()
            if int(votes[0]) != self._size:
                if nccl.mode() == "1":
                    raise RuntimeError(f"{nccl.ENV}=1 but only {int(votes[0])} of {self._size} "
                                       f"workers have one GPU and NCCL")
                return
            if int(votes[1]) == self._size:
                clique = known
            else:
                unique = nccl.unique_id_hex() if self._rank == 0 else "00" * 128
                shared = self.broadcast(tf.constant(list(bytes.fromhex(unique)), tf.int32), 0,
                                        name="sok_nccl_id").numpy()
                clique = nccl.remember_clique(key, bytes(int(b) for b in shared).hex())
        self._gpu = gpus[0]
        self._nccl = nccl.Transport(clique, self._size)

    @property
    def checks_splits(self):
        return self._nccl is not None

    @property
    def timeout(self):
        """The completion timeout of every collective, in seconds (0: none)."""
        return self._timeout

    def describe(self):
        return f"{super().describe()}, CPU collectives over {self._rpc_layer}"

    # --- graph-mode sessions ----------------------------------------------

    def session_config(self, config=None):
        """A copy of `config` (a tf.compat.v1.ConfigProto, or a new one) that
        names the collective group leader and keeps this worker's Session to
        its own devices: what a Session running these collectives needs."""
        updated = copied_session_config(config)
        updated.experimental.collective_group_leader = multi_worker_util.collective_leader(
            self._cluster_spec, self._task_type, self._task_id)
        del updated.device_filters[:]
        updated.device_filters.append(f"/job:{self._task_type}/task:{self._task_id}")
        return updated

    def session_target(self):
        """The target of this worker's gRPC server, for tf.compat.v1.Session.

        With eager execution on, MultiWorkerMirroredStrategy started the
        server when it was built; with eager execution disabled the first
        call starts one (configured with session_config()), once per process.
        """
        global _server
        if getattr(eager_context.context(), "_collective_ops_server_def", None) is not None:
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
        """A tf.compat.v1.Session of this worker's server (session_target())
        with session_config(config)."""
        return tf.compat.v1.Session(self.session_target(), graph=graph,
                                    config=self.session_config(config))

    # --- single collective ops ----------------------------------------------
    #
    # In Session graphs the "v1" ops (keys as attributes: they give the step
    # its collective graph key, and they accept new shapes in every step);
    # eagerly and in tf.functions the "v2" ops (keys as tensors).

    def _gather_equal(self, tensor, key):
        """Equally shaped tensors of every worker, concatenated along axis 0
        in rank order."""
        if _mode() == _SESSION:
            return collective_ops.all_gather(  # tf2-only: TFDistribute exists on TF 2.x only
                tensor, self._size, GROUP_KEY, key, timeout=self._timeout)
        return collective_ops.all_gather_v2(  # tf2-only: TFDistribute exists on TF 2.x only
            tensor, self._size, GROUP_KEY, key, timeout=self._timeout)

    def _reduce(self, tensor, key):
        if _mode() == _SESSION:
            return collective_ops.all_reduce(  # tf2-only: TFDistribute exists on TF 2.x only
                tensor, self._size, GROUP_KEY, key, "Add", "Id", timeout=self._timeout)
        return collective_ops.all_reduce_v2(  # tf2-only: TFDistribute exists on TF 2.x only
            tensor, self._size, GROUP_KEY, key, "Add", "Id", timeout=self._timeout)

    def _send_or_receive(self, tensor, root_rank, keys):
        """root_rank's tensor, through a broadcast (keys: two)."""
        size, timeout = self._size, self._timeout
        is_root = self._rank == root_rank
        if _mode() != _SESSION:
            if is_root:
                return collective_ops.broadcast_send_v2(  # tf2-only: TFDistribute is TF 2.x only
                    tensor, size, GROUP_KEY, keys[0], timeout=timeout)
            return collective_ops.broadcast_recv_v2(  # tf2-only: TFDistribute is TF 2.x only
                tf.shape(tensor), tensor.dtype, size, GROUP_KEY, keys[0], timeout=timeout)
        if tensor.shape.is_fully_defined():
            if is_root:
                return collective_ops.broadcast_send(  # tf2-only: TFDistribute is TF 2.x only
                    tensor, tensor.shape, tensor.dtype, size, GROUP_KEY, keys[0],
                    timeout=timeout)
            return collective_ops.broadcast_recv(  # tf2-only: TFDistribute is TF 2.x only
                tensor.shape, tensor.dtype, size, GROUP_KEY, keys[0], timeout=timeout)
        # The v1 broadcast needs a static shape: gather the root's flattened
        # tensor (the others send no element) and give it the local shape.
        flat = tf.reshape(tensor, [-1])
        sent = flat if is_root else flat[:0]
        counts = tf.reshape(self._gather_equal(tf.shape(sent, out_type=tf.int64), keys[0]),
                            [size])
        chunk = tf.maximum(tf.reduce_max(counts), 1)
        padding = tf.zeros(tf.reshape(chunk - tf.size(sent, out_type=tf.int64), [1]),
                           tensor.dtype)
        gathered = self._gather_equal(tf.concat([sent, padding], 0), keys[1])
        start = root_rank * chunk
        return tf.reshape(gathered[start:start + counts[root_rank]], tf.shape(tensor))

    # --- all-to-all -----------------------------------------------------------

    def _exchange(self, tensor, send_splits, recv_splits, chunk, key, bucketed):
        """Rows to every worker through one CollectiveAllToAllV2, each chunk
        padded to `chunk` rows; the received valid rows, in sender order.
        `bucketed` (Session graphs): `key` is the first of a block of _BUCKETS
        keys, and the chunk is padded further to the size whose key it takes."""
        size = self._size
        tensor = tf.convert_to_tensor(tensor)
        if bucketed:
            chunk, index = _bucket(chunk)
            key = tf.cast(key + index, tf.int32)
        row_shape = tf.shape(tensor, out_type=tf.int64)[1:]
        buffer = pack_chunks(tensor, send_splits, chunk, size)
        received = collective_ops.all_to_all_v2(  # tf2-only: TFDistribute exists on TF 2.x only
            buffer, size, GROUP_KEY, key, timeout=self._timeout)
        received = tf.reshape(received, tf.concat([[size * chunk], row_shape], 0))
        out = tf.gather(received, valid_rows(recv_splits, chunk))
        out.set_shape(tf.TensorShape([None]).concatenate(tensor.shape[1:]))
        return out

    def sends_padded_rows(self):
        return self._nccl is not None

    @_not_converted
    def _alltoall(self, tensor, splits, name, padded=False):
        if self._nccl is not None:
            with tf.device(self._gpu):
                return self._nccl.alltoall(tensor, splits, self._rank,
                                           name=name or "sok_alltoall", padded=padded)
        size = self._size
        device = self._device
        with tf.name_scope(name or "sok_alltoall"):
            bucketed = _mode() == _SESSION
            if bucketed:
                gather_key, key = _keys(1)[0], _new_instance_keys(_BUCKETS)
                gradient_key = _GradientKey(_new_instance_keys(_BUCKETS),
                                            lambda: _new_instance_keys(_BUCKETS))
            else:
                gather_key, key, reserved = _keys(3)
                gradient_key = _GradientKey(reserved, lambda: _keys(1)[0])
            with tf.device(device):
                # [sender, receiver] -> rows, on every worker.
                matrix = tf.reshape(
                    self._gather_equal(tf.reshape(splits, [1, size]), gather_key), [size, size])
                recv_splits = matrix[:, self._rank]
                # At least one row per chunk: no buffer is ever empty.
                chunk = tf.maximum(tf.reduce_max(matrix), 1)

                # Every tensor the exchange uses is an argument: in graphs,
                # custom_gradient looks for variables upstream of what the
                # function captures, which would reach into the caller's graph.
                @tf.custom_gradient
                def exchange(x, send, receive, rows):
                    def grad(dy):
                        with tf.device(device):
                            return (self._exchange(dy, receive, send, rows, gradient_key.take(),
                                                   bucketed), None, None, None)

                    return self._exchange(x, send, receive, rows, key, bucketed), grad

                return exchange(tensor, splits, recv_splits, chunk), recv_splits

    # --- all-reduce, all-gather, broadcast --------------------------------------

    @_not_converted
    def allreduce(self, tensor, name=None):
        """Sum over workers. Gradient (as Horovod's): the sum of the workers'
        gradients."""
        device = self._device
        with tf.name_scope(name or "sok_allreduce"), tf.device(device):
            tensor = tf.convert_to_tensor(tensor)
            key, reserved = _keys(2)
            gradient_key = _GradientKey(reserved, lambda: _keys(1)[0])

            @tf.custom_gradient
            def reduce(x):
                def grad(dy):
                    with tf.device(device):
                        return self._reduce(tf.convert_to_tensor(dy), gradient_key.take())

                return self._reduce(x, key), grad

            return reduce(tensor)

    @_not_converted
    def allgather(self, tensor, name=None):
        """Every worker's tensor, concatenated along axis 0 in rank order;
        first dimensions may differ. Gradient (as Horovod's): this worker's
        rows of the sum of the workers' gradients."""
        device = self._device
        with tf.name_scope(name or "sok_allgather"), tf.device(device):
            tensor = tf.convert_to_tensor(tensor)
            if tensor.shape.rank == 0:
                raise ValueError(f"allgather needs a tensor of rank >= 1; got a scalar: "
                                 f"{tensor}")
            counts_key, key, reserved = _keys(3)
            gradient_key = _GradientKey(reserved, lambda: _keys(1)[0])
            shape = tf.shape(tensor, out_type=tf.int64)
            counts = tf.reshape(self._gather_equal(shape[:1], counts_key), [self._size])
            chunk = tf.maximum(tf.reduce_max(counts), 1)
            start = tf.reduce_sum(counts[:self._rank])

            # Tensors as arguments, not captures: see _alltoall.
            @tf.custom_gradient
            def gather(x, counts, chunk, start):
                shape = tf.shape(x, out_type=tf.int64)
                padding = tf.zeros(tf.concat([[chunk - shape[0]], shape[1:]], 0), x.dtype)
                gathered = self._gather_equal(tf.concat([x, padding], 0), key)
                out = tf.gather(gathered, valid_rows(counts, chunk))
                out.set_shape(tf.TensorShape([None]).concatenate(x.shape[1:]))

                def grad(dy):
                    with tf.device(device):
                        summed = self._reduce(tf.convert_to_tensor(dy), gradient_key.take())
                        return summed[start:start + shape[0]], None, None, None

                return out, grad

            return gather(tensor, counts, chunk, start)

    @_not_converted
    def broadcast(self, tensor, root_rank=0, name=None):
        """root_rank's `tensor` on every worker; every worker passes a tensor
        of the same shape and dtype. Gradient (as Horovod's): on the root the
        sum of the workers' gradients, zeros elsewhere."""
        if isinstance(root_rank, bool) or not isinstance(root_rank, int) or \
                not 0 <= root_rank < self._size:
            raise ValueError(f"root_rank must be an int in [0, {self._size}); got {root_rank!r}")
        device = self._device
        is_root = self._rank == root_rank
        with tf.name_scope(name or "sok_broadcast"), tf.device(device):
            tensor = tf.convert_to_tensor(tensor)
            *keys, reserved = _keys(3)
            gradient_key = _GradientKey(reserved, lambda: _keys(1)[0])

            @tf.custom_gradient
            def broadcast(x):
                def grad(dy):
                    with tf.device(device):
                        summed = self._reduce(tf.convert_to_tensor(dy), gradient_key.take())
                        if is_root:
                            return summed
                        # The root waits for this worker's share of the sum,
                        # so the reduction must run although its value is not
                        # needed here: zeros_like(summed) would let
                        # TensorFlow prune it, and the root would stall.
                        with tf.control_dependencies([summed]):
                            return tf.zeros_like(dy)

                out = self._send_or_receive(x, root_rank, keys)
                out.set_shape(x.shape)
                return out, grad

            return broadcast(tensor)

    @_not_converted
    def barrier(self):
        """Returns once every worker has called it: eagerly, or with eager
        execution disabled through a one-op graph in a Session of this
        worker's server."""
        with tf.init_scope():
            if tf.executing_eagerly():
                with tf.device(self._device):
                    self._reduce(tf.zeros([], tf.float32), _keys(1)[0]).numpy()
                return
        with tf.Graph().as_default() as graph:
            with tf.device(self._device):
                done = self._reduce(tf.zeros([], tf.float32), _keys(1)[0])
            with self.session(graph=graph) as sess:
                sess.run(done)


def create():
    """The communicator for the active tf.distribute strategy (call it under
    the strategy's scope): a single process when the strategy has one replica
    (no strategy, MirroredStrategy on one device, one worker), TFDistribute
    under a MultiWorkerMirroredStrategy with one replica per worker,
    MirroredReplicas under a MirroredStrategy with several devices in this
    process."""
    strategy = tf.distribute.get_strategy()
    replicas = strategy.num_replicas_in_sync
    if replicas == 1:
        return SingleProcess()
    # The strategy's NCCL collectives start after this: NVLink multicast
    # stays off unless the user turned it on (it can take a shared host's
    # GPUs out of service).
    os.environ.setdefault(ENV_NCCL_NVLS, "0")
    name = type(strategy).__name__
    if compat.IS_TF1:
        raise NotImplementedError(
            f"comm_tool='tf' needs TensorFlow 2.x (its all-to-all and timeouts); the active "
            f"{name} has {replicas} replicas on TensorFlow {tf.__version__}. Use "
            f"comm_tool='horovod'.")
    resolver = strategy.cluster_resolver
    multi_worker = isinstance(strategy.extended,
                              collective_all_reduce_strategy.CollectiveAllReduceExtended)
    if not multi_worker or resolver is None or not resolver.cluster_spec().as_dict():
        # Every replica in this process: each replica is a worker.
        if not isinstance(strategy.extended, mirrored_strategy.MirroredExtended):
            raise NotImplementedError(
                f"comm_tool='tf' supports MirroredStrategy and MultiWorkerMirroredStrategy; "
                f"the active strategy is a {name} with {replicas} replicas")
        return MirroredReplicas(strategy)
    comm = TFDistribute(strategy)
    if replicas != comm.world_size:
        raise NotImplementedError(
            f"comm_tool='tf' supports one replica per worker process; the active {name} has "
            f"{replicas} replicas over {comm.world_size} workers (several devices per worker "
            f"are not supported yet). Give each worker one device, e.g. with python -m "
            f"sok_graph.launch.")
    return comm
