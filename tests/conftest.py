"""Shared fixtures. Tests import sok_graph as users do: the installed package
(pytest) or the package Bazel stages (bazel test)."""

import contextlib
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

# TF 1.x starts in graph mode; the suite is written for TF2's eager default
# (graph-mode tests build their own tf.Graph and Session). This must run
# before any op is created.
if tf.__version__.startswith("1."):
    tf.compat.v1.enable_eager_execution()

import sok_graph as sok  # noqa: E402
from sok_graph import context  # noqa: E402

# tests/gpu/run_tf_suite.sh sets this to "/GPU:0": every test then runs with
# that device as the default device (ops with a GPU kernel go there, others
# fall back to the CPU as TensorFlow's soft placement decides).
TEST_DEVICE = os.environ.get("SOK_GRAPH_TEST_DEVICE", "")
ON_GPU = "GPU" in TEST_DEVICE.upper()


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "cpu_only(reason): the test checks something only the CPU has; "
        "skipped when the suite runs with a GPU as default device (reason required)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        marker = item.get_closest_marker("cpu_only")
        if marker is None:
            continue
        reason = marker.kwargs.get("reason") or (marker.args[0] if marker.args else "")
        if not reason:
            raise pytest.UsageError(f"{item.nodeid}: cpu_only needs a reason")
        if ON_GPU:
            item.add_marker(pytest.mark.skip(reason="CPU-only: " + reason))


@pytest.fixture(autouse=True)
def default_device():
    """The suite's default device (SOK_GRAPH_TEST_DEVICE), if one is set."""
    if not TEST_DEVICE:
        yield
        return
    with tf.device(TEST_DEVICE):
        yield


@pytest.fixture(autouse=True)
def sok_initialized():
    """Every test runs with sok_graph initialized for a single process,
    with tf.keras.optimizers as TensorFlow made it (a test that asks init
    for legacy optimizers gets them until it ends)."""
    sok.init(comm_tool="none", use_legacy_optimizer=False)
    yield
    context.restore_keras_optimizers()


@contextlib.contextmanager
def op_determinism_on():
    """TensorFlow's op determinism on for a block, then as it was. The GPU
    gradient of dense tables is summed with atomics unless it is on. TF 1.x
    has no such switch; there the kernels this suite runs are the CPU's,
    which sum in order."""
    from tensorflow.python.framework import config

    if not hasattr(config, "enable_op_determinism"):
        yield
        return
    was = config.is_op_determinism_enabled()
    config.enable_op_determinism()
    try:
        yield
    finally:
        if not was:
            config.disable_op_determinism()


@pytest.fixture
def op_determinism():
    """op_determinism_on for a whole test."""
    with op_determinism_on():
        yield


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def run_in_graph(build):
    """Builds `build()` in a fresh TF1-style graph and runs it in a Session."""
    graph = tf.Graph()
    with graph.as_default():
        fetches = build()
        init = tf.compat.v1.global_variables_initializer()
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(init)
            return sess.run(fetches)


def strategy_run(strategy, fn, args=()):
    """strategy.run(fn, args): TF 1.15 spells it experimental_run_v2."""
    run = getattr(strategy, "run", None) or strategy.experimental_run_v2
    return run(fn, args=args)


def relaxed_function(fn):
    """tf.function(fn, reduce_retracing=True); TF 1.15 spells it
    experimental_relax_shapes."""
    try:
        return tf.function(fn, reduce_retracing=True)
    except TypeError:
        return tf.function(fn, experimental_relax_shapes=True)
