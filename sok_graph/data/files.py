"""Files written whole: a writer fills a temporary name beside the file and
renames it into place, so a write that fails or is interrupted leaves no
half-written file at the path (which a later run would take as data)."""

import contextlib
import os
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
    directory, name = os.path.split(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"{what}={path!r}: its directory {directory!r} does not exist "
                                f"(or is not a directory)")
    tmp = os.path.join(directory, f".{name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
