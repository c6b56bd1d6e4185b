"""Files written whole: a writer fills a temporary name beside the file and
renames it into place, so a write that fails or is interrupted leaves no
half-written file at the path (which a later run would take as data)."""

import contextlib
import glob
import os
import re
import uuid


@contextlib.contextmanager
def written_whole(path, what="path"):
    """Yields the temporary path to write instead of `path` (a str or
    os.PathLike); once the block finishes, the file there replaces `path`.
    An error or interrupt in the block removes the temporary file and
    leaves `path` as it was (absent, or its previous file). `what` names
    the argument in errors."""
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str):
        raise TypeError(f"{what} must be a file path (a str); got {type(path).__name__} "
                        f"{path!r}")
    if not path:
        raise ValueError(f"{what} must name a file; got an empty string")
    if os.path.isdir(path):
        raise IsADirectoryError(f"{what}={path!r} is a directory; give the path of a file")
    # The directory as given, not normalized: the rename below resolves
    # `path` as the kernel does, so "new/" (a trailing separator) and
    # "missing/../f" (abspath made both look fine) failed only there, after
    # the whole file was written, naming the temporary file.
    directory, name = os.path.split(path)
    if name in ("", os.curdir, os.pardir):
        raise IsADirectoryError(f"{what}={path!r} names a directory (it ends with "
                                f"{name or os.sep!r}); give the path of a file")
    directory = directory or os.curdir
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"{what}={path!r}: its directory {directory!r} does not exist "
                                f"(or is not a directory)")
    # Absolute (the process may change its directory meanwhile), with its
    # ".." kept for the kernel to resolve.
    directory = os.path.join(os.getcwd(), directory)
    _remove_dead_writers(directory, name)
    tmp = os.path.join(directory, f".{name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(directory, name))
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def _remove_dead_writers(directory, name):
    """Deletes the temporary files of writers of `name` in `directory` whose
    process is gone (killed mid-write: its own cleanup never ran, and each
    such kill left a file nothing removed); those of live processes stay."""
    pattern = re.compile(r"\." + re.escape(name) + r"\.tmp-([0-9]+)-[0-9a-f]{8}")
    for tmp in glob.glob(os.path.join(glob.escape(directory), f".{glob.escape(name)}.tmp-*")):
        match = pattern.fullmatch(os.path.basename(tmp))
        if match is None or not os.path.isfile(tmp) or os.path.islink(tmp):
            continue
        if writer_gone(match.group(1)):
            with contextlib.suppress(OSError):
                os.remove(tmp)


def writer_gone(pid):
    """Whether the process `pid` (the digits a temporary name holds) that
    wrote a temporary file or directory has exited: its leftovers may go.
    A live process, or one this user cannot signal, keeps them."""
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (ValueError, OverflowError, PermissionError):
        pass
    return False

