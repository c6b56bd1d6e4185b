"""DemoModel training on hashed keys: sok's dynamic table against plain
TensorFlow's ways of embedding hashed ids, in the same run.

Production ids are hashes from a 2^63 space, not row numbers. Each step
here takes --batch samples of --slots x --nnz keys: ids drawn from Zipf
(--alpha, default 1.05) or uniform (--alpha 0) over --vocab distinct ids,
each hashed (splitmix64) into [0, 2^63). Every side embeds them in dim
--dim, flattens [batch, slots * nnz * dim] into the same --layers dense
layers of --units (SOK's DemoModel: 100 x 10 keys, dim 16, 7 layers of
1024), and trains with SGD (--lr) in one tf.function:

- sok: a sok.DynamicVariable (a row per key, created on first sight),
  sok.lookup_sparse-free read (sparse_read of the [batch, slots, nnz] keys),
  sok.OptimizerWrapper(SGD);
- hashing trick: a tf.Variable of --vocab rows indexed by key mod --vocab
  (tf.nn.embedding_lookup; colliding keys share a row), SGD by
  scatter_sub of the IndexedSlices gradient;
- MutableHashTable / DenseHashTable (tf.lookup.experimental): unique keys,
  lookup (zeros for new keys), the gradient of the looked-up rows, insert of
  the updated rows (what a trainable TF hash table takes).

A "dense" step, the same layers on a fixed embedding tensor of the same
shape (forward, loss, gradients of the weights and of that tensor, the
update), is timed too; "emb*" is a side's step less that. --mode graph
builds every side in one graph run by a tf.compat.v1.Session (the sok side
then wraps tf.compat.v1.train's SGD), the batches held in variables on
the device. Sides run in
interleaved rounds (--rounds of --steps steps, after a warm-up round);
figures are medians. Printed per side: ms per step, emb*, and emb* over the
hashing trick's (issue 43's target at 2^20 keys on a GPU: sok at most 0.5).

    python bench/hashed_bench.py [--vocab 1048576 --alpha 1.05 --batch 8192
        --slots 100 --nnz 10 --dim 16 --layers 7 --units 1024]

On a CPU use a smaller --batch (e.g. 512): the DemoModel's 8.2M keys per step
take seconds there. --trace SIDE (a part of a side's name, e.g. "sok")
then traces --trace_steps steps of that side with TensorFlow's profiler and
prints its GPU time per TensorFlow op and the device-to-host copies per
step (bench/host_syncs.py reads the trace).
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import sok_graph as sok  # noqa: E402
from sok_graph.data.hashed_keys import draw_ids, hashed  # noqa: E402


def key_batches(args, rng):
    out = []
    shape = (args.batch, args.slots, args.nnz)
    for _ in range(args.batches):
        out.append(hashed(draw_ids(rng, args.alpha, args.vocab, shape)))
    return out


class Dense:
    """The DemoModel's dense layers, the same on every side."""

    def __init__(self, args, width, seed):
        rng = np.random.default_rng(seed)
        sizes = [width] + [args.units] * args.layers + [1]
        self.weights = [tf.Variable(rng.normal(0, 1 / np.sqrt(a), (a, b)).astype(np.float32))
                        for a, b in zip(sizes[:-1], sizes[1:])]

    def loss(self, x, labels):
        for w in self.weights[:-1]:
            x = tf.nn.relu(tf.matmul(x, w))
        logits = tf.squeeze(tf.matmul(x, self.weights[-1]), 1)
        return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels,
                                                                      logits=logits))

    def update(self, grads, lr):
        return [w.assign_sub(lr * g) for w, g in zip(self.weights, grads)]


def make_steps(args, graph):
    """{side: (body, rows)}: body(keys, labels) builds one training step,
    returning (loss, the updates to run); rows() a tensor of the rows the
    side's table holds. graph: the sok side takes a tf.compat.v1.train
    optimizer (Keras 3's run only eagerly or in a tf.function)."""
    width = args.slots * args.nnz * args.dim
    lr = args.lr
    steps = {}

    # sok: a dynamic table, a row per key.
    table = sok.DynamicVariable(args.dim, initializer="uniform")
    sok_dense = Dense(args, width, 1)
    sok_opt = sok.OptimizerWrapper(tf.compat.v1.train.GradientDescentOptimizer(lr) if graph
                                   else tf.keras.optimizers.SGD(learning_rate=lr))

    def sok_step(keys, labels):
        with tf.GradientTape() as tape:
            rows = table.sparse_read(keys)
            loss = sok_dense.loss(tf.reshape(rows, [-1, width]), labels)
        grads = tape.gradient(loss, [table] + sok_dense.weights)
        return loss, [sok_opt.apply_gradients([(grads[0], table)])] + \
            sok_dense.update(grads[1:], lr)

    steps["sok DynamicVariable"] = (sok_step, lambda: table.size[0])

    # plain TF, the hashing trick: key mod vocab into a dense table.
    trick = tf.Variable(tf.random.uniform([args.vocab, args.dim], -0.05, 0.05, seed=2))
    trick_dense = Dense(args, width, 1)

    def trick_step(keys, labels):
        with tf.GradientTape() as tape:
            rows = tf.nn.embedding_lookup(trick, tf.math.floormod(keys, args.vocab))
            loss = trick_dense.loss(tf.reshape(rows, [-1, width]), labels)
        grads = tape.gradient(loss, [trick] + trick_dense.weights)
        return loss, [trick.scatter_sub(tf.IndexedSlices(lr * grads[0].values,
                                                         grads[0].indices))] + \
            trick_dense.update(grads[1:], lr)

    steps["TF hashing trick"] = (trick_step, lambda: tf.constant(args.vocab))

    # plain TF hash tables: lookup, gradient of the rows, insert back.
    tables = {
        "TF MutableHashTable": lambda: tf.lookup.experimental.MutableHashTable(
            tf.int64, tf.float32, default_value=tf.zeros([args.dim])),
        "TF DenseHashTable": lambda: tf.lookup.experimental.DenseHashTable(
            tf.int64, tf.float32, default_value=tf.zeros([args.dim]), empty_key=-1,
            deleted_key=-2),
    }
    for name, make in tables.items():
        try:
            hash_table = make()
        except (tf.errors.OpError, TypeError, ValueError) as e:
            print(f"{name}: skipped ({type(e).__name__}: {e})")
            continue
        dense = Dense(args, width, 1)

        def table_step(keys, labels, hash_table=hash_table, dense=dense):
            flat = tf.reshape(keys, [-1])
            distinct, position = tf.unique(flat, out_idx=tf.int64)
            rows = hash_table.lookup(distinct)
            with tf.GradientTape() as tape:
                tape.watch(rows)
                x = tf.reshape(tf.gather(rows, position), [-1, width])
                loss = dense.loss(x, labels)
            grads = tape.gradient(loss, [rows] + dense.weights)
            # The gather's gradient: IndexedSlices by position, summed per key.
            grad = tf.math.unsorted_segment_sum(grads[0].values, grads[0].indices,
                                                tf.shape(rows)[0])
            return loss, [hash_table.insert(distinct, rows - lr * grad)] + \
                dense.update(grads[1:], lr)

        steps[name] = (table_step, hash_table.size)

    # The dense part alone, on a fixed embedding tensor.
    fixed = tf.Variable(tf.random.uniform([args.batch, width], -0.05, 0.05))
    alone = Dense(args, width, 1)

    def dense_step(keys, labels):
        del keys
        with tf.GradientTape() as tape:
            loss = alone.loss(fixed, labels)
        grads = tape.gradient(loss, [fixed] + alone.weights)
        return loss + 0.0 * tf.reduce_sum(grads[0]), alone.update(grads[1:], lr)

    steps["dense part alone"] = (dense_step, lambda: tf.constant(0))
    return steps


def function_steps(args, keys, labels):
    """{side: (step(i), rows())}: each side's step as a tf.function on batch
    i's tensors (already on the device)."""
    built = {}
    for name, (body, rows) in make_steps(args, graph=False).items():
        fn = tf.function(lambda k, y, body=body: body(k, y)[0])
        built[name] = (lambda i, fn=fn: fn(keys[i % len(keys)], labels[i % len(keys)]),
                       lambda rows=rows: int(rows()))
    return built


def graph_steps(args, keys, labels):
    """{side: (step(i), rows())}: each side's step in one graph run by one
    tf.compat.v1.Session; the batches live in variables on the device and
    a step feeds only its batch's number."""
    graph = tf.Graph()
    with graph.as_default():
        keys_in = tf.compat.v1.placeholder(tf.int64, (len(keys),) + keys[0].shape)
        labels_in = tf.compat.v1.placeholder(tf.float32, (len(labels),) + labels[0].shape)
        all_keys = tf.Variable(keys_in, trainable=False)
        all_labels = tf.Variable(labels_in, trainable=False)
        index = tf.compat.v1.placeholder(tf.int32, [])
        batch_keys, batch_labels = tf.gather(all_keys, index), tf.gather(all_labels, index)
        ops = {name: (body(batch_keys, batch_labels), rows())
               for name, (body, rows) in make_steps(args, graph=True).items()}
        sess = tf.compat.v1.Session(graph=graph)
        sess.run(tf.compat.v1.global_variables_initializer(),
                 {keys_in: np.stack(keys), labels_in: np.stack(labels)})
    built = {}
    for name, ((loss, updates), rows) in ops.items():
        with graph.as_default():
            train = tf.group(*[u for u in updates if u is not None])
        built[name] = (
            lambda i, loss=loss, train=train: sess.run([loss, train], {index: i % len(keys)})[0],
            lambda rows=rows: int(sess.run(rows)))
    return built


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=1 << 20, help="distinct ids of the stream")
    p.add_argument("--alpha", type=float, default=1.05, help="Zipf exponent; 0: uniform")
    p.add_argument("--batch", type=int, default=8192)
    p.add_argument("--slots", type=int, default=100)
    p.add_argument("--nnz", type=int, default=10)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--layers", type=int, default=7)
    p.add_argument("--units", type=int, default=1024)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--batches", type=int, default=8, help="distinct batches, cycled")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trace", default=None, help="trace the sides whose name contains this")
    p.add_argument("--mode", choices=("function", "graph"), default="function",
                   help="tf.function steps, or one graph run by a tf.compat.v1.Session")
    p.add_argument("--skip", default="", help="comma-separated parts of names of sides not "
                   "to run (the hashing trick and the dense part always run)")
    p.add_argument("--trace_steps", type=int, default=3)
    args = p.parse_args()
    sok.init(comm_tool="none")
    rng = np.random.default_rng(args.seed)
    key_arrays = key_batches(args, rng)
    label_arrays = [rng.integers(0, 2, size=args.batch).astype(np.float32) for _ in key_arrays]
    distinct = np.mean([np.unique(b).size for b in key_arrays])
    device = "GPU" if tf.config.list_physical_devices("GPU") else "CPU"
    print(f"device {device}, TensorFlow {tf.__version__}; {args.batch} x {args.slots} x "
          f"{args.nnz} keys a step ({distinct:.0f} distinct), "
          f"{'Zipf(%.2f)' % args.alpha if args.alpha > 0 else 'uniform'} over {args.vocab} ids "
          f"hashed into 63 bits; dim {args.dim}; {args.layers} x {args.units} dense; "
          f"{'tf.compat.v1.Session' if args.mode == 'graph' else 'tf.function'}", flush=True)
    if args.mode == "graph":
        steps = graph_steps(args, key_arrays, label_arrays)
    else:
        steps = function_steps(args, [tf.constant(k) for k in key_arrays],
                               [tf.constant(y) for y in label_arrays])
    for part in filter(None, args.skip.split(",")):
        for name in [n for n in steps if part.lower() in n.lower()]:
            if name not in ("TF hashing trick", "dense part alone"):
                del steps[name]

    def run_round(step):
        start = time.perf_counter()
        for i in range(args.steps):
            loss = step(i)
        float(loss)  # waits for the last step
        return (time.perf_counter() - start) / args.steps

    for step, _ in steps.values():
        run_round(step)  # warm-up: traces, first inserts
    times = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, (step, _) in steps.items():
            times[name].append(run_round(step))
    median = {name: float(np.median(t)) for name, t in times.items()}
    dense = median["dense part alone"]
    trick = median["TF hashing trick"] - dense
    print(f"{'side':>22} {'ms/step':>9} {'emb* ms':>9} {'emb* / trick':>13} {'rows':>10}")
    for name, (_, rows) in steps.items():
        emb = median[name] - dense
        ratio = "" if name == "dense part alone" else f"{emb / trick:13.2f}"
        print(f"{name:>22} {median[name] * 1e3:9.2f} "
              f"{'' if name == 'dense part alone' else '%9.2f' % (emb * 1e3):>9} {ratio:>13} "
              f"{rows() or '':>10}")
    if args.trace:
        for name, (step, _) in steps.items():
            if args.trace.lower() in name.lower():
                trace(name, step, args.trace_steps)


def trace(name, step, count):
    """Prints a side's GPU time per TensorFlow op and per kernel and its
    device-to-host copies, per step, from a profiler trace of `count` steps."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import host_syncs

    host_syncs.print_traced_steps(name, step, count)


if __name__ == "__main__":
    main()
