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
    labels [num_samples] float32 in {0, 1}."""
    rng = np.random.default_rng(seed)
    logits = np.zeros(num_samples)
    values, splits = [], []
    for vocab, hot in zip(vocab_sizes, max_hotness):
        scores = rng.standard_normal(vocab) * signal
        lengths = rng.integers(1, hot + 1, size=num_samples)
        split = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        # Zipf-like popularity: a few ids are common, most are rare.
        ids = np.minimum(rng.zipf(1.2, size=split[-1]) - 1, vocab - 1).astype(np.int64)
        ids = (ids * 2654435761) % vocab  # spread popular ids over the table
        sums = np.add.reduceat(scores[ids], split[:-1]) if len(ids) else np.zeros(num_samples)
        logits += sums / lengths
        values.append(ids)
        splits.append(split)
    probs = 1.0 / (1.0 + np.exp(-(logits - logits.mean())))
    labels = (rng.random(num_samples) < probs).astype(np.float32)
    return PlantedDataset(values, splits, labels, list(vocab_sizes))


def batch(dataset, start, stop):
    """The samples [start, stop) of a PlantedDataset as (values, row_splits, labels)."""
    values, splits = [], []
    for v, s in zip(dataset.values, dataset.row_splits):
        lo, hi = s[start], s[stop]
        values.append(v[lo:hi])
        splits.append(s[start:stop + 1] - lo)
    return values, splits, dataset.labels[start:stop]
