"""Local repositories the build needs; nothing here downloads anything.

  @local_config_tf       headers and framework library of the pip TensorFlow
                         that $TF_PYTHON_BIN_PATH imports, plus a py_runtime
                         toolchain for that same Python (so py_test imports the
                         TensorFlow the library was built against).
  @local_config_cuda     nvcc, the CUDA headers and the static cudart, when a
                         CUDA toolkit is installed; otherwise a CPU-only build.
  @system_gtest          Debian's googletest (libgtest-dev).
  @rules_cc, @rules_java, @remote_coverage_tools
                         what Bazel 4.2.3's own tools reference; small local
                         stand-ins so that nothing is fetched.
"""

_TF_QUERY = """
import json, os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf
lib = tf.sysconfig.get_lib()
framework = [f for f in os.listdir(lib) if f.startswith("libtensorflow_framework.so")]
framework.sort(key=len)
print(json.dumps({
    "include": tf.sysconfig.get_include(),
    "lib": lib,
    "framework": framework[-1] if framework else "",
    "version": tf.__version__,
    "compile_flags": tf.sysconfig.get_compile_flags(),
    "python": sys.executable,
}))
"""

def _tf_configure_impl(rctx):
    python = rctx.os.environ.get("TF_PYTHON_BIN_PATH", "")
    if not python:
        found = rctx.which("python3")
        python = str(found) if found else ""
    if not python:
        fail("TF_PYTHON_BIN_PATH is not set and no python3 is on PATH; " +
             "build through tf_ops/build/bazelw.py or set TF_PYTHON_BIN_PATH")
    result = rctx.execute([python, "-c", _TF_QUERY])
    if result.return_code != 0:
        fail("could not import tensorflow with %s (TF_PYTHON_BIN_PATH):\n%s" % (python, result.stderr))
    info = json.decode(result.stdout.strip().splitlines()[-1])
    if not info["framework"]:
        fail("no libtensorflow_framework.so* in " + info["lib"])

    rctx.symlink(info["include"], "include")
    defines = [f[2:] for f in info["compile_flags"] if f.startswith("-D")]
    rctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "tf_headers",
    hdrs = glob(["include/**/*.h", "include/**/*.hpp", "include/**/*.inc",
                 "include/Eigen/**", "include/unsupported/Eigen/**"]),
    includes = ["include"],
    defines = {defines},
)

# The framework library is linked by path, not copied: at run time the
# library is loaded into a process that already has TensorFlow loaded.
cc_library(
    name = "tf_framework",
    linkopts = ["-L{lib}", "-l:{framework}", "-Wl,-rpath,{lib}"],
)

load("@bazel_tools//tools/python:toolchain.bzl", "py_runtime_pair")

py_runtime(
    name = "py3_runtime",
    interpreter_path = "{python}",
    python_version = "PY3",
)

py_runtime_pair(
    name = "py_runtime_pair",
    py3_runtime = ":py3_runtime",
)

toolchain(
    name = "python_toolchain",
    toolchain = ":py_runtime_pair",
    toolchain_type = "@bazel_tools//tools/python:toolchain_type",
)
""".format(
        defines = repr(defines),
        lib = info["lib"],
        framework = info["framework"],
        python = info["python"],
    ))
    rctx.file("tf_info.bzl", "TF_VERSION = %r\nTF_PYTHON = %r\n" % (info["version"], info["python"]))

tf_configure = repository_rule(
    implementation = _tf_configure_impl,
    environ = ["TF_PYTHON_BIN_PATH"],
    local = True,
)

def _cuda_configure_impl(rctx):
    env = rctx.os.environ
    nvcc = ""
    if env.get("SOK_GRAPH_WITHOUT_CUDA", "0") not in ("1", "true", "yes"):
        for home in [env.get("CUDA_HOME", ""), env.get("CUDA_PATH", ""), "/usr/local/cuda"]:
            if home and rctx.path(home + "/bin/nvcc").exists:
                nvcc = home + "/bin/nvcc"
                break
    if not nvcc:
        rctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])
cc_library(name = "cudart_static")
""")
        rctx.file("cuda_info.bzl", "CUDA_AVAILABLE = False\nNVCC = ''\nCUDA_HOME = ''\n")
        return
    home = nvcc[:-len("/bin/nvcc")]
    lib = home + "/lib64"
    if not rctx.path(lib + "/libcudart_static.a").exists:
        lib = home + "/targets/x86_64-linux/lib"
    rctx.symlink(home + "/include", "include")
    rctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

# Static cudart: the library then loads on machines with no CUDA and no
# driver; CUDA calls simply report that no device exists.
cc_library(
    name = "cudart_static",
    linkopts = ["{lib}/libcudart_static.a", "-ldl", "-lrt", "-lpthread"],
)

cc_library(
    name = "cuda_headers",
    hdrs = glob(["include/**/*.h", "include/**/*.hpp"]),
    includes = ["include"],
)
""".format(lib = lib))
    rctx.file("cuda_info.bzl", "CUDA_AVAILABLE = True\nNVCC = %r\nCUDA_HOME = %r\n" % (nvcc, home))

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["CUDA_HOME", "CUDA_PATH", "SOK_GRAPH_WITHOUT_CUDA"],
    local = True,
)

def _system_gtest_impl(rctx):
    if not rctx.path("/usr/include/gtest/gtest.h").exists:
        fail("googletest headers not found; install Debian's libgtest-dev (scripts/setup_env.sh does)")
    rctx.symlink("/usr/include/gtest", "include/gtest")
    rctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])
cc_library(
    name = "gtest_main",
    hdrs = glob(["include/gtest/**/*.h"]),
    includes = ["include"],
    linkopts = ["-l:libgtest_main.a", "-l:libgtest.a", "-lpthread"],
)
""")

system_gtest = repository_rule(implementation = _system_gtest_impl, local = True)

def _files_repository_impl(rctx):
    for name, content in rctx.attr.files.items():
        rctx.file(name, content)

files_repository = repository_rule(
    implementation = _files_repository_impl,
    attrs = {"files": attr.string_dict()},
)

_RULES_CC_DEFS = """
# Re-exports Bazel's native C++ rules under @rules_cc: Debian's packaged
# rules_cc is newer than Bazel 4.2.3 understands.
def cc_binary(**kwargs):
    native.cc_binary(**kwargs)

def cc_library(**kwargs):
    native.cc_library(**kwargs)

def cc_test(**kwargs):
    native.cc_test(**kwargs)

def cc_import(**kwargs):
    native.cc_import(**kwargs)

def cc_proto_library(**kwargs):
    native.cc_proto_library(**kwargs)

def cc_toolchain(**kwargs):
    native.cc_toolchain(**kwargs)

def cc_toolchain_suite(**kwargs):
    native.cc_toolchain_suite(**kwargs)

def objc_library(**kwargs):
    native.objc_library(**kwargs)
"""

def sok_graph_repositories():
    tf_configure(name = "local_config_tf")
    cuda_configure(name = "local_config_cuda")
    system_gtest(name = "system_gtest")
    files_repository(
        name = "rules_cc",
        files = {
            "WORKSPACE": "workspace(name = \"rules_cc\")\n",
            "BUILD": "",
            "cc/BUILD": "",
            "cc/defs.bzl": _RULES_CC_DEFS,
        },
    )
    native.local_repository(
        name = "rules_java",
        path = "/usr/share/bazel/rules/java",
    )

    # Every test action depends on this repository for coverage collection;
    # an empty stand-in keeps `bazel test` offline.
    files_repository(
        name = "remote_coverage_tools",
        files = {
            "WORKSPACE": "workspace(name = \"remote_coverage_tools\")\n",
            "BUILD": "package(default_visibility = [\"//visibility:public\"])\n" +
                     "filegroup(name = \"coverage_report_generator\", srcs = [])\n" +
                     "filegroup(name = \"lcov_merger\", srcs = [])\n",
        },
    )
