"""A Keras 3 weights file of a model whose sok table is sharded over a
MirroredStrategy's replicas (2 logical CPUs), trained by Adam through
sok.OptimizerWrapper: the file keeps the rows, not the slots, which the
shards hold each for its keys (tf.train.Checkpoint and sok.dump keep them
whole). The save left them out without a word: a fit resumed from the
file trained the rows with fresh Adam slots. Now it warns, naming the
table. Prints "OK" at the end.
"""

import sys
import warnings

import numpy as np


def main():
    import tensorflow as tf

    from mirrored_cpus import mirrored_strategy_on_cpus

    strategy = mirrored_strategy_on_cpus(2)
    import keras

    import sok_graph as sok

    with strategy.scope():
        sok.init(comm_tool="tf")
        table = sok.DynamicVariable(dimension=2, name="dyn", initializer="0.5")
        opt = sok.OptimizerWrapper(tf.keras.optimizers.Adam(0.1))

    def step():
        ids = tf.RaggedTensor.from_tensor(tf.constant([[1, 2], [3, 4]], tf.int64))
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(sok.lookup_sparse(table, ids, combiners="sum"))
        opt.apply_gradients(zip(tape.gradient(loss, [table]), [table]))
        return loss

    tf.function(lambda: strategy.run(step))()

    class Holder(keras.Model):
        def __init__(self):
            super().__init__()
            self.table = table

        def call(self, x):
            return x

    holder = Holder()
    holder(tf.zeros([1]))
    path = sys.argv[1]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        holder.save_weights(path)
    said = [str(w.message) for w in seen if "sok table" in str(w.message)]
    assert len(said) == 1 and "slots and step of sok table 'dyn' (a table sharded over " \
        "replicas)" in said[0], said
    keys, rows = (np.asarray(t) for t in sok.export(table))
    assert sorted(keys.tolist()) == [1, 2, 3, 4], keys
    # The rows are in the file all the same: they come back.
    tf.function(lambda: strategy.run(step))()  # the rows move on
    _, moved = (np.asarray(t) for t in sok.export(table))
    assert not np.array_equal(moved, rows)
    holder.load_weights(path)
    again_keys, again = (np.asarray(t) for t in sok.export(table))
    np.testing.assert_array_equal(again[np.argsort(again_keys)], rows[np.argsort(keys)])
    print("OK", flush=True)


if __name__ == "__main__":
    main()
