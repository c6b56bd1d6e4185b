"""The TF2 lookup demo in TF1-style graph mode: placeholders, a
tf.compat.v1.Session loop and a tf.compat.v1.train optimizer, which applies
sok tables' IndexedSlices gradients to the touched rows only.

    python examples_tf1/lookup_demo.py [--steps 300] [--batch 1024]
"""

import argparse
import time

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_eager_execution()

import sok_graph as sok  # noqa: E402
from sok_graph.data import flags, synthetic  # noqa: E402

VOCABS = [20000, 5000, 1000]
HOTNESS = [1, 1, 5]
DIMS = [16, 16, 8]
COMBINERS = ["sum", "sum", "mean"]


def dense(x, fan_in, fan_out, name):
    """x @ W + b with graph-mode variables (tf.compat.v1.layers needs Keras 2)."""
    w = tf.compat.v1.get_variable(
        name + "/kernel", [fan_in, fan_out],
        initializer=tf.compat.v1.initializers.he_normal(seed=0))
    b = tf.compat.v1.get_variable(name + "/bias", [fan_out], initializer=tf.zeros_initializer())
    return tf.matmul(x, w) + b


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=flags.int_at_least(1), default=300)
    parser.add_argument("--batch", type=flags.int_at_least(1), default=1024)
    parser.add_argument("--lr", type=flags.positive_number, default=0.5)
    args = parser.parse_args()

    sok.init()
    rng = np.random.default_rng(0)
    n_train = args.steps * args.batch
    data = synthetic.make_planted_dataset(n_train + 20000, VOCABS, HOTNESS, seed=1)

    tables = [sok.Variable(rng.normal(0, 0.05, (v, d)).astype(np.float32), name=n)
              for v, d, n in zip(VOCABS, DIMS, ["user", "item", "tags"])]
    values = [tf.compat.v1.placeholder(tf.int64, [None]) for _ in VOCABS]
    splits = [tf.compat.v1.placeholder(tf.int64, [None]) for _ in VOCABS]
    labels = tf.compat.v1.placeholder(tf.float32, [None])
    ids = [tf.RaggedTensor.from_row_splits(v, s) for v, s in zip(values, splits)]
    emb = tf.concat(sok.lookup_sparse(tables, ids, combiners=COMBINERS), axis=1)
    hidden = tf.nn.relu(dense(emb, sum(DIMS), 64, "hidden"))
    logits = tf.squeeze(dense(hidden, 64, 1, "output"), 1)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    train_op = tf.compat.v1.train.AdagradOptimizer(args.lr).minimize(loss)
    probs = tf.sigmoid(logits)

    def feed(start, stop):
        v, s, y = synthetic.batch(data, start, stop)
        out = {labels: y}
        out.update(zip(values, v))
        out.update(zip(splits, s))
        return out

    start = time.time()
    losses = []
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for step in range(args.steps):
            _, value = sess.run([train_op, loss], feed(step * args.batch, (step + 1) * args.batch))
            losses.append(value)
            if step % max(1, args.steps // 10) == 0 or step == args.steps - 1:
                print(f"step {step:5d}  loss {np.mean(losses[-20:]):.4f}", flush=True)
        test = feed(n_train, n_train + 20000)
        test_auc = synthetic.auc(test[labels], sess.run(probs, test))
    print(f"trained {args.steps} steps in {time.time() - start:.1f}s; "
          f"first loss {np.mean(losses[:10]):.4f}, last loss {np.mean(losses[-10:]):.4f}")
    print(f"test AUC {test_auc:.4f}")


if __name__ == "__main__":
    main()
