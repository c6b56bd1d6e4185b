"""What the multi-worker tests share: starting workers under the launcher and
the Horovod requirement.

Imported by tests/test_*.py as `multiworker.launching` (pytest puts tests/ on
sys.path)."""

import importlib.util
import os
import subprocess
import sys
import time

import numpy as np
import pytest

HAVE_HOROVOD = importlib.util.find_spec("horovod") is not None
# CI sets SOK_GRAPH_REQUIRE_HOROVOD=1 (scripts/run_tests.sh): there a missing
# Horovod fails these tests instead of skipping them.
needs_horovod = pytest.mark.skipif(
    not HAVE_HOROVOD and not os.environ.get("SOK_GRAPH_REQUIRE_HOROVOD"),
    reason="Horovod is not installed (scripts/install_horovod.sh builds it; CI requires it)")

_TF_VERSION = __import__("tensorflow").__version__
# comm_tool='tf' with several workers (MultiWorkerMirroredStrategy, or the
# replicas of a MirroredStrategy) is TensorFlow 2.x only
# (sok_graph.communication.tf_distribute.create says so on 1.x).
needs_tf2_collectives = pytest.mark.skipif(
    _TF_VERSION.startswith("1."),
    reason="comm_tool='tf' with several workers needs TensorFlow 2.x's collectives "
           "(all-to-all, timeouts); TensorFlow %s" % _TF_VERSION)


def env(**extra):
    out = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    out.update(extra)
    return out


def run_process(argv, timeout=600, cwd=None, **extra_env):
    """Runs argv, which must succeed; returns its output (stdout + stderr)."""
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=env(**extra_env), timeout=timeout, cwd=cwd)
    except subprocess.TimeoutExpired as e:
        # What it printed so far says how far it got (which workload hung).
        out = e.output.decode(errors="replace") if isinstance(e.output, bytes) else e.output
        raise AssertionError(f"{argv} did not end within {timeout} s; its last output:\n"
                             f"{(out or '')[-6000:]}") from None
    assert proc.returncode == 0, f"{argv} exited {proc.returncode}:\n{proc.stdout[-6000:]}"
    return proc.stdout


def launch(n, script, args=(), timeout=600, **extra_env):
    """Runs `script args` on n CPU workers under sok_graph.launch (also
    where GPUs are visible: the equivalence runs are about the engines, and
    one GPU cannot hold a worker per rank); must succeed."""
    return run_process([sys.executable, "-m", "sok_graph.launch", "-np", str(n), "--cpu", "--timeout",
                        str(timeout - 30), script] + list(args), timeout, **extra_env)


def launch_failing(launcher_args, timeout):
    """Runs the launcher expecting a failure: (exit status, seconds, output)."""
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "sok_graph.launch"] + list(launcher_args),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=env(), timeout=timeout)
    return proc.returncode, time.monotonic() - t0, proc.stdout


def rel_sq_err(a, b):
    """sum((a - b)^2) / sum(b^2)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sum((a - b) ** 2) / max(np.sum(b ** 2), 1e-30))


REQUIRE_HOROVOD = "SOK_GRAPH_REQUIRE_HOROVOD"


@pytest.fixture
def horovod():
    """Skips the test where Horovod is not installed, unless
    SOK_GRAPH_REQUIRE_HOROVOD is set (scripts/run_tests.sh sets it): then the
    test fails. As a fixture (`from multiworker.launching import horovod`):
    the check runs when the test does, not at collection."""
    from sok_graph import launch as sok_launch

    if sok_launch.horovod_available():
        return
    message = (
        f"Horovod is not installed in {sys.executable} (scripts/install_horovod.sh installs it)"
    )
    if os.environ.get(REQUIRE_HOROVOD):
        pytest.fail(f"{message}, and {REQUIRE_HOROVOD} is set")
    pytest.skip(f"{message}; set {REQUIRE_HOROVOD}=1 to make this a failure")
