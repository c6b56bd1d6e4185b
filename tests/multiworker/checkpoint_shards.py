"""A worker of test_multiworker_load.py's tf.train.Checkpoint test: each
worker process holds its shard of a static and a dynamic table (Horovod
engine); it writes a checkpoint of its own (<dir>/rank<r>), restores it into
zeroed tables (every row back), and then restores rank 0's, which only rank
0 may: any other worker must get TensorFlow's NotFoundError naming its
shard's tensors (each worker saves its shard only; named alike, a worker
reading rank 0's file took rank 0's rows, without an error). TensorFlow
2.11 and later (_serialize_to_tensors); the static and the dynamic table
are restored apart, so that each one's refusal is seen."""

import argparse
import os

import numpy as np


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    args = p.parse_args()
    import tensorflow as tf

    tf.compat.v1.enable_eager_execution()
    import horovod.tensorflow as hvd

    import sok_graph as sok

    hvd.init()
    rank, world = hvd.rank(), hvd.size()
    sok.init(comm_tool="horovod")
    rows = np.repeat(np.arange(8, dtype=np.float32)[:, None], 2, 1)  # row i is [i, i]
    keys = np.arange(100, 108, dtype=np.int64)
    mine = keys[keys % world == rank]
    static = sok.Variable(rows, name="st")
    dynamic = sok.DynamicVariable(dimension=2, initializer="zeros", name="dy")
    dynamic.import_rows(mine, np.repeat(mine.astype(np.float32)[:, None], 2, 1))
    own = os.path.join(args.dir, f"rank{rank}")
    tf.train.Checkpoint(dy=dynamic, st=static).write(own)
    hvd.allreduce(tf.constant(0.0), name="written")  # every worker's written

    def zeroed():
        return (sok.DynamicVariable(dimension=2, initializer="zeros", name="dy"),
                sok.Variable(np.zeros_like(rows), name="st"))

    fresh, zero = zeroed()
    tf.train.Checkpoint(dy=fresh, st=zero).read(own).assert_consumed()
    got_keys, got_rows = (np.asarray(a) for a in sok.export(fresh))
    order = np.argsort(got_keys)
    np.testing.assert_array_equal(got_keys[order], mine)
    np.testing.assert_array_equal(got_rows[order][:, 0], mine.astype(np.float32))
    ids, values = (np.asarray(a) for a in sok.export(zero))
    np.testing.assert_array_equal(values, rows[ids])
    fresh, zero = zeroed()
    for name, table in (("dy", fresh), ("st", zero)):
        try:
            tf.train.Checkpoint(**{name: table}).read(
                os.path.join(args.dir, "rank0")).expect_partial()
        except tf.errors.NotFoundError as e:
            assert rank != 0 and f"-shard{rank}of{world}" in str(e), (rank, name, str(e))
        else:
            assert rank == 0, f"rank {rank} restored rank 0's shard of {name}"
    assert sorted(np.asarray(sok.export(fresh)[0]).tolist()) == (mine.tolist() if rank == 0
                                                                 else [])
    print(f"rank {rank}/{world} checkpoint shards: ok", flush=True)


if __name__ == "__main__":
    main()
