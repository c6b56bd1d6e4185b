"""Crash safety of sok.dump: a dumping process is SIGKILLed at random points
many times; after each kill the dump directory still loads, whole, as the
previous checkpoint or the new one, and a partial dump left behind is either
complete or rejected with CheckpointError. Every flipped bit and every
truncation of every file of a dump is detected.

The killed writers are forks of this process that run the file-writing half
of sok.dump (`write_dump`: files, fsyncs, manifest, renames, clean-up) on
arrays exported here, so a kill costs milliseconds instead of a TensorFlow
start. Two kinds of kill:
  * at the N-th Python-level call or return inside the writer (N drawn over
    the whole dump): every step between two file operations is reachable;
  * by the parent, after a random delay, while a larger dump is written:
    asynchronous, as a real SIGKILL lands. How many such kills land depends
    on the machine's speed, so this soak runs with SOK_GRAPH_CRASH_SOAK=1
    only (not in CI).
"""

import glob
import os
import random
import signal
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import sok_graph as sok
from sok_graph import dump_load
from sok_graph.dump_load import CheckpointError

HOOK_KILLS = int(os.environ.get("SOK_GRAPH_CRASH_KILLS", "60"))
TIMED_KILLS = int(os.environ.get("SOK_GRAPH_CRASH_TIMED_KILLS", "30"))
# The random-time soak: outside CI (a busy 2-core machine can finish a dump
# before most random kills land, which says nothing about the checkpoint).
SOAK = os.environ.get("SOK_GRAPH_CRASH_SOAK") == "1"
DIM = 4


def generation(g, rows=12):
    """The tables of checkpoint number g: a static and a dynamic table with
    optimizer slots, every value tagged with g."""
    rng = np.random.default_rng(g)
    keys = rng.choice(10 ** 12, size=rows, replace=False).astype(np.int64)
    dyn = {"keys": keys, "values": rng.normal(size=(rows, DIM)).astype(np.float32) + g,
           "timestamps": np.full(rows, g, np.int64), "frequencies": np.arange(rows) + g,
           "slot.accumulator": np.full((rows, DIM), g, np.float32)}
    static = {"keys": np.arange(5, dtype=np.int64),
              "values": np.full((5, DIM), g, np.float32),
              "slot.accumulator": np.full((5, DIM), -g, np.float32)}
    return {"dyn": ("dynamic", dyn), "static": ("static", static)}


OPTIMIZER = {"algorithm": "adagrad", "slots": ["accumulator"]}


def read(path):
    """The arrays of a dump (checked), as generation() lays them out."""
    manifest, arrays = dump_load.read_dump(path, {"dyn": DIM, "static": DIM}, {"static": 5},
                                           slot_names=["accumulator"], algorithm="adagrad")
    return manifest["optimizer"]["step"], arrays


def same(arrays, tables):
    return all(np.array_equal(arrays[name][part], np.asarray(want))
               for name, (_, parts) in tables.items() for part, want in parts.items())


def write(path, g, rows=12):
    dump_load.write_dump(path, generation(g, rows), dict(OPTIMIZER, step=g))


def fork_writer(path, g, rows=12, kill_at=None):
    """Forks a process that writes checkpoint g to `path`. With kill_at, it
    SIGKILLs itself at its kill_at-th call/return event inside write_dump;
    the child reports (through its exit code 0) that it ran to the end."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    try:  # the child: never returns into pytest
        if kill_at is not None:
            events = [0]

            def hook(frame, event, arg):
                events[0] += 1
                if events[0] >= kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)

            sys.setprofile(hook)
        write(path, g, rows)
        sys.setprofile(None)
        os._exit(0)
    finally:
        os._exit(3)


def count_events(path, g):
    """How many call/return events one write_dump takes (in a child),
    overwriting a dump at `path` as the killed writers do: a first dump to a
    fresh path skips the swap's move aside and clean-up, and counted so it
    left few of the kill points drawn after the swap (in one run none of 62
    fell there)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            events = [0]

            def hook(frame, event, arg):
                events[0] += 1

            write(path, g)
            sys.setprofile(hook)
            write(path, g)
            sys.setprofile(None)
            os.write(w, str(events[0]).encode())
        finally:
            os._exit(0)
    os.close(w)
    out = os.read(r, 64)
    os.close(r)
    os.waitpid(pid, 0)
    return int(out)


def check_after_kill(path, old, new):
    """What a kill may leave: `path` loads, whole, as checkpoint old or new;
    leftovers are complete dumps or rejected. Returns the checkpoint found."""
    step, arrays = read(path)
    assert step in (old, new), f"loaded step {step}; expected {old} or {new}"
    assert same(arrays, generation(step)), f"checkpoint {step} loaded with wrong contents"
    for partial in glob.glob(path + ".tmp-*") + glob.glob(path + ".old-*"):
        try:
            leftover_step, leftover = read(partial)
        except CheckpointError as e:
            assert str(e)  # rejected, with a message
        else:
            # A whole dump that a killed writer had not yet swapped in (maybe
            # an earlier one: a writer cleans up dead ones when it starts).
            assert leftover_step <= new and same(leftover, generation(leftover_step))
    return step


def test_sigkill_at_every_kind_of_point_keeps_a_whole_checkpoint(tmp_path):
    path = str(tmp_path / "ckpt")
    write(path, 0)
    total = count_events(str(tmp_path / "probe"), 0)
    assert total > 50  # the hook sees the writer's steps
    rng = random.Random(1234)
    current, outcomes, kills, trial = 0, set(), 0, 0
    # Until HOOK_KILLS writers were killed (a draw past the writer's last
    # event lets it finish: that is checked too).
    while kills < HOOK_KILLS:
        trial += 1
        assert trial <= 3 * HOOK_KILLS
        new = current + 1
        pid = fork_writer(path, new, kill_at=rng.randint(1, total))
        _, status = os.waitpid(pid, 0)
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        assert killed or os.WEXITSTATUS(status) == 0, f"writer failed: status {status}"
        kills += killed
        current = check_after_kill(path, current, new)
        outcomes.add("new" if current == new else "old")
        if trial % 10 == 9:
            # A later dump succeeds and leaves nothing of the killed ones.
            current += 1
            write(path, current)
            assert read(path)[0] == current
            assert not glob.glob(path + ".tmp-*") and not glob.glob(path + ".old-*")
    assert outcomes == {"old", "new"}  # kills landed before and after the swap
    print(f"hook kills survived: {kills} of {trial} writers")


@pytest.mark.skipif(not SOAK, reason="the random-time kill soak depends on the machine's "
                    "speed (how many kills land before a writer ends); run it with "
                    "SOK_GRAPH_CRASH_SOAK=1. The kills at chosen points above cover every "
                    "step of the writer deterministically.")
def test_sigkill_at_random_times_keeps_a_whole_checkpoint(tmp_path):
    path = str(tmp_path / "ckpt")
    rows = 200000  # ~5 MB per table file: a dump takes long enough to land in
    write(path, 0, rows)
    # How long a forked writer takes, start to end, as the killed ones run:
    # the fastest of three, so that a slow first write (a loaded machine)
    # does not stretch the kill times past most writers' end.
    durations = []
    for _ in range(3):
        start = time.perf_counter()
        os.waitpid(fork_writer(str(tmp_path / "timing"), 0, rows), 0)
        durations.append(time.perf_counter() - start)
    duration = min(durations)
    rng = random.Random(99)
    current, kills = 0, 0
    for _ in range(TIMED_KILLS):
        new = current + 1
        pid = fork_writer(path, new, rows)
        time.sleep(rng.uniform(0, 1.2 * duration))
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        kills += os.WIFSIGNALED(status)
        step, arrays = read(path)
        assert step in (current, new)
        assert same(arrays, generation(step, rows))
        current = step
    assert kills >= TIMED_KILLS // 2
    print(f"timed kills survived: {kills} (dump takes {duration * 1e3:.0f} ms)")


def test_load_after_a_kill_restores_variables(tmp_path):
    """sok.load (not only the reader) works on what a killed dump left, and
    assigns the checkpoint it finds."""
    path = str(tmp_path / "ckpt")
    dyn = sok.DynamicVariable(DIM, name="dyn")
    static = sok.Variable(np.zeros((5, DIM), np.float32), name="static")
    write(path, 0)
    total = count_events(str(tmp_path / "probe"), 0)
    for kill_at in (1, total // 3, 2 * total // 3, total - 5):
        pid = fork_writer(path, 1, kill_at=kill_at)
        os.waitpid(pid, 0)
        sok.load(path, [dyn, static])
        step = read(path)[0]
        want = generation(step)
        keys, values = sok.export(dyn)
        order = np.argsort(keys.numpy())
        want_order = np.argsort(want["dyn"][1]["keys"])
        np.testing.assert_array_equal(keys.numpy()[order], want["dyn"][1]["keys"][want_order])
        np.testing.assert_array_equal(values.numpy()[order],
                                      want["dyn"][1]["values"][want_order])
        np.testing.assert_array_equal(static.numpy(), want["static"][1]["values"])


def flips_and_truncations(path, rng, flips_per_file):
    """(file, description, bytes) for damaged copies of every file of a dump:
    a flipped bit in every header byte and at random payload positions, and
    truncations / extensions."""
    for name in sorted(os.listdir(path)):
        data = open(os.path.join(path, name), "rb").read()
        positions = list(range(min(64, len(data))))
        positions += [rng.randrange(len(data)) for _ in range(flips_per_file)]
        for pos in positions:
            bit = 1 << rng.randrange(8)
            damaged = bytearray(data)
            damaged[pos] ^= bit
            yield name, f"bit {bit} of byte {pos}", bytes(damaged)
        for length in {0, 1, 63, 64, len(data) - 1, rng.randrange(len(data))}:
            if 0 <= length < len(data):
                yield name, f"truncated to {length} bytes", data[:length]
        yield name, "one byte appended", data + b"\0"


def test_every_flipped_bit_and_truncation_of_every_file_is_detected(tmp_path):
    path = str(tmp_path / "ckpt")
    write(path, 7)
    assert read(path)[0] == 7
    rng = random.Random(5)
    checked = 0
    for name, what, damaged in flips_and_truncations(path, rng, flips_per_file=40):
        target = os.path.join(path, name)
        original = open(target, "rb").read()
        with open(target, "wb") as f:
            f.write(damaged)
        try:
            with pytest.raises(CheckpointError):
                read(path)
        except BaseException as e:
            raise AssertionError(f"{name}: {what} was not detected") from e
        finally:
            with open(target, "wb") as f:
                f.write(original)
        checked += 1
    assert read(path)[0] == 7
    assert checked >= 900  # 9 files x (64 header bytes + 40 random bits + cuts)
    print(f"damaged copies detected: {checked}")


def test_graph_mode_dump_is_not_affected_by_a_killed_eager_writer(tmp_path):
    """A Session-mode sok.dump after a killed writer replaces the checkpoint
    and removes the dead writer's leftovers."""
    path = str(tmp_path / "ckpt")
    write(path, 0)
    pid = fork_writer(path, 1, kill_at=count_events(str(tmp_path / "probe"), 0) // 2)
    os.waitpid(pid, 0)
    graph = tf.Graph()
    with graph.as_default():
        v = sok.DynamicVariable(DIM, initializer=3.0, name="dyn")
        read_op = v.sparse_read(tf.constant([1, 2], tf.int64))
        with tf.compat.v1.Session(graph=graph) as sess, sess.as_default():
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(read_op)
            sok.dump(path, [v])
    assert not glob.glob(path + ".tmp-*") and not glob.glob(path + ".old-*")
    manifest, arrays = dump_load.read_dump(path, {"dyn": DIM})
    np.testing.assert_array_equal(np.sort(arrays["dyn"]["keys"]), [1, 2])


def test_two_processes_dumping_to_one_path_take_turns(tmp_path):
    """Two writers to one path at once: each dump succeeds (no bare
    FileNotFoundError or "Directory not empty" from a swap half done by the
    other), and the path holds one whole checkpoint of either."""
    path = str(tmp_path / "ckpt")
    write(path, 0)

    def writer(first):
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid:
            return pid
        try:
            for g in range(first, first + 8):
                write(path, g, rows=2000)
            os._exit(0)
        finally:
            os._exit(3)

    pids = [writer(1), writer(101)]
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    step, arrays = read(path)
    assert step in (8, 108)
    assert same(arrays, generation(step, rows=2000))
    assert not glob.glob(path + ".tmp-*") and not glob.glob(path + ".old-*")
