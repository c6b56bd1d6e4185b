"""SOK's DemoModel (from its "Get Started" guide) and a learnable synthetic
data set for it, shared by the 1.x-API examples in examples_tf2/ and
examples_tf1/.

The data: every key k has a hidden score; a sample's label is 1 when the
scores of its keys sum to more than zero. A model that learns an embedding
per key can fit that, so the loss falls as training goes on.
"""

import argparse

import numpy as np
import tensorflow as tf

import sok_graph as sok  # or: import sparse_operation_kit as sok
from sok_graph.data import flags


class DemoModel(tf.keras.models.Model):
    """All2AllDenseEmbedding -> reshape -> num_of_dense_layers x Dense(relu) -> Dense(1)."""

    def __init__(self, max_vocabulary_size_per_gpu, slot_num, nnz_per_slot,
                 embedding_vector_size, num_of_dense_layers, dense_units=1024,
                 dense_layer=tf.keras.layers.Dense, **kwargs):
        super(DemoModel, self).__init__(**kwargs)
        self.max_vocabulary_size_per_gpu = max_vocabulary_size_per_gpu
        self.slot_num = slot_num
        self.nnz_per_slot = nnz_per_slot
        self.embedding_vector_size = embedding_vector_size
        self.num_of_dense_layers = num_of_dense_layers

        # one embedding vector per key: [batch, slot_num, nnz_per_slot, dim]
        self.embedding_layer = sok.All2AllDenseEmbedding(
            max_vocabulary_size_per_gpu=self.max_vocabulary_size_per_gpu,
            embedding_vec_size=self.embedding_vector_size,
            slot_num=self.slot_num,
            nnz_per_slot=self.nnz_per_slot)

        self.dense_layers = []
        for _ in range(self.num_of_dense_layers):
            self.dense_layers.append(dense_layer(units=dense_units, activation="relu"))
        self.out_layer = dense_layer(units=1, activation=None)

    def call(self, inputs, training=True):
        emb_vector = self.embedding_layer(inputs, training=training)
        hidden = tf.reshape(
            emb_vector, [-1, self.slot_num * self.nnz_per_slot * self.embedding_vector_size])
        for layer in self.dense_layers:
            hidden = layer(hidden)
        return self.out_layer(hidden)


def synthetic_batches(steps, batch_size, slot_num, nnz_per_slot, vocabulary, seed=0):
    """`steps` batches of (keys [batch, slot_num, nnz_per_slot] int64, labels
    [batch, 1] float32) with the planted rule of the module docstring."""
    rng = np.random.default_rng(seed)
    scores = rng.normal(size=vocabulary)
    for _ in range(steps):
        keys = rng.integers(0, vocabulary, size=(batch_size, slot_num, nnz_per_slot))
        labels = (scores[keys].sum(axis=(1, 2)) > 0).astype(np.float32)[:, None]
        yield keys.astype(np.int64), labels


def check_learned(losses, name):
    """Fails loudly unless every loss is finite and the last steps' mean is
    below the first steps' mean."""
    losses = np.asarray(losses, np.float64)
    if not np.all(np.isfinite(losses)):
        raise SystemExit(f"{name}: a loss is not finite: {losses.tolist()}")
    k = max(1, len(losses) // 4)
    first, last = losses[:k].mean(), losses[-k:].mean()
    print(f"{name}: mean loss of the first {k} steps {first:.4f}, of the last {k} steps "
          f"{last:.4f}")
    if not last < first:
        raise SystemExit(f"{name}: the loss did not decrease")


def parse_args(description, replicas=False):
    """The flags every DemoModel example takes (CPU-sized defaults; SOK's
    guide uses batch 65536 and 7 dense layers of 1024 units); `replicas`
    adds --replicas (MirroredStrategy over that many logical CPUs)."""
    p = argparse.ArgumentParser(description=description)
    if replicas:
        p.add_argument("--replicas", type=flags.int_at_least(1), default=1,
                       help="> 1: a MirroredStrategy over that many logical CPUs")
    p.add_argument("--use_tf_opt", type=int, choices=[0, 1], default=1,
                   help="1: a native optimizer in sok.OptimizerScope; 0: sok.optimizers.Adam")
    p.add_argument("--global_batch_size", type=flags.int_at_least(1), default=1024)
    p.add_argument("--steps", type=flags.int_at_least(2), default=30,
                   help="at least 2: the check compares the last loss with the first")
    p.add_argument("--dense_layers", type=flags.int_at_least(0), default=2)
    p.add_argument("--dense_units", type=flags.int_at_least(1), default=64)
    p.add_argument("--learning_rate", type=flags.positive_number, default=0.01)
    return p.parse_args()
