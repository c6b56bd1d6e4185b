"""What the workers of an export or a delta learn from each other.

created: the earliest clock reading over all workers. Every worker reads
  its clock before it reads any table; the readings are gathered and the
  earliest is the export's (or the delta's) `created`. A dynamic table
  stamps the keys it updates with the clock of the worker that holds it,
  and every worker's reading is at or after `created`: a key that worker
  updates after the export read its tables is stamped after its reading,
  so after `created`, whatever the offsets between the workers' clocks. A
  delta with since=created therefore holds it (rows updated in the overlap
  are written again, newer).
outcome: whether a step (rank 0's writing of an export or a delta, its
  checks) failed on some worker, so that every worker raises, not only the
  one that failed.

Each is one all-gather of int64 numbers through the job's communicator
(serving/sources.py's _Gather, as the tables' gathers), made by every
worker in the same order, so none waits for a gather another skipped. One
process (no communicator, one worker, or the replicas of one process's
MirroredStrategy, which share its clock) gathers nothing.
"""

import time

import numpy as np
import tensorflow as tf

from sok_graph.serving import sources

# The most bytes of an error's message another worker is told.
MESSAGE_BYTES = 4096


def now_micros():
    """This process's wall clock in integer UTC microseconds, the clock the
    dynamic tables stamp the keys they update with (the kernels' wall clock,
    taken down to the microsecond)."""
    return time.time_ns() // 1000


def gathers(comm):
    """Whether `comm` joins several processes (so a gather is needed)."""
    return comm is not None and not comm.in_process and comm.world_size > 1


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
    gather = sources._Gather(comm, eager, [tf.TensorSpec([None], tf.int64)], "agree")
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
        raise RuntimeError(f"serving: the workers' gathered numbers ({len(flat)}) do not split "
                           f"into {comm.world_size} workers' parts")
    return out


def agree(comm, eager, reading=None, error=None):
    """(earliest reading, [(rank, class name, message) of each worker's
    error]): every worker calls it at the same point. reading: this
    worker's clock reading (now_micros) or None where no time is gathered;
    error: the exception this worker holds, or None. One process: its own
    reading and error."""
    if not gathers(comm):
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


# The classes of rank 0's errors (writing an export or a delta) that the
# other workers raise as they are; any other class is a RuntimeError naming it.
SHARED_FAILURES = (FileExistsError, FileNotFoundError, NotADirectoryError, IsADirectoryError,
                   PermissionError, OSError, ValueError, TypeError, RuntimeError)


def raise_shared(comm, own, failures, what, kinds):
    """After agree: raises `own` (this worker's exception) where it has one;
    else, where another worker failed, an exception of that worker's class
    (when it is one of `kinds`, else RuntimeError) saying which worker, what
    it was doing (`what`) and its message. Returns where none failed."""
    if own is not None:
        raise own
    if not failures:
        return
    rank, name, message = failures[0]
    by_name = {k.__name__: k for k in kinds}
    cls = by_name.get(name)
    if cls is None:
        cls, message = RuntimeError, f"{name}: {message}"
    raise cls(f"{what} failed on rank {rank} of {comm.world_size}: {message}")
