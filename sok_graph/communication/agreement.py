"""Agreement between worker processes at a point outside the training step:
every worker tells the others its numbers and whether it failed, so that a
step that failed on one worker fails on every worker, with that worker's
reason, instead of the others going on as if it had worked.

Used where each worker checks only its own part of a job-wide step: sok.load
(each worker checks the rows it would own; one refusal must stop every
worker before any table changes), sok.dump (rank 0 writes), and the serving
export and delta (rank 0 writes; every worker raises where it failed, and
they agree on the earliest clock reading, serving/collective.py); and where
every worker must have called a step alike (`texts`: sok.dump's and
sok.load's variables).

Each agreement is one all-gather of int64 numbers through the job's
communicator, made by every worker in the same order, so none waits for a
gather another skipped. One process (no communicator, one worker, or the
replicas of one process's MirroredStrategy, whose checks cover every shard)
gathers nothing.
"""

import numpy as np
import tensorflow as tf

# The most bytes of an error's message another worker is told.
MESSAGE_BYTES = 4096


def spans_processes(comm):
    """Whether `comm` joins several processes (so an agreement gathers)."""
    return comm is not None and not comm.in_process and comm.world_size > 1


class HostGather:
    """Cross-process all-gather of numpy arrays, eagerly or (eager=False) in
    a graph and Session of its own, built once per HostGather and the same
    on every worker: the job's own graph does not grow with each call."""

    def __init__(self, comm, eager, specs, tag):
        self._eager = eager
        self._comm = comm
        self._specs = specs
        self._tag = tag
        if eager:
            self._feeds = None
            return
        self._graph = tf.Graph()
        with self._graph.as_default():
            self._feeds = [tf.compat.v1.placeholder(s.dtype, s.shape) for s in specs]
            self._fetches = [comm.allgather(f, name=f"sok_{tag}_{i}")
                             for i, f in enumerate(self._feeds)]
        # The tf.distribute engine's collectives run only in a Session of
        # the worker's server (its session()); Horovod's in any Session.
        make = getattr(comm, "session", None)
        self._session = (make(graph=self._graph) if make is not None
                         else tf.compat.v1.Session(graph=self._graph))

    def __call__(self, *arrays):
        if self._eager:
            return [self._comm.allgather(tf.convert_to_tensor(a, s.dtype),
                                         name=f"sok_{self._tag}_{i}").numpy()
                    for i, (a, s) in enumerate(zip(arrays, self._specs))]
        return self._session.run(self._fetches, dict(zip(self._feeds, arrays)))

    def close(self):
        if self._feeds is not None:
            self._session.close()


def _encoded(error):
    """int64 numbers telling an exception (or None): [length, bytes...] of
    "<class name>\\n<message>" in UTF-8, cut to MESSAGE_BYTES."""
    if error is None:
        return np.zeros([1], np.int64)
    text = f"{type(error).__name__}\n{error}".encode("utf-8")[:MESSAGE_BYTES]
    return np.concatenate([[len(text)], np.frombuffer(text, np.uint8)]).astype(np.int64)


def _decoded(numbers):
    """(class name, message) of what _encoded gave, or None."""
    if not len(numbers):
        return None
    text = bytes(np.asarray(numbers, np.int64).astype(np.uint8)).decode("utf-8", "replace")
    name, _, message = text.partition("\n")
    return name, message


def _gathered(comm, eager, numbers):
    """Every worker's `numbers` (int64 [n], n may differ), in rank order."""
    numbers = np.asarray(numbers, np.int64)
    gather = HostGather(comm, eager, [tf.TensorSpec([None], tf.int64)], "agree")
    try:
        # Each worker's numbers with their count in front, so the gathered
        # concatenation splits back into workers.
        flat = gather(np.concatenate([[len(numbers)], numbers]).astype(np.int64))[0]
    finally:
        gather.close()
    out, at = [], 0
    for _ in range(comm.world_size):
        n = int(flat[at])
        out.append(flat[at + 1:at + 1 + n])
        at += 1 + n
    if at != len(flat):
        raise RuntimeError(f"the workers' gathered numbers ({len(flat)}) do not split into "
                           f"{comm.world_size} workers' parts")
    return out


def texts(comm, eager, text):
    """Every worker's `text` (str), in rank order; [text] in one process.
    For checks that every worker called a job-wide step alike."""
    if not spans_processes(comm):
        return [text]
    mine = np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int64)
    return [bytes(np.asarray(n, np.int64).astype(np.uint8)).decode("utf-8", "replace")
            for n in _gathered(comm, eager, mine)]


def agree(comm, eager, reading=None, error=None):
    """(earliest reading, [(rank, class name, message) of each worker's
    error]): every worker calls it at the same point. reading: this
    worker's number to take the least of (a clock reading) or None;
    error: the exception this worker holds, or None. One process: its own
    reading and error."""
    if not spans_processes(comm):
        failures = [] if error is None else [(0, type(error).__name__, str(error))]
        return reading, failures
    mine = np.concatenate([[0 if reading is None else 1, 0 if reading is None else reading],
                           _encoded(error)]).astype(np.int64)
    readings, failures = [], []
    for rank, numbers in enumerate(_gathered(comm, eager, mine)):
        if numbers[0]:
            readings.append(int(numbers[1]))
        told = _decoded(numbers[3:3 + int(numbers[2])])
        if told is not None:
            failures.append((rank, told[0], told[1]))
    return (min(readings) if readings else None), failures


def raise_shared(comm, own, failures, what, kinds, outcome=""):
    """After agree: raises `own` (this worker's exception) where it has one;
    else, where another worker failed, an exception of that worker's class
    (when it is one of `kinds`, else RuntimeError) saying which worker, what
    it was doing (`what`), its message and `outcome` (what that means for
    this worker). Returns where none failed."""
    if own is not None:
        raise own
    if not failures:
        return
    rank, name, message = failures[0]
    by_name = {k.__name__: k for k in kinds}
    cls = by_name.get(name)
    if cls is None:
        cls, message = RuntimeError, f"{name}: {message}"
    world = 1 if comm is None else comm.world_size
    raise cls(f"{what} failed on rank {rank} of {world}: {message}{outcome}")
