"""What the workers of an export or a delta learn from each other, through
communication/agreement.py (one all-gather of numbers and errors at the
same point on every worker).

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
  one that failed (SHARED_FAILURES: the classes raised as they are).
"""

import time


def now_micros():
    """This process's wall clock in integer UTC microseconds, the clock the
    dynamic tables stamp the keys they update with (the kernels' wall clock,
    taken down to the microsecond)."""
    return time.time_ns() // 1000


# The classes of rank 0's errors (writing an export or a delta) that the
# other workers raise as they are; any other class is a RuntimeError naming it.
SHARED_FAILURES = (FileExistsError, FileNotFoundError, NotADirectoryError, IsADirectoryError,
                   PermissionError, OSError, ValueError, TypeError, RuntimeError)

