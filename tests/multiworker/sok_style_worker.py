"""A SOK-style training script, one worker of tests/test_sok_compat_two_workers.py.

Written the way SOK's own multi-worker scripts are: ``hvd.init()``,
``sok.init()``, each worker takes its slice of the global batch by
``hvd.rank()``, the tables go through ``sok.lookup_sparse`` with per-id
weights, the loss is all-reduced with ``hvd.allreduce`` and fetched together
with the train op (``sess.run([loss, train_op])``), and nothing else orders
the step's reads and writes.

  --role sok        run under the launcher (python -m sok_graph.launch -np N);
                    writes <out>/<config>/rank<r>.npz: the per-step global
                    losses, this worker's rows of every table and, in graph
                    mode, every write of a table that does not wait for a
                    read of it in the step's graph
  --role reference  one process, plain TensorFlow only (no sok_graph import):
                    tf.Variables with the same starting rows,
                    tf.nn.safe_embedding_lookup_sparse on the whole global
                    batch; writes <out>/<opt>-<loss>-<exec>/reference.npz
  --exec graph      tf.compat.v1 Session graphs (v2 behaviour disabled on
                    TF 2.x), tf.compat.v1.train optimizers
  --exec function   TF2: the step in a tf.function, Keras optimizers
  --configs         comma-separated kind:opt:loss:input
      kind    dyn_loc / dyn_dist: sok.DynamicVariable, mode "localized:<t mod
              N>" or distributed; static_loc / static_dist: sok.Variable
              likewise; repl: plain tf.Variables every worker holds whole
              (data parallel, gradient summed with hvd.allreduce), which the
              fused lookup reads in place
      opt     sgd | adagrad (a wrapped native optimizer; Adagrad has slots)
      loss    logistic: a dense layer and sigmoid cross-entropy;
              linear: the sum of the embeddings (SOK's own tests), whose
              gradient needs no forward value
      input   sparse: SparseTensor ids and weights; ragged: RaggedTensors
              with a static batch size (graph mode: placeholders of fixed
              length), so shapes give the gradient no link to the forward

Every worker's loss is its share of the global mean (the sum over its
samples divided by the global batch) and the dense gradients are summed over
the workers: the exchange's backward already sums the sharded tables'
gradient rows over the workers (docs/multiworker.md), so the sum of the
shares is the single-process mean loss and every gradient is its gradient.
"""

import argparse
import os
import sys

import numpy as np

GLOBAL_BATCH = 16
ROWS = 48          # ids are in [0, ROWS); static tables have ROWS rows
ASSIGNED = 32      # dynamic tables start with keys [0, ASSIGNED) set to the
#                    reference rows; later keys are inserted by the lookup
#                    with the constant initializer NEW_ROW
NEW_ROW = 0.05
DIMS = (4, 4, 8)   # three tables per model
COMBINERS = ("sum", "mean", "sqrtn")
LR = {"sgd": 0.4, "adagrad": 0.3}
KINDS = ("dyn_loc", "dyn_dist", "static_loc", "static_dist", "repl")
OPTS = ("sgd", "adagrad")
LOSSES = ("logistic", "linear")
INPUTS = ("sparse", "ragged")

# Op types that change a table (its rows or slots) and those that only
# describe it; every other op that takes a table's handle reads its rows.
_WRITES = ("SokSparseApply", "SokDynamicSparseApply", "SokDynamicTableScatter",
           "SokDynamicTableImport", "SokDynamicTableRemove", "SokDynamicTableClear",
           "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp")
_WRITE_PREFIXES = ("ResourceApply", "ResourceSparseApply", "ResourceScatter")
_NOT_READS = ("VariableShape", "VarIsInitializedOp", "DestroyResourceOp",
              "SokDynamicTableStats", "SokDynamicTableIsInitialized")


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--role", choices=["sok", "reference"], required=True)
    p.add_argument("--exec", dest="exec_mode", choices=["graph", "function"], required=True)
    p.add_argument("--configs", required=True)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    args.configs = [tuple(c.split(":")) for c in args.configs.split(",")]
    for c in args.configs:
        if len(c) != 4 or c[0] not in KINDS or c[1] not in OPTS or c[2] not in LOSSES \
                or c[3] not in INPUTS:
            p.error(f"--configs: {':'.join(c)} is not kind:opt:loss:input with kind in {KINDS}, "
                    f"opt in {OPTS}, loss in {LOSSES}, input in {INPUTS}")
    return args


def config_name(config, exec_mode):
    return "-".join(config + (exec_mode,))


def reference_name(opt, loss, exec_mode):
    return f"{opt}-{loss}-{exec_mode}"


def initial_rows(t):
    """The starting rows of static table t, [ROWS, DIMS[t]]."""
    rows = np.random.default_rng(100 + t).uniform(-0.5, 0.5, (ROWS, DIMS[t]))
    return rows.astype(np.float32)


def dynamic_start(t):
    """What dynamic table t holds before training, as a [ROWS, dim] table:
    the assigned keys' rows, then the initializer's constant."""
    rows = initial_rows(t).copy()
    rows[ASSIGNED:] = NEW_ROW
    return rows


def global_batches(steps):
    """Per step: for each table (ids, lengths, weights) of the global batch,
    and labels. Skewed ids (a few repeat often, across the workers too),
    samples without ids too."""
    rng = np.random.default_rng(7)
    out = []
    for _ in range(steps):
        tables = []
        for _t in DIMS:
            lengths = rng.integers(0, 5, GLOBAL_BATCH)
            n = int(lengths.sum())
            ids = np.minimum(rng.zipf(1.4, n) - 1, ROWS - 1).astype(np.int64)
            weights = rng.uniform(0.25, 2.0, n).astype(np.float32)
            tables.append((ids, lengths, weights))
        labels = rng.integers(0, 2, GLOBAL_BATCH).astype(np.float32)
        out.append((tables, labels))
    return out


def slice_batch(batch, lo, hi):
    """Samples [lo, hi) of a global batch."""
    tables, labels = batch
    out = []
    for ids, lengths, weights in tables:
        starts = np.concatenate([[0], np.cumsum(lengths)])
        a, b = starts[lo], starts[hi]
        out.append((ids[a:b], lengths[lo:hi], weights[a:b]))
    return out, labels[lo:hi]


def sparse_parts(ids, lengths):
    """(indices [n, 2], dense_shape) of a SparseTensor [batch, max_len]
    holding each sample's ids in its row."""
    rows = np.repeat(np.arange(len(lengths)), lengths)
    starts = np.concatenate([[0], np.cumsum(lengths)])[:-1]
    cols = np.arange(len(ids)) - np.repeat(starts, lengths)
    width = max(int(lengths.max()) if len(lengths) else 0, 1)
    return np.stack([rows, cols], 1).astype(np.int64), np.array([len(lengths), width], np.int64)


def dense_start(in_dim):
    return np.linspace(-0.4, 0.4, in_dim, dtype=np.float32).reshape(in_dim, 1)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def main():
    args = parse()
    import tensorflow as tf

    if args.exec_mode == "graph":
        tf.compat.v1.disable_v2_behavior()  # a TF1 script: no eager anywhere
    else:
        tf.compat.v1.enable_eager_execution()  # TF 1.x starts in graph mode
    if args.role == "reference":
        for opt, loss in sorted({(c[1], c[2]) for c in args.configs}):
            run_reference(tf, args, opt, loss)
        return 0
    import horovod.tensorflow as hvd
    import sparse_operation_kit as sok

    hvd.init()
    sok.init()
    for config in args.configs:
        graph = tf.Graph() if args.exec_mode == "graph" else None
        with graph.as_default() if graph is not None else _null():
            run_sok(tf, hvd, sok, args, config)
    return 0


# ------------------------------------------------------- shared by both sides


def make_optimizer(tf, exec_mode, opt, reference):
    """A tf.compat.v1.train optimizer (graph) or a Keras one (function).
    sok.init() gives Keras 2 scripts the legacy optimizers where TensorFlow
    has OptimizerV2 ones (2.11 - 2.15); the reference takes the same."""
    lr = LR[opt]
    if exec_mode == "graph":
        v1 = tf.compat.v1.train
        return v1.GradientDescentOptimizer(lr) if opt == "sgd" else v1.AdagradOptimizer(lr)
    keras = tf.keras.optimizers
    if reference and _legacy_keras(tf):
        keras = keras.legacy
    return keras.SGD(lr) if opt == "sgd" else keras.Adagrad(lr)


def _legacy_keras(tf):
    parts = tf.__version__.split(".")
    version = (int(parts[0]), int(parts[1]))
    return (2, 11) <= version < (2, 16) and hasattr(tf.keras.optimizers, "legacy")


def loss_of(tf, loss, embs, w, labels):
    """This worker's share of the global mean loss."""
    if loss == "linear":
        return tf.add_n([tf.reduce_sum(e) for e in embs]) / GLOBAL_BATCH
    logits = tf.squeeze(tf.matmul(tf.concat(embs, 1), w), 1)
    per_sample = tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)
    return tf.reduce_sum(per_sample) / GLOBAL_BATCH


def step_inputs(part, form):
    """Per table the arrays the step takes: (indices, ids, weights,
    dense_shape) of SparseTensors, or (ids, lengths, weights) of
    RaggedTensors."""
    out = []
    for ids, lengths, weights in part:
        if form == "sparse":
            indices, shape = sparse_parts(ids, lengths)
            out.append((indices, ids, weights, shape))
        else:
            out.append((ids, lengths.astype(np.int64), weights))
    return out


def as_tensors(tf, inputs, form):
    """Per table (ids, weights) as SparseTensors or RaggedTensors."""
    out = []
    for item in inputs:
        if form == "sparse":
            indices, ids, weights, shape = item
            out.append((tf.SparseTensor(indices, ids, shape),
                        tf.SparseTensor(indices, weights, shape)))
        else:
            ids, lengths, weights = item
            out.append((tf.RaggedTensor.from_row_lengths(ids, lengths),
                        tf.RaggedTensor.from_row_lengths(weights, lengths)))
    return out


def placeholders(tf, form, batch):
    """Graph-mode inputs of step_inputs' layout; ragged ones have a static
    batch size."""
    out = []
    for _ in DIMS:
        if form == "sparse":
            out.append((tf.compat.v1.placeholder(tf.int64, [None, 2]),
                        tf.compat.v1.placeholder(tf.int64, [None]),
                        tf.compat.v1.placeholder(tf.float32, [None]),
                        tf.compat.v1.placeholder(tf.int64, [2])))
        else:
            out.append((tf.compat.v1.placeholder(tf.int64, [None]),
                        tf.compat.v1.placeholder(tf.int64, [batch]),
                        tf.compat.v1.placeholder(tf.float32, [None])))
    return out


def feed_dict(ph, labels_ph, part, labels, form):
    feed = {labels_ph: labels}
    for phs, arrays in zip(ph, step_inputs(part, form)):
        feed.update(zip(phs, arrays))
    return feed


def run_graph(tf, step, data, form, batch, fetch_after=None):
    """Per-step losses of step(inputs, labels) -> (loss, train_op) in a
    Session; fetch_after(sess) is run at the end and returned too."""
    ph = placeholders(tf, form, batch)
    labels_ph = tf.compat.v1.placeholder(tf.float32, [batch])
    loss, train_op = step(ph, labels_ph)
    after = fetch_after() if fetch_after is not None else None
    losses = []
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=2,
                                      inter_op_parallelism_threads=2)
    with tf.compat.v1.Session(config=config) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        if after is not None and after[0] is not None:
            sess.run(after[0])  # the starting rows
        for part, labels in data:
            value, _ = sess.run([loss, train_op], feed_dict(ph, labels_ph, part, labels, form))
            losses.append(float(value))
        results = sess.run(after[1]) if after is not None else None
    return losses, (loss, train_op), results


def run_function(tf, step, data, form):
    """Per-step losses of step's loss as a tf.function with one input
    signature (the updates run inside it: a tf.function runs every stateful
    op)."""
    if form == "sparse":
        table = (tf.TensorSpec([None, 2], tf.int64), tf.TensorSpec([None], tf.int64),
                 tf.TensorSpec([None], tf.float32), tf.TensorSpec([2], tf.int64))
    else:
        table = (tf.TensorSpec([None], tf.int64), tf.TensorSpec([None], tf.int64),
                 tf.TensorSpec([None], tf.float32))
    signature = [[table] * len(DIMS), tf.TensorSpec([None], tf.float32)]
    # No AutoGraph: the step has no Python control flow on tensors, and on
    # TF 1.x converting every function the lookup calls takes minutes.
    fn = tf.function(lambda inputs, labels: step(inputs, labels)[0],
                     input_signature=signature, autograph=False)
    losses = []
    for part, labels in data:
        inputs = [tuple(tf.constant(x) for x in t) for t in step_inputs(part, form)]
        losses.append(float(fn(inputs, tf.constant(labels))))
    return losses


# ------------------------------------------------------------ sok_graph side


def run_sok(tf, hvd, sok, args, config):
    kind, opt, loss_kind, form = config
    rank, world = hvd.rank(), hvd.size()
    per = GLOBAL_BATCH // world
    data = [slice_batch(b, rank * per, (rank + 1) * per) for b in global_batches(args.steps)]
    graph = args.exec_mode == "graph"
    tables = []
    for t, dim in enumerate(DIMS):
        mode = f"localized:{t % world}" if kind.endswith("_loc") else "distributed"
        if kind.startswith("dyn"):
            tables.append(sok.DynamicVariable(dimension=dim, mode=mode, initializer=NEW_ROW,
                                              name=f"emb{t}"))
        elif kind == "repl":
            tables.append(tf.compat.v1.Variable(initial_rows(t), name=f"emb{t}",
                                                use_resource=True))
        else:
            tables.append(sok.Variable(initial_rows(t), mode=mode, name=f"emb{t}"))
    w = tf.compat.v1.Variable(dense_start(sum(DIMS)), name="w", use_resource=True)
    dense = [] if loss_kind == "linear" else [w]
    emb_opt = sok.OptimizerWrapper(make_optimizer(tf, args.exec_mode, opt, False))
    dense_opt = make_optimizer(tf, args.exec_mode, opt, False)

    def step(inputs, labels):
        inputs = as_tensors(tf, inputs, form)
        with _null() if graph else tf.GradientTape() as tape:
            embs = sok.lookup_sparse(tables, [i for i, _ in inputs], [x for _, x in inputs],
                                     combiners=list(COMBINERS))
            loss = loss_of(tf, loss_kind, embs, w, labels)
        if graph:
            grads = tf.compat.v1.gradients(loss, tables + dense)
        else:
            grads = tape.gradient(loss, tables + dense)
        emb_grads = grads[:len(tables)]
        if kind == "repl":  # data parallel: every worker's gradient, summed
            emb_grads = [hvd.allreduce(tf.convert_to_tensor(g), op=hvd.Sum) for g in emb_grads]
        updates = [emb_opt.apply_gradients(zip(emb_grads, tables))]
        if dense:
            dense_grad = hvd.allreduce(grads[-1], op=hvd.Sum)
            updates.append(dense_opt.apply_gradients([(dense_grad, w)]))
        total = hvd.allreduce(loss, op=hvd.Sum)
        return total, (tf.group(*[u for u in updates if u is not None]) if graph else None)

    # Keys below ASSIGNED start with the reference's rows, each on its owner.
    assign_keys = np.arange(ASSIGNED, dtype=np.int64)
    owned = []
    if kind.startswith("dyn"):
        for t, table in enumerate(tables):
            mine = owners(kind, t, assign_keys, world) == rank
            owned.append((table, assign_keys[mine], initial_rows(t)[:ASSIGNED][mine]))

    unordered = []
    if graph:
        def assigns_and_exports():
            assigns = [sok.assign(table, keys, rows) for table, keys, rows in owned]
            return (assigns or None), [export(tf, sok, kind, table, rank) for table in tables]

        losses, fetches, exported = run_graph(tf, step, data, form, per, assigns_and_exports)
        unordered = unordered_writes(tables, fetches)
    else:
        for table, keys, rows in owned:
            sok.assign(table, keys, rows)
        losses = run_function(tf, step, data, form)
        exported = [tuple(np.asarray(x) for x in export(tf, sok, kind, table, rank))
                    for table in tables]

    out = os.path.join(args.out, config_name(config, args.exec_mode))
    os.makedirs(out, exist_ok=True)
    result = {"losses": np.array(losses), "unordered": np.array(unordered, dtype=str)}
    for t, (keys, rows) in enumerate(exported):
        result[f"keys{t}"], result[f"rows{t}"] = np.asarray(keys), np.asarray(rows)
    np.savez(os.path.join(out, f"rank{rank}.npz"), **result)
    print(f"rank {rank} {config_name(config, args.exec_mode)}: losses {losses[:3]} ...; "
          f"unordered writes: {unordered}", flush=True)


def export(tf, sok, kind, table, rank):
    """(global row ids or keys, rows) this worker holds; a replicated table
    is held whole by every worker, so only the first reports it."""
    if kind != "repl":
        return sok.export(table)
    value = tf.convert_to_tensor(table)
    if rank != 0:
        value = value[:0]
    return tf.range(tf.shape(value, out_type=tf.int64)[0]), value


def owners(kind, t, keys, world):
    """numpy: the worker that holds each key of table t (SOK's placement)."""
    if kind.endswith("_loc"):
        return np.full(keys.shape, t % world)
    return np.mod(keys, world)


def unordered_writes(tables, fetches):
    """Every op of the step (what `fetches` run) that writes a table without
    waiting for each op of the step that reads that table's rows, as
    "table: write <- read" strings. In a TF1 graph only data and control
    edges order ops: a write that does not wait for a read may run first,
    and the read then sees this step's update."""
    fetched = [getattr(f, "op", f) for f in fetches]
    step_ops = _ancestors(fetched) | set(fetched)
    problems = []
    for table in tables:
        users = [op for op in _consumers(table.handle) if op in step_ops]
        writes = [op for op in users if _writes(op)]
        reads = [op for op in users if not _writes(op) and op.type not in _NOT_READS]
        for write in writes:
            before = _ancestors([write])
            problems += [f"{table.name}: {write.type} {write.name} <- {read.type} {read.name}"
                         for read in reads if read not in before]
    return problems


def _writes(op):
    return op.type in _WRITES or op.type.startswith(_WRITE_PREFIXES)


def _consumers(tensor):
    """The ops that take `tensor`, through identities."""
    out = []
    for op in tensor.consumers():
        if op.type == "Identity":
            out += _consumers(op.outputs[0])
        else:
            out.append(op)
    return out


def _ancestors(ops):
    seen, stack = set(), list(ops)
    while stack:
        op = stack.pop()
        for before in [x.op for x in op.inputs] + list(op.control_inputs):
            if before not in seen:
                seen.add(before)
                stack.append(before)
    return seen


# ------------------------------------------------------ plain TensorFlow side


def run_reference(tf, args, opt, loss_kind):
    """The whole global batch in one process, plain TensorFlow: what every
    configuration with this optimizer and loss must reproduce. Static (and
    replicated) tables start with initial_rows, dynamic ones with
    dynamic_start: both runs are written, with the ids each table has
    seen."""
    data = global_batches(args.steps)
    results = {}
    for start_name, start in (("static", initial_rows), ("dynamic", dynamic_start)):
        graph = tf.Graph() if args.exec_mode == "graph" else None
        with graph.as_default() if graph is not None else _null():
            losses, rows = _reference_run(tf, args, opt, loss_kind, data, start)
        results[f"{start_name}_losses"] = np.array(losses)
        for t, r in enumerate(rows):
            results[f"{start_name}_rows{t}"] = r
    for t in range(len(DIMS)):
        seen = np.zeros(ROWS, bool)
        for tables, _ in data:
            seen[tables[t][0]] = True
        results[f"seen{t}"] = seen
    out = os.path.join(args.out, reference_name(opt, loss_kind, args.exec_mode))
    os.makedirs(out, exist_ok=True)
    np.savez(os.path.join(out, "reference.npz"), **results)


def _reference_run(tf, args, opt, loss_kind, data, start):
    graph = args.exec_mode == "graph"
    tables = [tf.compat.v1.Variable(start(t), name=f"ref{t}", use_resource=True)
              for t in range(len(DIMS))]
    w = tf.compat.v1.Variable(dense_start(sum(DIMS)), name="w", use_resource=True)
    variables = tables + ([] if loss_kind == "linear" else [w])
    optimizer = make_optimizer(tf, args.exec_mode, opt, True)

    def step(inputs, labels):
        inputs = as_tensors(tf, inputs, "sparse")
        with _null() if graph else tf.GradientTape() as tape:
            # The safe form keeps samples without ids (zero rows), as
            # sok.lookup_sparse does; the plain one drops trailing ones.
            embs = [tf.nn.safe_embedding_lookup_sparse(table, ids, weights, combiner=c)
                    for table, (ids, weights), c in zip(tables, inputs, COMBINERS)]
            loss = loss_of(tf, loss_kind, embs, w, labels)
        if not graph:
            grads = tape.gradient(loss, variables)
            return loss, optimizer.apply_gradients(zip(grads, variables))
        grads = tf.compat.v1.gradients(loss, variables)
        # TensorFlow's own gather gradient does not wait for the gather
        # either: the reference orders its update after the loss itself.
        with tf.control_dependencies([loss]):
            return loss, optimizer.apply_gradients(zip(grads, variables))

    if graph:
        losses, _, rows = run_graph(tf, step, data, "sparse", GLOBAL_BATCH,
                                    lambda: (None, tables))
        return losses, rows
    losses = run_function(tf, step, data, "sparse")
    return losses, [t.numpy() for t in tables]


if __name__ == "__main__":
    sys.exit(main())
