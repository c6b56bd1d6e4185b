"""The tf.distribute engine (comm_tool="tf") across CPU worker processes.

Each test starts N workers with `python -m sok_graph.launch -np N`; the
workers run this file as a script (`... this_file.py worker MODE OUTDIR`),
build a MultiWorkerMirroredStrategy from the launcher's TF_CONFIG, call
sok.init(comm_tool="tf") under it and check every collective and its
gradient against numpy: every worker can compute what every other worker
sends, so each checks its own received values exactly.

Modes:
  tf2  (2 workers) eager ops and barrier; tf.function called directly and
       through strategy.run, and one called with other shapes and
       differentiated outside; a tf.compat.v1 Session of the worker's server
       (the one eager MultiWorkerMirroredStrategy started); a timing
  tf1  (3 workers: another group size, a worker that sends nothing) eager
       execution disabled before the strategy is built; Session of a server
       the engine starts, also fed other shapes in every step; barrier through
       a Session; a collective whose peers never come fails after
       SOK_GRAPH_STALL_TIMEOUT seconds

Each launch costs a TensorFlow start per worker; two launches keep the file
under a minute on a 2-core machine.
"""

import collections
import contextlib
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from multiworker.launching import needs_tf2_collectives

ROW_DIM = 3
GATHER_DIM = 2
# The whole job, generously, for a loaded 2-core machine; a hang fails the
# test instead of stalling the suite.
JOB_TIMEOUT_S = 150
STALL_TIMEOUT_S = 2.0
MODES = ("tf2", "tf1")


# --- what every worker sends, and what it must receive (numpy) -----------

def split_matrix(world, variant=0):
    """[sender, receiver] -> rows. Variant 0: zeros included, and with 3+
    workers the last one sends nothing at all; 1: another pattern; 2: chunks
    of 33 rows and more (padded further in Session graphs)."""
    m = np.array([[(3 * s + 2 * d + 1 + variant * (s + 2 * d + 1)) % 4 for d in range(world)]
                  for s in range(world)], np.int64)
    if variant == 0 and world >= 3:
        m[world - 1] = 0
    if variant == 2:
        m += 33
    return m


VARIANTS = (1, 2, 0)


def send_rows(sender, n):
    i = np.arange(n, dtype=np.float32)[:, None]
    k = np.arange(ROW_DIM, dtype=np.float32)[None, :]
    return (1000.0 * sender + 10.0 * i + 0.25 * k).astype(np.float32)


def send_ids(sender, n):
    # Beyond int32, so a lossy cast anywhere shows.
    return sender * 10**12 + 7 * np.arange(n, dtype=np.int64)


def received(matrix, receiver, sent):
    """What `receiver` gets: from every sender in rank order, its block."""
    parts = []
    for s in range(matrix.shape[0]):
        start = matrix[s, :receiver].sum()
        parts.append(sent[s][start:start + matrix[s, receiver]])
    return np.concatenate(parts)


def loss_weights(receiver, n):
    return (0.5 * np.arange(n * ROW_DIM).reshape(n, ROW_DIM) + receiver).astype(np.float32)


def alltoall_grad(matrix, sender):
    """d/d(sender's rows) of sum over receivers of sum(received * weights):
    each row gets the weights of the position it lands at."""
    grad = np.zeros((matrix[sender].sum(), ROW_DIM), np.float32)
    for d in range(matrix.shape[0]):
        weights = loss_weights(d, matrix[:, d].sum())
        at = matrix[:sender, d].sum()
        start = matrix[sender, :d].sum()
        grad[start:start + matrix[sender, d]] = weights[at:at + matrix[sender, d]]
    return grad


def expected_exchange(world, rank, variant):
    """(received rows, received splits, gradient of sum(received * weights))."""
    m = split_matrix(world, variant)
    rows = received(m, rank, [send_rows(s, m[s].sum()) for s in range(world)])
    return rows, m[:, rank], alltoall_grad(m, rank)


def gather_rows(rank):
    n = [2, 0, 3, 1][rank % 4]
    return (100.0 * rank + np.arange(n * GATHER_DIM).reshape(n, GATHER_DIM)).astype(np.float32)


def gather_weights(total):
    return (np.arange(total * GATHER_DIM).reshape(total, GATHER_DIM) + 1.0).astype(np.float32)


def broadcast_value(rank):
    return (np.arange(6).reshape(2, 3) * 1.5 + 100 * rank).astype(np.float32)


def expected(world, rank):
    m = split_matrix(world)
    gathered = np.concatenate([gather_rows(w) for w in range(world)])
    start = sum(len(gather_rows(w)) for w in range(rank))
    root = world - 1
    return {
        "recv_rows": received(m, rank, [send_rows(s, m[s].sum()) for s in range(world)]),
        "recv_splits": m[:, rank],
        "recv_ids": received(m, rank, [send_ids(s, m[s].sum()) for s in range(world)]),
        "recv_id_splits": m[:, rank],
        "grad_rows": alltoall_grad(m, rank),
        "empty": np.zeros((0, ROW_DIM), np.float32),
        "empty_splits": np.zeros(world, np.int64),
        "sum_float": sum((w + 1) * np.arange(6, dtype=np.float32).reshape(2, 3)
                         for w in range(world)),
        "sum_int": sum(w * 10**12 + np.arange(4, dtype=np.int64) for w in range(world)),
        "grad_sum": np.full((2, 3), sum(w + 1 for w in range(world)), np.float32),
        "gathered": gathered,
        "grad_gathered": world * gather_weights(len(gathered))[
            start:start + len(gather_rows(rank))],
        "bcast": broadcast_value(root),
        "bcast_dynamic": broadcast_value(root),
        "grad_bcast": (np.full((2, 3), sum(w + 1 for w in range(world)), np.float32)
                       if rank == root else np.zeros((2, 3), np.float32)),
    }


SMALL = ("recv_rows", "recv_splits", "grad_rows", "sum_float")


def build(comm, tf, small=False):
    """Every collective, with gradients (graph mode: tf.function or Session);
    `small`: only an alltoall with its gradient and an allreduce (the SMALL
    results), where a setting needs checking but not every op again."""
    world, rank = comm.world_size, comm.rank
    m = split_matrix(world)
    n = int(m[rank].sum())
    x = tf.constant(send_rows(rank, n))
    recv_rows, recv_splits = comm.alltoall(x, tf.constant(m[rank]))
    loss = tf.reduce_sum(recv_rows * loss_weights(rank, int(m[:, rank].sum())))
    summand = tf.constant((rank + 1) * np.arange(6, dtype=np.float32).reshape(2, 3))
    sum_float = comm.allreduce(summand)
    if small:
        return {"recv_rows": recv_rows, "recv_splits": recv_splits,
                "grad_rows": tf.gradients(loss, x)[0], "sum_float": sum_float}
    # int32 splits are accepted too.
    recv_ids, recv_id_splits = comm.alltoall(tf.constant(send_ids(rank, n)),
                                             tf.constant(m[rank].astype(np.int32)))
    empty, empty_splits = comm.alltoall(tf.zeros([0, ROW_DIM]), tf.zeros([world], tf.int64))

    sum_int = comm.allreduce(tf.constant(rank * 10**12 + np.arange(4, dtype=np.int64)))

    # Unknown static row counts, as in a real step.
    rows = tf.compat.v1.placeholder_with_default(gather_rows(rank), [None, GATHER_DIM])
    gathered = comm.allgather(rows)
    total = sum(len(gather_rows(w)) for w in range(world))
    gather_loss = tf.reduce_sum(gathered * gather_weights(total))

    value = tf.constant(broadcast_value(rank))
    bcast = comm.broadcast(value, root_rank=world - 1)
    dynamic = tf.compat.v1.placeholder_with_default(broadcast_value(rank), [None, None])
    bcast_dynamic = comm.broadcast(dynamic, root_rank=world - 1)

    return {
        "recv_rows": recv_rows, "recv_splits": recv_splits,
        "recv_ids": recv_ids, "recv_id_splits": recv_id_splits,
        "grad_rows": tf.gradients(loss, x)[0],
        "empty": empty, "empty_splits": empty_splits,
        "sum_float": sum_float, "sum_int": sum_int,
        "grad_sum": tf.gradients(tf.reduce_sum(sum_float) * (rank + 1), summand)[0],
        "gathered": gathered, "grad_gathered": tf.gradients(gather_loss, rows)[0],
        "bcast": bcast, "bcast_dynamic": bcast_dynamic,
        "grad_bcast": tf.gradients(tf.reduce_sum(bcast) * (rank + 1), value)[0],
    }


def check(where, got, want):
    assert sorted(got) == sorted(want), (where, sorted(got), sorted(want))
    for key, value in want.items():
        value_got = np.asarray(got[key])
        assert value_got.dtype == value.dtype, (where, key, value_got.dtype, value.dtype)
        # Sums of small exact float32 values: equality, not closeness.
        np.testing.assert_array_equal(value_got, value, err_msg=f"{where}: {key}")


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def _steady_alltoall_ms(comm, tf, rows=4096, dim=16, calls=20):
    """Median time of a tf.function doing one uneven alltoall of float rows."""
    world, rank = comm.world_size, comm.rank
    splits = np.full(world, rows // world, np.int64)
    splits[rank] += rows - splits.sum()
    x = tf.constant(np.ones((rows, dim), np.float32))

    @tf.function
    def step():
        return comm.alltoall(x, tf.constant(splits))[0]

    step()
    times = []
    for _ in range(calls):
        times.append(_timed(lambda: step().numpy())[1])
    return 1000 * float(np.median(times))


def worker(mode, outdir):
    import tensorflow as tf

    import sok_graph as sok
    from sok_graph import communication
    from sok_graph.communication import tf_distribute

    if mode == "tf1":
        tf.compat.v1.disable_eager_execution()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        comm = sok.init(comm_tool="tf")
    world = int(os.environ["SOK_GRAPH_WORLD_SIZE"])
    rank = int(os.environ["SOK_GRAPH_RANK"])
    assert isinstance(comm, tf_distribute.TFDistribute) and comm.name == "tf", comm
    assert (comm.world_size, comm.rank) == (world, rank), comm.describe()
    assert comm.timeout == tf_distribute.stall_timeout(), comm.timeout
    want = expected(world, rank)
    timings = {}

    def run_session(label, small=False):
        expect = {k: want[k] for k in SMALL} if small else want
        with tf.Graph().as_default():
            fetches = build(comm, tf, small)
            with comm.session() as sess:
                got, timings[label + "_first_s"] = _timed(lambda: sess.run(fetches))
                check(label, got, expect)
                got, timings[label + "_again_s"] = _timed(lambda: sess.run(fetches))
                check(label + " again", got, expect)

    if mode == "tf2":
        # Eagerly: v2 ops, a new collective per call.
        m = split_matrix(world)
        rows, splits = comm.alltoall(send_rows(rank, int(m[rank].sum())), m[rank])
        np.testing.assert_array_equal(rows.numpy(), want["recv_rows"])
        np.testing.assert_array_equal(splits.numpy(), want["recv_splits"])
        with tf.GradientTape() as tape:
            x = tf.constant(send_rows(rank, int(m[rank].sum())))
            tape.watch(x)
            loss = tf.reduce_sum(comm.alltoall(x, m[rank])[0]
                                 * loss_weights(rank, int(m[:, rank].sum())))
        np.testing.assert_array_equal(tape.gradient(loss, x).numpy(), want["grad_rows"])
        np.testing.assert_array_equal(comm.allgather(gather_rows(rank)).numpy(),
                                      want["gathered"])
        np.testing.assert_array_equal(comm.broadcast(broadcast_value(rank),
                                                     root_rank=world - 1).numpy(), want["bcast"])
        np.testing.assert_array_equal(
            comm.allreduce(tf.constant((rank + 1) * np.arange(6, dtype=np.float32)
                                       .reshape(2, 3))).numpy(), want["sum_float"])
        _, timings["barrier_s"] = _timed(comm.barrier)

        # tf.function in cross-replica context (called directly).
        def step():
            return build(comm, tf)

        direct = tf.function(step)
        _, timings["function_trace_s"] = _timed(direct.get_concrete_function)
        got, timings["function_first_s"] = _timed(direct)
        check("tf.function", got, want)
        got, timings["function_again_s"] = _timed(direct)
        check("tf.function again", got, want)

        # One function, called with other row counts (no retrace: its
        # signature has none) and differentiated from outside (the gradient
        # runs in a backward function of its own).
        @tf.function(input_signature=[tf.TensorSpec([None, ROW_DIM], tf.float32),
                                      tf.TensorSpec([world], tf.int64)])
        def exchange(x, splits):
            return comm.alltoall(x, splits)

        for variant in VARIANTS:
            m = split_matrix(world, variant)
            x = tf.constant(send_rows(rank, int(m[rank].sum())))
            with tf.GradientTape() as tape:
                tape.watch(x)
                rows, splits = exchange(x, tf.constant(m[rank]))
                loss = tf.reduce_sum(rows * loss_weights(rank, int(m[:, rank].sum())))
            want_rows, want_splits, want_grad = expected_exchange(world, rank, variant)
            np.testing.assert_array_equal(rows.numpy(), want_rows)
            np.testing.assert_array_equal(splits.numpy(), want_splits)
            np.testing.assert_array_equal(tape.gradient(loss, x).numpy(), want_grad)

        # tf.function around strategy.run (replica context). One replica per
        # worker: its results come back as they are.
        @tf.function
        def in_run():
            return strategy.run(build, args=(comm, tf, True))

        got, timings["strategy_run_first_s"] = _timed(in_run)
        check("strategy.run", got, {k: want[k] for k in SMALL})

        # The server eager MultiWorkerMirroredStrategy started (tf1 mode runs
        # everything in a Session of a server the engine starts).
        run_session("session", small=True)
        timings["alltoall_4096x16_ms"] = _steady_alltoall_ms(comm, tf)
    else:
        with strategy.scope():
            run_session("session")
        _, timings["barrier_s"] = _timed(comm.barrier)

        # Other row counts in every step of one Session graph.
        with tf.Graph().as_default():
            x = tf.compat.v1.placeholder(tf.float32, [None, ROW_DIM])
            splits = tf.compat.v1.placeholder(tf.int64, [world])
            weights = tf.compat.v1.placeholder(tf.float32, [None, ROW_DIM])
            rows, recv_splits = comm.alltoall(x, splits)
            grad = tf.gradients(tf.reduce_sum(rows * weights), x)[0]
            gathered = comm.allgather(x)
            with comm.session() as sess:
                for variant in VARIANTS:
                    m = split_matrix(world, variant)
                    sent = send_rows(rank, int(m[rank].sum()))
                    got = sess.run([rows, recv_splits, grad, gathered], {
                        x: sent, splits: m[rank],
                        weights: loss_weights(rank, int(m[:, rank].sum()))})
                    for g, w in zip(got[:3], expected_exchange(world, rank, variant)):
                        np.testing.assert_array_equal(g, w, err_msg=f"variant {variant}")
                    np.testing.assert_array_equal(got[3], np.concatenate(
                        [send_rows(w, int(m[w].sum())) for w in range(world)]))

        # Peers that never join: the collective fails after the stall
        # timeout instead of hanging (and leaves this process's collectives
        # aborted, so it comes last).
        os.environ[tf_distribute.STALL_TIMEOUT_ENV] = str(STALL_TIMEOUT_S)
        with strategy.scope():
            impatient = communication.create("tf")
        assert impatient.timeout == STALL_TIMEOUT_S, impatient.timeout
        flag = os.path.join(outdir, "stall_test_done")
        if rank == 0:
            with tf.Graph().as_default():
                lonely = impatient.allreduce(tf.ones([3]))
                with impatient.session() as sess:
                    start = time.perf_counter()
                    try:
                        sess.run(lonely)
                    except (tf.errors.DeadlineExceededError, tf.errors.UnavailableError) as e:
                        timings["stall_error"] = type(e).__name__
                    else:
                        raise AssertionError("a collective without its peer returned")
                    timings["stall_s"] = time.perf_counter() - start
            assert STALL_TIMEOUT_S * 0.9 <= timings["stall_s"] <= STALL_TIMEOUT_S + 30, timings
            open(flag, "w").close()
        else:
            deadline = time.time() + 90
            while not os.path.exists(flag):
                assert time.time() < deadline, "rank 0 never finished its stall test"
                time.sleep(0.05)

    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump(timings, f)
    print(f"rank {rank} of {world}: all checks passed; {json.dumps(timings)}", flush=True)


def _child_env():
    """Environment for child processes: they import the sok_graph this test
    imported, with the default stall timeout."""
    import sok_graph

    site = os.path.dirname(os.path.dirname(os.path.abspath(sok_graph.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [site] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    env.pop("SOK_GRAPH_STALL_TIMEOUT", None)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def launch(tmp_path, world, mode):
    env = _child_env()
    # CPU workers also where a GPU is visible (the launcher gives each GPU
    # worker a GPU of its own).
    cmd = [sys.executable, "-m", "sok_graph.launch", "-np", str(world), "--cpu", "--timeout",
           str(JOB_TIMEOUT_S), os.path.abspath(__file__), "worker", mode, str(tmp_path)]
    proc = subprocess.run(cmd, check=False, env=env, cwd=str(tmp_path), capture_output=True,
                          text=True, timeout=JOB_TIMEOUT_S + 30)
    assert proc.returncode == 0, (f"{' '.join(cmd)} exited with {proc.returncode}\n"
                                  f"stdout:\n{proc.stdout[-6000:]}\nstderr:\n{proc.stderr[-6000:]}")
    timings = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    print(f"{world} workers, {mode}: {timings}")
    return timings


@needs_tf2_collectives
def test_two_workers_eager_tf_function_strategy_run_and_session(tmp_path):
    launch(tmp_path, 2, "tf2")


@needs_tf2_collectives
def test_three_workers_tf1_graph_mode_session_barrier_and_stall_timeout(tmp_path):
    timings = launch(tmp_path, 3, "tf1")
    assert timings[0]["stall_error"] in ("DeadlineExceededError", "UnavailableError")


def test_without_a_multi_worker_strategy_it_is_a_single_process():
    import tensorflow as tf

    from sok_graph import communication

    assert isinstance(communication.create("tf"), communication.SingleProcess)
    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
        assert isinstance(communication.create("tf"), communication.SingleProcess)


@needs_tf2_collectives
@pytest.mark.parametrize("mode", ["function", "graph"])
def test_replicas_in_one_process_are_the_workers(mode):
    """MirroredStrategy over 3 logical CPUs: comm_tool='tf' makes each
    replica a worker; every collective and its gradient vs numpy, and clear
    errors outside strategy.run (tests/multiworker/replica_checks.py; a fresh
    process, as the logical CPUs must exist before TensorFlow starts)."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multiworker",
                          "replica_checks.py")
    proc = subprocess.run([sys.executable, script, "--mode", mode, "--replicas", "3"],
                          check=False, env=_child_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and "OK" in proc.stdout, (proc.stdout + proc.stderr)[-4000:]


@needs_tf2_collectives
def test_a_modules_tables_sharded_over_replicas_are_in_its_trainable_variables():
    """SOK's pattern, split_embedding_variable_from_others(
    model.trainable_variables), on a tf.Module under a MirroredStrategy of 2
    logical CPUs: its static and dynamic tables, sharded over the replicas,
    were missing from trainable_variables (tf.Module lists tf.Variables),
    so the step trained the dense weight alone, without an error. Rows and
    weight now equal plain TensorFlow's under the same strategy
    (tests/multiworker/mirrored_module.py; a fresh process, as the logical
    CPUs must exist before TensorFlow starts)."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multiworker",
                          "mirrored_module.py")
    proc = subprocess.run([sys.executable, script, "--replicas", "2"], check=False,
                          env=_child_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "OK" in proc.stdout, (proc.stdout + proc.stderr)[-4000:]


@needs_tf2_collectives
def test_a_checkpoint_restores_into_another_number_of_replicas(tmp_path):
    """tf.train.Checkpoint of a static and a dynamic table written by 2
    replicas (each a shard) and read by 1 (plain tables, no strategy) and 3,
    and written by 1 and read by 2: every row comes back, each shard holding
    the keys it owns (tests/multiworker/replica_checkpoint.py; fresh
    processes, as the logical CPUs must exist before TensorFlow starts).
    Each shard saved and restored its own rows, so 2 -> 1 and 1 -> 2
    restored nothing and 2 -> 3 left keys in shards that do not own them,
    without an error. Also in a Session's graph, and a table of other rows
    is refused before any shard changes."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multiworker",
                          "replica_checkpoint.py")

    def run(replicas, phase, path, *more):
        proc = subprocess.run([sys.executable, script, "--replicas", str(replicas), "--phase",
                               phase, "--path", path, *more], check=False, env=_child_env(),
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0 and "OK" in proc.stdout, \
            (replicas, phase, more, (proc.stdout + proc.stderr)[-4000:])

    by_two, by_one = str(tmp_path / "two" / "ckpt"), str(tmp_path / "one" / "ckpt")
    run(2, "save", by_two)
    run(1, "load", by_two)
    run(3, "load", by_two)
    run(2, "load", by_two, "--graph")  # a Session's restore, no initializer run
    run(1, "save", by_one)
    run(2, "load", by_one)


def _unconnected(world=2, rank=0):
    """A TFDistribute for a cluster that is never started: enough to check
    what happens before any collective runs."""
    import tensorflow as tf

    from sok_graph.communication import tf_distribute

    cluster = tf.train.ClusterSpec({"worker": [f"127.0.0.1:{1 + w}" for w in range(world)]})

    class Strategy:
        cluster_resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            cluster, task_type="worker", task_id=rank)

        class extended:  # noqa: N801 (the strategy's attribute)
            worker_devices = (f"/job:worker/replica:0/task:{rank}/device:CPU:0",)

    return tf_distribute.TFDistribute(Strategy)


def test_arguments_are_checked_before_any_collective():
    import tensorflow as tf

    comm = _unconnected(world=3, rank=1)
    assert (comm.world_size, comm.rank, comm.name) == (3, 1, "tf")
    with pytest.raises(ValueError, match=r"splits must have shape \[world_size\] = \[3\]"):
        comm.alltoall(tf.zeros([4, 2]), [2, 2])
    with pytest.raises(ValueError, match="alltoall needs a tensor of rank >= 1"):
        comm.alltoall(tf.constant(1.0), [1, 0, 0])
    # Eagerly the splits' sum is checked before the first collective.
    with pytest.raises(tf.errors.InvalidArgumentError, match="splits must add up"):
        comm.alltoall(tf.zeros([4, 2]), [1, 1, 1])
    with pytest.raises(ValueError, match="allgather needs a tensor of rank >= 1"):
        comm.allgather(tf.constant(1.0))
    for root in (3, -1, 1.0, True):
        with pytest.raises(ValueError, match=r"root_rank must be an int in \[0, 3\)"):
            comm.broadcast(tf.zeros([2]), root_rank=root)


def test_session_config_names_the_group_leader_and_this_worker():
    import tensorflow as tf

    given = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=3)
    given.device_filters.append("/job:other")
    config = _unconnected(world=2, rank=1).session_config(given)
    assert config.experimental.collective_group_leader == "/job:worker/replica:0/task:0"
    assert list(config.device_filters) == ["/job:worker/task:1"]
    assert config.inter_op_parallelism_threads == 3
    assert list(given.device_filters) == ["/job:other"]  # a copy: the argument is unchanged
    with pytest.raises(TypeError, match="config must be a tf.compat.v1.ConfigProto"):
        _unconnected().session_config({"device_filters": []})


def test_session_config_sees_the_contexts_gpus(monkeypatch):
    """A Session of an engine sees the logical and visible GPUs the eager
    context was given (without them two replicas on logical GPUs of one
    physical GPU share one Session device and their collectives hang); what
    the caller's config says itself wins."""
    import tensorflow as tf
    from sok_graph.communication import base

    context_config = tf.compat.v1.ConfigProto()
    context_config.gpu_options.visible_device_list = "1"
    for limit in (4096, 2048):
        context_config.gpu_options.experimental.virtual_devices.add().memory_limit_mb.append(limit)
    monkeypatch.setattr(base, "_context_gpu_options", lambda: context_config.gpu_options)

    config = base.copied_session_config(None)
    assert config.gpu_options.visible_device_list == "1"
    assert [list(v.memory_limit_mb) for v in config.gpu_options.experimental.virtual_devices] \
        == [[4096], [2048]]
    given = tf.compat.v1.ConfigProto()
    given.gpu_options.visible_device_list = "0"
    given.gpu_options.experimental.virtual_devices.add().memory_limit_mb.append(1024)
    config = base.copied_session_config(given)
    assert config.gpu_options.visible_device_list == "0"
    assert [list(v.memory_limit_mb) for v in config.gpu_options.experimental.virtual_devices] \
        == [[1024]]
    monkeypatch.setattr(base, "_context_gpu_options", lambda: None)  # TF 1.15 without a context
    assert not base.copied_session_config(None).gpu_options.experimental.virtual_devices


def test_session_chunk_sizes_and_their_keys():
    # In Session graphs an all-to-all's instance key is base + index, so one
    # index must always mean one padded size, and the padding must stay small.
    from sok_graph.communication import tf_distribute

    chunks = np.unique(np.concatenate([np.arange(1, 3000), np.geomspace(3000, 2**40, 400)
                                       .astype(np.int64)]))
    padded, index = (t.numpy() for t in tf_distribute._bucket(chunks))
    assert np.all(padded >= chunks)
    assert np.all(padded[chunks < 16] == chunks[chunks < 16])
    assert np.all((padded - chunks) * 16 <= chunks)
    assert index.min() >= 0 and index.max() < tf_distribute._BUCKETS
    size_of = {}
    for i, p in zip(index.tolist(), padded.tolist()):
        assert size_of.setdefault(i, p) == p, (i, p, size_of[i])


@pytest.mark.parametrize("raw, seconds", [(None, 120.0), ("", 120.0), ("7.5", 7.5), ("0", 0.0)])
def test_stall_timeout_from_the_environment(monkeypatch, raw, seconds):
    from sok_graph.communication import tf_distribute

    if raw is None:
        monkeypatch.delenv(tf_distribute.STALL_TIMEOUT_ENV, raising=False)
    else:
        monkeypatch.setenv(tf_distribute.STALL_TIMEOUT_ENV, raw)
    assert tf_distribute.stall_timeout() == seconds


@pytest.mark.parametrize("raw", ["-1", "soon", "nan", "inf"])
def test_bad_stall_timeout_is_refused(monkeypatch, raw):
    from sok_graph.communication import tf_distribute

    monkeypatch.setenv(tf_distribute.STALL_TIMEOUT_ENV, raw)
    with pytest.raises(ValueError, match="SOK_GRAPH_STALL_TIMEOUT must be a number"):
        tf_distribute.stall_timeout()


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "worker" or sys.argv[2] not in MODES:
        sys.exit(f"usage: {sys.argv[0]} worker {'|'.join(MODES)} OUTDIR")
    worker(sys.argv[2], sys.argv[3])


def test_nccl_setting_is_checked(monkeypatch):
    """SOK_GRAPH_NCCL takes auto (the default), 0 or 1; =1 where the ranks
    are not GPUs is an error that says why, never a silent fallback."""
    from sok_graph.communication import nccl

    monkeypatch.setenv("SOK_GRAPH_NCCL", "yes")
    with pytest.raises(ValueError, match="SOK_GRAPH_NCCL must be 'auto', '0' or '1'; got 'yes'"):
        nccl.mode()
    monkeypatch.setenv("SOK_GRAPH_NCCL", "1")
    with pytest.raises(RuntimeError, match="SOK_GRAPH_NCCL=1 but NCCL cannot exchange the rows: "
                                           "the ranks are not all GPUs"):
        nccl.usable(["/cpu:0", "/cpu:1"])
    monkeypatch.setenv("SOK_GRAPH_NCCL", "auto")
    assert nccl.usable(["/cpu:0", "/cpu:1"]) is False
    # auto needs two ranks or more, wherever they are.
    assert nccl.usable(["/gpu:0"]) is False
    assert nccl.usable(["/gpu:0"], world_size=1) is False
    monkeypatch.setenv("SOK_GRAPH_NCCL", "0")
    assert nccl.usable(["/gpu:0", "/gpu:1"]) is False
    monkeypatch.delenv("SOK_GRAPH_NCCL")
    assert nccl.mode() == "auto"


def test_nccl_is_not_used_on_logical_gpus_that_share_one(monkeypatch):
    """Two logical GPUs cut from one physical GPU (tf.config's logical
    device configuration) cannot be two NCCL ranks: auto keeps the engine's
    own exchange, 1 says why."""
    import tensorflow as tf

    from sok_graph.communication import nccl

    monkeypatch.setattr(nccl.library, "built_with_cuda", lambda: True)
    monkeypatch.setattr(nccl, "load_library", lambda: object())
    here = "/job:localhost/replica:0/task:0"
    logical = {"GPU": [f"{here}/device:GPU:0", f"{here}/device:GPU:1"]}
    physical = {"GPU": 1}
    device = collections.namedtuple("LogicalDevice", "name device_type")  # TF 1.15 has none
    monkeypatch.setattr(tf.config.experimental, "list_logical_devices",
                        lambda kind: [device(name, kind) for name in logical[kind]])
    monkeypatch.setattr(tf.config.experimental, "list_physical_devices",
                        lambda kind: [None] * physical[kind])
    gpus = ["/gpu:0", "/gpu:1"]
    monkeypatch.setenv("SOK_GRAPH_NCCL", "auto")
    assert nccl.usable(gpus) is False
    monkeypatch.setenv("SOK_GRAPH_NCCL", "1")
    with pytest.raises(RuntimeError, match="this process's 2 logical GPUs share fewer physical "
                                           "ones"):
        nccl.usable(gpus)
    physical["GPU"] = 2
    assert nccl.usable(gpus) is True
    # One GPU per process: once a MultiWorkerMirroredStrategy connects the
    # cluster, the logical devices list the other workers' GPUs too; those
    # are not this process's and do not make its one GPU a shared one.
    logical["GPU"] = [f"{here}/device:GPU:0", "/job:worker/replica:0/task:1/device:GPU:0"]
    physical["GPU"] = 1
    assert nccl.usable(["/gpu:0"], world_size=2) is True


def _replica_asserts(register):
    """The ops of a tf.function in which two devices (replicas) each build
    two asserts, in replica order; with `register`, the graph is passed to
    compat.order_side_effects_per_replica first. Returns {name: op}."""
    import tensorflow as tf

    from sok_graph import compat

    # Only traced, never run: the device names need not exist.
    @tf.function
    def step(x):
        if register:
            assert compat.order_side_effects_per_replica(tf.compat.v1.get_default_graph())
        outs = []
        for r in range(2):
            # As a MirroredStrategy builds them: replica N > 0 in "replica_N/".
            scope = tf.name_scope(f"replica_{r}") if r else contextlib.nullcontext()
            with scope, tf.device(f"/cpu:{r}"):
                first = tf.debugging.Assert(x > -1.0, [x], name=f"first{r}")
                with tf.control_dependencies([first]):
                    y = x + float(r)
                second = tf.debugging.Assert(y > -1.0, [y], name=f"second{r}")
                # A side effect the replica pins to the host (as sok's byte
                # count is), on one device for both replicas.
                with tf.device("/device:CPU:0"):
                    host = tf.debugging.Assert(y > -2.0, [y], name=f"host{r}")
                with tf.control_dependencies([second, host]):
                    outs.append(tf.identity(y))
        return outs

    graph = step.get_concrete_function(tf.TensorSpec([], tf.float32)).graph
    # In a function an assert is a stateful cond ("<name>/AssertGuard").
    return {op.name.split("/")[-2]: op for op in graph.get_operations()
            if op.name.endswith("/AssertGuard")}


def _waits_for(op, other):
    """Whether `op` depends on `other` through control inputs or data."""
    seen, todo = set(), [op]
    while todo:
        o = todo.pop()
        if o is other:
            return True
        if o.name in seen:
            continue
        seen.add(o.name)
        todo.extend(o.control_inputs)
        todo.extend(t.op for t in o.inputs)
    return False


@needs_tf2_collectives
def test_side_effects_ordered_per_replica_in_functions():
    """Inside a tf.function TensorFlow orders every resource-less side effect
    after the one built before it, across devices: replica 1's first assert
    (and so its NCCL exchange, which waits for replica 0's in NCCL) would
    wait for replica 0's second. In a graph passed to
    compat.order_side_effects_per_replica, each device keeps its own order
    and the replicas no longer wait for each other."""
    plain = _replica_asserts(register=False)
    # TensorFlow's own rule, which the NCCL exchange cannot live with.
    assert _waits_for(plain["first1"], plain["second0"])
    ordered = _replica_asserts(register=True)
    assert not _waits_for(ordered["first1"], ordered["second0"])
    assert not _waits_for(ordered["first0"], ordered["second1"])
    assert not _waits_for(ordered["host1"], ordered["host0"])
    assert not _waits_for(ordered["first1"], ordered["host0"])
    # Each device's own side effects stay in the order they were built.
    assert _waits_for(ordered["second0"], ordered["first0"])
    assert _waits_for(ordered["second1"], ordered["first1"])
    assert _waits_for(ordered["host1"], ordered["second1"])


def test_a_replica_sharded_table_after_sok_init_without_its_strategy():
    """A table sharded over a MirroredStrategy's replicas (a ReplicaShards),
    used after sok.init set up another engine (one process): its lookup
    failed with "'SingleProcess' object has no attribute 'replica_id'". A
    RuntimeError names the call, the table and both set-ups. (Two shards
    made by hand: the object a 2-replica strategy makes, without the
    logical CPUs it needs.)"""
    import tensorflow as tf

    import sok_graph as sok
    from sok_graph import context
    from sok_graph.tables.replica_shards import ReplicaShards

    sok.init("none")
    try:
        rows = np.arange(8, dtype=np.float32).reshape(4, 2)
        table = ReplicaShards([sok.Variable(rows, name="sharded"),
                               sok.Variable(rows + 100, name="sharded")])
        ids = tf.ragged.constant([[1], [2, 3]], tf.int64)
        words = (r"sok.lookup_sparse on 'sharded(:0)?': the table is sharded over the 2 replicas "
                 r"of the MirroredStrategy it was made under, but sok.init has since set up "
                 r"'none' with 1 worker\(s\)")
        with pytest.raises(RuntimeError, match=words):
            sok.lookup_sparse([table], [ids], combiners=["sum"])
        with pytest.raises(RuntimeError, match="sok.all2all_dense_embedding on 'sharded"):
            sok.all2all_dense_embedding(table, tf.constant([1], tf.int64))
    finally:
        context.reset()
