"""One worker of the multi-worker sok.Saver test (tests/test_multiworker_load.py):

    saver_worker.py --dir D [--graph]

Each worker holds its shard of a static and a dynamic table and writes it
with Saver.dump_to_file into D/gen1 (every row 1 x its base) and D/gen2
(2 x). Rank 0 then makes D/mixed (gen1 with worker 1's shards of gen2: a
worker that did not dump with the others, a directory copied in part) and
D/missing (gen2 without worker 1's shards). Then, on every worker:

- restore_from_file of D/gen2 gives every row 2 x its base;
- after the rows are set to 3 x, a restore of D/mixed is a CheckpointError
  on every worker naming the different saves, and one of D/missing is one
  on every worker (worker 1 its own, the others naming worker 1), and no
  row changes (the shards of two saves were restored together, and a
  worker that could not read its shard failed alone).

--graph: the same in a tf.compat.v1 Session's graph. Prints "rank R ok".
"""

import argparse
import os
import shutil

import numpy as np

ROWS, DIM = 12, 3
BASE = np.arange(ROWS * DIM, dtype=np.float32).reshape(ROWS, DIM) + 1


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--graph", action="store_true")
    args = p.parse_args()
    import tensorflow as tf
    import horovod.tensorflow as hvd

    hvd.init()
    rank = hvd.rank()
    if args.graph:
        tf.compat.v1.disable_eager_execution()
    else:
        tf.compat.v1.enable_eager_execution()  # TF 1.x starts in graph mode
    import sok_graph as sok
    from sok_graph.dump_load import CheckpointError

    sok.init(comm_tool="horovod")
    static = sok.Variable(np.zeros([ROWS, DIM], np.float32), name="static_t")
    dynamic = sok.DynamicVariable(dimension=DIM, initializer="zeros", name="dynamic_t")
    tables = [static, dynamic]
    saver = sok.Saver()
    sess = None
    if args.graph:
        sess = tf.compat.v1.Session()
        sess.run(tf.compat.v1.global_variables_initializer())

    def run(ops):
        return sess.run(ops) if sess is not None else ops

    def set_rows(factor):
        run([saver.load_embedding_values(t, factor * BASE) for t in tables])

    def rows_of(table):
        """This worker's shard: {key: row}."""
        keys, rows = run(sok.export(table))
        return {int(k): np.asarray(r) for k, r in zip(np.asarray(keys), np.asarray(rows))}

    def check_rows(factor, what):
        for table in tables:
            got = rows_of(table)
            assert got, (rank, what)
            for k, r in got.items():
                np.testing.assert_array_equal(r, factor * BASE[k], err_msg=f"{rank} {what}")

    # A graph's barrier is one op, run each time (made before the Session
    # runs anything else of it).
    sok_barrier = hvd.allreduce(tf.zeros([1]), name="saver_worker_barrier") if sess else None

    for gen in (1, 2):
        set_rows(gen)
        run([saver.dump_to_file(t, os.path.join(args.dir, f"gen{gen}")) for t in tables])
    if sess is None:
        hvd.allreduce(tf.zeros([1]), name="made")
    else:
        sess.run(sok_barrier)
    if rank == 0:
        gen1, gen2 = os.path.join(args.dir, "gen1"), os.path.join(args.dir, "gen2")
        mixed, missing = os.path.join(args.dir, "mixed"), os.path.join(args.dir, "missing")
        shutil.copytree(gen1, mixed)
        shutil.copytree(gen2, missing)
        for name in ("static_t", "dynamic_t"):
            shard = f"{name}.shard-1-of-2"
            shutil.rmtree(os.path.join(mixed, shard))
            shutil.copytree(os.path.join(gen2, shard), os.path.join(mixed, shard))
            shutil.rmtree(os.path.join(missing, shard))
    if sess is None:
        hvd.allreduce(tf.zeros([1]), name="copied")
    else:
        sess.run(sok_barrier)

    run([saver.restore_from_file(t, os.path.join(args.dir, "gen2")) for t in tables])
    check_rows(2, "restored gen2")
    set_rows(3)
    for case, words in (("mixed", "shards come from different saves"),
                        ("missing", "no Saver dump" if rank == 1 else
                         "worker(s) [1] of 2 could not read their shard")):
        for table in tables:
            try:
                run(saver.restore_from_file(table, os.path.join(args.dir, case)))
            except (CheckpointError, tf.errors.OpError) as e:
                assert words in str(e), (rank, case, str(e)[:2000])
            else:
                raise AssertionError(f"rank {rank}: the restore of {case} went through")
        check_rows(3, f"after the refused {case}")
    print(f"rank {rank} ok", flush=True)


if __name__ == "__main__":
    main()
