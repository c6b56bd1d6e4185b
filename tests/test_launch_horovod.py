"""Horovod under the launcher, `python -m sok_graph.launch`: CPU workers on
localhost.

Where Horovod is installed the launcher serves its Gloo rendezvous, so a
script's hvd.init() joins one job of all the workers, as under
`horovodrun --gloo`. The collectives are checked against numpy on data every
worker can compute for every rank. A file of its own (one Bazel test target):
each test starts TensorFlow in 2 or 3 workers.
"""

import os
import re
import subprocess
import sys
import time

import pytest
from multiworker.launching import horovod  # noqa: F401 (the fixture)
from test_launch import LAUNCH_PY, _env, _env_reports, _lines_by_rank


# TensorFlow and Horovod start in each worker of a loaded 2-core machine.
HOROVOD_RUN_TIMEOUT_S = 300


HVD_WORKER = r"""
import os, signal, sys, time

import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd

tf.compat.v1.enable_eager_execution()  # TF 1.x starts in graph mode

rank = int(os.environ["SOK_GRAPH_RANK"])
size = int(os.environ["SOK_GRAPH_WORLD_SIZE"])
syncdir, mode = sys.argv[1], sys.argv[2]


def wait_for_all():
    # hvd.init() gives a late peer only the Gloo timeout (which the stall
    # tests make short): start it once every worker has imported TensorFlow.
    open(os.path.join(syncdir, "ready.%d" % rank), "w").close()
    deadline = time.time() + 120
    while len([n for n in os.listdir(syncdir) if n.startswith("ready.")]) < size:
        if time.time() > deadline:
            sys.exit("not every worker started")
        time.sleep(0.05)


wait_for_all()
hvd.init()
assert (hvd.rank(), hvd.size()) == (rank, size), (hvd.rank(), hvd.size())
assert (hvd.local_rank(), hvd.local_size(), hvd.cross_size()) == (rank, size, 1)

D = 3
ROOT = size - 1


def send_counts(src):
    # Uneven, with empty sends: rows rank src sends to each rank.
    return [(2 * src + 3 * dst + 1) % 4 for dst in range(size)]


def alltoall_input(src):
    n = sum(send_counts(src))
    return (src * 1000 + 10 * np.arange(n)[:, None] + np.arange(D)[None, :]).astype(np.float32)


def recv_weight(dst):
    # The weights rank dst gives the rows it receives in its loss.
    n = sum(send_counts(src)[dst] for src in range(size))
    return ((dst + 1) + 0.5 * np.arange(n)[:, None] + 0.25 * np.arange(D)[None, :]).astype(
        np.float32
    )


def alltoall_reference(me):
    # What rank `me` receives: from each source, in rank order, the slice of
    # its rows addressed to me; and d(sum of every rank's loss)/d(my input):
    # each of my rows gets the weight its receiver gave it.
    out, splits = [], []
    for src in range(size):
        counts = send_counts(src)
        start = sum(counts[:me])
        out.append(alltoall_input(src)[start:start + counts[me]])
        splits.append(counts[me])
    grad = []
    for dst in range(size):
        offset = sum(send_counts(src)[dst] for src in range(me))
        grad.append(recv_weight(dst)[offset:offset + send_counts(me)[dst]])
    return np.concatenate(out), np.array(splits), np.concatenate(grad)


def gather_input(r):
    # rank r has r + 1 rows: uneven first dimensions.
    return (r * 10 + np.arange(r + 1)[:, None] + 0.5 * np.arange(2)[None, :]).astype(np.float32)


def reduce_input(r):
    return np.array([r + 1, 2 * (r + 1), -r, 0.5 * r], np.float32)


def bcast_input(r):
    return np.full([2, 2], 7 * r + 1, np.float32)


def check(results, where):
    out, rsplits, grad, gathered, total, mean, bcast = results
    ref_out, ref_splits, ref_grad = alltoall_reference(rank)
    np.testing.assert_array_equal(out, ref_out)
    np.testing.assert_array_equal(rsplits, ref_splits)
    np.testing.assert_array_equal(grad, ref_grad)
    np.testing.assert_array_equal(gathered, np.concatenate([gather_input(r) for r in range(size)]))
    sums = np.sum([reduce_input(r) for r in range(size)], axis=0)
    np.testing.assert_array_equal(total, sums)
    np.testing.assert_allclose(mean, sums / size, rtol=1e-6)
    np.testing.assert_array_equal(bcast, bcast_input(ROOT))
    print("ok", where, "received", out.shape[0], "rows", flush=True)


def collectives(x, splits, w, g, a, b):
    with tf.GradientTape() as tape:
        tape.watch(x)
        out, rsplits = hvd.alltoall(x, splits=splits)
        loss = tf.reduce_sum(out * w)
    grad = tape.gradient(loss, x)
    return (
        out,
        rsplits,
        grad,
        hvd.allgather(g),
        hvd.allreduce(a, op=hvd.Sum),
        hvd.allreduce(a),  # the default: Average
        hvd.broadcast(b, root_rank=ROOT),
    )


inputs = (
    alltoall_input(rank),
    np.array(send_counts(rank), np.int32),
    recv_weight(rank),
    gather_input(rank),
    reduce_input(rank),
    bcast_input(rank),
)

if mode == "collectives":
    step = tf.function(collectives)
    for call in range(2):  # the second call runs from Horovod's response cache
        check([t.numpy() for t in step(*[tf.constant(v) for v in inputs])], "tf.function %d" % call)

    graph = tf.Graph()
    with graph.as_default():
        feeds = [
            tf.compat.v1.placeholder(tf.float32, [None, D]),
            tf.compat.v1.placeholder(tf.int32, [size]),
            tf.compat.v1.placeholder(tf.float32, [None, D]),
            tf.compat.v1.placeholder(tf.float32, [None, 2]),
            tf.compat.v1.placeholder(tf.float32, [4]),
            tf.compat.v1.placeholder(tf.float32, [2, 2]),
        ]
        x, splits, w, g, a, b = feeds
        out, rsplits = hvd.alltoall(x, splits=splits)
        (grad,) = tf.gradients(tf.reduce_sum(out * w), [x])
        fetches = [
            out,
            rsplits,
            grad,
            hvd.allgather(g),
            hvd.allreduce(a, op=hvd.Sum),
            hvd.allreduce(a),
            hvd.broadcast(b, root_rank=ROOT),
        ]
        v = tf.compat.v1.get_variable(
            "v", initializer=tf.constant(bcast_input(rank) + 1), use_resource=False
        )
        sync = hvd.broadcast_global_variables(ROOT)
        with tf.compat.v1.Session(graph=graph) as sess:
            feed = dict(zip(feeds, inputs))
            for call in range(2):
                check(sess.run(fetches, feed), "session %d" % call)
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(sync)
            np.testing.assert_array_equal(sess.run(v), bcast_input(ROOT) + 1)
            print("ok session broadcast_global_variables", flush=True)
elif mode == "stall":
    stalled = int(sys.argv[3])
    # Every rank joins a first collective: the job itself works.
    hvd.allreduce(tf.constant(1.0), name="before_stall", op=hvd.Sum)
    if rank == stalled:
        print("stalling", flush=True)
        time.sleep(600)
        sys.exit("slept 600 s: nobody stopped this worker")
    print("entering at %.3f" % time.time(), flush=True)
    hvd.allreduce(tf.constant(2.0), name="after_stall", op=hvd.Sum)
    sys.exit("the collective returned although rank %d never joined it" % stalled)
elif mode == "freeze":
    frozen = int(sys.argv[3])
    hvd.allreduce(tf.constant(1.0), name="before_freeze", op=hvd.Sum)
    if rank == frozen:
        print("freezing", flush=True)
        # Stopped whole, Horovod's background thread included: only Gloo's
        # timeout notices (the stall inspector runs in the threads that wait).
        os.kill(os.getpid(), signal.SIGSTOP)
        sys.exit("continued, but not stopped")
    print("entering at %.3f" % time.time(), flush=True)
    hvd.allreduce(tf.constant(2.0), name="after_freeze", op=hvd.Sum)
    sys.exit("the collective returned although rank %d is frozen" % frozen)
elif mode == "selfkill":
    victim = int(sys.argv[3])
    for i in range(1000000):
        hvd.allreduce(tf.constant(float(i)), name="loop", op=hvd.Sum)
        if i == 20 and rank == victim:
            with open(os.path.join(syncdir, "killed_at"), "w") as f:
                f.write("%.3f" % time.time())
            os.kill(os.getpid(), signal.SIGKILL)
    sys.exit("ran 1000000 steps although rank %d was killed" % victim)
elif mode == "sok_barrier":
    # sok_graph's Horovod engine: its barrier returns on a worker only once
    # every worker has entered it (rank 1 comes 3 s late).
    from sok_graph.communication import horovod as engine

    comm = engine.create()
    assert type(comm).__name__ == "Horovod", comm
    if rank == 1:
        time.sleep(3)
    entered = time.time()
    comm.barrier()
    print("barrier entered %.3f left %.3f" % (entered, time.time()), flush=True)
"""


def _run_horovod(tmp_path, launcher_args, mode, *args, timeout=HOROVOD_RUN_TIMEOUT_S):
    """(exit status, stdout, stderr, time.time() at the launcher's exit) of
    HVD_WORKER under the launcher."""
    script = tmp_path / "hvd_worker.py"
    script.write_text(HVD_WORKER)
    syncdir = tmp_path / "sync"
    syncdir.mkdir()
    p = subprocess.run(
        [sys.executable, LAUNCH_PY]
        + list(launcher_args)
        + ["--timeout", str(timeout - 30), str(script), str(syncdir), mode]
        + list(args),
        env=_env(TF_CPP_MIN_LOG_LEVEL="2"),
        capture_output=True,
        check=False,
        timeout=timeout,
    )
    return p.returncode, p.stdout.decode(), p.stderr.decode(), time.time()


@pytest.mark.parametrize("n", [2, 3])
def test_horovod_collectives_under_the_launcher(tmp_path, horovod, n):
    # alltoall with uneven (and empty) splits and its gradient, allgather of
    # uneven first dimensions, allreduce (sum, average), broadcast; in a
    # tf.function and in a TF1 Session.
    rc, out, err, _ = _run_horovod(tmp_path, ["-np", str(n)], "collectives")
    assert rc == 0, err[-5000:]
    by_rank = _lines_by_rank(out)
    assert sorted(k for k in by_rank if k is not None) == list(range(n)), out
    for rank in range(n):
        received = sum((2 * src + 3 * rank + 1) % 4 for src in range(n))
        expected = [
            f"ok {where} {call} received {received} rows"
            for where in ("tf.function", "session")
            for call in range(2)
        ] + ["ok session broadcast_global_variables"]
        assert by_rank[rank] == expected, out


@pytest.mark.parametrize("n, stalled", [(2, 1), (3, 0)])
def test_horovod_stalled_worker_ends_the_job_within_the_stall_timeout(
    tmp_path, horovod, n, stalled
):
    # One rank never joins a collective (rank 0 is Horovod's coordinator, so
    # both kinds of rank are covered). Horovod's stall inspector, set up from
    # --stall-timeout, shuts the job down; the waiting ranks' collective fails
    # and the launcher stops the stalled rank.
    stall_timeout = 10
    rc, out, err, exited_at = _run_horovod(
        tmp_path,
        ["-np", str(n), "--stall-timeout", str(stall_timeout), "--grace", "5"],
        "stall",
        str(stalled),
    )
    assert rc != 0, err[-5000:]
    by_rank = _lines_by_rank(out)
    assert by_rank[stalled] == ["stalling"], out
    entered = [
        float(by_rank[r][0].split()[-1]) for r in range(n) if r != stalled and by_rank.get(r)
    ]
    assert len(entered) == n - 1, out
    waited = exited_at - min(entered)
    # The bound, plus the failing ranks' exit and the launcher's SIGTERM on a
    # loaded machine; at least the stall inspector's shutdown time.
    assert 0.5 * stall_timeout <= waited < stall_timeout + 15, (waited, err[-5000:])
    assert "is stalled for longer than" in err, err[-5000:]
    # Horovod's coordinator (rank 0) lists the stalled rank, marked with "!".
    assert re.search(rf"^\[0\] {stalled}!: \[", err, re.MULTILINE), err[-5000:]
    # A waiting rank failed first; the stalled one was stopped.
    first = re.search(r"sok_graph\.launch: rank (\d+) exited with status [1-9]", err)
    assert first and int(first.group(1)) != stalled, err[-5000:]


def test_horovod_frozen_worker_ends_the_job_within_the_stall_timeout(tmp_path, horovod):
    # A worker stopped whole (SIGSTOP) answers nothing: the others' Gloo
    # operations time out after --stall-timeout, and the launcher's SIGTERM
    # (with a SIGCONT) ends the frozen one well before the grace period.
    stall_timeout = 10
    rc, out, err, exited_at = _run_horovod(
        tmp_path,
        ["-np", "2", "--stall-timeout", str(stall_timeout), "--grace", "60"],
        "freeze",
        "1",
    )
    assert rc != 0, err[-5000:]
    by_rank = _lines_by_rank(out)
    assert by_rank[1] == ["freezing"], out
    waited = exited_at - float(by_rank[0][0].split()[-1])
    assert 0.5 * stall_timeout <= waited < stall_timeout + 15, (waited, err[-5000:])
    assert f"Timed out waiting {stall_timeout * 1000}ms" in err, err[-5000:]
    assert "rank 0 exited with status 1; stopping 1 other worker(s)" in err, err[-5000:]
    assert "sending SIGKILL" not in err, err[-5000:]


def test_horovod_killed_worker_ends_the_job_quickly(tmp_path, horovod):
    # Rank 1 SIGKILLs itself in the middle of a loop of allreduces.
    rc, _, err, exited_at = _run_horovod(tmp_path, ["-np", "3", "--grace", "30"], "selfkill", "1")
    killed_at = float((tmp_path / "sync" / "killed_at").read_text())
    assert rc != 0, err[-5000:]
    assert "rank 1 was killed by SIGKILL (signal 9)" in err, err[-5000:]
    # Well within the grace period: the others stopped on SIGTERM or failed.
    assert exited_at - killed_at < 15, (exited_at - killed_at, err[-5000:])


def test_horovod_variables_are_horovodruns(tmp_path, horovod):
    # The reference: horovodrun's own functions for its Gloo mode, given
    # horovodrun's host plan for `-H localhost:3` and the interface it picks.
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.gloo_run import create_run_env_vars, create_slot_env_vars
    from horovod.runner.util.network import get_local_intfs

    reports = _env_reports(tmp_path, ["-np", "3", "--stall-timeout", "40"])
    plan = get_host_assignments(parse_hosts("localhost:3"), 3)
    nics = get_local_intfs()
    port = reports[0]["HOROVOD_GLOO_RENDEZVOUS_PORT"]
    for rank, env in enumerate(reports):
        expected = {k: str(v) for k, v in create_run_env_vars("127.0.0.1", nics, port).items()}
        expected.update(create_slot_env_vars(plan[rank]))
        expected.update(
            {
                "SOK_GRAPH_STALL_TIMEOUT": "40",
                "HOROVOD_STALL_CHECK_TIME_SECONDS": "6",
                "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "22",
                "HOROVOD_GLOO_TIMEOUT_SECONDS": "40",
            }
        )
        if "NCCL_NVLS_ENABLE" not in os.environ:
            expected["NCCL_NVLS_ENABLE"] = "0"  # the launcher's own: NVLink multicast off
        assert env == expected


def test_horovod_settings_of_the_callers_environment_are_kept(tmp_path, horovod):
    (env,) = _env_reports(tmp_path, [], HOROVOD_STALL_CHECK_TIME_SECONDS="3")
    assert env["HOROVOD_STALL_CHECK_TIME_SECONDS"] == "3"
    assert env["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"] == "60"
    assert env["SOK_GRAPH_STALL_TIMEOUT"] == "120"


def test_sok_horovod_engine_barrier_waits_for_every_worker(tmp_path, horovod):
    # The engine's barrier called hvd.barrier(), which horovod.tensorflow
    # does not have (AttributeError); it is the engine's own all-reduce.
    rc, out, err, _ = _run_horovod(tmp_path, ["-np", "2"], "sok_barrier")
    assert rc == 0, err[-5000:]
    by_rank = _lines_by_rank(out)
    times = {r: [float(w) for w in by_rank[r][0].split()[2::2]] for r in (0, 1)}
    entered_late = times[1][0]
    assert times[0][1] >= entered_late, out
