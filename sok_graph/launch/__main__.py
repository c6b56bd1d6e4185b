"""The launcher's entry point: `python -m sok_graph.launch ...`, or
`python path/to/sok_graph/launch ...` without importing sok_graph or TensorFlow.
"""

import sys

if __package__:  # python -m sok_graph.launch
    from .supervisor import main
else:
    # Run by its directory: this file is the top-level __main__ and the
    # directory is sys.path[0]. Load the directory as a package of its own,
    # not as sok_graph.launch (whose parent would import TensorFlow), and keep
    # its modules from shadowing top-level ones.
    import importlib.util
    import os

    _here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or os.curdir) == _here:
        del sys.path[0]
    _spec = importlib.util.spec_from_file_location(
        "_sok_graph_launch", os.path.join(_here, "__init__.py"), submodule_search_locations=[_here]
    )
    _package = importlib.util.module_from_spec(_spec)
    sys.modules[_spec.name] = _package
    _spec.loader.exec_module(_package)
    main = _package.main

if __name__ == "__main__":
    sys.exit(main())
