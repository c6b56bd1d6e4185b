"""The op library as built: build stamp, version check, CUDA plumbing."""

import os
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf

from sok_graph.ops import library as _ops


def test_stamp_matches_running_tensorflow():
    info = _ops.read_build_info(_ops.library_path())
    assert info["tf_version"] == tf.__version__
    assert info["cuda"] in ("0", "1")


def test_library_built_for_other_tensorflow_is_reported(tmp_path):
    stale = tmp_path / "libsok_ops.so"
    data = open(_ops.library_path(), "rb").read()
    marker = b"tf_version=" + tf.__version__.encode()
    other = b"tf_version=" + b"9" * len(tf.__version__.encode())
    assert marker in data
    stale.write_bytes(data.replace(marker, other))
    with pytest.raises(_ops.OpLibraryError) as err:
        _ops.check_build(str(stale))
    message = str(err.value)
    assert "9" * len(tf.__version__) in message  # what it was built for
    assert tf.__version__ in message  # what is running
    assert "pip install" in message  # how to rebuild


def _stamped_copy(tmp_path, version):
    """A copy of the library whose build stamp names TensorFlow `version`
    (same length as the running version's, so the file's layout is kept)."""
    data = open(_ops.library_path(), "rb").read()
    marker = b"tf_version=" + tf.__version__.encode()
    assert len(version) == len(tf.__version__)
    path = tmp_path / "libsok_ops.so"
    path.write_bytes(data.replace(marker, b"tf_version=" + version.encode()))
    return str(path)


def test_other_minor_version_names_the_wheel_to_get(tmp_path):
    major, minor = tf.__version__.split(".")[:2]
    other_minor = str(int(minor) + 1 if len(str(int(minor) + 1)) == len(minor) else int(minor) - 1)
    built_for = tf.__version__.replace(f"{major}.{minor}", f"{major}.{other_minor}", 1)
    with pytest.raises(_ops.OpLibraryError) as err:
        _ops.check_build(_stamped_copy(tmp_path, built_for))
    message = str(err.value)
    assert f"built for TensorFlow {built_for}" in message
    assert f"+tf{major}.{minor}-" in message  # the wheel for the running TensorFlow


def test_other_patch_release_of_the_same_minor_loads(tmp_path):
    """TensorFlow keeps its C++ ABI within a minor version: a wheel built
    with 2.15.1 serves 2.15.0 too."""
    parts = tf.__version__.split(".")
    last = parts[2]
    other = ("0" if last != "0" else "1") + last[1:]
    built_for = ".".join(parts[:2] + [other] + parts[3:])
    _ops.check_build(_stamped_copy(tmp_path, built_for))


def test_missing_library_is_reported(tmp_path):
    with pytest.raises(_ops.OpLibraryError, match="missing.*pip install"):
        _ops.check_build(str(tmp_path / "libsok_ops.so"))


def test_load_is_cached():
    assert _ops.load() is _ops.load()


def _linked_libraries(path):
    out = subprocess.run(["ldd", path], capture_output=True, text=True, check=True).stdout
    return out


def test_library_does_not_need_cuda_runtime_at_load_time():
    # Static cudart: no libcudart.so / libcuda.so dependency, so the library
    # loads on machines without CUDA (such as this test machine).
    linked = _linked_libraries(_ops.library_path())
    assert "libcudart" not in linked
    assert "libcuda.so" not in linked


def _cuda_kernel_library():
    path = os.path.join(os.path.dirname(_ops.library_path()), "libsok_cuda_kernels.so")
    return path if os.path.exists(path) else None


@pytest.mark.skipif(not _ops.built_with_cuda(), reason="built without a CUDA toolkit")
def test_cuda_launchers_fail_cleanly_without_a_gpu():
    """The C launchers load without TensorFlow and report, not crash, when no
    GPU is usable. Run in a fresh process with no GPU visible."""
    lib = _cuda_kernel_library()
    assert lib is not None, "a CUDA build must ship libsok_cuda_kernels.so"
    assert "libcudart" not in _linked_libraries(lib)
    script = textwrap.dedent(f"""
        import ctypes, sys
        lib = ctypes.CDLL({lib!r})
        assert "tensorflow" not in sys.modules
        count = lib.sok_cuda_device_count()
        print("devices", count)
        if count == 0:
            # launching without a device returns a CUDA error code
            rc = lib.sok_local_rows_int64(None, ctypes.c_int64(4), ctypes.c_int64(2), None,
                                          None, None)
            print("rc", rc)
            assert rc != 0
    """)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "devices 0" in out.stdout


@pytest.mark.skipif(not _ops.built_with_cuda(), reason="built without a CUDA toolkit")
@pytest.mark.cpu_only(reason="checks the CPU fallback of a machine that has no GPU")
def test_gpu_kernel_registered_but_cpu_used_without_gpu():
    # The GPU OpKernel of SokLocalRows is compiled in; with no GPU TensorFlow
    # places the op on the CPU and it still runs.
    assert b"SokLocalRows" in open(_ops.library_path(), "rb").read()
    assert not tf.config.experimental.list_physical_devices("GPU")
    from sok_graph.ops import sharding

    assert sharding.local_rows(tf.constant([5, 8], tf.int64), 2).numpy().tolist() == [2, 4]


def test_ops_load_in_a_process_with_no_cuda_visible():
    # Eager as on TF 2.x (a no-op there; TF 1.x starts in graph mode).
    script = "import tensorflow as tf; tf.compat.v1.enable_eager_execution(); " \
             "import sok_graph as sok; sok.init(); " \
             "print(sok.lookup_sparse(tf.ones([3, 2]), tf.ragged.constant([[0, 2]], tf.int64)," \
             " combiners='sum').numpy().tolist())"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert "[[2.0, 2.0]]" in out.stdout
