"""Serving exports and deltas of two Horovod workers whose clocks differ.

Each dynamic table stamps the keys it updates with the clock of the worker
that holds it. The export's `created` was rank 0's clock: where rank 1's
clock ran behind it, rank 1 stamped the keys it updated just after the
export with times before `created`, and a delta with since=created missed
them without an error (the served model kept the old rows). `created` is
now the earliest of the workers' clocks, each read before any table is.

tests/multiworker/serving_clock_worker.py runs rank 0 an hour ahead (its
clock as the serving code reads it, and the times it stamps its keys
with), exports, updates keys on both workers, exports a delta since the
export's created and applies it; then asks for deltas rank 0 refuses,
which every worker must now raise (the others returned None), and an
export into a directory rank 0 refuses, which every worker must raise too.
"""

import json
import os
import time

import numpy as np
import pytest
import tensorflow as tf

from multiworker.launching import launch, needs_horovod

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "multiworker", "serving_clock_worker.py")
HOUR = 3600 * 10 ** 6
TF1 = tf.__version__.startswith("1.")
MODES = ["session", "strategy"] + ([] if TF1 else ["eager"])

pytestmark = needs_horovod


def _rows(keys, base):
    """The worker's rows for `keys`: base + key + [0, .1, .2, .3], float32."""
    return np.array([[base + k + c / 10 for c in range(4)] for k in keys], np.float32)


@pytest.fixture(scope="module", params=MODES)
def run(request, tmp_path_factory):
    """(mode, out directory, {rank: report}) of one two-worker run."""
    out = str(tmp_path_factory.mktemp(f"clocks_{request.param}"))
    launch(2, WORKER, ["--mode", request.param, "--out", out, "--shift", str(HOUR)],
           timeout=300)
    reports = {}
    for rank in (0, 1):
        with open(os.path.join(out, f"rank{rank}.json")) as f:
            reports[rank] = json.load(f)
    return request.param, out, reports


def _served(export_dir, table):
    """{key: served row} of a dynamic table in the export's checkpoint."""
    with open(os.path.join(export_dir, "assets.extra", "sok_serving.json")) as f:
        entry = [t for t in json.load(f)["tables"] if t["name"] == table][0]
    reader = tf.train.load_checkpoint(os.path.join(export_dir, "variables", "variables"))
    where = entry["checkpoint_keys"]
    keys, index, rows = (reader.get_tensor(where[role]) for role in ("keys", "index", "rows"))
    return {int(k): rows[i] for k, i in zip(keys, index)}


def test_a_delta_since_the_exports_created_holds_the_rows_a_lagging_worker_updated(run):
    mode, out, reports = run
    export_dir, delta_dir = os.path.join(out, "export"), os.path.join(out, "delta")
    with open(os.path.join(export_dir, "assets.extra", "sok_serving.json")) as f:
        export_created = json.load(f)["created"]
    with open(os.path.join(delta_dir, "manifest.json")) as f:
        manifest = json.load(f)
    assert [t["name"] for t in manifest["tables"]] == ["dyn"]
    keys = np.load(os.path.join(delta_dir, "dyn.keys.npy"))
    rows = np.load(os.path.join(delta_dir, "dyn.rows.npy"))
    # Updated after the export: 3 and 11 on rank 1 (key % 2), whose clock is
    # behind, 4 and 12 on rank 0. Also rank 0's other keys, written before
    # the export but stamped by its clock, an hour ahead: after the
    # earliest clock reading, so written again (the overlap), unchanged.
    # Every key was in before any clock was read: rank 1 gives no other.
    np.testing.assert_array_equal(keys, [0, 2, 3, 4, 6, 8, 11, 12])
    np.testing.assert_array_equal(rows, np.concatenate([
        _rows([0, 2], 0), _rows([3, 4], 100), _rows([6, 8], 0), _rows([11, 12], 100)]))
    # The earliest clock: rank 1's, read during its export call (rank 0's
    # was an hour ahead).
    assert reports[1]["rank1_clock_before_export"] <= export_created \
        <= reports[1]["rank1_clock_after_export"], (mode, export_created, reports[1])
    assert manifest["since"] == export_created
    assert export_created < manifest["created"] <= time.time_ns() // 1000, manifest
    assert reports[0]["applied"] == {"dyn": 8}
    served = _served(export_dir, "dyn")
    assert sorted(served) == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12]
    for k in served:
        want = _rows([k], 100 if k in (3, 4, 11, 12) else 0)[0]
        np.testing.assert_array_equal(served[k], want, err_msg=f"{mode}: key {k}")


def test_every_worker_raises_where_rank_0_refuses_a_delta(run):
    """A delta_dir that exists, and a table rank 0 reads a key of twice
    (the first of two tables: rank 0 still reads the second, which the
    other worker gathers): rank 0 raises, and rank 1 an error of the same
    class naming rank 0 and its message (it returned None)."""
    mode, out, reports = run
    delta_dir = os.path.join(out, "delta")
    exists = f"delta_dir {delta_dir!r} exists; a delta goes to a new directory"
    assert reports[0]["exists"] == ["FileExistsError", exists], (mode, reports[0])
    assert reports[1]["exists"] == [
        "FileExistsError", "export_serving_delta failed on rank 0 of 2: " + exists], \
        (mode, reports[1])
    twice = (f"export_serving_delta: table 'dyn' gave key 0 2 times while it was read (and 7 "
             f"other keys repeated); a table holds each key once, so it was changed while it "
             f"was read (train only after export_serving_delta returns, on every worker): "
             f"nothing was written to delta_dir={os.path.join(out, 'twice')!r}")
    assert reports[0]["twice"] == ["DeltaError", twice], (mode, reports[0])
    assert reports[1]["twice"] == [
        "DeltaError", "export_serving_delta failed on rank 0 of 2: " + twice], (mode, reports[1])
    assert not os.path.exists(os.path.join(out, "twice"))


def test_every_worker_raises_where_rank_0_refuses_an_export_dir(run):
    """export_dir holds a file of the user's: rank 0 refused it and raised,
    while rank 1 returned None (and went on as if the export were written).
    Every worker raises now, rank 1 an error of rank 0's class naming rank 0,
    before any table is read; the user's file stays, alone."""
    mode, out, reports = run
    taken = os.path.join(out, "taken")
    if mode == "eager":
        refused = (f"export_dir={taken!r} holds something other than a SavedModel: an export "
                   f"replaces only a previous export or an empty directory; choose another "
                   f"export_dir or remove it")
    else:
        refused = (f"export_dir={taken!r} exists and is not empty; a TF1 export (as "
                   f"TensorFlow's SavedModel Builder) writes only a new directory: choose "
                   f"another export_dir")
    caller = "CollectiveStrategy.export_saved_model" if mode == "strategy" \
        else "export_for_serving"
    assert reports[0]["taken"] == ["FileExistsError", refused], (mode, reports[0])
    assert reports[1]["taken"] == [
        "FileExistsError", f"{caller} failed on rank 0 of 2: {refused}"], (mode, reports[1])
    assert os.listdir(taken) == ["notes.txt"]
