"""Resident memory under a stream of ever-new keys (CI-sized; the full run
with 20M keys is bench/memory_bound.py): a bounded dynamic table stays
within its bound plus a slack however many keys arrive; an unbounded one
grows linearly, by about the bytes per key its layout promises."""

import numpy as np
import pytest
import tensorflow as tf

import sok_graph as sok

DIM = 16
BATCH = 16384
ROW_BUDGET = DIM * 4 + 32  # bytes per key the table layout allows
SLACK = 48 << 20  # a batch's tensors and TensorFlow's allocator caches


def rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def feed(var, start, keys):
    """Looks up `keys` new keys from `start` on, BATCH at a time; yields
    (keys fed so far, RSS) after each batch."""
    for first in range(start, start + keys, BATCH):
        var.sparse_read(tf.range(first, min(first + BATCH, start + keys), dtype=tf.int64))
        yield min(first + BATCH, start + keys) - start, rss_bytes()


def fixed_mmap_threshold():
    """On TF 1.x, glibc's dynamic mmap threshold rises as TensorFlow frees its
    batch-sized tensors, which then come from the heap between the table's
    allocations: RSS creeps up by ~0.5 MiB a batch with the table's own bytes
    flat (not on TF 2.x). A fixed threshold (what MALLOC_MMAP_THRESHOLD_=131072
    sets) keeps what is measured the table's."""
    if tf.__version__.startswith("1."):
        import ctypes

        M_MMAP_THRESHOLD = -3
        ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, 128 * 1024)


def warm_up():
    fixed_mmap_threshold()
    # TensorFlow's first-call allocations (kernels, thread pools) happen here,
    # outside what is measured.
    v = sok.DynamicVariable(DIM, initializer="zeros")
    list(feed(v, -10 * BATCH, 2 * BATCH))
    del v


GPU_TABLE = ("measures host RSS; with a GPU the table lives in GPU memory, from "
             "TensorFlow's allocator (tests/test_gpu_tables.py checks that)")


@pytest.mark.cpu_only(reason=GPU_TABLE)
def test_bounded_table_stays_within_its_bound():
    warm_up()
    capacity = 1 << 15
    base = rss_bytes()
    var = sok.DynamicVariable(DIM, var_type="hybrid", init_capacity=1 << 12,
                              max_capacity=capacity, initializer="zeros")
    samples = list(feed(var, 0, 40 * capacity))  # 1.3M distinct keys, 40x the bound
    bound = capacity * ROW_BUDGET
    assert int(var.size[0]) == capacity
    assert int(var.stats()["memory_bytes"]) <= bound
    growth = [rss - base for _, rss in samples]
    assert max(growth) <= bound + SLACK, (max(growth), bound)
    # Flat once full: the last three quarters of the stream add (almost) nothing.
    full = growth[len(growth) // 4]
    assert max(growth[len(growth) // 4:]) - full <= SLACK // 3, growth


@pytest.mark.cpu_only(reason=GPU_TABLE)
def test_unbounded_table_grows_linearly_by_its_bytes_per_key():
    warm_up()
    base = rss_bytes()
    var = sok.DynamicVariable(DIM, initializer="zeros")
    samples = list(feed(var, 0, 1 << 20))
    keys = np.array([k for k, _ in samples], np.float64)
    growth = np.array([rss - base for _, rss in samples], np.float64)
    # Least-squares slope over the second half (past the small-table steps).
    half = len(keys) // 2
    slope, intercept = np.polyfit(keys[half:], growth[half:], 1)
    per_key = int(var.stats()["memory_bytes"]) / int(var.size[0])
    assert DIM * 4 <= slope <= 1.6 * ROW_BUDGET, slope
    assert per_key <= 2 * ROW_BUDGET  # storage doubles as it grows: up to 2x
    # Linear: no sample far from the fitted line (the index and storage grow
    # in doublings, so allow a few MiB of steps).
    residual = growth[half:] - (slope * keys[half:] + intercept)
    assert np.abs(residual).max() <= 24 << 20, residual
    print(f"unbounded: {slope:.1f} bytes of RSS per key; memory_bytes/key {per_key:.1f}")
