"""The NCCL all-to-all between the GPUs of one process, against numpy.

Run by tests/gpu/test_multi_gpu.py on a machine with `--world` GPUs. A
MirroredStrategy over the GPUs, one replica per GPU; every replica sends a
random number of rows (zero included) to every other, exchanges them with
sok_graph's NCCL op (SOK_GRAPH_NCCL=1: an error if it cannot be used) and
sends them back (the sized reply); the gradient of a weighted sum of what
arrived is the reverse exchange of the weights; a padded input (rows past
the splits, not sent) gives the same rows and a zero gradient for its
padding. Checked in a tf.function
and in a tf.compat.v1 Session graph, for float32 rows of 128 and int64 ids.
Prints one line per check and exits non-zero on the first mismatch.
"""

import argparse
import os
import sys

os.environ["SOK_GRAPH_NCCL"] = "1"
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from sok_graph.communication import nccl  # noqa: E402


def plan(world, seed):
    """splits[s][r]: rows s sends r; rows[s]: s's rows (each row names its
    sender, receiver and position so a misplaced row is visible)."""
    rng = np.random.default_rng(seed)
    splits = rng.integers(0, 50, size=(world, world))
    splits[0, world - 1] = 0  # an empty message
    rows = []
    for s in range(world):
        n = int(splits[s].sum())
        rows.append(rng.standard_normal((n, 128)).astype(np.float32) + 1000 * s)
    return splits, rows


def expected(splits, rows, r):
    world = len(rows)
    out = []
    for s in range(world):
        start = int(splits[s, :r].sum())
        out.append(rows[s][start:start + int(splits[s, r])])
    return np.concatenate(out, 0)


def run_function(strategy, world, splits, rows):
    transport = nccl.Transport.local(strategy.extended.worker_devices)
    weights = [np.random.default_rng(10 + r).standard_normal(
        (int(splits[:, r].sum()), 128)).astype(np.float32) for r in range(world)]

    @tf.function
    def step():
        def replica():
            rank = int(tf.get_static_value(
                tf.distribute.get_replica_context().replica_id_in_sync_group))
            x = tf.constant(rows[rank])
            ids = tf.cast(tf.range(tf.shape(x)[0]), tf.int64) + 100000 * rank
            with tf.GradientTape() as tape:
                tape.watch(x)
                got, got_splits = transport.alltoall(x, tf.constant(splits[rank]), rank)
                back, _ = transport.alltoall(got * 2.0, got_splits, rank)
                loss = tf.reduce_sum(got * weights[rank])
            grad = tape.gradient(loss, x)
            got_ids, _ = transport.alltoall(ids, tf.constant(splits[rank]), rank)
            # Padded: 7 rows past the splits stay here; their gradient is 0.
            padded = tf.concat([x, tf.fill([7, 128], 9999.0)], 0)
            with tf.GradientTape() as tape:
                tape.watch(padded)
                got_padded, _ = transport.alltoall(padded, tf.constant(splits[rank]), rank,
                                                   padded=True)
                loss = tf.reduce_sum(got_padded * weights[rank])
            grad_padded = tape.gradient(loss, padded)
            return got, got_splits, back, grad, got_ids, got_padded, grad_padded
        return strategy.run(replica)

    outs = step()
    for r in range(world):
        got, got_splits, back, grad, got_ids, got_padded, grad_padded = [
            strategy.experimental_local_results(o)[r].numpy() for o in outs]
        want = expected(splits, rows, r)
        np.testing.assert_array_equal(got, want, err_msg=f"function: rows received by {r}")
        np.testing.assert_array_equal(got_splits, splits[:, r], err_msg=f"splits of {r}")
        np.testing.assert_array_equal(back, rows[r] * 2.0, err_msg=f"reply to {r}")
        # The gradient: the weights of rank t for the rows r sent t.
        want_grad = np.concatenate([
            weights[t][int(splits[:r, t].sum()):int(splits[:r + 1, t].sum())]
            for t in range(world)], 0)
        np.testing.assert_array_equal(grad, want_grad, err_msg=f"gradient of {r}")
        ids = [np.arange(int(splits[s].sum()), dtype=np.int64) + 100000 * s for s in range(world)]
        np.testing.assert_array_equal(got_ids, expected(splits, ids, r), err_msg=f"ids of {r}")
        np.testing.assert_array_equal(got_padded, want, err_msg=f"padded rows received by {r}")
        np.testing.assert_array_equal(
            grad_padded, np.concatenate([want_grad, np.zeros((7, 128), np.float32)], 0),
            err_msg=f"gradient of {r}'s padded rows")
    print(f"nccl_alltoall_check: tf.function on {world} GPUs: rows, splits, reply, "
          f"gradient, int64 ids and a padded input as numpy's")


def run_session(world, splits, rows):
    graph = tf.Graph()
    with graph.as_default():
        transport = nccl.Transport("local:session-check", world)
        outs = []
        for r in range(world):
            with tf.device(f"/GPU:{r}"):
                x = tf.constant(rows[r])
                got, got_splits = transport.alltoall(x, tf.constant(splits[r]), r)
                back, _ = transport.alltoall(got + 1.0, got_splits, r)
                outs.append((got, back))
        with tf.compat.v1.Session(graph=graph) as sess:
            for _ in range(3):  # the same graph again: the communicators are reused
                values = sess.run(outs)
    for r in range(world):
        np.testing.assert_array_equal(values[r][0], expected(splits, rows, r),
                                      err_msg=f"session: rows received by {r}")
        np.testing.assert_array_equal(values[r][1], rows[r] + 1.0, err_msg=f"session reply {r}")
    print(f"nccl_alltoall_check: Session graph on {world} GPUs, 3 runs: as numpy's")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--world", type=int, default=2)
    args = p.parse_args()
    gpus = tf.config.list_physical_devices("GPU")
    if len(gpus) < args.world:
        sys.exit(f"needs {args.world} GPUs; TensorFlow sees {len(gpus)}")
    splits, rows = plan(args.world, seed=args.world)
    strategy = tf.distribute.MirroredStrategy([f"/gpu:{i}" for i in range(args.world)])
    run_function(strategy, args.world, splits, rows)
    run_session(args.world, splits, rows)


if __name__ == "__main__":
    main()
