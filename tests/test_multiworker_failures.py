"""Failures of N-worker training under the launcher (tests/multiworker/
train_worker.py --fault): a worker killed, stalled, built with another table
shape, or looking up an id past a table's rows, must end the job with an
error that names the cause, within a bound. Split from test_multiworker.py,
whose equivalence runs fill its own time budget.
"""

import os

from multiworker.launching import launch_failing, needs_horovod

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "multiworker", "train_worker.py")


def _faulty_run(tmp_path, fault, *launcher_flags):
    """2 workers on the v2 workload, rank 1 at fault: (status, seconds, output)."""
    return launch_failing(
        ["-np", "2", *launcher_flags, TRAIN, "--engine", "horovod", "--configs",
         "v2:static:function", "--world", "2", "--out", str(tmp_path), "--fault", fault],
        timeout=300)


@needs_horovod
def test_worker_killed_mid_training_stops_the_others(tmp_path):
    rc, took, out = _faulty_run(tmp_path, "kill")
    assert rc != 0, out[-3000:]
    assert "rank 1" in out and "SIGKILL" in out, out[-3000:]


@needs_horovod
def test_worker_with_another_table_shape_fails_with_the_cause(tmp_path):
    """Rank 1 makes its tables one column wider: the first lookup names the
    table and both shapes, before any exchange (Horovod's collectives failed
    with "Mismatched ALLTOALL tensor shapes", naming no table)."""
    rc, took, out = _faulty_run(tmp_path, "shape")
    assert rc != 0, out[-3000:]
    assert "the workers' calls differ" in out and "'ta' (90 x 8 float32, distributed) on " \
        "rank 0 and 'ta' (90 x 9 float32, distributed) on rank 1" in out, out[-3000:]


@needs_horovod
def test_out_of_range_id_on_one_worker_is_a_clear_error(tmp_path):
    """A row id past the end of a sharded table is caught before it is sent
    to its owner, with the argument, the bound and the id in the message."""
    rc, took, out = _faulty_run(tmp_path, "badid")
    assert rc != 0, out[-3000:]
    assert "InvalidArgumentError" in out and "(sp_ids[0]) must be in [0, 90)" in out \
        and "90" in out, out[-3000:]


@needs_horovod
def test_id_that_would_wrap_the_shared_key_space_is_a_clear_error(tmp_path):
    """The sharded tables of one lookup share a key space (id * tables +
    table): an id so large that the key would wrap is caught as out of
    range, not looked up as some other row."""
    rc, took, out = _faulty_run(tmp_path, "hugeid")
    assert rc != 0, out[-3000:]
    assert "InvalidArgumentError" in out and "(sp_ids[0]) must be in [0, 90)" in out \
        and str(2 ** 62 + 1) in out, out[-3000:]


@needs_horovod
def test_stalled_worker_fails_the_job_within_the_bound(tmp_path):
    import re
    import time

    bound = 20
    rc, took, out = _faulty_run(tmp_path, "stall", "--stall-timeout", str(bound))
    ended = time.time()
    assert rc != 0, out[-3000:]
    assert "stall" in out.lower(), out[-3000:]
    # Measured from the moment rank 1 stopped taking part (start-up time on
    # a busy machine does not count against the bound).
    stalled_at = float(re.search(r"stall before step \d+ at ([\d.]+)", out).group(1))
    assert ended - stalled_at < bound + 30, \
        f"the job ended {ended - stalled_at:.0f} s after the stall with a {bound} s bound"
