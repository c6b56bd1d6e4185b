"""Entry point of every Bazel py_test: runs pytest on one test file against
the package staged by //:sok_graph_site (laid out as `pip install .` lays it
out), not against whatever sok_graph the Python may have installed."""

import os
import sys


def main():
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    srcdir = os.environ.get("TEST_SRCDIR")
    if srcdir:
        workspace = os.environ.get("TEST_WORKSPACE", "sok_graph")
        site = os.path.join(srcdir, workspace, "sok_graph_site")
        sys.path.insert(0, site)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [site] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        )
    import pytest

    target = os.path.join(tests_dir, sys.argv[1])
    args = [target, "-p", "no:cacheprovider", "-q", "--rootdir", tests_dir] + sys.argv[2:]
    sys.exit(pytest.main(args))


if __name__ == "__main__":
    main()
