"""The single-process Python surface: init, Variable, lookup_sparse."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf
from conftest import run_in_graph

import sok_graph as sok
from sok_graph.compat import keras as keras_compat
from sok_graph import context


def test_sparse_operation_kit_is_sok_graph():
    import sparse_operation_kit as sok2
    import sparse_operation_kit.distributed_variable as dv2
    import sparse_operation_kit.dynamic_variable as dyn2
    from sparse_operation_kit.dynamic_variable import DynamicVariable

    import sok_graph.tables.dynamic as dyn
    import sok_graph.tables.static as dv

    assert sok2.lookup_sparse is sok.lookup_sparse
    assert sok2.Variable is sok.Variable
    # SOK's module names reach sok_graph's table modules.
    assert dv2 is dv and dyn2 is dyn
    assert DynamicVariable is sok.DynamicVariable


def test_init_without_legacy_optimizers_leaves_keras_alone():
    before = tf.keras.optimizers, dict(vars(tf.keras.optimizers))
    sok.init(comm_tool="none", use_legacy_optimizer=False)
    assert (tf.keras.optimizers, dict(vars(tf.keras.optimizers))) == before


def test_init_rejects_unknown_comm_tool():
    with pytest.raises(ValueError, match="comm_tool.*'mpi'"):
        sok.init(comm_tool="mpi")


@pytest.mark.parametrize("names", [("SOK_GRAPH_RANK", "SOK_GRAPH_WORLD_SIZE"),
                                   ("HOROVOD_RANK", "HOROVOD_SIZE"),
                                   ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")],
                         ids=["launcher", "horovodrun", "mpirun"])
def test_init_in_one_of_several_workers_needs_an_engine_that_joins_them(monkeypatch, names):
    """Under `python -m sok_graph.launch -np 2` (or horovodrun, mpirun)
    without hvd.init(), sok.init() made each worker a single process: two
    independent trainings, each on half the data with its own whole table,
    and no error. The default engine, "tf" without a multi-worker strategy,
    and sok.Init are RuntimeErrors naming the worker and what to call now;
    comm_tool="none" still makes an independent process."""
    for key in list(os.environ):
        if key.startswith(("SOK_GRAPH_", "HOROVOD_", "OMPI_COMM_WORLD_")):
            monkeypatch.delenv(key)
    rank, size = names
    monkeypatch.setenv(rank, "1")
    monkeypatch.setenv(size, "2")
    context.reset()
    keras_optimizers = tf.keras.optimizers
    with pytest.raises(RuntimeError, match=r"worker 1 of 2 .*comm_tool='horovod' found nothing "
                                           r"joining the workers.*Call hvd.init\(\)"):
        sok.init()
    assert tf.keras.optimizers is keras_optimizers  # a refused init rebinds nothing
    with pytest.raises(RuntimeError, match=r"comm_tool='tf' .*MultiWorkerMirroredStrategy"):
        sok.init(comm_tool="tf")
    with pytest.raises(RuntimeError, match="worker 1 of 2"):
        sok.Init(global_batch_size=2)
    assert context.active() is None  # nothing was set up
    comm = sok.init(comm_tool="none")
    assert (comm.world_size, comm.rank) == (1, 0)
    monkeypatch.setenv(size, "1")
    monkeypatch.setenv(rank, "0")
    assert sok.init().world_size == 1


def test_lookup_before_init_says_to_call_init():
    context.reset()
    with pytest.raises(RuntimeError, match=r"call sok.init\(\)"):
        sok.lookup_sparse(tf.ones([2, 2]), tf.ragged.constant([[0]], tf.int64))


def test_variable_behaves_like_tf_variable(tmp_path, rng):
    init = rng.standard_normal((15, 4)).astype(np.float32)
    v = sok.Variable(init, name="emb")
    assert isinstance(v, tf.Variable) and v.trainable
    assert v.global_shape == (15, 4) and v.mode == "distributed" and v.target_gpu == -1
    np.testing.assert_array_equal(v.numpy(), init)
    v.assign(tf.zeros_like(init))
    assert float(tf.reduce_sum(v)) == 0.0

    class M(tf.Module):
        def __init__(self):
            self.table = sok.Variable(init)

    m = M()
    assert m.table in m.trainable_variables
    ckpt = tf.train.Checkpoint(m=m)
    path = ckpt.save(str(tmp_path / "ck"))
    m.table.assign(tf.zeros_like(init))
    ckpt.restore(path)
    np.testing.assert_array_equal(m.table.numpy(), init)


def test_variable_modes():
    assert sok.Variable(tf.zeros([3, 2]), mode="localized:0").mode == "localized:0"
    with pytest.raises(ValueError, match=r"localized:1.*\[0, 1\)"):
        sok.Variable(tf.zeros([3, 2]), mode="localized:1")
    with pytest.raises(ValueError, match="'distributed' or 'localized:<rank>'.*'sharded'"):
        sok.Variable(tf.zeros([3, 2]), mode="sharded")
    with pytest.raises(ValueError, match=r"\[rows, dim\].*\[3\]"):
        sok.Variable(tf.zeros([3]))


def test_lookup_sparse_list_and_single(rng):
    tables = [sok.Variable(rng.standard_normal((10, 3)).astype(np.float32)),
              sok.Variable(rng.standard_normal((6, 5)).astype(np.float32))]
    ids = [tf.ragged.constant([[1, 2], [3]], tf.int64), tf.ragged.constant([[5], []], tf.int32)]
    outs = sok.lookup_sparse(tables, ids)  # SOK's default combiner: mean
    assert isinstance(outs, list) and [o.shape for o in outs] == [(2, 3), (2, 5)]
    ref = tf.nn.embedding_lookup_sparse(tables[0], ids[0].to_sparse(), None, combiner="mean")
    np.testing.assert_allclose(outs[0].numpy(), ref.numpy(), rtol=1e-6)
    single = sok.lookup_sparse(tables[0], ids[0], combiners="mean")
    np.testing.assert_array_equal(single.numpy(), outs[0].numpy())


def test_lookup_sparse_in_v1_session(rng):
    table = rng.standard_normal((8, 2)).astype(np.float32)

    def build():
        v = sok.Variable(table)
        sp = tf.compat.v1.SparseTensorValue([[0, 0], [0, 1], [2, 0]], [1, 7, 3], [3, 2])
        return sok.lookup_sparse([v], [sp], combiners=["sum"])[0]

    out = run_in_graph(build)
    np.testing.assert_allclose(out, [table[1] + table[7], [0, 0], table[3]], rtol=1e-6)


def test_disable_eager_execution_session():
    """TF1-style graph mode for a whole process, as SOK 1.x scripts run."""
    script = textwrap.dedent("""
        import numpy as np, tensorflow as tf
        tf.compat.v1.disable_eager_execution()
        import sok_graph as sok
        sok.init()
        v = sok.Variable(np.arange(12, dtype=np.float32).reshape(6, 2))
        ids = tf.compat.v1.sparse_placeholder(tf.int64, shape=[None, None])
        out = sok.lookup_sparse([v], [ids], combiners=["mean"])[0]
        loss = tf.reduce_sum(out)
        train = tf.compat.v1.train.GradientDescentOptimizer(1.0).minimize(loss)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            feed = {ids: tf.compat.v1.SparseTensorValue([[0, 0], [0, 1]], [1, 1], [1, 2])}
            print(sess.run(out, feed).tolist())
            sess.run(train, feed)
            print(sess.run(v).tolist())
    """)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0] == "[[2.0, 3.0]]"  # mean of row 1 twice
    table = np.arange(12, dtype=np.float32).reshape(6, 2)
    table[1] -= 1.0  # d(mean)/d(row 1) = 2 * 1/2
    assert lines[1] == str(table.tolist())


@pytest.mark.skipif(tf.__version__.startswith("1."),
                    reason="tf.saved_model.save / load of a tf.Module (TF2's API)")
def test_a_saved_model_holding_sok_ops_loads_after_import(tmp_path):
    """A SavedModel whose functions read a sok table (sok ops in its graph)
    loads in a fresh process that only imported sok_graph, and computes
    what it did when saved: the op library was loaded at the first sok call,
    so loading failed with "Op type not registered 'SokFusedLookup'"."""
    path = str(tmp_path / "model")
    save = textwrap.dedent(f"""
        import tensorflow as tf
        import sok_graph as sok
        sok.init(comm_tool="none")
        class Model(tf.Module):
            def __init__(self):
                self.table = sok.Variable(tf.reshape(tf.range(30, dtype=tf.float32), [10, 3]))
            @tf.function(input_signature=[tf.RaggedTensorSpec([None, None], tf.int64)])
            def __call__(self, ids):
                return sok.lookup_sparse([self.table], [ids], combiners=["sum"])[0]
        tf.saved_model.save(Model(), {path!r})
    """)
    load = textwrap.dedent(f"""
        import tensorflow as tf
        import sok_graph
        model = tf.saved_model.load({path!r})
        print(model(tf.ragged.constant([[1, 2], [9]], tf.int64)).numpy().tolist())
    """)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    for script in (save, load):
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             env=env, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
    table = np.arange(30, dtype=np.float32).reshape(10, 3)
    assert out.stdout.strip().splitlines()[-1] == str([(table[1] + table[2]).tolist(),
                                                       table[9].tolist()])


@pytest.mark.parametrize("kwargs,exc,pattern", [
    (dict(sp_ids=[None]), TypeError, r"sp_ids\[0\] must be a tf.SparseTensor or tf.RaggedTensor"),
    (dict(combiners=["max"]), ValueError, r"combiners\[0\] must be one of .*'max'"),
    (dict(combiners=""), ValueError, r"combiners\[0\] must be one of .*''"),
    (dict(combiners=["sum", "sum"]), ValueError, r"combiners must have one entry per table \(1\)"),
    (dict(sp_weights=[None, None]), ValueError, r"sp_weights must have one entry per table"),
    (dict(max_norm=-1.0), ValueError, r"max_norm\[0\] must be None or a positive finite"),
    (dict(max_norm=float("nan")), ValueError, r"max_norm\[0\] must be None or a positive"),
    (dict(max_norm=[0.0]), ValueError, r"max_norm\[0\] must be None or a positive"),
    (dict(max_norm=["1"]), ValueError, r"max_norm\[0\] must be None or a positive"),
])
def test_lookup_sparse_bad_arguments(kwargs, exc, pattern):
    args = dict(params=[tf.ones([4, 2])], sp_ids=[tf.ragged.constant([[0]], tf.int64)])
    args.update(kwargs)
    with pytest.raises(exc, match=pattern):
        sok.lookup_sparse(**args)


def test_max_norm_below_float32s_smallest_normal_is_refused():
    """max_norm=1e-40 (a float32 subnormal) or 1e-50 (0 in float32): the op
    read it as 0, no clipping, and returned the rows as they were, where
    tf.nn.embedding_lookup_sparse scales them down to zero. Refused, naming
    the argument, by lookup_sparse and fused_lookup; float32's smallest
    normal number still clips as TensorFlow does."""
    from sok_graph.ops import lookup as lookup_ops

    table = np.arange(1, 13, dtype=np.float32).reshape(6, 2)
    sp = tf.SparseTensor([[0, 0], [0, 1], [1, 0]], tf.constant([1, 4, 2], tf.int64), [2, 2])
    tiny = float(np.finfo(np.float32).tiny)
    for max_norm in (1e-40, 1e-50, tiny / 2):
        with pytest.raises(ValueError) as refused:
            sok.lookup_sparse(tf.constant(table), sp, max_norm=max_norm)
        assert str(refused.value) == (
            f"max_norm[0] must be at least 1.1754943508222875e-38 (float32's smallest normal "
            f"number: the lookup clips in float32, where a smaller max_norm reads as 0, no "
            f"clipping); got {max_norm!r}")
        with pytest.raises(ValueError, match=r"^max_norms\[0\] must be at least "):
            lookup_ops.fused_lookup([tf.constant(table)], [tf.constant([1, 4], tf.int64)],
                                    [tf.constant([0, 2], tf.int64)], combiners=["sum"],
                                    max_norms=[max_norm])
    for max_norm in (tiny, 1e-30, 2.5):
        got = sok.lookup_sparse(tf.Variable(table), sp, combiners="sum", max_norm=max_norm)
        want = tf.nn.embedding_lookup_sparse(tf.constant(table), sp, None, combiner="sum",
                                             max_norm=max_norm)
        # At max_norm=tiny the clipped rows (and the scale) are float32
        # subnormals, which TensorFlow's GPU kernels flush to zero and sok's
        # keep: each row may differ there by less than tiny, and sample 0
        # sums two rows.
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6, atol=2 * tiny)


def test_max_norm_as_a_numpy_scalar_or_a_large_int_is_one_number():
    """A numpy scalar max_norm (np.float32(0.5), np.int64(3)) applies to every
    table, as a Python float does: with two tables it was refused as a list
    of one entry ("max_norm must have one entry per table (2); got 1"). A
    Python int beyond int64 (2**70) is a number: numpy's isfinite failed on
    it ("ufunc 'isfinite' not supported for the input types"); one beyond a
    float's range (10**400) is refused naming max_norm. Reference:
    tf.nn.embedding_lookup_sparse with the same max_norm, table by table."""
    first = np.arange(1, 13, dtype=np.float32).reshape(6, 2)
    second = -0.5 * first[::-1].copy()
    sp = tf.SparseTensor([[0, 0], [0, 1], [1, 0]], tf.constant([1, 4, 2], tf.int64), [2, 2])
    tables = [sok.Variable(first), sok.Variable(second)]
    for max_norm in (np.float32(2.5), np.int64(3), np.float16(1.5), 2**70):
        got = sok.lookup_sparse(tables, [sp, sp], combiners=["sum", "mean"], max_norm=max_norm)
        for out, table, combiner in zip(got, (first, second), ("sum", "mean")):
            want = tf.nn.embedding_lookup_sparse(tf.constant(table), sp, None,
                                                 combiner=combiner, max_norm=float(max_norm))
            np.testing.assert_allclose(out.numpy(), want.numpy(), rtol=1e-6)
    with pytest.raises(ValueError, match=r"^max_norm\[1\] must be None or a positive finite "
                                         r"number \(the L2 norm rows are clipped to\); got 1000"):
        sok.lookup_sparse(tables, [sp, sp], max_norm=[None, 10**400])


@pytest.mark.skipif(tf.__version__.startswith("1."), reason="TF2 export (eager)")
def test_a_served_lookup_checks_the_ids_and_weights_dtypes_as_training(tmp_path):
    """lookup_sparse in serving mode (sok.export_for_serving) took float ids,
    cast to int64 (id 1.7 served row 1, 2.2 row 2), and int weights, which
    training refuses: both are now the same TypeError at export, naming the
    argument. Int ids and float weights serve what TensorFlow computes."""
    rows = np.arange(12, dtype=np.float32).reshape(4, 3)
    table = sok.Variable(rows, name="served_dtypes")

    def model(ids, weights):
        return sok.lookup_sparse(table, ids, weights, combiners="sum")

    def spec(dtype):
        return tf.RaggedTensorSpec([None, None], dtype, ragged_rank=1)

    ids = tf.ragged.constant([[1, 2], [3]], dtype=tf.int64)
    weights = tf.ragged.constant([[0.5, 2.0], [-1.0]])
    for id_dtype, weight_dtype, pattern in (
            (tf.float32, tf.float32, r"sp_ids\[0\] must hold int32 or int64 ids; got float32"),
            (tf.int64, tf.int32, r"sp_weights\[0\] must hold floats; got int32")):
        with pytest.raises(TypeError, match=pattern):
            model(tf.cast(ids, id_dtype), tf.cast(weights, weight_dtype))
        with pytest.raises(TypeError, match=pattern):
            sok.export_for_serving(model, str(tmp_path / id_dtype.name),
                                   input_signature=[spec(id_dtype), spec(weight_dtype)])
    sok.export_for_serving(model, str(tmp_path / "ok"),
                           input_signature=[spec(tf.int64), spec(tf.float32)])
    served = tf.saved_model.load(str(tmp_path / "ok"))
    want = tf.nn.embedding_lookup_sparse(tf.constant(rows), ids.to_sparse(), weights.to_sparse(),
                                         combiner="sum")
    np.testing.assert_allclose(served.serve(ids, weights).numpy(), want.numpy(), rtol=1e-6)


def test_a_gradient_of_a_lookups_gradient_is_refused_by_name():
    """A gradient penalty on a table (the gradient of its gradient) failed
    in TensorFlow's registry ("gradient registry has no entry for:
    SokFusedLookupGrad"); it is a NotImplementedError saying what
    sok.lookup_sparse lacks. The first-order gradient under the same tapes
    is the plain lookup's."""
    rows = np.arange(8, dtype=np.float32).reshape(4, 2)
    table, ref = sok.Variable(rows), tf.Variable(rows)
    ids = tf.ragged.constant([[0, 1], [2]], tf.int64)
    with tf.GradientTape() as outer:
        with tf.GradientTape() as inner:
            loss = tf.reduce_sum(tf.square(sok.lookup_sparse(table, ids, combiners="sum")))
        grad = tf.convert_to_tensor(inner.gradient(loss, table))
        penalty = tf.reduce_sum(tf.square(grad))
    with tf.GradientTape() as plain:
        want = tf.reduce_sum(tf.square(tf.nn.embedding_lookup_sparse(
            ref, ids.to_sparse(), None, combiner="sum")))
    np.testing.assert_allclose(grad.numpy(), tf.convert_to_tensor(
        plain.gradient(want, ref)).numpy(), rtol=1e-6)
    with pytest.raises(NotImplementedError, match="sok.lookup_sparse has no second-order "
                                                  "gradient"):
        outer.gradient(penalty, table)


def test_lookup_sparse_bad_types():
    ids = tf.ragged.constant([[0]], tf.int64)
    with pytest.raises(TypeError, match=r"params\[0\] must be float32.*int32"):
        sok.lookup_sparse([tf.ones([4, 2], tf.int32)], [ids])
    with pytest.raises(TypeError, match=r"sp_ids\[0\] must hold int32 or int64 ids; got float32"):
        sok.lookup_sparse([tf.ones([4, 2])], [tf.ragged.constant([[0.5]], tf.float32)])
    with pytest.raises(ValueError, match=r"params must name at least one table"):
        sok.lookup_sparse([], [])
    with pytest.raises(ValueError, match=r"sp_ids must have one entry per table \(2\); got 1"):
        sok.lookup_sparse([tf.ones([4, 2]), tf.ones([4, 2])], [ids])
    with pytest.raises(ValueError, match=r"sp_ids\[0\] must be a 2-D RaggedTensor"):
        sok.lookup_sparse([tf.ones([4, 2])], [tf.ragged.constant([[[0]]], tf.int64)])
    with pytest.raises(TypeError, match=r"share one dtype"):
        sok.lookup_sparse([tf.ones([4, 2]), tf.ones([4, 2], tf.float16)], [ids, ids])


def test_lookup_sparse_names_params_that_are_no_table():
    """A dict of tables, an iterator, None or an object as params (or as one
    of a list's entries) failed with tf.convert_to_tensor's "Attempt to
    convert a value (None) with an unsupported type", naming no argument.
    A TypeError naming params[t] and what it got; tables given alike still
    read as tf.nn.embedding_lookup_sparse."""
    ids = tf.ragged.constant([[0, 2]], tf.int64)
    table = tf.reshape(tf.range(8.0), [4, 2])
    cases = [({"a": table}, 0, "dict"), (iter([table]), 0, "list_iterator"),
             (None, 0, "NoneType"), (object(), 0, "object"), ([table, None], 1, "NoneType"),
             ([table, {"x": 1}], 1, "dict")]
    for params, t, got in cases:
        sp_ids = [ids] * len(params) if isinstance(params, list) else ids
        with pytest.raises(TypeError) as refused:
            sok.lookup_sparse(params, sp_ids)
        assert str(refused.value) == (
            f"params[{t}] must be a table: a sok.Variable, sok.DynamicVariable, tf.Variable or "
            f"[rows, dim] tensor; got {got}")
    np.testing.assert_array_equal(
        sok.lookup_sparse([table, table.numpy()], [ids, ids], combiners="sum")[1].numpy(),
        tf.nn.embedding_lookup_sparse(table, ids.to_sparse(), None, combiner="sum").numpy())


def test_all2all_dense_embedding_names_its_indices():
    """Its errors name its own argument, not the lookup's sp_ids[0]."""
    with pytest.raises(TypeError, match="indices must hold int32 or int64 ids; got float32"):
        sok.all2all_dense_embedding(tf.ones([4, 2]), tf.constant([1.0]))
    table = sok.DynamicVariable(2, key_type=tf.int32)
    with pytest.raises(TypeError, match=r"indices must hold int32 keys \(the key_type"):
        sok.all2all_dense_embedding(table, tf.constant([2 ** 33], tf.int64))
    np.testing.assert_array_equal(
        sok.all2all_dense_embedding(tf.reshape(tf.range(8.0), [4, 2]),
                                    tf.constant([[3]], tf.int32)).numpy(),
        tf.nn.embedding_lookup(tf.reshape(tf.range(8.0), [4, 2]), [[3]]).numpy())


def test_all2all_dense_embedding_names_a_list_of_tables_and_sparse_indices():
    """param given as a list of tables failed in a reshape ("Input to
    reshape is a tensor with 4 values"), or with "'list' object has no
    attribute 'shape'"; ragged or sparse indices with tf.convert_to_tensor's
    messages ("object of type 'RaggedTensor' has no len()"). Each is a
    TypeError naming the argument; one table still reads as
    tf.nn.embedding_lookup."""
    table = tf.reshape(tf.range(8.0), [4, 2])
    for param, indices in (([table], [1, 2]), ([table], [1]), ((table, table), [[1]])):
        with pytest.raises(TypeError) as refused:
            sok.all2all_dense_embedding(param, tf.constant(indices))
        assert str(refused.value) == (
            f"param must be one table (a sok.Variable, tf.Variable, tensor or "
            f"sok.DynamicVariable); got a {type(param).__name__} of {len(param)}: call "
            f"all2all_dense_embedding once per table")
    for indices in (tf.ragged.constant([[1], [2, 3]]), tf.SparseTensor([[0]], [1], [2]),
                    tf.compat.v1.SparseTensorValue([[0]], [1], [2])):
        with pytest.raises(TypeError) as refused:
            sok.all2all_dense_embedding(table, indices)
        assert str(refused.value) == (
            f"indices must be a dense tensor of ids (any shape); got a "
            f"{type(indices).__name__}: sok.lookup_sparse takes sparse and ragged ids")
    np.testing.assert_array_equal(sok.all2all_dense_embedding(table, [[1, 2], [3, 0]]).numpy(),
                                  tf.nn.embedding_lookup(table, [[1, 2], [3, 0]]).numpy())


def test_mixed_id_dtypes_are_widened(rng):
    t = tf.constant(rng.standard_normal((5, 2)).astype(np.float32))
    a, b = sok.lookup_sparse([t, t], [tf.ragged.constant([[4]], tf.int32),
                                      tf.ragged.constant([[4]], tf.int64)], combiners="sum")
    np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_keras_layers_list_sok_variables_among_their_weights():
    class Embedding(tf.keras.layers.Layer):
        def __init__(self):
            super().__init__()
            self.sok_table = sok.Variable(np.ones((5, 2), np.float32), name="sok_table")
            self.tf_table = tf.Variable(np.ones((5, 2), np.float32), name="tf_table")

    layer = Embedding()
    names = [w.name.split(":")[0] for w in layer.trainable_weights]
    # Keras 2 counts both as layer weights; Keras 3 tracks only its own
    # Variable class, and sok_graph makes its layers list sok tables too
    # (test_keras_layers_list_tables.py): fit trains them.
    assert "sok_table" in names
    assert ("tf_table" in names) == (keras_compat.KERAS_MAJOR_VERSION < 3)
    module = tf.Module()
    module.table = layer.sok_table
    assert module.trainable_variables == (layer.sok_table,)


def test_assign_and_export_in_graph_mode(rng):
    table = rng.standard_normal((6, 2)).astype(np.float32)

    def build():
        v = sok.Variable(np.zeros((6, 2), np.float32))
        d = sok.DynamicVariable(2, initializer="zeros")
        with tf.control_dependencies([sok.assign(v, tf.range(6, dtype=tf.int64), table),
                                      sok.assign(d, tf.constant([4, 9], tf.int64), table[:2])]):
            return sok.export(v)[1], sok.export(d)

    rows, (keys, drows) = run_in_graph(build)
    np.testing.assert_array_equal(rows, table)
    assert sorted(zip(keys.tolist(), drows.tolist())) == [(4, table[0].tolist()),
                                                          (9, table[1].tolist())]


@pytest.mark.parametrize("lr,exc", [("x", TypeError), (None, TypeError), (True, TypeError),
                                    (float("nan"), ValueError), (-0.1, ValueError)])
def test_sgd_learning_rate_must_be_a_rate(lr, exc):
    with pytest.raises(exc, match=r"sok.SGD: learning_rate must be"):
        sok.SGD(lr)


@pytest.mark.skipif(not tf.executing_eagerly(), reason="TF2 tapes over tf.functions")
@pytest.mark.parametrize("kind", ["tf.Variable", "sok.Variable"])
@pytest.mark.parametrize("first_call", ["without_a_tape", "inside_a_tf_function"])
def test_a_traced_lookup_called_under_a_later_tape_has_its_gradient(kind, first_call):
    """A tf.function of a lookup traced without a tape (a warm-up or an
    evaluation call) or inside another tf.function, then called under an
    eager GradientTape: the gradient for the table was None (the trace did
    not list the table among the variables it reads, so the tape never
    watched it), and an optimizer passed the table over without an error.
    The gradient is now tf.nn.embedding_lookup_sparse's."""
    sok.init(comm_tool="none")
    start = np.arange(12, dtype=np.float32).reshape(4, 3)
    table = tf.Variable(start) if kind == "tf.Variable" else sok.Variable(start)
    reference = tf.Variable(start)
    ids = tf.ragged.constant([[1, 2], [3, 3]], dtype=tf.int64)

    @tf.function
    def embed(ids):
        return sok.lookup_sparse(table, ids, combiners="sum")

    @tf.function
    def differentiated_inside(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(embed(ids))
        return tape.gradient(loss, table)

    if first_call == "without_a_tape":
        embed(ids)
    else:
        differentiated_inside(ids)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.square(embed(ids)))
    got = tape.gradient(loss, table)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.square(tf.nn.embedding_lookup_sparse(
            reference, ids.to_sparse(), None, combiner="sum")))
    want = tape.gradient(loss, reference)
    assert got is not None
    np.testing.assert_allclose(tf.convert_to_tensor(got).numpy(),
                               tf.convert_to_tensor(want).numpy(), rtol=1e-6)


@pytest.mark.skipif(not tf.executing_eagerly(), reason="TF2 tapes over tf.functions")
@pytest.mark.parametrize("read", ["sparse_read", "lookup_sparse"])
@pytest.mark.parametrize("first_call", ["under_the_tape", "without_a_tape"])
def test_a_dynamic_tables_tf_function_differentiated_by_a_tape_outside_it(read, first_call):
    """A tf.function reading a DynamicVariable, differentiated by a tape
    outside it: building its gradient failed with TensorFlow's "Node with id
    4 is different from the passed in node" (and, traced without a tape
    first, the gradient was None). It now equals the eager gradient."""
    sok.init(comm_tool="none")
    table = sok.DynamicVariable(dimension=3, initializer="1")
    keys = tf.constant([1, 2, 3, 3, 7], tf.int64)
    upstream = tf.constant(np.arange(15, dtype=np.float32).reshape(5, 3))

    def rows(keys):
        if read == "sparse_read":
            return table.sparse_read(keys)
        return sok.lookup_sparse(table, tf.RaggedTensor.from_row_lengths(keys, [1, 1, 1, 1, 1]),
                                 combiners="sum")

    def gradient(fn):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(fn(keys) * upstream)
        g = tape.gradient(loss, table)
        assert isinstance(g, tf.IndexedSlices)
        dense = {}
        for k, v in zip(g.indices.numpy().tolist(), g.values.numpy()):
            dense[k] = dense.get(k, 0) + v
        return dense

    want = gradient(rows)
    traced = tf.function(rows)
    if first_call == "without_a_tape":
        traced(keys)
    got = gradient(traced)
    assert sorted(got) == sorted(want) == [1, 2, 3, 7]
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
