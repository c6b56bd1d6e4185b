"""Exports the same tables from --replicas workers (replicas of one
process's MirroredStrategy over logical CPUs; 1: no strategy) for
tests/test_serving.py. Prints a JSON line: the export directory, the batch
and the model's predictions."""

import argparse
import json
import os

import numpy as np


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--replicas", type=int, required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    import tensorflow as tf

    if args.replicas > 1:
        from mirrored_cpus import mirrored_strategy_on_cpus

        strategy = mirrored_strategy_on_cpus(args.replicas)
    import sok_graph as sok
    from sok_graph import placement
    from sok_graph.tables import replica_shards

    if args.replicas > 1:
        with strategy.scope():
            comm = sok.init(comm_tool="tf")
    else:
        comm = sok.init()
    rng = np.random.default_rng(1)
    whole = rng.normal(size=(23, 5)).astype(np.float32)
    keys = rng.choice(10 ** 6, size=37, replace=False).astype(np.int64)
    rows = rng.normal(size=(37, 5)).astype(np.float32)
    static = sok.Variable(whole, name="static")
    dyn = sok.DynamicVariable(dimension=5, initializer="zeros", name="dyn")
    for shard in replica_shards.shards_of(dyn):
        mine = placement.owned_mask(shard, keys)
        shard.scatter_update(tf.constant(keys[mine]), tf.constant(rows[mine]))
    kernel = tf.constant(rng.normal(size=(10, 1)).astype(np.float32))

    class Model(tf.Module):
        def __call__(self, static_ids, dyn_ids):
            a = sok.lookup_sparse(static, tf.RaggedTensor.from_tensor(static_ids, padding=-1),
                                  combiners="mean")
            b = sok.lookup_sparse(dyn, tf.RaggedTensor.from_tensor(dyn_ids, padding=-1),
                                  combiners="sum")
            return tf.matmul(tf.concat([a, b], 1), kernel)

    model = Model()
    export_dir = os.path.join(args.out, "model")
    sok.export_for_serving(model, export_dir, [
        tf.TensorSpec([None, 2], tf.int64, name="static_ids"),
        tf.TensorSpec([None, 3], tf.int64, name="dyn_ids")], chunk_rows=8)
    batch = {"static_ids": rng.integers(0, 23, size=(9, 2)),
             "dyn_ids": rng.choice(np.concatenate([keys, [5, -1]]), size=(9, 3))}
    # The reference: the whole tables in numpy (a lookup outside a replica
    # would need strategy.run).
    a = whole[batch["static_ids"]].mean(1)
    table = dict(zip(keys.tolist(), rows))
    b = np.stack([sum((table.get(k, np.zeros(5, np.float32)) for k in r if k != -1),
                      np.zeros(5, np.float32)) for r in batch["dyn_ids"].tolist()])
    want = np.concatenate([a, b], 1) @ kernel.numpy()
    print(json.dumps({"world_size": comm.world_size, "export_dir": export_dir,
                      "batch": {k: v.tolist() for k, v in batch.items()},
                      "want": want.tolist()}))


if __name__ == "__main__":
    main()
