"""SOK's training pattern under a MirroredStrategy whose replicas are the
workers (tests/test_tf_distribute_comm.py): a tf.Module holding a static
and a dynamic sok table and a dense tf.Variable, trained with
split_embedding_variable_from_others(model.trainable_variables),
sok.OptimizerWrapper for the tables and a Keras optimizer for the rest.
The same model with plain tf.Variables for the tables
(tf.nn.embedding_lookup_sparse) is trained under the same strategy on the
same batches; rows and weights must agree. The tables, sharded over the
replicas, were missing from model.trainable_variables: the step trained
the dense weight only, without an error. Prints "OK" at the end.
"""

import argparse

import numpy as np

ROWS, DIM, STEPS, LR = 6, 2, 3, 0.1
KEYS = np.array([10 ** 12, 7, -5, 3], np.int64)  # the dynamic table's keys
DYNAMIC_START = 0.5  # every new key's row (the table's constant initializer)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--replicas", type=int, default=2)
    args = p.parse_args()
    n = args.replicas
    import tensorflow as tf

    from mirrored_cpus import mirrored_strategy_on_cpus

    strategy = mirrored_strategy_on_cpus(n)
    import sok_graph as sok

    rng = np.random.default_rng(3)
    static_init = rng.normal(size=(ROWS, DIM)).astype(np.float32)
    dense_init = rng.normal(size=(DIM, 1)).astype(np.float32)
    # Per step and replica: two samples of static ids and of dynamic keys
    # (positions into KEYS), ragged.
    batches = [[(rng.integers(0, ROWS, size=(2, 2)), rng.integers(0, len(KEYS), size=(2, 3)))
                for _ in range(n)] for _ in range(STEPS)]

    class SokModel(tf.Module):
        def __init__(self):
            self.static = sok.Variable(static_init, name="static")
            self.dynamic = sok.DynamicVariable(dimension=DIM, initializer=str(DYNAMIC_START),
                                               name="dynamic")
            self.w = tf.Variable(dense_init, name="w")

        def __call__(self, ids, keys):
            a, b = sok.lookup_sparse([self.static, self.dynamic], [ids, keys],
                                     combiners=["sum", "mean"])
            return tf.matmul(a + b, self.w)

    class PlainModel(tf.Module):
        def __init__(self):
            self.static = tf.Variable(static_init, name="static")
            self.dynamic = tf.Variable(np.full((len(KEYS), DIM), DYNAMIC_START, np.float32),
                                       name="dynamic")
            self.w = tf.Variable(dense_init, name="w")

        def __call__(self, ids, key_positions):
            a = tf.nn.embedding_lookup_sparse(self.static, ids.to_sparse(), None,
                                              combiner="sum")
            b = tf.nn.embedding_lookup_sparse(self.dynamic, key_positions.to_sparse(), None,
                                              combiner="mean")
            return tf.matmul(a + b, self.w)

    def ragged(rows):
        return tf.RaggedTensor.from_tensor(tf.constant(rows, tf.int64))

    def replica_inputs(step, sok_side):
        ctx = tf.distribute.get_replica_context()
        ids, positions = batches[step][tf.get_static_value(ctx.replica_id_in_sync_group)]
        return ragged(ids), ragged(KEYS[positions] if sok_side else positions)

    def loss_of(out):
        return tf.reduce_sum(tf.square(out - 1.0)) / (2 * n)

    with strategy.scope():
        sok.init(comm_tool="tf")
        model = SokModel()
        listed = [v.name for v in model.trainable_variables]
        assert len(listed) == 3, f"the module lists {listed}; its two tables and w"
        table_opt = sok.OptimizerWrapper(tf.keras.optimizers.SGD(LR))
        dense_opt = tf.keras.optimizers.SGD(LR)
        plain = PlainModel()
        plain_opt = tf.keras.optimizers.SGD(LR)

    def sok_step(step):
        ids, keys = replica_inputs(step, True)
        with tf.GradientTape() as tape:
            loss = loss_of(model(ids, keys))
        tables, others = sok.split_embedding_variable_from_others(model.trainable_variables)
        assert len(tables) == 2 and len(others) == 1, (tables, others)
        table_grads, other_grads = tape.gradient(loss, [tables, others])
        table_opt.apply_gradients(zip(table_grads, tables))
        dense_opt.apply_gradients(zip(other_grads, others))
        return loss

    def plain_step(step):
        ids, positions = replica_inputs(step, False)
        with tf.GradientTape() as tape:
            loss = loss_of(plain(ids, positions))
        variables = plain.trainable_variables
        plain_opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    for step in range(STEPS):
        for fn in (sok_step, plain_step):
            tf.function(lambda fn=fn, step=step: strategy.run(fn, args=(step,)))()

    keys, rows = (np.asarray(t) for t in sok.export(model.static))
    got = np.zeros_like(static_init)
    got[keys] = rows
    np.testing.assert_allclose(got, plain.static.numpy(), rtol=1e-6, atol=1e-6)
    assert not np.array_equal(got, static_init), "the static table did not train"
    keys, rows = (np.asarray(t) for t in sok.export(model.dynamic))
    by_key = dict(zip(keys.tolist(), rows))
    used = sorted(set(np.concatenate([positions.ravel() for step in batches
                                      for _, positions in step]).tolist()))
    assert sorted(by_key) == sorted(KEYS[used].tolist()), (sorted(by_key), KEYS[used])
    for position in used:
        np.testing.assert_allclose(by_key[int(KEYS[position])], plain.dynamic.numpy()[position],
                                   rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(model.w.numpy(), plain.w.numpy(), rtol=1e-6, atol=1e-6)
    print("OK", flush=True)


if __name__ == "__main__":
    main()
