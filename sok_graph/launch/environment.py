"""What the launcher gives each worker: the variable names and defaults, the
environments (rank, TF_CONFIG, Horovod's Gloo variables), GPUs and ports.
Standard library only; the tf.distribute engine imports the stall timeout's
name and default from here without the launcher's supervisor.
"""

import collections
import importlib.util
import json
import math
import os
import socket
import subprocess

ENV_RANK = "SOK_GRAPH_RANK"
ENV_LOCAL_RANK = "SOK_GRAPH_LOCAL_RANK"
ENV_WORLD_SIZE = "SOK_GRAPH_WORLD_SIZE"
ENV_LOCAL_WORLD_SIZE = "SOK_GRAPH_LOCAL_WORLD_SIZE"
ENV_COORDINATOR_ADDR = "SOK_GRAPH_COORDINATOR_ADDR"
ENV_COORDINATOR_PORT = "SOK_GRAPH_COORDINATOR_PORT"
ENV_TF_CONFIG = "SOK_GRAPH_TF_CONFIG"
ENV_TIMEOUT = "SOK_GRAPH_LAUNCH_TIMEOUT"
ENV_GRACE = "SOK_GRAPH_LAUNCH_GRACE"
ENV_STALL_TIMEOUT = "SOK_GRAPH_STALL_TIMEOUT"
ENV_NCCL_NVLS = "NCCL_NVLS_ENABLE"

DEFAULT_GRACE_S = 10.0
# The most seconds Horovod's time settings take (it narrows them to a C int).
HOROVOD_MAX_SECONDS = 2**31 - 1
DEFAULT_STALL_TIMEOUT_S = 120.0
# The least stall bound but 0 (no bound): TensorFlow's collectives count
# their timeout in whole microseconds, and a shorter one is none.
MIN_STALL_TIMEOUT_S = 1e-6
HOST = "127.0.0.1"

WorkerInfo = collections.namedtuple("WorkerInfo", ["rank", "local_rank", "world_size"])

# (rank, local rank, world size) variable names, in the order worker_info
# looks for them: this launcher, horovodrun, Open MPI's mpirun.
_LAUNCHER_ENVS = (
    (ENV_RANK, ENV_LOCAL_RANK, ENV_WORLD_SIZE),
    ("HOROVOD_RANK", "HOROVOD_LOCAL_RANK", "HOROVOD_SIZE"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE"),
)


def _env_int(environ, name, minimum):
    text = environ[name]
    try:
        value = int(text.strip())
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise ValueError(
            f"environment variable {name} must be an integer >= {minimum}; got {text!r}"
        )
    return value


def worker_info(environ=None):
    """(rank, local_rank, world_size) of this process, for sharding data.

    Read from what `python -m sok_graph.launch` sets (SOK_GRAPH_RANK, ...),
    else from horovodrun's or mpirun's variables; (0, 0, 1) when none is set.
    environ: a mapping to read instead of os.environ.
    """
    environ = os.environ if environ is None else environ
    for rank_name, local_name, size_name in _LAUNCHER_ENVS:
        if rank_name not in environ and size_name not in environ:
            continue
        for name, other in ((rank_name, size_name), (size_name, rank_name)):
            if name not in environ:
                raise ValueError(
                    f"environment variable {other} is set but {name} is not; set both or neither"
                )
        rank = _env_int(environ, rank_name, 0)
        size = _env_int(environ, size_name, 1)
        local = _env_int(environ, local_name, 0) if local_name in environ else rank
        if rank >= size:
            raise ValueError(
                f"environment variable {rank_name} must be < {size_name} ({size}); got {rank}"
            )
        return WorkerInfo(rank, local, size)
    return WorkerInfo(0, 0, 1)


# -- devices and ports --------------------------------------------------------


def _count_gpus():
    """Number of GPUs `nvidia-smi -L` lists; 0 without nvidia-smi or a driver."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "-L"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return 0
    if out.returncode != 0:
        return 0
    # MIG instances are listed indented under their GPU; count GPUs only.
    return sum(
        1 for line in out.stdout.decode("utf-8", "replace").splitlines() if line.startswith("GPU ")
    )


def visible_gpus(environ=None, count_gpus=_count_gpus):
    """The GPU ids the workers share out: CUDA_VISIBLE_DEVICES's entries (up to
    the first negative one, as CUDA reads it), or 0 .. n-1 for the n GPUs found
    when the variable is unset."""
    environ = os.environ if environ is None else environ
    if "CUDA_VISIBLE_DEVICES" not in environ:
        return [str(i) for i in range(count_gpus())]
    gpus = []
    for entry in environ["CUDA_VISIBLE_DEVICES"].split(","):
        entry = entry.strip()
        if not entry:
            continue
        if entry.startswith("-"):
            break
        gpus.append(entry)
    return gpus


def free_ports(count):
    """`count` distinct TCP ports on 127.0.0.1 that were free a moment ago.

    All sockets stay bound until every port is known, so the ports differ;
    another program may still take one before the worker binds it.
    """
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(s)
            s.bind((HOST, 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def horovod_available():
    """Whether the workers' Python (the launcher's own) finds a `horovod`
    package; looks it up without importing it."""
    try:
        return importlib.util.find_spec("horovod") is not None
    except (ImportError, ValueError):
        return False


def horovod_stall_settings(stall_timeout):
    """Horovod's stall and Gloo timeout settings (whole seconds) for a bound of
    `stall_timeout` seconds on a collective that a worker never joins (0:
    no bound).

    Horovod's coordinator looks for stalled collectives once a check time has
    passed since the last look, and shuts Horovod down at the first look that
    finds one waiting longer than the shutdown time: up to shutdown + check
    after the collective began. A collective that ran before (its response is
    cached) is first seen stalled up to two checks after it began, and only
    then starts its shutdown clock. So shutdown + 3 checks <= stall_timeout
    (for a stall_timeout of at least 4 s; Horovod ignores a shutdown time
    below the check time). Gloo's timeout, which fails a collective whose
    peer does not answer at all (a frozen or unreachable process), is the
    bound itself.
    """
    # Horovod reads each as a C int (strtol, then narrowed): 3e9 s became
    # negative and 1e20 -1, and every worker aborted in hvd.init() with
    # Gloo's "timeout.count() >= 0. Invalid timeout" (SIGABRT). A bound that
    # large means no bound in practice; each setting stops at INT_MAX
    # seconds (68 years).
    # 0 is no bound, as the tf.distribute engine reads it: below, it would
    # become a bound of 1 s (each setting is at least 1), and left unset,
    # Horovod's own defaults bound Gloo at 30 s. The largest bound stands
    # for none, as above.
    if stall_timeout == 0 or stall_timeout > HOROVOD_MAX_SECONDS:
        stall_timeout = HOROVOD_MAX_SECONDS
    check = max(1, int(stall_timeout / 6))
    shutdown = max(check, int(stall_timeout) - 3 * check)
    return {
        "HOROVOD_STALL_CHECK_TIME_SECONDS": str(check),
        "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": str(shutdown),
        "HOROVOD_GLOO_TIMEOUT_SECONDS": str(max(1, math.ceil(stall_timeout))),
    }


def horovod_environment(slot, rendezvous_port, iface="lo"):
    """The variables horovodrun's Gloo mode gives one worker
    (horovod/runner/gloo_run.py: create_run_env_vars and
    create_slot_env_vars); `slot` has the fields of Horovod's SlotInfo."""
    return {
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": HOST,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(rendezvous_port),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_IFACE": iface,
        "NCCL_SOCKET_IFNAME": iface,
        "HOROVOD_HOSTNAME": str(slot.hostname),
        "HOROVOD_RANK": str(slot.rank),
        "HOROVOD_SIZE": str(slot.size),
        "HOROVOD_LOCAL_RANK": str(slot.local_rank),
        "HOROVOD_LOCAL_SIZE": str(slot.local_size),
        "HOROVOD_CROSS_RANK": str(slot.cross_rank),
        "HOROVOD_CROSS_SIZE": str(slot.cross_size),
    }



def worker_environments(
    world_size,
    gpus,
    ports,
    coordinator_port,
    tf_config=True,
    base_env=None,
    stall_timeout=DEFAULT_STALL_TIMEOUT_S,
    horovod=None,
):
    """The environment of each worker (see the docstring of sok_graph.launch).

    gpus: one CUDA device id per worker, or None for CPU workers.
    ports: one port per worker for TF_CONFIG.
    horovod: None, or one horovod_environment() per worker; its stall
      settings then come from stall_timeout.
    """
    base_env = os.environ if base_env is None else base_env
    if horovod is not None and len(horovod) != world_size:
        raise ValueError(
            f"horovod must have one environment per worker ({world_size}); got {len(horovod)}"
        )
    cluster = [f"{HOST}:{port}" for port in ports]
    envs = []
    for rank in range(world_size):
        env = dict(base_env)
        config = json.dumps(
            {"cluster": {"worker": cluster}, "task": {"type": "worker", "index": rank}}
        )
        env.update(
            {
                ENV_RANK: str(rank),
                ENV_LOCAL_RANK: str(rank),
                ENV_WORLD_SIZE: str(world_size),
                ENV_LOCAL_WORLD_SIZE: str(world_size),
                ENV_COORDINATOR_ADDR: HOST,
                ENV_COORDINATOR_PORT: str(coordinator_port),
                ENV_TF_CONFIG: config,
                ENV_STALL_TIMEOUT: f"{stall_timeout:g}",
                "CUDA_VISIBLE_DEVICES": gpus[rank] if gpus is not None else "",
            }
        )
        if horovod is not None:
            env.update(horovod[rank])
            for name, value in horovod_stall_settings(stall_timeout).items():
                env.setdefault(name, value)
        if tf_config:
            env["TF_CONFIG"] = config
        else:
            env.pop("TF_CONFIG", None)
        env.setdefault("PYTHONUNBUFFERED", "1")
        # NVLink multicast (NCCL's NVLS) stays off unless the user turned it
        # on: it can take a shared host's GPUs out of service.
        env.setdefault(ENV_NCCL_NVLS, "0")
        envs.append(env)
    return envs
