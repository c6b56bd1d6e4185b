"""The launcher's supervisor: starts Horovod's rendezvous server and the
workers, forwards their output and signals, stops them all when one fails.
"""

import collections
import os
import signal
import re
import subprocess
import sys
import threading
import time

from .cli import parse_args
from .environment import HOST, free_ports, horovod_environment, worker_environments

EXIT_START_FAILED = 1
EXIT_TIMEOUT = 124
STDERR_TAIL_LINES = 20
# A worker's output line is forwarded whole, with its rank in front, up to
# this many bytes; a longer one is forwarded in pieces of this size, each
# a line with the rank in front (no reader holds more than one piece).
LINE_LIMIT = 1 << 20
# The most of one line kept for the report of a failed worker's stderr.
_TAIL_LINE_BYTES = 4096
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
            if stream is None or stream in self._broken:
                # None: the launcher was started with that descriptor
                # closed (`>&-`); its output is dropped, as a closed
                # reader's is, and the workers' status still comes back.
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


# A line that names an exception: a Python traceback's last line
# ("ValueError: ...", "tensorflow.python.framework.errors_impl.
# DeadlineExceededError: ...").
_ERROR_LINE = re.compile(rb"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt)\b")


class _StderrTail:
    """The last STDERR_TAIL_LINES lines of a worker's stderr, and the last
    line among all of them that names an exception. A TensorFlow error raised
    by a Session or a tf.function prints its message first and then the
    traceback of the failing op's creation (dozens of lines), which pushed
    the message out of the last lines: the report of a failed worker then
    said where, but not what."""

    def __init__(self):
        self.lines = collections.deque(maxlen=STDERR_TAIL_LINES)
        self.error = None

    def append(self, line):
        if len(line) > _TAIL_LINE_BYTES:
            line = line[:_TAIL_LINE_BYTES] + b" [...]\n"
        self.lines.append(line)
        if _ERROR_LINE.match(line):
            self.error = line

    def report(self, prefix):
        text = "".join(prefix + line.decode("utf-8", "replace") for line in self.lines)
        if self.error is not None and self.error not in self.lines:
            text = ("its last error, before the last lines: " + prefix
                    + self.error.decode("utf-8", "replace") + text)
        return text


class _Worker:
    def __init__(self, rank, proc, output):
        self.rank = rank
        self.proc = proc
        self.stderr_tail = _StderrTail()
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
            # A line of up to LINE_LIMIT bytes arrives as it was printed (a
            # 64 KiB limit cut a longer JSON line into two prefixed lines).
            for line in iter(lambda: pipe.readline(LINE_LIMIT), b""):
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
        _signal_group(self.proc.pid, signum)
        if signum != signal.SIGKILL:
            _signal_group(self.proc.pid, signal.SIGCONT)


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


def _kill(procs):
    """SIGKILLs the process groups of workers already started, and reaps them."""
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        p.wait()


def _rank0_stdin():
    """Rank 0's stdin, for Popen: the launcher's own (None: inherited), so
    that input piped or redirected to the launcher reaches the job, as
    mpirun gives it to rank 0; /dev/null where the launcher's stdin is closed
    or a terminal. The other ranks always get /dev/null: two readers of one
    pipe would each get an unpredictable part of it.

    Called before the launcher opens a descriptor it keeps: with its fd 0
    closed, the next one it opens takes the number 0, and an inherited fd 0
    is then whatever that is. Rank 0's own output pipe, say, which Popen
    closes in rank 0: it had no fd 0 at all, and sys.stdin None.
    """
    try:
        os.fstat(0)
    except OSError:  # `<&-`: rank 0 reads /dev/null, as the others do
        return subprocess.DEVNULL
    # A terminal is kept from rank 0. A worker runs in a session of its own
    # (start_new_session: the launcher signals its whole process group, and
    # the terminal's Ctrl-C reaches only the launcher, which forwards it), so
    # the terminal is not its controlling terminal and job control does not
    # apply to it: with the launcher in the background (`&`, or Ctrl-Z and
    # `bg`) the kernel would not stop it with SIGTTIN when it reads, and it
    # would take keystrokes meant for the shell. In a process group of its
    # own in the launcher's session it would be stopped by SIGTTIN at its
    # first read even in the foreground (its group is never the terminal's
    # foreground group), and the job would hang. `cat | python -m
    # sok_graph.launch ...` gives rank 0 what is typed, through a cat that
    # job control does stop.
    if os.isatty(0):
        return subprocess.DEVNULL
    return None


def _start(args, output, rendezvous, rank0_stdin=subprocess.DEVNULL):
    try:
        ports = free_ports(args.np + 1)
    except OSError as e:
        raise LaunchError(f"could not find {args.np + 1} free ports for {args.np} worker(s) "
                          f"on {HOST}: {e}") from e
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
        for rank, env in enumerate(envs):
            procs.append(
                subprocess.Popen(
                    cmd,
                    env=env,
                    stdin=rank0_stdin if rank == 0 else subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                    preexec_fn=hook,  # noqa: PLW1509  (see _die_with_parent_hook)
                )
            )
    except OSError as e:
        _kill(procs)
        raise LaunchError(f"could not start worker {len(procs)} ({cmd[0]}): {e}") from e
    # Readers start after every fork, so no fork happens while they run.
    workers = [_Worker(rank, p, output) for rank, p in enumerate(procs)]
    started = 0
    try:
        for w in workers:
            for t in w.readers:
                t.start()
                started += 1
    except RuntimeError as e:
        # "can't start new thread": the workers ran on, unwatched (run()
        # only stops the workers _start returned).
        _kill(procs)
        raise LaunchError(
            f"could not start the thread that reads a worker's output ({started} of "
            f"{2 * len(workers)} started): {e}; use a smaller -np (now {args.np})"
        ) from e
    return workers


def run(args):
    """Runs the workers of parsed `args` to the end; returns the exit status."""
    output = _Output()
    received = []  # signals the launcher got, in order

    def on_signal(signum, frame):
        received.append(signum)

    # Before the rendezvous server's socket and the workers' pipes are
    # opened (see _rank0_stdin).
    rank0_stdin = _rank0_stdin()
    forwarded = [getattr(signal, name) for name in _FORWARDED if hasattr(signal, name)]
    previous = {s: signal.signal(s, on_signal) for s in forwarded}
    workers = []
    rendezvous = None
    try:
        # Before free_ports: the server's port is then taken, so no worker
        # address can be the same.
        if args.horovod:
            rendezvous = HorovodRendezvous(args.np)
        workers = _start(args, output, rendezvous, rank0_stdin)
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
    _end_leftovers(workers, args.grace, output)
    _drain(workers)
    if failed is not None:
        prefix = f"[{failed.rank}] "
        tail = failed.stderr_tail.report(prefix)
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


def _group_alive(pgid):
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # members we may not signal: alive all the same
        pass
    return True


def _signal_group(pgid, signum):
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _end_leftovers(workers, grace, output):
    """Ends what exited workers left running in their process groups (a
    child a worker started and never waited for): SIGTERM, then SIGKILL
    after `grace` s. Such a child outlived a job that had ended with
    status 0, and kept its output pipes open. A group's id is its reaped
    worker's pid, which no new process takes while the group has members."""
    left = [w for w in workers if _group_alive(w.proc.pid)]
    if not left:
        return
    output.message(f"rank(s) {','.join(str(w.rank) for w in left)} exited and left processes "
                   f"running in their process group; stopping them")
    for w in left:
        _signal_group(w.proc.pid, signal.SIGTERM)
        _signal_group(w.proc.pid, signal.SIGCONT)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_group_alive(w.proc.pid) for w in left):
        time.sleep(_POLL_S)
    for w in left:
        _signal_group(w.proc.pid, signal.SIGKILL)


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
