"""The dynamic table's initial rows, bit for bit, against a NumPy port of
the recipe in tf_ops/dynamic/core/random_draws.h.

The recipe is defined by correctly rounded float32 operations only, so NumPy
(whose float32 +, -, *, / and sqrt are IEEE operations) must reproduce the
op library's rows exactly; so must the GPU table (tests/gpu/table_checks.py).
The port takes its own route where it can: the exponent split by np.frexp,
the angle by float64 arithmetic, the quarter-turn rotation by a loop.
"""

import numpy as np
import pytest
import tensorflow as tf

from sok_graph.ops import dynamic as dyn

F32 = np.float32
U64 = np.uint64
MASK64 = (1 << 64) - 1


def splitmix64(x):
    x = np.asarray(x, dtype=U64)
    with np.errstate(over="ignore"):
        x = x + U64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> U64(30))) * U64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> U64(27))) * U64(0x94D049BB133111EB)
    return x ^ (x >> U64(31))


def seed_key(seed, keys):
    s = splitmix64(np.array([(seed ^ 0x5851F42D4C957F2D) & MASK64], dtype=U64))[0]
    return s ^ splitmix64(np.asarray(keys, dtype=np.int64).view(U64))


def draw_bits(sk, counter):
    with np.errstate(over="ignore"):
        c = U64((counter * 0xD1B54A32D192ED03) & MASK64)
    return splitmix64(sk ^ c)


def poly(coeffs, y):
    p = np.full_like(y, F32(coeffs[0]))
    for c in coeffs[1:]:
        p = p * y + F32(c)
    return p


LOG_R = (0.23332141, 0.28550756, 0.40000123, 0.6666667)
SIN = (-0.004601658, 0.07968003, -0.6459635, 1.5707964)
COS = (0.000903363, -0.020859936, 0.25366917, -1.2337005, 1.0)


def normal_pair(bits):
    """The two standard normals (float32) of Box-Muller pairs with hashes `bits`."""
    bits = np.asarray(bits, dtype=U64)
    x = ((bits >> U64(33)) | U64(1)).astype(np.int32).astype(F32)
    half, e2 = np.frexp(x.astype(np.float64))  # x = half * 2^e2, half in [0.5, 1)
    high = half.astype(F32) >= F32(0.70710677)
    m = np.where(high, half, 2.0 * half).astype(F32)
    e = np.where(high, e2, e2 - 1)
    f = m - F32(1)
    s = f / (F32(2) + f)
    y = s * s
    log1pf = (s + s) + s * (y * poly(LOG_R, y))
    k = (31 - e).astype(F32)
    neg_log = k * F32(0.693145751953125) + (k * F32(1.4286068e-06) - log1pf)
    r = np.sqrt(neg_log + neg_log)
    turn = ((bits & U64((1 << 26) - 1)).astype(np.float64) + 0.5) / 2.0 ** 24  # quarter turns
    q = np.floor(turn + 0.5)
    t = (turn - q).astype(F32)
    yt = t * t
    c, sn = poly(COS, yt), t * poly(SIN, yt)
    quadrant = q.astype(np.int64) % 4
    for _ in range(3):  # rotate by a quarter turn where quadrant > 0
        turn_more = quadrant > 0
        c, sn = np.where(turn_more, -sn, c), np.where(turn_more, c, sn)
        quadrant = np.where(turn_more, quadrant - 1, quadrant)
    return r * c, r * sn


def normal_draw(sk, j):
    z0, z1 = normal_pair(draw_bits(sk, j // 2))
    return z1 if j % 2 else z0


def expected_rows(kind, keys, dim, seed, mean=0.0, stddev=1.0, minval=0.0, maxval=1.0):
    sk = seed_key(seed, keys)
    n = len(keys)
    rows = np.empty((n, dim), F32)
    if kind == "uniform":
        span = float(F32(maxval) - F32(minval))
        for d in range(dim):
            u = ((draw_bits(sk, d) >> U64(11)).astype(np.float64) + 0.5) / 2.0 ** 53
            v = (float(F32(minval)) + span * u).astype(F32)
            top = (v >= F32(maxval)) & (F32(maxval) > F32(minval))
            rows[:, d] = np.where(top, np.nextafter(F32(maxval), F32(minval)), v)
        return rows
    z = np.stack([normal_draw(sk, d) for d in range(dim)], axis=1).astype(F32)
    if kind == "truncated_normal":
        for i in range(n):
            counter = dim
            for d in range(dim):
                while abs(z[i, d]) > F32(2):
                    z[i, d] = normal_draw(sk[i:i + 1], counter)[0]
                    counter += 1
    return F32(mean) + F32(stddev) * z


def table_rows(keys, dim, **kwargs):
    handle = dyn.handle(f"init{np.random.randint(1 << 40)}")
    dyn.create(handle, tf.int64, dim, kwargs)
    rows = dyn.find_or_insert(handle, tf.constant(keys, tf.int64), dim)[0].numpy()
    again = dyn.find(handle, tf.constant(keys, tf.int64), dim, tf.constant(0.0))[0].numpy()
    np.testing.assert_array_equal(rows.view(np.uint32), again.view(np.uint32))
    return rows


def some_keys(n):
    i64 = np.iinfo(np.int64)
    rng = np.random.default_rng(11)
    special = [0, 1, -1, 2, 42, i64.min, i64.min + 1, i64.max, i64.max - 1, 1 << 40, -(1 << 40)]
    rand = rng.integers(i64.min, i64.max, size=n, dtype=np.int64)
    return np.unique(np.concatenate([np.array(special, np.int64), rand]))


@pytest.mark.parametrize("dim", [1, 2, 7, 16, 33])
@pytest.mark.parametrize("seed", [0, 12345])
def test_normal_rows_bit_identical_to_numpy_port(dim, seed):
    keys = some_keys(3000)
    got = table_rows(keys, dim, initializer="normal", mean=0.5, stddev=0.05, seed=seed)
    want = expected_rows("normal", keys, dim, seed, mean=0.5, stddev=0.05)
    bad = np.argwhere(got.view(np.uint32) != want.view(np.uint32))
    assert bad.size == 0, f"{len(bad)} values differ, first at {bad[0]}: {got[tuple(bad[0])]!r} vs {want[tuple(bad[0])]!r}"


@pytest.mark.parametrize("dim", [3, 16])
def test_truncated_normal_rows_bit_identical_to_numpy_port(dim):
    keys = some_keys(800)
    got = table_rows(keys, dim, initializer="truncated_normal", mean=-1.0, stddev=2.0, seed=9)
    want = expected_rows("truncated_normal", keys, dim, 9, mean=-1.0, stddev=2.0)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    assert np.all(np.abs(got + 1.0) <= 4.0)
    # The redraw path ran: some first draws were beyond two stddevs.
    sk = seed_key(9, keys)
    first = np.stack([normal_draw(sk, d) for d in range(dim)], axis=1)
    assert np.sum(np.abs(first) > 2) > 20


def test_uniform_rows_bit_identical_to_numpy_port():
    keys = some_keys(2000)
    got = table_rows(keys, 5, initializer="uniform", minval=-0.25, maxval=0.75, seed=3)
    want = expected_rows("uniform", keys, 5, 3, minval=-0.25, maxval=0.75)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_numpy_port_is_a_standard_normal():
    # The port itself against closed-form moments (so a port that agreed
    # with a broken library would still be caught).
    bits = splitmix64(np.arange(1 << 18, dtype=U64))
    z = np.concatenate(normal_pair(bits)).astype(np.float64)
    assert abs(z.mean()) < 0.006
    assert abs(z.std() - 1.0) < 0.005
    assert abs(np.mean(np.abs(z) < 1.0) - 0.6826895) < 0.003
    assert np.max(np.abs(z)) < 6.56
