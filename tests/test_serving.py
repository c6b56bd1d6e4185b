"""sok.export_for_serving, export_serving_delta and apply_serving_delta.

Each exported model is loaded in a fresh interpreter in which sok_graph
cannot be imported, with stock TensorFlow only, and must give the training
model's predictions (relative error <= 1e-6) on batches that hold keys the
tables never saw; its saved_model.pb must list only stock ops.
"""

import json
import os
import re
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import tensorflow as tf

import sok_graph as sok
from sok_graph import compat

HERE = os.path.dirname(os.path.abspath(__file__))
MULTIWORKER = os.path.join(HERE, "multiworker")

tf2_only = pytest.mark.skipif(compat.IS_TF1, reason="TF2 export (eager)")

# The preamble of every plain-TensorFlow check: sok_graph (and SOK's name
# for it) cannot be imported.
_NO_SOK = textwrap.dedent("""
    import sys
    sys.modules["sok_graph"] = None
    sys.modules["sparse_operation_kit"] = None
    import json, os
    import numpy as np
    import tensorflow as tf
    from tensorflow.core.protobuf import saved_model_pb2

    def op_types(export_dir):
        model = saved_model_pb2.SavedModel()
        with open(os.path.join(export_dir, "saved_model.pb"), "rb") as f:
            model.ParseFromString(f.read())
        types = set()
        for meta in model.meta_graphs:
            types.update(n.op for n in meta.graph_def.node)
            for fn in meta.graph_def.library.function:
                types.update(n.op for n in fn.node_def)
        return types

    def rel_err(got, want):
        got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
        return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))
""")


def _plain_tf(body, *args):
    """Runs `body` after _NO_SOK in a fresh interpreter; returns its last
    stdout line as JSON."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    # sys.modules["sok_graph"] = None already makes it unimportable; the
    # entries that hold it leave the path too (TensorFlow's may stay: on some
    # machines TensorFlow itself comes through PYTHONPATH).
    kept = [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
            if p and not os.path.isdir(os.path.join(p, "sok_graph"))]
    env["PYTHONPATH"] = os.pathsep.join(kept)
    out = subprocess.run([sys.executable, "-c", _NO_SOK + textwrap.dedent(body)] + list(args),
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


_SERVE_TF2 = """
    export_dir, batch_file = sys.argv[1], sys.argv[2]
    data = dict(np.load(batch_file))
    want = data.pop("want")
    loaded = tf.saved_model.load(export_dir)
    got = loaded.signatures["serving_default"](**{k: tf.constant(v) for k, v in data.items()})
    got = list(got.values())[0].numpy()
    sok_ops = sorted(t for t in op_types(export_dir) if t.startswith("Sok"))
    print(json.dumps({"err": rel_err(got, want), "sok_ops": sok_ops, "n": len(op_types(export_dir)),
                      "shape": list(got.shape)}))
"""


def _rng():
    return np.random.default_rng(7)


class ServingModel(tf.keras.Model):
    """Static and dynamic tables (int64 and int32 keys), weights, mean /
    sqrtn, max_norm, a dense lookup and a dense layer."""

    def __init__(self):
        super().__init__()
        rng = _rng()
        self.static = sok.Variable(rng.normal(size=(40, 6)).astype(np.float32),
                                   name="static_table")
        self.dyn = sok.DynamicVariable(dimension=6, initializer="zeros", name="dyn_a")
        self.dyn_b = sok.DynamicVariable(dimension=3, initializer="0.5", name="dyn_b",
                                         key_type=tf.int32)
        self.kernel = tf.Variable(rng.normal(size=(15, 2)).astype(np.float32))

    def call(self, inputs):
        ids_s = tf.RaggedTensor.from_tensor(inputs["static_ids"], padding=-1)
        weights = tf.RaggedTensor.from_tensor(inputs["static_w"], lengths=ids_s.row_lengths())
        ids_d = tf.RaggedTensor.from_tensor(inputs["dyn_ids"], padding=-1)
        a, b = sok.lookup_sparse([self.static, self.dyn], [ids_s, ids_d], [weights, None],
                                 combiners=["mean", "sqrtn"], max_norm=[None, 1.5])
        c = sok.all2all_dense_embedding(self.dyn_b, inputs["single"])
        return tf.matmul(tf.concat([a, b, c], 1), self.kernel)


_SIGNATURE = [{
    "static_ids": tf.TensorSpec([None, 3], tf.int64, name="static_ids"),
    "static_w": tf.TensorSpec([None, 3], tf.float32, name="static_w"),
    "dyn_ids": tf.TensorSpec([None, 4], tf.int64, name="dyn_ids"),
    "single": tf.TensorSpec([None], tf.int32, name="single"),
}]


def _trained(model, seen_keys):
    rng = _rng()
    rows = rng.normal(size=(len(seen_keys), 6)).astype(np.float32)
    sok.assign(model.dyn, tf.constant(seen_keys, tf.int64), tf.constant(rows))
    sok.assign(model.dyn_b, tf.constant([3, 9, -4], tf.int32),
               tf.constant(rng.normal(size=(3, 3)).astype(np.float32)))
    return model


def _batch(seen_keys, unseen=True):
    rng = np.random.default_rng(11)
    n = 16
    static_ids = rng.integers(0, 40, size=(n, 3))
    static_ids[::4, 1:] = -1  # fewer ids in some samples
    static_ids[5] = -1  # a sample without ids: zeros
    pool = np.concatenate([seen_keys, [10 ** 12, -77, 123456]]) if unseen else seen_keys
    dyn_ids = rng.choice(pool, size=(n, 4))
    dyn_ids[::3, 2:] = -1
    single = rng.choice([3, 9, -4, 5, 1000] if unseen else [3, 9, -4], size=n)
    return {"static_ids": static_ids.astype(np.int64),
            "static_w": rng.uniform(0.1, 2.0, size=(n, 3)).astype(np.float32),
            "dyn_ids": dyn_ids.astype(np.int64), "single": single.astype(np.int32)}


def _predict(model, batch):
    return model({k: tf.constant(v) for k, v in batch.items()}).numpy()


def _serve_check(export_dir, batch, want, tmp_path, tag="batch"):
    batch_file = str(tmp_path / f"{tag}.npz")
    np.savez(batch_file, want=want, **batch)
    result = _plain_tf(_SERVE_TF2, export_dir, batch_file)
    assert result["sok_ops"] == [], result
    assert result["err"] <= 1e-6, result
    return result


@tf2_only
def test_tf2_keras_model_serves_in_plain_tensorflow(tmp_path):
    sok.init()
    seen = np.array([5, 17, 2 ** 40, -3, 8, 1001, 64], np.int64)
    model = _trained(ServingModel(), seen)
    export_dir = str(tmp_path / "model")
    # chunk_rows=3: every table is copied in several chunks
    assert sok.export_for_serving(model, export_dir, _SIGNATURE, chunk_rows=3,
                                  default_row={"dyn_b": 0.5}) == export_dir
    batch = _batch(seen)
    want = _predict(model, batch)  # unseen keys: zeros / 0.5, as their initializers give
    _serve_check(export_dir, batch, want, tmp_path)
    with open(os.path.join(export_dir, "assets.extra", "sok_serving.json")) as f:
        manifest = json.load(f)
    assert sorted(t["name"] for t in manifest["tables"]) == ["dyn_a", "dyn_b", "static_table"]


@tf2_only
def test_tf2_v1_layers_and_module(tmp_path):
    """SOK 1.x layers and a tf.Module with a sparse input served by `serve`
    (not a signature: it takes a RaggedTensor)."""
    sok.init()
    layer = sok.DistributedEmbedding("mean", 64, 4, slot_num=2, max_nnz=3,
                                     embedding_initializer="zeros")
    dense = sok.All2AllDenseEmbedding(64, 4, slot_num=2, nnz_per_slot=1,
                                      embedding_initializer="zeros")
    rng = _rng()
    sok.assign(layer.embedding_variable, tf.constant([1, 2, 3, 40], tf.int64),
               tf.constant(rng.normal(size=(4, 4)).astype(np.float32)))
    sok.assign(dense.embedding_variable, tf.constant([7, 8], tf.int64),
               tf.constant(rng.normal(size=(2, 4)).astype(np.float32)))

    class Module(tf.Module):
        def __call__(self, ids, keys):
            return tf.reduce_sum(layer(ids), 1) + tf.reduce_sum(dense(keys), [1, 2])

    module = Module()
    export_dir = str(tmp_path / "module")
    sok.export_for_serving(module, export_dir, [
        tf.RaggedTensorSpec([None, None], tf.int64, ragged_rank=1),
        tf.TensorSpec([None, 2, 1], tf.int64)])
    ids = tf.ragged.constant([[1, 2], [3], [], [40, 99, 1], [5], [2, 2]], tf.int64)
    keys = tf.constant([[[7], [8]], [[8], [500]], [[1], [7]]], tf.int64)
    want = module(ids, keys).numpy()
    result = _plain_tf("""
        loaded = tf.saved_model.load(sys.argv[1])
        ids = tf.ragged.constant([[1, 2], [3], [], [40, 99, 1], [5], [2, 2]], tf.int64)
        keys = tf.constant([[[7], [8]], [[8], [500]], [[1], [7]]], tf.int64)
        got = loaded.serve(ids, keys).numpy()
        want = np.array(json.loads(sys.argv[2]))
        print(json.dumps({"err": rel_err(got, want),
                          "sok": [t for t in op_types(sys.argv[1]) if t.startswith("Sok")]}))
    """, export_dir, json.dumps(want.tolist()))
    assert result["sok"] == [] and result["err"] <= 1e-6, result


@tf2_only
def test_delta_round_trip(tmp_path):
    sok.init()
    seen = np.array([5, 17, 2 ** 40, -3, 8, 1001, 64], np.int64)
    model = _trained(ServingModel(), seen)
    time.sleep(0.01)
    # A float (time.time() * 1e6), before the export: the delta misses no
    # row trained after the export read its tables.
    since = time.time() * 1e6
    time.sleep(0.01)
    export_dir = str(tmp_path / "model")
    sok.export_for_serving(model, export_dir, _SIGNATURE, default_row={"dyn_b": 0.5})
    time.sleep(0.01)
    # "Training" after the export: held and new keys of both dynamic tables,
    # and rows of the static table.
    rng = np.random.default_rng(3)
    changed = np.array([17, 64, 555, -9], np.int64)
    sok.assign(model.dyn, tf.constant(changed), tf.constant(
        rng.normal(size=(4, 6)).astype(np.float32)))
    sok.assign(model.dyn_b, tf.constant([9, 77], tf.int32), tf.constant(
        rng.normal(size=(2, 3)).astype(np.float32)))
    model.static.scatter_update(tf.IndexedSlices(
        tf.constant(rng.normal(size=(2, 6)).astype(np.float32)), tf.constant([0, 39])))
    delta_dir = str(tmp_path / "delta")
    assert sok.export_serving_delta([model.static, model.dyn, model.dyn_b], since,
                                    delta_dir) == delta_dir
    manifest = json.load(open(os.path.join(delta_dir, "manifest.json")))
    counts = {t["name"]: t["rows"] for t in manifest["tables"]}
    assert counts == {"static_table": 40, "dyn_a": 4, "dyn_b": 2}, counts

    batch = _batch(np.concatenate([seen, changed]))
    batch["single"][:3] = [9, 77, 3]
    want = _predict(model, batch)

    # 1. offline: the delta written into a copy of the export
    updated = str(tmp_path / "updated")
    applied = sok.apply_serving_delta(export_dir, delta_dir, output_dir=updated)
    assert applied == counts
    _serve_check(updated, batch, want, tmp_path, "offline")

    # 2. online: the loaded model's own function, in plain TensorFlow
    batch_file = str(tmp_path / "online.npz")
    np.savez(batch_file, want=want, **batch)
    result = _plain_tf("""
        export_dir, delta_dir, batch_file = sys.argv[1:4]
        loaded = tf.saved_model.load(export_dir)
        manifest = json.load(open(os.path.join(delta_dir, "manifest.json")))
        for table in manifest["tables"]:
            keys = np.load(os.path.join(delta_dir, table["files"]["keys"]["file"]))
            rows = np.load(os.path.join(delta_dir, table["files"]["rows"]["file"]))
            fn = loaded.sok_tables[table["name"]].apply_delta_fn
            fn(tf.constant(keys.astype(table["key_dtype"])), tf.constant(rows))
        data = dict(np.load(batch_file))
        want = data.pop("want")
        got = loaded.signatures["serving_default"](**{k: tf.constant(v) for k, v in data.items()})
        try:  # 3 keys, 2 rows
            loaded.sok_tables["dyn_a"].apply_delta_fn(tf.constant([1, 2, 3], tf.int64),
                                                      tf.zeros([2, 6]))
            mismatch = "accepted"
        except tf.errors.InvalidArgumentError as e:
            mismatch = str(e)
        print(json.dumps({"err": rel_err(list(got.values())[0].numpy(), want),
                          "mismatch": mismatch}))
    """, export_dir, delta_dir, batch_file)
    assert result["err"] <= 1e-6, result
    assert "apply_delta_fn of table" in result["mismatch"] and "dyn_a" in result["mismatch"] \
        and "keys and rows must pair one to one" in result["mismatch"], result["mismatch"]

    # a corrupted file is refused before anything changes
    rows_file = os.path.join(delta_dir, manifest["tables"][1]["files"]["rows"]["file"])
    with open(rows_file, "r+b") as f:
        f.seek(-4, 2)
        f.write(b"\x00\x01\x02\x03")
    with pytest.raises(sok.serving.delta.DeltaError, match="corrupted"):
        sok.apply_serving_delta(export_dir, delta_dir)


def _worker_path():
    """The worker scripts' helpers first, then the sok_graph this test
    imports (installed, or staged by Bazel) and whatever else is on the path
    (TensorFlow, on some machines)."""
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(sok.__file__)))
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join([MULTIWORKER, package_root] + rest)


def _worker(n, out):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=_worker_path())
    run = subprocess.run([sys.executable, os.path.join(MULTIWORKER, "serving_worker.py"),
                          "--replicas", str(n), "--out", out],
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


@tf2_only
def test_two_workers_export_equals_one_worker(tmp_path):
    """Tables sharded over 2 workers (the in-process replica engine) export
    the same model as the same tables in one worker."""
    one = _worker(1, str(tmp_path / "one"))
    two = _worker(2, str(tmp_path / "two"))
    assert two["world_size"] == 2 and one["world_size"] == 1
    readers = [tf.train.load_checkpoint(os.path.join(d, "variables", "variables"))
               for d in (one["export_dir"], two["export_dir"])]
    keys = [k for k in readers[0].get_variable_to_shape_map() if k.startswith("sok_tables/")]
    assert len(keys) == 4, keys  # static rows; dynamic keys, index, rows
    for key in keys:
        np.testing.assert_array_equal(readers[0].get_tensor(key), readers[1].get_tensor(key))
    batch = {k: np.asarray(v) for k, v in one["batch"].items()}
    want = np.asarray(one["want"], np.float32)
    np.testing.assert_allclose(np.asarray(two["want"], np.float32), want, rtol=1e-6)
    for d in (one["export_dir"], two["export_dir"]):
        _serve_check(d, batch, want, tmp_path, os.path.basename(os.path.dirname(d)))


_TF1_BUILD = """
def build(tf, sok):
    ids = tf.compat.v1.sparse_placeholder(tf.int64, shape=[None, None], name="ids")
    keys = tf.compat.v1.placeholder(tf.int64, [None], name="keys")
    static = sok.Variable(tf.zeros([30, 4]), name="emb_static")
    dyn = sok.DynamicVariable(dimension=4, initializer="zeros", name="emb_dyn")
    a = sok.lookup_sparse(static, ids, combiners="sum")
    b = sok.all2all_dense_embedding(dyn, keys)
    w = tf.compat.v1.get_variable("w", [8, 1])
    return ids, keys, tf.matmul(tf.concat([a, b], 1), w)
"""


def test_tf1_session_export_serves_in_plain_tensorflow(tmp_path):
    namespace = {}
    exec(_TF1_BUILD, namespace)
    build = namespace["build"]
    rng = _rng()
    with tf.Graph().as_default():
        sok.init()
        ids, keys, out = build(tf, sok)
        static = [v for v in tf.compat.v1.global_variables() if v.op.name == "emb_static"][0]
        dyn = [v for v in tf.compat.v1.global_variables()
               if isinstance(v, sok.DynamicVariable)][0]
        fill = [static.assign(rng.normal(size=(30, 4)).astype(np.float32)),
                sok.assign(dyn, tf.constant([4, 10 ** 9, -2], tf.int64),
                           tf.constant(rng.normal(size=(3, 4)).astype(np.float32)))]
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(fill)
            export_dir = str(tmp_path / "tf1")

            def build_fn():
                i, k, o = build(tf, sok)
                return {"ids": i, "keys": k}, {"out": o}
            assert sok.export_for_serving(build_fn, export_dir, session=sess) == export_dir
            sp = tf.compat.v1.SparseTensorValue(
                np.array([[0, 0], [0, 1], [2, 0]], np.int64), np.array([3, 29, 7], np.int64),
                np.array([3, 2], np.int64))
            key_batch = np.array([4, 55, -2], np.int64)  # 55: unseen
            want = sess.run(out, {ids: sp, keys: key_batch})
    result = _plain_tf("""
        export_dir = sys.argv[1]
        want = np.array(json.loads(sys.argv[2]))
        with tf.Graph().as_default() as g, tf.compat.v1.Session(graph=g) as sess:
            meta = tf.compat.v1.saved_model.load(sess, [tf.saved_model.SERVING], export_dir)
            sig = meta.signature_def["serving_default"]
            sp = sig.inputs["ids"].coo_sparse
            feed = {g.get_tensor_by_name(sp.indices_tensor_name):
                    np.array([[0, 0], [0, 1], [2, 0]], np.int64),
                    g.get_tensor_by_name(sp.values_tensor_name): np.array([3, 29, 7], np.int64),
                    g.get_tensor_by_name(sp.dense_shape_tensor_name): np.array([3, 2], np.int64),
                    g.get_tensor_by_name(sig.inputs["keys"].name): np.array([4, 55, -2], np.int64)}
            got = sess.run(g.get_tensor_by_name(sig.outputs["out"].name), feed)
        print(json.dumps({"err": rel_err(got, want),
                          "sok": [t for t in op_types(export_dir) if t.startswith("Sok")]}))
    """, export_dir, json.dumps(want.tolist()))
    assert result["sok"] == [] and result["err"] <= 1e-6, result


def test_collective_strategy_export_uses_serving_writer(tmp_path):
    """One worker of tests/multiworker/collective_worker.py exports through
    sok.export_for_serving's graph writer: stock ops, and a manifest."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=_worker_path())
    export_dir = str(tmp_path / "cs")
    run = subprocess.run([sys.executable, os.path.join(MULTIWORKER, "collective_worker.py"),
                          "--mode", "strategy", "--api", "lookup", "--opt", "adagrad",
                          "--out", str(tmp_path / "out"), "--export", export_dir],
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert os.path.exists(os.path.join(export_dir, "assets.extra", "sok_serving.json"))
    result = _plain_tf("""
        export_dir = sys.argv[1]
        with tf.Graph().as_default() as g, tf.compat.v1.Session(graph=g) as sess:
            meta = tf.compat.v1.saved_model.load(sess, [tf.saved_model.SERVING], export_dir)
            table = [v for v in tf.compat.v1.global_variables() if v.op.name == "emb/table"]
            shape = sess.run(table[0]).shape
        print(json.dumps({"shape": list(shape),
                          "sok": [t for t in op_types(export_dir) if t.startswith("Sok")]}))
    """, export_dir)
    assert result["sok"] == [] and result["shape"][0] > 0, result


def test_bad_arguments_are_named_errors(tmp_path):
    """The serving entry points refuse what they cannot use, naming it,
    before anything is written."""
    table = sok.Variable(tf.ones([4, 2]))
    with pytest.raises(TypeError, match="model must be a function"):
        sok.export_for_serving("not callable", str(tmp_path / "a"),
                               session=tf.compat.v1.Session(graph=tf.Graph()))
    with pytest.raises(TypeError, match="export_serving_delta takes sok tables"):
        sok.export_serving_delta([table, tf.Variable(1.0)], 0, str(tmp_path / "d"))
    # Two tables of one name: numbered by this list they could reach each
    # other's serving table (the export numbers them in the model's order).
    twin = sok.Variable(tf.ones([4, 2]), name=table.name.split(":")[0])
    with pytest.raises(ValueError, match="several tables named.*pass a dict"):
        sok.export_serving_delta([table, twin], 0, str(tmp_path / "d"))
    assert not os.path.exists(str(tmp_path / "a")) and not os.path.exists(str(tmp_path / "d"))


@tf2_only
def test_a_delta_of_a_table_whose_name_another_shares_is_given_as_a_dict(tmp_path):
    """Two tables left with the default name are served as DynamicVariable
    and DynamicVariable_1 (in the order the model reads them); a delta of
    the second given in a list was written under its own name and applied
    into the first table's served rows without a word. A list holding a
    table whose name another live table shares (or a name the export gives
    such a pair) is refused, naming it and saying what to pass; a dict of
    serving names is taken, and serves each table's own rows (numpy against
    the trained tables' find())."""
    from sok_graph.serving import delta as delta_mod

    sok.init(comm_tool="none")
    first = sok.DynamicVariable(2, initializer="zeros")
    second = sok.DynamicVariable(2, initializer="zeros")
    assert first.name == second.name == "DynamicVariable"
    ids = np.array([1, 2], np.int64)
    sok.assign(first, tf.constant(ids), np.array([[1, 1], [2, 2]], np.float32))
    sok.assign(second, tf.constant(ids), np.array([[10, 10], [20, 20]], np.float32))

    class Model(tf.Module):
        def __call__(self, x):
            return tf.concat([tf.nn.embedding_lookup(first, x),
                              tf.nn.embedding_lookup(second, x)], 1)

    export_dir = str(tmp_path / "export")
    sok.export_for_serving(Model(), export_dir, [tf.TensorSpec([None], tf.int64)])
    since = _export_created(export_dir)
    sok.assign(second, tf.constant([1], tf.int64), np.array([[30, 30]], np.float32))
    third = sok.DynamicVariable(2, initializer="zeros", name="DynamicVariable_1")
    for variables, name in (([second], "DynamicVariable"), (second, "DynamicVariable"),
                            ([third], "DynamicVariable_1")):
        with pytest.raises(ValueError, match=re.escape(
                f"table {name!r} of variables shares its name with")) as refused:
            sok.export_serving_delta(variables, since, str(tmp_path / "delta"))
        assert "pass a dict {serving name: table}" in str(refused.value)
    assert not os.path.exists(str(tmp_path / "delta"))
    del third
    delta_dir = sok.export_serving_delta({"DynamicVariable_1": second}, since,
                                         str(tmp_path / "delta"))
    assert sorted(delta_mod.read_serving_delta(delta_dir)) == ["DynamicVariable_1"]
    assert sok.apply_serving_delta(export_dir, delta_dir) == {"DynamicVariable_1": 1}
    loaded = tf.saved_model.load(export_dir)
    want = np.concatenate([first.find(tf.constant(ids))[0], second.find(tf.constant(ids))[0]], 1)
    np.testing.assert_array_equal(loaded.serve(tf.constant(ids)).numpy(), want)
    assert want.tolist() == [[1, 1, 30, 30], [2, 2, 20, 20]]


def test_a_delta_of_a_name_too_long_for_a_file_is_refused_before_writing(tmp_path):
    """export_serving_delta names its files after the tables: a name that
    makes one longer than the file system takes was np.save's bare OSError
    midway, its directory left half-written beside delta_dir. A ValueError
    naming the variable now, before anything is written; so is a delta_dir
    whose name leaves no room for the name it is written under first."""
    limit = os.pathconf(str(tmp_path), "PC_NAME_MAX")
    table = sok.Variable(tf.ones([4, 2]), name="t" * (limit - 8))  # + ".keys.npy": limit + 1
    with pytest.raises(ValueError, match=rf"variable 't+\.\.\.t+': its name is {limit - 8} "
                                         rf"bytes long, which makes the delta file"):
        sok.export_serving_delta([table], 0, str(tmp_path / "d"))
    with pytest.raises(ValueError, match=r"delta_dir=.*bytes long; a delta is written beside"):
        sok.export_serving_delta([sok.Variable(tf.ones([4, 2]))], 0,
                                 str(tmp_path / ("d" * (limit - 5))))
    assert os.listdir(tmp_path) == []
    fits = sok.Variable(tf.ones([4, 2]), name="t" * (limit - 9))
    assert sok.export_serving_delta([fits], 0, str(tmp_path / "d")) == str(tmp_path / "d")


def _crafted_delta(directory, keys, rows, key_file="t.keys.npy", rows_file="t.rows.npy"):
    """A delta directory for one dynamic table 't', with the arrays and file
    names given (as a hostile or careless writer might make it)."""
    from sok_graph.serving import delta as delta_mod

    os.makedirs(directory, exist_ok=True)
    files = {}
    for part, array, name in (("keys", keys, key_file), ("rows", rows, rows_file)):
        path = os.path.normpath(os.path.join(directory, name))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        np.save(path, array, allow_pickle=True)
        files[part] = dict(file=name, bytes=os.path.getsize(path), crc32=delta_mod._crc(path))
    manifest = dict(format=delta_mod.DELTA_FORMAT, since=0, created=0, tables=[dict(
        name="t", kind="dynamic", key_dtype="int64", dtype="float32", dimension=2,
        rows=len(keys), files=files)])
    with open(os.path.join(directory, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    return directory


@tf2_only
def test_a_refused_export_leaves_the_previous_one(tmp_path):
    """An export that still holds sok ops is refused only after it was
    written; the export it would replace stays whole (it used to be
    overwritten, leaving a model with sok ops and a manifest of the wrong
    tables). A directory that is not an export is never replaced."""
    sok.init(comm_tool="none")
    user = sok.DynamicVariable(2, initializer="zeros", name="user")
    sok.assign(user, tf.constant([1], tf.int64), np.full((1, 2), 1.0, np.float32))
    sig = [tf.TensorSpec([None, 1], tf.int64)]

    class Good(tf.Module):
        def __call__(self, x):
            return sok.lookup_sparse([user], [tf.RaggedTensor.from_tensor(x)],
                                     combiners=["sum"])[0]

    class Bad(tf.Module):
        def __call__(self, x):
            from sok_graph.ops import util as util_ops

            distinct = util_ops.unique(tf.reshape(x, [-1]))[0]  # a sok op kept in the model
            return Good()(x) + tf.cast(tf.reduce_sum(distinct), tf.float32)

    export_dir = str(tmp_path / "model")
    sok.export_for_serving(Good(), export_dir, sig)
    with pytest.raises(RuntimeError, match="still holds sok_graph ops"):
        sok.export_for_serving(Bad(), export_dir, sig)
    loaded = tf.saved_model.load(export_dir)
    np.testing.assert_array_equal(loaded.serve(tf.constant([[1]], tf.int64)).numpy(), [[1, 1]])
    assert sorted(os.listdir(tmp_path)) == ["model"]  # no staging directory left
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="holds something other than a SavedModel"):
        sok.export_for_serving(Good(), str(mine), sig)
    assert (mine / "notes.txt").read_text() == "mine"
    # Files added to a previous export (TF Serving's warm-up requests, a
    # README) were deleted by the export replacing it, without a word.
    warmup = tmp_path / "model" / "assets.extra" / "tf_serving_warmup_requests"
    warmup.write_bytes(b"requests")
    (tmp_path / "model" / "README.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=r"files no export writes, \['README.txt', "
                                              r"'assets.extra/tf_serving_warmup_requests'\]"):
        sok.export_for_serving(Good(), export_dir, sig)
    assert warmup.read_bytes() == b"requests"
    assert (tmp_path / "model" / "README.txt").read_text() == "mine"
    warmup.unlink()
    (tmp_path / "model" / "README.txt").unlink()
    # The staging directory of an export killed mid-write (its process
    # gone) is deleted by the next export; a live writer's stays.
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = tmp_path / f"model.tmp-{gone.pid}-0123abcd"
    live = tmp_path / f"model.tmp-{os.getpid()}-4567cdef"
    for staged in (dead, live):
        staged.mkdir()
        (staged / "saved_model.pb").write_bytes(b"half")
    sok.export_for_serving(Good(), export_dir, sig)  # an export of its own files only
    assert not dead.exists() and (live / "saved_model.pb").read_bytes() == b"half"


@tf2_only
def test_int64_ids_for_an_int32_key_table_are_refused_at_export(tmp_path):
    """Training refuses int64 ids for an int32-key table; the export did
    not, and the served model narrowed them (id 2^32 + 5 served key 5's
    row). A TypeError naming the table, as in training."""
    sok.init(comm_tool="none")
    table = sok.DynamicVariable(2, initializer="zeros", name="narrow", key_type=tf.int32)

    class Model(tf.Module):
        def __call__(self, x):
            return sok.lookup_sparse([table], [tf.RaggedTensor.from_tensor(x)],
                                     combiners=["sum"])[0]

    with pytest.raises(TypeError, match="must hold int32 keys"):
        Model()(tf.constant([[2 ** 32 + 5]], tf.int64))
    with pytest.raises(TypeError, match="table 'narrow' must be int32"):
        sok.export_for_serving(Model(), str(tmp_path / "m"),
                               [tf.TensorSpec([None, 1], tf.int64)])
    assert not os.path.exists(str(tmp_path / "m"))
    sok.export_for_serving(Model(), str(tmp_path / "m"), [tf.TensorSpec([None, 1], tf.int32)])


def test_delta_of_well_formed_arrays_is_read(tmp_path):
    d = _crafted_delta(str(tmp_path / "ok"), np.array([6, 7], np.int64),
                       np.ones((2, 2), np.float32))
    entry, keys, rows = sok.serving.delta.read_serving_delta(d)["t"]
    assert keys.tolist() == [6, 7] and rows.shape == (2, 2)


@pytest.mark.parametrize("case,keys,rows,pattern", [
    ("float keys", np.array([6.5, 7.0]), np.ones((2, 2), np.float32),
     r"keys of dtype float64.*must be a vector of integers"),
    ("nan row", np.array([6, 7], np.int64), np.array([[1, 2], [np.nan, 0]], np.float32),
     r"NaN or infinite value in the row of key 7"),
    ("inf row", np.array([6, 7], np.int64), np.array([[1, np.inf], [0, 0]], np.float32),
     r"NaN or infinite value in the row of key 6"),
    ("object keys", np.array([6, "x"], dtype=object), np.ones((2, 2), np.float32),
     r"t.keys.npy is not a numpy array of numbers"),
    ("integer rows", np.array([6, 7], np.int64), np.ones((2, 2), np.int64),
     r"rows of dtype int64.*float matrix"),
])
def test_delta_with_bad_arrays_is_refused(tmp_path, case, keys, rows, pattern):
    d = _crafted_delta(str(tmp_path / "bad"), keys, rows)
    with pytest.raises(sok.serving.delta.DeltaError, match=pattern):
        sok.serving.delta.read_serving_delta(d)


@pytest.mark.parametrize("edit,pattern", [
    (lambda m: m.pop("tables"), r"the manifest's tables is None; it must be a list"),
    (lambda m: m.update(tables="abc"), r"the manifest's tables is 'abc'"),
    (lambda m: m.update(tables=[1]), r"tables\[0\] is 1; it must be an object"),
    (lambda m: m["tables"][0].pop("rows"), r"tables\[0\] has rows None; it must be a int"),
    (lambda m: m["tables"][0].update(dimension="2"), r"has dimension '2'; it must be a int"),
    (lambda m: m["tables"][0]["files"]["keys"].pop("crc32"),
     r"has files\['keys'\] .*it must name the file, its bytes and its crc32"),
    (lambda m: m["tables"][0]["files"].pop("rows"), r"has files\['rows'\] None"),
    (lambda m: m["tables"][0].update(table_rows=2.0), r"has table_rows 2.0; it must be a int"),
    (lambda m: m["tables"][0].update(dtype=["float32"]), r"has dtype \['float32'\]; it must "
                                                         r"be a dtype's name"),
    (lambda m: m["tables"].append(dict(m["tables"][0])),
     r"tables\[1\] names table 't' a second time"),
])
def test_a_hand_edited_manifest_is_refused_naming_the_field(tmp_path, edit, pattern):
    """A KeyError or TypeError naming nothing before."""
    d = _crafted_delta(str(tmp_path / "edited"), np.array([6, 7], np.int64),
                       np.ones((2, 2), np.float32))
    path = os.path.join(d, "manifest.json")
    manifest = json.load(open(path))
    edit(manifest)
    json.dump(manifest, open(path, "w"))
    with pytest.raises(sok.serving.delta.DeltaError, match=pattern):
        sok.serving.delta.read_serving_delta(d)


def test_a_static_delta_of_another_tables_size_is_refused(tmp_path):
    """A static table's delta holds it whole and says how many rows that
    is: one read from a table of another size is another model's table of
    the same name, and wrote over the served table's first rows without an
    error before."""
    sok.init()

    class Model(tf.Module):
        def __init__(self, rows, seed):
            super().__init__()
            self.item = sok.Variable(np.random.default_rng(seed).normal(size=(rows, 3))
                                     .astype(np.float32), name="item_of_delta_test")

        @tf.function
        def __call__(self, ids):
            return sok.all2all_dense_embedding(self.item, ids)

    served = Model(10, 0)
    export_dir = str(tmp_path / "a")
    sok.export_for_serving(served, export_dir, [tf.TensorSpec([None], tf.int64)])
    created = json.load(open(os.path.join(export_dir, "assets.extra",
                                          "sok_serving.json")))["created"]
    other = Model(5, 1)
    # Two live tables of one name: a list of one of them is refused (which
    # the export served under that name cannot be told), a dict is taken.
    with pytest.raises(ValueError, match="shares its name with 1 other live sok table"):
        sok.export_serving_delta([other.item], created, str(tmp_path / "delta"))
    sok.export_serving_delta({"item_of_delta_test": other.item}, created,
                             str(tmp_path / "delta"))
    with pytest.raises(sok.serving.delta.DeltaError,
                       match=r"'item_of_delta_test': the delta was read from a static table "
                             r"of 5 rows; the model at .* serves 10: the delta is of another"):
        sok.apply_serving_delta(export_dir, str(tmp_path / "delta"),
                                output_dir=str(tmp_path / "out"))
    assert not os.path.exists(str(tmp_path / "out"))
    # The same table's own delta (all 10 rows) is taken.
    sok.export_serving_delta({"item_of_delta_test": served.item}, created,
                             str(tmp_path / "own"))
    sok.apply_serving_delta(export_dir, str(tmp_path / "own"), output_dir=str(tmp_path / "out"))


@pytest.mark.parametrize("name", ["../other/t.keys.npy", "/tmp/t.keys.npy", "sub/t.keys.npy",
                                  ".."])
def test_delta_files_outside_its_directory_are_refused(tmp_path, name):
    d = str(tmp_path / "delta")
    if name.startswith("/") or name == "..":
        _crafted_delta(d, np.array([6, 7], np.int64), np.ones((2, 2), np.float32))
        manifest = json.load(open(os.path.join(d, "manifest.json")))
        manifest["tables"][0]["files"]["keys"]["file"] = name
        json.dump(manifest, open(os.path.join(d, "manifest.json"), "w"))
    else:
        _crafted_delta(d, np.array([6, 7], np.int64), np.ones((2, 2), np.float32),
                       key_file=name)
    with pytest.raises(sok.serving.delta.DeltaError,
                       match=r"plain names inside its own directory"):
        sok.serving.delta.read_serving_delta(d)


# ------------------------------------------------------------ the table protocol

def _serving_tables(key_dtype, session=None):
    """A StaticTable and a DynamicTable of known contents, and numpy's
    account of them: {row number: row} and {key: row}. The dynamic table is
    filled by two deltas (the second overwrites held keys and adds keys
    between them), so its rows are not stored in key order. With `session`
    the tables are built in its graph and filled there."""
    from sok_graph.serving.tables import DynamicTable, StaticTable

    rng = _rng()
    static_rows = rng.normal(size=(7, 3)).astype(np.float32)
    deltas = [np.array([40, -3, 1 << 30, 0, 17], np.int64),
              np.array([17, -(1 << 29), 5, -3, 41, 2], np.int64)]
    deltas = [(k, rng.normal(size=(len(k), 3)).astype(np.float32)) for k in deltas]
    want_dynamic = {}
    for keys, rows in deltas:
        want_dynamic.update(zip(keys.tolist(), rows))
    static = StaticTable("s", variable=compat.resource_variable_class()(
        initial_value=static_rows, trainable=False, name="static_rows"))
    dynamic = DynamicTable("d", key_dtype, 3)
    if session is None:
        for keys, rows in deltas:
            dynamic.apply_delta(tf.constant(keys, key_dtype), rows)
    else:
        applies = [dynamic.apply_delta(tf.constant(k, key_dtype), r) for k, r in deltas]
        session.run(tf.compat.v1.global_variables_initializer())
        for apply in applies:  # one at a time: the second delta overwrites the first
            session.run(apply)
    return static, dynamic, dict(enumerate(static_rows)), want_dynamic


def _check_chunked_reads(static, dynamic, want_static, want_dynamic, key_dtype, runner):
    scalar = tf.TensorSpec([], tf.int64)
    for table, want, keys_dtype in ((static, want_static, np.int64),
                                    (dynamic, want_dynamic, key_dtype.as_numpy_dtype)):
        count = int(runner.make(table.row_count, [])())
        assert count == len(want)
        read = runner.make(table.export_chunk, [scalar, scalar])
        for limit in (1, 2, 3, 5, count, count + 4, 1 << 62):
            got, order, offset = {}, [], 0
            while offset < count:
                keys, rows, next_offset = read(np.int64(offset), np.int64(limit))
                assert int(next_offset) == min(offset + limit, count), (limit, offset)
                assert keys.dtype == keys_dtype and rows.dtype == np.float32
                assert len(keys) == len(rows) == int(next_offset) - offset
                for key, row in zip(keys.tolist(), rows):
                    assert key not in got, (limit, key)
                    got[key] = row
                    order.append(key)
                offset = int(next_offset)
            for key, row in want.items():
                np.testing.assert_array_equal(got[key], row)
            # every row once, in the table's order: row numbers, or ascending keys
            assert order == sorted(want), limit
        keys, rows, next_offset = read(np.int64(count), np.int64(3))
        assert len(keys) == 0 and rows.shape == (0, 3) and int(next_offset) == count


@pytest.mark.parametrize("key_dtype", [tf.int64, tf.int32], ids=["int64", "int32"])
def test_serving_tables_read_in_chunks_as_training_tables_do(key_dtype):
    """row_count and export_chunk of both serving table kinds against numpy:
    chunks of 1, of sizes that do not divide the table, of its size, larger,
    and "everything" give every row exactly once with its exact value; next
    offset is min(offset + limit, rows); keys are what the training tables
    give (a static table's int64 row numbers, a dynamic table's keys in its
    key dtype). Read eagerly, then in a TF1 graph through a Session, as
    exports read tables (sources.Runner); there the tables are also filled
    by deltas run in the Session, whose ops only data dependencies order
    (apply_delta once read the rows twice, and the new keys' rows could
    point past the table when the second read ran after the append)."""
    from sok_graph.serving import sources

    _check_chunked_reads(*_serving_tables(key_dtype), key_dtype, sources.Runner())
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        _check_chunked_reads(*_serving_tables(key_dtype, session), key_dtype,
                             sources.Runner(session))


def test_serving_tables_chunk_where_training_tables_chunk():
    """The same offsets and limits, past the end included, give the same
    number of rows and the same next offset on a serving table as on the
    training table of its kind holding the same rows; a serving dynamic
    table refuses an offset or limit its training kind's op refuses."""
    static, dynamic, want_static, want_dynamic = _serving_tables(tf.int64)
    trained_static = sok.Variable(np.stack([want_static[i] for i in range(len(want_static))]))
    trained_dynamic = sok.DynamicVariable(3)
    sok.assign(trained_dynamic, tf.constant(list(want_dynamic), tf.int64),
               np.stack(list(want_dynamic.values())))
    for serving, trained in ((static, trained_static), (dynamic, trained_dynamic)):
        count = int(trained.row_count())
        assert int(serving.row_count()) == count
        for offset in range(count + 3):
            for limit in (1, 2, 4, count + 1):
                got = serving.export_chunk(offset, limit)
                want = trained.export_chunk(offset, limit)
                assert (len(got[0]), int(got[2])) == (len(want[0]), int(want[2])), \
                    (type(serving).__name__, offset, limit)
    for offset, limit in ((-1, 2), (0, 0)):
        for table in (dynamic, trained_dynamic):
            with pytest.raises(tf.errors.InvalidArgumentError):
                table.export_chunk(offset, limit)


def test_serving_tables_refuse_updated_after_and_take_no_training_path():
    """A serving table keeps no write times (an export copies rows, a delta
    stamps none), so a read of the rows written since a time is refused, as
    a sok.Variable refuses it, instead of passing every row off as changed.
    Serving tables say no table_kind (sok_graph/tables/__init__.py says
    why): is_dynamic is False for both, so no training path takes one."""
    from sok_graph.tables import is_dynamic

    static, dynamic, _, _ = _serving_tables(tf.int64)
    for table in (static, dynamic):
        with pytest.raises(ValueError, match=f"serving table '{table.table_name}' keeps no "
                                             "write times"):
            table.export_chunk(0, 5, updated_after=0)
        assert len(table.export_chunk(0, 5, updated_after=None)[0]) == 5
        assert getattr(table, "table_kind", None) is None and not is_dynamic(table)
    assert (static.kind, dynamic.kind) == ("static", "dynamic")


def test_serving_dynamic_table_holding_no_keys_serves_and_takes_deltas():
    """A serving dynamic table with no keys (its training table was never
    written) serves its default row, reads as empty, and takes a delta, in
    the functions a SavedModel holds; a gather in the empty index failed
    every one of them on a CPU."""
    from sok_graph.serving.tables import DynamicTable

    table = DynamicTable("empty", tf.int64, 2, default_row=1.5)
    lookup, apply_delta = table.serving_functions()
    np.testing.assert_array_equal(lookup(tf.constant([3, -8], tf.int64)), np.full((2, 2), 1.5))
    keys, rows, next_offset = table.export_chunk(0, 4)
    assert int(table.row_count()) == 0 and len(keys) == 0 and int(next_offset) == 0
    assert int(apply_delta(tf.constant([3], tf.int64), tf.ones([1, 2]))) == 1
    np.testing.assert_array_equal(lookup(tf.constant([3, -8], tf.int64)),
                                  [[1.0, 1.0], [1.5, 1.5]])


@tf2_only  # on TF 1.15 a tf.function fails placing the gather by the eager table
def test_tf_nn_embedding_lookup_on_a_dynamic_table_is_exported(tmp_path):
    """As docs/serving.md says, tf.nn.embedding_lookup on a DynamicVariable
    serves too: its export failed ("untracked resource"), TensorFlow's
    placement of the gather having taken the training table's handle into
    the servable function. Served rows against the table's own."""
    sok.init(comm_tool="none")
    user = sok.DynamicVariable(3, initializer="zeros", name="user_embedding_lookup")
    held = np.array([4, 2 ** 40, -7], np.int64)
    rows = np.arange(9, dtype=np.float32).reshape(3, 3)
    sok.assign(user, tf.constant(held), rows)

    class Model(tf.Module):
        def __init__(self):
            super().__init__()
            self.user = user

        def __call__(self, ids):
            return tf.nn.embedding_lookup(self.user, ids)

    export_dir = str(tmp_path / "lookup")
    sok.export_for_serving(Model(), export_dir, [tf.TensorSpec([None], tf.int64)])
    served = tf.saved_model.load(export_dir)
    ids = np.array([2 ** 40, 4, 5, -7, 4], np.int64)
    got = served.signatures["serving_default"](tf.constant(ids))
    (out,) = got.values()
    expected = np.stack([rows[1], rows[0], np.zeros(3), rows[2], rows[0]])
    np.testing.assert_array_equal(out.numpy(), expected)


# ------------------------------------------------------------ applying deltas

def _one_table_export(tmp_path, name="export", **export_args):
    """An export of a model reading one dynamic table 'user' (key 1: row 1),
    and the table. export_args: export_for_serving's further arguments."""
    sok.init(comm_tool="none")
    user = sok.DynamicVariable(2, initializer="zeros", name="user")
    sok.assign(user, tf.constant([1], tf.int64), np.full((1, 2), 1.0, np.float32))

    class Model(tf.Module):
        def __call__(self, x):
            return sok.lookup_sparse([user], [tf.RaggedTensor.from_tensor(x)],
                                     combiners=["sum"])[0]

    export_dir = str(tmp_path / name)
    sok.export_for_serving(Model(), export_dir, [tf.TensorSpec([None, 1], tf.int64)],
                           **export_args)
    return export_dir, user


def _export_created(export_dir):
    """When the export at export_dir began to read its tables (its
    sok_serving.json): the since of a first delta that misses no row."""
    with open(os.path.join(export_dir, "assets.extra", "sok_serving.json")) as f:
        return json.load(f)["created"]


def _export_state(export_dir):
    """({role: array} of table 'user' in the export's checkpoint, [ids of
    the deltas recorded as applied])."""
    extra = os.path.join(export_dir, "assets.extra")
    with open(os.path.join(extra, "sok_serving.json")) as f:
        where = {t["name"]: t for t in json.load(f)["tables"]}["user"]["checkpoint_keys"]
    reader = tf.train.load_checkpoint(os.path.join(export_dir, "variables", "variables"))
    arrays = {role: reader.get_tensor(key) for role, key in sorted(where.items())}
    applied = []
    if os.path.exists(os.path.join(extra, "sok_deltas.json")):
        with open(os.path.join(extra, "sok_deltas.json")) as f:
            applied = [a["id"] for a in json.load(f)["applied"]]
    return arrays, applied


def _same_state(a, b):
    return a[1] == b[1] and sorted(a[0]) == sorted(b[0]) and all(
        np.array_equal(a[0][k], b[0][k]) for k in a[0])


def _served_rows(export_dir, keys):
    """The rows the export serves for `keys` (numpy, from its checkpoint): a
    key the table does not hold gets row 0, the default."""
    arrays = _export_state(export_dir)[0]
    index = dict(zip(arrays["keys"].tolist(), arrays["index"].tolist()))
    return np.stack([arrays["rows"][index.get(int(k), 0)] for k in keys])


@tf2_only
def test_lookups_while_deltas_are_applied_see_one_state_of_the_table(tmp_path):
    """A loaded export's lookups running in a thread while apply_delta_fn
    adds keys and rewrites held ones (from two threads at once): every
    lookup gives every key its own row, all of one delta (the table before
    a delta or after it). apply_delta_fn assigned rows, keys and index one
    after another, and a lookup between them read keys of one state with
    the index of another: other keys' rows. Two deltas applied at once
    wrote over each other's rows. The final rows are numpy's."""
    import threading

    sok.init(comm_tool="none")
    table = sok.DynamicVariable(2, initializer="zeros", name="a")
    held = np.arange(0, 1000, 2, dtype=np.int64)  # row of key k after delta v: [k, v]
    sok.assign(table, tf.constant(held), np.stack([held, held * 0], 1).astype(np.float32))

    class Model(tf.Module):
        def __call__(self, ids):
            return tf.nn.embedding_lookup(table, ids)

    export_dir = str(tmp_path / "export")
    sok.export_for_serving(Model(), export_dir, [tf.TensorSpec([None], tf.int64)])
    served = tf.saved_model.load(export_dir).sok_tables["a"]
    probe = tf.constant(held)
    stop, wrong, lookups = threading.Event(), [], [0]

    def serve():
        while not stop.is_set():
            got = served.lookup_fn(probe).numpy()
            lookups[0] += 1
            if not (np.array_equal(got[:, 0], held) and (got[:, 1] == got[0, 1]).all()):
                wrong.append(got)

    rng = np.random.default_rng(3)
    # Writer 0 rewrites the held keys and adds odd negative keys, writer 1
    # adds even negative ones (below every held key: the held keys move up
    # in keys and index): numpy's account of the rows they leave.
    want = {int(k): [float(k), 0.0] for k in held}
    drawn = rng.permutation(10 ** 6)[:1600]
    added = [-(drawn[:800] * 2 + 1), -(drawn[800:] * 2 + 2)]
    deltas = [[], []]
    for v, new in enumerate(np.array_split(added[0], 400), 1):
        keys = np.concatenate([held, new])
        deltas[0].append((keys, np.stack([keys, np.full(len(keys), v)], 1)))
        want.update({int(k): [float(k), float(v)] for k in keys})
    for new in np.array_split(added[1], 400):
        deltas[1].append((new, np.stack([new, np.full(len(new), -1)], 1)))
        want.update({int(k): [float(k), -1.0] for k in new})

    def write(which):
        for keys, rows in deltas[which]:
            served.apply_delta_fn(tf.constant(keys, tf.int64), tf.constant(rows, tf.float32))

    reader = threading.Thread(target=serve)
    writers = [threading.Thread(target=write, args=(w,)) for w in (0, 1)]
    reader.start()
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    stop.set()
    reader.join()
    assert lookups[0] > 50 and not wrong, (lookups[0], len(wrong), wrong[:1])
    keys = np.array(sorted(want), np.int64)
    np.testing.assert_array_equal(served.keys.numpy(), keys)
    np.testing.assert_array_equal(served.lookup_fn(tf.constant(keys)).numpy(),
                                  np.array([want[k] for k in keys.tolist()], np.float32))


class _Stop(BaseException):
    """Raised inside apply_serving_delta, as a crash stops it at that point
    (not an Exception: no `except Exception` of the code under test may
    catch it)."""


@tf2_only
def test_exports_and_deltas_are_on_disk_before_they_are_renamed_into_place(tmp_path,
                                                                           monkeypatch):
    """export_for_serving, export_serving_delta and apply_serving_delta
    write beside their place and rename into it; every file they put there
    is fsynced before that rename (as a dump's are), so a machine that
    crashes after the call returned cannot leave an export or delta of empty
    files. Only the dump's own files were: a delta's, a SavedModel's and
    an applied export's stayed in the page cache."""
    synced, renamed = [], []
    real_fsync, real_rename = os.fsync, os.rename

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real_fsync(fd)

    def rename(src, dst):
        renamed.append((os.path.abspath(src), os.path.abspath(dst), len(synced)))
        return real_rename(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    export_dir, user = _one_table_export(tmp_path)
    sok.assign(user, tf.constant([5], tf.int64), np.ones((1, 2), np.float32))
    delta_dir = sok.export_serving_delta([user], _export_created(export_dir),
                                         str(tmp_path / "delta"))
    sok.apply_serving_delta(export_dir, delta_dir)
    for final in (os.path.abspath(export_dir), os.path.abspath(delta_dir)):
        moves = [(src, at) for src, dst, at in renamed if dst == final]
        assert moves, f"{final} was not renamed into place"
        src, at = moves[-1]
        files = [os.path.relpath(os.path.join(root, f), final)
                 for root, _, names in os.walk(final) for f in names]
        assert files
        unsynced = [f for f in files if os.path.join(src, f) not in synced[:at]]
        assert not unsynced, f"{final}: not on disk before its rename: {unsynced}"


@tf2_only
def test_a_delta_is_refused_for_a_damaged_export_or_into_its_own_directory(tmp_path):
    """apply_serving_delta copied the export's saved_model.pb as it was: one
    cut short (or another file in its place) went into the updated export
    without a word, and its fingerprint was rewritten to match it. Now the
    file must parse as a SavedModel and be the one the export's fingerprint
    was written for; nothing changes otherwise. An output_dir inside
    export_dir or delta_dir (a copy written into what it copies) is
    refused too."""
    from tensorflow.core.protobuf import saved_model_pb2

    export_dir, user = _one_table_export(tmp_path)
    since = _export_created(export_dir)
    sok.assign(user, tf.constant([5], tf.int64), np.array([[4, 5]], np.float32))
    delta_dir = sok.export_serving_delta([user], since, str(tmp_path / "delta"))
    for name, directory in (("export_dir", export_dir), ("delta_dir", delta_dir)):
        inside = os.path.join(directory, "copy")
        with pytest.raises(ValueError, match=f"output_dir .* is inside {name}"):
            sok.apply_serving_delta(export_dir, delta_dir, output_dir=inside)
        assert not os.path.exists(inside)
    pb = os.path.join(export_dir, "saved_model.pb")
    with open(pb, "rb") as f:
        whole = f.read()
    other = saved_model_pb2.SavedModel()
    other.ParseFromString(whole)
    other.meta_graphs[0].meta_info_def.tags.append("another")  # parses, not the same file
    cases = [(whole[:len(whole) // 2], "does not parse as a SavedModel")]
    if os.path.exists(os.path.join(export_dir, "fingerprint.pb")):  # TF 2.12 and up
        cases.append((other.SerializeToString(), "not the file its fingerprint.pb was written"))
    state = _export_state(export_dir)
    for damaged, words in cases:
        with open(pb, "wb") as f:
            f.write(damaged)
        with pytest.raises(sok.serving.delta.DeltaError, match=words):
            sok.apply_serving_delta(export_dir, delta_dir)
        assert _same_state(_export_state(export_dir), state)
        assert sorted(os.listdir(tmp_path)) == ["delta", "export"]
    with open(pb, "wb") as f:
        f.write(whole)
    # export_dir as a symbolic link (TF Serving's version directory often
    # is one): the in-place update put a directory where the link was, kept
    # the link beside it for good and left its target as it was. Refused.
    link = tmp_path / "served"
    link.symlink_to(export_dir)
    with pytest.raises(FileExistsError, match=r"export_dir=.*served.* is a symbolic link"):
        sok.apply_serving_delta(str(link), delta_dir)
    assert os.path.islink(link) and _same_state(_export_state(export_dir), state)
    link.unlink()
    assert sok.apply_serving_delta(export_dir, delta_dir) == {"user": 1}
    np.testing.assert_array_equal(_served_rows(export_dir, np.array([1, 5])), [[1, 1], [4, 5]])
    # The staging directory of a delta killed mid-write (hidden, named
    # without its writer's pid, it stayed for good) is deleted by the next
    # delta written there once its process is gone.
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = tmp_path / f"delta2.tmp-{gone.pid}-0123abcd"
    dead.mkdir()
    (dead / "user.keys.npy").write_bytes(b"half")
    sok.export_serving_delta([user], since, str(tmp_path / "delta2"))
    assert not dead.exists() and (tmp_path / "delta2").is_dir()
    assert not [e for e in os.listdir(tmp_path) if ".tmp-" in e]


@tf2_only
def test_a_delta_stopped_anywhere_leaves_the_export_whole(tmp_path):
    """apply_serving_delta in place, stopped at every step of its own code
    and of dump_load's swap (an exception raised at the n-th call, return
    or C call there, for every n): the export is whole afterwards,
    either as it was (old rows, no delta recorded) or, stopped after its
    swap, updated (new rows, the delta recorded), and loads in TensorFlow.
    The export used to be rewritten in place: its checkpoint files were
    deleted, then the new ones renamed in, so a stop between left an export
    without variables."""
    import shutil

    from sok_graph import dump_load
    from sok_graph.serving import delta as delta_mod

    export_dir, user = _one_table_export(tmp_path)
    since = _export_created(export_dir)
    sok.assign(user, tf.constant([1, 5], tf.int64), np.array([[2, 3], [4, 5]], np.float32))
    delta_dir = sok.export_serving_delta([user], since, str(tmp_path / "delta"))
    pristine = str(tmp_path / "pristine")
    shutil.copytree(export_dir, pristine)
    old = _export_state(export_dir)
    np.testing.assert_array_equal(_served_rows(export_dir, np.array([1, 5])), [[1, 1], [0, 0]])

    # sok_graph's own steps (an exception injected inside the standard
    # library's breaks its own invariants; what reaches sok_graph from a
    # call into it that fails is an exception of that call, as here).
    files = {os.path.abspath(m.__file__).replace(".pyc", ".py") for m in (delta_mod, dump_load)}

    def hook_stopping_at(n, seen):
        # Not inside the lock's own code: stopped there, this process would
        # keep the lock (a crash releases it with the process).
        def hook(frame, event, arg):
            if frame.f_code.co_filename in files \
                    and frame.f_code.co_name != "writers_take_turns":
                seen[0] += 1
                if seen[0] == n:
                    raise _Stop(f"stopped at event {n}: {event} in "
                                f"{frame.f_code.co_name}")
        return hook

    probe = str(tmp_path / "probe")
    shutil.copytree(export_dir, probe)
    seen = [0]
    sys.setprofile(hook_stopping_at(-1, seen))
    try:
        sok.apply_serving_delta(probe, delta_dir)
    finally:
        sys.setprofile(None)
    total = seen[0]
    new = _export_state(probe)
    assert new[1] and not old[1] and not _same_state(old, new)
    np.testing.assert_array_equal(_served_rows(probe, np.array([1, 5, 9])),
                                  [[2, 3], [4, 5], [0, 0]])
    outcomes = {"old": 0, "new": 0}
    for n in range(1, total + 1):
        sys.setprofile(hook_stopping_at(n, [0]))
        try:
            sok.apply_serving_delta(export_dir, delta_dir)
            stopped = False
        except _Stop:
            stopped = True
        finally:
            sys.setprofile(None)
        assert stopped, n
        assert os.path.exists(os.path.join(export_dir, "saved_model.pb")), n
        state = _export_state(export_dir)
        # No staging directory stays (a crashed process's goes with the next
        # apply); a copy moved aside may, when stopped after the swap.
        beside = [f for f in os.listdir(tmp_path) if f.startswith("export.")]
        assert all(f.startswith("export.old-") for f in beside), (n, beside)
        if _same_state(state, old):
            outcomes["old"] += 1
        else:
            assert _same_state(state, new), f"stopped at event {n}: neither the old export " \
                                            f"nor the updated one"
            outcomes["new"] += 1
            for f in beside + ["export"]:
                shutil.rmtree(os.path.join(tmp_path, f))
            shutil.copytree(pristine, export_dir)
    assert outcomes["old"] > 0 and outcomes["new"] > 0, outcomes
    print(f"stops: {outcomes}")
    # A process killed between the swap's two renames leaves no export_dir,
    # and the previous export moved aside: the next apply starts from it.
    os.rename(export_dir, f"{export_dir}.old-{time.time_ns():020d}-0123abcd")
    assert sok.apply_serving_delta(export_dir, delta_dir) == {"user": 2}
    assert _same_state(_export_state(export_dir), new)
    loaded = tf.saved_model.load(export_dir)
    np.testing.assert_array_equal(loaded.serve(tf.constant([[1], [5], [9]], tf.int64)).numpy(),
                                  [[2, 3], [4, 5], [0, 0]])
    assert sorted(os.listdir(tmp_path)) == ["delta", "export", "pristine", "probe"]
    # An export in place that lost its saved_model.pb (a copy cut short, a
    # file deleted) is no such case: the delta was applied to the older
    # copy moved aside, which then replaced the export without a word.
    older = f"{export_dir}.old-{time.time_ns():020d}-0123abcd"
    shutil.copytree(pristine, older)
    os.remove(os.path.join(export_dir, "saved_model.pb"))
    held = sorted(os.listdir(export_dir))
    with pytest.raises(sok.serving.delta.DeltaError,
                       match=r"no export at .*export \(no saved_model.pb or saved_model.pbtxt; "
                             r"it holds \["):
        sok.apply_serving_delta(export_dir, delta_dir)
    assert sorted(os.listdir(export_dir)) == held and os.path.isdir(older)


@tf2_only
def test_a_delta_is_applied_once_and_in_order(tmp_path, monkeypatch):
    """The export records the deltas applied to it: the same delta twice,
    a delta older than one applied (its rows would overwrite newer ones) and
    a delta older than the export itself are refused with a DeltaError
    naming the delta, and the export is unchanged; a delta of before deltas
    had an id is known by its manifest. They all used to be applied (rows
    rolled back without a word). A failure midway (the checkpoint write
    raising) leaves the export as it was, and the delta may be applied
    after it."""
    from sok_graph.serving import delta as delta_mod

    export_dir, user = _one_table_export(tmp_path)
    since = _export_created(export_dir)
    deltas = []
    for step, (key, value) in enumerate([(1, 2.0), (5, 3.0), (1, 4.0)]):
        sok.assign(user, tf.constant([key], tf.int64), np.full((1, 2), value, np.float32))
        deltas.append(sok.export_serving_delta([user], since, str(tmp_path / f"d{step}")))
        time.sleep(0.002)  # distinct creation times
    # numpy's account of what the export serves after each delta
    want = [{1: [2, 2]}, {1: [2, 2], 5: [3, 3]}, {1: [4, 4], 5: [3, 3]}]

    def served(directory):
        return {int(k): r.tolist() for k, r in zip(
            [1, 5], _served_rows(directory, np.array([1, 5]))) if r.any()}

    assert served(export_dir) == {1: [1, 1]}
    real_write = delta_mod._write_checkpoint

    def write_then_fail(prefix, tensors):
        real_write(prefix, tensors)
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(delta_mod, "_write_checkpoint", write_then_fail)
    with pytest.raises(OSError, match="simulated"):
        sok.apply_serving_delta(export_dir, deltas[0])
    monkeypatch.undo()
    assert served(export_dir) == {1: [1, 1]} and _export_state(export_dir)[1] == []

    sok.apply_serving_delta(export_dir, deltas[0])
    assert served(export_dir) == want[0]
    with pytest.raises(delta_mod.DeltaError, match=r"d0 \(id [0-9a-f]{32}\) was already applied"):
        sok.apply_serving_delta(export_dir, deltas[0])
    sok.apply_serving_delta(export_dir, deltas[2])
    assert served(export_dir) == want[2]
    before = _export_state(export_dir)
    with pytest.raises(delta_mod.DeltaError, match=r"d1 was exported at .*not after delta "
                                                   r".*apply deltas in the order"):
        sok.apply_serving_delta(export_dir, deltas[1])
    assert _same_state(_export_state(export_dir), before) and served(export_dir) == want[2]

    # A copy (output_dir) starts from its source's record; an export made
    # after a delta holds newer rows than it.
    copy = str(tmp_path / "copy")
    with pytest.raises(delta_mod.DeltaError, match="already applied"):
        sok.apply_serving_delta(export_dir, deltas[2], output_dir=copy)
    assert not os.path.exists(copy)
    fresh, _ = _one_table_export(tmp_path, "fresh")  # made after the deltas
    with pytest.raises(delta_mod.DeltaError, match=r"d0 was exported at .*before the export at "
                                                   r".*fresh was made"):
        sok.apply_serving_delta(fresh, deltas[0])

    # A delta without an id (written before deltas had one) is applied once.
    since = _export_created(fresh)
    sok.assign(user, tf.constant([7], tf.int64), np.full((1, 2), 6.0, np.float32))
    # (a dict: the fresh export's table 'user' lives on beside this one)
    new_delta = sok.export_serving_delta({"user": user}, since, str(tmp_path / "d3"))
    with open(os.path.join(new_delta, "manifest.json")) as f:
        manifest = json.load(f)
    del manifest["id"]
    with open(os.path.join(new_delta, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    sok.apply_serving_delta(fresh, new_delta)
    np.testing.assert_array_equal(_served_rows(fresh, np.array([7])), [[6, 6]])
    with pytest.raises(delta_mod.DeltaError, match=r"d3 \(id manifest-sha256-[0-9a-f]{64}\) "
                                                   r"was already applied"):
        sok.apply_serving_delta(fresh, new_delta)


@tf2_only
def test_an_export_swaps_in_under_the_appliers_lock(tmp_path, monkeypatch):
    """export_for_serving swaps its export in holding the lock that
    apply_serving_delta holds from reading the export to swapping in its
    update. It swapped without it: an export swapped in while an applier
    worked was replaced by the older export plus the delta (and deleted as
    a moved-aside copy), and the check that refuses a delta older than the
    export had read the older export's time."""
    import fcntl

    from sok_graph.serving import export as export_mod

    export_dir, user = _one_table_export(tmp_path)
    parent = os.path.dirname(os.path.abspath(export_dir))

    def lock_held():
        # flock locks belong to an open file: another open of the
        # directory, in this process too, cannot take a lock held.
        fd = os.open(parent, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    held = []
    real_swap = export_mod.swap_into_place

    def swap(tmp, final):
        held.append(lock_held())
        return real_swap(tmp, final)

    monkeypatch.setattr(export_mod, "swap_into_place", swap)
    sok.assign(user, tf.constant([1], tf.int64), np.full((1, 2), 2.0, np.float32))

    class Model(tf.Module):
        def __call__(self, x):
            return sok.lookup_sparse([user], [tf.RaggedTensor.from_tensor(x)],
                                     combiners=["sum"])[0]

    sok.export_for_serving(Model(), export_dir, [tf.TensorSpec([None, 1], tf.int64)])
    assert held == [True]
    assert not lock_held()
    np.testing.assert_array_equal(_served_rows(export_dir, np.array([1])), [[2, 2]])


def test_deltas_of_a_tf1_export_are_applied_once_and_in_order(tmp_path):
    """The same for a TF1 (Session) export, on every TensorFlow: deltas
    applied in order give the rows numpy expects; the same delta again, or
    an older one after a newer, is refused and the export is unchanged."""
    import shutil

    from sok_graph.serving import delta as delta_mod

    with tf.Graph().as_default():
        user, keys, rows, assign = _assignable_user_in_graph()

        build_fn = _serving_build_fn(user_output="out")

        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(assign, {keys: [1], rows: [[1, 1]]})
            export_dir = str(tmp_path / "tf1")
            sok.export_for_serving(build_fn, export_dir, session=sess)
            since = _export_created(export_dir)
            deltas = []
            for step, (key, value) in enumerate([(1, 2.0), (5, 3.0)]):
                sess.run(assign, {keys: [key], rows: [[value, value]]})
                deltas.append(sok.export_serving_delta([user], since, str(tmp_path / f"d{step}"),
                                                       session=sess))
                time.sleep(0.002)  # distinct creation times
    want = {1: [1, 1], 5: [0, 0]}
    for delta_dir, changed in zip(deltas, [{1: [2, 2]}, {5: [3, 3]}]):
        sok.apply_serving_delta(export_dir, delta_dir)
        want.update(changed)
        got = _served_rows(export_dir, np.array(sorted(want)))
        np.testing.assert_array_equal(got, [want[k] for k in sorted(want)])
    state = _export_state(export_dir)
    for delta_dir, words in ((deltas[1], "was already applied"),
                             (deltas[0], "was already applied")):
        with pytest.raises(delta_mod.DeltaError, match=words):
            sok.apply_serving_delta(export_dir, delta_dir)
    out_of_order = str(tmp_path / "tf1_copy")
    shutil.copytree(export_dir, out_of_order)
    os.remove(os.path.join(out_of_order, "assets.extra", "sok_deltas.json"))  # as exported
    sok.apply_serving_delta(out_of_order, deltas[1])
    with pytest.raises(delta_mod.DeltaError, match="apply deltas in the order they were exported"):
        sok.apply_serving_delta(out_of_order, deltas[0])
    assert _same_state(_export_state(export_dir), state)


@tf2_only
def test_a_delta_row_beyond_the_served_dtype_is_refused(tmp_path):
    """A delta's float32 row for a float16 served table: rounded as numpy
    rounds it, but a value that would become infinite (70000) is a
    DeltaError naming the table, the row and the value, and the export is
    unchanged (the served table took inf, with only numpy's warning)."""
    from sok_graph.serving import delta as delta_mod

    sok.init(comm_tool="none")
    half = sok.Variable(np.ones((4, 2), np.float16), name="half")

    class Model(tf.Module):
        def __call__(self, x):
            return sok.lookup_sparse([half], [tf.RaggedTensor.from_tensor(x)],
                                     combiners=["sum"])[0]

    export_dir = str(tmp_path / "export")
    sok.export_for_serving(Model(), export_dir, [tf.TensorSpec([None, 1], tf.int64)])
    with open(os.path.join(export_dir, "assets.extra", "sok_serving.json")) as f:
        where = json.load(f)["tables"][0]["checkpoint_keys"]["rows"]

    def served():
        prefix = os.path.join(export_dir, "variables", "variables")
        return tf.train.load_checkpoint(prefix).get_tensor(where)

    def delta(name, rows):
        directory = _crafted_delta(str(tmp_path / name), np.array([1, 3], np.int64), rows)
        with open(os.path.join(directory, "manifest.json")) as f:
            manifest = json.load(f)
        manifest["created"] = int(time.time() * 1e6)
        manifest["tables"][0].update(name="half", kind="static")
        with open(os.path.join(directory, "manifest.json"), "w") as f:
            json.dump(manifest, f)
        return directory

    with pytest.raises(delta_mod.DeltaError, match=r"served table 'half' has dtype float16; "
                                                   r"delta .*big holds the float32 value "
                                                   r"70000\.0 in row 3, column 0"):
        sok.apply_serving_delta(export_dir, delta("big", np.array([[1, 2], [7e4, 1]],
                                                                  np.float32)))
    np.testing.assert_array_equal(served(), np.ones((4, 2), np.float16))
    rows = np.array([[0.1, 2], [6e4, 1]], np.float32)
    sok.apply_serving_delta(export_dir, delta("fits", rows))
    want = np.ones((4, 2), np.float16)
    want[[1, 3]] = rows.astype(np.float16)
    np.testing.assert_array_equal(served(), want)


def _serving_build_fn(user_output="user", item=False):
    """The build_fn of a TF1 export that serves the dynamic table 'user'
    (dimension 2) as `user_output` and, with item, the static table 'item'
    (4 x 2) as "item", both read at placeholder ids (item's modulo 4)."""
    def build_fn():
        ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
        served_user = sok.DynamicVariable(dimension=2, initializer="zeros", name="user")
        outputs = {user_output: sok.all2all_dense_embedding(served_user, ids)}
        if item:
            served_item = sok.Variable(np.zeros((4, 2), np.float32), name="item")
            outputs["item"] = sok.all2all_dense_embedding(served_item, ids % 4)
        return {"ids": ids}, outputs

    return build_fn


def test_a_tf1_build_fn_reading_a_training_graph_dynamic_table_is_refused(tmp_path):
    """A build_fn that reads the training graph's DynamicVariable instead of
    making its own: a TypeError naming the table, nothing written (the
    table was taken for a static table's rows)."""
    with tf.Graph().as_default():
        user, keys, rows, assign = _assignable_user_in_graph()

        def build_fn():
            ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
            return {"ids": ids}, {"user": sok.all2all_dense_embedding(user, ids)}

        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(assign, {keys: [1], rows: [[1, 1]]})
            with pytest.raises(TypeError, match=r"sok.DynamicVariable 'user' is not of the "
                                                r"serving graph; create the dynamic tables "
                                                r"inside build_fn"):
                sok.export_for_serving(build_fn, str(tmp_path / "export"), session=sess)
    assert not os.path.exists(str(tmp_path / "export"))


def test_a_tf1_training_graph_with_two_dynamic_tables_of_one_name_is_refused(tmp_path):
    """Two DynamicVariables named alike in the trained graph: the serving
    table of that name took the rows of one of them, without a word. Now a
    ValueError naming the name, nothing written."""
    with tf.Graph().as_default():
        sok.init()
        tables = [sok.DynamicVariable(dimension=2, initializer="zeros", name="user")
                  for _ in range(2)]
        fill = [sok.assign(t, tf.constant([k], tf.int64), tf.fill([1, 2], float(k)))
                for k, t in enumerate(tables, 1)]

        def build_fn():
            ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
            served = sok.DynamicVariable(dimension=2, initializer="zeros", name="user")
            return {"ids": ids}, {"out": sok.all2all_dense_embedding(served, ids)}

        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(fill)
            with pytest.raises(ValueError, match=r"two sok tables named 'user'.*distinct names"):
                sok.export_for_serving(build_fn, str(tmp_path / "export"), session=sess)
    assert not os.path.exists(str(tmp_path / "export"))


def test_a_tf1_build_fn_reading_a_static_table_with_stock_ops_serves_its_trained_rows(
        tmp_path):
    """A sok.Variable that build_fn reads with tf.nn.embedding_lookup (no sok
    lookup) kept its initial rows in the export, with only a warning: it is
    filled from the trained table of its name as a sok lookup's table is."""
    trained = np.arange(20, dtype=np.float32).reshape(10, 2)
    export_dir = str(tmp_path / "export")
    with tf.Graph().as_default():
        sok.init()
        sok.Variable(trained, name="st")

        def build_fn():
            table = sok.Variable(tf.ones([10, 2]), name="st")
            ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
            return {"ids": ids}, {"out": tf.nn.embedding_lookup(table, ids)}

        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sok.export_for_serving(build_fn, export_dir, session=sess)
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], export_dir)
        sig = meta.signature_def["serving_default"]
        got = sess.run(sig.outputs["out"].name, {sig.inputs["ids"].name: [3, 9, 0]})
    np.testing.assert_array_equal(got, trained[[3, 9, 0]])


@pytest.mark.parametrize("serving_shape", [[12, 2], [8, 2], [10, 3]])
def test_a_tf1_build_fn_whose_static_table_has_another_shape_is_refused(tmp_path,
                                                                        serving_shape):
    """A serving graph whose static table has other rows than the trained
    one was exported declaring its own shape while holding the trained
    rows (serving then failed past row 10, or served rows 8 and 9 of an
    [8, 2] table); another dimension failed in a feed naming neither. Both
    are a ValueError naming the variable and the shapes, nothing written."""
    with tf.Graph().as_default():
        sok.init()
        st = sok.Variable(np.arange(20, dtype=np.float32).reshape(10, 2), name="st")

        def build_fn():
            table = sok.Variable(tf.ones(serving_shape), name="st")
            ids = tf.compat.v1.ragged.placeholder(tf.int64, 1, [], name="ids")
            return {"ids": ids}, {"out": sok.lookup_sparse(table, ids, combiners="sum")}

        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            assert sess.run(st.read_value()).shape == (10, 2)
            with pytest.raises(ValueError, match=r"static table 'st' has shape \(%d, %d\); "
                                                 r"the trained table has \(10, 2\)"
                                                 % tuple(serving_shape)):
                sok.export_for_serving(build_fn, str(tmp_path / "export"), session=sess)
    assert not os.path.exists(str(tmp_path / "export"))


@pytest.mark.parametrize("serving", [dict(dimension=3), dict(key_type=tf.int32)])
def test_a_tf1_build_fn_whose_dynamic_table_has_another_dimension_or_key_type_is_refused(
        tmp_path, serving):
    """A serving DynamicVariable declared with int32 keys for a table trained
    with int64 keys: the sorted keys were cast to int32, wrapping 2^32 + 4
    onto 4 and -2^40 onto 0, so key 0 (never trained) was served -2^40's
    row, and the cast list, unsorted, lost trained keys to zeros, without
    an error. Another dimension failed in a feed naming neither. Both are a
    ValueError naming the table, the dimensions and key types, nothing
    written."""
    with tf.Graph().as_default():
        sok.init()
        table = sok.DynamicVariable(2, initializer="zeros", name="dv")
        fill = sok.assign(table, tf.constant([3, 5, 2**32 + 4, -2**40], tf.int64),
                          tf.constant([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0], [4.0, 4.0]]))

        def build_fn():
            made = dict(dict(dimension=2, key_type=tf.int64), **serving)
            served = sok.DynamicVariable(made["dimension"], name="dv", key_type=made["key_type"])
            ids = tf.compat.v1.placeholder(made["key_type"], [None], name="ids")
            return {"ids": ids}, {"out": sok.all2all_dense_embedding(served, ids)}

        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(fill)
            want = (r"dynamic table 'dv' has dimension %d and %s keys; the trained table has "
                    r"dimension 2 and int64 keys" % (serving.get("dimension", 2),
                                                     serving.get("key_type", tf.int64).name))
            with pytest.raises(ValueError, match=want):
                sok.export_for_serving(build_fn, str(tmp_path / "export"), session=sess)
    assert not os.path.exists(str(tmp_path / "export"))


def test_a_tf1_serving_graph_with_a_table_the_training_did_not_fill_is_refused(tmp_path):
    """A serving graph whose table (or variable) has no trained value was
    exported with its initial rows and only a logged warning: on TF 2.21
    (Keras 3 numbers default layer names across graphs) rebuilding the
    model's 1.x layers in build_fn named their tables anew and served
    untrained tables. Now a ValueError naming them, nothing written."""
    with tf.Graph().as_default():
        sok.init()
        trained = sok.DynamicVariable(2, initializer="zeros", name="user")
        fill = sok.assign(trained, tf.constant([1], tf.int64), tf.ones([1, 2]))

        def build_fn():
            served = sok.DynamicVariable(2, initializer="zeros", name="user_2")
            dense = tf.compat.v1.get_variable("head", [2], initializer=tf.ones_initializer())
            ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
            return {"ids": ids}, {"out": sok.all2all_dense_embedding(served, ids) * dense}

        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(fill)
            with pytest.raises(ValueError, match=r"no value for: \['head', 'user_2'\].*variable "
                                                 r"and table names"):
                sok.export_for_serving(build_fn, str(tmp_path / "export"), session=sess)
    assert not os.path.exists(str(tmp_path / "export"))


def test_a_graphs_delta_reads_its_default_session(tmp_path):
    """export_serving_delta(session=None) in graph mode reads the tables in
    the default Session, as sok.dump does (an AttributeError about .numpy()
    before); with none, a ValueError saying what to pass."""
    with tf.Graph().as_default():
        user, keys, rows, assign = _assignable_user_in_graph()
        sess = tf.compat.v1.Session()  # not the default Session
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(assign, {keys: [1, 7], rows: [[1, 1], [2, 2]]})
        with pytest.raises(ValueError, match=r"pass session= .*sess.as_default"):
            sok.export_serving_delta([user], 0, str(tmp_path / "none"))
        assert not os.path.exists(str(tmp_path / "none"))
        with sess.as_default():
            delta_dir = sok.export_serving_delta([user], 0, str(tmp_path / "d"))
        sess.close()
    keys_file = [f for f in os.listdir(delta_dir) if f.endswith(".keys.npy")]
    assert sorted(np.load(os.path.join(delta_dir, keys_file[0])).tolist()) == [1, 7]


def _assignable_user_in_graph():
    """In the default graph, after sok.init(): a dynamic table 'user' of
    dimension 2, placeholders for keys and rows, and the op assigning them."""
    sok.init()
    user = sok.DynamicVariable(dimension=2, initializer="zeros", name="user")
    keys = tf.compat.v1.placeholder(tf.int64, [None])
    rows = tf.compat.v1.placeholder(tf.float32, [None, 2])
    return user, keys, rows, sok.assign(user, keys, rows)


def _user_and_item_export(tmp_path):
    """(export dir, item's rows) of a model serving a dynamic table 'user'
    (key 1 holds [1, 1]) and a static table 'item' (4 x 2, rows 0..7)."""
    sok.init(comm_tool="none")
    start = np.arange(8, dtype=np.float32).reshape(4, 2)
    user = sok.DynamicVariable(2, initializer="zeros", name="user")
    item = sok.Variable(start, name="item")
    sok.assign(user, tf.constant([1], tf.int64), np.full((1, 2), 1.0, np.float32))

    class Model(tf.Module):
        def __call__(self, x):
            ids = tf.RaggedTensor.from_tensor(x)
            return sok.lookup_sparse([user, item], [ids, ids % 4], combiners=["sum", "sum"])

    export_dir = str(tmp_path / "export")
    sok.export_for_serving(Model(), export_dir, [tf.TensorSpec([None, 1], tf.int64)])
    return export_dir, start


# Plain-TF code (indented as the bodies it goes before): each case's
# apply_delta_fn call, "accepted" or its error.
_APPLY_EACH = """
        def apply_each(loaded, calls):
            out = {}
            for case, (name, keys, rows) in calls.items():
                try:
                    loaded.sok_tables[name].apply_delta_fn(tf.constant(keys, tf.int64),
                                                           tf.constant(rows, tf.float32))
                    out[case] = "accepted"
                except tf.errors.InvalidArgumentError as e:
                    out[case] = str(e)
            return out
"""


@tf2_only
def test_a_loaded_int32_tables_functions_check_int64_keys_instead_of_narrowing_them(tmp_path):
    """An int32-keyed table of a loaded model (plain TensorFlow): its
    lookup_fn and apply_delta_fn take int32 keys and int64 keys (numpy or
    tensors), and refuse an int64 key outside int32's range naming the
    table, its rows unchanged. numpy int64 keys were narrowed to the int32
    signature: key 2^32 + 9 overwrote key 9's row, and a lookup of it read
    key 9's."""
    sok.init(comm_tool="none")
    table = sok.DynamicVariable(2, initializer="zeros", key_type=tf.int32, name="k32")
    sok.assign(table, tf.constant([5, 9], tf.int32), np.array([[5, 5], [9, 9]], np.float32))

    class Model(tf.Module):
        def __call__(self, ids):
            return sok.lookup_sparse([table], [ids], combiners=["sum"])[0]

    export_dir = str(tmp_path / "export")
    sok.export_for_serving(Model(), export_dir, [tf.RaggedTensorSpec([None, None], tf.int32)])
    result = _plain_tf("""
        loaded = tf.saved_model.load(sys.argv[1])
        t = loaded.sok_tables["k32"]
        out = {}
        def attempt(case, call):
            try:
                out[case] = call().numpy().tolist()
            except tf.errors.InvalidArgumentError as e:
                out[case] = str(e)
        ones = np.ones((1, 2), np.float32)
        attempt("delta_numpy", lambda: t.apply_delta_fn(np.array([2**32 + 9], np.int64), ones))
        attempt("delta_tensor", lambda: t.apply_delta_fn(tf.constant([-2**31 - 1], tf.int64),
                                                         tf.constant(ones)))
        attempt("lookup_numpy", lambda: t.lookup_fn(np.array([2**32 + 5], np.int64)))
        out["after"] = t.lookup_fn(tf.constant([5, 9], tf.int32)).numpy().tolist()
        out["int64_in_range"] = t.lookup_fn(np.array([9, 5], np.int64)).numpy().tolist()
        t.apply_delta_fn(tf.constant([7], tf.int32), tf.constant(2 * ones))
        t.apply_delta_fn(np.array([8], np.int64), 3 * ones)
        out["added"] = t.lookup_fn([7, 8]).numpy().tolist()
        print(json.dumps(out))
    """, export_dir)
    for case in ("delta_numpy", "delta_tensor", "lookup_numpy"):
        assert "keys of table \\'k32\\' must be in int32\\'s range" in result[case], \
            (case, result[case])
    assert result["after"] == [[5, 5], [9, 9]]
    assert result["int64_in_range"] == [[9, 9], [5, 5]]
    assert result["added"] == [[2, 2], [3, 3]]


@tf2_only
def test_a_served_models_apply_delta_fn_refuses_what_apply_serving_delta_does(tmp_path):
    """The loaded model's apply_delta_fn, in plain TensorFlow: NaN or
    infinite rows and a static table's row ids outside [0, rows) are
    InvalidArgumentErrors naming the table, and the tables keep their rows
    (NaN rows used to be served; an id outside the table failed on a CPU
    only, without the table's name). It keeps no record of the deltas
    applied (its docstring says why)."""
    export_dir, start = _user_and_item_export(tmp_path)
    result = _plain_tf(_APPLY_EACH + """
        loaded = tf.saved_model.load(sys.argv[1])
        nan, inf = float("nan"), float("inf")
        calls = {"nan": ("user", [1, 8], [[nan, 1.0], [1.0, 1.0]]),
                 "inf": ("item", [0], [[-inf, 0.0]]),
                 "outside": ("item", [2, 4], [[1.0, 1.0], [1.0, 1.0]]),
                 "negative": ("item", [-1], [[1.0, 1.0]])}
        out = apply_each(loaded, calls)
        out["user"] = loaded.sok_tables["user"].lookup_fn(
            tf.constant([1, 8], tf.int64)).numpy().tolist()
        out["item"] = loaded.sok_tables["item"].lookup_fn(
            tf.range(4, dtype=tf.int64)).numpy().tolist()
        loaded.sok_tables["item"].apply_delta_fn(tf.constant([3], tf.int64),
                                                 tf.constant([[9.0, 9.0]]))
        out["item_after"] = loaded.sok_tables["item"].lookup_fn(
            tf.range(4, dtype=tf.int64)).numpy().tolist()
        print(json.dumps(out))
    """, export_dir)
    for case, name, words in (("nan", "user", "rows must be finite"),
                              ("inf", "item", "rows must be finite"),
                              ("outside", "item", "delta row ids must be in [0, rows"),
                              ("negative", "item", "delta row ids must be in [0, rows")):
        # (the table's name quoted, and escaped by the Assert's message)
        assert "apply_delta_fn of table" in result[case] and f"table \\'{name}\\'" in result[case] \
            and words in result[case], (case, result[case])
    assert result["user"] == [[1, 1], [0, 0]], result
    np.testing.assert_array_equal(result["item"], start)
    want = start.copy()
    want[3] = 9.0
    np.testing.assert_array_equal(result["item_after"], want)
    from sok_graph.serving.tables import DynamicTable, StaticTable

    for cls in (DynamicTable, StaticTable):
        assert "records no delta and cannot refuse one" in cls.apply_delta.__doc__


def _checkpoint_rows(export_dir, name):
    """The rows variable of served table `name` in the export's checkpoint."""
    with open(os.path.join(export_dir, "assets.extra", "sok_serving.json")) as f:
        where = {t["name"]: t for t in json.load(f)["tables"]}[name]["checkpoint_keys"]
    prefix = os.path.join(export_dir, "variables", "variables")
    return tf.train.load_checkpoint(prefix).get_tensor(where["rows"])


def test_a_delta_after_a_gap_is_refused(tmp_path):
    """A delta of a dynamic table's rows changed after a since later than
    the newest rows the export holds (the created of the export, then of
    the last delta it took) is refused with a DeltaError naming both times
    and the delta, nothing written: the rows changed in between were in
    neither (it used to be applied). A since at or before that time is
    taken (the overlap is rewritten with newer rows), and a delta of static
    tables only, which holds them whole, whatever its since."""
    from sok_graph.serving import delta as delta_mod

    with tf.Graph().as_default():
        sok.init()
        user = sok.DynamicVariable(dimension=2, initializer="zeros", name="user")
        item = sok.Variable(np.zeros((4, 2), np.float32), name="item")
        keys = tf.compat.v1.placeholder(tf.int64, [None])
        rows = tf.compat.v1.placeholder(tf.float32, [None, 2])
        assign = sok.assign(user, keys, rows)
        set_item = item.scatter_update(tf.IndexedSlices(rows, keys))

        build_fn = _serving_build_fn(item=True)

        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())

            def train(key, value, op=assign):
                sess.run(op, {keys: [key], rows: [[value, value]]})
                time.sleep(0.002)  # distinct update times

            def now():
                moment = int(time.time() * 1e6)
                time.sleep(0.002)
                return moment

            def delta(name, since, tables=(user,)):
                out = sok.export_serving_delta(list(tables), since, str(tmp_path / name),
                                               session=sess)
                time.sleep(0.002)  # distinct creation times
                return out

            train(1, 1.0)
            export_dir = str(tmp_path / "export")
            sok.export_for_serving(build_fn, export_dir, session=sess)
            made = _export_created(export_dir)
            train(1, 2.0)
            late = now()
            train(5, 3.0)
            gap = delta("gap", late)  # key 5 only: key 1's new row is in neither
            first = delta("first", made)
            train(7, 4.0)
            late_again = now()
            train(9, 5.0)
            gap_again = delta("gap_again", late_again)
            overlap = delta("overlap", made)  # everything since the export
            train(1, 6.0)
            with open(os.path.join(overlap, "manifest.json")) as f:
                overlap_created = json.load(f)["created"]
            at_last = delta("at_last", overlap_created)
            train(2, 7.0, set_item)
            static_only = delta("static_only", now(), tables=(item,))
    with open(os.path.join(first, "manifest.json")) as f:
        first_manifest = json.load(f)

    def served_user():
        held = [1, 5, 7, 9]
        return {k: r.tolist() for k, r in zip(held, _served_rows(export_dir, np.array(held)))
                if r.any()}

    state = _export_state(export_dir)
    with pytest.raises(delta_mod.DeltaError) as refused:
        sok.apply_serving_delta(export_dir, gap)
    message = str(refused.value)
    assert f"delta {gap} holds the rows changed after" in message, message
    assert f"(since={late})" in message and "rows up to" in message, message
    assert f"(created={made}: the time the export was made)" in message, message
    assert _same_state(_export_state(export_dir), state) and served_user() == {1: [1, 1]}

    sok.apply_serving_delta(export_dir, first)
    assert served_user() == {1: [2, 2], 5: [3, 3]}
    state = _export_state(export_dir)
    with pytest.raises(delta_mod.DeltaError) as refused:
        sok.apply_serving_delta(export_dir, gap_again)
    message = str(refused.value)
    assert f"delta {gap_again} holds the rows changed after" in message, message
    assert f"(since={late_again})" in message, message
    assert (f"(created={first_manifest['created']}: the created of delta "
            f"{first_manifest['id']}, the last it took)") in message, message
    assert _same_state(_export_state(export_dir), state)

    sok.apply_serving_delta(export_dir, overlap)
    assert served_user() == {1: [2, 2], 5: [3, 3], 7: [4, 4], 9: [5, 5]}
    sok.apply_serving_delta(export_dir, at_last)
    assert served_user() == {1: [6, 6], 5: [3, 3], 7: [4, 4], 9: [5, 5]}
    assert sok.apply_serving_delta(export_dir, static_only) == {"item": 4}
    want_item = np.zeros((4, 2), np.float32)
    want_item[2] = 7.0
    np.testing.assert_array_equal(_checkpoint_rows(export_dir, "item"), want_item)
    assert len(_export_state(export_dir)[1]) == 4


@tf2_only
def test_a_gap_is_checked_table_by_table(tmp_path):
    """The gap check is per dynamic table: a delta holding table T whose
    since is after the newest time the export holds T's rows for (its own
    created, or that of the last delta it took holding T) is refused,
    naming T and both times. It compared the since with the created of the
    last delta taken whatever tables that held: a delta of 'user' alone,
    then one of 'user' and 'item' since its created, were both taken, and
    'item''s rows trained between the export and the first were in
    neither; a delta of no dynamic table (static tables only, or none)
    moved that time for every table. Served rows against the trained
    tables' own find()."""
    from sok_graph.serving import delta as delta_mod

    sok.init(comm_tool="none")
    user = sok.DynamicVariable(2, initializer="zeros", name="user")
    item = sok.DynamicVariable(2, initializer="zeros", name="item")
    static = sok.Variable(np.zeros((4, 2), np.float32), name="static")
    ids = np.array([1, 2], np.int64)

    def train(table, value):
        sok.assign(table, tf.constant(ids), np.full((2, 2), value, np.float32))
        time.sleep(0.002)  # distinct update times

    train(user, 1.0)
    train(item, 1.0)

    class Model(tf.Module):
        def __call__(self, x):
            ragged = tf.RaggedTensor.from_tensor(x[:, None] % 4)
            return tf.concat([tf.nn.embedding_lookup(user, x), tf.nn.embedding_lookup(item, x),
                              sok.lookup_sparse([static], [ragged], combiners=["sum"])[0]], 1)

    export_dir = str(tmp_path / "export")
    sok.export_for_serving(Model(), export_dir, [tf.TensorSpec([None], tf.int64)])
    made = _export_created(export_dir)

    def delta(name, tables, since):
        out = sok.export_serving_delta(tables, since, str(tmp_path / name))
        time.sleep(0.002)  # distinct creation times
        with open(os.path.join(out, "manifest.json")) as f:
            manifest = json.load(f)
        return out, manifest["created"], manifest["id"]

    def served():
        loaded = tf.saved_model.load(export_dir)
        return loaded.serve(tf.constant(ids)).numpy()

    def trained():
        return np.concatenate([user.find(tf.constant(ids))[0], item.find(tf.constant(ids))[0],
                               tf.gather(static.read_value(), ids % 4)], 1)

    train(user, 2.0)
    train(item, 2.0)  # in no delta below until "both"
    first, first_created, first_id = delta("first", [user], made)
    train(user, 3.0)
    gap, _, _ = delta("gap", [user, item], first_created)
    sok.apply_serving_delta(export_dir, first)
    state = _export_state(export_dir)
    with pytest.raises(delta_mod.DeltaError) as refused:
        sok.apply_serving_delta(export_dir, gap)
    message = str(refused.value)
    assert f"delta {gap} holds the rows changed after" in message, message
    assert f"(since={first_created}) of table 'item'" in message, message
    assert f"(created={made}: the time the export was made)" in message, message
    assert _same_state(_export_state(export_dir), state)

    # Deltas of static tables only, and of no table, are taken and move no
    # dynamic table's time.
    static.assign(np.full((4, 2), 5.0, np.float32))
    static_only, static_created, _ = delta("static_only", [static], first_created)
    empty, empty_created, _ = delta("empty", [], static_created)
    assert sok.apply_serving_delta(export_dir, static_only) == {"static": 4}
    assert sok.apply_serving_delta(export_dir, empty) == {}
    after_empty, _, _ = delta("after_empty", [user], empty_created)
    state = _export_state(export_dir)
    with pytest.raises(delta_mod.DeltaError) as refused:
        sok.apply_serving_delta(export_dir, after_empty)
    message = str(refused.value)
    assert f"(since={empty_created}) of table 'user'" in message, message
    assert (f"(created={first_created}: the created of delta {first_id}, the last it took "
            f"holding table 'user')") in message, message
    assert _same_state(_export_state(export_dir), state)

    # Each table since its own time: taken, and served as trained.
    both, _, _ = delta("both", {"user": user, "item": item}, made)
    assert sok.apply_serving_delta(export_dir, both) == {"user": 2, "item": 2}
    np.testing.assert_array_equal(served(), trained())
    assert served()[:, :4].tolist() == [[3, 3, 2, 2]] * 2


# Per dtype: the unsigned integer of its width (bits compared), and rows
# that dtype holds exactly where float32, or a rounding, would change them.
_DTYPE_CASES = {
    "bfloat16": (np.uint16, [[1.0078125, -2.0 ** -130], [3.3895313892515355e38, -0.0]]),
    "float16": (np.uint16, [[1.0009765625, -2.0 ** -24], [65504.0, 6.1e-05]]),
    "float64": (np.uint64, [[1 + 1e-12, 1e300], [5e-324, -2.5]]),
}


@pytest.mark.parametrize("dtype", sorted(_DTYPE_CASES))
def test_a_delta_of_a_table_of_any_float_dtype_round_trips_bit_for_bit(tmp_path, dtype):
    """A bfloat16, float16 or float64 sok.Variable's delta, exported from a
    Session and applied to its export: the served rows are numpy's, bit for
    bit. A bfloat16 table's rows file holds their raw bits (uint16), which
    its manifest entry says, and numpy alone reads them back; np.save wrote
    bfloat16 rows as void ('|V2'), which read_serving_delta refused."""
    from sok_graph.serving import delta as delta_mod

    bits, new = _DTYPE_CASES[dtype]
    np_dtype = tf.as_dtype(dtype).as_numpy_dtype
    start = (np.arange(12, dtype=np.float64).reshape(6, 2) / 3).astype(np_dtype)
    new = np.array(new, np.float64).astype(np_dtype)
    want = start.copy()
    want[[1, 4]] = new
    with tf.Graph().as_default():
        sok.init()
        table = sok.Variable(start, name="emb")
        update = table.scatter_update(tf.IndexedSlices(tf.constant(new), tf.constant([1, 4])))

        def build_fn():
            ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
            served = sok.Variable(np.zeros((6, 2), np_dtype), name="emb")
            return {"ids": ids}, {"out": sok.all2all_dense_embedding(served, ids)}

        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            export_dir = str(tmp_path / "export")
            sok.export_for_serving(build_fn, export_dir, session=sess)
            sess.run(update)
            delta_dir = sok.export_serving_delta([table], _export_created(export_dir),
                                                 str(tmp_path / "delta"), session=sess)
    _, keys, rows = delta_mod.read_serving_delta(delta_dir)["emb"]
    assert rows.dtype == np.dtype(np_dtype)
    np.testing.assert_array_equal(keys, np.arange(6))
    np.testing.assert_array_equal(rows.view(bits), want.view(bits))

    assert sok.apply_serving_delta(export_dir, delta_dir) == {"emb": 6}
    served = _checkpoint_rows(export_dir, "emb")
    assert served.dtype == np.dtype(np_dtype)
    np.testing.assert_array_equal(served.view(bits), want.view(bits))
    # The updated export loads, holding those rows (its lookup sums in
    # float32 and flushes subnormals, as training's does: the variable is
    # compared).
    with tf.Graph().as_default() as graph, tf.compat.v1.Session(graph=graph) as sess:
        tf.compat.v1.saved_model.load(sess, [tf.saved_model.SERVING], export_dir)
        variable = [v for v in tf.compat.v1.global_variables() if v.op.name == "emb"][0]
        loaded = sess.run(variable)
    np.testing.assert_array_equal(np.asarray(loaded).view(bits), want.view(bits))
    # numpy alone reads the rows file: the manifest names the dtype it holds.
    with open(os.path.join(delta_dir, "manifest.json")) as f:
        entry = json.load(f)["tables"][0]
    stored = np.load(os.path.join(delta_dir, entry["files"]["rows"]["file"]))
    assert entry["dtype"] == dtype
    assert stored.dtype.name == entry["files"]["rows"]["dtype"] == (
        "uint16" if dtype == "bfloat16" else dtype)
    np.testing.assert_array_equal(stored.view(bits), want.view(bits))


def test_delta_file_names_are_made_unique_as_a_dumps_are(tmp_path, monkeypatch):
    """Serving names that clean up to one file stem ("a/b", "a_b", and
    "A_B" on a file system that ignores case) get files of their own,
    named by dump_load._unique_stem as a dump's are (the delta had a loop
    of its own), and each table's rows come back as numpy has them."""
    from sok_graph import dump_load
    from sok_graph.serving import delta as delta_mod

    stems = []
    real = dump_load._unique_stem

    def unique_stem(stem, parts, used):
        out = real(stem, parts, used)
        stems.append((stem, tuple(parts), out))
        return out

    monkeypatch.setattr(dump_load, "_unique_stem", unique_stem)
    rng = _rng()
    arrays = {name: rng.normal(size=(3, 2)).astype(np.float32)
              for name in ("a/b", "a_b", "A_B")}
    with tf.Graph().as_default():
        sok.init()
        tables = {name: sok.Variable(array, name=f"t{i}")
                  for i, (name, array) in enumerate(arrays.items())}
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            delta_dir = sok.export_serving_delta(tables, 0, str(tmp_path / "delta"),
                                                 session=sess)
    assert stems == [("a_b", ("keys.npy", "rows.npy"), "a_b"),
                     ("a_b", ("keys.npy", "rows.npy"), "a_b-1"),
                     ("A_B", ("keys.npy", "rows.npy"), "A_B-2")], stems
    files = [f for f in os.listdir(delta_dir) if f != "manifest.json"]
    assert len({f.lower() for f in files}) == len(files) == 6, files
    read = delta_mod.read_serving_delta(delta_dir)
    for name, array in arrays.items():
        _, keys, rows = read[name]
        np.testing.assert_array_equal(keys, np.arange(3))
        np.testing.assert_array_equal(rows, array)


def _delta_of(directory, name, kind, keys, rows, since, created):
    """_crafted_delta's delta, of table `name` of `kind`, with the times
    given: a delta written by hand."""
    _crafted_delta(directory, np.asarray(keys, np.int64), np.asarray(rows, np.float32))
    with open(os.path.join(directory, "manifest.json")) as f:
        manifest = json.load(f)
    manifest.update(since=since, created=created)
    manifest["tables"][0].update(name=name, kind=kind)
    with open(os.path.join(directory, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    return directory


def test_a_delta_that_repeats_a_key_is_refused(tmp_path):
    """A delta whose keys file holds a key twice (made by hand or
    corrupted; export_serving_delta writes each once) is a DeltaError
    naming the delta, the table and the key, before anything is written, on
    every TensorFlow: apply_serving_delta took it, adding a new dynamic key
    twice (and a static table's row id took one of its rows, unsaid which).
    A delta of distinct keys is then taken, giving the rows numpy expects."""
    from sok_graph.serving import delta as delta_mod

    with tf.Graph().as_default():
        user, keys, rows, assign = _assignable_user_in_graph()
        sok.Variable(np.zeros((4, 2), np.float32), name="item")

        build_fn = _serving_build_fn(item=True)

        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(assign, {keys: [1], rows: [[1, 1]]})
            export_dir = str(tmp_path / "export")
            sok.export_for_serving(build_fn, export_dir, session=sess)
    made = _export_created(export_dir)
    now = int(time.time() * 1e6)
    new_twice = _delta_of(str(tmp_path / "new_twice"), "user", "dynamic", [5, 1, 5],
                          [[3, 3], [2, 2], [4, 4]], made, now)
    held_twice = _delta_of(str(tmp_path / "held_twice"), "user", "dynamic", [1, 7, 1, 7, 9],
                           np.ones((5, 2)), made, now)
    static_twice = _delta_of(str(tmp_path / "static_twice"), "item", "static", [2, 0, 2],
                             [[3, 3], [2, 2], [4, 4]], 0, now)
    state = _export_state(export_dir)
    for delta_dir, words in (
            (new_twice, r"table 'user' has key 5 2 times in its keys file 't.keys.npy'; a "
                        r"delta holds each key once"),
            (held_twice, r"table 'user' has key 1 2 times in its keys file 't.keys.npy' "
                         r"\(and 1 other key repeated\)"),
            (static_twice, r"table 'item' has row id 2 2 times in its keys file "
                           r"'t.keys.npy'; a delta holds each row id once")):
        for apply in (delta_mod.read_serving_delta,
                      lambda d: sok.apply_serving_delta(export_dir, d),
                      lambda d: sok.apply_serving_delta(export_dir, d,
                                                        output_dir=str(tmp_path / "copy"))):
            with pytest.raises(delta_mod.DeltaError) as refused:
                apply(delta_dir)
            message = str(refused.value)
            assert message.startswith(f"{delta_dir}: ") and re.search(words, message), message
    # nothing written: the rows numpy expects of the export as it was made
    assert _same_state(_export_state(export_dir), state) and state[1] == []
    np.testing.assert_array_equal(_export_state(export_dir)[0]["keys"], [1])
    np.testing.assert_array_equal(_served_rows(export_dir, np.array([1, 5])), [[1, 1], [0, 0]])
    np.testing.assert_array_equal(_checkpoint_rows(export_dir, "item"), np.zeros((4, 2)))
    assert sorted(os.listdir(tmp_path)) == ["export", "held_twice", "new_twice", "static_twice"]

    distinct = _delta_of(str(tmp_path / "distinct"), "user", "dynamic", [5, 1],
                         [[3, 3], [2, 2]], made, now + 1)
    assert sok.apply_serving_delta(export_dir, distinct) == {"user": 2}
    np.testing.assert_array_equal(_export_state(export_dir)[0]["keys"], [1, 5])
    np.testing.assert_array_equal(_served_rows(export_dir, np.array([1, 5, 9])),
                                  [[2, 2], [3, 3], [0, 0]])
    items = _delta_of(str(tmp_path / "items"), "item", "static", [2, 0], [[3, 3], [2, 2]], 0,
                      now + 2)
    assert sok.apply_serving_delta(export_dir, items) == {"item": 2}
    np.testing.assert_array_equal(_checkpoint_rows(export_dir, "item"),
                                  [[2, 2], [0, 0], [3, 3], [0, 0]])


def test_a_table_read_with_a_key_twice_is_refused_before_the_delta_is_written(tmp_path,
                                                                              monkeypatch):
    """A table changed while export_serving_delta reads it in chunks can
    give a key twice. The delta was written anyway, and read_serving_delta /
    apply_serving_delta then refused it as corrupted; now export_serving_delta
    refuses it, naming the table, the key and how often, and writes
    nothing."""
    from sok_graph.serving import delta as delta_mod

    reads = {
        "user": [(np.array([3, 1], np.int64), np.array([[3, 3], [1, 1]], np.float32)),
                 (np.array([1, 8, 8], np.int64), np.ones((3, 2), np.float32))],
        "item": [(np.array([0, 2], np.int64), np.zeros((2, 2), np.float32)),
                 (np.array([2], np.int64), np.ones((1, 2), np.float32))],
    }

    def whole_table(table, runner, chunk_rows=1 << 20, updated_after=None, keys_only=False):
        chunks = reads[table_names[id(table)]]
        return sum(len(k) for k, _ in chunks), iter(chunks)

    monkeypatch.setattr(delta_mod.sources, "whole_table", whole_table)
    with tf.Graph().as_default():
        sok.init()
        user = sok.DynamicVariable(dimension=2, initializer="zeros", name="user")
        item = sok.Variable(np.zeros((4, 2), np.float32), name="item")
        table_names = {id(user): "user", id(item): "item"}
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for name, table, words in (
                    ("user", user, "table 'user' gave key 1 2 times while it was read (and 1 "
                                   "other key repeated); a table holds each key once"),
                    ("item", item, "table 'item' gave row id 2 2 times while it was read; a "
                                   "table holds each row id once")):
                delta_dir = str(tmp_path / name)
                with pytest.raises(delta_mod.DeltaError) as refused:
                    sok.export_serving_delta({name: table}, 0, delta_dir, session=sess)
                message = str(refused.value)
                assert message.startswith("export_serving_delta: " + words), message
                assert message.endswith(f"nothing was written to delta_dir={delta_dir!r}")
    assert os.listdir(str(tmp_path)) == []


def test_serving_paths_and_chunk_rows_are_checked_before_anything_is_read(tmp_path,
                                                                          monkeypatch):
    """export_serving_delta(delta_dir="") wrote the delta beside the
    current directory's parent, failed to rename it to "" and left it
    there; bytes and None failed in os.path naming no argument, after the
    tables were read; a delta_dir under a file failed with os's bare "File
    exists"; chunk_rows=0 failed inside a TensorFlow op and 1.5 was taken.
    export_for_serving(model, ".") in an empty current directory, and
    apply_serving_delta(".", ...) in the export's directory, renamed the
    current directory away (the process was left in a deleted directory).
    Each is now an error naming the argument, with nothing written."""
    from sok_graph.serving import delta as delta_mod

    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(str(work))
    with tf.Graph().as_default():
        user, keys, rows, assign = _assignable_user_in_graph()

        build_fn = _serving_build_fn()

        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(assign, {keys: [1], rows: [[1, 1]]})
            for delta_dir, chunk_rows, error, words in (
                    ("", 8, ValueError, "delta_dir must name a directory; got an empty string"),
                    (None, 8, TypeError,
                     "delta_dir must be a str or a path (a directory); got NoneType None"),
                    ("d", 0, ValueError, "export_serving_delta: chunk_rows must be a positive "
                                         "integer (the rows read at a time); got 0"),
                    ("d", 1.5, ValueError, "chunk_rows must be a positive integer (the rows "
                                           "read at a time); got 1.5"),
                    ("d", True, ValueError, "chunk_rows must be a positive integer (the rows "
                                            "read at a time); got True")):
                with pytest.raises(error, match=re.escape(words)):
                    sok.export_serving_delta([user], 0, delta_dir, session=sess,
                                             chunk_rows=chunk_rows)
            assert sorted(os.listdir(str(tmp_path))) == ["work"] and os.listdir(".") == []

            (work / "file").write_text("mine")
            with pytest.raises(FileExistsError, match=re.escape(
                    "cannot write delta_dir='file/d': a file stands where its parent "
                    "directories must be")):
                sok.export_serving_delta([user], 0, "file/d", session=sess)
            (work / "file").unlink()

            with pytest.raises(ValueError, match=re.escape(
                    "export_for_serving: export_dir='.' is the current directory, which it "
                    "would replace")):
                sok.export_for_serving(build_fn, ".", session=sess)
            with pytest.raises(ValueError, match=re.escape(
                    "export_for_serving: chunk_rows must be a positive integer (the rows read "
                    "at a time); got -1")):
                sok.export_for_serving(build_fn, "export", session=sess, chunk_rows=-1)
            assert os.listdir(".") == []
            # bytes are a path
            assert sok.export_for_serving(build_fn, b"export", session=sess) == "export"
            # since 0: key 1, stamped before the export, is in the delta too
            assert sok.export_serving_delta([user], 0, b"d1", session=sess) == "d1"
    assert sorted(os.listdir(".")) == ["d1", "export"]
    state = _export_state("export")

    monkeypatch.chdir(str(work / "export"))
    with pytest.raises(ValueError, match=re.escape(
            "apply_serving_delta: export_dir='.' is the current directory, which it would "
            "replace")):
        sok.apply_serving_delta(".", "../d1")
    assert os.getcwd() == str(work / "export") and os.path.isfile("saved_model.pb")
    assert _same_state(_export_state("."), state)
    for kwargs, error, words in (
            (dict(export_dir=None, delta_dir="../d1"), TypeError,
             "export_dir must be a str or a path (a directory); got NoneType None"),
            (dict(export_dir=".", delta_dir=None, output_dir="../copy"), TypeError,
             "delta_dir must be a str or a path (a directory); got NoneType None"),
            (dict(export_dir=".", delta_dir="../d1", output_dir=""), ValueError,
             "output_dir must name a directory; got an empty string")):
        with pytest.raises(error, match=re.escape(words)):
            sok.apply_serving_delta(**kwargs)
    # A copy of the current directory is fine, and bytes are paths.
    assert sok.apply_serving_delta(b".", b"../d1", output_dir=b"../copy") == {"user": 1}
    monkeypatch.chdir(str(work))
    assert sorted(os.listdir(".")) == ["copy", "d1", "export"]
    np.testing.assert_array_equal(_served_rows("copy", np.array([1, 2])), [[1, 1], [0, 0]])
    assert delta_mod.read_serving_delta("d1")["user"][1].tolist() == [1]


def test_urls_huge_chunk_rows_and_a_file_above_are_refused_before_anything_is_read(
        tmp_path, monkeypatch):
    """A URL as delta_dir was taken as a relative path ("gs://b/d" wrote
    ./gs:/b/d and was returned as written); apply_serving_delta's paths
    alike; export_for_serving to file:// skipped the refusal of a directory
    holding something else and the write-beside-then-swap. chunk_rows of
    2**63 and up passed the check and failed with an OverflowError once
    tables were read; an export_dir under a regular file failed as the
    SavedModel was written. Each is now an error naming the argument,
    before any table is read, and nothing is written; the largest int64
    chunk_rows is taken."""
    from sok_graph.serving import sources

    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(str(work))
    real_whole_table = sources.whole_table
    reads = []

    def whole_table(*args, **kwargs):
        reads.append(args[0])
        return real_whole_table(*args, **kwargs)

    monkeypatch.setattr(sources, "whole_table", whole_table)
    (work / "file").write_text("mine")
    with tf.Graph().as_default():
        user, keys, rows, assign = _assignable_user_in_graph()
        build_fn = _serving_build_fn()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(assign, {keys: [1], rows: [[1, 2]]})
            local = str(work / "d")
            for delta_dir, words in (
                    ("gs://bucket/d", "export_serving_delta: delta_dir='gs://bucket/d' is a URL; "
                                      "delta_dir must be a local directory path"),
                    ("file://" + local, f"export_serving_delta: delta_dir='file://{local}' is a "
                                        f"file:// URL; give it as a local directory path "
                                        f"('{local}')")):
                with pytest.raises(ValueError, match=re.escape(words)):
                    sok.export_serving_delta([user], 0, delta_dir, session=sess)
            for chunk_rows in (2 ** 63, 2 ** 70, np.uint64(2 ** 63)):
                words = ("chunk_rows must be a positive integer an int64 holds (at most 2**63 - "
                         f"1; the rows read at a time); got {chunk_rows!r}")
                with pytest.raises(ValueError, match=re.escape("export_serving_delta: " + words)):
                    sok.export_serving_delta([user], 0, "d", session=sess, chunk_rows=chunk_rows)
                with pytest.raises(ValueError, match=re.escape("export_for_serving: " + words)):
                    sok.export_for_serving(build_fn, "export", session=sess,
                                           chunk_rows=chunk_rows)
            with pytest.raises(ValueError, match=re.escape(
                    f"export_for_serving: export_dir='file://{work}/export' is a file:// URL; "
                    f"give it as a local directory path ('{work}/export')")):
                sok.export_for_serving(build_fn, f"file://{work}/export", session=sess)
            with pytest.raises(FileExistsError, match=re.escape(
                    "cannot write export_dir='file/export': a file stands where its parent "
                    f"directories must be ({str(work / 'file')!r} is not a directory)")):
                sok.export_for_serving(build_fn, "file/export", session=sess)
            assert reads == [] and sorted(os.listdir(".")) == ["file"]
            assert sok.export_for_serving(build_fn, "export", session=sess,
                                          chunk_rows=2 ** 63 - 1) == "export"
            assert sok.export_serving_delta([user], 0, "d", session=sess,
                                            chunk_rows=np.int64(2 ** 63 - 1)) == "d"
    np.testing.assert_array_equal(_served_rows("export", np.array([1, 2])), [[1, 2], [0, 0]])
    for kwargs, words in (
            (dict(export_dir="gs://bucket/export", delta_dir="d"),
             "apply_serving_delta: export_dir='gs://bucket/export' is a URL; export_dir must be "
             "a local directory path"),
            (dict(export_dir="export", delta_dir="gs://bucket/d"),
             "apply_serving_delta: delta_dir='gs://bucket/d' is a URL; delta_dir must be a local "
             "directory path"),
            (dict(export_dir="export", delta_dir="d", output_dir="gs://bucket/copy"),
             "apply_serving_delta: output_dir='gs://bucket/copy' is a URL; output_dir must be a "
             "local directory path"),
            (dict(export_dir="export", delta_dir="d", output_dir=f"file://{work}/copy"),
             f"apply_serving_delta: output_dir='file://{work}/copy' is a file:// URL")):
        with pytest.raises(ValueError, match=re.escape(words)):
            sok.apply_serving_delta(**kwargs)
    with pytest.raises(FileExistsError, match=re.escape(
            "cannot write output_dir='file/copy': a file stands where its parent directories "
            "must be")):
        sok.apply_serving_delta("export", "d", output_dir="file/copy")
    assert sorted(os.listdir(".")) == ["d", "export", "file"]
    assert sok.apply_serving_delta("export", "d", output_dir="copy") == {"user": 1}


@tf2_only
def test_an_updated_export_carries_the_fingerprint_of_its_new_variables(tmp_path):
    """apply_serving_delta copied the export's fingerprint.pb, which
    describes its previous variables (checkpoint_hash): the updated export
    carries none or the one TensorFlow computes from its files now."""
    export_dir, user = _one_table_export(tmp_path)
    if not os.path.exists(os.path.join(export_dir, "fingerprint.pb")):
        pytest.skip("this TensorFlow writes no SavedModel fingerprint")
    from tensorflow.core.protobuf import fingerprint_pb2
    from tensorflow.python.saved_model.pywrap_saved_model import fingerprinting

    def stored(directory):
        fingerprint = fingerprint_pb2.FingerprintDef()
        with open(os.path.join(directory, "fingerprint.pb"), "rb") as f:
            fingerprint.ParseFromString(f.read())
        return fingerprint

    def computed(directory):
        fingerprint = fingerprint_pb2.FingerprintDef()
        fingerprint.ParseFromString(fingerprinting.CreateFingerprintDef(directory))
        return fingerprint

    def same(a, b):  # but their uuid (newer TensorFlows), drawn anew each time
        for fingerprint in (a, b):
            if "uuid" in fingerprint.DESCRIPTOR.fields_by_name:
                fingerprint.ClearField("uuid")
        return a == b

    since = _export_created(export_dir)
    sok.assign(user, tf.constant([1, 5], tf.int64), np.array([[2, 3], [4, 5]], np.float32))
    delta_dir = sok.export_serving_delta([user], since, str(tmp_path / "delta"))
    before = stored(export_dir)
    assert same(stored(export_dir), computed(export_dir))
    copy = str(tmp_path / "copy")
    sok.apply_serving_delta(export_dir, delta_dir, output_dir=copy)
    sok.apply_serving_delta(export_dir, delta_dir)
    for directory in (copy, export_dir):
        np.testing.assert_array_equal(_served_rows(directory, np.array([1, 5])),
                                      [[2, 3], [4, 5]])
        if os.path.exists(os.path.join(directory, "fingerprint.pb")):
            assert same(stored(directory), computed(directory))
            assert stored(directory).checkpoint_hash != before.checkpoint_hash


@tf2_only
@pytest.mark.parametrize("name", ["café", "用户"])
def test_a_table_of_a_name_beyond_ascii_is_exported_and_takes_deltas(tmp_path, name):
    """A table named "café" or "用户" failed export_for_serving with
    TensorFlow's "not a valid root scope name" after its rows were read.
    It is served under its own name (loaded.sok_tables, the manifest, its
    delta's files), its variables in an ASCII name scope; served rows
    against the table's own find(), also after a delta."""
    from sok_graph.serving import tables as serving_tables

    sok.init(comm_tool="none")
    table = sok.DynamicVariable(2, initializer="zeros", name=name)
    ids = np.array([1, 2, 3], np.int64)
    sok.assign(table, tf.constant(ids[:2]), np.array([[1, 2], [3, 4]], np.float32))

    class Model(tf.Module):
        def __call__(self, x):
            return sok.lookup_sparse(table, x, combiners="sum")

    export_dir = str(tmp_path / "export")
    sok.export_for_serving(Model(), export_dir,
                           [tf.RaggedTensorSpec([None, None], tf.int64, ragged_rank=1)])
    since = _export_created(export_dir)
    sok.assign(table, tf.constant(ids[1:]), np.array([[5, 6], [7, 8]], np.float32))
    delta_dir = sok.export_serving_delta([table], since, str(tmp_path / "delta"))
    assert sorted(os.listdir(delta_dir)) == sorted(
        ["manifest.json", f"{name}.keys.npy", f"{name}.rows.npy"])
    assert sok.apply_serving_delta(export_dir, delta_dir) == {name: 2}
    loaded = tf.saved_model.load(export_dir)
    assert list(loaded.sok_tables) == [name]
    batch = tf.RaggedTensor.from_tensor(tf.constant(ids[:, None]))
    np.testing.assert_array_equal(loaded.serve(batch).numpy(),
                                  table.find(tf.constant(ids))[0].numpy())
    assert loaded.serve(batch).numpy().tolist() == [[1, 2], [5, 6], [7, 8]]
    assert serving_tables.scope_name(name) == {"café": "caf_", "用户": "__"}[name]
    for ascii_name, stem in (("a/b", "a_b"), ("with space", "with_space"),
                             ("dots..and-dash_ok", "dots..and-dash_ok")):
        assert serving_tables.scope_name(ascii_name) == stem


@tf2_only
def test_a_served_models_apply_delta_fn_refuses_a_repeated_key(tmp_path):
    """The loaded model's apply_delta_fn, in plain TensorFlow: keys (a
    static table's row ids) given twice are an InvalidArgumentError naming
    the table and the key, and the tables keep their keys and rows (a new
    key was added twice, a static row took one of its rows). Distinct keys
    are then taken, giving the rows numpy expects."""
    export_dir, start = _user_and_item_export(tmp_path)
    result = _plain_tf(_APPLY_EACH + """
        loaded = tf.saved_model.load(sys.argv[1])
        calls = {"new_twice": ("user", [8, 3, 8], [[5, 5], [6, 6], [7, 7]]),
                 "held_twice": ("user", [1, 1], [[5, 5], [6, 6]]),
                 "static_twice": ("item", [2, 0, 2], [[5, 5], [6, 6], [7, 7]])}
        out = apply_each(loaded, calls)
        user, item = loaded.sok_tables["user"], loaded.sok_tables["item"]
        probe = tf.constant([1, 3, 8], tf.int64)
        out["user_keys"] = user.keys.numpy().tolist()
        out["user"] = user.lookup_fn(probe).numpy().tolist()
        out["item"] = item.lookup_fn(tf.range(4, dtype=tf.int64)).numpy().tolist()
        out["added"] = int(user.apply_delta_fn(tf.constant([8, 3], tf.int64),
                                               tf.constant([[5.0, 5.0], [6.0, 6.0]])))
        item.apply_delta_fn(tf.constant([2, 0], tf.int64), tf.constant([[7.0, 7.0], [9.0, 9.0]]))
        out["user_keys_after"] = user.keys.numpy().tolist()
        out["user_after"] = user.lookup_fn(probe).numpy().tolist()
        out["item_after"] = item.lookup_fn(tf.range(4, dtype=tf.int64)).numpy().tolist()
        print(json.dumps(out))
    """, export_dir)
    for case, name, words, key in (("new_twice", "user", "keys must be distinct", 8),
                                   ("held_twice", "user", "keys must be distinct", 1),
                                   ("static_twice", "item", "row ids must be distinct", 2)):
        # (the table's name quoted, and escaped by the Assert's message)
        assert "apply_delta_fn of table" in result[case] and f"table \\'{name}\\'" in result[case] \
            and words in result[case] and re.search(rf"are\] \[{key}\]", result[case]), \
            (case, result[case])
    assert result["user_keys"] == [1], result
    np.testing.assert_array_equal(result["user"], [[1, 1], [0, 0], [0, 0]])
    np.testing.assert_array_equal(result["item"], start)
    assert result["added"] == 2 and result["user_keys_after"] == [1, 3, 8], result
    np.testing.assert_array_equal(result["user_after"], [[1, 1], [6, 6], [5, 5]])
    want = start.copy()
    want[[2, 0]] = [[7, 7], [9, 9]]
    np.testing.assert_array_equal(result["item_after"], want)


# Awkward names and the file stem both cleanups give them today (the
# expected strings written out, not computed).
_STEMS = [
    ("a/b", "a_b"),
    ("scope/table:0", "scope_table_0"),
    ("with space", "with_space"),
    ("tab\tand\nnewline", "tab_and_newline"),
    ("C:\\dir\\t", "C__dir_t"),
    ("café/日本語", "café_日本語"),
    ("emoji🙂", "emoji_"),
    ("e\u0301", "e_"),  # a combining accent is no letter
    ("x²", "x²"),  # a superscript digit is one
    ("dots..and-dash_ok", "dots..and-dash_ok"),
    ("..", ".."),
    ("/", "_"),
    ("a" * 300 + "/b:c", "a" * 300 + "_b_c"),
]


@pytest.mark.parametrize("name,stem", _STEMS)
def test_serving_names_and_dump_file_stems_are_one_cleanup(name, stem):
    """serving.tables.safe_name (a delta's file stems, the serving tables'
    name scopes) and dump_load._file_stem (a dump's files) give the names
    they gave before for awkward names, and one is written in terms of the
    other (each had its own copy of the rule); only an empty name differs:
    "table" as a serving name."""
    from sok_graph import dump_load
    from sok_graph.serving import tables as serving_tables

    assert dump_load._file_stem(name) == stem
    assert serving_tables.safe_name(name) == stem


def test_safe_name_is_dump_loads_file_stem(monkeypatch):
    from sok_graph import dump_load
    from sok_graph.serving import tables as serving_tables

    assert dump_load._file_stem("") == "" and serving_tables.safe_name("") == "table"
    monkeypatch.setattr(dump_load, "_file_stem", lambda name: f"<{name}>")
    assert serving_tables.safe_name("a/b") == "<a/b>"
    monkeypatch.setattr(dump_load, "_file_stem", lambda name: "")
    assert serving_tables.safe_name("a/b") == "table"


_RAGGED_IDS = [tf.RaggedTensorSpec([None, None], tf.int64, ragged_rank=1)]


class _DecoratedModule(tf.Module):
    """The usual way to a SavedModel: a tf.Module whose __call__ is a
    tf.function (here without an input signature; below with one)."""

    def __init__(self):
        super().__init__()
        self.static = sok.Variable(np.ones([4, 2], np.float32), name="decorated_static")
        self.dynamic = sok.DynamicVariable(dimension=2, initializer="1", name="decorated_dyn")

    def lookup(self, ids):
        a, b = sok.lookup_sparse([self.static, self.dynamic], [ids, ids], combiners="sum")
        return a + b

    @tf.function
    def __call__(self, ids):
        return self.lookup(ids)


class _DecoratedWithSignature(_DecoratedModule):
    @tf.function(input_signature=_RAGGED_IDS)
    def __call__(self, ids):
        return self.lookup(ids)


@tf2_only
@pytest.mark.parametrize("signature", [False, True])
def test_a_model_whose_call_is_a_tf_function_trains_on_after_its_export(tmp_path, signature):
    """The export traced the model's tf.function, whose cache kept the serving
    trace: the model's calls after the export read the served tables'
    snapshot (the trained rows changed, its answers did not), a second export
    served the first one's rows; and a trace made before the export (with an
    input signature) was taken for the serving one, which failed naming an
    'untracked' resource."""
    sok.init()
    model = _DecoratedWithSignature() if signature else _DecoratedModule()
    x = tf.ragged.constant([[1], [2]], dtype=tf.int64)
    model(x)  # a training trace before the export
    sok.export_for_serving(model, str(tmp_path / "first"), input_signature=_RAGGED_IDS)
    sok.assign(model.dynamic, tf.constant([1, 2], tf.int64), tf.constant([[5., 5.], [7., 7.]]))
    model.static.assign(np.full([4, 2], 10., np.float32))
    want = np.array([[15., 15.], [17., 17.], [11., 11.]], np.float32)
    np.testing.assert_array_equal(
        model(tf.ragged.constant([[1], [2], [3]], dtype=tf.int64)).numpy(), want)
    np.testing.assert_array_equal(model(x).numpy(), want[:2])
    sok.export_for_serving(model, str(tmp_path / "second"), input_signature=_RAGGED_IDS)
    served = tf.saved_model.load(str(tmp_path / "second"))
    np.testing.assert_array_equal(served.serve(x).numpy(), want[:2])


@tf2_only
def test_lookups_in_a_models_inner_tf_function_are_refused_at_export(tmp_path):
    """A lookup inside a tf.function below the model's __call__ would leave
    its serving trace in that function's cache, for the training calls after
    the export: refused, naming the cause, and the model goes on training
    on its tables."""
    sok.init()

    class Inner(tf.Module):
        def __init__(self):
            super().__init__()
            self.dynamic = sok.DynamicVariable(dimension=2, initializer="1", name="inner_dyn")
            self.embed = tf.function(
                lambda ids: sok.lookup_sparse(self.dynamic, ids, combiners="sum"))

        def __call__(self, ids):
            return self.embed(ids) * 2.0

    model = Inner()
    x = tf.ragged.constant([[1], [2]], dtype=tf.int64)
    with pytest.raises(ValueError, match=r"inside a tf\.function of its own"):
        sok.export_for_serving(model, str(tmp_path / "export"), input_signature=_RAGGED_IDS)
    assert not os.path.exists(str(tmp_path / "export"))
    sok.assign(model.dynamic, tf.constant([1, 2], tf.int64), tf.constant([[5., 5.], [7., 7.]]))
    np.testing.assert_array_equal(model(x).numpy(), [[10., 10.], [14., 14.]])


@tf2_only
def test_served_weights_must_pair_with_the_ids_as_in_training(tmp_path):
    """Weights whose rows do not pair with the ids' (same count, other row
    lengths) are refused by training; the served model summed them by the
    ids' rows without an error."""
    sok.init()
    table = sok.Variable(np.arange(12, dtype=np.float32).reshape(4, 3), name="weighted")

    def model(ids, weights):
        return sok.lookup_sparse(table, ids, weights, combiners="mean")

    spec = _RAGGED_IDS + [tf.RaggedTensorSpec([None, None], tf.float32, ragged_rank=1)]
    sok.export_for_serving(model, str(tmp_path / "export"), input_signature=spec)
    served = tf.saved_model.load(str(tmp_path / "export"))
    ids = tf.ragged.constant([[1, 2], [3]], dtype=tf.int64)
    paired = tf.ragged.constant([[1., 3.], [2.]])
    np.testing.assert_array_equal(served.serve(ids, paired).numpy(), model(ids, paired).numpy())
    shifted = tf.ragged.constant([[1.], [2., 3.]])
    for run in (model, served.serve):
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=r"sp_weights\[0\] must have one weight per id"):
            run(ids, shifted)


def _filtered_table(name):
    """A counting table where key 1 was admitted (seen 3 times) and key 2
    was not (seen once): training reads filter_default for key 2 and for
    keys never seen."""
    table = sok.DynamicVariable(dimension=2, initializer="0.5", name=name, min_count=3,
                                filter_default=0.25)
    return table


@tf2_only
def test_keys_a_filter_has_not_admitted_serve_its_default_row(tmp_path):
    """Training reads filter_default for keys an admission filter has not
    admitted (and for keys never seen); the served model read zeros for
    them. A default_row given for the table still wins."""
    sok.init()
    table = _filtered_table("admitted_only")
    for _ in range(3):
        sok.lookup_sparse(table, tf.ragged.constant([[1]], dtype=tf.int64), combiners="sum")
    sok.lookup_sparse(table, tf.ragged.constant([[2]], dtype=tf.int64), combiners="sum")

    def model(ids):
        return sok.lookup_sparse(table, ids, combiners="sum")

    ids = tf.ragged.constant([[1], [2], [9]], dtype=tf.int64)
    want = np.array([[.5, .5], [.25, .25], [.25, .25]], np.float32)
    np.testing.assert_array_equal(model(ids).numpy(), want)
    sok.export_for_serving(model, str(tmp_path / "export"), input_signature=_RAGGED_IDS)
    served = tf.saved_model.load(str(tmp_path / "export"))
    np.testing.assert_array_equal(served.serve(ids).numpy(), want)
    sok.export_for_serving(model, str(tmp_path / "given"), input_signature=_RAGGED_IDS,
                           default_row={"admitted_only": 7.0})
    given = tf.saved_model.load(str(tmp_path / "given"))
    np.testing.assert_array_equal(given.serve(ids).numpy(), [[.5, .5], [7., 7.], [7., 7.]])


def test_keys_a_filter_has_not_admitted_serve_its_default_row_in_a_session(tmp_path):
    """The same for a Session's export, whose build_fn makes the table with
    the training table's settings."""
    with tf.Graph().as_default():
        sok.init()
        keys = tf.compat.v1.placeholder(tf.int64, [None])
        rows = sok.all2all_dense_embedding(_filtered_table("admitted_tf1"), keys)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for batch in ([1], [1], [1], [2]):
                sess.run(rows, {keys: batch})
            want = sess.run(rows, {keys: [1, 2, 9]})

            def build_fn():
                k = tf.compat.v1.placeholder(tf.int64, [None], name="keys")
                return {"keys": k}, {"out": sok.all2all_dense_embedding(
                    _filtered_table("admitted_tf1"), k)}
            sok.export_for_serving(build_fn, str(tmp_path / "tf1"), session=sess)
    np.testing.assert_array_equal(want, [[.5, .5], [.25, .25], [.25, .25]])
    with tf.Graph().as_default() as g, tf.compat.v1.Session(graph=g) as sess:
        meta = tf.compat.v1.saved_model.load(sess, [tf.saved_model.SERVING], str(tmp_path / "tf1"))
        sig = meta.signature_def["serving_default"]
        got = sess.run(g.get_tensor_by_name(sig.outputs["out"].name),
                       {g.get_tensor_by_name(sig.inputs["keys"].name): [1, 2, 9]})
    np.testing.assert_array_equal(got, want)


@tf2_only
def test_served_static_ids_outside_the_table_fail_on_any_device(tmp_path):
    """A served static table's ids outside [0, rows) fail with the table's
    name, as in training; TensorFlow's gather failed only on a CPU (a GPU's
    gives zeros for them)."""
    sok.init()
    table = sok.Variable(np.arange(12, dtype=np.float32).reshape(4, 3), name="bounded")

    def model(ids):
        return sok.lookup_sparse(table, ids, combiners="sum")

    sok.export_for_serving(model, str(tmp_path / "export"), input_signature=_RAGGED_IDS)
    served = tf.saved_model.load(str(tmp_path / "export"))
    ok = tf.ragged.constant([[3, 0]], dtype=tf.int64)
    np.testing.assert_array_equal(served.serve(ok).numpy(), model(ok).numpy())
    for bad in (4, -1):
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=r"ids of served table .*bounded.* must be in \[0, rows\)"):
            served.serve(tf.ragged.constant([[1, bad]], dtype=tf.int64))
        with tf.device("/device:CPU:0"), pytest.raises(tf.errors.InvalidArgumentError):
            model(tf.ragged.constant([[1, bad]], dtype=tf.int64))


@tf2_only
def test_a_models_dynamic_find_is_served(tmp_path):
    """DynamicVariable.find (the read for inference, which inserts nothing)
    in a model: served as training reads it (the export failed with
    TensorFlow's "untracked resource" for the training table's handle)."""
    sok.init()
    table = sok.DynamicVariable(dimension=2, initializer="0.5", name="found")
    sok.assign(table, tf.constant([3, 2 ** 40], tf.int64), tf.constant([[1., 2.], [3., 4.]]))

    def model(ids):
        rows, found = table.find(ids, default_value=-1.0)
        return rows * tf.cast(found, tf.float32)[:, None] + rows

    ids = tf.constant([2 ** 40, 7, 3], tf.int64)
    want = model(ids).numpy()
    np.testing.assert_array_equal(want, [[6., 8.], [-1., -1.], [2., 4.]])
    sok.export_for_serving(model, str(tmp_path / "export"),
                           input_signature=[tf.TensorSpec([None], tf.int64)])
    served = tf.saved_model.load(str(tmp_path / "export"))
    np.testing.assert_array_equal(served.serve(ids).numpy(), want)
    assert sorted(sok.export(table)[0].numpy().tolist()) == [3, 2 ** 40]


def test_a_lookup_of_a_table_whose_keys_and_index_never_agree_fails_naming_it():
    """A delta stopped between its two assigns (or a lookup compiled with
    XLA, which reads each variable once) leaves keys and index of two
    lengths: the lookup's re-reads are bounded and end in an error naming
    the table, where they spun for ever. A whole delta is read as usual.
    (The bound is an int64 count and the error CheckNumerics':
    maximum_iterations and an assertion could not be placed on a GPU.)"""
    from sok_graph.serving import tables as serving_tables

    table = serving_tables.DynamicTable("user", tf.int64, 2)
    table.apply_delta(tf.constant([3, 1], tf.int64), tf.constant([[3.0, 3.0], [1.0, 1.0]]))
    np.testing.assert_array_equal(table.lookup(tf.constant([1, 2, 3], tf.int64)).numpy(),
                                  [[1.0, 1.0], [0.0, 0.0], [3.0, 3.0]])
    table.keys.assign(tf.constant([1, 3, 5], tf.int64))  # the index was not assigned
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="sok serving table 'user': its keys and index did not agree"):
        table.lookup(tf.constant([1], tf.int64))


def test_a_tf1_build_fn_whose_dynamic_table_lacks_the_trained_filter_default_is_refused(
        tmp_path):
    """A build_fn that makes a filtered table again without its admission
    settings (they look like training's alone): the export served zeros for
    keys the trained table had not admitted, where training reads its
    filter_default, without an error. It is a ValueError naming the table
    and both defaults, nothing written; with the trained settings (or an
    explicit default_row) the export serves what training reads."""
    with tf.Graph().as_default():
        sok.init()
        table = sok.DynamicVariable(2, initializer="0.5", name="flt", min_count=3,
                                    filter_default=0.25)
        ids = tf.constant([1, 1, 1, 2], tf.int64)
        read = table.sparse_read(ids)
        probe = tf.constant([1, 2, 9], tf.int64)

        def build_fn(**settings):
            served = sok.DynamicVariable(2, initializer="0.5", name="flt", **settings)
            keys = tf.compat.v1.placeholder(tf.int64, [None], name="keys")
            return {"keys": keys}, {"out": sok.all2all_dense_embedding(served, keys)}

        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(read)
            # Training's inference read: key 1 admitted, 2 counted once, 9 never seen.
            want = np.array([[0.5, 0.5], [0.25, 0.25], [0.25, 0.25]], np.float32)
            with pytest.raises(ValueError, match=r"dynamic table 'flt' has filter_default 0.0; "
                                                 r"the trained table reads 0.25"):
                sok.export_for_serving(build_fn, str(tmp_path / "bare"), session=sess)
            assert not os.path.exists(str(tmp_path / "bare"))
            for name, fn, row in (
                    ("same", lambda: build_fn(min_count=3, filter_default=0.25), None),
                    ("explicit", build_fn, {"flt": 0.25})):
                export_dir = str(tmp_path / name)
                sok.export_for_serving(fn, export_dir, session=sess, default_row=row)
                with tf.Graph().as_default(), tf.compat.v1.Session() as served:
                    meta = tf.compat.v1.saved_model.loader.load(served, ["serve"], export_dir)
                    signature = meta.signature_def["serving_default"]
                    got = served.run(signature.outputs["out"].name,
                                     {signature.inputs["keys"].name: sess.run(probe)})
                np.testing.assert_array_equal(got, want)


@tf2_only
@pytest.mark.parametrize("default_row,pattern", [
    ({"usr": 7.0}, r"default_row names \['usr'\], which the model serves no dynamic table as; "
                   r"its dynamic tables are served as \['user'\]"),
    (1e39, r"default_row of table 'user' must be finite in the table's dtype float32; got 1e\+39"),
    (float("nan"), r"default_row of table 'user' must be finite"),
])
def test_a_default_row_of_no_served_table_or_not_finite_is_refused(tmp_path, default_row,
                                                                     pattern):
    """default_row naming a table the model serves under no such name (a
    typo) was passed over and the table served zeros; 1e39 (past float32)
    and nan were served for every key the table lacks. Each is a ValueError
    naming default_row, nothing written."""
    with pytest.raises(ValueError, match=pattern):
        _one_table_export(tmp_path, default_row=default_row)
    assert not os.path.exists(str(tmp_path / "export"))


@tf2_only
def test_unique_read_and_a_filtered_read_counted_serve_as_training_reads(tmp_path):
    """A model reading a dynamic table through unique_read, or a filtered
    one through read_counted: the export failed (a sok op left in the
    servable function; TensorFlow's "untracked resource", naming neither
    the table nor the read). They serve what training's inference read
    gives: held rows, else the table's filter_default."""
    sok.init(comm_tool="none")
    plain = sok.DynamicVariable(2, initializer="zeros", name="plain")
    sok.assign(plain, tf.constant([3, 5], tf.int64), np.array([[1, 1], [2, 2]], np.float32))
    filtered = sok.DynamicVariable(2, initializer="0.5", name="filtered", min_count=2,
                                   filter_default=0.25)
    filtered.sparse_read(tf.constant([3, 3, 5], tf.int64))  # 3 admitted, 5 counted once

    class Model(tf.Module):
        def __call__(self, keys):
            _, rows, positions = plain.unique_read(keys)
            counted = filtered.read_counted(keys, tf.ones_like(keys))
            return tf.concat([tf.gather(rows, positions), counted], 1)

    export_dir = str(tmp_path / "reads")
    sok.export_for_serving(Model(), export_dir, [tf.TensorSpec([None], tf.int64)])
    served = tf.saved_model.load(export_dir)
    (out,) = served.signatures["serving_default"](tf.constant([5, 3, 9], tf.int64)).values()
    want = np.array([[2, 2, 0.25, 0.25], [1, 1, 0.5, 0.5], [0, 0, 0.25, 0.25]], np.float32)
    np.testing.assert_array_equal(out.numpy(), want)
