"""SOK's "Get Started" walkthrough, run with sok_graph on CPU, one process.

Adapted where the walkthrough contradicts itself: its printed embeddings
come from tables whose row i is [k*i, k*i + 1, ...] (k = the dimension, 3 and
5) and from combiners "sum" and "sum" (it passes "sum" and "mean" but prints
sums), so the tables are filled that way with sok.assign, and both
combiners are "sum". Horovod is used when it is installed and initialized.
"""

import datetime
import os
import sys
import tempfile

import numpy as np
import tensorflow as tf

import sparse_operation_kit as sok

sok.init()

# sok.Variable: distributed (default) and localized.
v1 = sok.Variable(np.arange(15 * 16).reshape(15, 16), dtype=tf.float32)
v2 = sok.Variable(np.arange(15 * 16).reshape(15, 16), dtype=tf.float32, mode="localized:0")
print("v1:", v1.shape, v1.mode, "v2:", v2.shape, v2.mode)

# sok.DynamicVariable: "hbm" (unbounded) and "hybrid" (bounded, evicting).
v1 = sok.DynamicVariable(dimension=3, var_type="hbm", initializer="normal")
v2 = sok.DynamicVariable(dimension=5, var_type="hybrid", initializer="uniform",
                         init_capacity=1024 * 1024, max_capacity=1024 * 1024,
                         max_hbm_for_vectors=2)
sok.assign(v1, tf.range(15, dtype=tf.int64), tf.reshape(tf.range(45, dtype=tf.float32), [15, 3]))
sok.assign(v2, tf.range(15, dtype=tf.int64), tf.reshape(tf.range(75, dtype=tf.float32), [15, 5]))

indices1 = tf.SparseTensor(indices=[[0, 0], [0, 1], [1, 0], [1, 1], [1, 2]],
                           values=tf.constant([1, 1, 3, 4, 5], tf.int64), dense_shape=[2, 3])
indices2 = tf.SparseTensor(indices=[[0, 0], [1, 0], [1, 1]],
                           values=tf.constant([1, 2, 3], tf.int64), dense_shape=[2, 2])
with tf.GradientTape() as tape:
    embeddings = sok.lookup_sparse([v1, v2], [indices1, indices2], combiners=["sum", "sum"])
    loss = 0.0
    for i, embedding in enumerate(embeddings):
        loss += tf.reduce_sum(embedding)
        print("embedding%d:\n" % (i + 1), embedding.numpy())
np.testing.assert_array_equal(embeddings[0].numpy(), [[6, 8, 10], [36, 39, 42]])
np.testing.assert_array_equal(embeddings[1].numpy(), [[5, 6, 7, 8, 9], [25, 27, 29, 31, 33]])

optimizer = tf.keras.optimizers.SGD(learning_rate=1.0)
sok_optimizer = sok.OptimizerWrapper(optimizer)
grads = tape.gradient(loss, [v1, v2])
for i, grad in enumerate(grads):
    print("grad%d: keys %s" % (i + 1, grad.indices.numpy().tolist()))
sok_optimizer.apply_gradients(zip(grads, [v1, v2]))
rows, _ = v1.find(tf.constant([1], tf.int64))
np.testing.assert_array_equal(rows.numpy(), [[3 - 2, 4 - 2, 5 - 2]])  # key 1 was used twice

indices = tf.convert_to_tensor([i for i in range(24)], dtype=tf.int64)
values = tf.convert_to_tensor(np.random.rand(24, 3), dtype=tf.float32)
sok.assign(v1, indices, values)
ex_v1_indices, ex_v1_values = sok.export(v1)
print("exported", ex_v1_indices.shape[0], "rows of v1")
assert ex_v1_indices.shape[0] == 24

path = os.path.join(tempfile.mkdtemp(), "weights")
sok_vars = [v1, v2]
sok.dump(path, sok_vars, sok_optimizer)
sok.load(path, sok_vars, sok_optimizer)
np.testing.assert_array_equal(sok.export(v1)[1].numpy(), ex_v1_values.numpy())

utc_time_threshold = datetime.datetime.now(datetime.timezone.utc)
sok.assign(v2, tf.constant([7], tf.int64), tf.ones([1, 5]))
keys, values = sok.incremental_model_dump(sok_vars, utc_time_threshold)
print("updated after the threshold:", [k.tolist() for k in keys])
assert [k.tolist() for k in keys] == [[], [7]]
print("get started: OK")
sys.exit(0)
