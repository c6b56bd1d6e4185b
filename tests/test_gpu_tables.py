"""A GPU dynamic table's memory comes from TensorFlow's allocator for the
device, so TensorFlow's memory settings and statistics cover it: the
allocator's count grows with the table and falls when it is freed, a
logical-device memory limit bounds it (a clear ResourceExhausted error, the
process still usable), and a table fits in what TensorFlow reserved for
itself. Needs a GPU (tests/gpu/run_tf_suite.sh); skipped elsewhere."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import sok_graph as sok

pytestmark = pytest.mark.skipif(not tf.config.experimental.list_physical_devices("GPU"),
                                reason="needs a GPU that TensorFlow sees")

DIM = 32


def gpu_bytes_in_use():
    return tf.config.experimental.get_memory_info("GPU:0")["current"]


def test_table_memory_is_counted_by_tensorflows_allocator():
    before = gpu_bytes_in_use()
    with tf.device("/GPU:0"):
        var = sok.DynamicVariable(DIM, initializer="zeros")
        keys = tf.range(1 << 18, dtype=tf.int64)
        var.sparse_read(keys)
    assert "GPU" in var.handle.device
    table_bytes = int(var.stats()["memory_bytes"])
    rows_bytes = (1 << 18) * DIM * 4
    assert table_bytes >= rows_bytes
    grown = gpu_bytes_in_use() - before
    # The table's storage (and its scratch) is in TensorFlow's count.
    assert grown >= rows_bytes, (grown, table_bytes)
    del var, keys
    import gc
    gc.collect()
    assert gpu_bytes_in_use() - before < rows_bytes // 4


LIMITED = textwrap.dedent("""
    import sys
    import tensorflow as tf
    gpu = tf.config.list_physical_devices("GPU")[0]
    tf.config.set_logical_device_configuration(
        gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=int(sys.argv[1]))])
    import sok_graph as sok
    sok.init(comm_tool="none")
    dim = 64
    var = sok.DynamicVariable(dim, initializer="zeros")
    inserted = 0
    try:
        for start in range(0, 1 << 26, 1 << 18):
            var.sparse_read(tf.range(start, start + (1 << 18), dtype=tf.int64))
            inserted = start + (1 << 18)
        print("NO_LIMIT_REACHED", inserted)
    except tf.errors.ResourceExhaustedError as e:
        print("LIMIT_REACHED", inserted, "|", str(e).splitlines()[0][:400])
    # The process still computes on the GPU, the table included (the last
    # keys inserted are still there; a bounded table evicted the first).
    rows, found = var.find(tf.constant([inserted - 2, inserted - 1], tf.int64))
    assert bool(tf.reduce_all(found)), found
    print("STILL_WORKS", float(tf.reduce_sum(tf.ones([1000, 1000]) @ tf.ones([1000, 1]))))
    print("TABLE_BYTES", int(var.stats()["memory_bytes"]))
""")


def run_limited(limit_mb, script=LIMITED):
    """stdout of `script` in a fresh process whose GPU has a memory limit."""
    env = dict(os.environ)
    env.pop("TF_FORCE_GPU_ALLOW_GROWTH", None)  # a memory limit instead of growth
    proc = subprocess.run([sys.executable, "-c", script, str(limit_mb)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc.stdout


def test_memory_limit_bounds_the_table_with_a_clear_error():
    # 512 MiB for everything: a table of 64-float rows reaches it within a
    # few million keys, far below the GPU's free memory (which cudaMalloc,
    # outside TensorFlow's allocator, would have used without noticing).
    out = run_limited(512)
    assert "LIMIT_REACHED" in out, out
    line = next(l for l in out.splitlines() if l.startswith("LIMIT_REACHED"))
    inserted = int(line.split()[1])
    assert inserted * DIM * 2 * 4 < 512 << 20, line  # it did stop at the limit
    assert "TensorFlow's allocator" in line and "max_capacity" in line, line
    assert "STILL_WORKS 1000000.0" in out, out
    # The table kept what it had before the failed call: at least the rows
    # of every key inserted, inside the limit.
    table = int(next(l for l in out.splitlines() if l.startswith("TABLE_BYTES")).split()[1])
    assert inserted * 64 * 4 <= table < 512 << 20, (inserted, table)


def test_bounded_table_fits_inside_tensorflows_reservation():
    # Under a 1 GiB reservation, a table bounded to 2^19 rows of 64 floats
    # (128 MiB of rows; a GPU table keeps up to 8/3 slots per row, plus its
    # eviction scratch) takes 8x as many keys, evicting, and stays inside.
    script = LIMITED.replace('var = sok.DynamicVariable(dim, initializer="zeros")',
                             'var = sok.DynamicVariable(dim, initializer="zeros", '
                             'var_type="hybrid", max_capacity=1 << 19, init_capacity=1 << 19)')
    script = script.replace("range(0, 1 << 26, 1 << 18)", "range(0, 1 << 22, 1 << 18)")
    out = run_limited(1024, script)
    assert "NO_LIMIT_REACHED 4194304" in out, out
    assert "STILL_WORKS" in out
    table = int(next(l for l in out.splitlines() if l.startswith("TABLE_BYTES")).split()[1])
    assert (1 << 19) * 64 * 4 <= table < 1 << 30, table


def test_a_hybrid_table_at_soks_default_bound_takes_memory_as_its_keys_come():
    # SOK's default max_capacity (2^26 keys) at dim 16: a table made at its
    # bound took 2^27 slots of keys, metadata and rows (about 11 GiB) before
    # its first key. It starts at its init_capacity and grows, and still
    # evicts nothing before its bound.
    before = gpu_bytes_in_use()
    with tf.device("/GPU:0"):
        var = sok.DynamicVariable(16, initializer="zeros", var_type="hybrid")
        var.sparse_read(tf.range(1000, dtype=tf.int64))
    assert "GPU" in var.handle.device
    assert int(var.stats()["memory_bytes"]) < 64 << 20, var.stats()
    assert gpu_bytes_in_use() - before < 256 << 20
    with tf.device("/GPU:0"):
        for start in range(0, 1 << 20, 1 << 18):
            var.sparse_read(tf.range(start, start + (1 << 18), dtype=tf.int64))
    assert int(var.size[0]) == 1 << 20
    _, found = var.find(tf.constant([0, 999, (1 << 20) - 1], tf.int64))
    assert bool(tf.reduce_all(found))
    # Half full as it grows: 2^21 slots of 16 floats and their index.
    assert int(var.stats()["memory_bytes"]) < (1 << 21) * (16 * 4 + 32) * 2, var.stats()


def test_int32_and_int64_tables_live_on_the_gpu_and_agree_with_the_cpu():
    keys = np.array([7, -3, 2 ** 31 - 1, -(2 ** 31), 7, 11], np.int32)
    results = {}
    for device in ("/GPU:0", "/CPU:0"):
        for key_type in (tf.int32, tf.int64):
            with tf.device(device):
                var = sok.DynamicVariable(4, key_type=key_type, initializer="normal", seed=5)
                emb = sok.lookup_sparse(var, tf.RaggedTensor.from_row_splits(
                    tf.constant(keys.astype(key_type.as_numpy_dtype)),
                    tf.constant([0, 2, 6], tf.int64)), combiners="sum")
                exported_keys, rows = var.export()
            assert device[1:4] in var.handle.device, (device, var.handle.device)
            order = np.argsort(exported_keys.numpy())
            results[(device, key_type.name)] = (emb.numpy(), exported_keys.numpy()[order],
                                                rows.numpy()[order])
    ref = results[("/CPU:0", "int64")]
    for k, (emb, ekeys, rows) in results.items():
        np.testing.assert_allclose(emb, ref[0], rtol=1e-6, err_msg=str(k))
        np.testing.assert_array_equal(ekeys, ref[1], err_msg=str(k))
        np.testing.assert_allclose(rows, ref[2], rtol=1e-6, err_msg=str(k))


def test_int32_ids_with_gpu_resident_tables_match_tensorflow():
    rng = np.random.default_rng(3)
    with tf.device("/GPU:0"):
        table = tf.Variable(rng.standard_normal((50, 8)).astype(np.float32))
        ids32 = tf.RaggedTensor.from_row_splits(
            tf.constant(rng.integers(0, 50, 40), tf.int32),
            tf.constant([0, 3, 3, 10, 25, 40], tf.int64))
        with tf.GradientTape(persistent=True) as tape:
            got = sok.lookup_sparse(table, ids32, combiners="mean")
            want = tf.nn.embedding_lookup_sparse(table, ids32.to_sparse(), None,
                                                 combiner="mean")
            g_loss = tf.reduce_sum(got * got)
            w_loss = tf.reduce_sum(want * want)
    assert "GPU" in table.device
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    g_got = tf.convert_to_tensor(tape.gradient(g_loss, table))
    g_want = tf.convert_to_tensor(tape.gradient(w_loss, table))
    np.testing.assert_allclose(g_got.numpy(), g_want.numpy(), rtol=1e-5, atol=1e-6)


def test_gpu_table_size_limits_are_clear_errors():
    from sok_graph.ops import dynamic as dyn
    with tf.device("/GPU:0"):
        for kwargs, words in ((dict(init_capacity=(1 << 29) + 1), "unbounded GPU table"),
                              (dict(max_capacity=(3 << 28) + 1), "bounded GPU table")):
            handle = dyn.handle(f"limits{np.random.randint(1 << 40)}")
            with pytest.raises(tf.errors.InvalidArgumentError, match=words):
                dyn.create(handle, tf.int64, 4, **kwargs)


def chunked_export(handle, dim, limit, updated_after):
    """Every row a chunked export gives ({key: (row bytes, time, count)}), and
    the (size, next_offset) of each chunk."""
    from sok_graph.ops import dynamic as dyn
    rows, cuts, offset = {}, [], 0
    size = int(dyn.stats(handle)[0])
    while offset < size:
        k, r, t, f, nxt = dyn.export(handle, tf.int64, dim, offset=offset, limit=limit,
                                     updated_after=updated_after)
        for key, row, ts, fr in zip(k.numpy(), r.numpy(), t.numpy(), f.numpy()):
            assert int(key) not in rows, "a chunked export gave a key twice"
            rows[int(key)] = (row.tobytes(), int(ts), int(fr))
        cuts.append((int(k.shape[0]), int(nxt)))
        assert int(nxt) > offset
        offset = int(nxt)
    return rows, cuts


def test_cpu_and_gpu_tables_export_the_same_chunks():
    """The same rows on a CPU and a GPU table export the same way for every
    filter and chunk size: the same rows, the same times and counts, and
    (without a filter, where the order does not matter) the same cuts."""
    from sok_graph.ops import dynamic as dyn
    rng = np.random.default_rng(7)
    n, dim = 300, 5
    keys = tf.constant(rng.choice(1 << 50, size=n, replace=False), tf.int64)
    rows = tf.constant(rng.standard_normal((n, dim)), tf.float32)
    stamps = tf.constant((1 + np.arange(n) % 6) * 1000, tf.int64)
    counts = tf.constant(np.arange(n) % 11, tf.int64)
    handles = {}
    for device in ("CPU", "GPU"):
        with tf.device(f"/{device}:0"):
            handles[device] = dyn.handle(f"export_{device}_{np.random.randint(1 << 40)}")
            dyn.create(handles[device], tf.int64, dim, dict(initializer="zeros"))
            dyn.import_rows(handles[device], keys, rows, stamps, counts)
            # A few rows touched again, so times differ from the imported ones.
            dyn.find_or_insert(handles[device], keys[::17], dim)
    assert "GPU" in handles["GPU"].device
    for updated_after in (int(np.iinfo(np.int64).min), 2500, 5500, 10 ** 15):
        for limit in (1, 7, 64, 1 << 20):
            cpu, cpu_cuts = chunked_export(handles["CPU"], dim, limit, updated_after)
            gpu, gpu_cuts = chunked_export(handles["GPU"], dim, limit, updated_after)
            # The re-found rows carry each device's own clock: compare those
            # by key only.
            assert set(cpu) == set(gpu), (updated_after, limit)
            for key in cpu:
                assert cpu[key][0] == gpu[key][0] and cpu[key][2] == gpu[key][2], key
                if cpu[key][1] <= 6000:
                    assert cpu[key][1] == gpu[key][1], key
            if updated_after < 0:
                assert cpu_cuts == gpu_cuts, limit
