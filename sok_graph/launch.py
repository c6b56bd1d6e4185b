"""Starts one worker process per device and watches them.

    python -m sok_graph.launch [-np N] [--cpu] [--timeout S] [--grace S]
                               [--stall-timeout S] [--no-horovod] script.py args...

Devices: on GPU machines one worker per GPU in CUDA_VISIBLE_DEVICES (every
GPU `nvidia-smi -L` lists when the variable is unset; `-np N` takes the first
N); with no GPU (or `--cpu`, or CUDA_VISIBLE_DEVICES empty or "-1") N CPU
workers, default 1. Each worker runs `<this python> script.py args...` with
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
how long the workers wait in a collective that one of them never joins. With
Horovod it becomes Horovod's stall inspector settings (a check every S/6 s,
shutdown once a collective has waited S/2 s: whole seconds, at least 1) and
Gloo's timeout (S), so a worker that stalls, or freezes whole, makes the
others' collectives fail within about S seconds; the launcher then stops the
stalled one as below. HOROVOD_STALL_CHECK_TIME_SECONDS,
HOROVOD_STALL_SHUTDOWN_TIME_SECONDS and HOROVOD_GLOO_TIMEOUT_SECONDS already
in the launcher's environment are passed on as they are.

Each output line of a worker is printed with its rank in front ("[1] ..."),
stdout to stdout and stderr to stderr. SIGINT, SIGTERM and SIGHUP are
forwarded to every worker (a second one kills them). When a worker exits
non-zero or is killed by a signal, the others get SIGTERM and, `--grace`
seconds later (default 10, or SOK_GRAPH_LAUNCH_GRACE), SIGKILL; the launcher
prints which rank failed and the end of its stderr and exits with its status
(128 + N for signal N). `--timeout S` (or SOK_GRAPH_LAUNCH_TIMEOUT) stops the
whole job after S seconds with status 124; by default there is none. Exit
status 1: a worker or Horovod's rendezvous server could not be started;
2: bad arguments; 128 + N: the launcher got signal N.

This module imports the standard library only (Horovod's runner, which does
not import TensorFlow, only when the workers get a Horovod job), so
`python path/to/launch.py` also works without importing TensorFlow.
"""

import argparse
import collections
import importlib.util
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time

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

DEFAULT_GRACE_S = 10.0
DEFAULT_STALL_TIMEOUT_S = 120.0
EXIT_START_FAILED = 1
EXIT_BAD_ARGS = 2
EXIT_TIMEOUT = 124
STDERR_TAIL_LINES = 20
HOST = "127.0.0.1"
# The host name the Horovod rendezvous knows the workers' (one) host by, as in
# `horovodrun -H localhost:N`.
HOROVOD_HOST = "localhost"
# How often the watch loop looks at the workers: the delay between a worker's
# death and the others' SIGTERM.
_POLL_S = 0.05
# After SIGKILL, how long to wait for the kernel to reap before giving up
# (a process stuck in uninterruptible sleep must not hang the launcher).
_REAP_S = 5.0
# How long to wait for a worker's pipes to reach EOF once it is gone (a child
# it left behind may hold them open).
_DRAIN_S = 2.0
_FORWARDED = ("SIGINT", "SIGTERM", "SIGHUP")


class LaunchError(RuntimeError):
    """The launcher could not start the job (a worker or Horovod's rendezvous)."""


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
    `stall_timeout` seconds on a collective that a worker never joins.

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


class HorovodRendezvous:
    """Horovod's Gloo rendezvous server for `world_size` workers on this host,
    started and initialised as horovodrun's gloo_run does; `stop()` ends it.

    Raises LaunchError when Horovod's runner cannot be imported or the server
    cannot start.
    """

    def __init__(self, world_size):
        try:
            from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
            from horovod.runner.http.http_server import RendezvousServer
            from horovod.runner.util.network import get_local_intfs
        except Exception as e:  # any import-time failure of an installed package
            raise LaunchError(
                f"Horovod is installed but its runner cannot be imported ({type(e).__name__}: "
                f"{e}); install Horovod's dependencies (cloudpickle psutil pyyaml packaging) "
                "or run with --no-horovod"
            ) from e
        # The interface that has 127.0.0.1, found as horovodrun finds it for
        # local hosts (driver_service.get_common_interfaces).
        ifaces = sorted(get_local_intfs())
        self.iface = ifaces[0] if ifaces else "lo"
        self.slots = get_host_assignments(parse_hosts(f"{HOROVOD_HOST}:{world_size}"), world_size)
        self._server = RendezvousServer()
        try:
            self.port = self._server.start()
            self._server.init(self.slots)
        except Exception as e:
            raise LaunchError(
                f"could not start Horovod's rendezvous server ({type(e).__name__}: {e}); "
                "run with --no-horovod to launch without it"
            ) from e

    def environments(self):
        """horovod_environment() of each rank, in rank order."""
        return [horovod_environment(slot, self.port, self.iface) for slot in self.slots]

    def stop(self):
        self._server.stop()


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
    """The environment of each worker (see the module docstring).

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
        envs.append(env)
    return envs


# -- arguments ------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.print_usage(sys.stderr)
        sys.stderr.write(f"sok_graph.launch: error: {message}\n")
        sys.exit(EXIT_BAD_ARGS)


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"must be a positive integer (number of workers); got {text!r}"
        )
    return value


def _seconds(text):
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds; got {text!r}")
    return value


def _parser():
    p = _Parser(
        prog="python -m sok_graph.launch",
        usage="%(prog)s [-h] [-np N] [--cpu] [--timeout S] [--grace S] [--stall-timeout S] "
        "[--no-tf-config] [--no-horovod] script.py [args...]",
        description="Runs script.py in one worker process per GPU (or -np N CPU processes), "
        "with the rank, world size and TF_CONFIG in each worker's environment; "
        "if a worker fails, stops the others and exits with its status.",
    )
    p.add_argument(
        "-np",
        "--np",
        dest="np",
        type=_positive_int,
        default=None,
        metavar="N",
        help="number of workers (default: one per GPU; 1 without GPUs)",
    )
    p.add_argument("--cpu", action="store_true", help="run CPU workers even where GPUs are visible")
    p.add_argument(
        "--timeout",
        type=_seconds,
        default=None,
        metavar="S",
        help="stop every worker after S seconds and exit 124 (default: no limit; "
        f"env {ENV_TIMEOUT})",
    )
    p.add_argument(
        "--grace",
        type=_seconds,
        default=None,
        metavar="S",
        help="seconds between SIGTERM and SIGKILL when workers are stopped "
        f"(default {DEFAULT_GRACE_S:g}; env {ENV_GRACE})",
    )
    p.add_argument(
        "--stall-timeout",
        type=_seconds,
        default=None,
        metavar="S",
        help="bound on how long workers wait in a collective that another worker does not "
        f"join; given to them as {ENV_STALL_TIMEOUT} and, with Horovod, as its stall and Gloo "
        f"timeouts (default {DEFAULT_STALL_TIMEOUT_S:g}; env {ENV_STALL_TIMEOUT})",
    )
    p.add_argument(
        "--no-horovod",
        dest="horovod",
        action="store_false",
        help="do not serve a Horovod rendezvous or set HOROVOD_* variables, even where "
        "Horovod is installed",
    )
    p.add_argument(
        "--no-tf-config",
        dest="tf_config",
        action="store_false",
        help="do not set TF_CONFIG (SOK_GRAPH_TF_CONFIG is still set)",
    )
    p.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="script.py args...",
        help="the Python script each worker runs, and its arguments",
    )
    return p


def _env_seconds(parser, name):
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    try:
        return _seconds(text)
    except argparse.ArgumentTypeError as e:
        parser.error(f"environment variable {name} {e}")


def parse_args(argv):
    """Parsed and checked arguments; exits with status 2 and a message on bad ones."""
    parser = _parser()
    args = parser.parse_args(argv)
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        parser.error(
            "no script given (expected: python -m sok_graph.launch [-np N] script.py args...)"
        )
    args.script, args.script_args = command[0], command[1:]
    if args.timeout is None:
        args.timeout = _env_seconds(parser, ENV_TIMEOUT)
    if args.grace is None:
        args.grace = _env_seconds(parser, ENV_GRACE) or DEFAULT_GRACE_S
    if args.stall_timeout is None:
        args.stall_timeout = _env_seconds(parser, ENV_STALL_TIMEOUT) or DEFAULT_STALL_TIMEOUT_S
    # The workers run this Python, so they can import Horovod if it can.
    args.horovod = args.horovod and horovod_available()
    if not os.path.isfile(args.script):
        parser.error(
            f"script {args.script!r} is not a file (expected: python -m "
            "sok_graph.launch [-np N] script.py args...)"
        )
    gpus = [] if args.cpu else visible_gpus()
    if gpus:
        if args.np is None:
            args.np = len(gpus)
        elif args.np > len(gpus):
            where = (
                "CUDA_VISIBLE_DEVICES=" + os.environ["CUDA_VISIBLE_DEVICES"]
                if "CUDA_VISIBLE_DEVICES" in os.environ
                else "nvidia-smi -L"
            )
            parser.error(
                f"-np {args.np} asks for more workers than there are GPUs "
                f"({len(gpus)}, from {where}); use -np <= {len(gpus)}, or --cpu "
                "for CPU workers"
            )
        args.gpus = gpus[: args.np]
    else:
        args.np = 1 if args.np is None else args.np
        args.gpus = None
    return args


# -- the workers ------------------------------------------------------------------


def _die_with_parent_hook():
    """A preexec_fn that makes the kernel SIGKILL the worker if the launcher
    dies without stopping it (e.g. by SIGKILL); None where that is not
    available (not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    pr_set_pdeathsig = 1

    def hook():
        # Runs in the child between fork and exec: only the pre-resolved
        # prctl and plain os calls.
        prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # the launcher died before prctl
            os._exit(1)

    return hook


class _Output:
    """Prefixes lines with a rank and writes them whole, one at a time."""

    def __init__(self):
        self.lock = threading.Lock()
        self._broken = set()

    def write(self, stream, data):
        with self.lock:
            if stream in self._broken:
                return
            try:
                buf = getattr(stream, "buffer", None)
                if buf is not None:
                    buf.write(data)
                    buf.flush()
                else:
                    stream.write(data.decode("utf-8", "replace"))
                    stream.flush()
            except (OSError, ValueError):
                # A closed reader of our output (`| head`) must not stop us
                # from draining the workers' pipes, or they would block.
                self._broken.add(stream)

    def message(self, text):
        self.write(sys.stderr, f"sok_graph.launch: {text}\n".encode())


class _Worker:
    def __init__(self, rank, proc, output):
        self.rank = rank
        self.proc = proc
        self.stderr_tail = collections.deque(maxlen=STDERR_TAIL_LINES)
        prefix = f"[{rank}] ".encode()
        self.readers = [
            threading.Thread(
                target=self._pump, args=(proc.stdout, sys.stdout, prefix, None, output), daemon=True
            ),
            threading.Thread(
                target=self._pump,
                args=(proc.stderr, sys.stderr, prefix, self.stderr_tail, output),
                daemon=True,
            ),
        ]

    @staticmethod
    def _pump(pipe, stream, prefix, tail, output):
        # One thread per pipe keeps every pipe drained, so no worker blocks on
        # a full pipe while we wait on another.
        try:
            for line in iter(lambda: pipe.readline(1 << 16), b""):
                if not line.endswith(b"\n"):
                    line += b"\n"
                if tail is not None:
                    tail.append(line)
                output.write(stream, prefix + line)
        except (OSError, ValueError):
            pass
        finally:
            pipe.close()

    @property
    def running(self):
        # returncode is set only when we reap the worker, so until then its pid
        # (and process group) cannot belong to anyone else.
        return self.proc.returncode is None

    def signal(self, signum):
        """Sends signum to the worker's process group (the worker and its
        children), and SIGCONT after it: a stopped (frozen) process acts on
        no signal but SIGKILL until it is continued."""
        if not self.running:
            return
        try:
            os.killpg(self.proc.pid, signum)
            if signum != signal.SIGKILL:
                os.killpg(self.proc.pid, signal.SIGCONT)
        except (ProcessLookupError, PermissionError):
            pass


def _status(returncode):
    """Exit status to report for a worker: its code, or 128 + N for signal N."""
    return 128 - returncode if returncode < 0 else returncode


def _describe(returncode):
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "an unknown signal"
        return f"was killed by {name} (signal {-returncode})"
    return f"exited with status {returncode}"


def _start(args, output, rendezvous):
    ports = free_ports(args.np + 1)
    envs = worker_environments(
        args.np,
        args.gpus,
        ports[:-1],
        ports[-1],
        args.tf_config,
        stall_timeout=args.stall_timeout,
        horovod=None if rendezvous is None else rendezvous.environments(),
    )
    hook = _die_with_parent_hook()
    cmd = [sys.executable, args.script] + list(args.script_args)
    procs = []
    try:
        for env in envs:
            procs.append(
                subprocess.Popen(
                    cmd,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                    preexec_fn=hook,  # noqa: PLW1509  (see _die_with_parent_hook)
                )
            )
    except OSError as e:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
            p.wait()
        raise LaunchError(f"could not start worker {len(procs)} ({cmd[0]}): {e}") from e
    # Readers start after every fork, so no fork happens while they run.
    workers = [_Worker(rank, p, output) for rank, p in enumerate(procs)]
    for w in workers:
        for t in w.readers:
            t.start()
    return workers


def run(args):
    """Runs the workers of parsed `args` to the end; returns the exit status."""
    output = _Output()
    received = []  # signals the launcher got, in order

    def on_signal(signum, frame):
        received.append(signum)

    forwarded = [getattr(signal, name) for name in _FORWARDED if hasattr(signal, name)]
    previous = {s: signal.signal(s, on_signal) for s in forwarded}
    workers = []
    rendezvous = None
    try:
        # Before free_ports: the server's port is then taken, so no worker
        # address can be the same.
        if args.horovod:
            rendezvous = HorovodRendezvous(args.np)
        workers = _start(args, output, rendezvous)
        return _watch(workers, args, output, received)
    finally:
        # Only reached with workers running if the launcher itself failed.
        for w in workers:
            w.signal(signal.SIGKILL)
        if rendezvous is not None:
            rendezvous.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)


def _watch(workers, args, output, received):
    start = time.monotonic()
    failed = None  # the first worker that exited non-zero
    status = None  # the launcher's exit status once stopping began
    kill_at = None  # when SIGTERMed workers get SIGKILL
    n_signals = 0
    while True:
        now = time.monotonic()
        newly_failed = []
        for w in workers:
            if w.running and w.proc.poll() is not None and w.proc.returncode != 0:
                newly_failed.append(w)
        if failed is None and status is None and newly_failed:
            failed = newly_failed[0]
            status = _status(failed.proc.returncode)
            others = [w for w in workers if w.running]
            output.message(
                f"rank {failed.rank} {_describe(failed.proc.returncode)}; "
                f"stopping {len(others)} other worker(s)"
            )
            for w in others:
                w.signal(signal.SIGTERM)
            kill_at = now + args.grace
        while n_signals < len(received):
            signum = received[n_signals]
            n_signals += 1
            running = [w for w in workers if w.running]
            if status is None:
                output.message(
                    f"got {signal.Signals(signum).name}; forwarding it to {len(running)} worker(s)"
                )
                for w in running:
                    w.signal(signum)
                status = 128 + signum
                kill_at = now + args.grace
            else:
                output.message(
                    f"got {signal.Signals(signum).name} while stopping the "
                    "workers; killing them now"
                )
                kill_at = now
        if status is None and args.timeout is not None and now - start >= args.timeout:
            running = [w for w in workers if w.running]
            output.message(
                f"timeout of {args.timeout:g} s reached; stopping {len(running)} worker(s)"
            )
            for w in running:
                w.signal(signal.SIGTERM)
            status = EXIT_TIMEOUT
            kill_at = now + args.grace
        running = [w for w in workers if w.running]
        if not running:
            break
        if kill_at is not None and now >= kill_at:
            ranks = ",".join(str(w.rank) for w in running)
            output.message(f"sending SIGKILL to rank(s) {ranks}")
            for w in running:
                w.signal(signal.SIGKILL)
            _reap(running, output)
            break
        time.sleep(_POLL_S)
    _drain(workers)
    if failed is not None:
        prefix = f"[{failed.rank}] "
        tail = "".join(prefix + line.decode("utf-8", "replace") for line in failed.stderr_tail)
        output.message(
            f"rank {failed.rank} failed: it {_describe(failed.proc.returncode)}; "
            "the last lines of its stderr:\n" + (tail or "(it wrote nothing to stderr)\n")
        )
    return 0 if status is None else status


def _reap(workers, output):
    deadline = time.monotonic() + _REAP_S
    for w in workers:
        try:
            w.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            output.message(
                f"rank {w.rank} (pid {w.proc.pid}) did not die from SIGKILL "
                f"within {_REAP_S:g} s; leaving it"
            )


def _drain(workers):
    deadline = time.monotonic() + _DRAIN_S
    for w in workers:
        for t in w.readers:
            t.join(max(0.0, deadline - time.monotonic()))


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return run(args)
    except LaunchError as e:
        sys.stderr.write(f"sok_graph.launch: error: {e}\n")
        return EXIT_START_FAILED


if __name__ == "__main__":
    sys.exit(main())
