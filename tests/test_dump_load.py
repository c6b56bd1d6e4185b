"""sok.dump / sok.load / sok.incremental_model_dump."""

import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import tensorflow as tf

import sok_graph as sok
from sok_graph import dump_load
from sok_graph.dump_load import CheckpointError

# Builds the same model in any process: a static and a dynamic table, an
# Adagrad OptimizerWrapper, and a deterministic training step.
MODEL = textwrap.dedent("""
    import numpy as np, tensorflow as tf
    tf.compat.v1.enable_eager_execution()  # TF 1.x starts in graph mode
    import sok_graph as sok
    sok.init()
    static = sok.Variable(np.linspace(-1, 1, 40, dtype=np.float32).reshape(10, 4), name="static")
    dyn = sok.DynamicVariable(4, initializer="normal", seed=7, name="dyn")
    opt = sok.OptimizerWrapper(tf.compat.v1.train.AdagradOptimizer(0.2))
    def batch(i):
        rng = np.random.default_rng(i)
        a = tf.ragged.constant([list(rng.integers(0, 10, 3)) for _ in range(6)], tf.int64)
        b = tf.ragged.constant([list(rng.integers(0, 1000, 2)) for _ in range(6)], tf.int64)
        return a, b
    def step(i):
        a, b = batch(i)
        with tf.GradientTape() as tape:
            x, y = sok.lookup_sparse([static, dyn], [a, b], combiners=["sum", "mean"])
            loss = tf.reduce_sum(tf.square(x - 1)) + tf.reduce_sum(tf.square(y + 1))
        opt.apply_gradients(zip(tape.gradient(loss, [static, dyn]), [static, dyn]))
        return float(loss)
    def state():
        k, r = sok.export(dyn)
        order = np.argsort(k.numpy())
        acc = opt.get_slot(dyn, "accumulator").find(tf.constant(k.numpy()[order]))[0].numpy()
        return static.numpy(), k.numpy()[order], r.numpy()[order], acc
""")


def run_model(code):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run([sys.executable, "-c", MODEL + textwrap.dedent(code)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_dump_new_process_load_gives_identical_next_step(tmp_path):
    path = str(tmp_path / "ckpt")
    run_model(f"""
        for i in range(3): step(i)
        sok.dump({path!r}, [static, dyn], opt)
        loss = step(3)
        s, k, r, acc = state()
        np.savez({str(tmp_path / 'expected.npz')!r}, s=s, k=k, r=r, acc=acc, loss=loss)
    """)
    run_model(f"""
        sok.load({path!r}, [static, dyn], opt)
        assert int(opt.iterations) == 3
        loss = step(3)
        s, k, r, acc = state()
        e = np.load({str(tmp_path / 'expected.npz')!r})
        assert loss == float(e["loss"]), (loss, float(e["loss"]))
        for got, want in ((s, e["s"]), (k, e["k"]), (r, e["r"]), (acc, e["acc"])):
            assert got.tobytes() == want.tobytes()
        print("identical")
    """)


def test_dump_files_have_headers_and_manifest(tmp_path):
    v = sok.DynamicVariable(3, name="emb")
    v.sparse_read(tf.constant([3, 1], tf.int64))
    sok.dump(str(tmp_path / "d"), [v])
    files = sorted(os.listdir(tmp_path / "d"))
    assert files == ["emb.frequencies", "emb.keys", "emb.timestamps", "emb.values",
                     "manifest.json"]
    assert open(tmp_path / "d" / "emb.values", "rb").read(8) == b"SOKGDUMP"


def _two_dumps(tmp_path):
    v = sok.DynamicVariable(2, initializer=1.0, name="t")
    v.sparse_read(tf.constant([1, 2], tf.int64))
    path = str(tmp_path / "d")
    sok.dump(path, [v])
    return v, path


@pytest.mark.parametrize("damage", ["flip", "truncate", "manifest"])
def test_corrupted_or_truncated_dump_loads_nothing(tmp_path, damage):
    v, path = _two_dumps(tmp_path)
    target = os.path.join(path, "t.values" if damage != "manifest" else "manifest.json")
    data = bytearray(open(target, "rb").read())
    if damage == "flip":
        data[-1] ^= 0x40
    elif damage == "truncate":
        data = data[: len(data) - 5]
    else:
        data = data[:10]
    open(target, "wb").write(bytes(data))
    sok.assign(v, tf.constant([1, 2], tf.int64), tf.fill([2, 2], 9.0))
    with pytest.raises(CheckpointError, match="corrupted|truncated"):
        sok.load(path, [v])
    k, r = sok.export(v)
    np.testing.assert_array_equal(r.numpy(), np.full((2, 2), 9.0))  # untouched


def test_load_errors_name_the_problem(tmp_path):
    v, path = _two_dumps(tmp_path)
    with pytest.raises(CheckpointError, match="dimension 2; it has dimension 5"):
        sok.load(path, [sok.DynamicVariable(5, name="t")])
    with pytest.raises(CheckpointError, match="no variable 'other'"):
        sok.load(path, [sok.DynamicVariable(2, name="other")])
    with pytest.raises(CheckpointError, match="no sok_graph dump"):
        sok.load(str(tmp_path / "nowhere"), [v])
    with pytest.raises(ValueError, match="holds variable 't' twice"):
        sok.dump(str(tmp_path / "x"), [v, v])
    with pytest.raises(CheckpointError, match="no optimizer state"):
        sok.load(path, [v], sok.OptimizerWrapper(tf.keras.optimizers.Adagrad()))
    with pytest.raises(CheckpointError, match="10 rows; the dump holds 2"):
        static = sok.Variable(np.zeros((10, 2), np.float32), name="t")
        sok.load(path, [static])


@pytest.mark.parametrize("optimizer", ["adam", 0.1, object()])
def test_an_optimizer_that_is_no_optimizer_is_refused_naming_the_argument(tmp_path, optimizer):
    v = sok.DynamicVariable(2, name="t")
    sok.dump(str(tmp_path / "d"), [v])
    for call in (sok.dump, sok.load):
        with pytest.raises(TypeError, match=r"optimizer must be None, a sok optimizer .*; got "
                                            + type(optimizer).__name__):
            call(str(tmp_path / "d"), [v], optimizer)
    assert dump_load.dumped_names(str(tmp_path / "d")) == ["t"]


def test_tables_of_one_name_load_only_as_the_list_they_were_dumped_in(tmp_path):
    """Two unnamed eager tables are both "Variable:0": the dump tells them
    apart by their places in the list. Loading one of them alone used to
    give it the first table's rows; now a CheckpointError, nothing changes,
    and the whole list loads as dumped."""
    user = sok.Variable(np.full((3, 2), 1.0, np.float32))
    item = sok.Variable(np.full((3, 2), 2.0, np.float32))
    assert user.name == item.name
    sok.dump(str(tmp_path / "d"), [user, item])
    item.assign(np.zeros((3, 2), np.float32))
    from sok_graph.dump_load import CheckpointError

    with pytest.raises(CheckpointError, match="2 tables named.*load_vars holds 1"):
        sok.load(str(tmp_path / "d"), [item])
    np.testing.assert_array_equal(item.numpy(), np.zeros((3, 2)))
    sok.load(str(tmp_path / "d"), [user, item])
    np.testing.assert_array_equal(item.numpy(), np.full((3, 2), 2.0))
    np.testing.assert_array_equal(user.numpy(), np.full((3, 2), 1.0))


@pytest.mark.parametrize("dynamic_dim", [2, 4])
def test_a_dump_holding_two_tables_of_the_loaded_name_says_so_first(tmp_path, dynamic_dim):
    """A dump of [dynamic "t", static "t"] loaded as [static "t"]: the
    file "t" is the dynamic table's, so the load was refused with its row
    count ("has 3 rows; the dump holds 1 rows: load it into a table of 1
    rows") or dimension, which pointed at the wrong fix. It is refused
    saying the dump holds 2 tables named 't', nothing changes, and the
    list loads as dumped."""
    dyn = sok.DynamicVariable(dimension=dynamic_dim, initializer="0", name="t")
    dyn.scatter_update(tf.constant([7], tf.int64), tf.fill([1, dynamic_dim], 7.0))
    static = sok.Variable(np.full((3, 2), 5.0, np.float32), name="t")
    path = str(tmp_path / "d")
    sok.dump(path, [dyn, static])
    static.assign(np.zeros((3, 2), np.float32))
    with pytest.raises(CheckpointError) as refused:
        sok.load(path, [static])
    assert str(refused.value) == (
        f"the dump at {path} holds 2 tables named 't', told apart only by their places in "
        f"the dumped list; load_vars holds 1 of them: load all of them, in the order they "
        f"were dumped, or give the tables distinct names")
    np.testing.assert_array_equal(static.numpy(), np.zeros((3, 2)))
    sok.load(path, [dyn, static])
    np.testing.assert_array_equal(static.numpy(), np.full((3, 2), 5.0))


def test_a_table_never_takes_rows_dumped_under_a_repeated_name(tmp_path):
    """Dumped [x "emb", y "emb", w "emb_1"], the files are emb, emb_1 (y)
    and emb_1_1 (w); loading [x, w] would match w to y's file by name. A
    CheckpointError instead (w used to get y's rows), nothing changes."""
    from sok_graph.dump_load import CheckpointError

    x = sok.Variable(np.full((2, 2), 1.0, np.float32), name="emb")
    y = sok.Variable(np.full((2, 2), 2.0, np.float32), name="emb")
    w = sok.Variable(np.full((2, 2), 3.0, np.float32), name="emb_1")
    sok.dump(str(tmp_path / "d"), [x, y, w])
    w.assign(np.zeros((2, 2), np.float32))
    with pytest.raises(CheckpointError, match="table 'emb_1' of load_vars would take"):
        sok.load(str(tmp_path / "d"), [x, w])
    np.testing.assert_array_equal(w.numpy(), np.zeros((2, 2)))
    sok.load(str(tmp_path / "d"), [x, y, w])
    np.testing.assert_array_equal(w.numpy(), np.full((2, 2), 3.0))


def test_momentum_slots_load_only_into_the_kind_of_optimizer_that_made_them(tmp_path):
    """Keras' momentum slot is a velocity (scaled by the learning rate),
    tf.compat.v1.train's an accumulator of gradients: loaded across, training
    resumed from a wrong state (rows up to 10 off). A CheckpointError
    instead; the same kind loads."""
    from sok_graph.dump_load import CheckpointError

    def trained(opt):
        table = sok.DynamicVariable(2, initializer="zeros", name="m")
        keys = tf.constant([1, 2], tf.int64)
        for _ in range(2):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(table.sparse_read(keys))
            opt.apply_gradients([(tape.gradient(loss, table), table)])
        return table

    keras_opt = sok.OptimizerWrapper(tf.keras.optimizers.SGD(0.1, momentum=0.9))
    table = trained(keras_opt)
    sok.dump(str(tmp_path / "d"), [table], keras_opt)
    v1_opt = sok.OptimizerWrapper(tf.compat.v1.train.MomentumOptimizer(0.1, 0.9))
    other = trained(v1_opt)
    with pytest.raises(CheckpointError, match="Keras optimizer's momentum slots"):
        sok.load(str(tmp_path / "d"), [other], v1_opt)
    again = sok.OptimizerWrapper(tf.keras.optimizers.SGD(0.1, momentum=0.9))
    fresh = trained(again)
    sok.load(str(tmp_path / "d"), [fresh], again)


def test_files_of_another_dump_are_refused(tmp_path):
    """A file copied in from another dump of the same shapes (a partial
    restore of a backup) has a valid checksum of its own: the manifest's
    record of each file's checksum refuses it, nothing changes."""
    import shutil

    from sok_graph.dump_load import CheckpointError

    v = sok.Variable(np.full((3, 2), 1.0, np.float32), name="v")
    sok.dump(str(tmp_path / "step1"), [v])
    v.assign(np.full((3, 2), 2.0, np.float32))
    sok.dump(str(tmp_path / "step2"), [v])
    shutil.copy(tmp_path / "step2" / "v.values", tmp_path / "step1" / "v.values")
    v.assign(np.zeros((3, 2), np.float32))
    with pytest.raises(CheckpointError, match="v.values is not the file this dump wrote"):
        sok.load(str(tmp_path / "step1"), [v])
    np.testing.assert_array_equal(v.numpy(), np.zeros((3, 2)))
    sok.load(str(tmp_path / "step2"), [v])
    np.testing.assert_array_equal(v.numpy(), np.full((3, 2), 2.0))


def test_a_dump_holding_a_key_twice_is_refused_before_any_table_changes(tmp_path):
    """A dump whose keys file holds a key twice (rewritten by another
    program, checksums and all) is refused naming the variable and the key,
    before any table changes: the table's own check of the repeat failed
    on the key's owner only, after the other workers had loaded."""
    path = str(tmp_path / "d")
    table = sok.DynamicVariable(2, name="t", initializer="zeros")
    sok.assign(table, tf.constant([3, 5, 9], tf.int64), np.arange(6, dtype=np.float32).reshape(3, 2))
    sok.dump(path, [table])
    # Key 9 written as 5 again, the file's and the manifest's checksums
    # made to match.
    crc = dump_load._write_array(os.path.join(path, "t.keys"), np.array([3, 5, 5], np.int64))
    with open(os.path.join(path, "manifest.json")) as f:
        manifest = json.load(f)
    manifest["variables"]["t"]["crc32"]["keys"] = crc
    del manifest["checksum"]
    manifest["checksum"] = dump_load._manifest_checksum(manifest)
    with open(os.path.join(path, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    sok.assign(table, tf.constant([7], tf.int64), [[1.0, 1.0]])
    keys, rows = (np.asarray(x) for x in sok.export(table))
    with pytest.raises(CheckpointError, match=r"variable 't': .* holds key 5 more than once"):
        sok.load(path, [table])
    after_keys, after_rows = (np.asarray(x) for x in sok.export(table))
    np.testing.assert_array_equal(after_keys, keys)
    np.testing.assert_array_equal(after_rows, rows)


def test_interrupted_dump_keeps_previous_dump_loadable(tmp_path):
    """Kill a process while it overwrites a dump: what load() finds is a
    complete dump, the old one or the new one, never a broken one."""
    path = str(tmp_path / "big")
    script = textwrap.dedent(f"""
        import sys, numpy as np, tensorflow as tf
        tf.compat.v1.enable_eager_execution()  # TF 1.x starts in graph mode
        import sok_graph as sok
        sok.init()
        v = sok.Variable(np.full((400000, 64), float(sys.argv[1]), np.float32), name="big")
        sok.dump({path!r}, [v])
        print("dumped", flush=True)
    """)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    first = subprocess.run([sys.executable, "-c", script, "1"], env=env, capture_output=True,
                           text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    outcomes = set()
    for delay in (0.5, 1.5, 2.5, 3.5):
        proc = subprocess.Popen([sys.executable, "-c", script, "2"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        v = sok.Variable(np.zeros((400000, 64), np.float32), name="big")
        sok.load(path, [v])
        values = np.unique(v.numpy())
        assert values.tolist() in ([1.0], [2.0]), values
        outcomes.add(float(values[0]))
        if values.tolist() == [2.0]:  # the new dump completed: restore the old one
            subprocess.run([sys.executable, "-c", script, "1"], env=env, check=True,
                           capture_output=True, timeout=300)
    assert 1.0 in outcomes


def test_incremental_model_dump_returns_exactly_rows_touched_after(rng):
    v = sok.DynamicVariable(2, initializer="zeros")
    v.sparse_read(tf.range(10, dtype=tf.int64))
    time.sleep(0.01)
    threshold = datetime.datetime.now(datetime.timezone.utc)
    time.sleep(0.01)
    v.sparse_read(tf.constant([3, 20], tf.int64))
    sok.assign(v, tf.constant([7], tf.int64), tf.ones([1, 2]))
    keys, values = sok.incremental_model_dump([v], threshold)
    assert sorted(keys[0].tolist()) == [3, 7, 20]
    got = dict(zip(keys[0].tolist(), values[0].tolist()))
    assert got[7] == [1.0, 1.0]
    with pytest.raises(TypeError, match="DynamicVariable"):
        sok.incremental_model_dump([sok.Variable(np.zeros((2, 2), np.float32))], threshold)


def test_dump_and_load_in_graph_mode(tmp_path):
    path = str(tmp_path / "g")
    graph = tf.Graph()
    with graph.as_default():
        v = sok.DynamicVariable(2, initializer=3.0, name="gv")
        read = v.sparse_read(tf.constant([5, 6], tf.int64))
        bump = v.scatter_add(tf.constant([5], tf.int64), tf.ones([1, 2]))
        with tf.compat.v1.Session(graph=graph) as sess, sess.as_default():
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(read)
            sok.dump(path, [v])
            sess.run(bump)
            sok.load(path, [v])
            np.testing.assert_array_equal(sess.run(read), np.full((2, 2), 3.0))


def test_a_session_dump_of_a_table_its_optimizer_never_trained_loads_back(tmp_path):
    """A graph's optimizer makes slots only for the tables it trains: a
    dump of a trained and an untrained table wrote no slots for the second,
    and sok.load with the same arguments refused it ("no 'm' slot").
    The untrained table's slots are dumped at their initial values (as an
    eager dump makes them), and the load makes them in the graph."""
    path = str(tmp_path / "g")

    def build():
        graph = tf.Graph()
        with graph.as_default():
            a = sok.Variable(np.ones((4, 2), np.float32), name="a")
            b = sok.DynamicVariable(2, initializer=1.0, name="b")
            ids = tf.RaggedTensor.from_tensor(tf.constant([[1]], tf.int64))
            loss = tf.reduce_sum(sok.lookup_sparse([a], [ids], combiners=["sum"])[0])
            opt = sok.OptimizerWrapper(tf.compat.v1.train.AdamOptimizer(0.1))
            train = opt.apply_gradients(zip(tf.compat.v1.gradients(loss, [a]), [a]))
            read_b = b.sparse_read(tf.constant([5, 6], tf.int64))
            init = tf.compat.v1.global_variables_initializer()
        sess = tf.compat.v1.Session(graph=graph)
        sess.run(init)
        return sess, a, b, opt, train, read_b

    sess, a, b, opt, train, read_b = build()
    with sess.graph.as_default(), sess.as_default():
        sess.run([train, read_b])
        sess.run(train)
        sok.dump(path, [a, b], opt)
        want_a = sess.run(a.read_value())
        m = sess.run(opt.get_slot(a, "m"))
    sess.close()
    sess, a, b, opt, train, read_b = build()
    with sess.graph.as_default(), sess.as_default():
        sok.load(path, [a, b], opt)
        np.testing.assert_array_equal(sess.run(a.read_value()), want_a)
        np.testing.assert_array_equal(sess.run(opt.get_slot(a, "m")), m)
        rows, found = sess.run(b.find(tf.constant([5, 6], tf.int64)))
        assert found.all()
        np.testing.assert_array_equal(rows, np.ones((2, 2), np.float32))
        rows, found = sess.run(opt.get_slot(b, "v").find(tf.constant([5, 6], tf.int64)))
        assert found.all()
        np.testing.assert_array_equal(rows, np.zeros((2, 2), np.float32))
    sess.close()


def test_dump_and_load_in_a_monitored_training_session(tmp_path):
    """A MonitoredTrainingSession finalizes its graph: a dump or load there
    gave only TensorFlow's "Graph is finalized and cannot be modified". They
    work there; without a default Session the error says what to do."""
    path = str(tmp_path / "m")
    graph = tf.Graph()
    with graph.as_default():
        v = sok.DynamicVariable(2, initializer=3.0, name="mv")
        s = sok.Variable(np.ones((3, 2), np.float32), name="ms")
        read = v.sparse_read(tf.constant([5, 6], tf.int64))
        read_s = s.read_value()
        bump = [v.scatter_add(tf.constant([5], tf.int64), tf.ones([1, 2])),
                s.assign_add(tf.ones([3, 2]))]
        with tf.compat.v1.train.MonitoredTrainingSession() as mon:
            assert graph.finalized
            with pytest.raises(RuntimeError, match=r"inside `with sess.as_default\(\):`"):
                sok.dump(path, [v, s])
            assert not os.path.exists(path)
            mon.run(read)
            with mon._tf_sess().as_default():
                sok.dump(path, [v, s])
                mon.run(bump)
                sok.load(path, [v, s])
            assert graph.finalized
            np.testing.assert_array_equal(mon.run(read), np.full((2, 2), 3.0))
            np.testing.assert_array_equal(mon.run(read_s), np.ones((3, 2)))
            # The increment since the start, through the monitored session
            # itself and through the default Session: keys 5 and 6 (read),
            # rows as restored.
            for kwargs in ({"sess": mon}, {}):
                with mon._tf_sess().as_default():
                    keys, rows = sok.incremental_model_dump([v], 0, **kwargs)
                order = np.argsort(keys[0])
                np.testing.assert_array_equal(keys[0][order], [5, 6])
                np.testing.assert_array_equal(rows[0][order], np.full((2, 2), 3.0))
            assert graph.finalized


def test_incremental_model_dump_runs_in_the_default_sessions_graph():
    """`with sess.as_default():` alone, the table's graph not the default
    graph: incremental_model_dump built its ops in the default graph and
    failed ("must be from the same graph"), where sok.dump worked."""
    graph = tf.Graph()
    with graph.as_default():
        v = sok.DynamicVariable(2, initializer=1.0, name="inc")
        read = v.sparse_read(tf.constant([1, 2], tf.int64))
        init = tf.compat.v1.global_variables_initializer()
    sess = tf.compat.v1.Session(graph=graph)
    sess.run(init)
    sess.run(read)
    with tf.Graph().as_default():  # graph mode; another graph is the default
        with sess.as_default():
            keys, rows = sok.incremental_model_dump([v], 0)
        np.testing.assert_array_equal(np.sort(keys[0]), [1, 2])
        np.testing.assert_array_equal(rows[0], np.ones((2, 2)))
        with pytest.raises(RuntimeError, match=r"incremental_model_dump without sess="):
            sok.incremental_model_dump([v], 0)
    sess.close()


_WRITER = """
import sys
import numpy as np
from sok_graph import dump_load
path, arrays, kind, ready = sys.argv[1:]
with np.load(arrays) as data:
    tables = {"s": (kind, {k: data[k] for k in data.files})}
open(ready, "w").close()
dump_load.write_dump(path, tables)
"""


def test_a_load_never_reads_a_dump_that_another_process_swaps_in(tmp_path, monkeypatch):
    """A load takes a reader's turn on the dump's directory: another
    process's dump there waits until the load has read the files (a load
    overlapping a dump read files of both, refused as "files of different
    dumps are mixed", as if the dump were damaged)."""
    import subprocess
    import sys
    import time

    from sok_graph import dump_load
    from sok_graph.tables import kind_of

    path = str(tmp_path / "ck")
    s = sok.Variable(np.ones((4, 2), np.float32), name="s")
    sok.dump(path, [s])
    s.assign(tf.fill([4, 2], 2.0))
    arrays = str(tmp_path / "newer.npz")
    np.savez(arrays, **dump_load._export(s, None))
    ready = str(tmp_path / "ready")
    read_dump, writer = dump_load.read_dump, []

    def read_while_another_process_dumps(*args, **kwargs):
        if not writer:
            writer.append(subprocess.Popen([sys.executable, "-c", _WRITER, path, arrays,
                                            kind_of(s), ready]))
            deadline = time.time() + 120
            while not os.path.exists(ready) and writer[0].poll() is None \
                    and time.time() < deadline:
                time.sleep(0.05)
            time.sleep(2.0)  # a dump of 4 rows takes milliseconds, if it is let through
            assert writer[0].poll() is None, "the other process's dump did not wait"
        return read_dump(*args, **kwargs)

    monkeypatch.setattr(dump_load, "read_dump", read_while_another_process_dumps)
    t = sok.Variable(np.zeros((4, 2), np.float32), name="s")
    sok.load(path, [t])
    np.testing.assert_array_equal(t.numpy(), np.ones((4, 2)))
    assert writer[0].wait(timeout=120) == 0
    monkeypatch.setattr(dump_load, "read_dump", read_dump)
    sok.load(path, [t])
    np.testing.assert_array_equal(t.numpy(), np.full((4, 2), 2.0))


def test_dump_vars_given_as_a_dict_is_a_type_error_naming_it(tmp_path):
    """A dict iterated as its keys: the error said "got str"."""
    table = sok.DynamicVariable(2, name="a")
    with pytest.raises(TypeError, match=r"dump_vars must be a sok variable or a list of them.*"
                                        r"got a dict"):
        sok.dump(str(tmp_path / "d"), {"a": table})
    with pytest.raises(TypeError, match=r"load_vars .*got a dict"):
        sok.load(str(tmp_path / "d"), {"a": table})
    assert not os.path.exists(str(tmp_path / "d"))


def test_variables_with_the_same_name_are_told_apart_by_position(tmp_path):
    a, b = sok.DynamicVariable(2, initializer=1.0), sok.DynamicVariable(2, initializer=2.0)
    a.sparse_read(tf.constant([1], tf.int64))
    b.sparse_read(tf.constant([1], tf.int64))
    sok.dump(str(tmp_path / "d"), [a, b])
    c, d = sok.DynamicVariable(2), sok.DynamicVariable(2)
    sok.load(str(tmp_path / "d"), [c, d])
    assert sok.export(c)[1].numpy().tolist() == [[1.0, 1.0]]
    assert sok.export(d)[1].numpy().tolist() == [[2.0, 2.0]]


def test_a_static_and_a_dynamic_table_of_one_name_listed_otherwise_are_refused(tmp_path):
    """A sok.Variable and a DynamicVariable both named 'emb', dumped as
    [static, dynamic] and loaded as [dynamic, static], took each other's
    rows (tables of one name go by place); the manifest knows each one's
    kind, so that order is refused, and the dumped order loads."""
    static = sok.Variable(np.full([4, 2], 1.0, np.float32), name="emb")
    dynamic = sok.DynamicVariable(2, initializer="zeros", name="emb")
    sok.assign(dynamic, tf.constant([0, 1, 2, 3], tf.int64), tf.fill([4, 2], 2.0))
    sok.dump(str(tmp_path / "d"), [static, dynamic])
    static2 = sok.Variable(np.zeros([4, 2], np.float32), name="emb")
    dynamic2 = sok.DynamicVariable(2, initializer="zeros", name="emb")
    with pytest.raises(CheckpointError,
                       match=r"listed as 'emb' of load_vars is dynamic; the dump's 'emb' is "
                             r"static"):
        sok.load(str(tmp_path / "d"), [dynamic2, static2])
    assert int(dynamic2.size[0]) == 0
    np.testing.assert_array_equal(static2.numpy(), 0.0)
    sok.load(str(tmp_path / "d"), [static2, dynamic2])
    np.testing.assert_array_equal(static2.numpy(), 1.0)
    np.testing.assert_array_equal(sok.export(dynamic2)[1].numpy(), 2.0)


def test_dump_before_any_step_still_carries_optimizer_state(tmp_path):
    v = sok.DynamicVariable(2, initializer=1.0, name="fresh")
    v.sparse_read(tf.constant([3], tf.int64))
    opt = sok.OptimizerWrapper(tf.compat.v1.train.AdagradOptimizer(0.1))
    sok.dump(str(tmp_path / "d"), [v], opt)
    other = sok.OptimizerWrapper(tf.compat.v1.train.AdagradOptimizer(0.1))
    w = sok.DynamicVariable(2, name="fresh")
    sok.load(str(tmp_path / "d"), [w], other)
    rows, found = other.get_slot(w, "accumulator").find(tf.constant([3], tf.int64))
    assert found.numpy().all()
    np.testing.assert_allclose(rows.numpy(), [[0.1, 0.1]])  # Adagrad's initial accumulator


def _train_steps(pairs, steps=3):
    """`steps` steps of sum-of-squares on keys 1..3: each (table, optimizer)
    of `pairs` trains its table."""
    ids = tf.ragged.constant([[1, 2], [3]], tf.int64)
    for _ in range(steps):
        tables = [t for t, _ in pairs]
        with tf.GradientTape() as tape:
            outs = sok.lookup_sparse(tables, [ids] * len(tables), combiners="sum")
            loss = tf.add_n([tf.reduce_sum(o * o) for o in outs])
        for (table, opt), grad in zip(pairs, tape.gradient(loss, tables)):
            opt.apply_gradients([(grad, table)])


def _rows(table):
    return table.sparse_read(tf.constant([1, 2, 3], tf.int64)).numpy()


def test_the_optimizer_a_wrapper_wraps_is_refused_where_the_wrapper_holds_the_state(tmp_path):
    """sok.dump / sok.load given the Keras optimizer that a trained table's
    sok.OptimizerWrapper wraps: the dump wrote step 0 and zero slots, and
    the load put the dumped ones where training never reads them, without
    an error. Both refuse now, before anything is written or changed."""
    inner = tf.keras.optimizers.Adam(0.1)
    wrapper = sok.OptimizerWrapper(inner)
    table = sok.DynamicVariable(2, initializer="1", name="v")
    _train_steps([(table, wrapper)])
    path = str(tmp_path / "d")
    with pytest.raises(ValueError, match=r"sok.dump: the optimizer state of table 'v' is held "
                                         r"by sok.OptimizerWrapper\(Adam\).*the wrapper, not opt"):
        sok.dump(path, [table], inner)
    assert not os.path.exists(path)
    sok.dump(path, [table], wrapper)
    before = _rows(table)
    _train_steps([(table, wrapper)])
    trained = _rows(table)
    with pytest.raises(ValueError, match="sok.load: the optimizer state of table 'v'"):
        sok.load(path, [table], inner)
    np.testing.assert_array_equal(_rows(table), trained)
    # The wrapper's load puts back rows, slots and step: the steps after it
    # are those after the dump, bit for bit.
    sok.load(path, [table], wrapper)
    np.testing.assert_array_equal(_rows(table), before)
    _train_steps([(table, wrapper)])
    np.testing.assert_array_equal(_rows(table), trained)


def test_a_dump_with_another_tables_optimizer_is_refused_naming_the_table(tmp_path):
    """Two tables trained by two optimizers, dumped with one of them: the
    other table's state (Adagrad's accumulators) was written as fresh Adam
    slots, without an error. Now refused; dumped one table per optimizer,
    a new process (new tables and optimizers) resumes bit for bit."""
    def make():
        return (sok.DynamicVariable(2, name="a", initializer="1"),
                sok.DynamicVariable(2, name="b", initializer="1"),
                sok.OptimizerWrapper(tf.keras.optimizers.Adam(0.1)),
                sok.OptimizerWrapper(tf.keras.optimizers.Adagrad(0.1)))

    a, b, opt_a, opt_b = make()
    _train_steps([(a, opt_a), (b, opt_b)])
    with pytest.raises(ValueError, match=r"table 'b' is held by sok.OptimizerWrapper\(Adagrad\), "
                                         r"not by the optimizer given \(sok.OptimizerWrapper"
                                         r"\(Adam\)\).*dumped and loaded separately"):
        sok.dump(str(tmp_path / "both"), [a, b], opt_a)
    assert not os.path.exists(str(tmp_path / "both"))
    sok.dump(str(tmp_path / "a"), [a], opt_a)
    sok.dump(str(tmp_path / "b"), [b], opt_b)
    _train_steps([(a, opt_a), (b, opt_b)])
    want = _rows(a), _rows(b)
    a2, b2, opt_a2, opt_b2 = make()
    sok.load(str(tmp_path / "a"), [a2], opt_a2)
    sok.load(str(tmp_path / "b"), [b2], opt_b2)
    _train_steps([(a2, opt_a2), (b2, opt_b2)])
    np.testing.assert_array_equal(_rows(a2), want[0])
    np.testing.assert_array_equal(_rows(b2), want[1])
    # A load into a new optimizer while the old one still lives is allowed
    # (training may go on with the new one), and it gets the dumped state.
    opt_b3 = sok.OptimizerWrapper(tf.keras.optimizers.Adagrad(0.1))
    sok.load(str(tmp_path / "b"), [b], opt_b3)
    _train_steps([(b, opt_b3)])
    np.testing.assert_array_equal(_rows(b), want[1])


def test_int64_keys_never_wrap_into_an_int32_key_table(tmp_path):
    """Key 2**32 + 5 would become key 5 in an int32-key table: refused before
    the table changes."""
    wide = sok.DynamicVariable(2, key_type=tf.int64, name="t")
    wide.import_rows(tf.constant([2 ** 32 + 5, 7], tf.int64), tf.ones([2, 2]))
    sok.dump(str(tmp_path / "d"), [wide])
    narrow = sok.DynamicVariable(2, key_type=tf.int32, name="t")
    narrow.import_rows(tf.constant([1], tf.int32), tf.fill([1, 2], 3.0))
    with pytest.raises(CheckpointError, match=r"int32 keys.*key 4294967301.*key_type=tf.int64"):
        sok.load(str(tmp_path / "d"), [narrow])
    keys, rows = narrow.export()
    assert keys.numpy().tolist() == [1] and rows.numpy().tolist() == [[3.0, 3.0]]


def test_failed_capacity_check_changes_no_table(tmp_path):
    """A 100-key dump into a hybrid table of 64 rows: refused before either
    table of the call changes (the static table keeps its rows too)."""
    static = sok.Variable(np.zeros((4, 2), np.float32), name="s")
    big = sok.DynamicVariable(2, name="h")
    big.import_rows(tf.range(100, dtype=tf.int64), tf.ones([100, 2]))
    static.assign(np.ones((4, 2), np.float32))
    sok.dump(str(tmp_path / "d"), [static, big])
    static.assign(np.zeros((4, 2), np.float32))
    small = sok.DynamicVariable(2, var_type="hybrid", init_capacity=64, max_capacity=64,
                                name="h")
    small.import_rows(tf.constant([500], tf.int64), tf.fill([1, 2], 9.0))
    with pytest.raises(CheckpointError, match=r"'h' holds at most 64 rows.*gives it 100"):
        sok.load(str(tmp_path / "d"), [static, small])
    np.testing.assert_array_equal(static.numpy(), np.zeros((4, 2), np.float32))
    keys, rows = small.export()
    assert keys.numpy().tolist() == [500] and rows.numpy().tolist() == [[9.0, 9.0]]


def test_replace_that_does_not_fit_leaves_the_table_as_it_was():
    """The replacing import itself (what load, Saver restores and
    checkpoints use) fails whole: five keys into a table of four rows keep
    its three old keys and rows (an import after a clear lost them)."""
    from sok_graph.ops import dynamic as dynamic_ops

    table = sok.DynamicVariable(2, var_type="hybrid", init_capacity=4, max_capacity=4)
    table.import_rows(tf.constant([1, 2, 3], tf.int64), tf.constant([[1., 1], [2, 2], [3, 3]]))
    too_many = tf.constant([7, 8, 9, 10, 11], tf.int64)
    # replace_rows refuses the count before the op (naming max_capacity);
    # the op refuses it on its own too.
    with pytest.raises(ValueError, match="max_capacity=4 holds: got 5 keys"):
        table.replace_rows(too_many, tf.ones([5, 2]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="5 distinct keys"):
        dynamic_ops.import_rows(table.handle, too_many, tf.ones([5, 2]), None, None,
                                replace=True)
    keys, rows = table.export()
    order = np.argsort(keys.numpy())
    assert keys.numpy()[order].tolist() == [1, 2, 3]
    assert rows.numpy()[order].tolist() == [[1, 1], [2, 2], [3, 3]]
    table.replace_rows(tf.constant([2, 5], tf.int64), tf.constant([[4., 4], [5, 5]]))
    keys, rows = table.export()
    order = np.argsort(keys.numpy())
    assert keys.numpy()[order].tolist() == [2, 5]
    assert rows.numpy()[order].tolist() == [[4, 4], [5, 5]]


def test_a_load_failing_midway_puts_back_the_tables_it_replaced(tmp_path, monkeypatch):
    """A load whose second dynamic table fails (as running out of memory
    would, after every check passed) restores the first one: keys, rows and
    the optimizer's slots; the static table was never written."""
    static = sok.Variable(np.zeros((4, 2), np.float32), name="s")
    first = sok.DynamicVariable(2, initializer="zeros", name="a")
    second = sok.DynamicVariable(2, initializer="zeros", name="b")
    opt = sok.OptimizerWrapper(tf.keras.optimizers.Adagrad(0.1))
    for table, keys in ((first, [1, 2]), (second, [5])):
        table.import_rows(tf.constant(keys, tf.int64), tf.ones([len(keys), 2]))
    sok.dump(str(tmp_path / "d"), [static, first, second], opt)
    # Afterwards: other keys, rows and slots than the dump has.
    first.replace_rows(tf.constant([7], tf.int64), tf.fill([1, 2], 3.0))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(sok.lookup_sparse([first], [tf.ragged.constant([[7]], tf.int64)],
                                               combiners=["sum"])[0])
    opt.apply_gradients(zip(tape.gradient(loss, [first]), [first]))
    static.assign(np.full((4, 2), 9.0, np.float32))
    before_rows = {int(k): r.tolist() for k, r in zip(*[t.numpy() for t in first.export()])}
    accum = opt.get_slot(first, "accumulator")
    before_slot = accum.find(tf.constant([7], tf.int64))[0].numpy().tolist()
    real = type(second).replace_rows

    calls = []

    def fails_for_b(self, *args, **kwargs):
        calls.append(self.name)
        if self is second and calls.count(self.name) == 1:  # the load's write, not the put-back
            raise tf.errors.ResourceExhaustedError(None, None, "out of memory (simulated)")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(type(second), "replace_rows", fails_for_b)
    with pytest.raises(tf.errors.ResourceExhaustedError, match="simulated"):
        sok.load(str(tmp_path / "d"), [static, first, second], opt)
    monkeypatch.undo()
    after_rows = {int(k): r.tolist() for k, r in zip(*[t.numpy() for t in first.export()])}
    assert after_rows == before_rows == {7: before_rows[7]}
    assert accum.find(tf.constant([7], tf.int64))[0].numpy().tolist() == before_slot
    np.testing.assert_array_equal(static.numpy(), np.full((4, 2), 9.0, np.float32))


def test_lookups_during_loads_never_see_an_empty_table(tmp_path):
    """One thread loads a dump over and over while another looks its keys
    up (sparse_read: a missing key would be inserted with its initial row):
    every lookup sees the dumped rows, never an emptied table."""
    import threading

    keys = np.arange(0, 2000, 7, dtype=np.int64)
    rows = np.stack([keys, -keys], 1).astype(np.float32)
    table = sok.DynamicVariable(2, initializer="normal", name="t")
    table.import_rows(tf.constant(keys), tf.constant(rows))
    sok.dump(str(tmp_path / "d"), [table])
    stop, loads, seen, wrong = threading.Event(), [0], [0], []

    def loader():
        while not stop.is_set():
            sok.load(str(tmp_path / "d"), [table])
            loads[0] += 1

    def reader():
        while not stop.is_set():
            got = table.sparse_read(tf.constant(keys)).numpy()
            seen[0] += 1
            if not np.array_equal(got, rows):
                wrong.append(int(np.sum(np.any(got != rows, axis=1))))

    threads = [threading.Thread(target=loader), threading.Thread(target=reader)]
    for t in threads:
        t.start()
    time.sleep(3)
    stop.set()
    for t in threads:
        t.join()
    assert loads[0] >= 5 and seen[0] >= 5, (loads, seen)
    assert not wrong, f"{len(wrong)} of {seen[0]} lookups during {loads[0]} loads saw other rows"


@pytest.mark.parametrize("existing", ["user_dir", "file", "cwd"])
def test_dump_never_replaces_what_is_not_a_dump(tmp_path, monkeypatch, existing):
    v = sok.Variable(np.ones((3, 2), np.float32), name="v")
    if existing == "user_dir":
        path = tmp_path / "proj"
        path.mkdir()
        (path / "notes.txt").write_text("mine")
        keep = path / "notes.txt"
    elif existing == "file":
        path = tmp_path / "ckpt"
        path.write_text("mine")
        keep = path
    else:
        (tmp_path / "notes.txt").write_text("mine")
        monkeypatch.chdir(tmp_path)
        path, keep = ".", tmp_path / "notes.txt"
    with pytest.raises(FileExistsError, match=r"not a sok_graph dump"):
        sok.dump(str(path), [v])
    assert keep.read_text() == "mine"


@pytest.mark.parametrize("form", ["bytes", "pathlib", "tensor"])
def test_dump_and_load_take_a_path_in_any_form_of_one(tmp_path, form):
    """bytes failed midway ("can't concat str to bytes"), an eager string
    tensor with os's "expected str, bytes or os.PathLike object"."""
    v = sok.Variable(np.arange(6, dtype=np.float32).reshape(3, 2), name="v")
    where = str(tmp_path / "d ü")
    path = {"bytes": os.fsencode(where), "pathlib": tmp_path / "d ü",
            "tensor": tf.constant(where)}[form]
    sok.dump(path, [v])
    assert sorted(os.listdir(tmp_path)) == ["d ü"]
    w = sok.Variable(np.zeros((3, 2), np.float32), name="v")
    sok.load(path, [w])
    np.testing.assert_array_equal(w.numpy(), np.arange(6, dtype=np.float32).reshape(3, 2))


def test_dump_refuses_paths_that_name_no_directory(tmp_path, monkeypatch):
    """"" was taken as the current directory, and a dump to the current
    directory (empty, or a previous dump) renamed it away: the process was
    left in a deleted directory (os.getcwd() failed). A file where a parent
    directory must be gave os's bare "[Errno 17] File exists"."""
    v = sok.Variable(np.ones((3, 2), np.float32), name="v")
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    for path in ("", b""):
        with pytest.raises(ValueError, match="path must name a directory; got an empty string"):
            sok.dump(path, [v])
    with pytest.raises(ValueError, match=r"path='\.' is the current directory"):
        sok.dump(".", [v])
    with pytest.raises(ValueError, match=r"is the current directory"):
        sok.dump(str(here), [v])
    assert os.getcwd() == str(here) and os.listdir(here) == []
    for path in (None, 3):
        with pytest.raises(TypeError, match="path must be a str or a path"):
            sok.dump(path, [v])
        with pytest.raises(TypeError, match="path must be a str or a path"):
            sok.load(path, [v])
    (tmp_path / "afile").write_text("mine")
    for path in ("afile/ckpt", "afile/sub/ckpt"):
        with pytest.raises(FileExistsError, match=r"cannot write a dump at .*afile.*a file stands "
                                                  r"where its parent directories must be"):
            sok.dump(str(tmp_path / path), [v])
    assert (tmp_path / "afile").read_text() == "mine"
    sok.dump("sub", [v])  # a directory under the current one is fine
    sok.load("sub", [v])


def test_a_dump_never_replaces_a_previous_dump_holding_what_is_not_its_own(tmp_path):
    """A previous dump is replaced whole: a table sok.Saver dumped into its
    directory (the Saver refuses that now, but earlier versions did it) and
    a user's file there were deleted without a word by the next dump."""
    a = sok.Variable(np.ones((3, 2), np.float32), name="a")
    b = sok.Variable(np.full((3, 2), 2.0, np.float32), name="b")
    path = str(tmp_path / "ckpt")
    sok.dump(path, [a])
    sok.Saver().dump_to_file(b, str(tmp_path / "saver"))
    shutil.copytree(str(tmp_path / "saver" / "b"), os.path.join(path, "b"))
    (tmp_path / "ckpt" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=r"is a sok_graph dump that also holds \['b', "
                                              r"'notes.txt'\], which are not the dump's"):
        sok.dump(path, [a])
    assert (tmp_path / "ckpt" / "notes.txt").read_text() == "mine"
    b.assign(np.zeros((3, 2), np.float32))
    sok.Saver().restore_from_file(b, path)
    np.testing.assert_array_equal(b.numpy(), np.full((3, 2), 2.0, np.float32))
    sok.load(path, [a])  # the dump itself is as it was
    np.testing.assert_array_equal(a.numpy(), np.ones((3, 2), np.float32))
    # Without them, the dump is replaced as before.
    os.remove(tmp_path / "ckpt" / "notes.txt")
    shutil.rmtree(tmp_path / "ckpt" / "b")
    a.assign(np.full((3, 2), 5.0, np.float32))
    sok.dump(path, [a])
    a.assign(np.zeros((3, 2), np.float32))
    sok.load(path, [a])
    np.testing.assert_array_equal(a.numpy(), np.full((3, 2), 5.0, np.float32))


@pytest.mark.parametrize("dtype", [np.int32, np.int64, bool])
def test_tables_of_rows_that_are_not_floats_are_refused(tmp_path, dtype):
    """A sok.Variable of int32 rows was dumped as float32 (16777217 came
    back 16777216) and a float dump loaded into it by truncation (0.5 became
    0, 1e10 became -2^31, a bool table all True), through sok.load, the
    Saver and load_embedding_values alike."""
    rows = np.array([[0.5, 1e10], [2.7, -3.9]], np.float32)
    a = sok.Variable(rows, name="a")
    path = str(tmp_path / "d")
    sok.dump(path, [a])
    other = sok.Variable(np.array([[0, 16777217], [1, 2]]).astype(dtype), name="a")
    before = other.numpy().copy()
    pattern = f"variable 'a' has {np.dtype(dtype).name} rows; sok.dump, sok.load and the Saver"
    with pytest.raises(TypeError, match="load_vars: " + pattern):
        sok.load(path, [other])
    with pytest.raises(TypeError, match="dump_vars: " + pattern):
        sok.dump(str(tmp_path / "e"), [other])
    saver = sok.Saver()
    saver.dump_to_file(a, str(tmp_path / "s"))
    with pytest.raises(TypeError, match="Saver.restore_from_file: " + pattern):
        saver.restore_from_file(other, str(tmp_path / "s"))
    with pytest.raises(TypeError, match="Saver.dump_to_file: " + pattern):
        saver.dump_to_file(other, str(tmp_path / "s2"))
    with pytest.raises(TypeError, match="Saver.load_embedding_values: " + pattern):
        saver.load_embedding_values(other, rows)
    np.testing.assert_array_equal(other.numpy(), before)
    assert not os.path.exists(tmp_path / "e") and not os.path.exists(tmp_path / "s2")


def test_dump_replaces_a_previous_dump_and_fills_an_empty_directory(tmp_path):
    v = sok.Variable(np.ones((3, 2), np.float32), name="v")
    (tmp_path / "empty").mkdir()
    sok.dump(str(tmp_path / "empty"), [v])
    v.assign(np.full((3, 2), 2.0, np.float32))
    sok.dump(str(tmp_path / "empty"), [v])  # over the previous dump
    v.assign(np.zeros((3, 2), np.float32))
    sok.load(str(tmp_path / "empty"), [v])
    np.testing.assert_array_equal(v.numpy(), np.full((3, 2), 2.0, np.float32))


def test_a_path_through_a_symlinked_directory_and_dotdot_is_the_file_systems(tmp_path):
    """"link/../x", link a symbolic link to real/deep/sub, is real/deep/x to
    the file system; os.path.abspath read it as ./x, so a dump there
    replaced another model's dump at ./x, and a load read it. Paths named
    like the copies a dump keeps beside itself while writing
    ("m.tmp-<pid>-<id>", "m.old-<time>-<id>") are refused: the next dump to
    "m" deleted them as its own leftovers."""
    (tmp_path / "real" / "deep" / "sub").mkdir(parents=True)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "real" / "deep" / "sub")
    other = sok.Variable(np.full((3, 2), 7.0, np.float32), name="v")
    sok.dump(str(tmp_path / "x"), [other])  # another model's dump at ./x
    v = sok.Variable(np.full((3, 2), 1.0, np.float32), name="v")
    sok.dump(str(link) + "/../x", [v])
    assert os.path.exists(tmp_path / "real" / "deep" / "x" / "manifest.json")
    target = sok.Variable(np.zeros((3, 2), np.float32), name="v")
    sok.load(str(tmp_path / "x"), [target])
    np.testing.assert_array_equal(target.numpy(), np.full((3, 2), 7.0))  # untouched
    sok.load(str(link) + "/../x", [target])
    np.testing.assert_array_equal(target.numpy(), np.full((3, 2), 1.0))
    for name in ("m.tmp-999999-abcdef01", "m.old-00000000000000000001-abcdef01"):
        with pytest.raises(ValueError, match="ends like the copies sok_graph keeps"):
            sok.dump(str(tmp_path / name), [v])
        assert not os.path.exists(tmp_path / name)


def test_a_dump_touches_no_sibling_but_its_own(tmp_path):
    """Directories next to a dump path whose names only start like a dump's
    own temporary and moved-aside ones (a user's `model.old-notes`, another
    dump at `model.old-v1`) are neither deleted by a dump nor loaded in
    place of a missing one."""
    v = sok.Variable(np.ones((3, 2), np.float32), name="v")
    sok.dump(str(tmp_path / "model.old-v1"), [v])  # a dump of its own
    notes = tmp_path / "model.old-notes"
    notes.mkdir()
    (notes / "readme.txt").write_text("mine")
    mine = tmp_path / "model.tmp-999999-mine"
    mine.mkdir()
    sok.dump(str(tmp_path / "model"), [v])
    assert (notes / "readme.txt").read_text() == "mine"
    assert (tmp_path / "model.old-v1" / "manifest.json").exists() and mine.exists()
    sok.dump(str(tmp_path / "m2.old-x"), [v])
    with pytest.raises(CheckpointError, match="no sok_graph dump"):
        sok.load(str(tmp_path / "m2"), [v])  # m2.old-x is a dump of its own


def test_an_older_dump_moved_aside_stands_in_only_where_no_dump_is_in_place(tmp_path):
    """A writer killed between its two renames leaves the previous dump
    moved aside and nothing at `path` (or the empty directory a job makes
    before it loads): a load reads the one moved aside. A `path` holding a
    dump whose manifest.json is gone (a copy cut short before it, a file
    deleted) is no such case: the older dump moved aside was loaded in its
    place without a word; it is a CheckpointError, the table unchanged."""
    path = str(tmp_path / "m")
    older = np.full((3, 2), 1.0, np.float32)
    sok.dump(path, [sok.Variable(older, name="v")])
    # What a writer killed between the renames of its swap leaves.
    os.rename(path, path + ".old-00000000000000000001-abcdef01")
    target = sok.Variable(np.zeros((3, 2), np.float32), name="v")
    sok.load(path, [target])
    np.testing.assert_array_equal(target.numpy(), older)
    os.mkdir(path)
    target.assign(np.zeros((3, 2), np.float32))
    sok.load(path, [target])
    np.testing.assert_array_equal(target.numpy(), older)
    os.rmdir(path)
    # A newer dump at `path` that lost its manifest.
    newer = np.full((3, 2), 2.0, np.float32)
    sok.dump(str(tmp_path / "new"), [sok.Variable(newer, name="v")])
    shutil.copytree(str(tmp_path / "new"), path)
    os.remove(os.path.join(path, "manifest.json"))
    sentinel = np.full((3, 2), -1.0, np.float32)
    target.assign(sentinel)
    with pytest.raises(CheckpointError, match=r"no sok_graph dump at .*m \(no manifest.json; "
                                              r"it holds \['v.keys', 'v.values'\]\)"):
        sok.load(path, [target])
    np.testing.assert_array_equal(target.numpy(), sentinel)
    # The one moved aside still loads by its own path.
    sok.load(path + ".old-00000000000000000001-abcdef01", [target])
    np.testing.assert_array_equal(target.numpy(), older)


def test_load_into_tables_of_another_shape_changes_nothing(tmp_path):
    """A dump loaded into tables of another shape: a static table of more or
    fewer rows or another dimension, a dynamic dump's keys into a static
    table, one table of several that does not fit. Each is a CheckpointError
    naming the variable and both shapes, raised before any table changes;
    a static table's dump loads into a dynamic table of its dimension (keys
    0..rows-1)."""
    whole = np.arange(8, dtype=np.float32).reshape(4, 2)
    static = sok.Variable(whole, name="s")
    dyn = sok.DynamicVariable(2, name="d")
    sok.assign(dyn, tf.constant([10, 20], tf.int64), np.array([[1, 2], [3, 4]], np.float32))
    path = str(tmp_path / "dump")
    sok.dump(path, [static, dyn])

    sentinel = np.full((4, 2), -1.0, np.float32)
    untouched = sok.Variable(sentinel, name="s")
    for targets, words in (
            ([sok.Variable(np.zeros((5, 2), np.float32), name="s")],
             r"'s' has 5 rows; the dump holds 4 rows: load it into a table of 4 rows"),
            ([sok.Variable(np.zeros((3, 2), np.float32), name="s")],
             r"'s' has 3 rows; the dump holds 4 rows"),
            ([sok.Variable(np.zeros((4, 3), np.float32), name="s")],
             r"'s' was dumped with dimension 2; it has dimension 3"),
            ([sok.Variable(np.zeros((2, 2), np.float32), name="d")],
             r"'d' is a static table of 2 rows, whose keys are its row numbers 0..1; the dump "
             r"holds key 10 where row 0 belongs"),
            ([untouched, sok.DynamicVariable(3, name="d")],
             r"'d' was dumped with dimension 2; it has dimension 3")):
        before = [sok.export(t)[1].numpy() for t in targets]
        with pytest.raises(CheckpointError, match=words):
            sok.load(path, targets)
        for t, rows in zip(targets, before):
            np.testing.assert_array_equal(sok.export(t)[1].numpy(), rows)
    np.testing.assert_array_equal(untouched.numpy(), sentinel)

    as_dynamic = sok.DynamicVariable(2, name="s")
    sok.load(path, [as_dynamic])
    keys, rows = sok.export(as_dynamic)
    order = np.argsort(keys.numpy())
    np.testing.assert_array_equal(keys.numpy()[order], np.arange(4))
    np.testing.assert_array_equal(rows.numpy()[order], whole)


def test_a_dynamic_tables_dump_of_keys_0_to_n_loads_into_a_static_table_by_key(tmp_path):
    """A dynamic table's dump of keys 0..rows-1 loads into a static table of
    that many rows, row k from key k, whatever order the dump holds them in:
    sok.dump sorts by key, but sok.Saver writes the table's own order (the
    GPU's hash order, the CPU's insertion order), and a static table restored
    from such a dump was refused as "a dynamic table's dump" (on a GPU even
    for keys inserted in order)."""
    sok.init(comm_tool="none")
    rng = np.random.default_rng(3)
    keys = rng.permutation(1000).astype(np.int64)
    rows = rng.standard_normal((1000, 3)).astype(np.float32)
    dyn = sok.DynamicVariable(3, name="s")
    sok.assign(dyn, tf.constant(keys), rows)
    exported = sok.export(dyn)[0].numpy()
    assert not np.array_equal(exported, np.sort(exported))  # the dump is out of key order
    path = str(tmp_path / "dump")
    sok.dump(path, [dyn])
    static = sok.Variable(np.zeros((1000, 3), np.float32), name="s")
    sok.load(path, [static])
    want = np.empty_like(rows)
    want[keys] = rows
    np.testing.assert_array_equal(static.numpy(), want)
    # Keys that are not 0..rows-1 are still refused, naming the first misfit.
    sok.assign(dyn, tf.constant([1000], tf.int64), np.ones((1, 3), np.float32))
    sok.dump(path, [dyn])
    with pytest.raises(CheckpointError, match=r"'s' has 1000 rows; the dump holds 1001 rows"):
        sok.load(path, [static])
    np.testing.assert_array_equal(static.numpy(), want)

    # sok.Saver writes a table's rows in the table's order, not sorted.
    import gc
    other = sok.DynamicVariable(3, name="v")
    sok.assign(other, tf.constant(keys), rows)
    sok.Saver().dump_to_file(other, str(tmp_path / "saver"))
    del other
    gc.collect()  # its namesake below may take its rows once it is gone
    static = sok.Variable(np.zeros((1000, 3), np.float32), name="v")
    sok.Saver().restore_from_file(static, str(tmp_path / "saver"))
    np.testing.assert_array_equal(static.numpy(), want)


def _without_dtypes(path):
    """Makes the dump at `path` read as one written before rows kept their
    dtype: no "dtype" / "dtypes" in its manifest (float32 files are the same
    bytes as then)."""
    from sok_graph import dump_load

    manifest_path = os.path.join(path, "manifest.json")
    with open(manifest_path) as f:
        manifest = json.load(f)
    for entry in manifest["variables"].values():
        assert set(entry.pop("dtypes", {}).values()) <= {"float32"}
        assert entry.pop("dtype", "float32") == "float32"
    del manifest["checksum"]
    manifest["checksum"] = dump_load._manifest_checksum(manifest)
    with open(manifest_path, "w") as f:
        json.dump(manifest, f)


@pytest.mark.parametrize("dtype", ["float64", "float16", "bfloat16"])
def test_rows_keep_the_tables_dtype_through_dump_and_load(tmp_path, dtype):
    """A table's rows are dumped in its own dtype (the manifest says which)
    and come back bit for bit, through sok.dump / sok.load and sok.Saver; a
    float64 table's rows used to be dumped as float32 (1 + 1e-12 came back
    as 1.0, 1e300 as inf, 5e-324 as 0). Loaded into a float32 table they
    are numpy's float32 of the same values."""
    tf_dtype = tf.as_dtype(dtype)
    rng = np.random.default_rng(3)
    wide = rng.normal(size=(5, 3)) * 100
    if dtype == "float64":
        wide[0, 0], wide[1, 1], wide[2, 2], wide[3, 0] = 1 + 1e-12, 1e300, 5e-324, np.pi
    values = wide.astype(tf_dtype.as_numpy_dtype)
    table = sok.Variable(values, name="t", dtype=tf_dtype)
    path = str(tmp_path / "d")
    sok.dump(path, [table])
    target = sok.Variable(np.zeros((5, 3)), name="t", dtype=tf_dtype)
    sok.load(path, [target])
    assert target.numpy().dtype == values.dtype
    assert target.numpy().tobytes() == values.tobytes()
    with open(os.path.join(path, "manifest.json")) as f:
        entry = json.load(f)["variables"]["t"]
    assert entry["dtype"] == dtype and entry["dtypes"] == {"values": dtype}

    saver = sok.Saver()
    saver.dump_to_file(table, str(tmp_path / "saver"))
    restored = sok.Variable(np.zeros((5, 3)), name="t", dtype=tf_dtype)
    saver.restore_from_file(restored, str(tmp_path / "saver"))
    assert restored.numpy().tobytes() == values.tobytes()

    if dtype != "float64":  # (1e300 has no float32: the next test)
        narrow = sok.Variable(np.zeros((5, 3), np.float32), name="t")
        sok.load(path, [narrow])
        np.testing.assert_array_equal(narrow.numpy(), values.astype(np.float32))


def test_dumps_from_before_rows_kept_their_dtype_still_load(tmp_path):
    """A dump written before (float32 files, dtype code 1, no dtype in the
    manifest) loads into float32, float64 and float16 tables, as numpy
    converts its rows; float32 files are what they were, byte for byte."""
    import struct

    values = np.array([[0.1, -2.5], [1e-3, 65000.0]], np.float32)
    path = str(tmp_path / "d")
    sok.dump(path, [sok.Variable(values, name="t")])
    with open(os.path.join(path, "t.values"), "rb") as f:
        magic, version, code = struct.unpack("<8sII", f.read(16))
    assert (magic, version, code) == (b"SOKGDUMP", 1, 1)
    _without_dtypes(path)
    for dtype in (np.float32, np.float64, np.float16):
        target = sok.Variable(np.zeros((2, 2), dtype), name="t")
        sok.load(path, [target])
        np.testing.assert_array_equal(target.numpy(), values.astype(dtype))


def test_a_file_of_an_unknown_dtype_code_is_refused(tmp_path):
    """A dump file whose header gives a dtype code this sok_graph does not
    know is refused, whatever dtype the manifest promised: one promised as
    float64 used to load (numpy compares None equal to float64), its bytes
    read as float64 rows."""
    import struct

    values = np.array([[0.5, -1.0], [2.0, 3.0]])
    path = str(tmp_path / "d")
    sok.dump(path, [sok.Variable(values, name="t", dtype=tf.float64)])
    with open(os.path.join(path, "t.values"), "r+b") as f:
        magic, version, code = struct.unpack("<8sII", f.read(16))
        assert (magic, code) == (b"SOKGDUMP", 3)
        f.seek(12)
        f.write(struct.pack("<I", 9))  # the payload and its checksums stay
    target = sok.Variable(np.zeros((2, 2)), name="t", dtype=tf.float64)
    with pytest.raises(CheckpointError, match=r"t\.values holds 2x2 of dtype code 9; the "
                                              r"manifest says 2x2 float64"):
        sok.load(path, [target])
    np.testing.assert_array_equal(target.numpy(), np.zeros((2, 2)))


def test_a_value_beyond_the_loading_tables_dtype_is_refused(tmp_path):
    """Rows loaded into a table of a narrower dtype are rounded as numpy
    rounds them; a finite value that would become infinite there (float64
    1e300 in a float32 table, float32 70000 in a float16 one) is a
    CheckpointError naming the variable, the value, where it is and the
    table's dtype, raised before any table of the call changes (the table
    used to take inf, with only numpy's warning). sok.Saver the same."""
    dyn = sok.DynamicVariable(2, name="dyn")
    sok.assign(dyn, tf.constant([4, 9], tf.int64), np.array([[1, 2], [3, 4]], np.float32))
    wide = sok.Variable(np.array([[0.1, 1e300], [-2.5, 1e30]]), name="wide", dtype=tf.float64)
    path = str(tmp_path / "d")
    sok.dump(path, [dyn, wide])
    sok.assign(dyn, tf.constant([4], tf.int64), np.full((1, 2), 7.0, np.float32))

    def dyn_rows():
        keys, rows = sok.export(dyn)
        return {int(k): r.tolist() for k, r in zip(keys.numpy(), rows.numpy())}

    before = dyn_rows()
    assert before == {4: [7.0, 7.0], 9: [3.0, 4.0]}
    sentinel = np.full((2, 2), -1.0, np.float32)
    narrow = sok.Variable(sentinel, name="wide")
    with pytest.raises(CheckpointError, match=r"variable 'wide' has dtype float32; the dump at "
                                              + re.escape(path) + r" holds "
                                              r"the float64 value 1e\+300 in row 0, column 1, "
                                              r"beyond float32's largest finite value .*become "
                                              r"inf; load it into a table of dtype float64"):
        sok.load(path, [dyn, narrow])
    np.testing.assert_array_equal(narrow.numpy(), sentinel)
    assert dyn_rows() == before  # the dynamic table, replaced first, was not

    half = sok.Variable(np.full((2, 2), -1.0, np.float16), name="h")
    sok.dump(str(tmp_path / "h"), [sok.Variable(np.array([[1, 2], [-7e4, 3]], np.float32),
                                                name="h")])
    with pytest.raises(CheckpointError, match=r"'h' has dtype float16; .*float32 value "
                                              r"-70000\.0 in row 1, column 0.*65504.*-inf"):
        sok.load(str(tmp_path / "h"), [half])
    np.testing.assert_array_equal(half.numpy(), np.full((2, 2), -1.0, np.float16))

    # Rounding (finite to finite) loads: numpy's rounding of the same values.
    rounded = np.array([[0.1, 1e-300], [-2.5, 1e30]])
    wide.assign(rounded)
    sok.dump(path, [wide])
    sok.load(path, [narrow])
    np.testing.assert_array_equal(narrow.numpy(), rounded.astype(np.float32))
    assert narrow.numpy()[0, 1] == 0.0 and float(narrow.numpy()[0, 0]) != 0.1

    saver = sok.Saver()
    wide.assign(np.array([[0.1, 1e300], [-2.5, 1e30]]))
    saver.dump_to_file(wide, str(tmp_path / "saver"))
    narrow.assign(sentinel)
    with pytest.raises(CheckpointError, match=r"has dtype float32; the dump holds the float64 "
                                              r"value 1e\+300 in row 0, column 1"):
        saver.restore_from_file(narrow, str(tmp_path / "saver"))
    np.testing.assert_array_equal(narrow.numpy(), sentinel)


def test_load_refusals_name_the_dump_they_read(tmp_path):
    """Each refusal of a dump that does not fit the tables given to
    sok.load names the dump's directory (and a damaged file its path): with
    several dumps about, "variable 's' was dumped with dimension 2" did not
    say which one."""
    path = str(tmp_path / "run-7")
    static = sok.Variable(np.zeros((4, 2), np.float32), name="s")
    dyn = sok.DynamicVariable(2, name="d", key_type=tf.int64)
    sok.assign(dyn, tf.constant([2 ** 32 + 5], tf.int64), np.ones((1, 2), np.float32))
    sok.dump(path, [static, dyn])
    at = "the dump at " + path
    for targets, words in (
            ([sok.Variable(np.zeros((4, 3), np.float32), name="s")],
             at + ": variable 's' was dumped with dimension 2; it has dimension 3"),
            ([sok.Variable(np.zeros((5, 2), np.float32), name="s")],
             at + ": variable 's' has 5 rows; the dump holds 4 rows"),
            ([sok.Variable(np.zeros((1, 2), np.float32), name="d")],
             at + ": variable 'd' is a static table of 1 rows"),
            ([sok.DynamicVariable(2, name="x")], at + " has no variable 'x'"),
            ([sok.DynamicVariable(2, name="d", key_type=tf.int32)],
             "variable 'd' has int32 keys (key_type); " + at + " holds key 4294967301")):
        with pytest.raises(CheckpointError, match=re.escape(words)):
            sok.load(path, targets)
    with pytest.raises(CheckpointError, match=re.escape(at + " holds no optimizer state")):
        sok.load(path, [static], sok.OptimizerWrapper(tf.keras.optimizers.Adagrad()))
    with open(os.path.join(path, "manifest.json")) as f:
        values = json.load(f)["variables"]["s"]["files"]["values"]
    with open(os.path.join(path, values), "r+b") as f:
        f.truncate(10)
    with pytest.raises(CheckpointError, match=re.escape(os.path.join(path, values)
                                                        + " is truncated")):
        sok.load(path, [static])


def test_a_suffixed_name_too_long_is_refused_before_any_table_is_read(tmp_path, monkeypatch):
    """Names that clean up to one file stem ("a/b", "a_b") get a suffix
    ("-1") in the dump; the check every worker makes before reading its
    tables must count it, or a name one byte short of the limit passed there
    and was refused only by the worker that writes the files, while the
    others waited for it at the dump's barrier."""
    limit = os.pathconf(str(tmp_path), "PC_NAME_MAX")
    stem = "s" * (limit - 8)  # "<stem>.values" fits; "<stem>-1.values" does not
    first = sok.Variable(np.ones((2, 2), np.float32), name=stem[:-2] + "/x")
    second = sok.Variable(np.ones((2, 2), np.float32), name=stem[:-2] + "_x")
    read = []
    real_export = dump_load._export
    monkeypatch.setattr(dump_load, "_export",
                        lambda *a, **k: read.append(1) or real_export(*a, **k))
    with pytest.raises(ValueError, match=r"-1\.values"):
        sok.dump(str(tmp_path / "d"), [first, second])
    assert read == [] and os.listdir(tmp_path) == []


def test_periodic_dumps_in_a_session_do_not_grow_its_graph(tmp_path):
    """A TF1 job that dumps (and reads increments) every N steps: each
    sok.dump added ~110 ops to the Session's graph and each
    incremental_model_dump its own, without bound. The ops are built once
    per graph, and each dump still holds the rows of its moment."""
    with tf.Graph().as_default() as graph:
        sok.init(comm_tool="none")
        v = sok.DynamicVariable(2, initializer="zeros", name="t")
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        opt = sok.OptimizerWrapper(tf.compat.v1.train.AdagradOptimizer(0.5))
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(v.sparse_read(ids))
        train = opt.apply_gradients([(tape.gradient(loss, v), v)])
        path = str(tmp_path / "ckpt")
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            ops, dumped = [], []
            for step in range(3):
                sess.run(train, {ids: [step, step + 1]})
                sok.dump(path, [v], opt)
                keys, _ = sok.incremental_model_dump([v], 0, sess)
                ops.append(len(graph.get_operations()))
                with open(os.path.join(path, "manifest.json")) as f:
                    rows = json.load(f)["variables"]["t"]["rows"]
                dumped.append((sorted(keys[0].tolist()), rows))
    assert ops[1] == ops[0] and ops[2] == ops[0], ops
    assert dumped == [([0, 1], 2), ([0, 1, 2], 3), ([0, 1, 2, 3], 4)]


def test_a_graphs_tables_dump_load_and_delta_under_the_default_session_alone(tmp_path):
    """TF 2.x runs eagerly under `with sess.as_default():` when the graph
    is not entered too: sok.dump, sok.load and incremental_model_dump (with
    or without sess=) of that graph's tables took the eager path and failed
    with TensorFlow's "<tf.Tensor ...> is out of scope", naming neither the
    table nor the Session. They run in the Session now, as with the graph
    entered; the rows are compared with the ones the Session reads."""
    graph = tf.Graph()
    with graph.as_default():
        sok.init(comm_tool="none")
        v = sok.DynamicVariable(2, initializer="ones", name="s")
        read = v.sparse_read(tf.constant([1, 2], tf.int64))
        change = sok.assign(v, tf.constant([1], tf.int64), tf.constant([[5.0, 6.0]]))
        init = tf.compat.v1.global_variables_initializer()
    path = str(tmp_path / "d")
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(init)
        sess.run(read)
        with sess.as_default():
            sok.dump(path, [v])
            sess.run(change)
            assert sess.run(read).tolist() == [[5.0, 6.0], [1.0, 1.0]]
            sok.load(path, [v])
            for kwargs in ({}, {"sess": sess}):
                keys, rows = sok.incremental_model_dump([v], 0, **kwargs)
                got = dict(zip(keys[0].tolist(), rows[0].tolist()))
                assert got == {1: [1.0, 1.0], 2: [1.0, 1.0]}
        assert sess.run(read).tolist() == [[1.0, 1.0], [1.0, 1.0]]
    with pytest.raises(RuntimeError, match=r"call inside `with sess.as_default\(\):`"):
        sok.dump(str(tmp_path / "e"), [v])  # no Session is the default
    assert not os.path.exists(tmp_path / "e")


def test_a_delta_threshold_in_seconds_or_nanoseconds_is_named(tmp_path):
    """incremental_model_dump takes microseconds (or a datetime): a threshold
    of time.time_ns() gave an empty delta every time and one of time.time()
    every row, without a word. Both are ValueErrors naming time_threshold
    and the unit; microseconds, 0 and the int64 bound ("after everything")
    still give their deltas."""
    sok.init(comm_tool="none")
    v = sok.DynamicVariable(2, name="when")
    before = time.time() * 1e6
    v.sparse_read(tf.constant([1, 2], tf.int64))
    with pytest.raises(ValueError, match=r"time_threshold=\d+ is a time of these decades in "
                                         r"nanoseconds .*time.time_ns\(\)"):
        sok.incremental_model_dump([v], time.time_ns())
    with pytest.raises(ValueError, match=r"time_threshold=[\d.]+ is a time of these decades in "
                                         r"seconds .*time.time\(\)"):
        sok.incremental_model_dump([v], time.time())
    assert sorted(sok.incremental_model_dump([v], before - 1e6)[0][0].tolist()) == [1, 2]
    assert sorted(sok.incremental_model_dump([v], 0)[0][0].tolist()) == [1, 2]
    assert sok.incremental_model_dump([v], 2 ** 63 - 1)[0][0].tolist() == []


def test_a_full_file_system_is_named_and_the_previous_dump_stays(tmp_path, monkeypatch):
    """A dump that runs out of room (ENOSPC, simulated at its second file)
    raises an OSError that names the dump, says why a dump needs room for
    two copies and that the previous one is unchanged (a bare "No space
    left on device" named none of it); that dump still loads, and no
    temporary directory is left."""
    import errno

    from sok_graph import dump_load

    sok.init(comm_tool="none")
    path = str(tmp_path / "ckpt")
    v = sok.DynamicVariable(2, initializer="ones", name="t")
    v.sparse_read(tf.constant([1, 2], tf.int64))
    sok.dump(path, [v])
    v.sparse_read(tf.constant([3], tf.int64))
    written = []
    real = dump_load._write_array

    def fill_up(fname, array):
        written.append(fname)
        if len(written) == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), fname)
        return real(fname, array)

    monkeypatch.setattr(dump_load, "_write_array", fill_up)
    with pytest.raises(OSError, match=re.escape(f"sok.dump to {path!r}: the file system is "
                                                f"full") + ".*room for both; the previous one "
                                                "at .* is unchanged") as info:
        sok.dump(path, [v])
    assert info.value.errno == errno.ENOSPC
    monkeypatch.setattr(dump_load, "_write_array", real)
    fresh = sok.DynamicVariable(2, initializer="zeros", name="t")
    sok.load(path, [fresh])
    assert sorted(fresh.export()[0].numpy().tolist()) == [1, 2]
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_a_mount_point_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    """A dump path that is a mount point (a container's volume) cannot be
    renamed aside: the whole dump was written on the parent's file system
    before a bare "Device or resource busy". It is refused first, with the
    way out."""
    sok.init(comm_tool="none")
    path = str(tmp_path / "volume")
    os.makedirs(path)
    real = os.path.ismount
    monkeypatch.setattr(os.path, "ismount", lambda p: p == path or real(p))
    v = sok.DynamicVariable(2, initializer="ones", name="t")
    v.sparse_read(tf.constant([1], tf.int64))
    with pytest.raises(ValueError, match=re.escape(f"{path!r} is a mount point") + ".*inside "
                                         "it, e.g. " + re.escape(repr(os.path.join(path,
                                                                                   "dump")))):
        sok.dump(path, [v])
    assert sorted(os.listdir(tmp_path)) == ["volume"] and os.listdir(path) == []
    sok.dump(os.path.join(path, "dump"), [v])


def test_a_name_too_long_for_a_file_name_is_refused_before_anything_is_written(tmp_path):
    """A variable whose name makes a file name longer than the file system
    takes (255 bytes here) made sok.dump and the Saver fail with a bare
    OSError ("File name too long"), the Saver after making its directory.
    A ValueError now, naming the variable, its name's length and the
    limit, before anything is written; the longest names that fit dump and
    load (a dynamic table's longest file is its .frequencies, a Saver's
    directory gets a 34-byte suffix beside it)."""
    limit = os.pathconf(str(tmp_path), "PC_NAME_MAX")
    static = sok.Variable(np.ones((2, 2), np.float32), name="s" * (limit - 6))
    with pytest.raises(ValueError, match=rf"variable 's+\.\.\.s+': its name is {limit - 6} "
                                         rf"bytes long, which makes the dump file 's+\.\.\.s+\."
                                         rf"values' {limit + 1} bytes long; the file system "
                                         rf"takes file names of at most {limit} bytes: give the "
                                         rf"variable a name of at most {limit - 7} bytes"):
        sok.dump(str(tmp_path / "d"), [sok.Variable(np.ones((1, 2), np.float32), name="ok"),
                                       static])
    dyn = sok.DynamicVariable(2, name="k" * (limit - 11))
    dyn.sparse_read(tf.constant([1, 2], tf.int64))
    with pytest.raises(ValueError, match=rf"its name is {limit - 11} bytes long.*"
                                         rf"\.frequencies' {limit + 1} bytes long"):
        sok.dump(str(tmp_path / "d"), [dyn])
    saver = sok.Saver()
    with pytest.raises(ValueError, match=rf"its name is {limit - 6} bytes long, which makes the "
                                         rf"Saver's directory .* {limit + 28} bytes long.*at "
                                         rf"most {limit - 34} bytes"):
        saver.dump_to_file(static, str(tmp_path / "saver"))
    with pytest.raises(ValueError, match=rf"path=.*{limit - 20} bytes long; a dump directory's "
                                         rf"name may have at most {limit - 34} bytes"):
        sok.dump(str(tmp_path / ("p" * (limit - 20))), [dyn])
    assert os.listdir(tmp_path) == []

    fits = sok.DynamicVariable(2, initializer=3.0, name="k" * (limit - 12))
    fits.sparse_read(tf.constant([1, 2], tf.int64))
    sok.dump(str(tmp_path / "d"), [fits])
    again = sok.DynamicVariable(2, name="k" * (limit - 12))
    sok.load(str(tmp_path / "d"), [again])
    assert sorted(again.export()[0].numpy().tolist()) == [1, 2]
    fits_saver = sok.Variable(np.full((2, 2), 5.0, np.float32), name="s" * (limit - 34))
    saver.dump_to_file(fits_saver, str(tmp_path / "saver"))
    back = sok.Variable(np.zeros((2, 2), np.float32), name="s" * (limit - 34))
    saver.restore_from_file(back, str(tmp_path / "saver"))
    np.testing.assert_array_equal(back.numpy(), np.full((2, 2), 5.0))


def test_dumps_and_loads_go_on_where_the_directory_cannot_be_locked(tmp_path, monkeypatch):
    """A file system without locks (NFS mounted nolock: flock fails with
    ENOLCK) dumped and loaded before dumps took turns; it still does. A load
    of no dump there says so, without an OSError chained to it."""
    import errno
    import fcntl

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    v = sok.Variable(np.arange(8, dtype=np.float32).reshape(4, 2), name="unlocked")
    path = str(tmp_path / "dump")
    sok.dump(path, [v])
    v.assign(tf.zeros([4, 2]))
    sok.load(path, [v])
    np.testing.assert_array_equal(v.numpy(), np.arange(8, dtype=np.float32).reshape(4, 2))
    with pytest.raises(CheckpointError, match="no sok_graph dump") as missing:
        sok.load(str(tmp_path / "nowhere" / "dump"), [v])
    assert missing.value.__context__ is None


def test_a_graph_mode_load_feeds_the_rows_instead_of_growing_the_graph(tmp_path):
    """In a Session, sok.load made the dump's arrays constants of the graph:
    each load grew the graph by the tables' size (rows, slots), and a table
    of 2 GB or more could not be loaded at all (TensorFlow's tensor protos
    stop there). They are fed now; the rows still arrive bit for bit."""
    sok.init(comm_tool="none")
    rng = np.random.default_rng(3)
    rows, dim = 100000, 8
    graph = tf.Graph()
    with graph.as_default():
        static = sok.Variable(rng.random((rows, dim), dtype=np.float32), name="fed_static")
        dynamic = sok.DynamicVariable(dim, name="fed_dynamic", initializer="ones")
        opt = sok.OptimizerWrapper(tf.compat.v1.train.AdamOptimizer(0.1))
        ids = tf.RaggedTensor.from_row_lengths(tf.range(0, rows, 2, dtype=tf.int64), [rows // 2])
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(sok.lookup_sparse([static, dynamic], [ids, ids],
                                                   combiners=["sum", "sum"])[0] ** 2)
        train = opt.apply_gradients(zip(tape.gradient(loss, [static, dynamic]),
                                        [static, dynamic]))
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train)
            path = str(tmp_path / "dump")
            sok.dump(path, [static, dynamic], opt)
            want_rows = sess.run(static)
            want_keys, want_values = sess.run(sok.export(dynamic))
            sess.run(train)
            before = graph.as_graph_def().ByteSize()
            sok.load(path, [static, dynamic], opt)
            grown = graph.as_graph_def().ByteSize() - before
            np.testing.assert_array_equal(sess.run(static), want_rows)
            keys, values = sess.run(sok.export(dynamic))
            np.testing.assert_array_equal(keys[np.argsort(keys)], np.sort(want_keys))
            np.testing.assert_array_equal(values[np.argsort(keys)],
                                          want_values[np.argsort(want_keys)])
    # The static table's rows alone are 3.2 MB (its slots as much again).
    assert grown < rows * dim * 4 // 2, grown


def _keys_of(table):
    return sorted(np.asarray(sok.export(table)[0]).tolist())


@pytest.mark.skipif(not tf.executing_eagerly(), reason="eager training (TF2)")
@pytest.mark.parametrize("route", ["checkpoint", "sok_load", "saver", "remove"])
def test_a_restore_that_drops_keys_drops_their_optimizer_state(tmp_path, route):
    """Restoring a dynamic table to a dump taken before key 5 existed left
    key 5's Adam moments in the slots, so the key came back with them
    instead of afresh (remove() drops them: the reference route). After
    every route the slots hold exactly the table's keys, the restored key's
    state is the dump's, and key 5's next step is the fresh key's step."""
    sok.init()
    table = sok.DynamicVariable(2, initializer=0.0, name="emb")
    opt = sok.OptimizerWrapper(tf.keras.optimizers.Adam(0.1))

    def step(keys):
        with tf.GradientTape() as tape:
            ids = tf.RaggedTensor.from_row_lengths(tf.constant(keys, tf.int64), [len(keys)])
            out = sok.lookup_sparse([table], [ids], combiners=["sum"])[0]
            loss = tf.reduce_sum(out * tf.constant([1.0, -1.0]))
        opt.apply_gradients(zip(tape.gradient(loss, [table]), [table]))

    step([1])
    slots = [opt.get_slot(table, name) for name in ("m", "v")]
    dumped = [np.asarray(s.find(tf.constant([1], tf.int64))[0]) for s in slots]
    checkpoint = tf.train.Checkpoint(table=table)
    saved = checkpoint.save(str(tmp_path / "ckpt"))
    sok.dump(str(tmp_path / "dump"), [table])
    saver = sok.Saver()
    saver.dump_to_file(table, str(tmp_path / "saver"))
    for _ in range(3):
        step([1, 5])
    if route == "checkpoint":
        checkpoint.restore(saved)
    elif route == "sok_load":
        sok.load(str(tmp_path / "dump"), [table])
    elif route == "saver":
        saver.restore_from_file(table, str(tmp_path / "saver"))
    else:
        table.remove(tf.constant([5], tf.int64))
    assert _keys_of(table) == [1]
    for slot, before in zip(slots, dumped):
        assert _keys_of(slot) == [1], route
        if route == "remove":
            continue
        # slots not in the dump (no optimizer given) keep key 1's newer state
        assert not np.array_equal(np.asarray(slot.find(tf.constant([1], tf.int64))[0]), before)
    # key 5 comes back with zero moments: after one step they are
    # (1 - beta) times the gradient [1, -1] and its square
    step([5])
    row = np.asarray(table.find(tf.constant([5], tf.int64))[0])[0]
    m = 0.1 * np.array([1.0, -1.0])  # (1 - beta_1) * g from zero moments
    v = 0.001 * np.array([1.0, 1.0])  # (1 - beta_2) * g^2
    for slot, fresh in zip(slots, (m, v)):
        np.testing.assert_allclose(np.asarray(slot.find(tf.constant([5], tf.int64))[0])[0],
                                   fresh, rtol=1e-4)
    assert np.all(np.abs(row) > 0)


def test_a_restore_in_a_graph_drops_the_keys_it_drops_from_the_shadows(tmp_path):
    """The same in a tf.compat.v1 Session: sok.load and a tf.compat.v1
    Saver's restore of a table leave its shadow tables (an optimizer's
    slots; here one made by make_slot) holding only keys the table holds."""
    with tf.Graph().as_default():
        sok.init()
        table = sok.DynamicVariable(2, initializer=0.0, name="emb")
        shadow = table.make_slot("m", 0.0)
        first = tf.constant([1, 2], tf.int64)
        later = tf.constant([5, 6], tf.int64)
        put = [t.import_rows(first, tf.ones([2, 2])) for t in (table, shadow)]
        put_later = [t.import_rows(later, 2 * tf.ones([2, 2])) for t in (table, shadow)]
        saver = tf.compat.v1.train.Saver([table])
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(put)
            sok.dump(str(tmp_path / "dump"), [table])
            path = saver.save(sess, str(tmp_path / "ckpt"))
            for restore in (lambda: sok.load(str(tmp_path / "dump"), [table]),
                            lambda: saver.restore(sess, path)):
                sess.run(put_later)
                restore()
                keys = [sorted(sess.run(sok_export_keys(t)).tolist()) for t in (table, shadow)]
                assert keys == [[1, 2], [1, 2]], keys


def sok_export_keys(table):
    """A table's keys, as a graph tensor (every key in one chunk)."""
    from sok_graph.ops import dynamic as dynamic_ops

    count = dynamic_ops.stats(table.handle)[0]
    return dynamic_ops.export(table.handle, table.key_type, table.dimension, 0,
                              tf.maximum(count, 1))[0]
