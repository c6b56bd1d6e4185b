"""The launcher's command line: its options, checked, with the worker count
and GPUs they and the environment give.
"""

import argparse
import math
import os
import sys

from .environment import (
    DEFAULT_GRACE_S,
    DEFAULT_STALL_TIMEOUT_S,
    ENV_GRACE,
    ENV_STALL_TIMEOUT,
    ENV_TIMEOUT,
    MIN_STALL_TIMEOUT_S,
    horovod_available,
    visible_gpus,
)

EXIT_BAD_ARGS = 2
# Open file descriptors the launcher holds for each worker while it runs: the
# read ends of its stdout and stderr pipes; with Horovod one more, its
# connection to the rendezvous server the launcher serves.
FDS_PER_WORKER = 2
FDS_PER_HOROVOD_WORKER = 3
# Descriptors the launcher needs besides those (and those it has open when
# the arguments are checked): a worker's start takes five for a moment (its
# pipes' write ends, subprocess's error pipe, /dev/null), Horovod's server
# its listening socket, nvidia-smi its pipe.
FDS_RESERVE = 16


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


def _number(text):
    """text as a float; nan (refused by every caller) where it is none."""
    try:
        return float(text)
    except ValueError:
        return float("nan")


def _seconds(text):
    value = _number(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds; got {text!r}")
    return value


def _stall_seconds(text):
    """A stall bound: 0 (none: collectives wait forever, as the tf.distribute
    engine reads it), or at least MIN_STALL_TIMEOUT_S seconds."""
    value = _number(text)
    # TensorFlow keeps a collective's timeout as a 32-bit float and counts it
    # in whole microseconds, where 0 is no timeout: 1e-300 became 0, and the
    # workers waited forever under a bound meant to be tiny. Such a value is
    # refused rather than rounded up: no one means a bound under a
    # microsecond, and a mistyped one is better named than run.
    if not (math.isfinite(value) and (value == 0 or value >= MIN_STALL_TIMEOUT_S)):
        raise argparse.ArgumentTypeError(
            f"must be 0 (no bound: wait forever) or a number of seconds >= "
            f"{MIN_STALL_TIMEOUT_S:g} (TensorFlow counts whole microseconds, and takes less "
            f"as 0); got {text!r}"
        )
    return value


def _parser():
    p = _Parser(
        prog="python -m sok_graph.launch",
        usage="%(prog)s [-h] [-np N] [--cpu] [--timeout S] [--grace S] [--stall-timeout S] "
        "[--no-tf-config] [--no-horovod] script.py [args...]",
        description="Runs script.py in one worker process per GPU (or -np N CPU processes), "
        "with the rank, world size and TF_CONFIG in each worker's environment; "
        "if a worker fails, stops the others and exits with its status. "
        "Input piped or redirected to the launcher is rank 0's stdin, as with mpirun; "
        "every other rank reads /dev/null, and so does rank 0 where the launcher's stdin "
        "is a terminal (pipe it in, as `cat | python -m sok_graph.launch ...`, to type "
        "to rank 0) or closed.",
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
        type=_stall_seconds,
        default=None,
        metavar="S",
        help="bound on how long workers wait in a collective that another worker does not "
        f"join; given to them as {ENV_STALL_TIMEOUT} and, with Horovod, as its stall and Gloo "
        f"timeouts; 0: no bound, they wait forever; else at least {MIN_STALL_TIMEOUT_S:g} "
        f"(default {DEFAULT_STALL_TIMEOUT_S:g}; env {ENV_STALL_TIMEOUT})",
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


def _env_seconds(parser, name, convert=_seconds):
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    try:
        return convert(text)
    except argparse.ArgumentTypeError as e:
        parser.error(f"environment variable {name} {e}")


def _open_descriptors():
    """Number of file descriptors this process has open (3 where it cannot
    be told)."""
    for where in ("/proc/self/fd", "/dev/fd"):
        try:
            return max(3, len(os.listdir(where)) - 1)  # less the listing's own
        except OSError:
            continue
    return 3


def descriptor_shortfall(np_, horovod, limits=None, in_use=None):
    """None where the launcher can hold what `np_` workers need of its open
    file descriptors; else the message saying why not. limits: (soft, hard)
    RLIMIT_NOFILE (this process's, where None); in_use: descriptors open
    now."""
    try:
        import resource
    except ImportError:  # not a Unix: no such limit to check
        return None
    if limits is None:
        limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    infinity = resource.RLIM_INFINITY
    soft, hard = limits
    if soft == infinity or soft < 0:
        return None
    in_use = _open_descriptors() if in_use is None else in_use
    per_worker = FDS_PER_HOROVOD_WORKER if horovod else FDS_PER_WORKER
    fixed = in_use + FDS_RESERVE
    need = fixed + per_worker * np_
    if need <= soft:
        return None
    most = (soft - fixed) // per_worker
    why = "its output pipes" + (" and its connection to Horovod's rendezvous" if horovod else "")
    hard_text = "unlimited" if hard == infinity or hard < 0 else str(hard)
    use = f"use -np <= {most}, or raise" if most >= 1 else "raise"
    return (
        f"-np {np_} needs about {need} open file descriptors in the launcher ({per_worker} per "
        f"worker for {why}, and {fixed} of its own), more than this process may open: "
        f"{soft} (RLIMIT_NOFILE, `ulimit -n`; its hard limit is {hard_text}); {use} the "
        f"limit (`ulimit -n {need}` in the shell that runs the launcher)"
    )


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
        # Compared with None, not `or`: 0 (no bound) is a value of its own.
        args.stall_timeout = _env_seconds(parser, ENV_STALL_TIMEOUT, _stall_seconds)
        if args.stall_timeout is None:
            args.stall_timeout = DEFAULT_STALL_TIMEOUT_S
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
        shared = sorted({g for g in args.gpus if args.gpus.count(g) > 1})
        if shared:
            # Each worker would get its own CUDA_VISIBLE_DEVICES naming one GPU:
            # two workers on one device (NCCL refuses a second rank on a
            # device; without NCCL both fill its memory).
            parser.error(
                f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')} lists GPU "
                f"{', '.join(shared)} more than once: {args.np} workers would share it; list "
                "each GPU once, or use --cpu for CPU workers"
            )
    else:
        args.np = 1 if args.np is None else args.np
        args.gpus = None
    # Checked before anything starts: it failed midway with "Too many open
    # files" (from free_ports, or starting worker k of N).
    shortfall = descriptor_shortfall(args.np, args.horovod)
    if shortfall:
        parser.error(shortfall)
    return args
