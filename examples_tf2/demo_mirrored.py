"""SOK's "Get Started" walkthrough for TensorFlow 2 with
tf.distribute.MirroredStrategy: DemoModel (All2AllDenseEmbedding + dense
layers), sok.Init under the strategy's scope, a tf.function training step
with either a native Keras optimizer inside sok.OptimizerScope
(--use_tf_opt 1) or sok.optimizers.Adam (--use_tf_opt 0) for the embedding.

The code follows the guide except for the import line, the data (a
learnable synthetic set, demo_model.py) and sizes small enough for a CPU
(flags; the guide uses batch 65536 and 7 dense layers of 1024 units).

    python examples_tf2/demo_mirrored.py --use_tf_opt 1 --steps 30
    python examples_tf2/demo_mirrored.py --replicas 2   # 2 replicas on the CPU

With several replicas (GPUs, or --replicas N logical CPUs) each replica is a
worker: it holds a shard of the embedding table, gets its slice of every
global batch, and the lookups exchange rows between the replicas.
"""

import os
import sys

import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sok_graph as sok  # noqa: E402  (or: import sparse_operation_kit as sok)
from demo_model import DemoModel, check_learned, parse_args, synthetic_batches  # noqa: E402


def main():
    args = parse_args(__doc__.splitlines()[0], replicas=True)
    global_batch_size = args.global_batch_size
    use_tf_opt = bool(args.use_tf_opt)
    slot_num, nnz_per_slot, vocabulary = 10, 5, 1024

    devices = None  # every visible GPU (or the CPU)
    if args.replicas > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * args.replicas)
        devices = [f"/cpu:{i}" for i in range(args.replicas)]
    strategy = tf.distribute.MirroredStrategy(devices)
    replicas = strategy.num_replicas_in_sync
    with strategy.scope():
        sok.Init(global_batch_size=global_batch_size)

        model = DemoModel(max_vocabulary_size_per_gpu=vocabulary, slot_num=slot_num,
                          nnz_per_slot=nnz_per_slot, embedding_vector_size=16,
                          num_of_dense_layers=args.dense_layers, dense_units=args.dense_units)
        if not use_tf_opt:
            emb_opt = sok.optimizers.Adam(learning_rate=args.learning_rate)
        else:
            emb_opt = tf.keras.optimizers.Adam(learning_rate=args.learning_rate)
        dense_opt = tf.keras.optimizers.Adam(learning_rate=args.learning_rate)

    loss_fn = tf.keras.losses.BinaryCrossentropy(from_logits=True,
                                                 reduction=tf.keras.losses.Reduction.NONE)

    def _replica_loss(labels, logits):
        loss = loss_fn(labels, logits)
        return tf.nn.compute_average_loss(loss, global_batch_size=global_batch_size)

    @tf.function
    def _train_step(inputs, labels):
        with tf.GradientTape() as tape:
            logits = model(inputs, training=True)
            loss = _replica_loss(labels, logits)
        emb_var, other_var = sok.split_embedding_variable_from_others(model.trainable_variables)
        grads, emb_grads = tape.gradient(loss, [other_var, emb_var])
        if use_tf_opt:
            with sok.OptimizerScope(emb_var):
                emb_opt.apply_gradients(zip(emb_grads, emb_var),
                                        experimental_aggregate_gradients=False)
        else:
            emb_opt.apply_gradients(zip(emb_grads, emb_var),
                                    experimental_aggregate_gradients=False)
        dense_opt.apply_gradients(zip(grads, other_var))
        return loss

    def per_replica(inputs, labels):
        if replicas == 1:
            return inputs, labels
        per = global_batch_size // replicas  # each replica its slice of the global batch
        return tuple(strategy.experimental_distribute_values_from_function(
            lambda ctx, x=x: tf.constant(x[ctx.replica_id_in_sync_group * per:][:per]))
            for x in (inputs, labels))

    losses = []
    batches = list(synthetic_batches(args.steps, global_batch_size, slot_num, nnz_per_slot,
                                     vocabulary))
    if replicas > 1:
        # Keras 3 cannot create an optimizer's variables inside a replicated
        # tf.function step (with or without sok_graph): build the dense layers
        # (one forward) and the dense optimizer before training.
        # Keras 2's OptimizerV2 (TF < 2.11) has no build(): it makes its
        # variables itself, in cross-replica context, at the first step.
        strategy.run(lambda x: model(x, training=False), args=(per_replica(*batches[0])[0],))
        if hasattr(dense_opt, "build"):
            with strategy.scope():
                dense_opt.build(sok.split_embedding_variable_from_others(
                    model.trainable_variables)[1])
    for i, (inputs, labels) in enumerate(batches):
        inputs, labels = per_replica(inputs, labels)
        replica_loss = strategy.run(_train_step, args=(inputs, labels))
        total_loss = strategy.reduce(tf.distribute.ReduceOp.SUM, replica_loss, axis=None)
        losses.append(float(total_loss))
        print("[SOK INFO]: Iteration: {}, loss: {}".format(i, losses[-1]))
    check_learned(losses, f"demo_mirrored (use_tf_opt={int(use_tf_opt)})")


if __name__ == "__main__":
    main()
