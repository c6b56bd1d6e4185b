"""Bucketing by owner and local-row mapping against numpy."""

import numpy as np
import pytest
import tensorflow as tf

from sok_graph.ops import sharding


@pytest.mark.parametrize("dtype", [tf.int32, tf.int64])
@pytest.mark.parametrize("world_size", [1, 2, 3, 8])
@pytest.mark.parametrize("non_negative", [False, True], ids=["checked", "unchecked"])
def test_bucketize_distributed(rng, dtype, world_size, non_negative):
    """The same buckets whether the op checks for negative ids (and reads
    that back on a GPU) or the caller vouches there are none."""
    ids = rng.integers(0, 1000, size=257).astype(dtype.as_numpy_dtype)
    ids[:3] = [0, np.iinfo(dtype.as_numpy_dtype).max, 0]
    b = sharding.bucketize_by_owner(tf.constant(ids), world_size, non_negative=non_negative)
    owners = ids.astype(np.int64) % world_size
    order = np.argsort(owners, kind="stable")  # independent stable sort
    np.testing.assert_array_equal(b.permutation.numpy(), order)
    np.testing.assert_array_equal(b.ids.numpy(), ids[order])
    np.testing.assert_array_equal(b.sizes.numpy(), np.bincount(owners, minlength=world_size))
    np.testing.assert_array_equal(b.ids.numpy()[b.inverse_permutation.numpy()], ids)
    rows = tf.gather(b.ids, b.inverse_permutation)  # un-permute by gathering
    np.testing.assert_array_equal(rows.numpy(), ids)


def test_bucketize_fixed_owner(rng):
    ids = rng.integers(0, 50, size=40)
    b = sharding.bucketize_by_owner(tf.constant(ids), 4, fixed_owner=2)
    np.testing.assert_array_equal(b.sizes.numpy(), [0, 0, 40, 0])
    np.testing.assert_array_equal(b.ids.numpy(), ids)
    np.testing.assert_array_equal(b.permutation.numpy(), np.arange(40))


def test_bucketize_empty():
    b = sharding.bucketize_by_owner(tf.zeros([0], tf.int64), 3)
    assert b.ids.shape == (0,)
    np.testing.assert_array_equal(b.sizes.numpy(), [0, 0, 0])


def test_bucketize_rejects_negative_ids():
    with pytest.raises(tf.errors.InvalidArgumentError, match="got -5 at position 1"):
        sharding.bucketize_by_owner(tf.constant([1, -5], tf.int64), 2)


def test_bucketize_rejects_bad_owner():
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="fixed_owner"):
        sharding.bucketize_by_owner(tf.constant([1], tf.int64), 2, fixed_owner=2)


def test_bucketize_rejects_bad_world_size():
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="world_size"):
        sharding.bucketize_by_owner(tf.constant([1], tf.int64), 0)


@pytest.mark.parametrize("world_size", [1, 2, 5])
def test_local_rows(rng, world_size):
    ids = rng.integers(0, 10**12, size=100)
    np.testing.assert_array_equal(sharding.local_rows(tf.constant(ids), world_size).numpy(),
                                  ids // world_size)


def test_local_rows_of_global_table_layout():
    # 2 workers, 15 rows: worker 0 holds 8 rows (0, 2, ..., 14), worker 1 holds 7
    ids = np.arange(15)
    b = sharding.bucketize_by_owner(tf.constant(ids), 2)
    np.testing.assert_array_equal(b.sizes.numpy(), [8, 7])
    local = sharding.local_rows(b.ids, 2).numpy()
    np.testing.assert_array_equal(local, list(range(8)) + list(range(7)))


def test_local_rows_rejects_negative():
    with pytest.raises(tf.errors.InvalidArgumentError, match="got -1 at position 0"):
        sharding.local_rows(tf.constant([-1, 3], tf.int32), 2)
