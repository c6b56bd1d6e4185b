"""The package's module structure: no import circles, and every module
imports on its own.

A circle between modules works only in some import orders (the first module
imported decides whether the second finds the first half-initialized); the
package once held one together with imports inside functions. The static
check reads every import statement of every module — at module level and
inside functions — and requires the graph of sok_graph's modules to be
acyclic. The dynamic check imports each module first in a fresh interpreter.
"""

import ast
import concurrent.futures
import os
import subprocess
import sys

import sok_graph

PACKAGE_DIR = os.path.dirname(os.path.abspath(sok_graph.__file__))


def _modules():
    """{dotted module name: path} of every module of the package."""
    found = {}
    root = os.path.dirname(PACKAGE_DIR)
    for directory, _, files in os.walk(PACKAGE_DIR):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(directory, name)
            rel = os.path.relpath(path, root)[:-len(".py")].split(os.sep)
            if rel[-1] == "__init__":
                rel = rel[:-1]
            found[".".join(rel)] = path
    return found


def _imported(module, path, modules):
    """The package's modules that `module` imports anywhere in its source."""
    is_package = path.endswith("__init__.py")
    tree = ast.parse(open(path).read(), path)
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[:len(base) - node.level + (1 if is_package else 0)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module
            # `from a.b import c` imports a.b.c when that is a module, else a.b.
            names = [f"{prefix}.{alias.name}" if f"{prefix}.{alias.name}" in modules else prefix
                     for alias in node.names]
        else:
            continue
        out.update(n for n in names if n in modules and n != module)
    return out


def test_no_import_circles():
    modules = _modules()
    graph = {m: _imported(m, p, modules) for m, p in modules.items()}
    assert len(graph) > 30, sorted(graph)  # the walk found the package
    # Depth-first search; a back edge is a circle.
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == "open":
                circle = stack[stack.index(n):] + [n]
                raise AssertionError("import circle: " + " -> ".join(circle))
            if n not in state:
                visit(n)
        stack.pop()
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m)


def _import_alone(module):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True,
                         text=True, env=env, timeout=300, cwd=os.path.dirname(__file__))
    return module, out.returncode, out.stderr[-2000:]


def test_every_module_imports_first_in_a_fresh_interpreter():
    modules = sorted(_modules())
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(_import_alone, modules))
    failed = [f"{m}: {err}" for m, rc, err in results if rc != 0]
    assert not failed, "\n\n".join(failed)
