"""Local repositories the build needs; nothing here downloads anything.

  @local_config_tf       headers and framework library of the pip TensorFlow
                         that $TF_PYTHON_BIN_PATH imports, plus a py_runtime
                         toolchain for that same Python (so py_test imports the
                         TensorFlow the library was built against).
  @local_config_cuda     the CUDA compiler, headers and static cudart: the
                         CUDA 12 tree of $SOK_GRAPH_CUDA12_HOME (clang compiles
                         the .cu files; scripts/cuda12_toolchain.sh makes the
                         tree), else nvcc of $CUDA_HOME or /usr/local/cuda;
                         with neither (or SOK_GRAPH_WITHOUT_CUDA=1) CPU-only.
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

def _cuda_runtime_version(rctx, include):
    """"12.9" for the CUDART_VERSION 12090 in include/cuda_runtime_api.h."""
    header = include + "/cuda_runtime_api.h"
    if not rctx.path(header).exists:
        fail("no %s: not a CUDA toolkit" % header)
    for line in rctx.read(header).splitlines():
        words = [w for w in line.replace("\t", " ").split(" ") if w]
        if len(words) == 3 and words[0] == "#define" and words[1] == "CUDART_VERSION":
            number = int(words[2])
            return "%d.%d" % (number // 1000, (number % 1000) // 10)
    fail("no CUDART_VERSION in " + header)

def _cuda12_clang(rctx, home):
    """The clang that compiles the .cu files against the CUDA 12 tree `home`."""
    for part in ["bin/ptxas", "bin/fatbinary", "nvvm/libdevice", "lib64/libcudart_static.a",
                 "include/cuda_runtime_api.h", "include/cub/cub.cuh"]:
        if not rctx.path(home + "/" + part).exists:
            fail(("SOK_GRAPH_CUDA12_HOME=%s has no %s; run scripts/cuda12_toolchain.sh " +
                  "(it prints the path to use) or unset SOK_GRAPH_CUDA12_HOME to build " +
                  "with nvcc") % (home, part))
    name = rctx.os.environ.get("SOK_GRAPH_CUDA_CLANG", "") or "clang++-19"
    clang = rctx.which(name) if "/" not in name else rctx.path(name)
    if not clang or not clang.exists:
        fail(("%s (SOK_GRAPH_CUDA_CLANG) not found: it compiles the CUDA kernels against " +
              "SOK_GRAPH_CUDA12_HOME; scripts/cuda12_toolchain.sh installs clang-19") % name)
    return str(clang)

def _cuda_configure_impl(rctx):
    env = rctx.os.environ
    compiler = ""  # "clang" (CUDA 12 tree) or "nvcc"
    tool = ""
    home = ""
    if env.get("SOK_GRAPH_WITHOUT_CUDA", "0") not in ("1", "true", "yes"):
        if env.get("SOK_GRAPH_CUDA12_HOME", ""):
            home = env["SOK_GRAPH_CUDA12_HOME"].rstrip("/")
            compiler = "clang"
            tool = _cuda12_clang(rctx, home)
        else:
            for candidate in [env.get("CUDA_HOME", ""), env.get("CUDA_PATH", ""), "/usr/local/cuda"]:
                if candidate and rctx.path(candidate + "/bin/nvcc").exists:
                    home = candidate
                    compiler = "nvcc"
                    tool = candidate + "/bin/nvcc"
                    break
    if not compiler:
        rctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])
cc_library(name = "cudart_static")
""")
        rctx.file("cuda_info.bzl", "\n".join([
            "CUDA_AVAILABLE = False",
            "CUDA_COMPILER = ''",
            "CUDA_TOOL = ''",
            "CUDA_HOME = ''",
            "CUDA_VERSION = ''",
        ]) + "\n")
        return
    lib = home + "/lib64"
    if not rctx.path(lib + "/libcudart_static.a").exists:
        lib = home + "/targets/x86_64-linux/lib"
    rctx.symlink(home + "/include", "include")
    version = _cuda_runtime_version(rctx, home + "/include")
    rctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

# Static cudart (CUDA {version}): the library then loads on machines with no
# CUDA and no driver; CUDA calls simply report that no device exists.
cc_library(
    name = "cudart_static",
    linkopts = ["{lib}/libcudart_static.a", "-ldl", "-lrt", "-lpthread"],
)

cc_library(
    name = "cuda_headers",
    hdrs = glob(["include/**/*.h", "include/**/*.hpp"]),
    includes = ["include"],
)
""".format(lib = lib, version = version))
    rctx.file("cuda_info.bzl", "\n".join([
        "CUDA_AVAILABLE = True",
        "CUDA_COMPILER = %r" % compiler,
        "CUDA_TOOL = %r" % tool,
        "CUDA_HOME = %r" % home,
        "CUDA_VERSION = %r" % version,
    ]) + "\n")

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = [
        "CUDA_HOME",
        "CUDA_PATH",
        "SOK_GRAPH_CUDA12_HOME",
        "SOK_GRAPH_CUDA_CLANG",
        "SOK_GRAPH_WITHOUT_CUDA",
    ],
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
