"""Synthetic categorical data with a planted signal, so a model can learn it.

Each table has a hidden score per row; a sample's label is drawn from
sigmoid(sum over tables of the mean hidden score of its ids). A model with one
embedding per table can recover the scores, so its loss falls and its AUC
rises well above 0.5, while a model that learns nothing stays at 0.5.
"""

import collections

import numpy as np

from sok_graph.data.metrics import auc  # noqa: F401  (the examples' import path)

PlantedDataset = collections.namedtuple(
    "PlantedDataset", ["values", "row_splits", "labels", "vocab_sizes"]
)


def make_planted_dataset(num_samples, vocab_sizes, max_hotness, seed=0, signal=2.0):
    """values[t] [nnz_t] int64 ids, row_splits[t] [num_samples + 1] int64,
    labels [num_samples] float32 in {0, 1}. vocab_sizes and max_hotness
    give one positive integer per table, in lists of one length (zip cut
    the longer one short, and the dataset named tables it did not have)."""
    vocab_sizes, max_hotness = list(vocab_sizes), list(max_hotness)
    if len(vocab_sizes) != len(max_hotness):
        raise ValueError(f"vocab_sizes and max_hotness must give one value per table; got "
                         f"{len(vocab_sizes)} and {len(max_hotness)}")
    for name, values in (("vocab_sizes", vocab_sizes), ("max_hotness", max_hotness)):
        for t, v in enumerate(values):
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"{name}[{t}] must be a positive integer; got {v!r}")
    if not isinstance(num_samples, (int, np.integer)) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive integer; got {num_samples!r}")
    if isinstance(signal, (bool, np.bool_)) or not isinstance(signal, (int, float, np.number)) \
            or not _finite(signal):
        # NaN or infinite: every logit NaN and every label 0, without an error.
        raise ValueError(f"signal must be a finite number (the hidden scores' scale); got "
                         f"{signal!r}")
    rng = np.random.default_rng(seed)
    logits = np.zeros(num_samples)
    values, splits = [], []
    for vocab, hot in zip(vocab_sizes, max_hotness):
        with np.errstate(over="ignore"):
            scores = rng.standard_normal(vocab) * signal
        lengths = rng.integers(1, hot + 1, size=num_samples)
        split = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        # Zipf-like popularity: a few ids are common, most are rare.
        ids = np.minimum(rng.zipf(1.2, size=split[-1]) - 1, vocab - 1).astype(np.int64)
        ids = (ids * 2654435761) % vocab  # spread popular ids over the table
        with np.errstate(over="ignore", invalid="ignore"):
            sums = np.add.reduceat(scores[ids], split[:-1]) if len(ids) else np.zeros(
                num_samples)
            logits += sums / lengths
        values.append(ids)
        splits.append(split)
    with np.errstate(over="ignore", invalid="ignore"):
        centred = logits - logits.mean()
    if not np.isfinite(centred).all():
        # A signal so large that the scores' sums overflow (1e308): the
        # logits were NaN and every label 0, as for a NaN signal.
        raise ValueError(f"signal={signal!r} is too large: the samples' scores overflow "
                         f"float64; give a smaller signal")
    with np.errstate(over="ignore"):
        probs = 1.0 / (1.0 + np.exp(-centred))
    labels = (rng.random(num_samples) < probs).astype(np.float32)
    return PlantedDataset(values, splits, labels, list(vocab_sizes))


def _finite(value):
    try:
        return bool(np.isfinite(float(value)))
    except OverflowError:  # an int beyond float64 (10**400)
        return False


def batch(dataset, start, stop):
    """The samples [start, stop) of a PlantedDataset as (values, row_splits,
    labels), 0 <= start < stop <= its samples."""
    n = len(dataset.labels)
    if not (isinstance(start, (int, np.integer)) and isinstance(stop, (int, np.integer))
            and 0 <= start < stop <= n):
        # A negative start gave one row's splits and two labels; start past
        # stop gave empty row_splits.
        raise ValueError(f"start and stop must be integers with 0 <= start < stop <= {n} "
                         f"(the samples); got start={start!r}, stop={stop!r}")
    values, splits = [], []
    for v, s in zip(dataset.values, dataset.row_splits):
        lo, hi = s[start], s[stop]
        values.append(v[lo:hi])
        splits.append(s[start:stop + 1] - lo)
    return values, splits, dataset.labels[start:stop]


def write_criteo_parquet(path, num_rows, num_tables=26, num_dense=13, vocab_size=100000,
                         max_hotness=3, row_group_size=65536, seed=0):
    """A Criteo-shaped Parquet file with a planted signal: list columns
    C1..C<num_tables> of int64 ids (1..max_hotness per row), float columns
    I1..I<num_dense>, and a label drawn from the ids' hidden scores and the
    dense values. Written in row groups so readers can stream it, whole:
    under a temporary name renamed to `path` at the end, so an interrupted
    write leaves no half-written file there."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sok_graph.data.files import written_whole

    for name, value, least in (("num_rows", num_rows, 1), ("num_tables", num_tables, 0),
                               ("num_dense", num_dense, 0), ("vocab_size", vocab_size, 1),
                               ("max_hotness", max_hotness, 1),
                               ("row_group_size", row_group_size, 1)):
        # num_rows=0 wrote no file at all, without an error; row_group_size=0
        # failed in range() naming no argument.
        if not isinstance(value, (int, np.integer)) or isinstance(value, (bool, np.bool_)) \
                or value < least:
            raise ValueError(f"{name} must be an integer >= {least}; got {value!r}")
    with written_whole(path) as tmp:
        _write_criteo(tmp, pa, pq, int(num_rows), int(num_tables), int(num_dense),
                      int(vocab_size), int(max_hotness), int(row_group_size), seed)


def _write_criteo(path, pa, pq, num_rows, num_tables, num_dense, vocab_size, max_hotness,
                  row_group_size, seed):
    rng = np.random.default_rng(seed)
    dense_weights = rng.standard_normal(num_dense) * 0.3
    scores = [rng.standard_normal(vocab_size) for _ in range(num_tables)]
    writer = None
    try:
        for start in range(0, num_rows, row_group_size):
            n = min(row_group_size, num_rows - start)
            columns, logits = {}, np.zeros(n)
            for t in range(num_tables):
                lengths = rng.integers(1, max_hotness + 1, size=n)
                offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
                ids = np.minimum(rng.zipf(1.3, size=offsets[-1]) - 1, vocab_size - 1)
                ids = ((ids * 2654435761) % vocab_size).astype(np.int64)
                logits += np.add.reduceat(scores[t][ids], offsets[:-1]) / lengths / np.sqrt(
                    num_tables)
                columns[f"C{t + 1}"] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids))
            dense = rng.standard_normal((n, num_dense)).astype(np.float32)
            logits += dense @ dense_weights
            for d in range(num_dense):
                columns[f"I{d + 1}"] = pa.array(dense[:, d])
            columns["label"] = pa.array(
                (rng.random(n) < 1 / (1 + np.exp(-logits))).astype(np.float32))
            table = pa.table(columns)
            if writer is None:
                writer = pq.ParquetWriter(path, table.schema)
            writer.write_table(table, row_group_size=row_group_size)
    finally:
        if writer is not None:
            writer.close()
