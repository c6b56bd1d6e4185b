"""sok.load on several worker processes is all or nothing: each worker
checks the rows it would own (its bounded table's max_capacity, its key
dtype), and where one refuses the dump every worker raises CheckpointError
before any table changes (tests/multiworker/dump_worker.py --refuse_on).
A file of its own: test_multiworker.py's engine runs take most of a large
test's bound."""

import os

from multiworker.launching import launch, needs_horovod

HERE = os.path.dirname(os.path.abspath(__file__))
DUMP = os.path.join(HERE, "multiworker", "dump_worker.py")


@needs_horovod
def test_a_load_one_worker_refuses_changes_no_worker(tmp_path):
    """Where one worker refuses a dump (its dynamic table holds at most 4
    rows), every worker raises CheckpointError and keeps its tables as
    built. The other workers loaded the dump without an error before: the
    job went on half from the dump, half from before."""
    launch(2, DUMP, ["--engine", "horovod", "--phase", "dump", "--path", str(tmp_path / "ckpt"),
                     "--out", str(tmp_path / "out")])
    for refusing in (0, 1):
        launch(2, DUMP, ["--engine", "horovod", "--phase", "load", "--path",
                         str(tmp_path / "ckpt"), "--out", str(tmp_path / "unused"),
                         "--refuse_on", str(refusing)])
    assert not os.path.exists(tmp_path / "unused")
