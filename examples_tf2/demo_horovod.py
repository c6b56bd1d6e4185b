"""SOK's "Get Started" walkthrough for TensorFlow 2 with Horovod: DemoModel,
sok.Init, a tf.function step that all-reduces the dense gradients with
Horovod and broadcasts the dense variables after the first step.

Needs Horovod (`horovodrun -np 2 -H localhost:2 python examples_tf2/demo_horovod.py`,
or plain `python ...` for one worker). Apart from the import line, the data
(demo_model.py) and CPU-sized flags, the code is the guide's.
"""

import os
import sys

import tensorflow as tf

try:
    import horovod.tensorflow as hvd
except ImportError:  # pragma: no cover - depends on the environment
    raise SystemExit("demo_horovod.py needs Horovod (pip install horovod); "
                     "see demo_mirrored.py for the tf.distribute version")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sok_graph as sok  # noqa: E402  (or: import sparse_operation_kit as sok)
from demo_model import DemoModel, check_learned, parse_args, synthetic_batches  # noqa: E402


def main():
    args = parse_args(__doc__.splitlines()[0])

    hvd.init()
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", str(hvd.local_rank()))
    global_batch_size = args.global_batch_size
    use_tf_opt = bool(args.use_tf_opt)
    slot_num, nnz_per_slot, vocabulary = 10, 5, 1024

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
    def _train_step(inputs, labels, first_batch):
        with tf.GradientTape() as tape:
            logits = model(inputs, training=True)
            loss = _replica_loss(labels, logits)
        emb_var, other_var = sok.split_embedding_variable_from_others(model.trainable_variables)
        emb_grads, other_grads = tape.gradient(loss, [emb_var, other_var])
        if use_tf_opt:
            with sok.OptimizerScope(emb_var):
                emb_opt.apply_gradients(zip(emb_grads, emb_var),
                                        experimental_aggregate_gradients=False)
        else:
            emb_opt.apply_gradients(zip(emb_grads, emb_var),
                                    experimental_aggregate_gradients=False)
        other_grads = [hvd.allreduce(grads) for grads in other_grads]
        dense_opt.apply_gradients(zip(other_grads, other_var))
        if first_batch:
            hvd.broadcast_variables(other_var, root_rank=0)
            # Keras 2: variables() is a method; Keras 3: a list.
            opt_vars = dense_opt.variables
            hvd.broadcast_variables(opt_vars() if callable(opt_vars) else opt_vars, root_rank=0)
        return loss

    local_batch = global_batch_size // hvd.size()
    losses = []
    batches = synthetic_batches(args.steps, local_batch, slot_num, nnz_per_slot, vocabulary,
                                seed=hvd.rank())
    for i, (inputs, labels) in enumerate(batches):
        replica_loss = _train_step(inputs, labels, 0 == i)
        total_loss = hvd.allreduce(replica_loss)
        losses.append(float(total_loss))
        print("[SOK INFO]: Iteration: {}, loss: {}".format(i, losses[-1]))
    check_learned(losses, f"demo_horovod (use_tf_opt={int(use_tf_opt)})")


if __name__ == "__main__":
    main()
