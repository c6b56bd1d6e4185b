"""The one interface through which sok_graph talks between workers.

Model parallelism needs all-to-all with uneven splits (ids one way, rows
back), all-reduce, all-gather and broadcast, inside the graph (tf.function
and graph-mode Sessions) and with gradients. Every engine implements
`Communicator` (base.py); the rest of the package only ever calls its
public methods, so supporting another engine means adding a module here and
nothing else. Engines import base.py, never this package, which imports them.

Engines:
  SingleProcess  world size 1, no communication (the default): base.py
  Horovod        horovod.tensorflow (Gloo on CPU, NCCL on GPUs): horovod.py
  TFDistribute   tf.distribute collectives (MultiWorkerMirroredStrategy, one
                 replica per process): tf_distribute.py
  MirroredReplicas  the replicas of a MirroredStrategy in one process, each a
                 worker (dataflow built with the strategy's merge_call); it
                 also says which shard a replica builds and sees: replicas.py

Every all-to-all can count the bytes it sends to other workers (see
`count_bytes`), so benchmarks can report bytes per step.
"""

from sok_graph.communication import horovod, tf_distribute
from sok_graph.communication.base import (  # noqa: F401  (the package's interface)
    COMM_TOOLS,
    SINGLE_PROCESS_TOOLS,
    Communicator,
    SingleProcess,
    bytes_sent,
    count_bytes,
    reset_bytes_sent,
)


def create(comm_tool):
    """The communicator for `comm_tool` ("horovod", "tf", "none"/"single" or
    None).

    SOK's default is "horovod"; when Horovod is absent or not initialized, or
    runs a single worker, that means one process and no communication.
    "tf" uses the active tf.distribute strategy's cluster.
    """
    if comm_tool is None:
        comm_tool = "horovod"
    if comm_tool not in COMM_TOOLS:
        raise ValueError(f"comm_tool must be one of {COMM_TOOLS} (\"none\" and \"single\" "
                         f"mean one process); got {comm_tool!r}")
    if comm_tool in SINGLE_PROCESS_TOOLS:
        return SingleProcess()
    comm = horovod.create() if comm_tool == "horovod" else tf_distribute.create()
    if type(comm) is SingleProcess:
        _refuse_one_of_several_workers(comm_tool)
    return comm


def _refuse_one_of_several_workers(comm_tool):
    """RuntimeError where the environment says this process is one of
    several workers (python -m sok_graph.launch, horovodrun, mpirun) but
    `comm_tool` found no engine joining them (Horovod not initialized; no
    multi-worker strategy): every worker then trained alone on its part of
    the data, its own whole table, without an error. comm_tool="none"
    still makes independent processes, if that is what is meant."""
    from sok_graph.launch.environment import worker_info

    try:
        rank, _, world_size = worker_info()
    except ValueError:  # malformed variables: the engines' business, not this check's
        return
    if world_size > 1:
        how = ("call hvd.init() (import horovod.tensorflow as hvd) before sok.init()"
               if comm_tool == "horovod" else
               "call sok.init(comm_tool=\"tf\") inside the scope of a "
               "MultiWorkerMirroredStrategy")
        raise RuntimeError(
            f"this process is worker {rank} of {world_size} (its launcher's environment "
            f"says so), but comm_tool={comm_tool!r} found nothing joining the workers: each "
            f"would train alone. {how[0].upper() + how[1:]}; or comm_tool=\"none\" for "
            f"independent processes")
