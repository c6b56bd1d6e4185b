"""Reading sok tables whole, in chunks: every worker's rows, on rank 0.

A table is read shard by shard, `chunk_rows` rows at a time, as (keys,
rows) numpy chunks: global row numbers of a sok.Variable, keys of a
sok.DynamicVariable. Shards held by other processes are gathered a chunk
per round (every worker takes part in every round); the shards of one
process's MirroredStrategy replicas are read directly. Nothing holds more
than a chunk of a table besides what the caller keeps.

Reads run eagerly (small tf.functions) or, for a TF1 graph, in the Session
that holds the tables (`runner`).
"""

import contextlib

import numpy as np
import tensorflow as tf

from sok_graph import context
from sok_graph.communication import agreement
from sok_graph.tables import dimension_of, is_dynamic, replica_shards
from sok_graph.ops import dynamic as dynamic_ops

INT64_MIN = dynamic_ops.INT64_MIN


class Runner:
    """Builds a small computation once and runs it on numpy inputs: eagerly
    (as a tf.function) or in `session` (placeholders in its graph)."""

    def __init__(self, session=None):
        self.session = session

    @contextlib.contextmanager
    def _graph(self):
        graph = self.session.graph
        unfinalize = getattr(graph, "_unsafe_unfinalize", None)
        refinalize = graph.finalized and unfinalize is not None
        if refinalize:
            unfinalize()  # a MonitoredSession's graph: the reads are added once
        try:
            with graph.as_default():
                yield
        finally:
            if refinalize:
                graph.finalize()

    def make(self, fn, specs):
        if self.session is None:
            function = tf.function(fn, input_signature=specs)
            # Each table gets its own small functions, traced once each; the
            # same code traced for table after table is not the retracing
            # TensorFlow warns about ("N out of the last N calls ... triggered
            # tf.function retracing"), so that warning is off for them.
            if hasattr(function, "_omit_frequent_tracing_warning"):
                function._omit_frequent_tracing_warning = True

            def run(*args):
                out = function(*args)
                return tf.nest.map_structure(lambda t: t.numpy(), out)
            return run
        with self._graph():
            feeds = [tf.compat.v1.placeholder(s.dtype, s.shape) for s in specs]
            fetches = fn(*feeds)

        def run_in_session(*args):
            return self.session.run(fetches, dict(zip(feeds, args)))
        return run_in_session


def _int64_scalar():
    return tf.TensorSpec([], tf.int64)


def shard_reader(shard, runner, updated_after=None, keys_only=False):
    """(count, read): the shard's number of rows, and read(offset, limit) ->
    (keys int64, rows, next offset) of its next chunk (the table protocol's
    row_count and export_chunk; updated_after applies to dynamic tables)."""
    after = updated_after if is_dynamic(shard) else None

    def chunk(offset, limit):
        keys, rows, next_offset = shard.export_chunk(offset, limit, after)
        return tf.cast(keys, tf.int64), rows[:0] if keys_only else rows, next_offset
    count = int(runner.make(shard.row_count, [])())
    return count, runner.make(chunk, [_int64_scalar(), _int64_scalar()])


def _shard_chunks(shard, runner, chunk_rows, updated_after=None, keys_only=False):
    count, read = shard_reader(shard, runner, updated_after, keys_only)
    offset = 0
    while offset < count:
        keys, rows, offset = read(np.int64(offset), np.int64(chunk_rows))
        offset = int(offset)
        if len(keys):
            yield np.asarray(keys), np.asarray(rows)


def _dtype_of(table):
    return tf.as_dtype(table.dtype).base_dtype


def whole_table(table, runner, chunk_rows=1 << 20, updated_after=None, keys_only=False):
    """(count, chunks): the number of rows of the whole table (on rank 0; 0
    on other ranks) and an iterator of its (keys, rows) numpy chunks (empty
    on ranks > 0, which still take part in the gathers). keys_only: the
    chunks' rows are empty."""
    shards = replica_shards.shards_of(table)
    comm = context.active()
    world_size = shards[0].placement[0]
    if world_size == 1 or comm is None or comm.in_process:
        counts = [shard_reader(s, runner, updated_after)[0] for s in shards]

        def local():
            for shard in shards:
                for chunk in _shard_chunks(shard, runner, chunk_rows, updated_after,
                                           keys_only):
                    yield chunk
        return sum(counts), local()
    return _gathered(shards[0], runner, chunk_rows, updated_after, keys_only, comm)


def _gathered(shard, runner, chunk_rows, updated_after, keys_only, comm):
    dim = dimension_of(shard)
    dtype = _dtype_of(shard)
    eager = runner.session is None
    rank = comm.rank
    counts = agreement.HostGather(comm, eager, [tf.TensorSpec([None], tf.int64)],
                                  "serving_count")
    count, _ = shard_reader(shard, runner, updated_after)
    total = int(np.sum(counts(np.array([count], np.int64))[0]))
    counts.close()

    def rounds():
        gather = agreement.HostGather(comm, eager, [tf.TensorSpec([None], tf.int64),
                                                    tf.TensorSpec([None, dim], dtype),
                                                    tf.TensorSpec([None], tf.int64)],
                                      "serving_rows")
        mine = _shard_chunks(shard, runner, chunk_rows, updated_after, keys_only)
        try:
            while True:
                chunk = next(mine, None)
                busy = np.array([0 if chunk is None else 1], np.int64)
                if chunk is None:
                    chunk = (np.zeros([0], np.int64),
                             np.zeros([0, dim], dtype.as_numpy_dtype))
                keys, rows, flags = gather(chunk[0], chunk[1], busy)
                if len(keys) and rank == 0:
                    yield keys, rows
                if not flags.any():
                    return
        finally:
            gather.close()
    return (total if rank == 0 else 0), rounds()
