"""Shared fixtures. Tests import sok_graph as users do: the installed package
(pytest) or the package Bazel stages (bazel test)."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import sok_graph as sok  # noqa: E402


@pytest.fixture(autouse=True)
def sok_initialized():
    """Every test runs with sok_graph initialized for a single process."""
    sok.init(comm_tool="none")
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
