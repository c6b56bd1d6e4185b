"""sok.lookup_sparse over several sharded static tables (lookup._group_rows,
exchange.grouped_static_rows) at its edges, under a MirroredStrategy over 2
and 3 logical CPUs whose replicas are the workers: forward values and the
tables' gradients against numpy on the whole tables, with ids of known and
unknown static size (tf.function with constants, with an input_signature,
and a tf.compat.v1 Session graph), int32 and int64 ids, empty samples and
all-empty table batches, repeated ids, every combiner with and without
weights, tables of 1 row and of fewer rows than replicas, a localized table,
ids out of range and row_splits that do not end at a table's number of ids
(errors naming the table). The checks run in a fresh
process (tests/multiworker/sharded_lookup_edges.py): logical CPUs must
exist before TensorFlow starts."""

import os
import sys

import pytest

from multiworker.launching import needs_tf2_collectives, run_process

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multiworker",
                      "sharded_lookup_edges.py")


@needs_tf2_collectives
@pytest.mark.parametrize("replicas", [2, 3])
def test_sharded_lookup_edges_equal_numpy(replicas):
    """In one process: tf.function, tf.function with an input_signature,
    then a Session graph."""
    out = run_process([sys.executable, SCRIPT, "--replicas", str(replicas)],
                      timeout=300, cwd=os.path.dirname(SCRIPT))
    assert "OK" in out, out[-4000:]
