"""Host memory of sok.export_for_serving on a large dynamic table.

    python bench/serving_export_memory.py [--rows 1000000] [--dim 16] [--chunk 65536]

Fills a sok.DynamicVariable with --rows keys, then exports a model reading
it. Reports the peak resident memory during the export above the resident
memory before it (Linux: VmHWM after resetting it through
/proc/self/clear_refs), in units of the table's payload (keys + rows,
rows * (8 + 4 * dim) bytes). The export streams the table in chunks of
--chunk rows; what it keeps is the serving copy (the rows, the sorted keys
and their row numbers), so the figure should stay near 1-1.5x, within the
2x the design allows on top of the trained table itself.
"""

import argparse
import os
import tempfile
import time

import numpy as np


def _status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--chunk", type=int, default=1 << 16)
    args = p.parse_args()
    import tensorflow as tf

    import sok_graph as sok

    sok.init()
    table = sok.DynamicVariable(dimension=args.dim, initializer="zeros", name="big")
    rng = np.random.default_rng(0)
    keys = rng.choice(1 << 40, size=args.rows, replace=False).astype(np.int64)
    step = 1 << 18
    for start in range(0, args.rows, step):
        part = keys[start:start + step]
        sok.assign(table, tf.constant(part),
                   tf.constant(rng.normal(size=(len(part), args.dim)).astype(np.float32)))
    probe = keys[:8].copy()
    del keys

    class Model(tf.Module):
        def __call__(self, ids):
            return sok.lookup_sparse(table, tf.RaggedTensor.from_tensor(ids[:, None]),
                                     combiners="sum")

    want = Model()(tf.constant(probe)).numpy()
    payload = args.rows * (8 + 4 * args.dim)
    export_dir = os.path.join(tempfile.mkdtemp(), "model")
    before = _status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    start = time.time()
    sok.export_for_serving(Model(), export_dir, [tf.TensorSpec([None], tf.int64)],
                           chunk_rows=args.chunk)
    seconds = time.time() - start
    peak = _status("VmHWM")
    got = tf.saved_model.load(export_dir).signatures["serving_default"](
        tf.constant(probe))
    got = list(got.values())[0].numpy()
    assert np.allclose(got, want), (got, want)
    print(f"rows {args.rows} dim {args.dim}: table payload {payload / 2**20:.1f} MiB, "
          f"export peak above baseline {(peak - before) / 2**20:.1f} MiB = "
          f"{(peak - before) / payload:.2f}x the table, {seconds:.1f}s")


if __name__ == "__main__":
    main()
