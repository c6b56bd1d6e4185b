"""pip install . — builds libsok_ops.so with Bazel for the TensorFlow of the
Python that runs pip, then installs sok_graph and the sparse_operation_kit
import name."""

import os
import shutil
import sys

from setuptools import Distribution, find_packages, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "tf_ops", "build"))
import bazelw  # noqa: E402


class BuildWithBazel(build_py):
    """Runs `bazel build //:sok_ops` and puts the library into the package."""

    def run(self):
        # setuptools' build/lib keeps every module an earlier build copied
        # there: a module since moved or removed would go into the wheel
        # again, a stale second copy beside the new one. Build the packages
        # afresh.
        for package in ("sok_graph", "sparse_operation_kit"):
            shutil.rmtree(os.path.join(self.build_lib, package), ignore_errors=True)
        super().run()
        # Asked in a subprocess with pip's build isolation undone: the ops are
        # built for the TensorFlow installed next to this Python.
        bazelw.tensorflow_install(sys.executable)
        if shutil.which("bazel") is None:
            sys.exit("sok_graph needs Bazel to build its ops: run scripts/setup_env.sh "
                     "(installs Debian's bazel-bootstrap) or apt-get install bazel-bootstrap")
        bazelw.run(["build", "//:sok_ops", "//tf_ops:cuda_kernel_library"])
        built = os.path.join(bazelw.bazel_bin(), "tf_ops")
        # libsok_cuda_kernels.so (the C launchers alone) exists only when the
        # build found a CUDA toolkit.
        for name in ("libsok_ops.so", "libsok_cuda_kernels.so"):
            library = os.path.join(built, name)
            dest = os.path.join(self.build_lib, "sok_graph", name)
            if name != "libsok_ops.so" and not os.path.exists(library):
                continue
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            if os.path.exists(dest):
                os.remove(dest)
            shutil.copyfile(library, dest)
            os.chmod(dest, 0o755)


class BinaryDistribution(Distribution):
    """The wheel carries a compiled library: tag it for this platform."""

    def has_ext_modules(self):
        return True


# A wheel holds ops built for one TensorFlow minor: scripts/build_wheel.sh
# names it in the local version (0.1.0+tf2.15), so wheels for several
# TensorFlow versions can sit side by side in one index or directory.
VERSION = "0.1.0"
if os.environ.get("SOK_GRAPH_LOCAL_VERSION"):
    VERSION += "+" + os.environ["SOK_GRAPH_LOCAL_VERSION"]

setup(
    name="sok_graph",
    version=VERSION,
    description="Model-parallel, fused and dynamic embeddings for TensorFlow (SOK-compatible API)",
    packages=find_packages(include=["sok_graph", "sok_graph.*", "sparse_operation_kit"]),
    python_requires=">=3.7",
    cmdclass={"build_py": BuildWithBazel},
    distclass=BinaryDistribution,
    zip_safe=False,
)
