"""Delta publishing: the rows trained since a time, to bring a served model
up to date without a new export.

A delta directory:
  manifest.json       format, id (random, unique to the delta), since /
                      created (UTC microseconds), and per table: name, kind,
                      key dtype, dtype, dimension, rows, for a static table
                      table_rows (the rows of the table it was read from,
                      all of them), and for its two files their size and
                      CRC-32
  <table>.keys.npy    int64 keys (global row numbers of a static table),
                      each once: a delta repeating one is refused
  <table>.rows.npy    rows [n, dimension] in the table's dtype; a bfloat16
                      table's as their raw bits, uint16 (.npy has no
                      bfloat16: np.save wrote it as void '|V2', which no
                      reader takes back as numbers). Each file's entry in
                      the manifest names the dtype the .npy holds.
Plain .npy files: a server without sok_graph reads them with numpy (a
bfloat16 table's rows: np.load(...).view(bfloat16), or tf.bitcast to
tf.bfloat16).

Dynamic tables give the keys updated after `since` (their per-key update
times); static tables keep no update times and give every row. The update
times are each worker's own clock's; `created` (of an export or a delta) is
the earliest of the workers' clocks, each read before any table is
(serving/collective.py), so a since of the previous created misses no key
updated after it read the tables, whatever the offsets between the
workers' clocks (docs/serving.md, "Clocks"). A table that gives a key twice
while it is read (changed meanwhile) is refused before anything is
written; where rank 0 refuses or fails to write a delta, every worker
raises.

A delta is applied to an export directory (apply_serving_delta, which
rewrites the SavedModel's variables with numpy and stock TensorFlow ops), or
to a loaded TF2 model through the function the SavedModel holds:
`loaded.sok_tables[name].apply_delta_fn(keys, rows)`.

apply_serving_delta is all or nothing: the updated export is written beside
export_dir and swapped in whole (dump_load.staging_dir, swap_into_place), so
a failure or a crash midway leaves the export as it was. It records every
delta it applied in the export (assets.extra/sok_deltas.json: id, since,
created, rows per table) and refuses a delta applied before, one older than
the last it applied (created earlier: its rows would overwrite newer ones),
one exported before the export itself was made, and one holding a
dynamic table whose since is after the created of the newest thing the
export holds of that table (the export itself, or the last delta it took
that held the table): rows trained in between would be in neither. Deltas written before deltas had
an id are known by a digest of their manifest.json.

apply_delta_fn, the loaded model's own function, keeps no such record and
cannot check order (serving/tables.py says why); it refuses what its keys
and rows show.
"""

import contextlib
import datetime
import gc
import hashlib
import importlib
import json
import os
import shutil
import time
import uuid
import zlib

import numpy as np
import tensorflow as tf

from sok_graph import context, dump_load
from sok_graph.communication import agreement
from sok_graph.tables.static import is_sok_variable
from sok_graph.ops import dynamic as dynamic_ops
from sok_graph.tables import (dimension_of, is_dynamic, is_float_dtype, live_tables,
                              replica_shards)
from sok_graph.serving import collective, sources
from sok_graph.serving.export import (APPLIED, MANIFEST, SAVED_MODEL_FILES,
                                      checked_chunk_rows, checked_dir, file_above,
                                      saved_model_file, table_name)
from sok_graph.serving.tables import safe_name

DELTA_FORMAT = 1
DELTA_MANIFEST = "manifest.json"
# A table's files in a delta: <stem>.keys.npy, <stem>.rows.npy.
_PARTS = ("keys.npy", "rows.npy")
APPLIED_FORMAT = 1
# Rows of a dtype .npy cannot hold are written as their raw bits, in the
# unsigned integer of their width: {table dtype: the .npy's dtype}.
_BITS = {"bfloat16": np.dtype(np.uint16)}


class DeltaError(ValueError):
    """A delta is corrupted, or does not fit the model it is applied to."""


def _named(variables):
    if is_sok_variable(variables) or not isinstance(variables, (list, tuple, dict)):
        variables = [variables]
    if isinstance(variables, dict):
        return dict(variables)
    out = {}
    for v in variables:
        if not is_sok_variable(v):
            raise TypeError(f"export_serving_delta takes sok tables; got {type(v).__name__}")
        name = table_name(v)
        if name in out:
            # The export numbered tables of one name (name, name_1, ...) in
            # the order the model read them, which a list here need not
            # follow: numbered by this list, a delta would reach the wrong
            # table without an error.
            raise ValueError(
                f"export_serving_delta: variables holds several tables named {name!r}; their "
                f"serving names (the export's sok_tables: {name!r}, {name + '_1'!r}, ...) follow "
                f"the order the model read them in: pass a dict {{serving name: table}}, or give "
                f"the tables distinct names")
        out[name] = v
    return out


def _live_tables(world):
    """Every live sok table of the process (a ReplicaShards once, not its
    shards) made in `world` (a graph, or None: eagerly)."""
    found = live_tables()
    shards = {id(s) for o in found if isinstance(o, replica_shards.ReplicaShards)
              for s in o.shards}
    return [o for o in found if id(o) not in shards and _world(o) is world]


def _world(table):
    """The graph a sok table was made in, None where it was made eagerly:
    an export serves the tables of one of them."""
    shard = replica_shards.shards_of(table)[0]
    return shard.graph if getattr(shard, "_in_graph_mode", False) else None


def _namesakes(named):
    """{name: the other live tables an export can serve under that name}
    for the tables of `named` (a list's, by their own names): tables of the
    same name, and for a name `base_k`, the tables named `base` where two or
    more are (an export serves them as base, base_1, ...)."""
    out = {}
    by_world = {}
    for name, table in named.items():
        world = _world(table)
        if world not in by_world:
            by_world[world] = {}
            for other in _live_tables(world):
                by_world[world].setdefault(table_name(other), []).append(other)
        names = by_world[world]
        others = [o for o in names.get(name, []) if o is not table]
        base, _, k = name.rpartition("_")
        if base and k.isdigit() and len(names.get(base, [])) > 1:
            others += names[base]
        if others:
            out[name] = others
    return out


def _refuse_namesakes(named):
    """ValueError where a table given in a list shares its name with another
    live table of the process: the export served such tables as name,
    name_1, ... in the order the model read them, and a delta named after
    the table itself went to whichever the export served as `name` (the
    first table's served rows took the second's without an error). Tables
    no longer referenced but not yet collected are not counted."""
    if not _namesakes(named):
        return
    gc.collect()
    shared = _namesakes(named)
    if shared:
        name = sorted(shared)[0]
        raise ValueError(
            f"export_serving_delta: table {name!r} of variables shares its name with "
            f"{len(shared[name])} other live sok table(s) of this process; an export serves "
            f"tables of one name as {name!r}, {name + '_1'!r}, ... in the order the model "
            f"reads them, so the delta's name cannot say which it is: pass a dict {{serving "
            f"name: table}} (the names loaded.sok_tables lists), or name the tables apart "
            f"(name= of sok.Variable / sok.DynamicVariable)")


def _crc(path):
    crc = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            crc = zlib.crc32(block, crc)
    return crc


def _stored_rows(rows, dtype):
    """The array a rows file holds for `rows` of the table dtype named
    `dtype`: the rows, or for a dtype of _BITS their raw bits."""
    bits = _BITS.get(dtype)
    rows = np.ascontiguousarray(rows, tf.as_dtype(dtype).as_numpy_dtype)
    return rows if bits is None else rows.view(bits)


def _refuse_read_repeats(name, what, ordered, delta_dir):
    """DeltaError where the sorted keys read from table `name` hold one
    twice. A table gives each key once; one changed while it is read in
    chunks (trained meanwhile: a dynamic table's keys move when it grows)
    can give one twice, and a delta of it is refused when read
    (_refuse_repeats): refused here, before it is written."""
    repeated = ordered[1:][ordered[1:] == ordered[:-1]]
    if not len(repeated):
        return
    first = repeated[0]
    distinct = len(np.unique(repeated))
    others = "" if distinct == 1 else \
        f" (and {distinct - 1} other {what}{'s' if distinct > 2 else ''} repeated)"
    raise DeltaError(
        f"export_serving_delta: table {name!r} gave {what} {int(first)} "
        f"{int(np.count_nonzero(ordered == first))} times while it was read{others}; a table "
        f"holds each {what} once, so it was changed while it was read (train only after "
        f"export_serving_delta returns, on every worker): nothing was written to "
        f"delta_dir={delta_dir!r}")


def export_serving_delta(variables, since, delta_dir, session=None, chunk_rows=1 << 20):
    """Writes the rows of `variables` (sok tables: a list, or {serving name:
    table}) changed after `since` (a UTC datetime or microseconds) to the new
    directory `delta_dir`. Every worker calls it (tables are gathered); rank
    0 writes and returns delta_dir, the others return None. In graph mode
    pass the trained graph's `session`.

    `since` is compared, on each worker, with the update times that
    worker's clock gave its keys. The delta's `created` is the earliest of
    the workers' clocks, each read before any table is (as an export's):
    a since of the previous created (of an export or a delta) misses no key
    updated after it read the tables, whatever the offsets between the
    workers' clocks (docs/serving.md, "Clocks"). A table that gives a key
    twice while it is read (trained meanwhile) is a DeltaError; nothing is
    written. Where rank 0 refuses or fails to write the delta (delta_dir
    exists, a repeated key, a full disk), every worker raises: rank 0 its
    own error, the others one of its class naming rank 0 and its message."""
    # Checked on every worker before any table is read: "" wrote the delta
    # beside the current directory's parent and left it there, bytes and
    # None failed in os.path once the tables were read.
    delta_dir = checked_dir(delta_dir, "delta_dir", "export_serving_delta")
    chunk_rows = checked_chunk_rows(chunk_rows, "export_serving_delta")
    after = dynamic_ops.utc_micros(since, "since")
    tables = _named(variables)
    if session is None and not tf.executing_eagerly():
        # As sok.dump: a graph's tables are read in its default Session (an
        # AttributeError about .numpy() before).
        session = tf.compat.v1.get_default_session()
        if session is None:
            raise ValueError("export_serving_delta in graph mode reads the tables in a "
                             "Session: pass session= (the one that trained them) or call it "
                             "inside `with sess.as_default():`")
    runner = sources.Runner(None if session is None else (
        session._tf_sess() if hasattr(session, "_tf_sess") else session))
    comm = context.active()
    rank = 0 if comm is None or comm.in_process else comm.rank
    eager = runner.session is None
    # Rank 0 writes: a delta_dir it cannot write is refused by every worker
    # before any table is read. With it, every worker's clock reading: the
    # earliest is `created` (serving/collective.py says why).
    failed = None
    try:
        # Each worker's own: which tables live in its process. Agreed on
        # like rank 0's refusal, so that a worker refusing does not leave
        # the others waiting for it in the gathers.
        if not isinstance(variables, dict):
            _refuse_namesakes(tables)
        if rank == 0:
            _refuse_taken(delta_dir)
    except (FileExistsError, ValueError) as e:
        failed = e
    created, failures = agreement.agree(comm, eager, reading=collective.now_micros(),
                                        error=failed)
    agreement.raise_shared(comm, failed, failures, "export_serving_delta", _FAILURES)
    collected = []
    for name, table in tables.items():
        dynamic = is_dynamic(replica_shards.shards_of(table)[0])
        _, chunks = sources.whole_table(table, runner, chunk_rows,
                                        updated_after=after if dynamic else None)
        # Every worker reads every table (each read is a round of gathers),
        # also after rank 0 refused one: it says so once all are read.
        parts = list(chunks)
        if failed is not None:
            continue
        dim = dimension_of(table)
        dtype = tf.as_dtype(table.dtype).base_dtype.as_numpy_dtype
        keys = np.concatenate([k for k, _ in parts]) if parts else np.zeros([0], np.int64)
        rows = np.concatenate([r for _, r in parts]) if parts else np.zeros([0, dim], dtype)
        order = np.argsort(keys, kind="stable")
        keys, rows = keys[order], rows[order]
        try:
            _refuse_read_repeats(name, "key" if dynamic else "row id", keys, delta_dir)
        except DeltaError as e:
            failed = e
            continue
        collected.append((name, "dynamic" if dynamic else "static",
                          table.key_type.name if dynamic else "int64",
                          tf.as_dtype(dtype).name, dim, keys, rows))
    if rank == 0 and failed is None:
        try:
            _write_delta(delta_dir, after, created, collected)
        except Exception as e:  # told to every worker, then raised
            failed = e
    # The other workers learn whether rank 0 wrote the delta: each raises
    # where it did not (they returned None while rank 0 failed).
    _, failures = agreement.agree(comm, eager, error=failed)
    agreement.raise_shared(comm, failed, failures, "export_serving_delta", _FAILURES)
    return delta_dir if rank == 0 else None


# The classes of rank 0's errors that the other workers raise as they are
# (any other: RuntimeError, naming it).
_FAILURES = (DeltaError,) + collective.SHARED_FAILURES


def _refuse_taken(delta_dir):
    """FileExistsError where delta_dir exists, or a file stands where one of
    its parent directories must be; changes nothing (the writer checks again
    as it writes)."""
    if os.path.lexists(delta_dir):
        raise FileExistsError(f"delta_dir {delta_dir!r} exists; a delta goes to a new directory")
    place = file_above(delta_dir)
    if place is not None:
        raise FileExistsError(f"cannot write delta_dir={delta_dir!r}: a file stands where its "
                              f"parent directories must be ({place!r} is not a directory)")


def _write_delta(delta_dir, after, created, collected):
    """Writes the delta of `collected` (the tables' rows, as
    export_serving_delta read them) beside delta_dir and renames it into
    place. Checks every name before anything is written."""
    parent = os.path.dirname(os.path.abspath(delta_dir))
    try:
        os.makedirs(parent, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as e:
        # os's "[Errno 17] File exists" named neither delta_dir nor the cause.
        raise FileExistsError(f"cannot write delta_dir={delta_dir!r}: a file stands where its "
                              f"parent directories must be ({e.filename!r} or a directory "
                              f"above it is not a directory)") from e
    if os.path.lexists(delta_dir):
        raise FileExistsError(f"delta_dir {delta_dir!r} exists; a delta goes to a new directory")
    # A staging name that holds the writer's pid (dump_load.staging_dir), so
    # that the staging of a delta killed mid-write is deleted by the next
    # one: a hidden ".<name>.tmp-<id>" was left for good.
    target = os.path.join(parent, os.path.basename(os.path.abspath(delta_dir)))
    dump_load.remove_dead_writers_tmp(target)
    tmp = dump_load.staging_dir(target)
    # Every name first: one longer than the file system takes is refused
    # here, before anything is written (its own error came midway).
    limit = dump_load.name_max(parent)
    own = len(os.fsencode(os.path.basename(delta_dir)))
    beside = len(os.fsencode(os.path.basename(tmp)))
    if beside > limit:
        raise ValueError(f"delta_dir={delta_dir!r}: its last component is {own} bytes long; a "
                         f"delta is written beside it under a name {beside - own} bytes longer, "
                         f"and the file system takes names of {limit} bytes: use a name of at "
                         f"most {limit - (beside - own)} bytes")
    stems, used = [], set()
    for name, *_ in collected:
        # Names that clean up to one stem ("a/b", "a_b", also "A" and "a" on
        # file systems that ignore case) get -1, -2, ... as a dump's files do.
        stem = dump_load._unique_stem(safe_name(name), _PARTS, used)
        longest = f"{stem}.keys.npy"
        dump_load.refuse_long_name(name, longest, len(os.fsencode(longest)), limit,
                                   "the delta file")
        stems.append(stem)
    os.makedirs(tmp)
    try:
        entries = []
        for stem, (name, kind, key_dtype, dtype, dim, keys, rows) in zip(stems, collected):
            files = {}
            for part, array in (("keys", np.ascontiguousarray(keys, np.int64)),
                                ("rows", _stored_rows(rows, dtype))):
                file_name = f"{stem}.{part}.npy"
                path = os.path.join(tmp, file_name)
                np.save(path, array)
                files[part] = dict(file=file_name, dtype=array.dtype.name,
                                   bytes=os.path.getsize(path), crc32=_crc(path))
            entry = dict(name=name, kind=kind, key_dtype=key_dtype, dtype=dtype,
                         dimension=dim, rows=int(len(keys)), files=files)
            if kind == "static":
                # It holds the table whole: its size, which a served table
                # of another size refuses.
                entry["table_rows"] = int(len(keys))
            entries.append(entry)
        # The id tells this delta from every other: apply_serving_delta
        # records it in the export and refuses the delta a second time.
        manifest = dict(format=DELTA_FORMAT, id=uuid.uuid4().hex, since=after,
                        created=created, tables=entries)
        with open(os.path.join(tmp, DELTA_MANIFEST), "w") as f:
            json.dump(manifest, f, indent=1)
        # On disk before it is in place, and its place too: a machine that
        # crashed after the call returned could leave a delta of empty files.
        dump_load.fsync_tree(tmp)
        os.rename(tmp, delta_dir)
        dump_load.fsync_dir(parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def read_serving_delta(delta_dir):
    """{table name: (entry, keys, rows)} of a delta directory, after checking
    every file's size and checksum."""
    return _read_delta(delta_dir)[2]


def _read_delta(delta_dir):
    """(manifest, identity, tables) of a delta directory: its manifest, what
    tells it from other deltas (its id, or for a delta written before deltas
    had one a digest of its manifest) and read_serving_delta's tables."""
    try:
        with open(os.path.join(delta_dir, DELTA_MANIFEST), "rb") as f:
            raw = f.read()
        manifest = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError) as e:
        raise DeltaError(f"{delta_dir}: no readable {DELTA_MANIFEST} ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != DELTA_FORMAT:
        raise DeltaError(f"{delta_dir}: delta format "
                         f"{manifest.get('format') if isinstance(manifest, dict) else None!r} "
                         f"is not {DELTA_FORMAT}")
    identity = manifest.get("id")
    if identity is None:
        identity = "manifest-sha256-" + hashlib.sha256(raw).hexdigest()
    elif not isinstance(identity, str) or not identity:
        raise DeltaError(f"{delta_dir}: the manifest's id is {identity!r}; a delta's id is a "
                         f"non-empty string")
    out = {}
    for entry in _table_entries(manifest, delta_dir):
        arrays = []
        for part in ("keys", "rows"):
            info = entry["files"][part]
            path = _file_inside(delta_dir, info["file"])
            if not os.path.exists(path) or os.path.getsize(path) != info["bytes"] \
                    or _crc(path) != info["crc32"]:
                raise DeltaError(f"{path} is missing, truncated or corrupted (size or "
                                 "checksum differs from the manifest)")
            try:
                array = np.load(path, allow_pickle=False)
            except (ValueError, OSError) as e:
                raise DeltaError(f"{path} is not a numpy array of numbers ({e})") from None
            # Deltas from before files named their dtype: the array's own.
            stored = info.get("dtype", array.dtype.name)
            if array.dtype.name != stored:
                raise DeltaError(f"{path} holds {array.dtype.name} values; the manifest says "
                                 f"{stored!r}")
            arrays.append(array)
        keys, rows = _checked_arrays(delta_dir, entry, arrays[0],
                                     _rows_of(delta_dir, entry, arrays[1]))
        if len(keys) != entry["rows"] or rows.shape != (entry["rows"], entry["dimension"]):
            raise DeltaError(f"{delta_dir}: table {entry['name']!r} has {len(keys)} keys and "
                             f"rows of shape {rows.shape}; the manifest says {entry['rows']} "
                             f"x {entry['dimension']}")
        out[entry["name"]] = (entry, keys, rows)
    return manifest, identity, out


def _table_entries(manifest, delta_dir):
    """The manifest's table entries, each checked for what _read_delta reads
    of it: a hand-edited or foreign manifest is a DeltaError naming the
    delta and the field, not a bare KeyError or TypeError."""
    tables = manifest.get("tables")
    if not isinstance(tables, list):
        raise DeltaError(f"{delta_dir}: the manifest's tables is {tables!r}; it must be a list "
                         f"of tables")
    for i, entry in enumerate(tables):
        where = f"{delta_dir}: the manifest's tables[{i}]"
        if not isinstance(entry, dict):
            raise DeltaError(f"{where} is {entry!r}; it must be an object")
        # table_rows only where a static table's delta recorded it.
        for field, kind in (("name", str), ("kind", str), ("rows", int), ("dimension", int),
                            ("files", dict), ("table_rows", int)):
            if field == "table_rows" and field not in entry:
                continue
            if not isinstance(entry.get(field), kind) or isinstance(entry.get(field), bool):
                raise DeltaError(f"{where} has {field} {entry.get(field)!r}; it must be a "
                                 f"{kind.__name__}")
        if not isinstance(entry.get("dtype", ""), str):
            raise DeltaError(f"{where} has dtype {entry['dtype']!r}; it must be a dtype's name")
        if any(other.get("name") == entry["name"] for other in tables[:i]):
            # Read into one dict by name: one of the two was dropped unsaid.
            raise DeltaError(f"{where} names table {entry['name']!r} a second time")
        for part in ("keys", "rows"):
            info = entry["files"].get(part)
            if not isinstance(info, dict) or not isinstance(info.get("file"), str) or \
                    not all(isinstance(info.get(k), int) for k in ("bytes", "crc32")):
                raise DeltaError(f"{where} has files[{part!r}] {info!r}; it must name the "
                                 f"file, its bytes and its crc32")
    return tables


def _file_inside(delta_dir, name):
    """The path of file `name` of a delta: a plain file name, inside
    delta_dir (a manifest cannot point elsewhere)."""
    if not isinstance(name, str) or name in ("", ".", "..") or os.path.basename(name) != name \
            or (os.path.altsep and os.path.altsep in name):
        raise DeltaError(f"{delta_dir}: the manifest names the file {name!r}; a delta's files "
                         f"are plain names inside its own directory")
    return os.path.join(delta_dir, name)


def _rows_of(delta_dir, entry, stored):
    """The rows of one table of a delta from the array its rows file holds:
    that array, or where the file holds the raw bits of a dtype .npy has no
    code for (_BITS: a bfloat16 table's rows as uint16), those bits read as
    the table's dtype."""
    dtype = entry.get("dtype")
    bits = _BITS.get(dtype)
    if bits is None:
        return stored  # numbers of their own dtype (_checked_arrays checks them)
    if stored.dtype != bits:
        raise DeltaError(f"{delta_dir}: table {entry.get('name')!r} of dtype {dtype} has rows "
                         f"of dtype {stored.dtype}; a {dtype} table's rows are written as "
                         f"their raw bits, {bits.name}")
    return stored.view(tf.as_dtype(dtype).as_numpy_dtype)


def _checked_arrays(delta_dir, entry, keys, rows):
    """(keys, rows) of one table of a delta: distinct integer keys, finite
    float rows."""
    name = entry.get("name")
    if keys.ndim != 1 or not np.issubdtype(keys.dtype, np.integer):
        raise DeltaError(f"{delta_dir}: table {name!r} has keys of dtype {keys.dtype} and shape "
                         f"{keys.shape}; keys must be a vector of integers")
    _refuse_repeats(delta_dir, entry, keys)
    if rows.ndim != 2 or not is_float_dtype(rows.dtype):
        raise DeltaError(f"{delta_dir}: table {name!r} has rows of dtype {rows.dtype} and shape "
                         f"{rows.shape}; rows must be a [keys, dimension] float matrix")
    # bfloat16 as float32 (exact): numpy's ufuncs need not take it.
    finite = np.isfinite(rows if np.issubdtype(rows.dtype, np.floating)
                         else rows.astype(np.float32))
    if not np.all(finite):
        bad = int(np.argwhere(~finite)[0][0])
        raise DeltaError(f"{delta_dir}: table {name!r} has a NaN or infinite value in the row "
                         f"of key {int(keys[bad]) if bad < len(keys) else bad}; rows must be "
                         f"finite")
    return keys, rows


def _refuse_repeats(delta_dir, entry, keys):
    """DeltaError where a key (a static table's row id) is in a table's
    keys file more than once. export_serving_delta writes each once; a
    delta made by hand or corrupted can repeat one, and then which of its
    rows is meant cannot be told (a new dynamic key was added twice)."""
    ordered = np.sort(keys)
    repeated = ordered[1:][ordered[1:] == ordered[:-1]]
    if not len(repeated):
        return
    what = "row id" if entry.get("kind") == "static" else "key"
    first = repeated[0]
    distinct = len(np.unique(repeated))
    others = "" if distinct == 1 else \
        f" (and {distinct - 1} other {what}{'s' if distinct > 2 else ''} repeated)"
    keys_file = entry["files"]["keys"]["file"]
    raise DeltaError(f"{delta_dir}: table {entry.get('name')!r} has {what} {int(first)} "
                     f"{int(np.count_nonzero(keys == first))} times in its keys file "
                     f"{keys_file!r}{others}; a delta holds each {what} once (which of its "
                     f"rows is meant cannot be told): this delta is corrupted or was not "
                     f"written by export_serving_delta")


def _merge_dynamic(keys, index, rows, new_keys, new_rows):
    """numpy: the keys, index and rows of a dynamic serving table after its
    delta (held keys overwritten, new keys added)."""
    n = len(keys)
    position = np.searchsorted(keys, new_keys, side="left")
    probe = np.minimum(position, max(n - 1, 0))
    found = (position < n) & (keys[probe] == new_keys) if n else np.zeros(len(new_keys), bool)
    rows = rows.copy()
    rows[index[probe[found]]] = new_rows[found]
    added_keys, added_rows = new_keys[~found], new_rows[~found]
    order = np.argsort(added_keys, kind="stable")
    added_keys, added_rows = added_keys[order], added_rows[order]
    first = len(rows)
    all_keys = np.concatenate([keys, added_keys])
    all_index = np.concatenate([index, first + np.arange(len(added_keys), dtype=np.int64)])
    order = np.argsort(all_keys, kind="stable")
    return all_keys[order], all_index[order], np.concatenate([rows, added_rows])


def _write_checkpoint(prefix, tensors):
    """Writes {key: array} as a checkpoint at `prefix` with stock SaveV2."""
    names = sorted(tensors)
    with tf.Graph().as_default() as graph:
        feeds = []
        for name in names:
            value = tensors[name]
            dtype = tf.string if isinstance(value, bytes) else tf.as_dtype(value.dtype)
            feeds.append(tf.compat.v1.placeholder(dtype, None if isinstance(value, bytes)
                                                  else value.shape))
        save = tf.raw_ops.SaveV2(prefix=tf.constant(prefix), tensor_names=tf.constant(names),
                                 shape_and_slices=tf.constant([""] * len(names)),
                                 tensors=feeds)
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(save, {f: tensors[n] for f, n in zip(feeds, names)})


def apply_serving_delta(export_dir, delta_dir, output_dir=None):
    """Writes the rows of a delta into the SavedModel at export_dir (written
    by sok.export_for_serving or CollectiveStrategy.export_saved_model): in
    place, or into a copy at output_dir (a new directory). Needs only numpy
    and stock TensorFlow. Returns {table name: rows applied}.

    All or nothing: the updated export is written beside its place and
    swapped in whole, so an error or a crash midway leaves export_dir (and
    output_dir) as they were. A delta the export already took, one older
    than the last it took, one exported before the export was made, or one
    of a dynamic table's rows changed after a since later than the newest
    rows the export holds of that table (the created of the last delta it
    took holding it, or its own: rows changed in between would be missing)
    is refused (DeltaError): the
    export records the deltas applied to it in assets.extra/sok_deltas.json
    (a copy at output_dir keeps the record)."""
    # bytes and None failed in os.path (naming no argument), "." as the
    # export to update in place (the current directory) was renamed away.
    export_dir = checked_dir(export_dir, "export_dir", "apply_serving_delta",
                             replaced=output_dir is None)
    delta_dir = checked_dir(delta_dir, "delta_dir", "apply_serving_delta", replaced=False)
    if output_dir is not None:
        output_dir = checked_dir(output_dir, "output_dir", "apply_serving_delta")
    source = os.path.abspath(export_dir)
    target = source if output_dir is None else os.path.abspath(output_dir)
    for name, given in (("export_dir", export_dir), ("delta_dir", delta_dir)):
        # A copy written into the directory it copies: the export then
        # served a second model's files inside its own.
        if output_dir is not None and os.path.realpath(target).startswith(
                os.path.realpath(given) + os.sep):
            raise ValueError(f"output_dir {output_dir!r} is inside {name} {given!r}: give a "
                             f"directory beside it")
    if output_dir is not None and os.path.lexists(target):
        raise FileExistsError(f"output_dir {output_dir!r} exists")
    if output_dir is not None and file_above(target) is not None:
        raise FileExistsError(f"cannot write output_dir={output_dir!r}: a file stands where its "
                              f"parent directories must be ({file_above(target)!r} is not a "
                              f"directory)")
    os.makedirs(os.path.dirname(target), exist_ok=True)
    # Appliers to one directory take turns, as dump writers do: each reads
    # the record of applied deltas the one before it swapped in. A copy also
    # waits for appliers of its source (locks taken in one order).
    with contextlib.ExitStack() as locks:
        for parent in sorted({os.path.dirname(source), os.path.dirname(target)}):
            locks.enter_context(dump_load.writers_take_turns(parent))
        if output_dir is not None and os.path.lexists(target):
            raise FileExistsError(f"output_dir {output_dir!r} exists")
        if saved_model_file(source) is None:
            # An applier or export that died between the two renames of its
            # swap left the previous export moved aside, and none in place
            # (a damaged export in place is refused: the delta applied to
            # the older copy replaced it).
            source = dump_load.aside_in_place(source, list(SAVED_MODEL_FILES), DeltaError,
                                              "export") or source
        served, applied_before, export_created = _served(source, export_dir)
        checksum = _saved_model_checksum(source, export_dir)
        manifest, identity, delta = _read_delta(delta_dir)
        record = _check_order(manifest, identity, applied_before, export_created, delta_dir,
                              export_dir)
        prefix = os.path.join(source, "variables", "variables")
        tensors, applied = _applied_tensors(served, delta, prefix, export_dir, delta_dir)
        record["tables"] = applied
        dump_load.remove_dead_writers_tmp(target)
        tmp = dump_load.staging_dir(target)
        try:
            # Everything but the variables, which are written anew.
            shutil.copytree(source, tmp, ignore=_variables_of(source))
            _write_checkpoint(os.path.join(tmp, "variables", "variables"), tensors)
            _refresh_fingerprint(tmp, checksum, export_dir)
            _write_applied(tmp, applied_before + [record])
            dump_load.swap_into_place(tmp, target)
        except BaseException as e:
            shutil.rmtree(tmp, ignore_errors=True)  # gone already once swapped in
            full = dump_load.no_room_error(e, target, "the delta's export")
            if full is not None:
                raise full from e
            raise
    return applied


def _saved_model_checksum(export_dir, given):
    """The export's saved_model.pb, checked before anything is written:
    DeltaError where it does not parse as a SavedModel of a meta graph (a
    file cut short, another program's); the saved_model_checksum its
    fingerprint.pb records (TF 2.12 and up), or None. The file is copied
    as it is into the updated export, which used to take a damaged one
    without a word, its fingerprint rewritten to match it."""
    from tensorflow.core.protobuf import saved_model_pb2

    path = saved_model_file(export_dir)
    if path is None or not path.endswith(".pb"):
        return None  # a text SavedModel: parsed by _served's loader checks
    with open(path, "rb") as f:
        data = f.read()
    model = saved_model_pb2.SavedModel()
    try:
        model.ParseFromString(data)
    except Exception as e:  # protobuf's DecodeError, by module version
        raise DeltaError(f"{given}: its {os.path.basename(path)} does not parse as a SavedModel "
                         f"({e}); the export is damaged: export it again") from None
    if not model.meta_graphs:
        raise DeltaError(f"{given}: its {os.path.basename(path)} holds no meta graph; the "
                         f"export is damaged: export it again")
    return _fingerprint_checksum(export_dir)


def _fingerprint_checksum(export_dir):
    """saved_model_checksum of export_dir's fingerprint.pb, or None."""
    path = os.path.join(export_dir, "fingerprint.pb")
    if not os.path.exists(path):
        return None
    try:
        fingerprint_pb2 = importlib.import_module("tensorflow.core.protobuf.fingerprint_pb2")
        fingerprint = fingerprint_pb2.FingerprintDef()
        with open(path, "rb") as f:
            fingerprint.ParseFromString(f.read())
        return int(fingerprint.saved_model_checksum)
    except Exception:  # pylint: disable=broad-except
        return None  # no fingerprint this TensorFlow reads: nothing to compare


def _refresh_fingerprint(export_dir, checksum=None, given=None):
    """The SavedModel fingerprint (fingerprint.pb, TF 2.12 and up) of the
    updated export at export_dir, written anew as tf.saved_model.save writes
    it, or removed where this TensorFlow writes none or cannot: the copied
    one described the export's previous variables (its checkpoint_hash),
    and whatever keys models by it took the update for the export it was.
    checksum: the saved_model_checksum the export's own fingerprint
    recorded; the update copies saved_model.pb as it is, so a new one that
    differs means the file is not the one the export wrote (DeltaError)."""
    path = os.path.join(export_dir, "fingerprint.pb")
    if not os.path.exists(path):
        return
    os.remove(path)
    try:
        # TensorFlow's own writer (2.12 and up; by name: TF 1.15 has none).
        importlib.import_module(
            "tensorflow.python.saved_model.fingerprinting_utils").write_fingerprint(export_dir)
    except Exception:  # pylint: disable=broad-except
        # No fingerprint is better than one of other variables; a loader
        # that finds none (an export of before TF 2.12) still loads it.
        if os.path.exists(path):
            os.remove(path)
        return
    now = _fingerprint_checksum(export_dir)
    if checksum is not None and now is not None and now != checksum:
        raise DeltaError(f"{given}: its saved_model.pb is not the file its fingerprint.pb was "
                         f"written for (saved_model_checksum {now}, recorded {checksum}): a "
                         f"damaged or replaced file; export the model again")


def _variables_of(export_dir):
    """copytree's ignore: the checkpoint files of the export's variables."""
    variables = os.path.join(export_dir, "variables")

    def ignore(directory, names):
        if os.path.abspath(directory) != variables:
            return []
        return [n for n in names if n == "variables.index" or n.startswith("variables.data-")]
    return ignore


def _served(export_dir, given):
    """({table name: sok_serving.json entry}, the deltas applied so far, the
    time the export was made or None) of the export at export_dir."""
    extra = os.path.join(export_dir, "assets.extra")
    manifest_path = os.path.join(extra, MANIFEST)
    try:
        with open(manifest_path) as f:
            manifest = json.load(f)
        served = {t["name"]: t for t in manifest["tables"]}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DeltaError(f"{given} has no readable {manifest_path} ({e}); was it written "
                         "by sok.export_for_serving?") from None
    applied = []
    record_path = os.path.join(extra, APPLIED)
    if os.path.exists(record_path):
        try:
            with open(record_path) as f:
                record = json.load(f)
            applied = list(record["applied"])
            if record.get("format") != APPLIED_FORMAT or not all(
                    isinstance(a, dict) and isinstance(a.get("id"), str)
                    and isinstance(a.get("created"), int) for a in applied):
                raise ValueError(f"not a record of format {APPLIED_FORMAT}")
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise DeltaError(f"{given}: its record of the deltas applied to it, {record_path}, "
                             f"does not read ({e}); without it a delta applied twice or out "
                             f"of order cannot be told") from None
    created = manifest.get("created")  # exports before it was recorded: unknown
    return served, applied, created if isinstance(created, int) else None


def _micros(t):
    """A UTC microsecond time for messages."""
    return datetime.datetime.fromtimestamp(t / 1e6, datetime.timezone.utc).isoformat()


def _check_order(manifest, identity, applied, export_created, delta_dir, export_dir):
    """The record of a delta about to be applied to an export that took the
    deltas `applied`: DeltaError where it took this one already, where this
    one is older than the last it took (created earlier: its rows would
    overwrite newer ones) or older than the export itself, and where it
    leaves a gap (_check_no_gap, table by table). A since at or before the
    newest time the export holds a table's rows for is fine: the rows
    changed in the overlap are in the delta too, and newer."""
    created = manifest.get("created")
    if isinstance(created, bool) or not isinstance(created, int):
        raise DeltaError(f"{delta_dir}: the manifest's created is {created!r}; it must be the "
                         f"time the delta was exported, in integer UTC microseconds")
    since = manifest.get("since")
    if isinstance(since, bool) or not isinstance(since, int):
        raise DeltaError(f"{delta_dir}: the manifest's since is {since!r}; it must be the time "
                         f"the delta's rows were changed after, in integer UTC microseconds")
    for place, before in enumerate(applied):
        if before["id"] == identity:
            raise DeltaError(
                f"delta {delta_dir} (id {identity}) was already applied to {export_dir} (delta "
                f"{place + 1} of the {len(applied)} applied to it): a delta is applied once")
    if applied:
        last = max(applied, key=lambda a: a["created"])
        if created <= last["created"]:
            raise DeltaError(
                f"delta {delta_dir} was exported at {_micros(created)} (created={created}), "
                f"not after delta {last['id']} that {export_dir} took last (created="
                f"{last['created']}, {_micros(last['created'])}): applied now, its rows "
                f"would overwrite newer ones; apply deltas in the order they were exported")
    if export_created is not None and created < export_created:
        raise DeltaError(
            f"delta {delta_dir} was exported at {_micros(created)} (created={created}), before "
            f"the export at {export_dir} was made (created={export_created}, "
            f"{_micros(export_created)}): the export holds newer rows; apply only deltas "
            f"exported after it")
    _check_no_gap(manifest, since, applied, export_created, delta_dir, export_dir)
    return dict(id=identity, created=created, since=since, applied=int(time.time() * 1e6),
                delta_dir=os.path.abspath(delta_dir))


def _check_no_gap(manifest, since, applied, export_created, delta_dir, export_dir):
    """DeltaError where a delta holding a dynamic table gives its rows
    changed after `since` and the export holds that table's rows only up to
    an earlier time: the newest of the export's own created and the created
    of the deltas it took that held that table. Checked per table: a delta
    holding other tables (or none: static tables only, an empty list) says
    nothing of this one's rows, and taken as the time of every table it let
    a later delta of both skip this table's rows trained in between. A
    static table is held whole, whatever the since. An entry of the record
    without its tables (sok_graph writes none; one made by hand) counts for
    no table: the check falls back to the others and the export, which can
    refuse a delta, never take one after a gap. An export of before created
    was recorded gives no time for a table no delta it took held."""
    for entry in manifest.get("tables", []):
        if entry.get("kind") == "static":
            continue
        name = entry.get("name")
        holding = [a for a in applied
                   if isinstance(a.get("tables"), dict) and name in a["tables"]]
        last = max(holding, key=lambda a: a["created"]) if holding else None
        if last is not None and (export_created is None or last["created"] >= export_created):
            newest = last["created"]
            what = f"the created of delta {last['id']}, the last it took"
            if last is not max(applied, key=lambda a: a["created"]):
                what += f" holding table {name!r}"
        elif export_created is not None:
            newest, what = export_created, "the time the export was made"
        else:
            continue
        if since > newest:
            raise DeltaError(
                f"delta {delta_dir} holds the rows changed after {_micros(since)} (since="
                f"{since}) of table {name!r}; {export_dir} holds that table's rows up to "
                f"{_micros(newest)} (created={newest}: {what}): its rows changed in between "
                f"would be in neither; export a delta of {name!r} with since <= {newest}")


def _write_applied(export_dir, applied):
    """Writes the record of the deltas applied to the export at export_dir."""
    extra = os.path.join(export_dir, "assets.extra")
    os.makedirs(extra, exist_ok=True)
    with open(os.path.join(extra, APPLIED), "w") as f:
        json.dump(dict(format=APPLIED_FORMAT, applied=applied), f, indent=1)
    # (Written into the export's staging copy: swap_into_place syncs it.)


def _applied_tensors(served, delta, prefix, export_dir, delta_dir):
    """({checkpoint key: array} of the export's variables with the delta's
    rows written in, {table name: rows applied}); every check runs here,
    before anything is written."""
    unknown = sorted(set(delta) - set(served))
    if unknown:
        raise DeltaError(f"the delta has tables {unknown} that the model at {export_dir} does "
                         f"not serve (it serves {sorted(served)})")
    reader = tf.train.load_checkpoint(prefix)
    tensors = {name: reader.get_tensor(name) for name in reader.get_variable_to_dtype_map()}
    applied = {}
    for name, (entry, keys, rows) in delta.items():
        table = served[name]
        if entry["dimension"] != table["dimension"] or entry["kind"] != table["kind"]:
            raise DeltaError(f"table {name!r}: the delta holds {entry['kind']} rows of "
                             f"dimension {entry['dimension']}; the model serves a "
                             f"{table['kind']} table of dimension {table['dimension']}")
        where = table["checkpoint_keys"]
        try:  # rounding is fine; a finite value that becomes infinite is not
            rows = dump_load.rows_as(
                rows, tf.as_dtype(table["dtype"]), f"the served table {name!r}", keys,
                static=table["kind"] == "static", source=f"delta {delta_dir}",
                advice="the served model would give inf for it")
        except dump_load.CheckpointError as e:
            raise DeltaError(str(e)) from None
        if table["kind"] == "static":
            values = tensors[where["rows"]].copy()
            if entry.get("table_rows", len(values)) != len(values):
                # Read from a table of another size: another table (another
                # model's of the same table names), whose rows wrote over the
                # first rows of this one unnoticed. (A delta made by hand may
                # hold some rows; it says nothing of its table's size.)
                raise DeltaError(f"table {name!r}: the delta was read from a static table of "
                                 f"{entry['table_rows']} rows; the model at {export_dir} serves "
                                 f"{len(values)}: the delta is of another table")
            if len(keys) and (keys.min() < 0 or keys.max() >= len(values)):
                raise DeltaError(f"table {name!r}: delta row ids must be in [0, {len(values)})")
            values[keys] = rows
            tensors[where["rows"]] = values
        else:
            key_dtype = tf.as_dtype(table["key_dtype"]).as_numpy_dtype
            info = np.iinfo(key_dtype)
            if len(keys) and (keys.min() < info.min or keys.max() > info.max):
                raise DeltaError(f"table {name!r} has {np.dtype(key_dtype).name} keys; the "
                                 f"delta holds keys outside that type's range")
            merged = _merge_dynamic(tensors[where["keys"]].astype(np.int64),
                                    tensors[where["index"]], tensors[where["rows"]],
                                    keys.astype(np.int64), rows)
            tensors[where["keys"]] = merged[0].astype(key_dtype)
            tensors[where["index"]] = merged[1]
            tensors[where["rows"]] = merged[2]
        applied[name] = int(len(keys))
    return tensors, applied
