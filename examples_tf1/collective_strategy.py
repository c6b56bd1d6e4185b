"""DeepRec's CollectiveStrategy example (MonitoredTrainingSession), on sok_graph.

    python -m sok_graph.launch -np 2 examples_tf1/collective_strategy.py   # 2 workers
    python examples_tf1/collective_strategy.py                            # 1 process
    COLLECTIVE_STRATEGY=none python examples_tf1/collective_strategy.py   # no Horovod

The model is DeepRec's as written (tf.get_variable etc. are spelled
tf.compat.v1 where TensorFlow 2 needs it). The table is sharded over the
workers; every worker looks up the same ids, so every worker must print what
one process prints: rows of ones and a loss of 36. The check after the step
also reads the rows again: one Ftrl step with the gradient of 2 per looked-up
element (averaged over workers: each worker's loss is its own, as in
DeepRec's example) must give what numpy's Ftrl gives.
"""

import numpy as np
import tensorflow as tf

from sok_graph import CollectiveStrategy

#STEP1:  initialize a collective strategy
strategy = CollectiveStrategy()
#STEP2:  define the data parallel scope
with strategy.scope(), tf.Graph().as_default():
    #STEP3:  define the model parallel scope
    with strategy.embedding_scope():
        var = tf.compat.v1.get_variable(
            'var_1',
            shape=(1000, 3),
            initializer=tf.compat.v1.ones_initializer(tf.float32),
            partitioner=tf.compat.v1.fixed_size_partitioner(num_shards=strategy.world_size())
        )
    emb = tf.nn.embedding_lookup(
        var, tf.cast([0, 1, 2, 5, 6, 7], tf.int64))
    fun = tf.multiply(emb, 2.0, name='multiply')
    loss = tf.reduce_sum(fun, name='reduce_sum')
    opt = tf.compat.v1.train.FtrlOptimizer(
        0.1,
        l1_regularization_strength=2.0,
        l2_regularization_strength=0.00001)
    g_v = opt.compute_gradients(loss)
    train_op = opt.apply_gradients(g_v)
    with tf.compat.v1.train.MonitoredTrainingSession('') as sess:
        emb_result, loss_result, _ = sess.run([emb, loss, train_op])
        print (emb_result, loss_result)
        emb_after = sess.run(emb)
        shard_rows = var.shape[0]

# What one process computes.
np.testing.assert_array_equal(emb_result, np.ones((6, 3), np.float32))
assert loss_result == 36.0, loss_result


def ftrl_step(w, g, lr=0.1, l1=2.0, l2=0.00001, accum=0.1, linear=0.0):
    """One step of TensorFlow's Ftrl (learning_rate_power -0.5) in numpy."""
    new_accum = accum + g * g
    linear = linear + g - (np.sqrt(new_accum) - np.sqrt(accum)) / lr * w
    quadratic = np.sqrt(new_accum) / lr + 2 * l2
    return np.where(np.abs(linear) > l1, (np.sign(linear) * l1 - linear) / quadratic, 0.0)


# The table is sharded: this worker holds rows rank, rank + N, ... of 1000.
assert shard_rows == len(range(strategy.rank(), 1000, strategy.world_size())), shard_rows
want = ftrl_step(np.ones((6, 3)), 2.0)
np.testing.assert_allclose(emb_after, want, rtol=1e-5)
print(f"rank {strategy.rank()} of {strategy.world_size()} (holds {shard_rows} of 1000 rows): "
      f"embeddings and loss equal a single process's; rows after one Ftrl step {emb_after[0]} "
      "as numpy's Ftrl", flush=True)
