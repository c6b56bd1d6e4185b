"""sok.dump / sok.load / sok.incremental_model_dump: tables with their
optimizer state on disk.

Layout of a dump directory:
  manifest.json           format version, variables (name, kind, dim, rows,
                          dtype of the rows, files and their CRC-32s),
                          optimizer (algorithm, step, slots),
                          named_alike (tables of one name, told apart by their
                          places in the list), and a CRC-32 of all that
  <var>.keys              int64 keys (row numbers for a sok.Variable)
  <var>.values            rows [rows, dim] in the table's dtype (float32,
                          float64, float16 or bfloat16; the manifest's
                          "dtype", and per file "dtypes")
  <var>.timestamps/.frequencies   per-key metadata (dynamic tables)
  <var>.slot.<name>       optimizer slot rows, aligned with the keys
  <var>.filter.keys/.filter.counts   an admission filter's counts (dynamic
                          tables with min_count; sok_graph/tables/admission.py):
                          keys waiting to enter, or sketch counter indices
Every file starts with a 64-byte header: magic, format version, dtype, row
width, row count and a CRC-32 of the payload; load() checks all of them for
every file before it changes any variable, so a corrupted or truncated dump
loads nothing. load() converts rows to the loading table's dtype, and refuses
(before any table changes) a finite value that would become infinite there.

Format version 1 throughout: dumps once widened or narrowed every table to
float32 (dtype code 1) and still load as float32 rows. Rows of other dtypes
have codes of their own (3 to 5), which a reader that predates them refuses,
naming the code, instead of misreading; a float32 dump is byte for byte what
it was.

A dump is written into a temporary directory next to `path` and renamed into
place; an existing dump is moved aside first and deleted last. If the
process dies in between, load() finds the previous dump under its
moved-aside name, so an interrupted dump never costs the previous one. A
name the file system would refuse (a file's, from a variable's name, or the
directory's with its siblings' suffix) is a ValueError before anything is
written.
"""

import contextlib
import errno
import functools
import glob
import json
import os
import re
import shutil
import struct
import time
import uuid
import warnings
import weakref
import zlib

import numpy as np
import tensorflow as tf

from sok_graph import context, placement
from sok_graph.communication import agreement
from sok_graph.data.files import writer_gone
from sok_graph.tables import (dimension_of, keras_weights, key_metadata_of, kind_of,
                              overflow_at, replica_shards)
from sok_graph.tables.static import is_sok_variable
from sok_graph.placement import owned_mask
from sok_graph.ops import dynamic as dynamic_ops
from sok_graph.optimization.native_slots import refuse_slots_held_elsewhere, slot_state_for
from sok_graph.optimization.wrapper import PENDING_OPTIMIZER_STATE, wrappers_with_slots

FORMAT_VERSION = 1
_MAGIC = b"SOKGDUMP"
_HEADER = struct.Struct("<8sIIQQI28x")  # magic, version, dtype, width, rows, crc32
_HEADER_FIELDS = struct.calcsize("<8sIIQQI")  # the rest is reserved, written as zeros
# The dtype codes of file headers. Rows are written in their table's dtype;
# codes 3-5 came later (every table used to be written as float32).
_FLOATS = {"float32": np.dtype(np.float32), "float64": np.dtype(np.float64),
           "float16": np.dtype(np.float16), "bfloat16": np.dtype(tf.bfloat16.as_numpy_dtype)}
_DTYPES = {1: _FLOATS["float32"], 2: np.dtype(np.int64), 3: _FLOATS["float64"],
           4: _FLOATS["float16"], 5: _FLOATS["bfloat16"]}
_CODES = {dtype: code for code, dtype in _DTYPES.items()}
# Where a file name is longer than the file system says (os.pathconf's
# PC_NAME_MAX) or where it does not say: NAME_MAX of Linux's file systems.
_NAME_MAX = 255
# The longest suffix a dump directory's siblings add to its name
# (".old-<20 digits>-<8 hex>"; ".tmp-<pid>-<8 hex>" is shorter).
_SIBLING_SUFFIX = len(".old-") + 20 + 1 + 8


class CheckpointError(ValueError):
    """A dump is missing, corrupted, or does not fit the variables given."""


# ------------------------------------------------------------------ files

def _write_array(path, array):
    array = np.ascontiguousarray(array)
    width = 1 if array.ndim == 1 else int(array.shape[1])
    payload = array.tobytes()
    header = _HEADER.pack(_MAGIC, FORMAT_VERSION, _CODES[array.dtype], width,
                          int(array.shape[0]), zlib.crc32(payload))
    # On disk before the dump is in place: swap_into_place syncs its files.
    with open(path, "wb") as f:
        f.write(header)
        f.write(payload)
    return zlib.crc32(payload)


def _read_array(path, dtype, width, rows, crc32=None):
    """The array in `path`, after checking its header against what the
    manifest promised and its payload against the checksum; crc32, where
    the manifest recorded one, must be the file's own: a file of another
    dump (copied over, a partial restore of a backup) has a valid checksum
    of its own but is not this dump's. Errors name the file by its path."""
    name = path
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise CheckpointError(f"cannot read {path}: {e}") from e
    if len(data) < _HEADER.size:
        raise CheckpointError(f"{name} is truncated: {len(data)} bytes, shorter than its header")
    magic, version, code, got_width, got_rows, crc = _HEADER.unpack_from(data)
    if any(data[_HEADER_FIELDS:_HEADER.size]):
        raise CheckpointError(f"{name} is corrupted: reserved header bytes are not zero")
    if magic != _MAGIC:
        raise CheckpointError(f"{name} is not a sok_graph dump file (bad magic)")
    if version != FORMAT_VERSION:
        raise CheckpointError(f"{name} has format version {version}; this sok_graph reads "
                              f"version {FORMAT_VERSION}")
    dtype = np.dtype(dtype)
    # The code first: numpy takes None for float64, so an unknown code
    # compared equal to a float64 the manifest promised.
    if code not in _DTYPES or _DTYPES[code] != dtype or got_width != width \
            or got_rows != rows:
        got = _DTYPES[code].name if code in _DTYPES else f"of dtype code {code}"
        raise CheckpointError(f"{name} holds {got_rows}x{got_width} {got}; the manifest says "
                              f"{rows}x{width} {dtype.name}")
    payload = data[_HEADER.size:]
    expected = rows * width * dtype.itemsize
    if len(payload) != expected:
        raise CheckpointError(f"{name} is truncated or padded: {len(payload)} payload bytes, "
                              f"expected {expected}")
    if zlib.crc32(payload) != crc:
        raise CheckpointError(f"{name} is corrupted: checksum mismatch")
    if crc32 is not None and crc != crc32:
        raise CheckpointError(f"{name} is not the file this dump wrote (its checksum is not "
                              f"the one the manifest recorded): files of different dumps are "
                              f"mixed in {os.path.dirname(path)}")
    array = np.frombuffer(payload, dtype=dtype)
    return array.reshape(rows, width) if width > 1 or dtype.kind != "i" else array


# ------------------------------------------------------------ tensors in/out

def _run(fetches, feed_dict=None):
    """Values of tensors: eagerly, or in the default Session in graph mode."""
    if tf.executing_eagerly():
        return tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, fetches)
    sess = tf.compat.v1.get_default_session()
    if sess is None:
        raise RuntimeError(_NO_SESSION)
    return sess.run(fetches, feed_dict=feed_dict)


class _Feeds:
    """The arrays a load hands its ops as tensors. In graph mode an array of
    _FED_BYTES or more is a placeholder, fed when the Session runs the load:
    as a constant it went into the graph, which grew by the tables' size at
    every load and could not hold a table of 2 GB or more at all
    (TensorFlow's "Cannot create a tensor proto whose content is larger
    than 2GB"). Smaller arrays stay constants, whose values the tables'
    checks read when the ops are built."""

    def __init__(self):
        self.feed_dict = {}

    def tensor(self, array):
        if array is None:
            return None
        if tf.executing_eagerly() or np.asarray(array).nbytes < _FED_BYTES:
            return tf.convert_to_tensor(array)
        array = np.asarray(array)
        fed = tf.compat.v1.placeholder(tf.as_dtype(array.dtype), array.shape)
        self.feed_dict[fed] = array
        return fed


_FED_BYTES = 1 << 16


_NO_SESSION = ("sok.dump / sok.load (and incremental_model_dump without sess=) in graph mode "
               "run in the default Session: call them inside `with sess.as_default():`")


@contextlib.contextmanager
def _session_graph(sess=None):
    """In graph mode: `sess` (default: the default Session), with its graph
    (where the variables live) the default graph, whatever graph was. A
    finalized graph (tf.compat.v1.train.MonitoredTrainingSession's) takes
    new ops too, as the serving export's reads do (serving/sources.py):
    TensorFlow's bare "Graph is finalized and cannot be modified" was all a
    dump, a load or an incremental dump there gave."""
    if sess is None:
        sess = tf.compat.v1.get_default_session()
        if sess is None:
            raise RuntimeError(_NO_SESSION)
    graph = sess.graph
    unfinalize = getattr(graph, "_unsafe_unfinalize", None)
    refinalize = graph.finalized and unfinalize is not None
    if refinalize:
        unfinalize()
    try:
        with graph.as_default():
            yield sess
    finally:
        if refinalize:
            graph.finalize()


def _graph_of_tables(variables):
    """The tf.Graph that holds the first of `variables` made in one (a
    table of a Session's graph); None where they are eager tables (or no
    list of tables: the function's own checks name it)."""
    if not isinstance(variables, (list, tuple)):
        variables = [variables]
    for var in variables:
        try:
            # An eager handle has no graph (AttributeError); a table made
            # in a tf.function lives outside it (init_scope).
            graph = var.handle.graph
        except Exception:  # noqa: BLE001 - not a table: its check comes later
            continue
        if isinstance(graph, tf.Graph) and not getattr(graph, "building_function", False):
            return graph
    return None


def _runs_in_a_session(variables):
    """Whether a call on `variables` builds ops for a Session to run: in
    graph mode, or eagerly (TF 2.x) for tables of a tf.Graph, run by the
    default Session (`with sess.as_default():` without the graph entered,
    where the eager path failed with TensorFlow's "<tf.Tensor ...> is out
    of scope", naming neither the table nor the Session)."""
    if not tf.executing_eagerly():
        return True
    graph = _graph_of_tables(variables)
    if graph is None:
        return False
    sess = tf.compat.v1.get_default_session()
    if sess is None or sess.graph is not graph:
        raise RuntimeError(
            f"the tables given live in a tf.Graph (not eagerly), and "
            f"{'no Session is the default' if sess is None else 'the default Session runs another graph'}"
            f": call inside `with sess.as_default():` for the Session of that graph")
    return True


def _in_session_graph(fn):
    """`fn` built in graph mode in the default Session's graph
    (_session_graph), also eagerly for tables of a Session's graph
    (_runs_in_a_session). Each call adds its ops once more. fn takes the
    tables as its second argument."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        variables = args[1] if len(args) > 1 else next(iter(
            v for k, v in kwargs.items() if k.endswith("_vars")), None)
        if not _runs_in_a_session(variables):
            return fn(*args, **kwargs)
        with _session_graph():
            return fn(*args, **kwargs)
    return wrapper


def checked_path(path, what="path"):
    """`path` as a str: a str, an os.PathLike, bytes (decoded as the file
    system does) or an eager scalar tf.string tensor; anything else, or an
    empty path, is an error naming `what` (bytes failed midway with "can't
    concat str to bytes", other types with os's message naming no argument,
    and "" was taken as the current directory)."""
    if isinstance(path, tf.Tensor) and path.dtype == tf.string and path.shape.rank == 0 \
            and hasattr(path, "numpy"):
        path = path.numpy()
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not isinstance(path, str):
        raise TypeError(f"{what} must be a str or a path (a directory); got "
                        f"{type(path).__name__} {path!r}")
    if not path:
        raise ValueError(f"{what} must name a directory; got an empty string (for the current "
                         f"directory's subdirectory, give its name)")
    if ".." in path.replace(os.sep, "/").split("/"):
        # "link/../x" is, to the file system, x beside the link's target;
        # os.path.abspath read it as ./x, and a dump there replaced another
        # model's (a load read it). The directories above resolved as the
        # file system does; the last name stays (a link there is refused).
        head, tail = os.path.split(path.rstrip("/") or path)
        path = os.path.realpath(path) if tail in ("..", ".", "") else \
            os.path.join(os.path.realpath(head or os.curdir), tail)
    return path


def var_name(var):
    """A table's name without TensorFlow's ":0" suffix (eager static tables)."""
    name = var.name[:-2] if var.name.endswith(":0") else var.name
    return name


def _file_stem(name):
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def table_stem(name):
    """A file name for a variable's name (other characters become '_'; names
    that are only dots too): what sok.Saver names a table's directory by."""
    stem = _file_stem(name)
    return stem if stem.strip(".") else "_" * max(len(stem), 1)


def _manifest_variables(path):
    """The sorted variable names of the manifest of the dump at `path` (or of
    the one an interrupted dump moved aside); CheckpointError where there is
    no manifest, OSError / ValueError / KeyError / TypeError where it does
    not read."""
    with open(os.path.join(_dump_dir(path), "manifest.json"), "rb") as f:
        manifest = json.loads(f.read().decode("utf-8"))
    return sorted(manifest["variables"])


def dumped_names(path):
    """The variable names of the sok_graph dump at `path` (or the one an
    interrupted dump moved aside), [] where there is none or its manifest
    does not read."""
    try:
        return _manifest_variables(path)
    except (CheckpointError, OSError, ValueError, KeyError, TypeError):
        return []


def unreadable_manifest(path):
    """Why the dump directory `path` cannot be read although it looks like
    one (its manifest.json does not parse, or it is missing beside the
    dump's data files), or None: dumped_names' [] said "no dump" for a
    damaged one."""
    if not os.path.isdir(path):
        return None
    try:
        _manifest_variables(path)
    except CheckpointError:  # no manifest, none moved aside
        data = sorted(f for f in os.listdir(path) if f.endswith((".keys", ".values")))
        return f"its manifest.json is missing beside {data[:4]}" if data else None
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"its manifest.json does not read ({type(e).__name__}: {e})"
    return None


def _unique_stem(stem, parts, used):
    """`stem`, or stem-1, stem-2, ...: the first whose files (stem.part) no
    earlier variable of the dump has taken. Different names can sanitize to
    one stem ("a/b", "a_b"), and some file systems ignore case."""
    candidate, k = stem, 0
    while any(f"{candidate}.{p}".lower() in used for p in parts):
        k += 1
        candidate = f"{stem}-{k}"
    used.update(f"{candidate}.{p}".lower() for p in parts)
    return candidate


def check_float_table(var, what):
    """TypeError naming `what` and the variable unless its rows are of a
    float dtype a dump holds: a sok.Variable of int32 or bool rows was
    dumped as float32 (int32 values beyond 2^24 rounded) and loaded by
    truncating (0.5 became 0, 1e10 became -2^31, any nonzero True)."""
    dtype = tf.as_dtype(var.dtype).base_dtype
    if dtype.name not in _FLOATS:
        raise TypeError(f"{what}: variable '{var_name(var)}' has {dtype.name} rows; sok.dump, "
                        f"sok.load and the Saver take tables of {', '.join(_FLOATS)} rows")


def _check_vars(variables, what):
    """{file name: variable}. Variables are named by their names; a name that
    repeats (e.g. eager tf.Variables are all "Variable") gets _1, _2, ... in
    list order, so load() matches them when given the same list."""
    names = {}
    if is_sok_variable(variables):
        variables = [variables]  # SOK takes one variable or a list
    if isinstance(variables, dict):
        # Iterating a dict gives its keys: "got str" named no dict.
        raise TypeError(f"{what} must be a sok variable or a list of them (files are named "
                        f"by the variables' names); got a dict: pass list(....values())")
    for v in list(variables):
        if not is_sok_variable(v):
            raise TypeError(f"{what} must hold sok.Variable or sok.DynamicVariable objects; got "
                            f"{type(v).__name__}")
        check_float_table(v, what)
        if any(v is seen for seen in names.values()):
            raise ValueError(f"{what} holds variable '{var_name(v)}' twice")
        base = name = var_name(v)
        k = 0
        while name in names:
            k += 1
            name = f"{base}_{k}"
        names[name] = v
    _check_world(names, what)
    return names


def _check_world(variables, what):
    """placement.check_world of every shard of each variable."""
    comm = context.active()
    for name, var in variables.items():
        for shard in replica_shards.shards_of(var):
            placement.check_world(comm, shard, name, what)


def _optimizer_described(optimizer):
    """What workers compare of sok.dump's / sok.load's optimizer: None, or
    its algorithm and slot names (a refusal's class where slot_state_for
    refuses it: raised after the agreement, on every worker)."""
    if optimizer is None:
        return None
    try:
        state = slot_state_for(optimizer)
        return [state.algorithm, [name for name, _ in state.slot_specs()]]
    except Exception as e:  # noqa: BLE001 (raised again after the agreement)
        return ["refused", type(e).__name__]


def _same_on_every_worker(variables, argument, what, path=None, optimizer=None):
    """ValueError on every worker process unless each passed the same
    variables (names, kinds and dimensions, in the same order) and, where
    given, the same `path` (as an absolute path), before any other
    collective: a dump gathers each variable's rows under its place in the
    list, so workers passing [a, b] and [b, a] wrote a dump whose table 'a'
    held rank 1's rows of b, and a load of [a, b] on one worker and [a] on
    another left that one's shard of b as it was, both without an error.
    Only rank 0 writes a dump: another worker's path was never written, and
    its sok.dump returned as if it had been. The optimizer too (given or
    not, its algorithm and slots): a load given it on one worker only put
    that worker's slots and step back and left the others' as they were,
    and such a dump failed in TensorFlow's collectives, naming nothing."""
    listed = [[name, kind_of(var), dimension_of(var)] for name, var in variables.items()]
    every = _every_workers([listed, None if path is None else os.path.abspath(path),
                            _optimizer_described(optimizer)])
    if every is None:
        return
    told = _told_if_they_differ(every, 0, lambda given: [v[0] for v in given[0]])
    if told:
        raise ValueError(
            f"{what}: the workers passed different {argument} ({told}); every worker must "
            f"pass the same variables, in the same order (names, kinds and dimensions "
            f"alike)")
    told = _told_if_they_differ(every, 1, lambda given: repr(given[1]))
    if told:
        raise ValueError(
            f"{what}: the workers passed different paths ({told}); every worker must pass "
            f"the same path (rank 0 writes the dump there for all of them)")
    told = _told_if_they_differ(every, 2, lambda given: (
        "no optimizer" if given[2] is None else f"{given[2][0]} {given[2][1]}"))
    if told:
        raise ValueError(
            f"{what}: the workers passed different optimizer arguments ({told}); every "
            f"worker must pass the same optimizer (its slots and step are every worker's "
            f"rows), or none")


def _every_workers(value):
    """Every worker process's `value` (JSON-serializable), in rank order,
    from one gather every worker makes at the same point; None in a single
    process (nothing to agree with)."""
    comm = context.active()
    if not agreement.spans_processes(comm):
        return None
    return [json.loads(text)
            for text in agreement.texts(comm, tf.executing_eagerly(), json.dumps(value))]


def _told_if_they_differ(every, index, shown):
    """"rank 0: ...; rank 1: ..." (shown(value) of each worker's value)
    where the workers' values differ at `index`, else None."""
    if all(given[index] == every[0][index] for given in every):
        return None
    return "; ".join(f"rank {rank}: {shown(given)}" for rank, given in enumerate(every))


def _same_dump_on_every_worker(manifest, path):
    """CheckpointError on every worker process unless each read the same
    dump (by its manifest's checksum): each worker reads its own files and
    keeps the rows it owns, so workers whose `path` held different dumps
    (another path given on a worker, or a host whose disk held an older
    dump) loaded a table half from one and half from the other, without
    an error. manifest: None where this worker could not read the dump
    (the refusal that follows reports it)."""
    every = _every_workers(
        None if manifest is None else [os.path.abspath(path), manifest.get("checksum")])
    if every is None or None in every:
        # A worker that could not read the dump: the agreement on its
        # refusal comes next, on every worker.
        return
    told = _told_if_they_differ(
        every, 1, lambda given: f"{given[0]!r} (manifest checksum {given[1]})")
    if told:
        raise CheckpointError(
            f"sok.load of {path}: the workers read different dumps ({told}); every worker "
            f"must read the same dump (its shard's rows come from its own copy); no worker "
            f"changed its tables")


def _named_alike(variables):
    """{name: [file names]} of the names that several of `variables` (as
    _check_vars gives them) share: those tables are told apart only by
    their places in the list."""
    groups = {}
    for name, var in variables.items():
        groups.setdefault(var_name(var), []).append(name)
    return {base: names for base, names in groups.items() if len(names) > 1}


def _check_named_alike(manifest, names, source):
    """CheckpointError where the dump holds tables of one name, told apart
    by their places in the dumped list, and load_vars does not give that
    many tables of that name: matched by place, one would get another's
    rows (two unnamed eager tables are both "Variable:0"). names: {file
    name (as _check_vars gives it): the table's own name}."""
    for base, dumped in sorted(manifest.get("named_alike", {}).items()):
        for place, name in enumerate(dumped):
            own = names.get(name)
            if own is not None and own != base:
                raise CheckpointError(
                    f"table '{own}' of load_vars would take the rows dumped as "
                    f"'{name}', which belong to table {place + 1} of the {len(dumped)} named "
                    f"'{base}' in {source}: give the tables distinct names, or load the "
                    f"tables named '{base}' with it, in the order they were dumped")
        given = [name for name in dumped if name in names]
        if given and len(given) != len(dumped):
            raise CheckpointError(
                f"{source} holds {len(dumped)} tables named '{base}', told apart only by their "
                f"places in the dumped list; load_vars holds {len(given)} of them: load all of "
                f"them, in the order they were dumped, or give the tables distinct names")


def table_arrays(var):
    """numpy arrays of one table as a dump holds them (keys sorted, rows,
    per-key metadata, admission counts; no slots), on this process: every
    worker's rows where the workers are replicas of this process, and with
    worker processes every worker must call it (an allgather)."""
    return _export(var, None)


def _slot_specs(optimizer):
    return optimizer.slot_specs() if optimizer is not None else []


def _export(var, optimizer):
    """numpy arrays of one variable: keys, values, metadata, slots. With
    several workers, every worker's rows (global ids or keys), on every
    worker, sorted by key: the files do not depend on the world size."""
    if optimizer is not None and tf.executing_eagerly():
        # Slots not made yet (no step taken) are dumped at their initial
        # values, so that a load with this optimizer always finds them.
        optimizer.create_slots(var)
    # The shards this process holds: one per worker process, or all of them
    # when the workers are the replicas of this process's MirroredStrategy.
    shards = replica_shards.shards_of(var)

    def build():
        parts = [_shard_tensors(shard, optimizer) for shard in shards]
        fetch = {k: tf.concat([p[k] for p in parts], 0) if len(parts) > 1 else parts[0][k]
                 for k in parts[0]}
        comm = context.active()
        if shards[0].placement[0] > 1 and not comm.in_process:
            fetch = {k: comm.allgather(t, name=f"sok_dump_{k.replace('.', '_')}")
                     for k, t in fetch.items()}
        return fetch

    # What the fetch holds depends on whether the optimizer has made slots.
    slotted = None if optimizer is None else tuple(optimizer.has_slots(s) for s in shards)
    out = _run(_built_once(("export", slotted), (var, optimizer), build))
    state = filter_arrays(shards[0].admission, out)
    order = np.argsort(out["keys"], kind="stable")
    arrays = {k: np.asarray(v)[order] for k, v in out.items()}
    arrays.update(state)
    return arrays


def filter_arrays(admission, fetched):
    """The state of an admission filter as a dump holds it, taken out of
    `fetched` (filter_tensors' values, of one shard or concatenated over
    shards): the counts merged, with what they are keyed by, and the call
    count. sok.dump and sok.Saver share it."""
    arrays = {}
    counts = {k: np.asarray(fetched.pop(k)) for k in _FILTER_PARTS if k in fetched}
    calls = fetched.pop(FILTER_CALLS, None)
    if counts:
        arrays.update(_merged_counts(counts["filter.keys"], counts["filter.counts"]))
        arrays[FILTER_KIND] = admission.description()
    if calls is not None:
        # One counter per shard, each counting the calls of its own reads
        # (every worker's shard is read once a step): the most of them.
        arrays[FILTER_CALLS] = int(np.max(calls))
    return arrays


# An admission filter's counts: entries (keys, or sketch counter indices)
# and their counts, in arrays of their own length.
_FILTER_PARTS = ("filter.keys", "filter.counts")
# The filter those counts belong to (a dict, written into the manifest).
FILTER_KIND = "filter"
# A drawing filter's call counter (an int, written into the manifest).
FILTER_CALLS = "filter_calls"
# Parts of a variable's arrays that are no file of the dump.
_MANIFEST_PARTS = (FILTER_KIND, FILTER_CALLS)


def _merged_counts(entries, counts):
    """The counts of every shard as one sorted list. A key is counted by its
    owner only, so a key's entry comes from one shard. A sketch's counter
    index is in every shard, each counting the keys its shard owns: the
    merged counter is the largest of them. That bounds the count of every
    key from above, as a count-min sketch must (a key can enter early, never
    late), and, since a load gives every shard the merged counters, a dump
    after a load writes them again unchanged; their sum was multiplied by
    the number of shards at each dump-and-load."""
    merged, where = np.unique(entries, return_inverse=True)
    largest = np.zeros(merged.shape, np.int64)
    np.maximum.at(largest, where, counts)
    return {"filter.keys": merged, "filter.counts": largest}


def _shard_tensors(var, optimizer):
    """Tensors of one shard's keys (global ids or keys), values, metadata
    (the table's key_metadata, each a file of its own), admission counts
    and slots."""
    keys, rows, metadata = var.read_all()
    fetch = {"keys": tf.cast(keys, tf.int64), "values": rows}
    fetch.update(metadata)
    fetch.update(filter_tensors(var))
    if optimizer is not None and optimizer.has_slots(var):
        for name, init in _slot_specs(optimizer):
            fetch["slot." + name] = var.read_slot(optimizer.slot(var, name), keys, init)
    elif optimizer is not None:
        # A graph whose optimizer never trained this table has no slots
        # for it (an eager dump makes them, see _export): their initial
        # values, so that a load with this optimizer finds every slot (a
        # Session's dump of a trained and an untrained table could not be
        # loaded back with the same arguments).
        for name, init in _slot_specs(optimizer):
            fetch["slot." + name] = tf.fill(tf.shape(rows), tf.cast(init, rows.dtype))
    return fetch


def filter_tensors(var):
    """Tensors of the state of shard `var`'s admission filter (none where it
    has none): its counts (entries, counts) and the call count of its
    draws ([1]). sok.dump and sok.Saver share it."""
    fetch = {}
    admission = var.admission
    if admission is not None and admission.counting:
        fetch["filter.keys"], fetch["filter.counts"] = admission.export()
    if admission is not None and admission.draws:
        fetch[FILTER_CALLS] = admission.calls()
    return fetch


def _parts(var, optimizer):
    """The parts (file name suffixes) a dump of `var` may have: keys, values,
    its per-key metadata, admission counts and the optimizer's slots."""
    shard = replica_shards.shards_of(var)[0]
    parts = ["keys", "values"] + list(key_metadata_of(shard))
    admission = shard.admission
    if admission is not None and admission.counting:
        parts += list(_FILTER_PARTS)
    return parts + ["slot." + name for name, _ in _slot_specs(optimizer)]


def _built_once(key, objects, build):
    """build(): eagerly its tensors; in graph mode the ops it builds, once
    per graph, `key` and `objects` (the tables, optimizer, ... the ops read,
    compared by identity): a TF1 job that dumps (or exports increments)
    every N steps added ~110 ops to its graph at each call, without bound,
    each a graph extension for the Session. Held by weak references (the
    graph holds the ops and the objects hold the graph: strong ones would
    keep every graph alive)."""
    if tf.executing_eagerly():
        return build()
    objects = [o for o in objects if o is not None]
    built = _BUILT_ONCE.setdefault(tf.compat.v1.get_default_graph(), {})
    index = key + tuple(id(o) for o in objects)
    entry = built.get(index)
    if entry is not None and all(r() is o for r, o in zip(entry[0], objects)):
        return tf.nest.map_structure(lambda r: r(), entry[1])
    tensors = build()
    built[index] = ([weakref.ref(o) for o in objects],
                    tf.nest.map_structure(weakref.ref, tensors))
    return tensors


# graph -> {key: ([weak references to the objects], the tensors' weak
# references)}: _built_once's ops.
_BUILT_ONCE = weakref.WeakKeyDictionary()


@_in_session_graph
def dump(path, dump_vars, optimizer=None):
    """Writes the variables (keys, rows, per-key metadata) and, when given,
    the optimizer's slots and step to the directory `path`. `optimizer`: an
    OptimizerWrapper, or a native optimizer (Keras OptimizerV2,
    tf.compat.v1.train) that updated sok variables itself or inside
    sok.OptimizerScope (optimization/native_slots.py says whose slots a
    variable's are)."""
    path = checked_path(path)
    if os.path.abspath(path) == os.path.abspath(os.getcwd()):
        # A dump replaces `path` by renames: the process would be left in
        # a deleted directory (later relative paths fail). A directory of
        # the user's files is refused as such, as anywhere.
        _check_replaceable(os.path.abspath(path))
        raise ValueError(f"path={path!r} is the current directory, which a dump would replace "
                         f"(the process would be left in a deleted directory): give a "
                         f"subdirectory")
    variables = _check_vars(dump_vars, "dump_vars")
    _same_on_every_worker(variables, "dump_vars", f"sok.dump to {path}", path, optimizer)
    optimizer = None if optimizer is None else slot_state_for(optimizer)
    if optimizer is not None:
        refuse_slots_held_elsewhere(optimizer, variables, "sok.dump")
    # Names too long for the file system are refused on every worker,
    # before anything is read or written, with the names write_dump gives
    # (a stem that repeats gets a suffix): a name refused only where the
    # files are written would leave the other workers waiting for it.
    used, file_names = set(), {}
    for name, var in variables.items():
        parts = _parts(var, optimizer)
        stem = _unique_stem(_file_stem(name), parts, used)
        file_names[name] = [f"{stem}.{part}" for part in parts]
    check_name_lengths(path, file_names)
    tables = {name: (kind_of(var), _export(var, optimizer)) for name, var in variables.items()}
    optimizer_entry = None
    if optimizer is not None:
        step = _run(optimizer.iterations)
        optimizer_entry = {"algorithm": optimizer.algorithm, "step": int(step),
                           "slots": [n for n, _ in _slot_specs(optimizer)],
                           "formulas": optimizer.slot_formulas}
    # With several workers, each holds every row now; the first writes the
    # dump (atomically, as with one) and the others wait until it is there.
    # Replicas of one process are written once, by that process.
    comm = context.active()
    world_size = 1 if comm is None else comm.world_size
    failed = None
    if comm is None or comm.in_process or comm.rank == 0:
        try:
            write_dump(path, tables, optimizer_entry, world_size=world_size,
                       named_alike=_named_alike(variables))
        except Exception as e:  # noqa: BLE001 (told to every worker, then raised)
            failed = e
    # The wait is an agreement: every worker learns whether rank 0 wrote the
    # dump. A dump rank 0 refused (a directory of the user's files at
    # `path`, a file where its parent must be) returned on the others as if
    # written, and their next collective met another of rank 0's.
    _, failures = agreement.agree(comm, tf.executing_eagerly(), error=failed)
    agreement.raise_shared(comm, failed, failures, f"sok.dump to {path}", _DUMP_ERRORS,
                           outcome="; no dump was written there (a dump it held is unchanged)")


# The kinds of a dump's refusals that another worker raises as they are
# (anything else as a RuntimeError naming the class).
_DUMP_ERRORS = (CheckpointError, ValueError, TypeError, OSError, FileExistsError,
                FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)


def write_dump(path, tables, optimizer_entry=None, world_size=1, named_alike=None,
               save_id=None):
    """Writes a dump directory from numpy arrays: tables maps a variable name
    to (kind, {"keys", "values", [metadata], ["slot.<name>"]: array}).
    Written aside and swapped in, so `path` always holds a whole dump.
    named_alike: {name: [its tables' file names]} for names several tables
    share, which load checks (_check_named_alike). save_id: the number
    the workers of one save agreed on, recorded for a reader to compare
    (sok.Saver's shards, one per worker)."""
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    try:
        os.makedirs(parent, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as e:
        # os's "[Errno 17] File exists" named neither the dump nor the cause.
        raise FileExistsError(
            f"cannot write a dump at {path!r}: a file stands where its parent directories "
            f"must be ({e.filename!r} or a directory above it is not a directory)") from e
    with writers_take_turns(parent):
        _write_dump_swapped(path, parent, tables, optimizer_entry, world_size, named_alike,
                            save_id)


@contextlib.contextmanager
def writers_take_turns(parent, reader=False):
    """Dumps into one directory run one at a time, also from several
    processes (an exclusive flock on the directory, released when the
    holder exits or dies), so two writers to one path never swap at once:
    the later dump replaces the earlier one. reader=True: a load's turn
    (a shared flock): loads run together, never while a dump there writes
    or swaps (a load overlapping a dump read files of both and was refused
    as "files of different dumps are mixed", as if the dump were damaged).
    A reader that cannot lock the directory (it does not exist: no dump
    there, which the load then says) reads without the lock."""
    try:
        import fcntl
    except ImportError:  # no flock on this platform: writers are not ordered
        yield
        return
    fd = None
    try:
        fd = os.open(parent, os.O_RDONLY)
    except OSError:
        if not reader:
            raise
    # (The body runs outside the except clauses: its own errors, "no sok_graph
    # dump at ...", do not come chained to this one.)
    if fd is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH if reader else fcntl.LOCK_EX)
        except OSError as e:
            # A file system without locks (NFS mounted nolock: ENOLCK; some
            # FUSE mounts: EOPNOTSUPP) read and wrote dumps before they were
            # ordered; they still do, unordered.
            os.close(fd)
            fd = None
            if not reader:
                tf.get_logger().warning(
                    "sok.dump: %s cannot be locked (%s); dumps into it from several "
                    "processes at once are not ordered", parent, e)
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)  # releases the lock


def _write_dump_swapped(path, parent, tables, optimizer_entry, world_size, named_alike,
                        save_id=None):
    _check_replaceable(path)
    # Every file's name first: one the file system refuses raises here,
    # before anything is written.
    stems, used = {}, set()
    for name, (kind, arrays) in tables.items():
        stems[name] = _unique_stem(_file_stem(name), list(arrays), used)
    check_name_lengths(path, {name: [f"{stems[name]}.{part}" for part in arrays
                                     if part not in _MANIFEST_PARTS]
                              for name, (kind, arrays) in tables.items()})
    remove_dead_writers_tmp(path)
    tmp = staging_dir(path)
    os.makedirs(tmp)
    try:
        # world_size is informational: load() redistributes rows to any number
        # of workers.
        manifest = {"format_version": FORMAT_VERSION, "world_size": int(world_size),
                    "variables": {}}
        for name, (kind, arrays) in tables.items():
            stem = stems[name]
            files, crcs, dtypes = {}, {}, {}
            for part, array in arrays.items():
                if part in _MANIFEST_PARTS:
                    continue
                if part in _INT64_PARTS:
                    array = np.asarray(array, np.int64)
                else:
                    array = _float_rows(array)
                    dtypes[part] = array.dtype.name
                fname = f"{stem}.{part}"
                crcs[part] = _write_array(os.path.join(tmp, fname), array)
                files[part] = fname
            manifest["variables"][name] = {
                "kind": kind,
                "dim": int(np.shape(arrays["values"])[1]),
                "rows": int(np.shape(arrays["keys"])[0]),
                "dtype": dtypes["values"],  # the table's
                "dtypes": dtypes,  # each file of rows (values, slots)
                "files": files,
                "crc32": crcs,  # each file's, so files of another dump are told apart
            }
            if "filter.keys" in arrays:
                manifest["variables"][name]["filter"] = dict(
                    arrays[FILTER_KIND], rows=int(np.shape(arrays["filter.keys"])[0]))
            if FILTER_CALLS in arrays:
                manifest["variables"][name][FILTER_CALLS] = int(arrays[FILTER_CALLS])
        if optimizer_entry is not None:
            manifest["optimizer"] = optimizer_entry
        if named_alike:
            manifest["named_alike"] = named_alike
        if save_id is not None:
            manifest["save_id"] = float(save_id)
        manifest["checksum"] = _manifest_checksum(manifest)
        with open(os.path.join(tmp, "manifest.json"), "w") as f:
            json.dump(manifest, f, indent=1, sort_keys=True)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        full = no_room_error(e, path, "sok.dump")
        if full is not None:
            raise full from e
        raise
    swap_into_place(tmp, path)


# Parts of a dump that hold integers (keys, per-key metadata, admission
# counts); every other part holds rows.
_INT64_PARTS = ("keys", "timestamps", "frequencies", "filter.keys", "filter.counts")


def _float_rows(array):
    """Rows to write: in their own dtype where it has a dtype code (a
    table's float32, float64, float16 or bfloat16), else as float32."""
    array = np.asarray(array)
    return array if array.dtype in _FLOATS.values() else array.astype(np.float32)


def name_max(directory):
    """The longest file name, in bytes, that the file system of `directory`
    (or of its nearest existing parent) takes."""
    directory = os.path.abspath(directory)
    while not os.path.isdir(directory) and os.path.dirname(directory) != directory:
        directory = os.path.dirname(directory)
    try:
        limit = int(os.pathconf(directory, "PC_NAME_MAX"))
    except (AttributeError, OSError, ValueError):
        return _NAME_MAX
    return limit if limit > 0 else _NAME_MAX


def _shown(name):
    """A long name as its start and its end."""
    return name if len(name) <= 64 else f"{name[:40]}...{name[-20:]}"


def check_name_lengths(path, file_names):
    """ValueError, before anything is written, where a name of the dump at
    `path` would be longer than its file system allows: the directory's own
    (with the suffix of its siblings, .old-... / .tmp-...) or a file's of
    `file_names` ({variable name: [its files' names]}). The file system's
    own error (a bare OSError, "File name too long") came midway, after
    some files were written."""
    path = os.path.abspath(path)
    limit = name_max(os.path.dirname(path))
    base = os.path.basename(path)
    if len(os.fsencode(base)) + _SIBLING_SUFFIX > limit:
        raise ValueError(
            f"path={path!r}: its last component {_shown(base)!r} is "
            f"{len(os.fsencode(base))} bytes long; a dump directory's name may have at most "
            f"{limit - _SIBLING_SUFFIX} bytes (the file system takes names of {limit} bytes, "
            f"and a dump writes beside the directory under its name + {_SIBLING_SUFFIX} "
            f"bytes)")
    for name, files in file_names.items():
        for fname in files:
            refuse_long_name(name, fname, len(os.fsencode(fname)), limit, "the dump file")


def refuse_long_name(variable, fname, size, limit, what, note=""):
    """ValueError where the name `fname` that variable `variable` gives
    `what` is over `limit` bytes; `size`: the longest name made from it
    (`note` says how)."""
    if size <= limit:
        return
    overhead = size - len(os.fsencode(_file_stem(variable)))
    raise ValueError(
        f"variable {_shown(variable)!r}: its name is {len(os.fsencode(variable))} bytes "
        f"long, which makes {what} {_shown(fname)!r}{note} {size} bytes long; the file "
        f"system takes file names of at most {limit} bytes: give the variable a name of at "
        f"most {max(limit - overhead, 0)} bytes")


def staging_dir(path):
    """The temporary sibling a writer of the directory `path` fills before
    swap_into_place (a name remove_dead_writers_tmp recognizes). A path
    named like such a copy (or a moved-aside one) is refused: a later
    write to the name before its suffix deleted it. So is a mount point:
    it cannot be renamed aside, so the whole copy was written on the
    parent's file system before a bare "Device or resource busy"."""
    name = os.path.basename(path)
    if re.search(_TMP.pattern + "$", name) or re.search(_ASIDE.pattern + "$", name):
        # A later write of the name before the suffix deleted it as its
        # own leftover.
        raise ValueError(
            f"{path!r} ends like the copies sok_graph keeps beside a dump or export while "
            f"writing it ('<name>.tmp-<pid>-<id>', '<name>.old-<time>-<id>'), which a later "
            f"write to '<name>' deletes: choose another name")
    if os.path.ismount(path):
        raise ValueError(
            f"{path!r} is a mount point: a dump or export is written beside its path and "
            f"swapped in by renaming, which a mount point refuses; write into a directory "
            f"inside it, e.g. {os.path.join(path, 'dump')!r}")
    return f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def no_room_error(error, path, what):
    """For `error` an OSError of a full file system (or quota) while `what`
    ("sok.dump", an export) was writing `path` beside its previous copy: an
    OSError that says so, names `path` and what became of the previous copy
    (a bare "No space left on device" named neither). Else None."""
    if not isinstance(error, OSError) or error.errno not in (errno.ENOSPC, errno.EDQUOT):
        return None
    before = (f"the previous one at {path!r} is unchanged" if os.path.lexists(path)
              else "nothing was left behind")
    return OSError(error.errno,
                   f"{what} to {path!r}: the file system is full ({error.strerror}); a new "
                   f"copy is written beside the previous one and swapped in, so it needs room "
                   f"for both; {before}", error.filename)


def swap_into_place(tmp, path):
    """Puts the finished directory `tmp` at `path` (both absolute, siblings):
    the previous `path` is moved aside first and deleted only once `tmp` is
    in place. Aside names sort by the time they were moved aside, so load()
    finds the newest when a writer dies between the two renames. Dumps and
    serving exports are swapped in by it. An error between the two renames
    puts the previous `path` back. Everything in `tmp` is on disk before the
    renames (fsync_tree): a crash of the machine does not leave a directory
    in place whose files were never written (a serving export's and an
    applied delta's files were only in the page cache)."""
    aside = None
    try:
        fsync_tree(tmp)
        if os.path.lexists(path):
            aside = f"{path}.old-{time.time_ns():020d}-{uuid.uuid4().hex[:8]}"
            os.rename(path, aside)
        os.rename(tmp, path)
        fsync_dir(os.path.dirname(path))
    except BaseException:
        if aside is not None and os.path.lexists(aside) and not os.path.lexists(path):
            with contextlib.suppress(OSError):
                os.rename(aside, path)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    # `path` is whole now: every moved-aside copy (this one's, or those of
    # writers killed between the renames) can go. Each loses its manifest
    # (a dump's, or an export's saved_model.pb) first, so one half deleted
    # when this process dies is never loaded.
    for old in _siblings(path, _ASIDE):
        for marker in _MARKERS:
            with contextlib.suppress(OSError):
                os.remove(os.path.join(old, marker))
        shutil.rmtree(old, ignore_errors=True)


# The file that makes a directory a dump, and a serving export's (binary, or
# a TF1 export's text form).
_MARKERS = ("manifest.json", "saved_model.pb", "saved_model.pbtxt")


def newest_aside(path, marker):
    """The copy of `path` that swap_into_place moved aside most recently
    and that holds the file `marker`, or None: where a writer died between
    its two renames, the previous `path` is there and `path` is missing."""
    aside = [d for d in _siblings(os.path.abspath(path), _ASIDE)
             if os.path.exists(os.path.join(d, marker))]
    return max(aside) if aside else None  # names sort by the time they were moved


def aside_in_place(path, markers, error, what):
    """The newest copy of `path` moved aside (holding one of `markers`)
    that stands in for `path`, or None where there is none. Only a writer
    that died between its two renames leaves such a copy as the latest
    one, and it leaves no `path` (or the empty directory a job makes before
    it reads): anything else at `path` (`what` whose marker is gone, a copy
    cut short) is refused with `error`, not replaced by an older copy
    without a word."""
    asides = [a for a in (newest_aside(path, m) for m in markers) if a is not None]
    if not asides:
        return None
    try:
        held = sorted(os.listdir(path)) if os.path.lexists(path) else []
    except OSError:  # a file, a dangling link, a directory it cannot list
        held = [os.path.basename(path)]
    if not held:
        return max(asides)
    raise error(
        f"no {what} at {path} (no {' or '.join(markers)}; it holds {held[:5]}"
        f"{'...' if len(held) > 5 else ''}): a damaged {what}? An earlier one moved aside "
        f"at {max(asides)} is not read in its place; give its path if it is the one meant")


# The siblings a dump to `path` makes: `path`.tmp-<pid>-<8 hex> while it
# writes, `path`.old-<20-digit ns time>-<8 hex> for the dump it replaces.
# Only names of exactly these forms are ever deleted or loaded: a user's
# `model.old-notes` next to a dump to `model` is the user's.
_TMP = re.compile(r"\.tmp-([0-9]+)-[0-9a-f]{8}")
_ASIDE = re.compile(r"\.old-[0-9]{20}-[0-9a-f]{8}")


def _siblings(path, pattern):
    """The directories next to `path` named `path` + a `pattern` suffix."""
    return [d for d in glob.glob(glob.escape(path) + ".*")
            if pattern.fullmatch(d[len(path):]) and os.path.isdir(d)
            and not os.path.islink(d)]


def _manifest_checksum(manifest):
    """CRC-32 of the manifest's content (canonical JSON), so that a flipped
    bit that still parses (a digit of a row count, a step) is caught too."""
    canonical = json.dumps(manifest, sort_keys=True, separators=(",", ":"))
    return zlib.crc32(canonical.encode("utf-8"))


def fsync_tree(directory):
    """Puts every file and directory under `directory` on disk (what a
    writer that did not fsync its own files, TensorFlow's SavedModel writer,
    a copy, left in the page cache), then `directory` itself."""
    for root, _, files in os.walk(directory, topdown=False):
        for name in files:
            path = os.path.join(root, name)
            if os.path.islink(path):
                continue
            with open(path, "rb") as f:
                os.fsync(f.fileno())
        fsync_dir(root)


def fsync_dir(directory):
    """Makes renames in `directory` durable (a crash of the machine, not
    only of the process, then keeps them)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def dump_manifest(path):
    """The manifest of the sok_graph dump at `path` (a JSON object with this
    format's keys), or None where path/manifest.json is no such file: a
    manifest.json of another program, a directory, a file that does not
    parse."""
    try:
        with open(os.path.join(path, "manifest.json"), "rb") as f:
            manifest = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError):
        return None
    if isinstance(manifest, dict) and "format_version" in manifest \
            and isinstance(manifest.get("variables"), dict):
        return manifest
    return None


def _check_replaceable(path):
    """A dump replaces only a previous dump (a directory with a manifest of
    this format's keys) or an empty directory: anything else at `path` is
    the user's, and stays."""
    if not os.path.lexists(path):
        return
    if os.path.isdir(path) and not os.path.islink(path):
        entries = os.listdir(path)
        if not entries:
            return
        manifest = dump_manifest(path)
        if manifest is not None:
            others = _not_of_the_dump(manifest, entries)
            if not others:
                return
            # The whole directory goes: a table a sok.Saver dumped into it,
            # or a user's file put there, went with it unnoticed.
            raise FileExistsError(
                f"path={path!r} is a sok_graph dump that also holds "
                f"{others[:5]}{'...' if len(others) > 5 else ''}, which are not the dump's "
                f"(a sok.Saver's tables, or files of yours): a dump replaces the whole "
                f"directory, so they would be deleted; move them out or choose another path")
        what = f"a directory holding {sorted(entries)[:5]}" + (
            "..." if len(entries) > 5 else "")
    else:
        what = "a symbolic link" if os.path.islink(path) else "a file"
    raise FileExistsError(
        f"path={path!r} is {what}, not a sok_graph dump (no manifest.json of one); a dump "
        f"replaces only a previous dump or an empty directory: choose another path or "
        f"remove it")


def _not_of_the_dump(manifest, entries):
    """The names among `entries` (a previous dump directory's) that are not
    files its manifest lists, nor the manifest: [] for a dump as written.
    A manifest that lists no files (of a format this reader does not know)
    claims every entry."""
    listed = {"manifest.json"}
    for entry in manifest["variables"].values():
        files = entry.get("files") if isinstance(entry, dict) else None
        if not isinstance(files, dict):
            return []
        listed.update(str(f) for f in files.values())
    return sorted(e for e in entries if e not in listed)


def remove_dead_writers_tmp(path):
    """Deletes temporary directories of dumps to `path` whose process is
    gone (killed mid-dump); those of live processes are left alone."""
    for tmp in _siblings(path, _TMP):
        if writer_gone(_TMP.fullmatch(tmp[len(path):]).group(1)):
            shutil.rmtree(tmp, ignore_errors=True)


def _dump_dir(path):
    """`path`, or the previous dump that an interrupted dump moved aside."""
    path = os.path.abspath(path)
    if os.path.exists(os.path.join(path, "manifest.json")):
        return path
    aside = aside_in_place(path, ["manifest.json"], CheckpointError, "sok_graph dump")
    if aside is None:
        raise CheckpointError(f"no sok_graph dump at {path} (no manifest.json)")
    return aside


@_in_session_graph
def load(path, load_vars, optimizer=None):
    """Restores variables (and, when given, the optimizer's slots and step)
    from a dump. Everything is read and checked before anything is assigned."""
    path = checked_path(path)
    variables = _check_vars(load_vars, "load_vars")
    _same_on_every_worker(variables, "load_vars", f"sok.load of {path}", optimizer=optimizer)
    optimizer = None if optimizer is None else slot_state_for(optimizer)
    if optimizer is not None:
        refuse_slots_held_elsewhere(optimizer, variables, "sok.load")
    slots = _slot_specs(optimizer)
    # Every shard of a table sharded over replicas has the kind, dimension
    # and global rows of the first.
    first = {name: replica_shards.shards_of(var)[0] for name, var in variables.items()}
    dims = {name: dimension_of(var) for name, var in first.items()}
    static_rows = {name: var.fixed_rows for name, var in first.items()
                   if var.fixed_rows is not None}
    # The dump read (a moved-aside one, if an interrupted dump left only
    # that), which every refusal names. A worker that cannot read it (its
    # shard's file damaged, a path its file system lacks) tells the others,
    # which would otherwise load it and go on from it alone.
    try:
        with writers_take_turns(os.path.dirname(os.path.abspath(path)), reader=True):
            directory = _dump_dir(path)
            source = f"the dump at {directory}"
            manifest, loaded = read_dump(
                directory, dims, static_rows, slot_names=[n for n, _ in slots],
                algorithm=None if optimizer is None else optimizer.algorithm,
                formulas=None if optimizer is None else optimizer.slot_formulas,
                names={name: var_name(var) for name, var in variables.items()})
    except CheckpointError as refusal:
        _same_dump_on_every_worker(None, path)
        _workers_agree(refusal, path)
        raise
    _same_dump_on_every_worker(manifest, path)
    step = None if optimizer is None else manifest["optimizer"]["step"]
    restore(variables, loaded, source, optimizer, step, workers_agree=True)


def restore(variables, loaded, source, optimizer=None, step=None, workers_agree=False):
    """Gives each table of `variables` ({name: table}) the rows of
    `loaded[name]` (arrays as read_dump or table_arrays give them, their
    keys sorted) and, with `optimizer`, its slots and `step`; refusals
    name `source`. Every check runs before any table changes, and a
    failure while replacing puts back the tables already replaced.
    sok.load and Keras weights files (tables/keras_weights.py) share it.
    workers_agree (sok.load, which every worker calls): a refusal on any
    worker process is one on every worker, before any of them changes."""
    slots = _slot_specs(optimizer)
    first = {name: replica_shards.shards_of(var)[0] for name, var in variables.items()}
    refusal = None
    try:
        for name, var in first.items():
            _as_table_dtype(loaded[name], var, f"variable '{name}'", source)
        _check_fits(variables, loaded, source)
    except CheckpointError as e:
        refusal = e
    if workers_agree:
        _workers_agree(refusal, source)
    if refusal is not None:
        raise refusal
    ops = []
    made = []
    for name, table in variables.items():
        # Optimizer state a Keras weights file left for the table's next
        # optimizer (keras_load) was for the rows these replace.
        if getattr(table, PENDING_OPTIMIZER_STATE, None) is not None:
            setattr(table, PENDING_OPTIMIZER_STATE, None)
        if optimizer is not None:
            shards = replica_shards.shards_of(table)
            new = [shard for shard in shards if not optimizer.has_slots(shard)]
            optimizer.create_slots(table)
            made += [optimizer.slot(shard, n) for shard in new for n, _ in slots]
    if made and not tf.executing_eagerly():
        # Slots this graph's optimizer had not made (it never trained the
        # table): a dynamic slot table must exist before rows go in.
        _run([slot.initializer for slot in made])
    # Tables whose replacement can fail (dynamic ones, which build a new
    # table) first: each is replaced whole or not at all (a table that
    # cannot take its rows raises with its old rows in place), and the
    # assignments in place (static tables), which cannot fail after the
    # checks above, come last, so a failing table leaves those untouched.
    order = sorted(variables.items(),
                   key=lambda item: not replica_shards.shards_of(item[1])[0].replace_can_fail)
    # Eagerly each write happens as it is made: a failure after some of
    # those tables were replaced (out of memory; every check ran above)
    # puts them back as they were, slots and metadata included.
    replaced = []
    feeds = _Feeds()
    try:
        for name, table in order:
            for var in replica_shards.shards_of(table):
                if tf.executing_eagerly() and var.replace_can_fail:
                    replaced.append((var, _run(_shard_tensors(var, optimizer))))
                ops.extend(_load_shard(var, loaded[name], optimizer, slots, feeds))
    except Exception as failure:
        unrestored = []
        for var, before in reversed(replaced):
            try:
                _put_back(var, before, optimizer)
            except Exception as e:  # noqa: BLE001 (reported with the first failure)
                unrestored.append(f"'{var_name(var)}' ({type(e).__name__}: {e})")
        if unrestored:
            raise CheckpointError(
                f"restoring from {source} failed ({type(failure).__name__}: {failure}) and "
                f"putting back "
                f"the tables it had replaced failed too for {', '.join(unrestored)}: those "
                f"tables may hold the dump's rows") from failure
        raise
    if optimizer is not None:
        ops.extend(optimizer.set_step(step))
    if not tf.executing_eagerly():
        _run([op for op in ops if op is not None], feeds.feed_dict)


def _as_table_dtype(arrays, var, what, source):
    """Converts the dumped rows (values, slots) of `arrays` in place to the
    dtype of the table `var` that loads them (CheckpointError naming
    `source`, the dump, before any table changes, where one becomes
    infinite)."""
    dtype = tf.as_dtype(var.dtype).base_dtype
    static = var.fixed_rows is not None
    for part in [p for p in arrays if p == "values" or p.startswith("slot.")]:
        slot = "" if part == "values" else f"slot '{part[len('slot.'):]}' "
        arrays[part] = rows_as(arrays[part], dtype, what, arrays["keys"], static, slot, source)


def rows_as(rows, dtype, what, keys=None, static=True, slot="", source="the dump",
            advice=None):
    """The dumped `rows` (numpy floats) as the table's `dtype` (a tf.DType).
    Rounding is fine; a finite value that becomes infinite (float64 1e300
    in a float32 table, 70000 in a float16 one) is a CheckpointError naming
    `what` (the table), the first such value and where it is: a table
    holding inf where the dump held a number gives every lookup of it inf,
    and numpy's cast only warns.

    keys: the rows' keys (row numbers where `static`); slot: "slot 'x' " for
    an optimizer slot's rows; source, advice: the message's words for where
    the rows come from and what to do instead."""
    target = np.dtype(dtype.as_numpy_dtype)
    if rows.dtype == target:
        return rows
    at, converted = overflow_at(rows, target)
    if at is not None:
        value = float(np.asarray(rows[at], np.float64))
        key = at[0] if keys is None else int(keys[at[0]])
        where = f"row {key}" if static else f"the row of key {key}"
        raise CheckpointError(
            f"{what} has dtype {dtype.name}; {source} holds the {rows.dtype.name} value "
            f"{value!r} in {slot}{where}, column {at[-1]}, beyond {dtype.name}'s largest finite "
            f"value {float(dtype.max)!r}: it would become {'inf' if value > 0 else '-inf'}; "
            + (advice or f"load it into a table of dtype {rows.dtype.name}"))
    return converted


def check_keys_fit(keys, key_dtype, what, source="the dump"):
    """CheckpointError unless every dumped key (int64) fits the table's key
    dtype: cast, 2^32 + 5 would become key 5 of an int32 table. `source`:
    the message's words for the dump."""
    info = np.iinfo(key_dtype.as_numpy_dtype)
    outside = keys[(keys < info.min) | (keys > info.max)]
    if outside.size:
        raise CheckpointError(
            f"{what} has {key_dtype.name} keys (key_type); {source} holds key "
            f"{int(outside[0])}, which does not fit in {key_dtype.name}: load it into a table "
            f"with key_type=tf.int64")


def _workers_agree(refusal, source):
    """Every worker process of sok.load tells the others whether it refused
    the load (`refusal`, this worker's CheckpointError or None), at one
    point that every worker reaches once per load; raises `refusal`, or a
    CheckpointError with the reason of a worker that refused. Each worker
    checks the rows it owns (its capacity, its keys' dtype) and reads its
    own files: a dump one worker refused was loaded by the others, without
    an error there, and the job went on half from the dump and half from
    before."""
    comm = context.active()
    _, failures = agreement.agree(comm, tf.executing_eagerly(), error=refusal)
    agreement.raise_shared(comm, refusal, failures, f"sok.load of {source}", (CheckpointError,),
                           outcome="; no worker changed its tables")


def _check_fits(variables, loaded, source):
    """CheckpointError, before any table changes, where a table cannot take
    the rows it would own: keys outside its key dtype or given twice,
    admission counts kept another way, or more rows than its bound (a
    dynamic table's max_capacity). A static table's rows were matched by read_dump: its
    int64 keys and its own rows always fit."""
    for name, table in variables.items():
        for var in replica_shards.shards_of(table):
            keys = loaded[name]["keys"][owned_mask(var, loaded[name]["keys"])]
            check_keys_fit(keys, var.key_dtype, f"variable '{name}'", source)
            ordered = np.sort(keys, kind="stable")
            twice = ordered[1:][ordered[1:] == ordered[:-1]]
            if twice.size:
                # A dump writes each key once; a table's own check of the
                # repeat failed on its owner only, after the other workers
                # had loaded.
                raise CheckpointError(
                    f"variable '{name}': {source} holds key {int(twice[0])} more than once "
                    f"(a dump holds each key once): it was not written by sok.dump, or was "
                    f"changed since")
            check_filter_fits(var, loaded[name], name, source)
            limit = int(_run(var.row_limit()))
            if 0 < limit < keys.size:
                raise CheckpointError(
                    f"variable '{name}' holds at most {limit} rows (its max_capacity); "
                    f"{source} gives it {keys.size}: raise max_capacity or load into a "
                    f"larger table")


def check_filter_fits(var, arrays, name, source):
    """CheckpointError where shard `var`'s admission filter (the variable
    `name`) cannot take the counts in `arrays` (read_dump's): kept another
    way, or of keys its key dtype cannot hold. sok.load and sok.Saver share
    it."""
    dumped = arrays.get(FILTER_KIND)
    admission = var.admission
    if dumped is not None and admission is not None and admission.counting \
            and dumped != admission.description():
        raise CheckpointError(
            f"variable '{name}' counts keys for its admission filter as "
            f"{admission.description()}; {source} kept its counts as {dumped}: "
            f"load into a table with the same min_count_counters and "
            f"min_count_hashes")
    if admission is not None and admission.counting and admission.kind == "keys" \
            and "filter.keys" in arrays:
        # The keys still waiting to enter: a narrowed key (2^32 + 5
        # as 5) would carry another key's count.
        waiting = arrays["filter.keys"]
        check_keys_fit(waiting[owned_mask(var, waiting)], var.key_dtype,
                       f"variable '{name}' (its admission filter's counts)", source)


def _put_back(var, before, optimizer):
    """Restores a shard (and the slots it had) from its arrays as
    _shard_tensors read them before a failed load."""
    keys = tf.constant(np.asarray(before["keys"]).astype(var.key_dtype.as_numpy_dtype))
    var.replace_rows(keys, before["values"], **{m: before[m] for m in var.key_metadata})
    for name in [k[len("slot."):] for k in before if k.startswith("slot.")]:
        var.replace_slot(optimizer.slot(var, name), keys, before["slot." + name])
    if "filter.keys" in before:
        var.admission.restore(before["filter.keys"], before["filter.counts"])
    if FILTER_CALLS in before:
        var.admission.restore_calls(before[FILTER_CALLS][0])


def _load_shard(var, a, optimizer, slots, feeds):
    """Assignments of the rows of dumped arrays `a` that shard `var` owns."""
    ops = []
    state = filter_state(var, a)
    # Each worker takes the rows it owns, whatever the dumping world size.
    keep = owned_mask(var, a["keys"])
    a = {k: v[keep] for k, v in a.items() if k not in _FILTER_PARTS + _MANIFEST_PARTS}
    # Keys are sorted, so a static shard's rows come in its local-row order,
    # as its replace_rows takes them. Metadata the dump lacks (a static
    # table's dump loaded into a dynamic table) is None: the table's default.
    keys = feeds.tensor(a["keys"].astype(var.key_dtype.as_numpy_dtype))
    # Rows are in the table's dtype already (_as_table_dtype): as tensors of
    # it, which tables take whatever the dtype (bfloat16 arrays are not numpy
    # floats).
    ops.append(var.replace_rows(keys, feeds.tensor(a["values"]),
                                **{m: feeds.tensor(a.get(m)) for m in var.key_metadata}))
    for slot, _ in slots:
        ops.append(var.replace_slot(optimizer.slot(var, slot), keys,
                                    feeds.tensor(a["slot." + slot])))
    ops.extend(restore_filter(var, {k: feeds.tensor(v) for k, v in state.items()}))
    return ops


def filter_state(var, arrays):
    """The state that shard `var`'s admission filter takes from dumped
    `arrays` (read_dump's), as numpy arrays: the counts of the keys it owns
    (of every sketch counter), where it counts, and the call count, where
    it draws. A dump without counts starts counting afresh, one without a
    call counter (no draws then, or from before it was kept) the draws.
    sok.load and sok.Saver share it."""
    admission, state = var.admission, {}
    if admission is not None and admission.counting:
        entries = np.asarray(arrays.get("filter.keys", np.zeros([0], np.int64)), np.int64)
        values = np.asarray(arrays.get("filter.counts", np.zeros([0], np.int64)), np.int64)
        if admission.kind == "keys":
            keep = owned_mask(var, entries)
            entries, values = entries[keep], values[keep]
        state["filter.keys"], state["filter.counts"] = entries, values
    if admission is not None and admission.draws:
        state[FILTER_CALLS] = np.int64(arrays.get(FILTER_CALLS, 0))
    return state


def restore_filter(var, state):
    """The ops that give shard `var`'s admission filter `state`
    (filter_state's parts, as arrays or tensors)."""
    ops = []
    if "filter.keys" in state:
        ops.append(var.admission.restore(state["filter.keys"], state["filter.counts"]))
    if FILTER_CALLS in state:
        ops.append(var.admission.restore_calls(state[FILTER_CALLS]))
    return ops


# Algorithms whose slots mean different things in tf.compat.v1.train's and
# Keras' formulas: loaded across, they would resume a wrong state.
_SLOTS_DIFFER_BY_FORMULAS = ("momentum",)


def read_dump(path, dims, static_rows=None, slot_names=(), algorithm=None, formulas=None,
              names=None):
    """(manifest, {name: arrays}) of the variables named in `dims` (name ->
    dimension), each file checked against the manifest and its checksum.
    static_rows: name -> row count of static tables, whose keys must be
    0..rows-1. algorithm: the optimizer whose slots `slot_names` must be there.
    names: {name in `dims`: the table's own name}, where the loaded tables
    must take the tables the dump holds under one name together
    (_check_named_alike), checked before any table's dimension or rows."""
    static_rows = static_rows or {}
    directory = _dump_dir(path)
    # Every refusal names the dump it read (a moved-aside copy, where an
    # interrupted dump left one): the variable's name alone did not say
    # which of several dumps was the wrong one.
    where = f"the dump at {directory}"
    try:
        with open(os.path.join(directory, "manifest.json"), "rb") as f:
            manifest = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError) as e:  # UnicodeDecodeError is a ValueError
        raise CheckpointError(f"{directory}/manifest.json is corrupted: {e}") from e
    if not isinstance(manifest, dict) or manifest.get("checksum") != _manifest_checksum(
            {k: v for k, v in manifest.items() if k != "checksum"}):
        raise CheckpointError(f"{directory}/manifest.json is corrupted: checksum mismatch (or "
                              f"no checksum: written by an older sok_graph)")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{where}: dump format version {manifest.get('format_version')} "
                              f"is not {FORMAT_VERSION}")
    if names is not None:
        # First: the dimension or row count of the table of that name that
        # the dump holds first said nothing of the others of its name.
        _check_named_alike(manifest, names, where)
    if algorithm is not None:
        saved = manifest.get("optimizer")
        if saved is None:
            raise CheckpointError(f"{where} holds no optimizer state; call load without "
                                  f"optimizer=")
        if saved["algorithm"] != algorithm:
            raise CheckpointError(f"{where} holds {saved['algorithm']} state; the optimizer "
                                  f"runs {algorithm}")
        dumped_formulas = saved.get("formulas")  # dumps before it was recorded: unknown
        if algorithm in _SLOTS_DIFFER_BY_FORMULAS and formulas is not None \
                and dumped_formulas is not None and dumped_formulas != formulas:
            kinds = {"tf1": "a tf.compat.v1.train optimizer's", "keras": "a Keras optimizer's"}
            raise CheckpointError(
                f"{where} holds {kinds.get(dumped_formulas, dumped_formulas)} {algorithm} "
                f"slots; the optimizer keeps {kinds.get(formulas, formulas)}, whose slots mean "
                f"another thing (an accumulator of gradients against a velocity): load with "
                f"the kind of optimizer that was dumped")
    loaded = {}
    named_alike = {n for group in manifest.get("named_alike", {}).values() for n in group}
    for name, dim in dims.items():
        entry = manifest["variables"].get(name)
        if entry is None:
            raise CheckpointError(f"{where} has no variable '{name}'; it has "
                                  f"{sorted(manifest['variables'])}")
        kind = "static" if name in static_rows else "dynamic"
        if name in named_alike and entry.get("kind") not in (None, kind):
            # Tables of one name are matched by their places in the list:
            # a sok.Variable and a DynamicVariable both named 'emb', listed
            # in the other order, took each other's rows.
            raise CheckpointError(
                f"{where}: the table listed as '{name}' of load_vars is {kind}; the dump's "
                f"'{name}' is {entry['kind']} (tables of one name are told apart by their "
                f"places in the dumped list): load them in the order they were dumped, or "
                f"give the tables distinct names")
        if entry["dim"] != dim:
            raise CheckpointError(f"{where}: variable '{name}' was dumped with dimension "
                                  f"{entry['dim']}; it has dimension {dim}")
        rows, files, crcs = entry["rows"], entry["files"], entry.get("crc32", {})

        def read(part, dtype, width, count, fname=None):
            return _read_array(os.path.join(directory, fname or files[part]), dtype, width,
                               count, crcs.get(part))

        # Dumps before rows kept their dtype: float32 rows, no "dtypes".
        dtypes = entry.get("dtypes", {})

        def rows_dtype(part):
            dtype = _FLOATS.get(dtypes.get(part, "float32"))
            if dtype is None:
                raise CheckpointError(
                    f"{where}: variable '{name}': the manifest gives {part} the dtype "
                    f"{dtypes[part]!r}; dumps hold rows of {sorted(_FLOATS)}")
            return dtype

        arrays = {"keys": read("keys", np.int64, 1, rows),
                  "values": read("values", rows_dtype("values"), dim, rows)}
        for meta in ("timestamps", "frequencies"):
            if meta in files:
                arrays[meta] = read(meta, np.int64, 1, rows)
        for part in _FILTER_PARTS:
            if part in files:
                arrays[part] = read(part, np.int64, 1, entry["filter"]["rows"])
        if "filter" in entry:
            arrays[FILTER_KIND] = {k: v for k, v in entry["filter"].items() if k != "rows"}
        if FILTER_CALLS in entry:
            calls = entry[FILTER_CALLS]
            if isinstance(calls, bool) or not isinstance(calls, int) or calls < 0:
                raise CheckpointError(f"{where}: variable '{name}': the manifest's "
                                      f"{FILTER_CALLS} must be an integer >= 0; got {calls!r}")
            arrays[FILTER_CALLS] = calls
        for slot in slot_names:
            fname = files.get("slot." + slot)
            if fname is None:
                raise CheckpointError(f"{where} has no '{slot}' slot for variable '{name}'")
            arrays["slot." + slot] = read("slot." + slot, rows_dtype("slot." + slot), dim, rows,
                                          fname)
        if name in static_rows:
            in_row_order(arrays, name, static_rows[name], where)
        loaded[name] = arrays
    return manifest, loaded


def in_row_order(arrays, name, want, where, holder="the dump"):
    """Puts the arrays of static table `name` (`want` rows) in row order, in
    place; a CheckpointError naming `where` (and the arrays as `holder`)
    unless their keys are that table's row numbers 0..want-1."""
    keys, rows = arrays["keys"], len(arrays["keys"])
    # Two messages: the one message for both said, of a dump of
    # rows 0..3 loaded into a table of 5 rows, that its keys were
    # not 0..3.
    if rows != want:
        raise CheckpointError(f"{where}: variable '{name}' has {want} rows; {holder} "
                              f"holds {rows} rows: load it into a table of {rows} rows")
    order = None if np.array_equal(keys, np.arange(rows)) else \
        np.argsort(keys, kind="stable")
    if order is not None and np.array_equal(keys[order], np.arange(rows)):
        # Keys 0..rows-1 in another order (a dynamic table's dump,
        # in its hash table's order, which differs between the CPU
        # and the GPU): row k is key k's, on every device alike.
        for part in ("keys", "values", "timestamps", "frequencies") + tuple(
                p for p in arrays if p.startswith("slot.")):
            if part in arrays:
                arrays[part] = arrays[part][order]
        keys = arrays["keys"]
    if not np.array_equal(keys, np.arange(rows)):
        first = int(np.flatnonzero(keys != np.arange(rows))[0])
        raise CheckpointError(
            f"{where}: variable '{name}' is a static table of {want} rows, whose keys "
            f"are its row numbers 0..{want - 1}; {holder} holds key {int(keys[first])} "
            f"where row {first} belongs (a dynamic table's rows?): load it into a "
            f"sok.DynamicVariable")


# ------------------------------------------------------ Keras weights files
# A table's entry in a Keras 3 weights file (tables/keras_weights.py, whose
# KerasWeights calls these): what a dump holds of it, and a restore as
# sok.load's. The admission filter's settings (a dict in a dump's manifest)
# go in as JSON text bytes.
_FILTER_JSON = "filter_json"
# The optimizer whose slots the entry holds, and its step (JSON as well).
_OPTIMIZER_JSON = "optimizer_json"


def _warn_slots_left_out(what, why, verb):
    """The warning of a Keras weights file that leaves a table's optimizer
    slots and step out (`what`, because `why`), naming the ways to `verb`
    them."""
    dump = "sok.dump" if verb == "keep" else "sok.load"
    warnings.warn(f"{what} ({why}); {verb} them with {dump}(path, vars, optimizer) or "
                  f"tf.train.Checkpoint")


def keras_save(table, store):
    """Writes `table` into its Keras weights entry `store`, with the slots
    and step of the optimizer that trained it (_keras_slot_holder)."""
    _refuse_worker_processes(table, "save_weights")
    optimizer, why = _keras_slot_holder(table, kept=False)
    if why is not None:
        _warn_slots_left_out(f"save_weights: the Keras weights file does not keep the slots "
                             f"and step of sok table '{var_name(table)}'", why, "keep")
    for part, value in _export(table, optimizer).items():
        if part == FILTER_KIND:
            store[_FILTER_JSON] = _json_bytes(value)
        else:
            store[part] = np.asarray(value)
    if optimizer is not None:
        store[_OPTIMIZER_JSON] = _json_bytes(dict(
            algorithm=optimizer.algorithm, formulas=optimizer.slot_formulas,
            slots=optimizer.slot_names(), step=int(optimizer.iterations.numpy())))


def _json_bytes(value):
    return np.frombuffer(json.dumps(value).encode("utf-8"), np.uint8)


def _json_of(array):
    return json.loads(np.asarray(array).tobytes().decode("utf-8"))


def _keras_slot_holder(table, kept):
    """(optimizer, why): the optimizer (OptimizerWrapper, or a native
    optimizer's own under sok.OptimizerScope) whose slots and step a Keras 3
    weights file keeps with `table`, the one holding slots for it; or None,
    and why not where that loses slots. Keras 3 saves a compiled model's
    optimizer variables in the same file, so a file without the sok rows'
    share resumed the dense weights where they were and the rows with fresh
    slots and a schedule started again. The save (`kept` False) and the load
    (`kept`: whether the file holds slots for the table) follow this one
    rule, so a file's slots go back to the optimizer they came from."""
    holders = wrappers_with_slots(table)
    if not holders and not kept:
        return None, None
    if len(replica_shards.shards_of(table)) != 1:
        # Its shards' slots are whole in tf.train.Checkpoint and sok.dump.
        return None, "a table sharded over replicas"
    if len(holders) > 1:
        return None, f"its slots are in {len(holders)} optimizers"
    return (holders[0] if holders else None), None


def keras_load(table, store):
    """Restores `table` from its Keras weights entry `store`, every check
    before it changes. Optimizer slots and step in the entry go to the
    optimizer holding slots for the table, or, where none does yet (a
    fresh model, whose optimizer makes them at its first step), to the
    first that makes them (wrapper.PENDING_OPTIMIZER_STATE)."""
    _refuse_worker_processes(table, "load_weights")
    name = var_name(table)
    source = f"the Keras weights file's entry for sok table '{name}'"
    parts = sorted(store.keys())
    if "keys" not in parts or "values" not in parts:
        raise CheckpointError(
            f"load_weights: {source} holds {parts}, not the table's keys and values (a "
            f"file saved by a model without this table, or before sok tables were saved "
            f"in Keras weights files, holds none): load the table with sok.load, and the rest "
            f"with load_weights(..., skip_mismatch=True)")
    arrays = {part: np.asarray(store[part]) for part in parts}
    if _FILTER_JSON in arrays:
        arrays[FILTER_KIND] = _json_of(arrays.pop(_FILTER_JSON))
    if FILTER_CALLS in arrays:
        arrays[FILTER_CALLS] = int(arrays[FILTER_CALLS])
    trained = _json_of(arrays.pop(_OPTIMIZER_JSON)) if _OPTIMIZER_JSON in arrays else None
    shard = replica_shards.shards_of(table)[0]
    keys, values = arrays["keys"], arrays["values"]
    dim = dimension_of(shard)
    if keys.ndim != 1 or values.ndim != 2 or values.shape[0] != keys.shape[0]:
        raise CheckpointError(
            f"load_weights: {source} holds keys of shape {list(keys.shape)} and values of "
            f"shape {list(values.shape)}; expected [n] keys and [n, {dim}] values")
    if values.shape[1] != dim:
        raise CheckpointError(
            f"load_weights: {source} holds rows of dimension {values.shape[1]}; the table "
            f"has dimension {dim}")
    for part in [p for p in arrays if p.startswith("slot.")]:
        if arrays[part].shape != values.shape:
            raise CheckpointError(
                f"load_weights: {source} holds {part} of shape {list(arrays[part].shape)}; "
                f"expected the values' {list(values.shape)}")
    arrays["keys"] = keys.astype(np.int64)
    if shard.fixed_rows is not None:
        in_row_order(arrays, name, shard.fixed_rows, f"load_weights: {source}",
                     holder="the file")
    optimizer = why = None
    if trained is not None:
        optimizer, why = _keras_slot_holder(table, kept=True)
    if why is not None:
        _warn_slots_left_out(f"load_weights: the file's slots and step of sok table '{name}' "
                             f"are not restored", why, "restore")
        trained = None
    if optimizer is not None and not _slots_match(optimizer, trained, name):
        optimizer = trained = None
    # The slots are converted (and checked) to the table's dtype with its
    # rows, and restored with them where an optimizer holds slots already.
    restore({name: table}, {name: arrays}, source, optimizer,
            None if optimizer is None else trained["step"])
    if optimizer is None and trained is not None:
        setattr(table, PENDING_OPTIMIZER_STATE,
                functools.partial(_restore_keras_slots, table, arrays, trained, name))


def _slots_match(optimizer, trained, name):
    """Whether `optimizer`'s slots are those a Keras weights file kept for
    table `name` (`trained`: their algorithm and formulas); else a warning,
    as Keras gives for its own optimizer's variables, and the slots start
    afresh."""
    same = optimizer.algorithm == trained["algorithm"] and (
        optimizer.algorithm not in _SLOTS_DIFFER_BY_FORMULAS
        or optimizer.slot_formulas == trained["formulas"]) and (
        # RMSprop's slots depend on momentum and centered.
        sorted(optimizer.slot_names()) == sorted(trained["slots"]))
    if not same:
        warnings.warn(
            f"load_weights: the file kept the slots {trained['slots']} of sok table '{name}' "
            f"for {trained['algorithm']} ({trained['formulas']} formulas); its optimizer is "
            f"{optimizer.algorithm} ({optimizer.slot_formulas} formulas) with slots "
            f"{optimizer.slot_names()}: the table's slots and step start afresh")
    return same


def _restore_keras_slots(table, arrays, trained, name, optimizer):
    """A Keras weights file's slots and step of `table`, given to
    `optimizer` when it first makes the table's slots (after the load)."""
    if not _slots_match(optimizer, trained, name):
        return
    keys = tf.constant(arrays["keys"].astype(table.key_dtype.as_numpy_dtype))
    for slot, _ in _slot_specs(optimizer):
        table.replace_slot(optimizer.slot(table, slot), keys,
                           tf.constant(arrays["slot." + slot]))
    if int(optimizer.iterations.numpy()) == 0:
        optimizer.set_step(trained["step"])


def _refuse_worker_processes(table, what):
    """A weights file holds one process's view: a table sharded over worker
    processes is refused (a rank-0-only save would also wait forever for the
    others in the allgather that reads every shard)."""
    world = replica_shards.shards_of(table)[0].placement[0]
    comm = context.active()
    if world > 1 and comm is not None and not comm.in_process:
        raise ValueError(
            f"{what}: sok table '{table.name}' is sharded over {world} worker processes, "
            f"which a Keras weights file cannot hold; save and restore it with sok.dump / "
            f"sok.load (every worker calls them)")


keras_weights.register_codec(keras_save, keras_load)


def incremental_model_dump(sok_vars, time_threshold, sess=None):
    """(keys, values): per variable, numpy arrays of the rows of the whole
    table updated (looked up for training, assigned or optimized) after
    `time_threshold`. With several workers each worker gets every worker's
    rows (in rank order), so that any of them can publish the increment; in
    graph mode every worker must call it, as every collective."""
    after = dynamic_ops.utc_micros(time_threshold, "time_threshold")
    _refuse_a_threshold_in_other_units(time_threshold, after)
    if is_sok_variable(sok_vars) or not isinstance(sok_vars, (list, tuple)):
        raise TypeError(f"sok_vars must be a list of sok.DynamicVariable; got "
                        f"{type(sok_vars).__name__}")
    for var in sok_vars:
        # Asked of what the table keeps, not of its kind: any table that
        # keeps write times can tell which rows were written since.
        if "timestamps" not in key_metadata_of(replica_shards.shards_of(var)[0]):
            raise TypeError("incremental_model_dump needs sok.DynamicVariable objects (static "
                            f"tables keep no update times); got {type(var).__name__}")
    # Eager tables are read at once; a graph's tables (also eagerly, TF 2.x
    # under `sess.as_default()` alone) by the Session's run below.
    in_graph = _graph_of_tables(sok_vars) is not None
    if (sess is not None and tf.executing_eagerly() and not in_graph) or (
            sess is None and not _runs_in_a_session(sok_vars)):
        values = _run([_updated_rows(var, after, index) for index, var in enumerate(sok_vars)])
        return [k for k, _ in values], [v for _, v in values]

    def build():
        # The threshold is fed: the ops serve every call (_built_once).
        threshold = tf.compat.v1.placeholder(tf.int64, [], name="sok_incremental_dump_after")
        return threshold, [_updated_rows(var, threshold, index)
                           for index, var in enumerate(sok_vars)]

    if sess is not None:
        _check_session(sess, sok_vars)
    # Built in the graph of the Session that runs it (`sess`, else the
    # default one), not in whatever graph is the default: under
    # `sess.as_default()` alone the ops went into another graph ("must be
    # from the same graph"), and a MonitoredTrainingSession's finalized
    # graph refused them.
    with _session_graph(sess) as runner:
        threshold, fetches = _built_once(("incremental",), tuple(sok_vars), build)
    values = runner.run(fetches, {threshold: after})
    return [k for k, _ in values], [v for _, v in values]


_MICROS_A_YEAR = 365 * 86400 * 10 ** 6


def _refuse_a_threshold_in_other_units(given, micros):
    """ValueError for an incremental_model_dump threshold given as a number
    that is a time of these decades in other units than microseconds: in
    nanoseconds (time.time_ns(), 1000 times too large: the delta was always
    empty) or in seconds (time.time(): the first hours of 1970 as
    microseconds, so every row was in every delta). A datetime, and numbers
    meant as "before everything" or "after everything" (0, -1, the int64
    bounds), are not such times."""
    import datetime
    import time

    if isinstance(given, datetime.datetime):
        return
    now = int(time.time() * 1e6)
    for unit, factor, call, as_micros in (
            ("nanoseconds", 10 ** -3, "time.time_ns()",
             "far in the future (no row would be in the delta)"),
            ("seconds", 10 ** 6, "time.time()",
             "in the first hours of 1970 (every row would be in the delta)")):
        if abs(micros * factor - now) < 50 * _MICROS_A_YEAR:
            raise ValueError(
                f"time_threshold={given!r} is a time of these decades in {unit} since the "
                f"epoch ({call}); it takes microseconds (time.time() * 1e6) or a datetime: as "
                f"microseconds it is {as_micros}")


def _check_session(sess, sok_vars):
    """incremental_model_dump's `sess`: a Session (or MonitoredSession) of
    the tables' graph. Anything else failed with "'str' object has no
    attribute 'graph'", and a Session of another graph with TensorFlow's
    "must be from the same graph" about an op of the dump's own."""
    graph = getattr(sess, "graph", None)
    if not hasattr(sess, "run") or not isinstance(graph, tf.Graph):
        raise TypeError(f"sess must be a tf.compat.v1.Session or MonitoredSession of the "
                        f"tables' graph, or None for the default Session; got "
                        f"{type(sess).__name__} {sess!r}")
    for var in sok_vars:
        held = getattr(var, "graph", None)
        if isinstance(held, tf.Graph) and held is not graph:
            raise ValueError(f"sess runs another graph than the one of variable "
                             f"'{var_name(var)}': pass the Session that holds the tables")


def _updated_rows(var, after, index):
    """(keys, rows) tensors of the rows of `var` updated after `after` (UTC
    microseconds), gathered from every worker."""
    parts = [shard.export_chunk(0, 1 << 62, updated_after=after)[:2]
             for shard in replica_shards.shards_of(var)]
    keys = tf.concat([k for k, _ in parts], 0) if len(parts) > 1 else parts[0][0]
    rows = tf.concat([r for _, r in parts], 0) if len(parts) > 1 else parts[0][1]
    comm = context.active()
    if comm is not None and comm.world_size > 1 and not comm.in_process:
        # Named by the variable's position: every worker builds the same
        # collectives in the same order.
        keys = comm.allgather(keys, name=f"sok_incremental_dump_{index}_keys")
        rows = comm.allgather(rows, name=f"sok_incremental_dump_{index}_rows")
    return keys, rows
