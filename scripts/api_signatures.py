"""The public API of sok_graph and sparse_operation_kit as a table, to show it
is the same on every TensorFlow version:

    cd tests && $SOK_PYTHON ../scripts/api_signatures.py dump /tmp/api-2.15.1.json
    python3 scripts/api_signatures.py compare /tmp/api-2.15.1.json /tmp/api-2.21.0.json

`dump` imports the installed packages (run it outside the repository root, so
the source tree does not shadow them) and every public submodule, and writes
one entry per public name: what it is, and for functions, classes and the
public methods of classes the package defines, every parameter with its kind
and default. `compare` needs no TensorFlow; it exits 1 and lists each
difference when the tables differ. TF 1.15 cannot be imported here; the static
check (scripts/check_tf115_api.py) covers it: the same source, with no public
definition that depends on the TensorFlow version.
"""

import importlib
import importlib.machinery
import importlib.util
import inspect
import json
import pkgutil
import re
import sys
import types

PACKAGES = ("sok_graph", "sparse_operation_kit")
_EXTENSION_SUFFIXES = tuple(importlib.machinery.EXTENSION_SUFFIXES)


def _ours(name, packages):
    return any(name == p or name.startswith(p + ".") for p in packages)


def _default_repr(value):
    # Addresses differ between runs; the rest of a repr is what a user sees.
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value))


def _signature(fn):
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return "no signature"
    return [
        [p.name, p.kind.name, None if p.default is p.empty else _default_repr(p.default)]
        for p in sig.parameters.values()
    ]


def _member(value):
    """A class attribute as found in the class body."""
    if isinstance(value, (staticmethod, classmethod)):
        return {"kind": type(value).__name__, "signature": _signature(value.__func__)}
    # A namedtuple's field reads as a property on Python 3.7 (TF 1.15's) and
    # as a _tuplegetter on 3.8+: the same read-only attribute either way.
    if isinstance(value, property) or type(value).__name__ == "_tuplegetter":
        return {"kind": "property"}
    if inspect.isfunction(value):
        return {"kind": "method", "signature": _signature(value)}
    if isinstance(value, type):
        return {"kind": "class"}
    return {"kind": "attribute", "type": type(value).__name__}


def describe(value, packages):
    """One table entry for a public name bound to `value`."""
    if isinstance(value, types.ModuleType):
        if _ours(value.__name__, packages):
            return {"kind": "module", "name": value.__name__}
        return {"kind": "external module"}
    module = getattr(value, "__module__", None) or ""
    if isinstance(value, type):
        if not _ours(module, packages):
            return {"kind": "external class"}
        members = {}
        # Members the package defines, inherited ones included; what a base
        # class from TensorFlow or Keras adds differs between their versions
        # and is not sok_graph's API.
        for klass in reversed(value.__mro__):
            if not _ours(getattr(klass, "__module__", ""), packages):
                continue
            for name, member in vars(klass).items():
                if not name.startswith("_") or name in ("__init__", "__call__"):
                    members[name] = _member(member)
        return {"kind": "class", "signature": _signature(value), "members": members}
    if callable(value):
        if not _ours(module, packages):
            return {"kind": "external callable"}
        return {"kind": "function", "signature": _signature(value)}
    return {"kind": "value", "type": type(value).__name__}


def _public_modules(package):
    """The package and every public submodule (no part starting with `_`)."""
    root = importlib.import_module(package)
    yield package, root
    if not hasattr(root, "__path__"):
        return
    for info in pkgutil.walk_packages(root.__path__, package + "."):
        if any(part.startswith("_") for part in info.name.split(".")):
            continue
        spec = importlib.util.find_spec(info.name)
        if spec is not None and (spec.origin or "").endswith(_EXTENSION_SUFFIXES):
            continue  # the op libraries, loaded through ctypes/TF, not imported
        try:
            yield info.name, importlib.import_module(info.name)
        except Exception as e:  # a module that fails on one version is a difference
            yield info.name, e


def dump(packages=PACKAGES):
    table = {}
    for package in packages:
        for name, module in _public_modules(package):
            if isinstance(module, Exception):
                table[name] = {"kind": "import error", "error": type(module).__name__}
                continue
            public = getattr(module, "__all__", None)
            if public is not None:
                table[name + ".__all__"] = {"kind": "__all__", "names": sorted(public)}
            for attr in sorted(dir(module)):
                if attr.startswith("_"):
                    continue
                try:
                    value = getattr(module, attr)
                except Exception as e:
                    table[name + "." + attr] = {"kind": "error", "error": type(e).__name__}
                    continue
                table[name + "." + attr] = describe(value, packages)
    return table


def compare(a, b, name_a="a", name_b="b"):
    """Lines describing every difference between two tables."""
    out = []
    for key in sorted(set(a) | set(b)):
        if key not in b:
            out.append("%s: only in %s (%s)" % (key, name_a, a[key]["kind"]))
        elif key not in a:
            out.append("%s: only in %s (%s)" % (key, name_b, b[key]["kind"]))
        elif a[key] != b[key]:
            out.append("%s differs:\n  %s: %s\n  %s: %s"
                       % (key, name_a, json.dumps(a[key], sort_keys=True),
                          name_b, json.dumps(b[key], sort_keys=True)))
    return out


def main(argv):
    if len(argv) == 3 and argv[1] == "dump":
        table = dump()
        with open(argv[2], "w") as f:
            json.dump({"tensorflow": _tf_version(), "api": table}, f, indent=1, sort_keys=True)
        print("public API: %d names written to %s" % (len(table), argv[2]))
        return 0
    if len(argv) >= 4 and argv[1] == "compare":
        tables = []
        for path in argv[2:]:
            with open(path) as f:
                tables.append(json.load(f))
        first = tables[0]
        failed = False
        for other in tables[1:]:
            diffs = compare(first["api"], other["api"], "TF " + first["tensorflow"],
                            "TF " + other["tensorflow"])
            for line in diffs:
                print(line)
            failed = failed or bool(diffs)
        n_sig = sum(1 for e in first["api"].values() if "signature" in e)
        versions = ", ".join(t["tensorflow"] for t in tables)
        print("public API on TF %s: %d names (%d with signatures) %s"
              % (versions, len(first["api"]), n_sig, "DIFFER" if failed else "identical"))
        return 1 if failed else 0
    print(__doc__)
    return 2


def _tf_version():
    try:
        import tensorflow as tf

        return tf.__version__
    except Exception:
        return "unknown"


if __name__ == "__main__":
    sys.exit(main(sys.argv))
