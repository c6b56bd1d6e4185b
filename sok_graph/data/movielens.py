"""MovieLens-100k as a click-prediction data set, from the copy that ships in
the `recbole` wheel (installed with --no-deps; nothing of recbole is imported).

Each rating becomes one sample: categorical features user, item, age, gender,
occupation, zip prefix and release year, the item's genres as a multi-hot
list, and label = rating >= 4. Samples are split at random (seeded) into
train and test, and written to Parquet with pyarrow.
"""

import importlib.util
import os

import numpy as np

CATEGORICAL = ["user", "item", "age", "gender", "occupation", "zip3", "year"]
MULTI_HOT = ["genres"]


def raw_dir():
    """The ml-100k folder inside the installed recbole package."""
    spec = importlib.util.find_spec("recbole")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("MovieLens-100k comes from the recbole wheel: "
                           "pip install --no-deps recbole")
    path = os.path.join(list(spec.submodule_search_locations)[0], "dataset_example", "ml-100k")
    if not os.path.exists(os.path.join(path, "ml-100k.inter")):
        raise RuntimeError(f"no ml-100k files in {path}")
    return path


def _table(path):
    with open(path, encoding="latin-1") as f:
        header = f.readline().rstrip("\n").split("\t")
        rows = [line.rstrip("\n").split("\t") for line in f if line.strip()]
    names = [h.split(":")[0] for h in header]
    return {n: [r[i] if i < len(r) else "" for r in rows] for i, n in enumerate(names)}


class _Vocab:
    """Dense ids 0..n-1 for the string values of one feature."""

    def __init__(self):
        self.ids = {}

    def __call__(self, value):
        return self.ids.setdefault(value, len(self.ids))


def load_samples():
    """dict of numpy arrays: one int64 column per categorical feature,
    genres as (values, row_splits), label float32, timestamp int64; and the
    vocabulary size of every feature."""
    base = raw_dir()
    inter = _table(os.path.join(base, "ml-100k.inter"))
    users = _table(os.path.join(base, "ml-100k.user"))
    items = _table(os.path.join(base, "ml-100k.item"))
    vocab = {name: _Vocab() for name in CATEGORICAL + MULTI_HOT}
    user_info = {u: (a, g, o, z[:3]) for u, a, g, o, z in
                 zip(users["user_id"], users["age"], users["gender"], users["occupation"],
                     users["zip_code"])}
    item_info = {i: (y, c.split()) for i, y, c in
                 zip(items["item_id"], items["release_year"], items["class"])}
    cols = {name: [] for name in CATEGORICAL}
    genre_values, genre_splits = [], [0]
    for u, i in zip(inter["user_id"], inter["item_id"]):
        age, gender, occupation, zip3 = user_info.get(u, ("", "", "", ""))
        year, genres = item_info.get(i, ("", []))
        for name, value in zip(CATEGORICAL, (u, i, age, gender, occupation, zip3, year)):
            cols[name].append(vocab[name](value))
        genre_values.extend(vocab["genres"](g) for g in (genres or ["none"]))
        genre_splits.append(len(genre_values))
    out = {name: np.asarray(v, np.int64) for name, v in cols.items()}
    out["genres_values"] = np.asarray(genre_values, np.int64)
    out["genres_splits"] = np.asarray(genre_splits, np.int64)
    out["label"] = (np.asarray(inter["rating"], np.float32) >= 4).astype(np.float32)
    out["timestamp"] = np.asarray(inter["timestamp"], np.float64).astype(np.int64)
    sizes = {name: len(v.ids) for name, v in vocab.items()}
    return out, sizes


def write_parquet(samples, path):
    """Writes the samples as a Parquet file (genres as a list column),
    whole: under a temporary name renamed to `path` at the end, so an
    interrupted write leaves no half-written file there (the demo, finding
    one, read it and failed on every later run)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sok_graph.data.files import written_whole

    columns = {name: pa.array(samples[name]) for name in CATEGORICAL + ["label", "timestamp"]}
    columns["genres"] = pa.ListArray.from_arrays(pa.array(samples["genres_splits"], pa.int32()),
                                                 pa.array(samples["genres_values"]))
    with written_whole(path) as tmp:
        pq.write_table(pa.table(columns), tmp)


def read_parquet(path):
    """The samples back from Parquet, in the layout load_samples returns."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    out = {name: table.column(name).to_numpy() for name in CATEGORICAL + ["label", "timestamp"]}
    genres = table.column("genres").combine_chunks()
    out["genres_values"] = genres.values.to_numpy().astype(np.int64)
    out["genres_splits"] = genres.offsets.to_numpy().astype(np.int64)
    return out


def split(samples, test_fraction=0.2, seed=0):
    """(train, test): a seeded random split of the samples; test_fraction in
    [0, 1] (1.5 and -0.5 split as 0.5 and 0 did, without an error)."""
    if isinstance(test_fraction, (bool, np.bool_)) or \
            not isinstance(test_fraction, (int, float, np.integer, np.floating)) or \
            not 0.0 <= test_fraction <= 1.0:
        raise ValueError(f"test_fraction must be a number in [0, 1]; got {test_fraction!r}")
    n = len(samples["label"])
    order = np.random.default_rng(seed).permutation(n)
    cut = int(n * (1 - test_fraction))
    return take(samples, order[:cut]), take(samples, order[cut:])


def take(samples, index):
    """The samples at positions `index` (a 1-D integer array or list; a
    negative position counts from the end, as numpy's), genres included."""
    given = np.asarray(index)
    if given.size and given.dtype.kind not in "iu":
        # A boolean mask became positions 0 and 1.
        raise TypeError(f"index must hold integer positions; got {given.dtype} (for a mask, "
                        f"pass np.flatnonzero(mask))")
    if given.ndim != 1:
        raise ValueError(f"index must be 1-D; got shape {given.shape}")
    n = len(samples["genres_splits"]) - 1
    # Checked before the cast to int64: a uint64 position past 2**63 (2**64 - 1)
    # wrapped to -1 and read the last sample.
    outside = (given < -n) | (given >= n) if given.dtype.kind == "i" else given >= n
    if outside.any():
        raise IndexError(f"index holds {given[np.argmax(outside)].item()}, outside the {n} "
                         f"samples")
    index = given.astype(np.int64)
    # Each position's genres lie between its split and the next: -1 read
    # the split at 0 and gave the last sample no genres and a negative one.
    index = np.where(index < 0, index + n, index)
    out = {k: v[index] for k, v in samples.items() if not k.startswith("genres")}
    starts, ends = samples["genres_splits"][index], samples["genres_splits"][index + 1]
    lengths = ends - starts
    out["genres_splits"] = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    out["genres_values"] = (np.concatenate([samples["genres_values"][s:e]
                                            for s, e in zip(starts, ends)])
                            if len(index) else np.zeros(0, np.int64))
    return out
