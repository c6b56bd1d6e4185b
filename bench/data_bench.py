"""Parquet reader throughput on a Criteo-shaped file vs a straightforward
pandas.read_parquet + tf.data.Dataset.from_tensor_slices pipeline.

Writes a synthetic file (26 list columns of ids, 13 float columns, label)
unless --file is given, then reads it end to end, each way, in the same
process, and prints rows/s and the ratio.

    python bench/data_bench.py [--rows 1000000] [--batch 65536]
"""

import argparse
import os
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from sok_graph.data import synthetic  # noqa: E402
from sok_graph.data.parquet import ParquetReader  # noqa: E402

RAGGED = [f"C{i}" for i in range(1, 27)]
DENSE = [f"I{i}" for i in range(1, 14)]


def read_ours(path, batch, as_dataset):
    reader = ParquetReader(path, batch, RAGGED, DENSE)
    rows = 0
    start = time.perf_counter()
    if as_dataset:
        for b in reader.dataset():
            rows += int(b["label"].shape[0])
    else:
        for b in reader:
            rows += len(b["label"])
    return rows, time.perf_counter() - start


def read_baseline(path, batch):
    import pandas as pd  # scripts/setup_bench_extras.sh installs it

    start = time.perf_counter()
    df = pd.read_parquet(path)
    features = {}
    for name in RAGGED:
        col = df[name]
        lengths = col.map(len).to_numpy()
        features[name] = tf.RaggedTensor.from_row_lengths(np.concatenate(col.to_numpy()),
                                                          lengths)
    features["dense"] = df[DENSE].to_numpy(np.float32)
    features["label"] = df["label"].to_numpy(np.float32)
    ds = tf.data.Dataset.from_tensor_slices(features).batch(batch)
    rows = 0
    for b in ds:
        rows += int(b["label"].shape[0])
    return rows, time.perf_counter() - start


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1000000)
    p.add_argument("--batch", type=int, default=65536)
    p.add_argument("--file", default=None)
    args = p.parse_args()
    path = args.file
    if path is None:
        path = os.path.join(tempfile.mkdtemp(), "criteo.parquet")
        t = time.perf_counter()
        synthetic.write_criteo_parquet(path, args.rows, vocab_size=1000000, seed=0)
        print(f"wrote {args.rows} rows to {path} ({os.path.getsize(path) / 2**20:.0f} MiB) in "
              f"{time.perf_counter() - t:.1f}s")
    print(f"TensorFlow {tf.__version__}, {os.cpu_count()} CPUs; batch {args.batch}; "
          f"26 list columns, 13 float columns, label")
    results = {}
    for name, fn in [("sok_graph reader (numpy)", lambda: read_ours(path, args.batch, False)),
                     ("sok_graph reader (tf.data)", lambda: read_ours(path, args.batch, True)),
                     ("pandas + from_tensor_slices", lambda: read_baseline(path, args.batch))]:
        fn() if name.startswith("sok") else None  # warm the page cache and tf.data
        rows, seconds = fn()
        results[name] = rows / seconds
        print(f"{name:<30}{rows / seconds / 1e6:>8.2f} M rows/s  ({rows} rows, {seconds:.2f}s)",
              flush=True)
    base = results["pandas + from_tensor_slices"]
    for name in ("sok_graph reader (numpy)", "sok_graph reader (tf.data)"):
        print(f"ratio {name} / baseline: {results[name] / base:.2f}x  "
              f"(targets: >= 1M rows/s and >= 2x)")


if __name__ == "__main__":
    main()
