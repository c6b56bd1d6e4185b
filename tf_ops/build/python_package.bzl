"""Stages the Python package as `pip install .` installs it, for Bazel tests."""

def _stage(ctx, src, dest):
    out = ctx.actions.declare_file(ctx.label.name + "/" + dest)
    ctx.actions.symlink(output = out, target_file = src)
    return out

def _staged_python_package_impl(ctx):
    outputs = []
    for f in ctx.files.package_srcs + ctx.files.extra_packages:
        outputs.append(_stage(ctx, f, f.short_path))
    for f in ctx.files.libraries:
        # A CPU-only build's CUDA kernel library is empty (no .so at all).
        if f.basename.endswith(".so"):
            outputs.append(_stage(ctx, f, "sok_graph/" + f.basename))
    return [DefaultInfo(files = depset(outputs), runfiles = ctx.runfiles(files = outputs))]

staged_python_package = rule(
    implementation = _staged_python_package_impl,
    attrs = {
        "package_srcs": attr.label_list(allow_files = [".py"]),
        "extra_packages": attr.label_list(allow_files = [".py"]),
        "libraries": attr.label_list(allow_files = True),
    },
)

def sok_py_tests(srcs, data = [], large = []):
    """One py_test per pytest file; each runs pytest on the staged package.

    large: files that need Bazel's "large" timeout (900 s) instead of
    "medium" (300 s), such as those that start many worker processes.
    """
    for src in srcs:
        native.py_test(
            name = src[:-len(".py")].replace("/", "_"),
            srcs = ["bazel_pytest.py", src],
            main = "bazel_pytest.py",
            args = [src],
            data = data + ["//:sok_graph_site"],
            python_version = "PY3",
            size = "large" if src in large else "medium",
        )
