"""Runs Bazel for the TensorFlow of the Python that runs this script.

    python tf_ops/build/bazelw.py build //:sok_ops
    python tf_ops/build/bazelw.py test //...

A library built for one TensorFlow version does not load in another, so each
(Python, TensorFlow version) pair gets its own Bazel output base under
~/.cache/sok_graph/bazel: switching between TF versions never rebuilds from
scratch, and two versions never overwrite each other's outputs.

All output bases share one Bazel disk cache (~/.cache/sok_graph/bazel-disk-cache):
an action whose command and inputs are the same for every TensorFlow version
(the CUDA kernels, compiled without TensorFlow headers; the C++ cores and
their googletests) runs once, for the first version built, and a fresh clone
reuses what an earlier clone built. Test results are never taken from it
(scripts/run_tests.sh runs tests with --cache_test_results=no).
"""

import hashlib
import os
import subprocess
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def clean_env(**extra):
    """os.environ without what pip's isolated build environment adds, so that
    `python` sees its own site-packages (and TensorFlow) even when this runs
    inside `pip install .`."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONNOUSERSITE", "PYTHONHOME", "PYTHONSAFEPATH")}
    env.update(extra)
    return env


_ASK_TENSORFLOW = (
    "import tensorflow as tf\n"
    "std = [f.split('=')[1] for f in tf.sysconfig.get_compile_flags() if '-std=' in f]\n"
    "print(tf.__version__, (std or ['-'])[0], tf.sysconfig.get_lib())\n")
_installs = {}  # python -> (version, C++ standard or "-", library directory)


def _ask_tensorflow(python):
    if python not in _installs:
        env = clean_env(TF_CPP_MIN_LOG_LEVEL="3")
        # stdout/stderr=PIPE and universal_newlines, not capture_output/text:
        # this also runs under the Python 3.7 of TF 1.15, and stays 3.6-clean.
        out = subprocess.run(
            [python, "-c", _ASK_TENSORFLOW],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
        )
        if out.returncode != 0:
            sys.exit("sok_graph builds its ops for the TensorFlow of the Python that builds it, "
                     "but %s cannot import tensorflow; install tensorflow first:\n%s"
                     % (python, out.stderr))
        _installs[python] = tuple(out.stdout.strip().splitlines()[-1].split(" ", 2))
    return _installs[python]


def tensorflow_install(python):
    """(version, library directory) of the TensorFlow that `python` imports."""
    version, _, lib = _ask_tensorflow(python)
    return version, lib


def _minor_version(version):
    """(major, minor) of a version string ("2.10.1" -> (2, 10))."""
    parts = []
    for piece in version.split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts + [0] * (2 - len(parts)))


def cxx_standard_options(python):
    """The C++ standard of TensorFlow's headers where it is not the build's
    C++17 (.bazelrc): a library compiled with another standard than
    TensorFlow's does not link against it (absl::string_view is
    std::string_view only under C++17). Newer TensorFlows say their
    standard in tf.sysconfig.get_compile_flags(); 1.x and 2.x up to 2.10 say
    nothing. Their headers are C++14 up to 2.9; 2.10 was built as C++17 (its
    stream_executor headers use std::optional and std::is_same_v)."""
    version, standard, _ = _ask_tensorflow(python)
    if standard == "-":
        standard = "c++17" if _minor_version(version) >= (2, 10) else "c++14"
    if standard == "c++17":
        return []
    return ["--cxxopt=-std=" + standard, "--host_cxxopt=-std=" + standard]


def _cache_dir():
    return os.environ.get("SOK_GRAPH_CACHE", os.path.expanduser("~/.cache/sok_graph"))


def output_base(tf_version, tf_lib):
    # Keyed by the TensorFlow installation, not by the spelling of the Python
    # path: `python`, `python3` and pip's build subprocess share one cache.
    cache = _cache_dir()
    key = hashlib.sha256(("%s\0%s\0%s" % (REPO_ROOT, tf_lib, tf_version)).encode()).hexdigest()[:12]
    return os.path.join(cache, "bazel", "tf-%s-%s" % (tf_version, key))


def is_tf1(tf_version):
    return tf_version.split(".")[0] == "1"


def bazel_command(args, python=None):
    python = python or sys.executable
    tf_version, tf_lib = tensorflow_install(python)
    startup = [
        "bazel",
        "--output_base=%s" % output_base(tf_version, tf_lib),
        # Bazel's JVM is sized for big machines; this one has 2 cores.
        "--host_jvm_args=-Xmx3g",
        # Don't leave an idle server holding memory for hours.
        "--max_idle_secs=600",
    ]
    command, rest = args[:1], args[1:]
    if command and command[0] in ("build", "test", "run"):
        rest = [
            # No bazel-* symlinks in the source tree: two TF versions would
            # fight over them, and setuptools would wander into them.
            "--symlink_prefix=/",
            "--disk_cache=%s" % os.path.join(_cache_dir(), "bazel-disk-cache"),
            "--jobs=%d" % max(1, min(os.cpu_count() or 1, 4)),
            "--local_test_jobs=%d" % max(1, os.cpu_count() or 1),
        ] + cxx_standard_options(python) + rest
    return startup + command + rest, python, tf_version


def build_env(python, tf_version):
    # TF 1.x builds are CPU-only: the CUDA kernels target CUDA 12, TF 1.15's
    # GPU build is CUDA 10.0 (README, "TensorFlow 1.15").
    extra = {"TF_PYTHON_BIN_PATH": python}
    if is_tf1(tf_version):
        extra["SOK_GRAPH_WITHOUT_CUDA"] = "1"
    return clean_env(**extra)


def run(args, python=None, check=True):
    cmd, python, tf_version = bazel_command(args, python)
    env = build_env(python, tf_version)
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env)
    if check and proc.returncode != 0:
        sys.exit(proc.returncode)
    return proc.returncode


def bazel_bin(python=None):
    cmd, python, tf_version = bazel_command(["info", "bazel-bin"], python)
    env = build_env(python, tf_version)
    return subprocess.run(cmd, cwd=REPO_ROOT, env=env, check=True, stdout=subprocess.PIPE,
                          universal_newlines=True).stdout.strip()


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    sys.exit(run(sys.argv[1:], check=False))
