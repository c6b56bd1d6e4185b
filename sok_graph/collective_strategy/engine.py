"""Which engine a CollectiveStrategy runs on (environment variable
COLLECTIVE_STRATEGY), and starting Horovod for the "sok" engine.
"""

import os

from sok_graph import context

ENGINES = ("sok", "none")
_ENV = "COLLECTIVE_STRATEGY"


def _engine_from_env():
    value = os.environ.get(_ENV, "sok")
    engine = value.strip().lower() or "sok"
    if engine not in ENGINES:
        raise ValueError(
            f"{_ENV}={value!r} is not supported by sok_graph; choose one of {ENGINES} "
            "('sok': Horovod with model-parallel sok tables, the default; 'none': one "
            "process). DeepRec's 'hb' (HybridBackend) is not available.")
    return engine


def _launched_world_size():
    """Workers the launcher (or horovodrun) started, from its environment."""
    for key in ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        text = os.environ.get(key)
        if text:
            try:
                return int(text)
            except ValueError:
                pass
    return 1


def _start_horovod():
    """The Horovod communicator (hvd.init() first if it has not run); one
    process when Horovod is absent and no multi-worker launch asked for it."""
    try:
        import horovod.tensorflow as hvd
    except ImportError as e:
        if _launched_world_size() > 1:
            raise ImportError(
                f"{_ENV}=sok with {_launched_world_size()} workers needs Horovod "
                "(horovod.tensorflow could not be imported: scripts/install_horovod.sh "
                f"builds it), or set {_ENV}=none for one process") from e
        return context.init(comm_tool="none")
    try:
        hvd.size()
    except ValueError:  # Horovod has not been initialized
        hvd.init()
    return context.init(comm_tool="horovod")
