"""SOK's import name: ``import sparse_operation_kit as sok`` gives sok_graph.

Submodules resolve to sok_graph's own module objects
(``sparse_operation_kit.lookup is sok_graph.lookup``), so classes and state
are shared, never duplicated.
"""

import importlib
import importlib.abc
import importlib.util
import sys
import types

import sok_graph
from sok_graph import *  # noqa: F401,F403
from sok_graph import __all__, __version__  # noqa: F401

_PREFIX = __name__ + "."


def _public_module(dotted):
    """The module sok_graph exposes as attribute path `dotted`, or None."""
    obj = sys.modules["sok_graph"]
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
    return obj if isinstance(obj, types.ModuleType) else None


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target):
        self._target = target

    def create_module(self, spec):
        return importlib.import_module(self._target)

    def exec_module(self, module):
        pass


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Maps sparse_operation_kit.X to the already-imported sok_graph.X."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(_PREFIX):
            return None
        target_name = "sok_graph." + fullname[len(_PREFIX):]
        if importlib.util.find_spec(target_name) is None:
            # A public name that is a module kept elsewhere in the package
            # (sok.optimizers is sok_graph/v1/optimizers.py).
            module = _public_module(fullname[len(_PREFIX):])
            if module is None:
                return None
            target_name = module.__name__
        return importlib.util.spec_from_loader(fullname, _AliasLoader(target_name))


if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _AliasFinder())

__path__ = []  # a package, so that submodule imports reach the finder
del sok_graph


def __getattr__(name):
    # Names sok_graph makes on first use (raw_ops: the op library).
    return getattr(sys.modules["sok_graph"], name)

