"""sok.load on several worker processes is all or nothing: each worker
checks the rows it would own (its bounded table's max_capacity, its key
dtype), and where one refuses the dump every worker raises CheckpointError
before any table changes (tests/multiworker/dump_worker.py --refuse_on).
A file of its own: test_multiworker.py's engine runs take most of a large
test's bound."""

import glob
import os
import shutil

import pytest

from multiworker.launching import launch, needs_horovod

HERE = os.path.dirname(os.path.abspath(__file__))
DUMP = os.path.join(HERE, "multiworker", "dump_worker.py")
SAVER = os.path.join(HERE, "multiworker", "saver_worker.py")


@needs_horovod
def test_a_load_one_worker_refuses_changes_no_worker(tmp_path):
    """Where one worker refuses a dump (its dynamic table holds at most 4
    rows), every worker raises CheckpointError and keeps its tables as
    built. The other workers loaded the dump without an error before: the
    job went on half from the dump, half from before.

    The dump phase first dumps to a directory of the user's files, which
    rank 0 (the writer) refuses: every worker raises FileExistsError naming
    rank 0 and its reason, and the next dump works. The others used to
    return as if the dump were written, and their next collective met
    another of rank 0's (a barrier failed, or waited for the stall
    timeout). A dump or load given the optimizer on one worker only is
    refused on every worker, naming the argument: the dump failed in
    TensorFlow's collectives, and the load put rank 0's slots and step
    back while rank 1 kept its own."""
    user = tmp_path / "user"
    user.mkdir()
    (user / "notes.txt").write_text("mine")
    launch(2, DUMP, ["--engine", "horovod", "--phase", "dump", "--path", str(tmp_path / "ckpt"),
                     "--out", str(tmp_path / "out"), "--refused_path", str(user)])
    assert os.listdir(user) == ["notes.txt"]
    for refusing in (0, 1):
        launch(2, DUMP, ["--engine", "horovod", "--phase", "load", "--path",
                         str(tmp_path / "ckpt"), "--out", str(tmp_path / "unused"),
                         "--refuse_on", str(refusing), "--reason", "holds at most 4 rows"])
    assert not os.path.exists(tmp_path / "unused")


@needs_horovod
def test_a_dump_one_worker_cannot_read_is_loaded_by_no_worker(tmp_path):
    """A worker whose copy of the dump is damaged (a file cut short: a file
    system of its own, a copy that failed) refuses it as it reads it; the
    others read theirs whole. Every worker raises CheckpointError naming
    that worker and its reason, and keeps its tables as built: the others
    used to load the dump and go on from it alone."""
    ckpt = str(tmp_path / "ckpt")
    launch(2, DUMP, ["--engine", "horovod", "--phase", "dump", "--path", ckpt,
                     "--out", str(tmp_path / "out")])
    shutil.copytree(ckpt, ckpt + "_damaged")
    values = sorted(glob.glob(os.path.join(ckpt + "_damaged", "*dynamic_table*values*")))
    assert values, os.listdir(ckpt + "_damaged")
    with open(values[0], "r+b") as f:
        f.truncate(os.path.getsize(values[0]) // 2)
    launch(2, DUMP, ["--engine", "horovod", "--phase", "load", "--path", ckpt,
                     "--out", str(tmp_path / "unused"), "--unreadable_on", "1",
                     "--reason", os.path.basename(values[0])])
    assert not os.path.exists(tmp_path / "unused")



@needs_horovod
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_a_saver_restore_of_shards_from_different_saves_is_refused_by_every_worker(
        tmp_path, graph):
    """sok.Saver on two workers (each writes and reads its own shard): a
    directory holding worker 0's shards of one save and worker 1's of
    another (a worker that did not dump with the others, a copy made in
    part) was restored as if whole, mixing the two saves, and a worker
    that could not read its shard failed alone while the other restored.
    Now the workers of a dump record a save id they agree on, and a restore
    is refused on every worker, before any row changes, unless every worker
    read its shard of one save (tests/multiworker/saver_worker.py)."""
    launch(2, SAVER, ["--dir", str(tmp_path)] + (["--graph"] if graph else []))


CHECKPOINT = os.path.join(HERE, "multiworker", "checkpoint_shards.py")
_TF_VERSION = tuple(int(x) for x in __import__("tensorflow").__version__.split(".")[:2])


@needs_horovod
@pytest.mark.skipif(_TF_VERSION < (2, 11),
                    reason="TensorFlow 2.11's checkpoint API (_serialize_to_tensors) names a "
                           "table's tensors by the table; before it a static table's are its "
                           "variable's")
def test_a_checkpoint_of_worker_shards_restores_only_on_its_own_worker(tmp_path):
    """tf.train.Checkpoint of tables sharded over worker processes: each
    worker's checkpoint holds its shard, which it restores whole; read on
    another worker (MultiWorkerMirroredStrategy's habit: every worker
    restores the chief's file) it is TensorFlow's NotFoundError naming the
    shard, where rank 1 took rank 0's rows (and its dynamic table rank 0's
    keys) without an error (multiworker/checkpoint_shards.py)."""
    out = launch(2, CHECKPOINT, ["--dir", str(tmp_path)])
    for rank in (0, 1):
        assert f"rank {rank}/2 checkpoint shards: ok" in out, out[-3000:]
