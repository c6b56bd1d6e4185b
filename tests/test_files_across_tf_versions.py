"""Files written under one TensorFlow version and read under another.

A user who upgrades (or downgrades) TensorFlow between writing and reading
sok_graph's files expects the same bits back (rows, optimizer slots, step,
per-key timestamps and use counts, admission counts and draws) or a clear
error naming the file and the version mismatch. Each TensorFlow version
sok_graph supports has its own virtualenv under ~/.cache/sok_graph/venvs
(scripts/setup_env.sh); this test runs a writer in each venv found and a
reader in each venv found, every reader reading every other version's
files, as subprocesses, and compares what the reader gets with numpy
arrays the writer recorded through plain reads (static tables' values,
`export_chunks` + `find` for dynamic tables, `get_slot(...)` for slots).

Covered, per (writer, reader) pair of different versions:
- sok.dump / sok.load with optimizer state: sok.SGD, OptimizerWrapper of
  tf.compat.v1.train.AdagradOptimizer and of tf.keras.optimizers.Adam,
  sok.optimizers.Adam; static tables of float32 / float16 / float64 /
  bfloat16 rows, dynamic tables with int64 and int32 keys, admission
  filters (min_count exact and sketch, filter_ratio), a bounded LFU table;
  the state loaded, then `incremental_model_dump` since a time before the
  last training step, then one more training step (admission counts and
  draws, eviction) against the writer's own next step;
- sok.Saver dump_to_file / restore_from_file;
- tf.compat.v1.train.Saver of tables in a Session;
- tf.train.Checkpoint of tables (rows, keys, timestamps, use counts, and
  the admission state through the next step);
- serving (TF 2.x readers load with stock TensorFlow): an export
  (`export_for_serving`) loaded, a delta (`export_serving_delta`) applied
  by the loaded model's `apply_delta_fn` and by `apply_serving_delta`.

Python 3.7 syntax (TF 1.15's pytest runs this file too).
"""

import json
import os
import re
import subprocess
import textwrap

import pytest

VENVS = os.path.expanduser(os.environ.get("SOK_GRAPH_VENVS", "~/.cache/sok_graph/venvs"))
VERSIONS = ("1.15.0", "2.15.1", "2.21.0")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# One subprocess should take well under this (a few seconds on 2 cores).
SUBPROCESS_TIMEOUT = 240


def _python(version):
    path = os.path.join(VENVS, "tf-" + version, "bin", "python")
    return path if os.path.exists(path) else None


# ----------------------------------------------------------------- the script
# Run by every venv: `script.py write OUT` or `script.py read OUT SRC...`.
SCRIPT = textwrap.dedent(r'''
import json
import os
import shutil
import sys
import time
import traceback

import numpy as np
import tensorflow as tf

TF1 = tf.__version__.startswith("1.")
if TF1:
    tf.compat.v1.enable_eager_execution()
import sok_graph as sok

sok.init()
VER = tf.__version__

STATIC = ["s32", "s16", "s64", "sbf"]
ORDER = ["s32", "s16", "s64", "sbf", "d64", "d32", "dmc", "dsk", "dfr", "dcap"]
GROUPS = {  # optimizer -> the tables it trains and dumps
    "sgd": ["s32", "sbf", "d64", "dmc", "dsk", "dfr", "dcap"],
    "adagrad": ["s32", "s16", "d32", "d64"],
    "adam": ["s64", "s32", "d64", "dcap"],
    "sokadam": ["s32", "d64", "dmc"],
}
# The tables a tf.train.Checkpoint holds, trained by sok.SGD.
CKPT = ["s32", "s16", "d64", "d32", "dmc", "dsk", "dfr", "dcap"]


def make_tables():
    t = {}
    t["s32"] = sok.Variable(np.linspace(-1, 1, 40, dtype=np.float32).reshape(10, 4),
                            name="s32")
    t["s16"] = sok.Variable(np.linspace(-1, 1, 18, dtype=np.float16).reshape(6, 3),
                            dtype=tf.float16, name="s16")
    t["s64"] = sok.Variable(np.linspace(-1, 1, 10, dtype=np.float64).reshape(5, 2) / 3,
                            dtype=tf.float64, name="s64")
    t["sbf"] = sok.Variable(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3),
                            dtype=tf.bfloat16, name="sbf")
    t["d64"] = sok.DynamicVariable(4, initializer="normal", seed=7, name="d64")
    t["d32"] = sok.DynamicVariable(3, initializer="normal", seed=8, key_type=tf.int32,
                                   name="d32")
    t["dmc"] = sok.DynamicVariable(2, initializer=0.5, min_count=3, name="dmc")
    t["dsk"] = sok.DynamicVariable(2, initializer=0.5, min_count=3, min_count_counters=64,
                                   name="dsk")
    t["dfr"] = sok.DynamicVariable(2, initializer="normal", seed=9, filter_ratio=0.5,
                                   name="dfr")
    t["dcap"] = sok.DynamicVariable(2, initializer="normal", seed=10, var_type="hybrid",
                                    init_capacity=16, max_capacity=16, evict_strategy="lfu",
                                    name="dcap")
    return t


def optimizer(name):
    if name == "sgd":
        return sok.SGD(0.1)
    if name == "adagrad":
        return sok.OptimizerWrapper(tf.compat.v1.train.AdagradOptimizer(0.2))
    if name == "adam":
        return sok.OptimizerWrapper(tf.keras.optimizers.Adam(0.05))
    return sok.optimizers.Adam(0.05)


def batch(name, i):
    rng = np.random.default_rng(100 * i + ORDER.index(name))
    static_rows = {"s32": 10, "s16": 6, "s64": 5, "sbf": 4}
    if name in static_rows:
        ids = [list(rng.integers(0, static_rows[name], 3)) for _ in range(4)]
    elif name == "dcap":
        ids = [list(rng.integers(0, 40, 3)) for _ in range(4)]
    elif name in ("dmc", "dsk"):
        ids = [list(rng.integers(0, 12, 3)) for _ in range(4)]
    else:
        big = 2 ** 30 if name == "d32" else 2 ** 40
        ids = [list(rng.integers(-big, big, 1)) + list(rng.integers(0, 30, 2))
               for _ in range(4)]
    return tf.ragged.constant(ids, tf.int32 if name == "d32" else tf.int64)


def step(tables, opt, names, i):
    """One training step of `names`; the lookups' outputs."""
    vs = [tables[n] for n in names]
    with tf.GradientTape() as tape:
        outs = []
        for n in names:
            if n == "s64":  # lookup_sparse takes no float64 table
                outs.append(tf.nn.embedding_lookup(tables[n], batch(n, i).flat_values))
            else:
                outs.append(sok.lookup_sparse([tables[n]], [batch(n, i)], combiners=["sum"],
                                              use_low_frequency_filter=True)[0])
        loss = tf.add_n([tf.reduce_sum(tf.square(tf.cast(o, tf.float32) - 0.3))
                         for o in outs])
    opt.apply_gradients(zip(tape.gradient(loss, vs), vs))
    return [o.numpy() for o in outs]


def plain(a):
    a = np.asarray(a)
    return a.view(np.uint16) if a.dtype.name == "bfloat16" else a


def state(tables, opt, names):
    """What the tables hold, read without sok.dump's code: a static table's
    value; a dynamic table's keys (export_chunks), its rows by find, its
    timestamps and use counts; slots by get_slot."""
    st = {}
    for n in names:
        v = tables[n]
        if n in STATIC:
            st[n + "/rows"] = plain(v.numpy())
        else:
            ks, ts, fs = [np.zeros([0], np.int64)], [np.zeros([0], np.int64)], \
                [np.zeros([0], np.int64)]
            for k, _, t, f in v.export_chunks(1000):
                ks.append(k.numpy().astype(np.int64))
                ts.append(t.numpy())
                fs.append(f.numpy())
            k = np.concatenate(ks)
            order = np.argsort(k, kind="stable")
            k = k[order]
            st[n + "/keys"] = k
            st[n + "/ts"] = np.concatenate(ts)[order]
            st[n + "/freq"] = np.concatenate(fs)[order]
            kk = tf.constant(k.astype(v.key_dtype.as_numpy_dtype))
            rows, found = v.find(kk)
            st[n + "/rows"] = rows.numpy()
            st[n + "/found"] = found.numpy()
        if opt is not None:
            for s in opt.slot_names():
                slot = opt.get_slot(v, s)
                st[n + "/slot." + s] = plain(slot.numpy() if n in STATIC
                                             else slot.find(kk)[0].numpy())
    return st


def incremental(tables, names, since, st):
    dyn = [n for n in names if n not in STATIC]
    keys, rows = sok.incremental_model_dump([tables[n] for n in dyn], since)
    for n, k, r in zip(dyn, keys, rows):
        k = np.asarray(k).astype(np.int64)
        order = np.argsort(k, kind="stable")
        st[n + "/inc_keys"] = k[order]
        st[n + "/inc_rows"] = np.asarray(r)[order]


def save(path, d):
    np.savez(path, **{k.replace("/", "__"): plain(v) for k, v in d.items()})


def load(path):
    z = np.load(path)
    return {k.replace("__", "/"): z[k] for k in z.files}


def differences(got, want, exact=True, skip=()):
    bad = []
    for k in sorted(want):
        if any(k.endswith(s) for s in skip):
            continue
        if k not in got:
            bad.append(k + ": missing")
            continue
        a, b = plain(got[k]), plain(want[k])
        if a.shape != b.shape or a.dtype != b.dtype:
            bad.append("%s: got %s %s, the writer had %s %s" % (k, a.dtype, a.shape,
                                                                b.dtype, b.shape))
        elif exact and a.tobytes() != b.tobytes():
            bad.append("%s: got %s, the writer had %s" % (k, a.tolist()[:4], b.tolist()[:4]))
        elif not exact and not np.allclose(a.astype(np.float64), b.astype(np.float64),
                                           rtol=1e-5, atol=1e-6):
            bad.append("%s: got %s, the writer had %s" % (k, a.tolist()[:4], b.tolist()[:4]))
    return bad


# ------------------------------------------------------------------- serving
KEYS = np.array([[5, 17, 2 ** 40], [-3, 8, 5], [99, 17, 12345678901]], np.int64)
SIDS = np.array([[0, 3, 7], [1, 1, 2], [9, 4, 0]], np.int64)


class Served(tf.Module):
    def __init__(self):
        super(Served, self).__init__()
        self.dyn = sok.DynamicVariable(4, initializer=0.0, name="dyn")
        self.st = sok.Variable(np.linspace(-1, 1, 40, dtype=np.float32).reshape(10, 4),
                               name="st")

    def __call__(self, keys, sids):
        a, b = sok.lookup_sparse([self.dyn, self.st],
                                 [tf.RaggedTensor.from_tensor(keys),
                                  tf.RaggedTensor.from_tensor(sids)],
                                 combiners=["sum", "sum"])
        return a + b


def served(export_dir):
    loaded = tf.saved_model.load(export_dir)
    f = loaded.signatures["serving_default"]
    return loaded, list(f(keys=tf.constant(KEYS), sids=tf.constant(SIDS)).values())[0].numpy()


def write_serving(out):
    m = Served()
    rng = np.random.default_rng(3)
    sok.assign(m.dyn, tf.constant([5, 17, 2 ** 40, -3, 8], tf.int64),
               tf.constant(rng.normal(size=(5, 4)).astype(np.float32)))
    sok.assign(m.st, tf.constant([0, 3], tf.int64),
               tf.constant(rng.normal(size=(2, 4)).astype(np.float32)))
    base = m(tf.constant(KEYS), tf.constant(SIDS)).numpy()
    export = os.path.join(out, "export")
    sok.export_for_serving(m, export, [tf.TensorSpec([None, 3], tf.int64, name="keys"),
                                       tf.TensorSpec([None, 3], tf.int64, name="sids")])
    with open(os.path.join(export, "assets.extra", "sok_serving.json")) as f:
        created = json.load(f)["created"]
    time.sleep(0.01)
    sok.assign(m.dyn, tf.constant([17, 99], tf.int64),
               tf.constant(rng.normal(size=(2, 4)).astype(np.float32)))
    sok.assign(m.st, tf.constant([7], tf.int64),
               tf.constant(rng.normal(size=(1, 4)).astype(np.float32)))
    after = m(tf.constant(KEYS), tf.constant(SIDS)).numpy()
    sok.export_serving_delta({"dyn": m.dyn, "st": m.st}, created, os.path.join(out, "delta"))
    np.savez(os.path.join(out, "serving.npz"), base=base, after=after)


def read_serving(src, out, results):
    want = np.load(os.path.join(src, "serving.npz"))
    export = os.path.join(src, "export")
    if not TF1:
        def base():
            _, got = served(export)
            return [] if np.array_equal(got, want["base"]) else [
                "served %s, the writer's model gave %s" % (got.tolist(), want["base"].tolist())]
        attempt(results, "serving_export", base)

        def delta_fn():
            from sok_graph.serving.delta import read_serving_delta
            loaded, _ = served(export)
            for name, (_, keys, rows) in read_serving_delta(os.path.join(src, "delta")).items():
                loaded.sok_tables[name].apply_delta_fn(keys, rows)
            got = list(loaded.signatures["serving_default"](
                keys=tf.constant(KEYS), sids=tf.constant(SIDS)).values())[0].numpy()
            return [] if np.array_equal(got, want["after"]) else [
                "served %s, the writer's model gave %s" % (got.tolist(), want["after"].tolist())]
        attempt(results, "serving_apply_delta_fn", delta_fn)

    def apply():
        target = os.path.join(out, "applied")
        shutil.rmtree(target, ignore_errors=True)
        applied = sok.apply_serving_delta(export, os.path.join(src, "delta"), output_dir=target)
        bad = [] if applied == {"dyn": 7, "st": 10} else ["applied %r" % (applied,)]
        if not TF1:
            _, got = served(target)
            if not np.array_equal(got, want["after"]):
                bad.append("served %s, the writer's model gave %s" % (got.tolist(),
                                                                     want["after"].tolist()))
        return bad
    attempt(results, "serving_apply_serving_delta", apply)


# ------------------------------------------------ tf.compat.v1.train.Saver
def v1_saver(directory, write):
    g = tf.Graph()
    with g.as_default():
        st = sok.Variable(np.linspace(-1, 1, 40, dtype=np.float32).reshape(10, 4), name="st")
        dyn = sok.DynamicVariable(4, initializer="normal", seed=3, name="dyn")
        d32 = sok.DynamicVariable(2, initializer="normal", seed=4, key_type=tf.int32,
                                  name="d32")
        ids = tf.ragged.constant([[1, 2 ** 40, -5], [7]], tf.int64)
        ids32 = tf.ragged.constant([[1, -2 ** 30], [7]], tf.int32)
        sids = tf.ragged.constant([[1, 2], [9]], tf.int64)
        a, b, c = sok.lookup_sparse([dyn, st, d32], [ids, sids, ids32], combiners=["sum"] * 3)
        loss = tf.reduce_sum(a * a) + tf.reduce_sum(b * b) + tf.reduce_sum(c * c)
        grads = tf.gradients(loss, [dyn, st, d32])
        train = sok.SGD(0.1).apply_gradients(zip(grads, [dyn, st, d32]))
        reads = {"dyn": dyn.find(tf.constant([1, 2 ** 40, -5, 7, 3], tf.int64)),
                 "st": tf.identity(st),
                 "d32": d32.find(tf.constant([1, -2 ** 30, 7, 3], tf.int32))}
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            if write:
                for _ in range(3):
                    sess.run(train)
                saver.save(sess, os.path.join(directory, "model"))
            else:
                saver.restore(sess, os.path.join(directory, "model"))
            got = sess.run(reads)
    return {"dyn/rows": got["dyn"][0], "dyn/found": got["dyn"][1], "st/rows": got["st"],
            "d32/rows": got["d32"][0], "d32/found": got["d32"][1]}


# --------------------------------------------------------------------- write
def write(out):
    os.makedirs(out)
    meta = {"version": VER}
    for g, names in GROUPS.items():
        tables, opt = make_tables(), optimizer(g)
        for i in range(3):
            step(tables, opt, names, i)
        since = int(time.time() * 1e6)
        time.sleep(0.01)
        step(tables, opt, names, 3)
        meta["since_" + g] = since
        sok.dump(os.path.join(out, "dump_" + g), [tables[n] for n in names], opt)
        st = state(tables, opt, names)
        st["step"] = np.array(int(opt.iterations.numpy()), np.int64)
        incremental(tables, names, since, st)
        save(os.path.join(out, "state_" + g + ".npz"), st)
        if g == "sgd":
            saver = sok.Saver()
            for n in names:
                saver.dump_to_file(tables[n], os.path.join(out, "saver"))
        nxt = step(tables, opt, names, 4)
        st = state(tables, opt, names)
        st.update(("out%d" % j, o) for j, o in enumerate(nxt))
        save(os.path.join(out, "next_" + g + ".npz"), st)
    # tf.train.Checkpoint of tables (with admission filters and a bound)
    tables, opt = make_tables(), optimizer("sgd")
    for i in range(3):
        step(tables, opt, CKPT, i)
    meta["ckpt"] = tf.train.Checkpoint(**{n: tables[n] for n in CKPT}).save(
        os.path.join(out, "ckpt", "c"))
    save(os.path.join(out, "state_ckpt.npz"), state(tables, None, CKPT))
    nxt = step(tables, optimizer("sgd"), CKPT, 3)
    st = state(tables, None, CKPT)
    st.update(("out%d" % j, o) for j, o in enumerate(nxt))
    save(os.path.join(out, "next_ckpt.npz"), st)
    os.makedirs(os.path.join(out, "v1"))
    save(os.path.join(out, "state_v1.npz"), v1_saver(os.path.join(out, "v1"), True))
    write_serving(out)
    with open(os.path.join(out, "meta.json"), "w") as f:
        json.dump(meta, f)


# ---------------------------------------------------------------------- read
def attempt(results, tag, fn):
    try:
        bad = fn()
        results[tag] = "; ".join(bad) if bad else "ok"
    except Exception as e:  # noqa: BLE001 (reported)
        traceback.print_exc()
        results[tag] = "raised %s: %s" % (type(e).__name__, str(e)[:1500])


def read_one(src, out):
    results = {}
    with open(os.path.join(src, "meta.json")) as f:
        meta = json.load(f)
    for g, names in GROUPS.items():
        def dumped(g=g, names=names):
            tables, opt = make_tables(), optimizer(g)
            sok.load(os.path.join(src, "dump_" + g), [tables[n] for n in names], opt)
            st = state(tables, opt, names)
            st["step"] = np.array(int(opt.iterations.numpy()), np.int64)
            incremental(tables, names, meta["since_" + g], st)
            bad = differences(st, load(os.path.join(src, "state_" + g + ".npz")))
            nxt = step(tables, opt, names, 4)
            st = state(tables, opt, names)
            st.update(("out%d" % j, o) for j, o in enumerate(nxt))
            # The next step's timestamps are the reader's clock; its numbers
            # come from this TensorFlow's kernels (a last-bit difference in
            # Adam's powers and square roots between versions is no file's).
            bad += ["next step: " + d for d in differences(
                st, load(os.path.join(src, "next_" + g + ".npz")), exact=False, skip=("/ts",))]
            return bad
        attempt(results, "dump_" + g, dumped)

    def saver():
        tables = make_tables()
        names = GROUPS["sgd"]
        for n in names:
            sok.Saver().restore_from_file(tables[n], os.path.join(src, "saver"))
        # The Saver keeps keys and rows (not timestamps, use counts or slots).
        return differences(state(tables, None, names),
                           load(os.path.join(src, "state_sgd.npz")),
                           skip=("/ts", "/freq", "step") + tuple(
                               "%s/inc_%s" % (n, p) for n in names for p in ("keys", "rows")))
    attempt(results, "saver", saver)

    def checkpoint():
        tables = make_tables()
        status = tf.train.Checkpoint(**{n: tables[n] for n in CKPT}).restore(meta["ckpt"])
        status.assert_existing_objects_matched()
        bad = differences(state(tables, None, CKPT), load(os.path.join(src, "state_ckpt.npz")))
        nxt = step(tables, optimizer("sgd"), CKPT, 3)
        st = state(tables, None, CKPT)
        st.update(("out%d" % j, o) for j, o in enumerate(nxt))
        bad += ["next step: " + d for d in differences(
            st, load(os.path.join(src, "next_ckpt.npz")), exact=False, skip=("/ts",))]
        return bad
    attempt(results, "tf_train_checkpoint", checkpoint)

    attempt(results, "v1_saver", lambda: differences(
        v1_saver(os.path.join(src, "v1"), False), load(os.path.join(src, "state_v1.npz"))))
    if os.path.exists(os.path.join(src, "serving.npz")):
        read_serving(src, out, results)
    return meta["version"], results


def main():
    if sys.argv[1] == "write":
        write(sys.argv[2])
        print("WROTE", VER)
        return
    out, results = sys.argv[2], {}
    for i, src in enumerate(sys.argv[3:]):
        scratch = os.path.join(out, "scratch%d" % i)
        os.makedirs(scratch)
        version, results[version] = read_one(src, scratch)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"reader": VER, "results": results}, f, indent=1)
    print("READ", VER)


main()
''')


def _run(version, args, tmp):
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2",
               CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES", "-1"))
    env.pop("PYTHONHOME", None)
    script = os.path.join(tmp, "files_across_versions.py")
    if not os.path.exists(script):
        with open(script, "w") as f:
            f.write(SCRIPT)
    cmd = [_python(version), script] + list(args)
    if hasattr(os, "nice"):
        cmd = ["nice", "-n", "19"] + cmd
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, env=env, cwd=tmp,
                          timeout=SUBPROCESS_TIMEOUT)
    return proc


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    """{(writer, reader): {check: "ok" or what went wrong}} for every pair of
    different versions whose venvs exist; errors of a whole writer or reader
    process under (writer, None) / (None, reader)."""
    found = [v for v in VERSIONS if _python(v) is not None]
    if len(found) < 2:
        pytest.skip("needs the venvs of at least two TensorFlow versions under %s; found %s"
                    % (VENVS, found or "none"))
    tmp = str(tmp_path_factory.mktemp("files_across_tf_versions"))
    written, failures = {}, {}
    for version in found:
        out = os.path.join(tmp, "written-" + version)
        proc = _run(version, ["write", out], tmp)
        if proc.returncode == 0:
            written[version] = out
        else:
            failures[(version, None)] = "writer failed:\n" + proc.stderr[-4000:]
    results = dict(failures)
    for reader in found:
        sources = [written[w] for w in found if w != reader and w in written]
        if not sources:
            continue
        out = os.path.join(tmp, "read-by-" + reader)
        os.makedirs(out)
        proc = _run(reader, ["read", out] + sources, tmp)
        if proc.returncode != 0:
            results[(None, reader)] = "reader failed:\n" + proc.stderr[-4000:]
            continue
        with open(os.path.join(out, "results.json")) as f:
            got = json.load(f)["results"]
        for writer, checks in got.items():
            results[(writer, reader)] = checks
    return results


PAIRS = [(w, r) for w in VERSIONS for r in VERSIONS if w != r]


def _pair(matrix, writer, reader):
    for v in (writer, reader):
        if _python(v) is None:
            pytest.skip("no venv of TensorFlow %s under %s" % (v, VENVS))
    for key in ((writer, None), (None, reader)):
        if key in matrix:
            pytest.fail(matrix[key])
    return matrix[(writer, reader)]


def _expect_ok(matrix, writer, reader, check, clear_error=None):
    """The check passed; or, where `clear_error` (a regular expression) is
    given, it raised an error that it matches (one naming the file and the
    version mismatch)."""
    checks = _pair(matrix, writer, reader)
    assert check in checks, "%s was not run for TF %s -> TF %s: %s" % (
        check, writer, reader, sorted(checks))
    got = checks[check]
    if clear_error is not None and got.startswith("raised ") and re.search(clear_error, got):
        return
    assert got == "ok", "written by TF %s, read by TF %s: %s" % (writer, reader, got)


def _ids(pairs):
    return ["%s-to-%s" % p for p in pairs]


# sok.dump / sok.load with each optimizer's slots and step; admission
# filters (exact, sketch, filter_ratio), a bounded LFU table, int32 and
# int64 keys, float32/float16/float64/bfloat16 rows; incremental_model_dump
# after the load; the next training step after the load.
@pytest.mark.parametrize("check", ["dump_sgd", "dump_adagrad", "dump_adam", "dump_sokadam"])
@pytest.mark.parametrize("writer,reader", PAIRS, ids=_ids(PAIRS))
def test_sok_dump_loads_the_same_state_under_another_tensorflow(matrix, writer, reader, check):
    _expect_ok(matrix, writer, reader, check)


@pytest.mark.parametrize("writer,reader", PAIRS, ids=_ids(PAIRS))
def test_sok_saver_restores_under_another_tensorflow(matrix, writer, reader):
    _expect_ok(matrix, writer, reader, "saver")


@pytest.mark.parametrize("writer,reader", PAIRS, ids=_ids(PAIRS))
def test_tf1_saver_of_tables_restores_under_another_tensorflow(matrix, writer, reader):
    _expect_ok(matrix, writer, reader, "v1_saver")


# TensorFlow reads its own object-based checkpoints across these versions
# (the static tables' variables come back); the dynamic tables and their
# admission state must come along, or the restore must say why not. TF 1.15
# names a dynamic table's tensors otherwise (".ATTRIBUTES/VARIABLE_VALUE-keys"
# against 2.x's ".ATTRIBUTES/-keys"): each reads the other's names as well
# (1.15 restored nothing from a 2.x file, without an error; 2.x failed on a
# 1.15 file with "Key ... not found").
CHECKPOINT_PAIRS = PAIRS


@pytest.mark.parametrize("writer,reader", CHECKPOINT_PAIRS, ids=_ids(CHECKPOINT_PAIRS))
def test_tf_train_checkpoint_of_tables_restores_under_another_tensorflow(matrix, writer,
                                                                          reader):
    _expect_ok(matrix, writer, reader, "tf_train_checkpoint")


# A TF 2.x reader loads the export with stock TensorFlow and applies the
# delta both ways; a TF 1.15 reader applies it with apply_serving_delta
# (its loaded SavedModels have no apply_delta_fn).
TF2_READERS = [(w, r) for w, r in PAIRS if not r.startswith("1.")]


@pytest.mark.parametrize("check", ["serving_export", "serving_apply_delta_fn"])
@pytest.mark.parametrize("writer,reader", TF2_READERS, ids=_ids(TF2_READERS))
def test_a_served_export_and_its_delta_load_under_another_tensorflow(matrix, writer, reader,
                                                                      check):
    _expect_ok(matrix, writer, reader, check)


@pytest.mark.parametrize("writer,reader", PAIRS, ids=_ids(PAIRS))
def test_apply_serving_delta_under_another_tensorflow(matrix, writer, reader):
    _expect_ok(matrix, writer, reader, "serving_apply_serving_delta")
