"""Mixed precision, table dtypes and bounded dynamic tables, against
independent references: plain tf.Variables trained by the same TensorFlow
or Keras optimizer, tf.nn.embedding_lookup_sparse, and a small Python
model of LRU / LFU eviction (the documented policy: a call's keys are never
evicted by it; LRU ranks by last use, LFU by use count then last use, ties
by key). A bad input must be an error naming the table and the way out."""

import tempfile
import time

import numpy as np
import pytest
import tensorflow as tf

import sok_graph as sok
from sok_graph import compat
from sok_graph.tables.dynamic import NoDenseValueError

TF1 = tf.__version__.startswith("1.")
KERAS3 = compat.KERAS_MAJOR_VERSION >= 3
V1 = tf.compat.v1


# ------------------------------------------------------------ mixed precision

def _keras_optimizers_given_a_dynamic_table():
    """name -> (make, trains): Keras' own optimizers a script may give a
    DynamicVariable's gradient outside sok.OptimizerScope; `trains`: it
    updates the table as a tf.Variable (else it must refuse it by name)."""
    if not tf.executing_eagerly():
        return {}
    found = {"sgd": (lambda: tf.keras.optimizers.SGD(0.1), KERAS3)}
    legacy = getattr(tf.keras.optimizers, "legacy", None)
    if legacy is not None and not KERAS3:  # TF 2.11-2.15: OptimizerV2 beside the newer one
        found["legacy_sgd"] = (lambda: legacy.SGD(0.1), False)
    mixed = getattr(tf.keras, "mixed_precision", None)
    if hasattr(mixed, "LossScaleOptimizer"):
        inner = legacy.SGD if legacy is not None and not KERAS3 else tf.keras.optimizers.SGD
        found["loss_scale_sgd"] = (lambda: mixed.LossScaleOptimizer(inner(0.1)), False)
    return found


@pytest.mark.parametrize("kind", sorted(_keras_optimizers_given_a_dynamic_table()) or ["none"])
def test_a_keras_optimizer_given_a_dynamic_table_trains_it_or_names_it(kind):
    """Keras 2's SGD (no slots, so nothing refused the table while making
    them) failed in TensorFlow's scatter with "Trying to access a handle's
    resource using the wrong type ... TableResource" (OptimizerV2) or
    "Cannot convert a partially known TensorShape (None, 2) to a Tensor";
    Keras 3's LossScaleOptimizer (what fit uses under mixed_float16) with
    "Tried to convert 'dims' to a tensor and failed": no word of the table
    or what to do. Each now trains the table as a tf.Variable (Keras 3's
    SGD) or raises a NoDenseValueError naming it, the table unchanged."""
    cases = _keras_optimizers_given_a_dynamic_table()
    if kind not in cases:
        pytest.skip("Keras optimizers eagerly (TF 2)")
    make, trains = cases[kind]
    table = sok.DynamicVariable(dimension=2, initializer="ones", name="given_" + kind)
    ids = tf.ragged.constant([[1, 2]], tf.int64)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(sok.lookup_sparse(table, ids, combiners="sum") * [[1.0, 3.0]])
    grads = tape.gradient(loss, [table])
    keys = tf.constant([1, 2], tf.int64)
    before = table.sparse_read(keys).numpy()
    if trains:
        make().apply_gradients(zip(grads, [table]))
        np.testing.assert_allclose(table.sparse_read(keys).numpy(),
                                   [[0.9, 0.7], [0.9, 0.7]], rtol=1e-6)
        return
    with pytest.raises(NoDenseValueError) as raised:
        make().apply_gradients(zip(grads, [table]))
    assert "given_" + kind in str(raised.value) and (
        "OptimizerScope" in str(raised.value) or "OptimizerWrapper" in str(raised.value))
    np.testing.assert_array_equal(table.sparse_read(keys).numpy(), before)


def _mixed_precision_v1():
    experimental = getattr(V1.train, "experimental", None)
    return getattr(experimental, "MixedPrecisionLossScaleOptimizer", None)


@pytest.mark.skipif(_mixed_precision_v1() is None,
                    reason="tf.compat.v1.train.experimental.MixedPrecisionLossScaleOptimizer")
def test_tf1_mixed_precision_optimizer_given_to_the_wrapper_says_what_to_do():
    """It was refused as "supports SGD, Momentum, ... got
    MixedPrecisionLossScaleOptimizer", with no word of mixed precision or
    of the way out (Keras' LossScaleOptimizer gets both)."""
    scaled = _mixed_precision_v1()(V1.train.GradientDescentOptimizer(0.1), "dynamic")
    with pytest.raises(TypeError, match=r"mixed precision MixedPrecisionLossScaleOptimizer.*"
                                        r"sok.OptimizerScope"):
        sok.OptimizerWrapper(scaled)


@pytest.mark.skipif(_mixed_precision_v1() is None,
                    reason="tf.compat.v1.train.experimental.MixedPrecisionLossScaleOptimizer")
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_tf1_mixed_precision_optimizer_in_the_scope_trains_as_tensorflow(dynamic):
    """tf.compat.v1's MixedPrecisionLossScaleOptimizer with a dynamic loss
    scale, minimize() inside sok.OptimizerScope in a Session, one step's
    loss overflowing (skipped): the rows end as a tf.Variable's trained by
    the same optimizer. On TF 1.15 a DynamicVariable failed with "Tensor
    conversion requested for IndexedSlices without dense_shape" (its
    finite check converts every gradient to a dense tensor), naming no
    table; TF 2.x trains it."""
    start = np.linspace(-1, 1, 12, dtype=np.float32).reshape(6, 2)
    with tf.Graph().as_default():
        if dynamic:
            table = sok.DynamicVariable(2, name="mp_dyn", initializer="zeros")
            plain = V1.get_variable("plain", initializer=np.zeros((6, 2), np.float32))
        else:
            table = sok.Variable(start, name="mp_static")
            plain = V1.get_variable("plain", initializer=start)
        label = V1.placeholder(tf.float32, [])
        ids = tf.ragged.constant([[0, 1], [3]], tf.int64)
        got = sok.lookup_sparse(table, ids, combiners="sum")
        want = tf.nn.embedding_lookup_sparse(plain, ids.to_sparse(), None, combiner="sum")

        def make():
            return _mixed_precision_v1()(V1.train.GradientDescentOptimizer(0.01), "dynamic")

        with sok.OptimizerScope([table]):
            train = make().minimize(tf.reduce_sum((got - label) ** 2), var_list=[table])
        train_plain = make().minimize(tf.reduce_sum((want - label) ** 2), var_list=[plain])
        with V1.Session() as sess:
            sess.run(V1.global_variables_initializer())
            for value in (1.0, 3e38, 2.0, 1.0):  # the second step overflows
                sess.run([train, train_plain], {label: value})
            expected = sess.run(plain)
            if dynamic:
                keys, rows = sess.run(sok.export(table))
                rows_now = np.zeros((6, 2), np.float32)
                rows_now[keys] = rows
            else:
                rows_now = sess.run(table)
    assert np.all(np.isfinite(expected)) and not np.allclose(expected, 0 if dynamic else start)
    np.testing.assert_allclose(rows_now, expected, rtol=1e-6, atol=1e-7)


def _set_policy(name):
    mixed = tf.keras.mixed_precision
    if hasattr(mixed, "set_global_policy"):
        mixed.set_global_policy(name)
    else:
        mixed.experimental.set_policy(name)


@pytest.mark.skipif(TF1 or KERAS3 or not hasattr(tf.keras.mixed_precision, "set_global_policy"),
                    reason="Keras 2's mixed precision fit (TF 2.4-2.15); Keras 3's "
                           "LossScaleOptimizer is refused inside the scope by design")
@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_a_mixed_precision_fit_in_the_scope_trains_as_plain_keras(policy):
    """model.fit of a model holding a sok.Variable and a DynamicVariable
    under a mixed-precision policy (compile() wraps SGD in a
    LossScaleOptimizer for mixed_float16), inside sok.OptimizerScope: the
    tables, and the dense kernel, end as the same model's on Keras weights
    read by tf.nn.embedding_lookup_sparse (float16 rounding apart)."""
    rows, dim = 8, 2
    start = np.linspace(-0.5, 0.5, rows * dim, dtype=np.float32).reshape(rows, dim)
    kernel = np.linspace(0.2, 1.0, 2 * dim, dtype=np.float32).reshape(2 * dim, 1)
    rng = np.random.RandomState(0)
    ids = rng.randint(0, rows, (12, 2)).astype(np.int64)
    labels = rng.normal(size=(12, 1)).astype(np.float32)

    def dense():
        return tf.keras.layers.Dense(1, use_bias=False,
                                     kernel_initializer=tf.keras.initializers.Constant(kernel))

    def sparse(x):
        return tf.RaggedTensor.from_tensor(x).to_sparse()

    class SokModel(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.table = sok.Variable(start)
            self.hashed = sok.DynamicVariable(dim, initializer="zeros")
            self.dense = dense()

        def call(self, x):
            a, b = sok.lookup_sparse([self.table, self.hashed], [sparse(x[:, :1]), sparse(x[:, 1:])],
                                     combiners=["sum", "sum"])
            return self.dense(tf.concat([a, b], 1))

    class PlainModel(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.table = self.add_weight(name="t", shape=(rows, dim),
                                         initializer=tf.keras.initializers.Constant(start))
            self.hashed = self.add_weight(name="h", shape=(rows, dim), initializer="zeros")
            self.dense = dense()

        def call(self, x):
            a = tf.nn.embedding_lookup_sparse(tf.convert_to_tensor(self.table), sparse(x[:, :1]),
                                              None, combiner="sum")
            b = tf.nn.embedding_lookup_sparse(tf.convert_to_tensor(self.hashed), sparse(x[:, 1:]),
                                              None, combiner="sum")
            return self.dense(tf.concat([a, b], 1))

    _set_policy(policy)
    try:
        got, want = SokModel(), PlainModel()
        for model in (got, want):
            model.compile(optimizer=tf.keras.optimizers.SGD(0.1), loss="mse")
        got(ids[:1])
        with sok.OptimizerScope([got.table, got.hashed]):
            got.fit(ids, labels, batch_size=4, epochs=2, shuffle=False, verbose=0)
        want.fit(ids, labels, batch_size=4, epochs=2, shuffle=False, verbose=0)
    finally:
        _set_policy("float32")
    tol = dict(rtol=0, atol=2e-3 if policy == "mixed_float16" else 2e-2)
    assert not np.allclose(want.table.numpy(), start, atol=0.05)  # it trained
    np.testing.assert_allclose(got.table.numpy(), want.table.numpy(), **tol)
    keys, values = [t.numpy() for t in sok.export(got.hashed)]
    hashed = np.zeros((rows, dim), np.float32)
    hashed[keys] = values
    np.testing.assert_allclose(hashed, want.hashed.numpy(), **tol)
    np.testing.assert_allclose(got.dense.kernel.numpy(), want.dense.kernel.numpy(), **tol)


# ----------------------------------------------------- tables of other dtypes

@pytest.mark.parametrize("table_dtype", ["float16", "bfloat16"])
def test_low_precision_tables_look_up_and_train_as_tf_variables(table_dtype):
    """A float16 / bfloat16 sok.Variable read with weights of every float
    dtype (cast to the table's, as TensorFlow casts them) and every
    combiner, then trained by sok.OptimizerWrapper(SGD / Adagrad): the
    outputs and rows equal tf.nn.embedding_lookup_sparse on a tf.Variable
    trained by the same optimizer (distinct ids per step: Keras 3 squares a
    repeated id's gradients one by one, a documented difference)."""
    dtype = tf.as_dtype(table_dtype)
    ulps = 2e-3 if dtype == tf.float16 else 1.6e-2  # two units in the last place
    rng = np.random.RandomState(1)
    start = (rng.standard_normal((6, 3)) * 2).astype(np.float32)
    ids = tf.ragged.constant([[0, 1], [3], [5, 2]], tf.int64)
    weights = [0.3, 2.5, 7.0, 0.1, 1.3]
    for weight_dtype in (tf.float64, tf.float32, tf.float16, tf.bfloat16):
        w = tf.RaggedTensor.from_row_splits(tf.constant(weights, weight_dtype), ids.row_splits)
        for combiner in ("sum", "mean", "sqrtn"):
            got = sok.lookup_sparse(sok.Variable(tf.cast(start, dtype)), ids, w,
                                    combiners=combiner)
            want = tf.nn.embedding_lookup_sparse(tf.cast(start, dtype), ids.to_sparse(),
                                                 w.to_sparse(), combiner=combiner)
            assert got.dtype == dtype
            # Two ulps apart at most, of the terms added: the two round their
            # products and sums in another order and precision (on a GPU
            # too), so a sum that cancels is compared by its terms' size.
            terms = np.abs(start).max() * max(weights)
            np.testing.assert_allclose(tf.cast(got, tf.float32).numpy(),
                                       tf.cast(want, tf.float32).numpy(), atol=ulps * terms,
                                       rtol=ulps,
                                       err_msg=f"{weight_dtype.name} weights, {combiner}")
    makers = {"sgd": lambda: tf.keras.optimizers.SGD(0.1),
              "adagrad": lambda: tf.keras.optimizers.Adagrad(0.1)}
    for name, make in makers.items():
        table, plain = sok.Variable(tf.cast(start, dtype)), tf.Variable(tf.cast(start, dtype))
        wrapper, native = sok.OptimizerWrapper(make()), make()
        for _ in range(3):
            with tf.GradientTape() as tape:
                out = sok.lookup_sparse(table, ids, combiners="sum")
                loss = tf.reduce_sum(tf.cast(out, tf.float32) ** 2)
            wrapper.apply_gradients(zip(tape.gradient(loss, [table]), [table]))
            with tf.GradientTape() as tape:
                out = tf.nn.embedding_lookup_sparse(plain, ids.to_sparse(), None,
                                                    combiner="sum")
                loss = tf.reduce_sum(tf.cast(out, tf.float32) ** 2)
            native.apply_gradients(zip(tape.gradient(loss, [plain]), [plain]))
        want = tf.cast(plain, tf.float32).numpy()
        assert not np.allclose(want, tf.cast(tf.cast(start, dtype), tf.float32).numpy()), name
        # An ulp or two apart: the two sum the rows' gradients in another
        # order (a row near zero by the rows' size).
        np.testing.assert_allclose(tf.cast(table, tf.float32).numpy(), want, err_msg=name,
                                   rtol=ulps, atol=ulps * np.abs(want).max())



def _bits(x):
    """The bit patterns of a 16-bit float tensor (numpy uint16)."""
    return tf.bitcast(x, tf.uint16).numpy()


@pytest.mark.skipif(not tf.config.experimental.list_physical_devices("GPU"),
                    reason="needs a GPU that TensorFlow sees")
@pytest.mark.parametrize("table_dtype", ["float16", "bfloat16"])
def test_low_precision_lookups_on_the_gpu_equal_the_cpus_bit_for_bit(table_dtype):
    """The fused lookup of a float16 / bfloat16 table on a GPU (its kernels
    compute in float32 and round once, as the CPU kernel does): outputs and
    gradients equal the CPU kernel's bit for bit, for every combiner, with
    weights and max_norm, rows of 4k and other widths, and samples without
    ids. sok.lookup_sparse on such a sok.Variable runs on the GPU (it failed
    placement: no GPU kernel for half types) and equals the CPU's rows."""
    from sok_graph.ops import lookup as lookup_ops

    dtype = tf.as_dtype(table_dtype)
    rng = np.random.RandomState(3)
    lengths = rng.randint(0, 6, size=40)
    ids = tf.constant(rng.randint(0, 50, lengths.sum()), tf.int64)
    splits = tf.constant(np.concatenate([[0], np.cumsum(lengths)]), tf.int64)
    weights = tf.constant(rng.uniform(0.1, 3.0, lengths.sum()), dtype)
    for dim in (8, 3):
        params = tf.constant(rng.standard_normal((50, dim)) * 2, dtype)
        upstream = tf.constant(rng.standard_normal((40, dim)), dtype)
        for combiner, max_norm in (("sum", None), ("mean", 1.5), ("sqrtn", None)):
            got = {}
            for device in ("/CPU:0", "/GPU:0"):
                with tf.device(device):
                    table = tf.identity(params)
                    with tf.GradientTape() as tape:
                        tape.watch(table)
                        out = lookup_ops.fused_lookup([table], [ids], [splits],
                                                      weights=[weights], combiners=[combiner],
                                                      max_norms=[max_norm])[0]
                    grad = tape.gradient(out, table, output_gradients=upstream)
                assert device[1:4] in out.device, (device, out.device)
                got[device] = (_bits(out), grad.indices.numpy(), _bits(grad.values))
            case = f"dim {dim}, {combiner}, max_norm {max_norm}"
            for want, have, what in zip(got["/CPU:0"], got["/GPU:0"],
                                        ("outputs", "gradient ids", "gradient rows")):
                np.testing.assert_array_equal(have, want, err_msg=f"{what}: {case}")
    soft = tf.config.get_soft_device_placement()
    tf.config.set_soft_device_placement(False)  # a CPU fallback would hide a missing kernel
    try:
        start = rng.standard_normal((50, 8)).astype(np.float32)
        ragged = tf.RaggedTensor.from_row_splits(ids, splits)
        rows = {}
        for device in ("/CPU:0", "/GPU:0"):
            with tf.device(device):
                table = sok.Variable(tf.cast(start, dtype))
                rows[device] = _bits(sok.lookup_sparse(table, ragged, combiners="mean"))
        np.testing.assert_array_equal(rows["/GPU:0"], rows["/CPU:0"])
    finally:
        tf.config.set_soft_device_placement(soft)


_WITH_BETAS = {"adam": lambda: tf.keras.optimizers.Adam(0.01),
               "adamax": lambda: tf.keras.optimizers.Adamax(0.01)}


@pytest.mark.parametrize("name", sorted(_WITH_BETAS))
def test_a_float16_table_trains_as_a_keras_optimizer_trains_a_tf_variable(name):
    """A float16 sok.Variable trained by sok.OptimizerWrapper of Keras'
    Adam / Adamax, the same rows each step: the rows move as the same
    optimizer moves a float16 tf.Variable's (within 0.5% of how far they
    moved: float16 rounding apart). The wrapper took 1 - float16(0.999)
    (0.00097656) where Keras takes 1 - 0.999 (0.0010004), and 1 -
    float16(0.9) for 1 - 0.9: Adam's second moment grew 2.4% slower, the
    rows 2% of their movement off after 30 steps (Adamax 1%). (Keras 2's
    OptimizerV2 and tf.compat.v1 subtract after the cast, as before.)"""
    rng = np.random.RandomState(2)
    start = rng.standard_normal((6, 3)).astype(np.float16)
    ids = tf.constant([0, 3, 5], tf.int64)
    table, plain = sok.Variable(start), tf.Variable(start)
    wrapper, native = sok.OptimizerWrapper(_WITH_BETAS[name]()), _WITH_BETAS[name]()
    for _ in range(30):
        grad = tf.IndexedSlices(tf.constant(rng.standard_normal((3, 3)).astype(np.float16)), ids,
                                tf.constant([6, 3], tf.int64))
        wrapper.apply_gradients([(grad, table)])
        native.apply_gradients([(grad, plain)])
    # The rows read (Keras 2's Adamax makes the others NaN: 0 / float16(1e-7)).
    got, want = [x.astype(np.float64)[[0, 3, 5]] for x in (table.numpy(), plain.numpy())]
    moved = np.abs(want - start[[0, 3, 5]]).max()
    assert moved > 0.03
    assert np.abs(got - want).max() <= 0.005 * moved, (name, got, want)


# ------------------------------------------------------- bounded dynamic tables

CAPACITY = 8


class _EvictionModel:
    """The documented policy, call by call: the call's distinct keys are
    used at a new time (a read counts one use per distinct key); new keys
    need room, made by evicting keys the call does not use, least recently
    used first (LRU) or least used first, then least recently (LFU); ties
    by key."""

    def __init__(self, policy):
        self.policy, self.last, self.uses, self.clock = policy, {}, {}, 0

    def read(self, keys):
        self.clock += 1
        distinct = list(dict.fromkeys(keys))
        new = [k for k in distinct if k not in self.last]
        for k in distinct:
            if k in self.last:
                self.last[k], self.uses[k] = self.clock, self.uses[k] + 1
        excess = len(self.last) + len(new) - CAPACITY
        evicted = []
        if excess > 0:
            candidates = [k for k in self.last if self.last[k] != self.clock]
            if self.policy == "lru":
                candidates.sort(key=lambda k: (self.last[k], k))
            else:
                candidates.sort(key=lambda k: (self.uses[k], self.last[k], k))
            evicted = candidates[:excess]
            for k in evicted:
                del self.last[k], self.uses[k]
        for k in new:
            self.last[k], self.uses[k] = self.clock, 1
        return evicted


def _bounded(policy, key_type, name="bounded"):
    return sok.DynamicVariable(2, var_type="hybrid", init_capacity=4, max_capacity=CAPACITY,
                               evict_strategy=policy, key_type=key_type, initializer="zeros",
                               name=name)


def _keys_held(table):
    return set(sok.export(table)[0].numpy().tolist())


def _batches(key_type, seed, count):
    top = np.iinfo(key_type.as_numpy_dtype).max
    pool = [0, 1, 2, 3, -1, -5, 7, 9, 11, 12, 13, 100, -2 ** 20, top, top - 1, -top - 1]
    rng = np.random.RandomState(seed)
    out = []
    while len(out) < count:
        keys = [int(k) for k in rng.choice(pool, rng.randint(1, 12))]
        if len(set(keys)) <= CAPACITY:
            out.append(keys)
    return out


@pytest.mark.parametrize("policy", ["lru", "lfu"])
@pytest.mark.parametrize("key_type", [tf.int64, tf.int32], ids=["int64", "int32"])
def test_a_bounded_table_evicts_exactly_the_documented_victims(policy, key_type):
    """Batches of repeated, negative and extreme keys (INT_MIN, INT_MAX of
    the key type), some larger than the bound in positions but not in
    distinct keys, read by lookup_sparse and sparse_read in turn: after
    every call the table holds exactly the model's keys, and
    sparse_read_and_evict reports exactly the model's victims, with the
    rows they had."""
    table, model = _bounded(policy, key_type), _EvictionModel(policy)
    for step, keys in enumerate(_batches(key_type, seed=3, count=30)):
        ids = tf.constant(keys, key_type)
        if step % 3 == 0:
            sok.lookup_sparse(table, tf.RaggedTensor.from_row_lengths(ids, [len(keys)]),
                              combiners="sum")
            model.read(keys)
        elif step % 3 == 1:
            table.sparse_read(ids)
            model.read(keys)
        else:
            held = dict(zip(*[t.numpy().tolist() for t in sok.export(table)]))
            _, evicted, rows = sok.sparse_read_and_evict(table, ids)
            want = model.read(keys)
            assert sorted(evicted.numpy().tolist()) == sorted(want), (step, keys)
            for key, row in zip(evicted.numpy().tolist(), rows.numpy().tolist()):
                assert row == held[key], (step, key)
        assert _keys_held(table) == set(model.last), (step, keys)


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "tf_function"])
def test_two_features_sharing_a_bounded_table_past_its_bound_are_refused_unchanged(in_function):
    """lookup_sparse([v, v], ...) whose two reads hold more distinct keys
    together than the table's max_capacity, each alone within it: refused
    before anything changes, as one read of those keys is. Checked read by
    read, the second read evicted a key the first had just read (its row
    already in the output), and only the update failed, with the table
    changed. Within the bound, the call reads every row as two lookups of
    a plain tf.Variable holding the rows the table held do."""
    table = sok.DynamicVariable(2, var_type="hybrid", max_capacity=CAPACITY, initializer="ones",
                                evict_strategy="lfu", name="shared")
    old = list(range(100, 100 + CAPACITY))
    for _ in range(3):
        table.sparse_read(tf.constant(old, tf.int64))  # full, each key used three times

    def lookup(first, second):
        return sok.lookup_sparse([table, table], [tf.ragged.constant([first], tf.int64),
                                                  tf.ragged.constant([second], tf.int64)],
                                 combiners=["sum", "sum"])

    call = tf.function(lookup) if in_function else lookup
    held = dict(zip(*[t.numpy().tolist() for t in sok.export(table)]))
    first, second = old[:CAPACITY - 1] + [1], [2]  # 1 and 2 new: CAPACITY + 1 distinct keys
    refused = r"(?s)shared.{0,4}: the batch has more distinct keys than its max_capacity"
    with pytest.raises(tf.errors.InvalidArgumentError, match=refused):
        call(first, second)
    assert dict(zip(*[t.numpy().tolist() for t in sok.export(table)])) == held

    first, second = old[:CAPACITY - 1], old[1:]
    a, b = call(first, second)
    plain = tf.Variable(np.array([held[k] for k in old], np.float32))
    want = [tf.reduce_sum(tf.gather(plain, [old.index(k) for k in keys]), 0)
            for keys in (first, second)]
    np.testing.assert_array_equal(a.numpy()[0], want[0].numpy())
    np.testing.assert_array_equal(b.numpy()[0], want[1].numpy())
    assert _keys_held(table) == set(old)


@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_a_bounded_table_loaded_from_a_dump_evicts_as_the_one_dumped(policy):
    """sok.dump of a full bounded table, sok.load into a fresh one: both
    then evict the same keys, call after call (the last-use times and use
    counts came back), and their rows stay equal under training."""
    first, second = _bounded(policy, tf.int64, "evicting"), _bounded(policy, tf.int64, "evicting")
    batches = _batches(tf.int64, seed=5, count=40)
    for keys in batches[:15]:
        first.sparse_read(tf.constant(keys, tf.int64))
    path = tempfile.mkdtemp()
    sok.dump(path, [first])
    sok.load(path, [second])
    assert _keys_held(first) == _keys_held(second)
    for step, keys in enumerate(batches[15:]):
        for table in (first, second):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(sok.lookup_sparse(
                    table, tf.ragged.constant([keys], tf.int64), combiners="sum"))
            (grad,) = tape.gradient(loss, [table])
            sok.SGD(0.1).apply_gradients([(grad, table)])
        assert _keys_held(first) == _keys_held(second), (policy, step, keys)
    a = dict(zip(*[t.numpy().tolist() for t in sok.export(first)]))
    b = dict(zip(*[t.numpy().tolist() for t in sok.export(second)]))
    assert a == b


def test_rows_imported_with_later_timestamps_are_evicted_before_rows_used_after():
    """import_rows with timestamps ahead of this machine's clock (a dump
    from a machine whose clock ran ahead, or the caller's own): the table's
    clock moves past them, so a key used after the import is the most
    recently used. It kept the wall clock, and LRU evicted the key just
    used before the imported ones (the Python model: the keys in order of
    last use). Timestamps outside [0, 2^62) are refused by name: the clock
    must count on past the latest."""
    table = _bounded("lru", tf.int64, "ahead")
    ahead = int(time.time() * 1e6) + 3600 * 10 ** 6  # an hour ahead
    held = list(range(10, 10 + CAPACITY))
    table.import_rows(tf.constant(held, tf.int64), tf.zeros([CAPACITY, 2]),
                      timestamps=tf.constant([ahead + i for i in range(CAPACITY)], tf.int64))
    table.sparse_read(tf.constant([1], tf.int64))  # full: evicts the oldest imported, 10
    table.sparse_read(tf.constant([2], tf.int64))  # evicts 11, not 1, used a call before
    assert _keys_held(table) == set(held[2:] + [1, 2])
    for bad in (-1, 2 ** 62):
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"timestamps must be in"):
            table.import_rows(tf.constant([5], tf.int64), tf.zeros([1, 2]),
                              timestamps=tf.constant([bad], tf.int64))
