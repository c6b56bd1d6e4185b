"""End-to-end training steps/s: sok embeddings vs plain TensorFlow embeddings.

Two models, each built twice in the same process — with sok_graph and with
plain TF (`tf.nn.embedding_lookup` / `tf.nn.embedding_lookup_sparse` on
tf.Variables) — sharing the dense part, the data and the optimizer class:

- dlrm: Criteo-shaped DLRM: 26 tables (rows x dim 16), ragged ids per table
  (hotness 1..5, combiner mean), 13 dense features, top MLP 512-256-1.
  sok side: the fused `sok.lookup_sparse` over 26 sok.Variables.
- demo: SOK's DemoModel: slot_num 100 x nnz_per_slot 10 keys, dim 16,
  7 dense layers (units --demo_units), sok side: `sok.All2AllDenseEmbedding`.

Both sides train with the same optimizer class (--optimizer adam|sgd):
Keras in tf.function, tf.compat.v1.train in graph mode (Keras 3 has no
graph mode); the sok side applies it to the tables through
`sok.OptimizerScope`, which updates only the batch's rows (Adam lazily),
while plain TF's Adam updates every row of a table with a sparse gradient —
that difference is part of what a user gets, so it is measured, not hidden.
The dense part is plain tf ops (tf.Variables + matmul) on both sides, so
Keras versions do not enter. Each step is also run in two parts:
- the embedding work alone (lookups, a trivial loss, gradients and the table
  update): the "emb" columns;
- the dense layers alone, on a fixed embedding tensor of the same shape held
  on the device (forward, loss, the gradients of the weights and of that
  embedding input, the dense optimizer): the "dense" column, the same code
  on both sides, measured on plain TF's. The input's gradient is the dense
  layers' backward work that a step training its embeddings always has (for
  the DemoModel the first layer's 8192x1024 by 1024x16000 matmul), so it is
  dense time, not embedding time. The step time over it is the ceiling a
  faster embedding can reach; the ceiling
  column infers the dense time instead as the whole step less the
  embedding-alone step, which also takes away the per-step costs both parts
  have (the call, the trivial loss and its gradient over the whole
  embedding output) and so overstates the ceiling;
- the dense layers on a bare embedding: a tensor of the embedding output's
  shape written from one trainable value (tf.fill), whose gradient reads
  the upstream gradient once (a sum). Less the dense part, that is the
  "bare*" column: the time any embedding must take that hands the dense
  layers its rows as one materialised tensor (write it, read its
  gradient), with no ids, no table and no update of rows. TF emb* / bare*
  bounds what TF/sok emb* can reach on that machine;
- (DemoModel) the step with its embedding as TensorFlow's gather by row
  number, whose gradient is sok's one-id dense gradient kernel, with the
  optimizer's dense update of the table's rows: a lookup with no hash table
  and no wait for the device, built from today's kernels. Less the dense
  part, that is the "gather*" column: what the DemoModel's embedding would
  cost if its forward waited for nothing (the hash table's find by key,
  without inserting, takes about as long as this gather on an H100).

    python bench/e2e_bench.py [--model dlrm|demo|both] [--mode function|graph|both]
                              [--graph_inputs device|feed] [--function_inputs resident|args]

Inputs are on the device before a step starts, in both modes: steps read
batches held in variables (--graph_inputs feed: through feed_dict each
step, whose host-to-device copy then counts as embedding time on both
sides — 9 ms of a DemoModel step on an H100; --function_inputs args: as
the tf.function's tensor arguments, whose handling per call then counts
too — 2-4 ms of a DLRM step on the 2-core VM and about 3 ms on the host
of an H100, for its 26 RaggedTensors). A cell printed "—" has no figure:
the model has no such step, or the difference is within the noise.
"""

import argparse
import os
import platform
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import sok_graph as sok  # noqa: E402
from sok_graph.ops import lookup as lookup_ops  # noqa: E402


# ----------------------------------------------------------------- data

def dlrm_batches(args, rng, n):
    out = []
    for _ in range(n):
        ragged = []
        for _ in range(26):
            lengths = rng.integers(1, 6, size=args.batch)
            splits = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
            # Zipf-skewed ids, as categorical features are.
            ids = np.minimum(rng.zipf(1.2, size=splits[-1]) - 1, args.rows - 1).astype(np.int64)
            ragged.append((ids, splits))
        dense = rng.normal(size=(args.batch, 13)).astype(np.float32)
        labels = rng.integers(0, 2, size=(args.batch, 1)).astype(np.float32)
        out.append((ragged, dense, labels))
    return out


def demo_batches(args, rng, n):
    out = []
    for _ in range(n):
        keys = rng.integers(0, args.demo_vocab, size=(args.demo_batch, 100, 10)).astype(np.int64)
        labels = rng.integers(0, 2, size=(args.demo_batch, 1)).astype(np.float32)
        out.append((keys, labels))
    return out


# ---------------------------------------------------------------- models

class MLP:
    """Dense layers as plain tf.Variables (ReLU between, none after the last)."""

    def __init__(self, sizes, seed):
        rng = np.random.default_rng(seed)
        self.weights = []
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            w = rng.normal(scale=np.sqrt(2.0 / a), size=(a, b)).astype(np.float32)
            self.weights += [tf.compat.v1.Variable(w, name=f"w{i}", use_resource=True),
                             tf.compat.v1.Variable(np.zeros(b, np.float32), name=f"b{i}",
                                                   use_resource=True)]

    def __call__(self, x):
        n = len(self.weights) // 2
        for i in range(n):
            x = tf.matmul(x, self.weights[2 * i]) + self.weights[2 * i + 1]
            if i < n - 1:
                x = tf.nn.relu(x)
        return x


def _bce(logits, labels):
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))


def make_optimizer(name, graph):
    lr = 0.01
    if graph:
        return (tf.compat.v1.train.AdamOptimizer(lr) if name == "adam"
                else tf.compat.v1.train.GradientDescentOptimizer(lr))
    return tf.keras.optimizers.Adam(lr) if name == "adam" else tf.keras.optimizers.SGD(lr)


class Variant:
    """One model on one side (sok or plain TF): tables, dense part, two
    optimizers (tables / dense), and the step functions."""

    def __init__(self, model, side, args, graph, part):
        self.model, self.side, self.args = model, side, args
        if side == "gather" and model != "demo":
            raise ValueError("the gather side is the DemoModel's")
        rng = np.random.default_rng(0)
        if part == "bare":
            # The bare embedding's one trainable value (see logits).
            self.tables = [tf.compat.v1.Variable(0.01, use_resource=True)]
        elif model == "dlrm":
            init = [rng.normal(0, 0.05, (args.rows, 16)).astype(np.float32) for _ in range(26)]
            if side == "sok":
                self.tables = [sok.Variable(t) for t in init]
            else:
                self.tables = [tf.compat.v1.Variable(t, use_resource=True) for t in init]
        else:
            if side == "sok":
                self.layer = sok.All2AllDenseEmbedding(args.demo_vocab, 16, 100, 10)
                self.tables = [self.layer.embedding_variable]
            else:
                init = rng.uniform(-0.05, 0.05, (args.demo_vocab, 16)).astype(np.float32)
                self.tables = [tf.compat.v1.Variable(init, use_resource=True)]
        self.mlp = MLP(_dense_sizes(model, args), seed=1)
        self.emb_opt = make_optimizer(args.optimizer, graph)
        self.dense_opt = make_optimizer(args.optimizer, graph)

    def embeddings(self, inputs):
        if self.model == "dlrm":
            ragged, _ = inputs
            if self.side == "sok":
                outs = sok.lookup_sparse(self.tables, ragged, combiners="mean")
            else:
                outs = [tf.nn.embedding_lookup_sparse(t, r.to_sparse(), None, combiner="mean")
                        for t, r in zip(self.tables, ragged)]
            return tf.concat(outs, 1)
        keys = inputs
        if self.side == "sok":
            rows = self.layer(keys)
        elif self.side == "gather":
            rows = _gathered_with_dense_grad(self.tables[0], keys)
        else:
            rows = tf.nn.embedding_lookup(self.tables[0], keys)
        return tf.reshape(rows, [-1, _embedding_width(self.model)])

    def logits(self, inputs, part):
        # The dense part alone takes a fixed embedding tensor in place of the
        # lookups' input (see fixed_inputs). The bare embedding writes a
        # tensor of that shape from its one trainable value, and its
        # gradient (Fill's: a sum over the whole upstream gradient) reads
        # the upstream gradient once: the memory traffic any embedding
        # must have that hands the dense layers its rows as one tensor,
        # with no ids to read and no table.
        if part in FIXED_INPUT_PARTS:
            emb = inputs[0] if self.model == "dlrm" else inputs
            if part == "bare":
                emb = tf.fill(tf.shape(emb), self.tables[0])
        else:
            emb = self.embeddings(inputs)
        if self.model == "dlrm":
            emb = tf.concat([emb, inputs[1]], 1)
        return self.mlp(emb)

    def _apply(self, grads, part):
        n = len(self.tables) if part != "dense" else 0
        emb_grads, dense_grads = grads[:n], grads[n:]
        ops = []
        if part != "dense":
            if self.side == "sok" and part != "bare":
                with sok.OptimizerScope(self.tables):
                    ops.append(self.emb_opt.apply_gradients(zip(emb_grads, self.tables)))
            else:
                ops.append(self.emb_opt.apply_gradients(zip(emb_grads, self.tables)))
        if part != "embedding":
            ops.append(self.dense_opt.apply_gradients(zip(dense_grads, self.mlp.weights)))
        return ops

    def loss(self, inputs, labels, part):
        """part: "whole" (the training step), "embedding" (the embedding
        work alone: lookups, gradients, update), "dense" (the dense layers
        alone, on a fixed embedding tensor) or "bare" (the dense layers on
        a bare embedding, see logits)."""
        if part == "embedding":
            return tf.reduce_mean(self.embeddings(inputs))
        return _bce(self.logits(inputs, part), labels)

    def variables(self, part):
        return (([] if part == "dense" else list(self.tables))
                + ([] if part == "embedding" else list(self.mlp.weights)))

    def fixed_embedding(self, inputs, part):
        """The dense part alone differentiates its loss by the fixed
        embedding tensor standing in for the lookups' output too: [it] for
        that part, [] for the others."""
        if part != "dense":
            return []
        return [inputs[0] if self.model == "dlrm" else inputs]

    def train(self, loss, inputs, part, gradients):
        """The update ops of a step and the tensor to fetch in place of the
        loss; gradients(loss, xs) is the caller's tape or tf.gradients,
        called once for all. The dense part alone fetches its fixed input's
        gradient with the loss, one element of it beside the loss in one
        small tensor: a gradient nothing reads is pruned from the graph
        (also when only a control dependency names it), and so would not
        be computed."""
        variables = self.variables(part)
        fixed = self.fixed_embedding(inputs, part)
        grads = gradients(loss, variables + fixed)
        ops = self._apply(grads[:len(variables)], part)
        if fixed:
            loss = tf.stack([loss, grads[-1][0, 0]])
        return ops, loss


def _gathered_with_dense_grad(table, keys):
    """Rows of the tf.Variable `table` at row numbers `keys` (tf.gather),
    differentiated by sok's one-id dense gradient kernel (what
    all2all_dense_embedding's gradient runs) into a dense [rows, dim]
    gradient of the table."""
    # Both as inputs: in graph mode custom_gradient looks up by name every
    # variable the function's ops read, and the keys may come from one
    # outside the global collections (resident_graph_step's).
    @tf.custom_gradient
    def rows(value, flat):
        def grad(dy):
            dy = tf.reshape(dy, [-1, value.shape[1]])
            return lookup_ops.one_id_sum_grad(value, flat, dy, "gather"), None

        return tf.gather(value, flat), grad

    return rows(tf.convert_to_tensor(table), tf.reshape(keys, [-1]))


def _embedding_width(model):
    """Columns of the embedding tensor the dense layers take."""
    return 26 * 16 if model == "dlrm" else 100 * 10 * 16


def _dense_sizes(model, args):
    """The dense layers' widths, their input first (DLRM's: the embeddings
    and the 13 dense features)."""
    if model == "dlrm":
        return [_embedding_width(model) + 13, 512, 256, 1]
    return [_embedding_width(model)] + [args.demo_units] * args.demo_layers + [1]


def fixed_inputs(model, batch):
    """The dense part's inputs for a batch: a fixed embedding tensor of the
    lookups' output shape in place of the ids (the same one for every batch:
    the values do not matter to the time), the rest as they are."""
    width = _embedding_width(model)
    rows = len(batch[-1])
    emb = _FIXED.get((rows, width))
    if emb is None:
        emb = np.random.default_rng(2).normal(0, 0.05, (rows, width)).astype(np.float32)
        _FIXED[(rows, width)] = emb
    if model == "dlrm":
        _, dense, labels = batch
        return (emb, dense), labels
    return emb, batch[-1]


_FIXED = {}
# Batches of data made per model; steps cycle through them.
NUM_BATCHES = 4
# The parts whose inputs are fixed_inputs: no ids.
FIXED_INPUT_PARTS = ("dense", "bare")


# ------------------------------------------------------------ measurement

def _inputs_as_tensors(model, batch, part):
    if part in FIXED_INPUT_PARTS:
        inputs, labels = fixed_inputs(model, batch)
        return tf.nest.map_structure(tf.constant, inputs), tf.constant(labels)
    if model == "dlrm":
        ragged, dense, labels = batch
        r = [tf.RaggedTensor.from_row_splits(tf.constant(i), tf.constant(s), validate=False)
             for i, s in ragged]
        return (r, tf.constant(dense)), tf.constant(labels)
    keys, labels = batch
    return tf.constant(keys), tf.constant(labels)


def function_step(model, side, args, batches, part):
    """A callable running training step i as a tf.function (compiled on first use)."""
    sok.init()
    v = Variant(model, side, args, False, part)

    @tf.function
    def step(inputs, labels):
        with tf.GradientTape() as tape:
            tape.watch(v.fixed_embedding(inputs, part))
            loss = v.loss(inputs, labels, part)
        return v.train(loss, inputs, part, tape.gradient)[1]

    data = [_inputs_as_tensors(model, b, part) for b in batches]
    if args.function_inputs == "args":
        return lambda i: step(*data[i % len(data)]).numpy()
    # Each batch held in variables, read inside a function of its own (one
    # trace per batch, made here): a step takes no tensor arguments. With
    # them, TensorFlow spends 2-4 ms per call on the DLRM's 26 RaggedTensor
    # arguments before any op runs (on the 2-core VM; a call with one
    # tensor argument costs 0.2-0.4 ms), time that would be counted as
    # embedding time on both sides.
    held = [[tf.Variable(t, trainable=False) for t in tf.nest.flatten(d, expand_composites=True)]
            for d in data]

    @tf.function
    def resident_step(k):
        read = [x.read_value() for x in held[k]]
        return step(*tf.nest.pack_sequence_as(data[k], read, expand_composites=True))

    for k in range(len(data)):
        resident_step.get_concrete_function(k)
    return lambda i: resident_step(i % len(data)).numpy()


def graph_step(model, side, args, batches, part):
    """A callable running training step i in its own graph and Session.
    The dense part alone (and the bare embedding) always takes its inputs
    from the device."""
    if args.graph_inputs == "device" or part in FIXED_INPUT_PARTS:
        return resident_graph_step(model, side, args, batches, part)
    graph = tf.Graph()
    with graph.as_default():
        init_op = sok.Init(global_batch_size=args.batch if model == "dlrm" else args.demo_batch)
        v = Variant(model, side, args, True, part)
        if model == "dlrm":
            ids = [(tf.compat.v1.placeholder(tf.int64, [None]),
                    tf.compat.v1.placeholder(tf.int64, [None])) for _ in range(26)]
            dense = tf.compat.v1.placeholder(tf.float32, [None, 13])
            inputs = ([tf.RaggedTensor.from_row_splits(i, s, validate=False) for i, s in ids],
                      dense)
        else:
            keys = tf.compat.v1.placeholder(tf.int64, [None, 100, 10])
            inputs = keys
        labels = tf.compat.v1.placeholder(tf.float32, [None, 1])
        ops, loss = v.train(v.loss(inputs, labels, part), inputs, part, tf.compat.v1.gradients)
        train = tf.group(*ops)
        sess = tf.compat.v1.Session(graph=graph)
        sess.run(init_op)
        sess.run(tf.compat.v1.global_variables_initializer())

    def feed(batch):
        if model == "dlrm":
            ragged, d, y = batch
            f = {dense: d, labels: y}
            for (pi, ps), (i, s) in zip(ids, ragged):
                f[pi], f[ps] = i, s
            return f
        k, y = batch
        return {keys: k, labels: y}

    feeds = [feed(b) for b in batches]
    return lambda i: sess.run([loss, train], feeds[i % len(feeds)])


def resident_graph_step(model, side, args, batches, part):
    """graph_step with every batch held in variables on the step's device
    (as the tf.function steps get their inputs: device tensors made once),
    one train op per batch sharing the model: a step feeds nothing, so
    copying its inputs from the host is not timed as part of it."""
    graph = tf.Graph()
    feeds = {}

    def resident(array):
        ph = tf.compat.v1.placeholder(tf.as_dtype(array.dtype), array.shape)
        # Outside the global collections: initialised here, from the feed.
        var = tf.compat.v1.Variable(ph, trainable=False, collections=[], use_resource=True)
        feeds[var.initializer] = {ph: array}
        return var.read_value()

    with graph.as_default():
        init_op = sok.Init(global_batch_size=args.batch if model == "dlrm" else args.demo_batch)
        v = Variant(model, side, args, True, part)
        fetches = []
        for batch in batches:
            if part in FIXED_INPUT_PARTS:
                fixed, y = fixed_inputs(model, batch)
                inputs = tf.nest.map_structure(resident, fixed)
            elif model == "dlrm":
                ragged, d, y = batch
                inputs = ([tf.RaggedTensor.from_row_splits(resident(i), resident(s),
                                                           validate=False)
                           for i, s in ragged], resident(d))
            else:
                k, y = batch
                inputs = resident(k)
            ops, loss = v.train(v.loss(inputs, resident(y), part), inputs, part,
                                tf.compat.v1.gradients)
            fetches.append([loss, tf.group(*ops)])
        sess = tf.compat.v1.Session(graph=graph)
        for op, feed in feeds.items():
            sess.run(op, feed)
        sess.run(init_op)
        sess.run(tf.compat.v1.global_variables_initializer())
    return lambda i: sess.run(fetches[i % len(fetches)])


def warmup_steps(requested):
    """At least one step per batch before timing: a tf.function that reads
    its batch from variables has a function per batch, and TensorFlow
    optimises a function's graph on its first run."""
    return max(requested, NUM_BATCHES)


def measure(steps, args):
    """Median seconds per step of each callable, run in turns (one step of
    each per round), so that load on the machine falls on all of them alike."""
    for i in range(warmup_steps(args.warmup)):
        for step in steps.values():
            step(i)
    times = {name: [] for name in steps}
    for i in range(args.steps):
        for name, step in steps.items():
            t0 = time.perf_counter()
            step(i)
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=["dlrm", "demo", "both"], default="both")
    p.add_argument("--mode", choices=["function", "graph", "both"], default="both")
    p.add_argument("--optimizer", choices=["adam", "sgd"], default="adam")
    p.add_argument("--batch", type=int, default=8192, help="DLRM batch")
    p.add_argument("--rows", type=int, default=100000, help="rows per DLRM table")
    p.add_argument("--demo_batch", type=int, default=8192)
    p.add_argument("--demo_vocab", type=int, default=8192)
    p.add_argument("--demo_units", type=int, default=1024)
    p.add_argument("--demo_layers", type=int, default=7)
    p.add_argument("--function_inputs", choices=["resident", "args"], default="resident",
                   help="tf.function: each batch held in variables that the step reads "
                        "(default), or passed as the step's tensor arguments, whose "
                        "per-call handling then counts as embedding time on both sides")
    p.add_argument("--graph_inputs", choices=["device", "feed"], default="device",
                   help="graph mode: batches held on the device, as in tf.function "
                        "(default), or fed through feed_dict each step (the host-to-device "
                        "copy of the inputs is then part of every step)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--plot", default=None, help="write a PNG of the step times here")
    args = p.parse_args()
    rng = np.random.default_rng(0)
    models = ["dlrm", "demo"] if args.model == "both" else [args.model]
    modes = ["function", "graph"] if args.mode == "both" else [args.mode]
    print(f"TensorFlow {tf.__version__}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs; optimizer {args.optimizer}; median of {args.steps} steps "
          f"after {warmup_steps(args.warmup)} warm-up steps")
    # ceiling: plain TF's step time over its dense time (its step without
    # the embedding work), the most that faster embeddings can gain. The
    # columns up to "of ceiling" infer the dense time (the whole step less
    # the embedding-alone step); the starred ones measure it (the dense
    # part alone): emb* = the whole step less the dense part. bare* is the
    # same for the bare embedding (Variant.logits): the least time an
    # embedding handing the dense layers one materialised tensor can take,
    # and TF emb* / bare* the most that TF/sok emb* can reach. gather*
    # (DemoModel): its embedding as a gather by row number with sok's
    # gradient kernel, no hash table and no wait (the module docstring).
    print(f"{'model':6} {'mode':9} {'sok steps/s':>12} {'plain TF steps/s':>17} {'ratio':>6} "
          f"{'sok emb share':>14} {'TF emb share':>13} {'sok emb ms':>11} {'TF emb ms':>10} "
          f"{'TF/sok emb':>11} {'ceiling':>8} {'of ceiling':>11} {'dense ms':>9} "
          f"{'sok emb* ms':>12} {'TF emb* ms':>11} {'TF/sok emb*':>12} {'ceiling*':>9} "
          f"{'of ceiling*':>12} {'bare* ms':>9} {'TF emb*/bare*':>14} {'gather* ms':>10} "
          f"{'TF emb*/gather*':>16}")
    rows = []
    for model in models:
        batches = (dlrm_batches if model == "dlrm" else demo_batches)(args, rng,
                                                                         NUM_BATCHES)
        for mode in modes:
            build = function_step if mode == "function" else graph_step
            steps = {(side, part): build(model, side, args, batches, part)
                     for side in ("sok", "tf") for part in ("whole", "embedding")}
            # The dense part is the same code on both sides.
            steps[("tf", "dense")] = build(model, "tf", args, batches, "dense")
            steps[("tf", "bare")] = build(model, "tf", args, batches, "bare")
            if model == "demo":
                steps[("gather", "whole")] = build(model, "gather", args, batches, "whole")
            t = measure(steps, args)
            full = {side: t[(side, "whole")] for side in ("sok", "tf")}
            emb = {side: t[(side, "embedding")] for side in ("sok", "tf")}
            dense = t[("tf", "dense")]
            # The embedding time of a side: its full step times its embedding share.
            emb_ms = {side: 1e3 * min(emb[side], full[side]) for side in ("sok", "tf")}
            # Below 2% of the step, plain TF's dense time is within the noise
            # of two medians: no ceiling is printed.
            dense_tf = full["tf"] - min(emb["tf"], full["tf"])
            ceiling = full["tf"] / dense_tf if dense_tf > 0.02 * full["tf"] else None
            ratio = full["tf"] / full["sok"]
            of_ceiling = ratio / ceiling if ceiling else None
            # From the dense part measured alone.
            marginal = {side: 1e3 * max(full[side] - dense, 0.0) for side in ("sok", "tf")}
            bare = 1e3 * max(t[("tf", "bare")] - dense, 0.0)
            # Within the noise of two medians (as the ceiling): no ratio.
            bare_ratio = marginal["tf"] / bare if bare > 0.02 * 1e3 * full["tf"] else None
            # The DemoModel's embedding without a hash table or a wait.
            gather = (1e3 * max(t[("gather", "whole")] - dense, 0.0)
                      if ("gather", "whole") in t else None)
            # A gather* of 0 (under the dense part's own noise) has no ratio.
            gather_ratio = marginal["tf"] / gather if gather else None
            ceiling_measured = (full["tf"] / dense if full["tf"] - dense > 0.02 * full["tf"]
                                else None)
            of_ceiling_measured = ratio / ceiling_measured if ceiling_measured else None
            print(f"{model:6} {mode:9} {1 / full['sok']:12.2f} {1 / full['tf']:17.2f} "
                  f"{ratio:5.2f}x {emb['sok'] / full['sok']:13.0%} "
                  f"{emb['tf'] / full['tf']:12.0%} {emb_ms['sok']:11.2f} {emb_ms['tf']:10.2f} "
                  f"{emb_ms['tf'] / max(emb_ms['sok'], 1e-9):10.2f}x "
                  f"{_cell(ceiling, 8, '.2f', 'x')} "
                  f"{_cell(of_ceiling, 11, '.0%')} {1e3 * dense:9.2f} "
                  f"{marginal['sok']:12.2f} "
                  f"{marginal['tf']:11.2f} {marginal['tf'] / max(marginal['sok'], 1e-9):11.2f}x "
                  f"{_cell(ceiling_measured, 9, '.2f', 'x')} "
                  f"{_cell(of_ceiling_measured, 12, '.0%')} "
                  f"{bare:9.2f} {_cell(bare_ratio, 14, '.2f', 'x')} "
                  f"{_cell(gather, 10, '.2f')} "
                  f"{_cell(gather_ratio, 16, '.2f', 'x')}", flush=True)
            rows.append((model, mode, full, emb))
    if args.plot:
        plot(rows, args.plot, f"TensorFlow {tf.__version__}, {os.cpu_count()} CPUs, batch "
                              f"{args.batch}, optimizer {args.optimizer}")


def _cell(value, width, spec, suffix=""):
    """A table cell right-aligned to width; "—" where the benchmark has no
    figure (no gather step for the model, or a difference within the
    noise of two medians)."""
    text = "—" if value is None else format(value, spec) + suffix
    return f"{text:>{width}}"


def plot(rows, path, title):
    """Step time per variant, split into the embedding work (lookups,
    gradients, table update) and the rest (dense layers), sok next to plain
    TF, with the speed-up over each pair."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2.6 + 2.2 * len(rows), 4))
    highest = 0.0
    for i, (model, mode, full, emb) in enumerate(rows):
        for j, side in enumerate(("sok", "tf")):
            x = 3 * i + j
            e, rest = emb[side] * 1e3, (full[side] - min(emb[side], full[side])) * 1e3
            ax.bar(x, e, color="tab:orange" if side == "sok" else "tab:gray",
                   label=None if i else f"{'sok' if side == 'sok' else 'plain TF'}: embedding")
            ax.bar(x, rest, bottom=e, color="tab:blue", alpha=0.5,
                   label=None if i or j else "dense layers and the rest")
        top = max(full.values()) * 1e3
        highest = max(highest, top)
        ax.text(3 * i + 0.5, top * 1.03, f"{full['tf'] / full['sok']:.2f}x", ha="center")
    ax.set_xticks([3 * i + 0.5 for i in range(len(rows))])
    ax.set_xticklabels([f"{model}\n{'tf.function' if mode == 'function' else 'graph'}"
                        for model, mode, _, _ in rows])
    ax.set_ylabel("ms per training step (left: sok, right: plain TF)")
    ax.set_title(title, fontsize=9)
    ax.set_ylim(0, highest * 1.45)  # room for the legend above the bars
    ax.legend(fontsize=8, loc="upper center", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
