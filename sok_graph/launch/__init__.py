"""Starts one worker process per device and watches them.

    python -m sok_graph.launch [-np N] [--cpu] [--timeout S] [--grace S]
                               [--stall-timeout S] [--no-horovod] script.py args...

Devices: on GPU machines one worker per GPU in CUDA_VISIBLE_DEVICES (every
GPU `nvidia-smi -L` lists when the variable is unset; `-np N` takes the first
N); with no GPU (or `--cpu`, or CUDA_VISIBLE_DEVICES empty or "-1") N CPU
workers, default 1. The launcher holds two open files per worker (its
output pipes; three with Horovod, its rendezvous connection) besides about
20 of its own: an -np its open-file limit (RLIMIT_NOFILE, `ulimit -n`)
cannot hold is refused (status 2) before any worker starts. Each worker runs `<this python> script.py args...` with
CUDA_VISIBLE_DEVICES set to its one GPU (empty on CPU) and:

  SOK_GRAPH_RANK               worker index, 0 .. world size - 1
  SOK_GRAPH_LOCAL_RANK         index on this host (= rank: one host)
  SOK_GRAPH_WORLD_SIZE         number of workers
  SOK_GRAPH_LOCAL_WORLD_SIZE   workers on this host (= world size)
  SOK_GRAPH_COORDINATOR_ADDR   127.0.0.1
  SOK_GRAPH_COORDINATOR_PORT   a free port no worker address uses, for an
                               engine that needs a rendezvous of its own
  SOK_GRAPH_STALL_TIMEOUT      seconds a collective may wait for a worker
                               that does not join it (--stall-timeout)
  SOK_GRAPH_TF_CONFIG          the TF_CONFIG below, always set
  TF_CONFIG                    {"cluster": {"worker": ["127.0.0.1:<port>", ...]},
                                "task": {"type": "worker", "index": <rank>}}
                               for tf.distribute.MultiWorkerMirroredStrategy;
                               not set with --no-tf-config (tf.estimator's
                               RunConfig rejects a cluster without a "chief")
  PYTHONUNBUFFERED=1           unless already set, so lines arrive as printed
  NCCL_NVLS_ENABLE=0           unless already set: NCCL's NVLink multicast
                               stays off (it can take a shared host's GPUs
                               out of service)

Horovod: when this Python can import `horovod` (and unless --no-horovod is
given), the launcher serves Horovod's Gloo rendezvous (horovod.runner's
RendezvousServer, as `horovodrun --gloo` does) for as long as the workers run,
and gives each worker the variables horovodrun's Gloo mode sets, so that
`hvd.init()` in the script joins one Horovod job of all the workers:

  HOROVOD_GLOO_RENDEZVOUS_ADDR, HOROVOD_GLOO_RENDEZVOUS_PORT   the server
  HOROVOD_CONTROLLER=gloo, HOROVOD_CPU_OPERATIONS=gloo
  HOROVOD_GLOO_IFACE, NCCL_SOCKET_IFNAME   the loopback interface ("lo")
  HOROVOD_HOSTNAME=localhost
  HOROVOD_RANK, HOROVOD_SIZE, HOROVOD_LOCAL_RANK, HOROVOD_LOCAL_SIZE,
  HOROVOD_CROSS_RANK (0), HOROVOD_CROSS_SIZE (1)

Stalls: `--stall-timeout S` (default 120, or SOK_GRAPH_STALL_TIMEOUT) bounds
how long the workers wait in a collective that one of them never joins; 0
means no bound (they wait forever: the tf.distribute engine's collectives
get no timeout, Horovod the largest settings it takes), and any other value
must be at least 1e-06 (TensorFlow counts the timeout in whole microseconds
and takes less as none, so a smaller one is refused with status 2). With
Horovod it becomes Horovod's stall inspector settings (a check every S/6 s,
shutdown once a collective has waited S/2 s: whole seconds, at least 1) and
Gloo's timeout (S), so a worker that stalls, or freezes whole, makes the
others' collectives fail within about S seconds; the launcher then stops the
stalled one as below. HOROVOD_STALL_CHECK_TIME_SECONDS,
HOROVOD_STALL_SHUTDOWN_TIME_SECONDS and HOROVOD_GLOO_TIMEOUT_SECONDS already
in the launcher's environment are passed on as they are.

Input: rank 0's stdin is the launcher's, as with mpirun, so that
`producer | python -m sok_graph.launch ...` and `... < file` reach it; the
other ranks read /dev/null (two readers of one pipe would each get part of
it). Where the launcher's stdin is a terminal, or closed, rank 0 reads
/dev/null too: a worker runs in a session of its own, where job control
would not stop it from taking keystrokes meant for the shell once the
launcher is in the background. `cat | python -m sok_graph.launch ...` gives
rank 0 what is typed. A stdin that never ends (an ssh session's, a CI
runner's pipe) makes a rank 0 that reads it wait; `< /dev/null` gives it
end of file at once.

Each output line of a worker is printed with its rank in front ("[1] ..."),
stdout to stdout and stderr to stderr; a line longer than 1 MiB is printed
in 1 MiB pieces, each a line with the rank in front. SIGINT, SIGTERM and SIGHUP are
forwarded to every worker (a second one kills them). When a worker exits
non-zero or is killed by a signal, the others get SIGTERM and, `--grace`
seconds later (default 10, or SOK_GRAPH_LAUNCH_GRACE), SIGKILL; the launcher
prints which rank failed, the end of its stderr (and the last line of it
that names an exception) and exits with its status
(128 + N for signal N). `--timeout S` (or SOK_GRAPH_LAUNCH_TIMEOUT) stops the
whole job after S seconds with status 124; by default there is none. Exit
status 1: a worker or Horovod's rendezvous server could not be started;
2: bad arguments; 128 + N: the launcher got signal N.

This package imports the standard library only (Horovod's runner, which does
not import TensorFlow, only when the workers get a Horovod job), so
`python path/to/sok_graph/launch` (the directory) also works without
importing TensorFlow.

Modules: environment (what each worker is given: variable names, defaults,
environments, GPUs, ports), cli (the command line), supervisor (Horovod's
rendezvous server and the workers: started, watched, stopped), __main__ (the
entry point). Importing this package loads environment only; the names of
cli and supervisor below are loaded on first use.
"""

import importlib

from .environment import (
    DEFAULT_GRACE_S,
    DEFAULT_STALL_TIMEOUT_S,
    ENV_COORDINATOR_ADDR,
    ENV_COORDINATOR_PORT,
    ENV_GRACE,
    ENV_LOCAL_RANK,
    ENV_LOCAL_WORLD_SIZE,
    ENV_RANK,
    ENV_STALL_TIMEOUT,
    ENV_TF_CONFIG,
    ENV_TIMEOUT,
    ENV_WORLD_SIZE,
    HOST,
    WorkerInfo,
    free_ports,
    horovod_available,
    horovod_environment,
    horovod_stall_settings,
    visible_gpus,
    worker_environments,
    worker_info,
)

# Names of the other modules, imported when first asked for.
_LAZY = {
    "EXIT_BAD_ARGS": "cli",
    "parse_args": "cli",
    "EXIT_START_FAILED": "supervisor",
    "EXIT_TIMEOUT": "supervisor",
    "HOROVOD_HOST": "supervisor",
    "STDERR_TAIL_LINES": "supervisor",
    "HorovodRendezvous": "supervisor",
    "LaunchError": "supervisor",
    "main": "supervisor",
    "run": "supervisor",
}

__all__ = sorted(
    [
        "DEFAULT_GRACE_S",
        "DEFAULT_STALL_TIMEOUT_S",
        "ENV_COORDINATOR_ADDR",
        "ENV_COORDINATOR_PORT",
        "ENV_GRACE",
        "ENV_LOCAL_RANK",
        "ENV_LOCAL_WORLD_SIZE",
        "ENV_RANK",
        "ENV_STALL_TIMEOUT",
        "ENV_TF_CONFIG",
        "ENV_TIMEOUT",
        "ENV_WORLD_SIZE",
        "HOST",
        "WorkerInfo",
        "free_ports",
        "horovod_available",
        "horovod_environment",
        "horovod_stall_settings",
        "visible_gpus",
        "worker_environments",
        "worker_info",
    ]
    + list(_LAZY)
)


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module("." + module, __name__), name)


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
