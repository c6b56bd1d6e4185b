"""SOK's "Get Started" walkthrough for TensorFlow 1.15-style graph mode:
DemoModel, `sok_init_op = sok.Init(...)` run first in a
tf.compat.v1.Session, tf.gradients, the embedding optimizer inside
sok.OptimizerScope (--use_tf_opt 1) or sok.optimizers.Adam (--use_tf_opt 0),
and Horovod all-reduce of the dense gradients when Horovod is installed
(one process without it).

Differences from the guide: the import line, the data (a learnable
synthetic set fed through placeholders), CPU-sized flags, and the native
optimizers are tf.compat.v1.train.AdamOptimizer — graph mode's optimizers
(the guide's tf.keras.optimizers.Adam was the Keras of TF 1.15). Keras 3
(TensorFlow >= 2.16) has no graph mode and its variables are not
tf.Variables, so there the dense layers are plain tf.compat.v1 variables
(GraphDense below) instead of tf.keras.layers.Dense.

    python examples_tf1/demo_session.py --use_tf_opt 1 --steps 30
"""

import os
import sys

import tensorflow as tf

try:
    import horovod.tensorflow as hvd
except ImportError:  # single process
    hvd = None

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                "examples_tf2"))
import sok_graph as sok  # noqa: E402  (or: import sparse_operation_kit as sok)
from demo_model import DemoModel, check_learned, parse_args, synthetic_batches  # noqa: E402


class GraphDense:
    """A dense layer of plain tf.compat.v1 variables, for graph mode where the
    installed Keras (3) has none; created on first call, like Keras layers."""

    _count = 0

    def __init__(self, units, activation=None):
        self.units, self.activation = units, activation
        self.trainable_variables = []

    def __call__(self, x):
        if not self.trainable_variables:
            GraphDense._count += 1
            with tf.compat.v1.variable_scope(f"graph_dense_{GraphDense._count}"):
                kernel = tf.compat.v1.get_variable(
                    "kernel", [int(x.shape[-1]), self.units],
                    initializer=tf.compat.v1.glorot_uniform_initializer(), use_resource=True)
                bias = tf.compat.v1.get_variable("bias", [self.units],
                                                 initializer=tf.compat.v1.zeros_initializer(),
                                                 use_resource=True)
            self.trainable_variables = [kernel, bias]
        kernel, bias = self.trainable_variables
        y = tf.matmul(x, kernel) + bias
        return tf.nn.relu(y) if self.activation == "relu" else y


def main():
    args = parse_args(__doc__.splitlines()[0])
    tf.compat.v1.disable_eager_execution()
    if hvd is not None:
        hvd.init()
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", str(hvd.local_rank()))
    workers = hvd.size() if hvd is not None else 1
    global_batch_size = args.global_batch_size
    use_tf_opt = bool(args.use_tf_opt)
    slot_num, nnz_per_slot, vocabulary = 10, 5, 1024

    sok_init_op = sok.Init(global_batch_size=global_batch_size)

    keras3 = sok.compat.KERAS_MAJOR_VERSION >= 3
    model = DemoModel(max_vocabulary_size_per_gpu=vocabulary, slot_num=slot_num,
                      nnz_per_slot=nnz_per_slot, embedding_vector_size=16,
                      num_of_dense_layers=args.dense_layers, dense_units=args.dense_units,
                      dense_layer=GraphDense if keras3 else tf.keras.layers.Dense)

    def trainable_variables():
        if not keras3:
            return model.trainable_variables
        plain = [v for layer in model.dense_layers + [model.out_layer]
                 for v in layer.trainable_variables]
        return model.trainable_variables + plain
    if not use_tf_opt:
        emb_opt = sok.optimizers.Adam(learning_rate=args.learning_rate)
    else:
        emb_opt = tf.compat.v1.train.AdamOptimizer(learning_rate=args.learning_rate)
    dense_opt = tf.compat.v1.train.AdamOptimizer(learning_rate=args.learning_rate)

    loss_fn = tf.keras.losses.BinaryCrossentropy(from_logits=True, reduction="none")

    def _replica_loss(labels, logits):
        loss = loss_fn(labels, logits)
        return tf.nn.compute_average_loss(loss, global_batch_size=global_batch_size)

    def train_step(inputs, labels, training):
        logit = model(inputs, training=training)
        loss = _replica_loss(labels, logit)
        emb_var, other_var = sok.split_embedding_variable_from_others(trainable_variables())
        grads = tf.compat.v1.gradients(loss, emb_var + other_var,
                                     colocate_gradients_with_ops=True)
        emb_grads, other_grads = grads[:len(emb_var)], grads[len(emb_var):]

        if use_tf_opt:
            with sok.OptimizerScope(emb_var):
                emb_train_op = emb_opt.apply_gradients(zip(emb_grads, emb_var))
        else:
            emb_train_op = emb_opt.apply_gradients(zip(emb_grads, emb_var))

        if hvd is not None:
            other_grads = [hvd.allreduce(grad) for grad in other_grads]
        other_train_op = dense_opt.apply_gradients(zip(other_grads, other_var))

        with tf.control_dependencies([emb_train_op, other_train_op]):
            total_loss = hvd.allreduce(loss) if hvd is not None else loss
            total_loss = tf.identity(total_loss)
            return total_loss

    local_batch = global_batch_size // workers
    inputs = tf.compat.v1.placeholder(tf.int64, [local_batch, slot_num, nnz_per_slot])
    labels = tf.compat.v1.placeholder(tf.float32, [local_batch, 1])
    loss = train_step(inputs, labels, training=True)

    init_op = tf.group(tf.compat.v1.global_variables_initializer(),
                       tf.compat.v1.local_variables_initializer())
    # Every worker starts the dense layers from rank 0's values (each drew
    # its own, and the all-reduced gradients then trained a different model
    # on every worker); the sok tables are sharded, each worker its rows.
    broadcast_op = None
    if hvd is not None:
        _, dense_vars = sok.split_embedding_variable_from_others(trainable_variables())
        broadcast_op = hvd.broadcast_variables(dense_vars, root_rank=0)

    losses = []
    rank = hvd.rank() if hvd is not None else 0
    batches = synthetic_batches(args.steps, local_batch, slot_num, nnz_per_slot, vocabulary,
                                seed=rank)
    with tf.compat.v1.Session() as sess:
        sess.run(sok_init_op)
        sess.run(init_op)
        if broadcast_op is not None:
            sess.run(broadcast_op)
        for step, (keys, label) in enumerate(batches):
            loss_v = sess.run(loss, {inputs: keys, labels: label})
            losses.append(float(loss_v))
            print("[SOK INFO]: Iteration: {}, loss: {}".format(step, loss_v))
    check_learned(losses, f"demo_session (use_tf_opt={int(use_tf_opt)})")


if __name__ == "__main__":
    main()
