"""The main job: a DLRM-style click model on MovieLens-100k with sok_graph.

Every categorical feature (user, item, age, gender, occupation, zip prefix,
release year, and the item's genres as a multi-hot list) gets a sok
embedding table — user and item in dynamic tables keyed by id, the small
vocabularies in static ones — looked up by one fused sok.lookup_sparse.
Pairwise dot products of the embeddings (DLRM's interaction) and the
embeddings themselves feed an MLP that predicts rating >= 4.

A random 20% of the ratings is the test set; 10% of the rest is held out for
validation and the model trains on the remaining 72%, on CPU. After every
epoch the job prints validation and test AUC; it keeps the epoch with the best
validation AUC (its tables through sok.dump, its dense weights in memory) and
stops once `--patience` epochs in a row did not beat it (`--epochs` is the
most it trains). At the end it restores that epoch's model, scores the test
set with it next to a popularity baseline (the item's share of positive
ratings in training), exports it as a servable SavedModel (no sok_graph op
in it: sok.export_for_serving), prints one prediction of the loaded
SavedModel next to the training model's, and writes a loss/AUC plot that
marks the kept epoch.

    python examples_tf2/movielens_dlrm.py [--mode tf2|tf1] [--epochs 5] [--patience 2] [--out DIR]
    python -m sok_graph.launch -np 2 examples_tf2/movielens_dlrm.py ...   # 2 workers

Under the launcher (with Horovod installed) the tables are sharded over the
workers, each worker trains on its slice of every global batch (the dense
gradients are summed over workers, the tables' gradients arrive summed
through the exchange), and every worker evaluates the whole validation and
test sets, so the numbers match a single-process run up to float rounding.
Worker 0's validation AUC decides which epoch is kept and when to stop, so
every worker takes the same (collective) steps.
"""

import argparse
import contextlib
import os
import time

import numpy as np
import tensorflow as tf

import sok_graph as sok
from sok_graph.data import flags, metrics, movielens

DIM = 16
DYNAMIC = ("user", "item")  # tables keyed by arbitrary ids
FEATURES = movielens.CATEGORICAL + movielens.MULTI_HOT
COMBINERS = ["sum"] * len(movielens.CATEGORICAL) + ["mean"]
TEST_FRACTION = 0.2  # of all ratings
VALIDATION_FRACTION = 0.1  # of the ratings left for training


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=["tf2", "tf1"], default="tf2",
                   help="tf2: tf.function; tf1: graph mode with a tf.compat.v1.Session")
    p.add_argument("--epochs", type=flags.int_at_least(1), default=5,
                   help="the most epochs to train")
    p.add_argument("--patience", type=flags.int_at_least(0), default=2,
                   help="stop after this many epochs in a row without a better validation "
                        "AUC than the kept epoch's")
    p.add_argument("--batch", type=flags.int_at_least(1), default=1024)
    p.add_argument("--lr", type=flags.positive_number, default=0.005)
    p.add_argument("--out", type=flags.writable_directory, default="movielens_out",
                   help="where tables and the plot go")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p.parse_args()


def prepare(out_dir):
    """Train/validation/test splits, via a Parquet file of all samples. The
    validation ratings come out of the training part: the test set stays
    untouched by the choice of epoch."""
    path = os.path.join(out_dir, "movielens100k.parquet")
    samples = None
    if os.path.exists(path):
        try:
            samples = movielens.read_parquet(path)
        except Exception as e:  # noqa: BLE001 (a cache: made again)
            # A cache another program damaged (it is written whole,
            # sok_graph/data/files.py): every later run failed reading it.
            print(f"{path} cannot be read ({type(e).__name__}: {e}); writing it again")
    if samples is None:
        samples, _ = movielens.load_samples()
        movielens.write_parquet(samples, path)
        samples = movielens.read_parquet(path)
    sizes = {name: int(samples[name].max()) + 1 for name in movielens.CATEGORICAL}
    sizes["genres"] = int(samples["genres_values"].max()) + 1
    train, test = movielens.split(samples, test_fraction=TEST_FRACTION, seed=0)
    train, val = movielens.split(train, test_fraction=VALIDATION_FRACTION, seed=1)
    return train, val, test, sizes


def batches(data, batch, shuffle_seed=None, rank=0, world=1):
    """(values per feature, row_splits per feature, labels) numpy batches;
    with several workers, this worker's slice of each global batch."""
    n = len(data["label"])
    order = np.arange(n) if shuffle_seed is None else np.random.default_rng(shuffle_seed).permutation(n)
    for start in range(0, n, batch):
        rows = order[start:start + batch]
        part = movielens.take(data, np.array_split(rows, world)[rank])
        m = len(part["label"])
        ones = np.arange(m + 1, dtype=np.int64)
        values = [part[name] for name in movielens.CATEGORICAL] + [part["genres_values"]]
        splits = [ones] * len(movielens.CATEGORICAL) + [part["genres_splits"]]
        yield values, splits, part["label"]


class Model:
    """Embedding tables + DLRM interaction + MLP, built from plain variables
    so the same code runs eagerly, in tf.function and in a TF1 graph."""

    def __init__(self, sizes, seed=0):
        rng = np.random.default_rng(seed)
        self.tables = []
        for name in FEATURES:
            if name in DYNAMIC:
                self.tables.append(sok.DynamicVariable(DIM, initializer="normal", seed=seed,
                                                       name=name))
            else:
                init = rng.normal(0, 0.05, (sizes[name], DIM)).astype(np.float32)
                self.tables.append(sok.Variable(init, name=name))
        n = len(FEATURES)
        width = n * DIM + n * (n - 1) // 2
        self.dense = []
        for i, (fan_in, fan_out) in enumerate([(width, 64), (64, 32), (32, 1)]):
            w = rng.normal(0, np.sqrt(2.0 / fan_in), (fan_in, fan_out)).astype(np.float32)
            self.dense += [tf.Variable(w, name=f"mlp{i}/w"),
                           tf.Variable(np.zeros(fan_out, np.float32), name=f"mlp{i}/b")]

    @property
    def variables(self):
        return self.tables + self.dense

    def logits(self, values, splits):
        ids = [tf.RaggedTensor.from_row_splits(v, s, validate=False)
               for v, s in zip(values, splits)]
        emb = tf.stack(sok.lookup_sparse(self.tables, ids, combiners=COMBINERS), axis=1)
        dots = tf.matmul(emb, emb, transpose_b=True)  # [batch, n, n]
        n = len(FEATURES)
        upper = np.array([[i, j] for i in range(n) for j in range(i + 1, n)])
        pairs = tf.gather_nd(tf.transpose(dots, [1, 2, 0]), upper)  # [pairs, batch]
        x = tf.concat([tf.reshape(emb, [-1, n * DIM]), tf.transpose(pairs)], axis=1)
        for i in range(0, len(self.dense), 2):
            x = tf.matmul(x, self.dense[i]) + self.dense[i + 1]
            if i + 2 < len(self.dense):
                x = tf.nn.relu(x)
        return tf.squeeze(x, 1)


def loss_of(logits, labels, global_batch):
    """This worker's share of the global batch's mean loss (summed over
    workers, it is the mean)."""
    return tf.reduce_sum(tf.nn.sigmoid_cross_entropy_with_logits(
        labels=labels, logits=logits)) / tf.cast(global_batch, tf.float32)


def sum_dense_gradients(grads, model):
    """Dense (data-parallel) gradients summed over workers; the tables'
    gradients already are."""
    comm = sok.context.communicator()
    n = len(model.tables)
    return list(grads[:n]) + [comm.allreduce(tf.convert_to_tensor(g)) for g in grads[n:]]


def popularity_auc(train, test):
    """AUC of scoring a rating by its item's (smoothed) share of positive
    ratings in training: what a model must beat to have learned anything
    beyond item popularity."""
    n_items = int(max(train["item"].max(), test["item"].max())) + 1
    pos = np.bincount(train["item"], weights=train["label"], minlength=n_items)
    cnt = np.bincount(train["item"], minlength=n_items)
    prior = train["label"].mean()
    score = (pos + 5 * prior) / (cnt + 5)
    return metrics.auc(test["label"], score[test["item"]])


def progress(total, quiet, desc):
    if quiet:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="step", leave=False)


def train_tf2(model, data, args):
    opt = sok.OptimizerWrapper(tf.compat.v1.train.AdamOptimizer(args.lr))
    spec = ([tf.TensorSpec([None], tf.int64)] * len(FEATURES),) * 2
    comm = sok.context.communicator()

    @tf.function(input_signature=spec + (tf.TensorSpec([None], tf.float32),
                                         tf.TensorSpec([], tf.int64)))
    def step(values, splits, labels, global_batch):
        with tf.GradientTape() as tape:
            loss = loss_of(model.logits(values, splits), labels, global_batch)
        grads = sum_dense_gradients(tape.gradient(loss, model.variables), model)
        opt.apply_gradients(zip(grads, model.variables))
        return comm.allreduce(loss)

    predict = tf.function(lambda v, s: tf.sigmoid(model.logits(v, s)), input_signature=spec)
    run_predict = lambda v, s: predict(v, s).numpy()  # noqa: E731

    def of_rank0(value):
        return float(comm.broadcast(tf.constant(value, tf.float64), 0, name="validation_auc"))

    best = BestEpoch(args.tables, model.tables, opt,
                     get_dense=lambda: [v.numpy() for v in model.dense],
                     set_dense=lambda values: [v.assign(x) for v, x in zip(model.dense, values)])
    history = _loop(lambda v, s, y, g: float(step(v, s, y, g)), run_predict, of_rank0, best,
                    data, args)
    return history, run_predict


def train_tf1(model_args, data, args):
    graph = tf.Graph()
    with graph.as_default():
        model = Model(*model_args)
        values = [tf.compat.v1.placeholder(tf.int64, [None]) for _ in FEATURES]
        splits = [tf.compat.v1.placeholder(tf.int64, [None]) for _ in FEATURES]
        labels = tf.compat.v1.placeholder(tf.float32, [None])
        global_batch = tf.compat.v1.placeholder(tf.int64, [])
        logits = model.logits(values, splits)
        loss = loss_of(logits, labels, global_batch)
        grads = tf.gradients(loss, [v.handle if isinstance(v, sok.DynamicVariable) else v
                                    for v in model.variables])
        opt = sok.OptimizerWrapper(tf.compat.v1.train.AdamOptimizer(args.lr))
        train_op = opt.apply_gradients(zip(sum_dense_gradients(grads, model), model.variables))
        comm = sok.context.communicator()
        total_loss = comm.allreduce(loss)
        probs = tf.sigmoid(logits)
        # Restoring the kept dense weights: fed values, assigned in one run.
        dense_in = [tf.compat.v1.placeholder(v.dtype.base_dtype, v.shape) for v in model.dense]
        assign_dense = tf.group(*[v.assign(x) for v, x in zip(model.dense, dense_in)])
        auc_in = tf.compat.v1.placeholder(tf.float64, [])
        auc_of_rank0 = comm.broadcast(auc_in, 0, name="validation_auc")
        init = tf.compat.v1.global_variables_initializer()
    sess = tf.compat.v1.Session(graph=graph)
    sess.run(init)

    def feed(v, s, y=None, g=None):
        f = dict(zip(values, v))
        f.update(zip(splits, s))
        if y is not None:
            f[labels], f[global_batch] = y, g
        return f

    predict = lambda v, s: sess.run(probs, feed(v, s))  # noqa: E731
    best = BestEpoch(args.tables, model.tables, opt,
                     get_dense=lambda: sess.run(model.dense),
                     set_dense=lambda xs: sess.run(assign_dense, dict(zip(dense_in, xs))),
                     session=sess)
    history = _loop(lambda v, s, y, g: sess.run([train_op, total_loss], feed(v, s, y, g))[1],
                    predict, lambda x: float(sess.run(auc_of_rank0, {auc_in: x})), best,
                    data, args)
    return history, sess, predict


class BestEpoch:
    """The model of the epoch with the best validation AUC so far: its tables
    in a sok.dump at `path` (with several workers, sok.dump gathers every
    worker's rows and sok.load gives each worker back the rows it owns), its
    dense weights -- the same on every worker -- as numpy arrays in each
    worker. The dump carries that epoch's optimizer slots too, so it is a
    consistent checkpoint to resume from."""

    def __init__(self, path, tables, optimizer, get_dense, set_dense, session=None):
        self.path, self.tables, self.optimizer = path, tables, optimizer
        self.get_dense, self.set_dense = get_dense, set_dense
        # Graph mode: sok.dump and sok.load run in the default Session.
        self.session = session
        self.dense = None

    def _in_session(self):
        return self.session.as_default() if self.session is not None \
            else contextlib.nullcontext()

    def keep(self):
        with self._in_session():
            sok.dump(self.path, self.tables, self.optimizer)
        self.dense = self.get_dense()

    def restore(self):
        # Tables only: training is over, the optimizer's state is not needed.
        with self._in_session():
            sok.load(self.path, self.tables)
        self.set_dense(self.dense)


def score(predict, data):
    """AUC of the model's predictions on a whole split. Every worker scores
    all of it (lookups are collective)."""
    scores = np.concatenate([predict(v, s) for v, s, _ in batches(data, 4096)])
    return metrics.auc(data["label"], scores)


def _loop(train_step, predict, of_rank0, best, data, args):
    """Trains up to args.epochs epochs; keeps the epoch with the best
    validation AUC, stops args.patience epochs after it unless a later one
    beat it, and restores it. `of_rank0` maps a number to worker 0's value
    of it, so every worker keeps and stops at the same epochs (sok.dump and
    the lookups are collective)."""
    train, val, test = data
    world, rank = sok.context.world()
    n = len(train["label"])
    steps_per_epoch = -(-n // args.batch)
    history = {"loss": [], "val_auc": [], "auc": [], "best_epoch": None}
    for epoch in range(1, args.epochs + 1):
        bar = progress(steps_per_epoch, args.quiet or rank > 0,
                       f"epoch {epoch}/{args.epochs}")
        for k, (values, splits, labels) in enumerate(
                batches(train, args.batch, shuffle_seed=epoch - 1, rank=rank, world=world)):
            global_batch = min(args.batch, n - k * args.batch)
            history["loss"].append(train_step(values, splits, labels, global_batch))
            if bar is not None:
                bar.set_postfix(loss=f"{np.mean(history['loss'][-20:]):.4f}")
                bar.update(1)
        if bar is not None:
            bar.close()
        val_auc = of_rank0(score(predict, val))
        history["val_auc"].append(val_auc)
        history["auc"].append(score(predict, test))
        print(f"epoch {epoch}: train loss {np.mean(history['loss'][-steps_per_epoch:]):.4f}"
              f"  validation AUC {val_auc:.6f}  test AUC {history['auc'][-1]:.6f}", flush=True)
        kept = history["best_epoch"]
        if kept is None or val_auc > history["val_auc"][kept - 1]:
            history["best_epoch"] = epoch
            best.keep()
        elif epoch - kept >= args.patience and epoch < args.epochs:
            waited = epoch - kept
            print(f"early stop after epoch {epoch}: {waited} epoch{'s' * (waited != 1)} "
                  f"without a better validation AUC than epoch {kept}'s", flush=True)
            break
    history["steps_per_epoch"] = steps_per_epoch
    # What the job reports, exports and plots from here on is the kept epoch's model.
    best.restore()
    return history


def serving_inputs(values, splits):
    """The SavedModel's inputs: each feature's ragged ids as two dense
    tensors (values, row_splits), which TF Serving can feed."""
    out = {}
    for name, v, s in zip(FEATURES, values, splits):
        out[f"{name}_values"], out[f"{name}_splits"] = v, s
    return out


def serving_signature():
    return {f"{name}_{part}": tf.TensorSpec([None], tf.int64, name=f"{name}_{part}")
            for name in FEATURES for part in ("values", "splits")}


def _split_inputs(inputs):
    return ([inputs[f"{name}_values"] for name in FEATURES],
            [inputs[f"{name}_splits"] for name in FEATURES])


def export_tf2(model, predict, export_dir, sample):
    """Exports the model for serving; returns (served, trained) predictions
    of `sample` (rank 0; None elsewhere)."""
    trained = predict(*sample)

    def serve(inputs):
        return {"probability": tf.sigmoid(model.logits(*_split_inputs(inputs)))}

    written = sok.export_for_serving(serve, export_dir, [serving_signature()])
    if written is None:
        return None
    loaded = tf.saved_model.load(export_dir)
    feed = {k: tf.constant(v) for k, v in serving_inputs(*sample).items()}
    served = loaded.signatures["serving_default"](**feed)["probability"].numpy()
    return served, trained


def export_tf1(model_args, sess, predict, export_dir, sample):
    """The same from the TF1 session: the serving graph is built again."""
    trained = predict(*sample)

    def build():
        inputs = {k: tf.compat.v1.placeholder(tf.int64, [None], name=k)
                  for k in serving_signature()}
        model = Model(*model_args)
        return inputs, {"probability": tf.sigmoid(model.logits(*_split_inputs(inputs)))}

    if sok.export_for_serving(build, export_dir, session=sess) is None:
        return None
    with tf.Graph().as_default() as g, tf.compat.v1.Session(graph=g) as serving_sess:
        meta = tf.compat.v1.saved_model.load(serving_sess, [tf.saved_model.SERVING], export_dir)
        sig = meta.signature_def["serving_default"]
        feed = {g.get_tensor_by_name(sig.inputs[k].name): v
                for k, v in serving_inputs(*sample).items()}
        served = serving_sess.run(g.get_tensor_by_name(sig.outputs["probability"].name), feed)
    return served, trained


def plot(history, path, baseline):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kept = history["best_epoch"]
    epochs = range(1, len(history["auc"]) + 1)
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(history["loss"], lw=0.8)
    # The kept model is the one at the end of its epoch.
    a.axvline(kept * history["steps_per_epoch"] - 1, color="tab:red", ls=":",
              label=f"end of the kept epoch ({kept})")
    a.set(title="training loss", xlabel="step", ylabel="log loss")
    a.legend()
    b.plot(epochs, history["val_auc"], marker="o", label="validation")
    b.plot(epochs, history["auc"], marker="s", label="test")
    b.axhline(baseline, color="gray", ls="--", label="popularity baseline (test)")
    b.axvline(kept, color="tab:red", ls=":", label=f"kept: epoch {kept} (best validation)")
    b.plot([kept], [history["val_auc"][kept - 1]], marker="*", ms=14, color="tab:red", ls="")
    b.set(title="sok_graph DLRM: AUC per epoch", xlabel="epoch", ylabel="AUC")
    b.set_xticks(list(epochs))
    b.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def init_workers():
    """Horovod when the launcher started several workers; sok.init() then
    uses it. Returns this worker's rank."""
    if int(os.environ.get("SOK_GRAPH_WORLD_SIZE", "1")) > 1:
        import horovod.tensorflow as hvd

        hvd.init()
        return hvd.rank()
    return 0


def main():
    args = parse_args()
    rank = init_workers()
    # The kept epoch's tables: worker 0 writes them, every worker reads them back.
    args.tables = os.path.join(args.out, "tables")
    if rank > 0:
        args.out = os.path.join(args.out, f"rank{rank}")  # rank 0 writes the results
    os.makedirs(args.out, exist_ok=True)
    start = time.time()
    train, val, test, sizes = prepare(args.out)
    print(f"MovieLens-100k: {len(train['label'])} train / {len(val['label'])} validation / "
          f"{len(test['label'])} test ratings, "
          f"{sum(sizes.values())} ids in {len(FEATURES)} features; mode {args.mode}; "
          f"worker {rank} of {os.environ.get('SOK_GRAPH_WORLD_SIZE', '1')}")
    baseline = popularity_auc(train, test)
    export_dir = os.path.join(args.out, "serving", str(int(time.time())))
    sample = next(batches(test, 8))[:2]  # the first test ratings, for the serving check
    if args.mode == "tf1":
        tf.compat.v1.disable_eager_execution()
        sok.init()
        history, sess, predict = train_tf1((sizes,), (train, val, test), args)
        test_auc = score(predict, test)
        served = export_tf1((sizes,), sess, predict, export_dir, sample)
    else:
        sok.init()
        model = Model(sizes)
        history, predict = train_tf2(model, (train, val, test), args)
        test_auc = score(predict, test)
        served = export_tf2(model, predict, export_dir, sample)
    kept = history["best_epoch"]
    print(f"kept epoch {kept} of {len(history['auc'])} trained (of at most {args.epochs}): "
          f"validation AUC {history['val_auc'][kept - 1]:.6f}")
    if served is not None:
        print(f"serving: SavedModel {export_dir} (stock TensorFlow ops only) predicts "
              f"{served[0][0]:.6f}; the training model {served[1][0]:.6f}")
    plot(history, os.path.join(args.out, "training.png"), baseline)
    print(f"popularity baseline test AUC {baseline:.4f}")
    print(f"sok_graph DLRM      test AUC {test_auc:.6f} (the restored model of epoch {kept})")
    print(f"epoch {kept}'s tables dumped to {args.tables}; plot in "
          f"{os.path.join(args.out, 'training.png')}; {time.time() - start:.0f}s in all")
    if not test_auc > baseline:
        raise SystemExit("the model did not beat the popularity baseline")


if __name__ == "__main__":
    main()
