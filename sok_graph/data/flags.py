"""argparse flag types the example scripts share (`type=` of add_argument):
each refuses a value the script cannot run with when the flags are parsed,
with argparse's message naming the flag. Without them, 0 or a negative
count trained nothing and exited 0, a negative learning rate trained up the
gradient, and the rest failed deep inside, naming no flag."""

import argparse
import os

import numpy as np


def int_at_least(lowest):
    """An integer >= `lowest`."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < lowest:
            raise argparse.ArgumentTypeError(
                f"expected an integer >= {lowest}; got {text!r}")
        return value
    return parse


def names_from(known):
    """A comma-separated list of names, each one of `known` (a tuple), as
    a list."""
    def parse(text):
        names = [n for n in text.split(",") if n]
        unknown = [n for n in names if n not in known]
        if not names or unknown:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated names from {', '.join(known)}; got {text!r}")
        return names
    return parse


def positive_number(text):
    """A finite number > 0 (a learning rate: 0 trains nothing, a negative
    one trains up the gradient, NaN fails later)."""
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not np.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a finite number > 0; got {text!r}")
    return value


def writable_directory(text):
    """A directory that exists or can be made, and can be written (one that
    was a file, empty or read-only failed late: in os.makedirs, in a
    writer, or after training, in the dump)."""
    if not text:
        raise argparse.ArgumentTypeError("expected a directory; got ''")
    path = os.path.abspath(text)
    if os.path.exists(path) and not os.path.isdir(path):
        raise argparse.ArgumentTypeError(f"{text!r} exists and is not a directory")
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise argparse.ArgumentTypeError(f"{text!r} cannot be made: {existing!r} is not a "
                                         f"directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text!r} cannot be written: {existing!r} is not "
                                         f"writable")
    return text
