"""Loads libsok_ops.so, once, and checks it was built for this TensorFlow.

A library built for one TensorFlow version does not load in another (their
C++ symbols differ), so before loading it the build stamp that the build
embeds in the file is read and compared with the running TensorFlow.
"""

import os
import re
import sys
import threading

import tensorflow as tf

LIBRARY_NAME = "libsok_ops.so"
REBUILD_COMMAND = "pip install --no-deps --force-reinstall <path to the sok_graph source>"

_STAMP = re.compile(rb"SOK_GRAPH_BUILD_INFO\{([^}]*)\}")
_lock = threading.Lock()
_library = None


class OpLibraryError(ImportError):
    """libsok_ops.so is missing or was built for another TensorFlow."""


def _package_dir():
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def library_path():
    """Where the op library is: $SOK_GRAPH_OPS_LIBRARY if set; else in the
    sok_graph package directory (where `pip install .` puts it); else, when
    this package is a source checkout (`python -m sok_graph.launch` from the
    checkout root puts it first on sys.path), in the installed sok_graph
    found further along sys.path. A path that does not exist is the package
    directory's, for the error message."""
    if os.environ.get("SOK_GRAPH_OPS_LIBRARY"):
        return os.environ["SOK_GRAPH_OPS_LIBRARY"]
    own = os.path.join(_package_dir(), LIBRARY_NAME)
    if os.path.exists(own):
        return own
    for entry in sys.path:
        candidate = os.path.join(os.path.abspath(entry or os.curdir), "sok_graph", LIBRARY_NAME)
        if os.path.exists(candidate):
            return candidate
    return own


def read_build_info(path):
    """The key=value pairs of the build stamp in `path` (e.g. tf_version, cuda)."""
    with open(path, "rb") as f:
        data = f.read()
    match = _STAMP.search(data)
    if match is None:
        raise OpLibraryError(f"{path} has no sok_graph build stamp; it is not a sok_graph op library")
    info = {}
    for item in match.group(1).decode().split(";"):
        if "=" in item:
            key, value = item.split("=", 1)
            info[key] = value
    return info


def check_build(path):
    """Raises OpLibraryError unless `path` exists and was built for the running TF."""
    if not os.path.exists(path):
        raise OpLibraryError(
            f"sok_graph's op library is missing: {path} does not exist. Build and install "
            f"the package for this TensorFlow with: {REBUILD_COMMAND}"
        )
    built_for = read_build_info(path).get("tf_version", "unknown")
    if _minor(built_for) != _minor(tf.__version__):
        running = ".".join(_minor(tf.__version__))
        raise OpLibraryError(
            f"{path} was built for TensorFlow {built_for}, but TensorFlow {tf.__version__} is "
            f"running; a sok_graph build only loads in the TensorFlow minor version it was "
            f"built for. Install the wheel built for TensorFlow {running} "
            f"(sok_graph-<version>+tf{running}-...whl; scripts/build_wheel.sh "
            f"{tf.__version__} makes it), or rebuild from source for this TensorFlow with: "
            f"{REBUILD_COMMAND}"
        )


def _minor(version):
    """("2", "15") of "2.15.1": TensorFlow keeps its C++ ABI within a minor
    version, which custom op libraries link against."""
    return tuple(version.split(".")[:2])


# The first load can happen while a tf.function is traced (inside
# strategy.run, AutoGraph converts what the replica function calls): file
# checks are not graph code.
@tf.autograph.experimental.do_not_convert
def load():
    """The loaded op module (snake_case op functions such as sok_fused_lookup)."""
    global _library
    if _library is None:
        with _lock:
            if _library is None:
                path = library_path()
                check_build(path)
                _library = tf.load_op_library(path)
    return _library


def built_with_cuda():
    """Whether the library has CUDA kernels compiled in."""
    return read_build_info(library_path()).get("cuda") == "1"
