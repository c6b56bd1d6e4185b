"""SOK's "Sparse Operation Kit with NVTabular Data Reader" notebook flow with
sok_graph's own Parquet reader: generate synthetic samples (slot_num x
nnz_per_slot keys and a label each) -> write them to Parquet with pyarrow ->
split them per worker -> train SOK's DemoModel under
tf.distribute.MirroredStrategy, every worker reading only its part through
sok_graph.data's ParquetReader.

Differences from the notebook, and why:
- The labels follow a planted rule (as in demo_model.py: every key has a
  hidden score, the label says whether a sample's scores sum to more than
  zero), so the model can learn them; the notebook's labels are random.
- NVTabular's loader is CUDA-first (on a CPU: fragile pins and about 3k
  rows/s, BUILD_NOTES.md), so the batches come from
  sok_graph.data.parquet.ParquetReader(...).dataset().
- The notebook's split step writes one file per worker with NVTabular. Here
  the split is the reader's: the file is written in row groups and worker
  `rank` of `world_size` reads row groups rank, rank + world_size, ..., so the
  workers read disjoint parts without a second copy of the data.
- CPU-sized defaults (the notebook: batch 8192 on 8 GPUs, vocabulary 8192,
  6 dense layers of 1024 units). The notebook's 100 slots x 10 keys stay;
  the small vocabulary (64) gives every key enough samples for the rule to
  be learned within a few dozen steps.

`--rank`/`--world_size` select the part this process reads. Running all N
workers at once (N processes under MultiWorkerMirroredStrategy) comes with
the launcher; until then a process started with --world_size N trains on its
own part only.

    python examples_tf2/parquet_demo.py [--steps 40] [--rank 0 --world_size 1]
"""

import argparse
import os
import sys
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sok_graph as sok  # noqa: E402  (or: import sparse_operation_kit as sok)
from demo_model import DemoModel, check_learned  # noqa: E402
from sok_graph.data import flags, metrics  # noqa: E402
from sok_graph.data.parquet import ParquetReader  # noqa: E402

FEATURE, LABEL = "feature", "label"  # the notebook's column names


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data_dir", type=flags.writable_directory, default=None,
                   help="where the Parquet files go (default: a new temporary directory)")
    p.add_argument("--rows", type=flags.int_at_least(1), default=32768,
                   help="training samples to generate")
    p.add_argument("--eval_rows", type=flags.int_at_least(1), default=4096,
                   help="held-out samples")
    p.add_argument("--row_group_size", type=flags.int_at_least(1), default=1024)
    p.add_argument("--slot_num", type=flags.int_at_least(1), default=100)
    p.add_argument("--nnz_per_slot", type=flags.int_at_least(1), default=10)
    p.add_argument("--vocabulary_size", type=flags.int_at_least(1), default=64)
    p.add_argument("--embedding_vec_size", type=flags.int_at_least(1), default=4)
    p.add_argument("--global_batch_size", type=flags.int_at_least(1), default=256,
                   help="rows per step summed over all workers")
    # Two at least: the run checks that the loss went down.
    p.add_argument("--steps", type=flags.int_at_least(2), default=40)
    p.add_argument("--dense_layers", type=flags.int_at_least(0), default=2)
    p.add_argument("--dense_units", type=flags.int_at_least(1), default=32)
    p.add_argument("--learning_rate", type=flags.positive_number, default=0.01)
    p.add_argument("--seed", type=flags.int_at_least(0), default=0,
                   help="seeds the model's initial values")
    p.add_argument("--rank", type=int, default=0, help="this worker's index")
    p.add_argument("--world_size", type=flags.int_at_least(1), default=1, help="number of workers")
    args = p.parse_args()
    if args.world_size < 1 or not 0 <= args.rank < args.world_size:
        p.error(f"--rank must be in [0, --world_size={args.world_size}); got {args.rank}")
    if args.global_batch_size % args.world_size:
        p.error(f"--global_batch_size ({args.global_batch_size}) must be a multiple of "
                f"--world_size ({args.world_size})")
    return args


class PlantedRule:
    """Samples of keys [n, slot_num, nnz_per_slot] int64, drawn uniformly
    from the vocabulary, and labels [n] float32: 1 where the hidden scores of
    a sample's keys sum to more than zero."""

    def __init__(self, slot_num, nnz_per_slot, vocabulary, seed=0):
        self.rng = np.random.default_rng(seed)
        self.shape = (slot_num, nnz_per_slot)
        self.vocabulary = vocabulary
        scores = self.rng.normal(size=vocabulary)
        # Centred, so about half the labels are 1 however many keys a sample
        # has (uncentred, the draw's mean score times slot_num * nnz_per_slot
        # keys can push nearly every sum to one side).
        self.scores = scores - scores.mean()

    def samples(self, n):
        keys = self.rng.integers(0, self.vocabulary, size=(n,) + self.shape, dtype=np.int64)
        labels = (self.scores[keys].sum(axis=(1, 2)) > 0).astype(np.float32)
        return keys, labels


def write_parquet(path, rule, num_rows, row_group_size):
    """num_rows samples of `rule` as one list<int64> column (each row's
    slot_num * nnz_per_slot keys, slot by slot) and a float32 label column,
    written one row group at a time. Returns the share of positive labels."""
    positives = 0
    with pq.ParquetWriter(path, pa.schema([(FEATURE, pa.list_(pa.int64())),
                                           (LABEL, pa.float32())])) as writer:
        for start in range(0, num_rows, row_group_size):
            keys, labels = rule.samples(min(row_group_size, num_rows - start))
            n, per_row = keys.shape[0], keys.shape[1] * keys.shape[2]
            offsets = pa.array(np.arange(0, (n + 1) * per_row, per_row, dtype=np.int32))
            writer.write_table(pa.table({
                FEATURE: pa.ListArray.from_arrays(offsets, pa.array(keys.reshape(-1))),
                LABEL: pa.array(labels),
            }), row_group_size=row_group_size)
            positives += int(labels.sum())
    return positives / max(num_rows, 1)


def generate(args, data_dir):
    """Training and held-out files drawn from one planted rule (the same
    hidden scores for both)."""
    rule = PlantedRule(args.slot_num, args.nnz_per_slot, args.vocabulary_size, seed=0)
    train = os.path.join(data_dir, "data.parquet")
    held_out = os.path.join(data_dir, "eval.parquet")
    share = write_parquet(train, rule, args.rows, args.row_group_size)
    write_parquet(held_out, rule, args.eval_rows, args.row_group_size)
    groups = pq.ParquetFile(train).metadata.num_row_groups
    print(f"[INFO]: wrote {args.rows} samples ({groups} row groups, {share:.3f} positive) to "
          f"{train}, {args.eval_rows} held-out samples to {held_out}")
    return train, held_out


def model_inputs(args):
    """Reader batch -> (keys [batch, slot_num, nnz_per_slot], labels [batch, 1])."""
    per_row = args.slot_num * args.nnz_per_slot

    def fn(batch):
        ids = batch[FEATURE]
        check = tf.debugging.assert_equal(
            ids.row_lengths(), tf.constant(per_row, tf.int64),
            message=f"every row of '{FEATURE}' must hold slot_num * nnz_per_slot = {per_row} keys")
        with tf.control_dependencies([check]):
            keys = tf.reshape(ids.flat_values, [-1, args.slot_num, args.nnz_per_slot])
        return keys, tf.reshape(batch[LABEL], [-1, 1])

    return fn


def main():
    args = parse_args()
    if args.data_dir:
        os.makedirs(args.data_dir, exist_ok=True)
        run(args, args.data_dir)
    else:
        with tempfile.TemporaryDirectory(prefix="sok_parquet_demo_") as data_dir:
            run(args, data_dir)


def run(args, data_dir):
    train_file, eval_file = generate(args, data_dir)

    # Split per worker: without shuffling, the reader gives worker `rank` the
    # row groups rank, rank + world_size, ... (the notebook's loader did not
    # shuffle either).
    worker_batch = args.global_batch_size // args.world_size
    reader = ParquetReader(train_file, worker_batch, [FEATURE], label_column=LABEL,
                           rank=args.rank, world_size=args.world_size, drop_remainder=True)
    meta = pq.ParquetFile(train_file).metadata
    mine = range(args.rank, meta.num_row_groups, args.world_size)
    print(f"[INFO]: worker {args.rank} of {args.world_size} reads row groups "
          f"{', '.join(map(str, mine[:3]))}, ... of {meta.num_row_groups} "
          f"({sum(meta.row_group(g).num_rows for g in mine)} rows), {worker_batch} rows per step")

    tf.keras.utils.set_random_seed(args.seed)
    strategy = tf.distribute.MirroredStrategy()
    with strategy.scope():
        sok.Init(global_batch_size=args.global_batch_size, seed=args.seed)
        model = DemoModel(max_vocabulary_size_per_gpu=args.vocabulary_size,
                          slot_num=args.slot_num, nnz_per_slot=args.nnz_per_slot,
                          embedding_vector_size=args.embedding_vec_size,
                          num_of_dense_layers=args.dense_layers, dense_units=args.dense_units)
        emb_opt = tf.keras.optimizers.Adam(learning_rate=args.learning_rate)
        dense_opt = tf.keras.optimizers.Adam(learning_rate=args.learning_rate)

    # The rows all replicas of this strategy see in one step: worker_batch in
    # one process; the global batch once the launcher's N workers share it.
    step_rows = worker_batch * strategy.num_replicas_in_sync // len(
        strategy.extended.worker_devices)
    loss_fn = tf.keras.losses.BinaryCrossentropy(from_logits=True,
                                                 reduction=tf.keras.losses.Reduction.NONE)

    @tf.function
    def train_step(keys, labels):
        with tf.GradientTape() as tape:
            logits = model(keys, training=True)
            loss = tf.nn.compute_average_loss(loss_fn(labels, logits),
                                              global_batch_size=step_rows)
        emb_var, other_var = sok.split_embedding_variable_from_others(model.trainable_variables)
        grads, emb_grads = tape.gradient(loss, [other_var, emb_var])
        with sok.OptimizerScope(emb_var):  # the native optimizer updates only the batch's rows
            emb_opt.apply_gradients(zip(emb_grads, emb_var),
                                    experimental_aggregate_gradients=False)
        dense_opt.apply_gradients(zip(grads, other_var))
        return loss

    options = tf.data.Options()
    # The reader already gives each worker its own part.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    losses, epoch = [], 0
    while len(losses) < args.steps:
        dataset = reader.dataset().map(model_inputs(args)).with_options(options)
        before = len(losses)
        print(f"[INFO]: epoch {epoch}")
        for keys, labels in strategy.experimental_distribute_dataset(dataset):
            replica_loss = strategy.run(train_step, args=(keys, labels))
            losses.append(float(strategy.reduce(tf.distribute.ReduceOp.SUM, replica_loss,
                                                axis=None)))
            print(f"[INFO]: Iteration: {len(losses) - 1}, loss: {losses[-1]}")
            if len(losses) == args.steps:
                break
        if len(losses) == before:
            raise SystemExit(f"worker {args.rank} has no full batch of {worker_batch} rows; "
                             "write more rows or use a smaller --global_batch_size")
        epoch += 1

    held_out = ParquetReader(eval_file, 1024, [FEATURE], label_column=LABEL)
    scores, truth = [], []
    for keys, labels in held_out.dataset().map(model_inputs(args)):
        scores.append(model(keys, training=False).numpy().reshape(-1))
        truth.append(labels.numpy().reshape(-1))
    auc = metrics.auc(np.concatenate(truth), np.concatenate(scores))
    print(f"[INFO]: held-out AUC {auc:.4f} ({args.eval_rows} samples)")
    check_learned(losses, f"parquet_demo (worker {args.rank} of {args.world_size})")


if __name__ == "__main__":
    main()
