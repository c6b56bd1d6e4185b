"""Trains a small embedding + MLP model with sok_graph in TF2 (tf.function).

Three sok tables (user, item, tags; tags are multi-hot with a mean combiner)
feed an MLP that predicts a click. The data is synthetic with a planted
signal, so the test AUC printed at the end must clearly beat 0.5.

    python examples_tf2/lookup_demo.py [--steps 300] [--batch 1024]
"""

import argparse
import time

import numpy as np
import tensorflow as tf

import sok_graph as sok
from sok_graph.data import flags, synthetic

VOCABS = [20000, 5000, 1000]
HOTNESS = [1, 1, 5]
DIMS = [16, 16, 8]
COMBINERS = ["sum", "sum", "mean"]


def dense_layer(rng, fan_in, fan_out):
    w = (rng.standard_normal((fan_in, fan_out)) * np.sqrt(2.0 / fan_in)).astype(np.float32)
    return tf.Variable(w), tf.Variable(np.zeros(fan_out, np.float32))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=flags.int_at_least(1), default=300)
    parser.add_argument("--batch", type=flags.int_at_least(1), default=1024)
    parser.add_argument("--lr", type=flags.positive_number, default=0.05,
                        help="dense layers' learning rate")
    parser.add_argument("--emb-lr", type=flags.positive_number, default=1.0,
                        help="embedding learning rate")
    args = parser.parse_args()

    sok.init()
    rng = np.random.default_rng(0)
    n_train = args.steps * args.batch
    data = synthetic.make_planted_dataset(n_train + 20000, VOCABS, HOTNESS, seed=1)
    tables = [sok.Variable(rng.normal(0, 0.05, (v, d)).astype(np.float32), name=n)
              for v, d, n in zip(VOCABS, DIMS, ["user", "item", "tags"])]
    layers = [dense_layer(rng, sum(DIMS), 64), dense_layer(rng, 64, 1)]
    dense_vars = [v for layer in layers for v in layer]

    def forward(values, splits):
        ids = [tf.RaggedTensor.from_row_splits(v, s) for v, s in zip(values, splits)]
        emb = sok.lookup_sparse(tables, ids, combiners=COMBINERS)
        x = tf.concat(emb, axis=1)
        x = tf.nn.relu(tf.matmul(x, layers[0][0]) + layers[0][1])
        return tf.squeeze(tf.matmul(x, layers[1][0]) + layers[1][1], 1)

    # One trace for every batch: ids per batch vary in number.
    ragged_spec = [tf.TensorSpec([None], tf.int64)] * len(VOCABS)
    spec = (ragged_spec, ragged_spec)

    @tf.function(input_signature=spec + (tf.TensorSpec([None], tf.float32),))
    def train_step(values, splits, labels):
        with tf.GradientTape() as tape:
            logits = forward(values, splits)
            loss = tf.reduce_mean(
                tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
        grads = tape.gradient(loss, tables + dense_vars)
        for var, grad in zip(tables + dense_vars, grads):
            if isinstance(grad, tf.IndexedSlices):  # sok tables: only touched rows move
                var.scatter_sub(tf.IndexedSlices(args.emb_lr * grad.values, grad.indices))
            else:
                var.assign_sub(args.lr * grad)
        return loss

    predict = tf.function(lambda values, splits: tf.sigmoid(forward(values, splits)),
                          input_signature=spec)

    start = time.time()
    losses = []
    for step in range(args.steps):
        values, splits, labels = synthetic.batch(data, step * args.batch, (step + 1) * args.batch)
        losses.append(float(train_step(values, splits, labels)))
        if step % max(1, args.steps // 10) == 0 or step == args.steps - 1:
            print(f"step {step:5d}  loss {np.mean(losses[-20:]):.4f}", flush=True)
    values, splits, labels = synthetic.batch(data, n_train, n_train + 20000)
    test_auc = synthetic.auc(labels, predict(values, splits).numpy())
    print(f"trained {args.steps} steps in {time.time() - start:.1f}s; "
          f"first loss {np.mean(losses[:10]):.4f}, last loss {np.mean(losses[-10:]):.4f}")
    print(f"test AUC {test_auc:.4f}")


if __name__ == "__main__":
    main()
