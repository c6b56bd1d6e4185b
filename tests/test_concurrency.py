"""One dynamic variable used from several threads at once for a bounded time:
lookups, updates, exports and dumps through two tf.functions and through
plain graph ops in a tf.compat.v1.Session, all on the same table. No crash,
no deadlock, and the final table equals a serial replay of the logged
operations.

Why a replay in any order is the right reference: the operations are
chosen to commute. Rows start at zero (a constant initializer, so the order
in which keys get inserted does not matter), and updates add or subtract
small integers, which float32 adds exactly (every partial sum stays far
below 2**24), so any interleaving of whole operations gives the same table.
A race that lost or tore an update (two writers on one row, a reader seeing
half a row) shows up as a mismatch or a non-integer row. Each operation is
logged after it ran, with a sequence number taken under a lock.

Sharing one table between the tf.functions and the Session: a Session has
its own resource manager, so a table created eagerly is invisible to it.
Here the variable lives in the Session's graph and the two tf.functions are
called from that graph (each call becomes a function-call op that captures
the table's handle), so everything reaches one table. A second part runs the
same kind of workload eagerly: two tf.functions, exports and sok.dump on an
eager table.
"""

import itertools
import os
import threading
import time

import numpy as np
import pytest
import tensorflow as tf
from conftest import relaxed_function

import sok_graph as sok
from sok_graph import dump_load

DIM = 4
KEYS = 300
SECONDS = float(os.environ.get("SOK_GRAPH_CONCURRENCY_SECONDS", "6"))


class Log:
    def __init__(self):
        self._lock = threading.Lock()
        self._seq = itertools.count()
        self.entries = []  # (seq, worker, keys, deltas or None for a lookup)

    def add(self, worker, keys, deltas):
        with self._lock:
            self.entries.append((next(self._seq), worker, np.array(keys), deltas))


def replay(entries):
    """The table a serial run of the logged operations leaves."""
    table = {}
    for _, _, keys, deltas in sorted(entries, key=lambda e: e[0]):
        for i, k in enumerate(keys.tolist()):
            row = table.setdefault(k, np.zeros(DIM, np.float64))
            if deltas is not None:
                row += deltas[i]
    return table


def batch(rng):
    """Keys (with repeats) and integer deltas in [-3, 3]."""
    n = int(rng.integers(1, 64))
    keys = rng.integers(0, KEYS, size=n).astype(np.int64)
    return keys, rng.integers(-3, 4, size=(n, DIM)).astype(np.float32)


def check_rows(rows, what):
    rows = np.asarray(rows)
    assert np.all(np.isfinite(rows)) and np.array_equal(rows, np.round(rows)), (
        f"{what}: a row that no serial order of whole updates gives (torn or lost update)")


def run_workers(workers, seconds):
    """Runs each worker(rng) in its own thread in a loop for `seconds`;
    fails on any exception, and on a thread still running long after."""
    stop = threading.Event()
    errors, counts = [], {}

    def loop(name, fn, seed):
        rng = np.random.default_rng(seed)
        n = 0
        try:
            while not stop.is_set():
                fn(rng)
                n += 1
        except BaseException as e:  # reported below, in the test's thread
            errors.append((name, e))
            stop.set()
        counts[name] = n

    threads = [threading.Thread(target=loop, args=(name, fn, i), daemon=True)
               for i, (name, fn) in enumerate(workers.items())]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    deadline = time.monotonic() + 60
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    stuck = [t.name for t in threads if t.is_alive()]
    assert not stuck, f"threads still running 60 s after the stop: deadlock? {stuck}"
    if errors:
        raise AssertionError(f"worker {errors[0][0]} failed") from errors[0][1]
    assert all(counts.get(name, 0) > 0 for name in workers), counts
    return counts


def check_final(keys, rows, log):
    want = replay(log.entries)
    got = dict(zip(np.asarray(keys).tolist(), np.asarray(rows)))
    assert len(got) == len(np.asarray(keys)), "a key exported twice"
    assert set(got) == set(want)
    for k, row in want.items():
        np.testing.assert_array_equal(got[k], row.astype(np.float32), err_msg=f"key {k}")


def check_dump(path, final_keys):
    _, arrays = dump_load.read_dump(path, {"shared": DIM})
    check_rows(arrays["shared"]["values"], f"dump {path}")
    assert set(arrays["shared"]["keys"].tolist()) <= set(np.asarray(final_keys).tolist())


def test_tf_functions_and_session_ops_share_one_table(tmp_path):
    graph = tf.Graph()
    log = Log()
    with graph.as_default():
        var = sok.DynamicVariable(DIM, initializer="zeros", name="shared")

        @tf.function
        def train_step(keys, deltas):  # lookup (find-or-insert), then update
            rows = var.sparse_read(keys)
            with tf.control_dependencies([rows]):
                return rows, var.scatter_add(keys, deltas)

        @tf.function
        def update_and_read(keys, deltas):  # update, then inference read
            evicted = var.scatter_sub(keys, deltas)
            with tf.control_dependencies([evicted]):
                return var.find(keys)[0]

        feeds = {}

        def placeholders(name):
            feeds[name] = (tf.compat.v1.placeholder(tf.int64, [None]),
                           tf.compat.v1.placeholder(tf.float32, [None, DIM]))
            return feeds[name]

        fn_a = train_step(*placeholders("fn_a"))
        fn_b = update_and_read(*placeholders("fn_b"))
        k_c, d_c = placeholders("graph_add")
        graph_add = var.scatter_add(k_c, d_c)
        k_d = tf.compat.v1.placeholder(tf.int64, [None])
        graph_lookup = var.sparse_read(k_d)
        export = sok.export(var)
        sess = tf.compat.v1.Session(graph=graph)
        sess.run(tf.compat.v1.global_variables_initializer())
    dumps = []

    def run_fn_a(rng):
        keys, deltas = batch(rng)
        rows, _ = sess.run(fn_a, {feeds["fn_a"][0]: keys, feeds["fn_a"][1]: deltas})
        check_rows(rows, "tf.function lookup")
        log.add("fn_a", keys, deltas)

    def run_fn_b(rng):
        keys, deltas = batch(rng)
        rows = sess.run(fn_b, {feeds["fn_b"][0]: keys, feeds["fn_b"][1]: deltas})
        check_rows(rows, "tf.function read")
        log.add("fn_b", keys, -deltas)

    def run_graph_ops(rng):
        keys, deltas = batch(rng)
        sess.run(graph_add, {k_c: keys, d_c: deltas})
        log.add("graph_add", keys, deltas)
        keys, _ = batch(rng)
        check_rows(sess.run(graph_lookup, {k_d: keys}), "graph lookup")
        log.add("graph_lookup", keys, None)

    def run_export_and_dump(rng):
        keys, rows = sess.run(export)
        assert len(np.unique(keys)) == len(keys)
        check_rows(rows, "export")
        path = str(tmp_path / f"dump{len(dumps) % 3}")
        # Graph mode is per thread: this one makes the Session's graph and
        # the Session its defaults, as any thread that dumps in graph mode must.
        with graph.as_default(), sess.as_default():
            sok.dump(path, [var])
        dumps.append(path)

    counts = run_workers({"fn_a": run_fn_a, "fn_b": run_fn_b, "graph_ops": run_graph_ops,
                          "export_dump": run_export_and_dump}, SECONDS)
    keys, rows = sess.run(export)
    check_final(keys, rows, log)
    for path in sorted(set(dumps)):
        check_dump(path, keys)
    sess.close()
    print(f"graph-mode operations run concurrently: {counts}")


def test_eager_tf_functions_exports_and_dumps_share_one_table(tmp_path):
    var = sok.DynamicVariable(DIM, initializer="zeros", name="shared")
    log = Log()

    @relaxed_function
    def train_step(keys, deltas):
        rows = var.sparse_read(keys)
        var.scatter_add(keys, deltas)
        return rows

    @relaxed_function
    def update_and_read(keys, deltas):
        var.scatter_sub(keys, deltas)
        return var.find(keys)[0]

    spec = (tf.TensorSpec([None], tf.int64), tf.TensorSpec([None, DIM], tf.float32))
    train_step = train_step.get_concrete_function(*spec)
    update_and_read = update_and_read.get_concrete_function(*spec)
    dumps = []

    def run_a(rng):
        keys, deltas = batch(rng)
        check_rows(train_step(tf.constant(keys), tf.constant(deltas)).numpy(), "lookup")
        log.add("fn_a", keys, deltas)

    def run_b(rng):
        keys, deltas = batch(rng)
        check_rows(update_and_read(tf.constant(keys), tf.constant(deltas)).numpy(), "read")
        log.add("fn_b", keys, -deltas)

    def run_export_and_dump(rng):
        keys, rows = sok.export(var)
        check_rows(rows.numpy(), "export")
        path = str(tmp_path / f"dump{len(dumps) % 3}")
        sok.dump(path, [var])
        dumps.append(path)

    counts = run_workers({"fn_a": run_a, "fn_b": run_b, "export_dump": run_export_and_dump},
                         SECONDS / 2)
    keys, rows = sok.export(var)
    check_final(keys.numpy(), rows.numpy(), log)
    for path in sorted(set(dumps)):
        check_dump(path, keys.numpy())
    print(f"eager operations run concurrently: {counts}")


@pytest.mark.parametrize("seconds", [1.0])
def test_a_lost_update_would_be_caught(seconds):
    """The check itself: a log claiming one more update than ran fails it."""
    var = sok.DynamicVariable(DIM, initializer="zeros")
    log = Log()
    keys = np.array([1, 2], np.int64)
    deltas = np.ones((2, DIM), np.float32)
    var.scatter_add(tf.constant(keys), tf.constant(deltas))
    log.add("w", keys, deltas)
    log.add("w", keys[:1], deltas[:1])  # never applied
    k, r = sok.export(var)
    with pytest.raises(AssertionError):
        check_final(k.numpy(), r.numpy(), log)
