"""SOK-style training scripts on two Horovod workers equal plain TensorFlow.

tests/multiworker/sok_style_worker.py is written as SOK's own multi-worker
scripts are (hvd.init, sok.init, the global batch split by hvd.rank(),
sok.lookup_sparse with per-id weights, a wrapped native optimizer, the loss
all-reduced and fetched with the train op). Two workers run it under the
launcher, in tf.compat.v1 Session graphs (TF 1.15, and TF 2.x with v2
behaviour disabled) and in TF2 tf.functions; one process runs the same model
in plain TensorFlow (tf.Variables, tf.nn.safe_embedding_lookup_sparse) on
the whole global batch. Per step the global loss, and at the end every
table row, must agree to a relative squared error below 1e-6 (SOK's bar);
the losses also by SOK's own per-step measure.

The tables: dynamic and static, localized (table t on worker t mod 2) and
distributed, and plain tf.Variables in the lookup that every worker holds
whole (data parallel); SGD and Adagrad; a logistic loss (values in the
gradients) and a loss linear in the embeddings (SOK's tests: the gradient
needs no forward value, so nothing but the graph's edges orders a table's
update after its reads); SparseTensor inputs and RaggedTensors of static
batch size. In graph mode each worker also checks its step's graph: every
op that writes a table waits for every op of the step that reads it.
"""

import glob
import os
import sys

import numpy as np
import pytest
import tensorflow as tf

from multiworker.launching import horovod, launch, rel_sq_err, run_process  # noqa: F401 (fixture)


HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "multiworker", "sok_style_worker.py")
sys.path.insert(0, os.path.join(HERE, "multiworker"))
import sok_style_worker as worker  # noqa: E402  (the model's constants and graph check)

TF1 = tf.__version__.startswith("1.")

# kind:opt:loss:input (see the worker's docstring).
GRAPH_CONFIGS = [
    "dyn_loc:sgd:linear:sparse",       # SOK's TF1 localized dynamic test, with weights
    "dyn_loc:adagrad:logistic:ragged",
    "dyn_dist:adagrad:linear:ragged",
    "dyn_dist:sgd:logistic:sparse",
    "static_loc:sgd:linear:ragged",
    "static_loc:adagrad:logistic:sparse",
    "static_dist:adagrad:linear:sparse",
    "static_dist:sgd:logistic:ragged",
    "repl:sgd:linear:ragged",          # read in place by the fused lookup
    "repl:adagrad:logistic:sparse",
]
FUNCTION_CONFIGS = [
    "dyn_loc:sgd:linear:sparse",
    "dyn_dist:adagrad:logistic:ragged",
    "static_loc:adagrad:linear:ragged",
    "static_dist:sgd:logistic:sparse",
    "repl:adagrad:linear:sparse",
]
GRAPH_STEPS = 12
# A TF 1.15 tf.function step with Horovod's collectives takes seconds on a
# two-core machine (TF 2.x: milliseconds): fewer steps there.
FUNCTION_STEPS = 4 if TF1 else 12


def _sok_loss_diff(got, want):
    """SOK's measure: the sum over steps of (a - b)^2 / (a^2 + b^2 + 1e-8)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.sum((got - want) ** 2 / (got ** 2 + want ** 2 + 1e-8)))


def _merged(directory):
    """The two workers' results of one configuration: the losses (the same
    on both, all-reduced) and each table's rows, merged and sorted by key."""
    files = sorted(glob.glob(os.path.join(directory, "rank*.npz")))
    assert len(files) == 2, f"expected two workers' results in {directory}; got {files}"
    parts = [dict(np.load(f)) for f in files]
    np.testing.assert_array_equal(parts[1]["losses"], parts[0]["losses"],
                                  err_msg=f"{directory}: the workers' global losses differ")
    out = {"losses": parts[0]["losses"],
           "unordered": [u for p in parts for u in p["unordered"].tolist()]}
    for t in range(len(worker.DIMS)):
        keys = np.concatenate([p[f"keys{t}"] for p in parts]).astype(np.int64)
        rows = np.concatenate([p[f"rows{t}"] for p in parts])
        assert len(np.unique(keys)) == len(keys), f"{directory}: table {t} has a row twice"
        order = np.argsort(keys)
        out[f"keys{t}"], out[f"rows{t}"] = keys[order], rows[order]
    return out


def _check(config, exec_mode, results, references):
    kind, opt, loss, _ = config.split(":")
    what = f"{config} ({exec_mode}, 2 workers)"
    got = _merged(os.path.join(results, worker.config_name(tuple(config.split(":")),
                                                          exec_mode)))
    ref = dict(np.load(os.path.join(references, worker.reference_name(opt, loss, exec_mode),
                                    "reference.npz")))
    start = "dynamic" if kind.startswith("dyn") else "static"
    assert not got["unordered"], (
        f"{what}: a table's update does not wait for a read of it in the step's graph, so "
        f"the read may see this step's update: {got['unordered']}")
    want = ref[f"{start}_losses"]
    err = rel_sq_err(got["losses"], want)
    assert err < 1e-6, (f"{what}: per-step losses differ from plain TensorFlow (relative "
                        f"squared error {err:.3g}):\n{got['losses']}\n{want}")
    sok_err = _sok_loss_diff(got["losses"], want)
    assert sok_err < 1e-6, f"{what}: SOK's loss difference {sok_err:.3g} is not below 1e-6"
    for t in range(len(worker.DIMS)):
        keys = got[f"keys{t}"]
        if kind.startswith("dyn"):
            # The assigned keys, and every key a batch brought (inserted).
            expected = np.union1d(np.arange(worker.ASSIGNED), np.flatnonzero(ref[f"seen{t}"]))
        else:
            expected = np.arange(worker.ROWS)
        np.testing.assert_array_equal(keys, expected, err_msg=f"{what}: keys of table {t}")
        err = rel_sq_err(got[f"rows{t}"], ref[f"{start}_rows{t}"][keys])
        assert err < 1e-6, (f"{what}: table {t} differs from plain TensorFlow (relative "
                            f"squared error {err:.3g})")


def _train_and_compare(exec_mode, configs, steps, tmp_path):
    references, results = str(tmp_path / "reference"), str(tmp_path / "workers")
    common = ["--exec", exec_mode, "--configs", ",".join(configs), "--steps", str(steps)]
    run_process([sys.executable, WORKER, "--role", "reference", "--out", references] + common,
                timeout=300)
    launch(2, WORKER, ["--role", "sok", "--out", results] + common, timeout=420)
    for config in configs:
        _check(config, exec_mode, results, references)


def test_session_graphs_on_two_workers_equal_plain_tensorflow(horovod, tmp_path):
    """tf.compat.v1 Sessions (TF 2.x: v2 behaviour disabled), as SOK's TF1
    scripts: every configuration's losses and tables, and its step's
    ordering of table reads before table writes."""
    _train_and_compare("graph", GRAPH_CONFIGS, GRAPH_STEPS, tmp_path)


def test_tf_functions_on_two_workers_equal_plain_tensorflow(horovod, tmp_path):
    """TF2 scripts: tables made eagerly, the step in a tf.function, Keras
    optimizers."""
    _train_and_compare("function", FUNCTION_CONFIGS, FUNCTION_STEPS, tmp_path)


def _graph_checks(build):
    """worker.unordered_writes of the training step `build` makes in a new
    graph: (fetches, tables) -> the writes that may run before a read."""
    import sok_graph as sok

    with tf.Graph().as_default():
        sok.init(comm_tool="none")
        fetches, tables = build(sok)
        return worker.unordered_writes(tables, fetches)


@pytest.mark.parametrize("read", ["fused_in_place", "embedding_lookup_dynamic"])
@pytest.mark.parametrize("gradient", ["tf.gradients", "GradientTape"])
def test_one_worker_graph_updates_wait_for_the_step_reads(read, gradient):
    """One process, the same check of the step's graph for the two reads
    that hand their gradient no forward value: the fused lookup reading a
    static table in place, and tf.nn.embedding_lookup on a DynamicVariable.
    With a static batch and a loss linear in the embeddings nothing else
    links the table's update to the read."""
    def build(sok):
        if read == "fused_in_place":
            table = sok.Variable(np.ones([10, 4], np.float32))
        else:
            table = sok.DynamicVariable(dimension=4)
        ids = tf.compat.v1.placeholder(tf.int64, [6])

        def forward():
            if read == "fused_in_place":
                splits = tf.constant([0, 2, 3, 6], tf.int64)  # three samples
                return sok.lookup_sparse(table, tf.RaggedTensor.from_row_splits(ids, splits),
                                         combiners="sum")
            return tf.nn.embedding_lookup(table, ids)

        if gradient == "GradientTape":
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(forward())
            grads = tape.gradient(loss, [table])
        else:
            loss = tf.reduce_sum(forward())
            grads = tf.compat.v1.gradients(loss, [table])
        opt = sok.OptimizerWrapper(tf.compat.v1.train.GradientDescentOptimizer(0.1))
        return [loss, opt.apply_gradients(zip(grads, [table]))], [table]

    assert _graph_checks(build) == []
