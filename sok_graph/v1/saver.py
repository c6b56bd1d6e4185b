"""`sok.Saver`, the SOK 1.x way to save and restore one embedding table.

    saver = sok.Saver()
    saver.dump_to_file(layer.embedding_variable, "/ckpt")
    saver.restore_from_file(layer.embedding_variable, "/ckpt")
    saver.load_embedding_values(layer.embedding_variable, initial_rows)

`filepath` is a directory that holds, as SOK's does, the tables dumped to
it under their names: each table (each worker's shard of it, with several
workers) in a directory of its own inside it, `<name>` or
`<name>.shard-<rank>-of-<workers>`, in sok.dump's format (checked headers,
manifest, written aside and swapped in: beside the table's directory, a
copy named `<its name>.tmp-<pid>-<8 hex>` while it is written and
`<its name>.old-<20 digits>-<8 hex>` for the one it replaces, so a table
whose directory would have such a name is refused). Dumping one table
replaces only that table's files; restoring reads the table of the
variable's own name and shard. A directory from before this layout (one table's dump directly
in `filepath`, named "table") still restores; a dump of a table named "table" that holds
what that layout never held (a sok.dump, a Saver's table directory) is refused. A dynamic
table's last-use times and use counts (what LRU and LFU evict by) are dumped and restored
with its rows, as sok.dump and sok.load keep them. A dynamic table's admission filter state
(the counts of min_count, the call count of filter_ratio's draws; each
worker its shard's) is dumped and restored with its rows, as sok.dump and
sok.load keep it; a dump without it (a Saver's from before it was kept)
starts counting and drawing afresh.

Tables are told apart by their names only, so two tables of one name
cannot share a `filepath`: where another table of the same name, living in
the same place (both eager, or both in one graph), was dumped to that
directory by this process and still exists, `dump_to_file` refuses with a
ValueError naming both tables and their name before anything is written
(the second dump used to replace the first one's files without a word,
and restoring the first then gave it the second's rows). A restore from
that directory is refused the same way, before the table changes, where
the rows there cannot be the table's: its own dump there was refused, or
the table dumped there is of the other kind (a sok.Variable and a
sok.DynamicVariable; a static table took a dynamic one's rows whose keys
happened to be 0..n-1). A table restored from the dump of another of its
kind and name (a copy made to check a round trip) takes its rows. Dumping a table
again replaces its own files, as does a table of that name from a later
run, or from a new graph built in place of the old one. `filepath` may be a string tensor (fed per
run in a Session). Eagerly each call does its work at once; in graph mode
each returns an op that does it when a Session runs it, so it can sit in a
graph next to the training op.

With several worker processes, `dump_to_file` and `restore_from_file` are
collective: every worker calls them for the same tables in the same order
(each gathers a number from every worker; see _agreed_save_id below).
"""

import os
import re
import threading
import weakref

import numpy as np
import tensorflow as tf

from sok_graph import context, placement
from sok_graph.communication import agreement
from sok_graph.tables import (dimension_of, is_dynamic, key_metadata_of, kind_of,
                               replica_shards, rows_from_user)
from sok_graph.tables.static import is_sok_variable
from sok_graph.dump_load import (_ASIDE, _FILTER_PARTS, _SIBLING_SUFFIX, _TMP, FILTER_CALLS,
                                 CheckpointError, _file_stem, var_name, check_filter_fits,
                                 check_float_table, check_keys_fit, checked_path,
                                 dump_manifest, dumped_names, filter_arrays, filter_state,
                                 filter_tensors, name_max, read_dump, refuse_long_name,
                                 restore_filter, rows_as, table_stem, unreadable_manifest,
                                 write_dump)

_TABLE = "table"  # the one table of a dump written before per-name directories


def _check(var, method):
    if not is_sok_variable(var):
        raise TypeError(f"Saver.{method} takes a sok embedding variable (a layer's "
                        f"embedding_variable, sok.Variable or DynamicVariable); got "
                        f"{getattr(var, 'name', type(var).__name__)!r}")
    check_float_table(var, f"Saver.{method}")


def _directory(filepath, method):
    """filepath as a str, or (graph mode) a scalar string tensor to feed the
    op that reads or writes the files."""
    if isinstance(filepath, tf.Tensor):
        if filepath.dtype != tf.string or filepath.shape.rank not in (None, 0):
            raise TypeError(f"Saver.{method}: filepath must be a str, a path or a scalar "
                            f"tf.string tensor; got a {filepath.dtype.name} tensor of shape "
                            f"{filepath.shape}")
        if not hasattr(filepath, "numpy"):  # a graph's: checked when the op runs
            return filepath
    if not isinstance(filepath, (str, bytes, os.PathLike, tf.Tensor)):
        raise TypeError(f"Saver.{method}: filepath must be a str, a path or a scalar tf.string "
                        f"tensor (the directory of the dump); got {type(filepath).__name__} "
                        f"{filepath!r}")
    # "" was the current directory: the tables' directories were written
    # into (and restored from) wherever the process happened to run.
    return checked_path(filepath, f"Saver.{method}: filepath")


def _refuse_a_dump_at(path):
    """FileExistsError where `path` (a Saver's directory), or a directory
    above it, is a sok.dump: the Saver's table directories were written in
    beside the dump's files, which the next sok.dump to that path then
    refused to replace (and sok.load took as a dump holding files not its
    own)."""
    where = os.path.abspath(path)
    while True:
        names = dumped_names(where)
        # A manifest.json of another program (a web app's, a data set's) in
        # a directory above refused every Saver dump beneath it.
        if names or dump_manifest(where) is not None:
            inside = "" if where == os.path.abspath(path) else f" inside the sok.dump {where!r}"
            raise FileExistsError(
                f"Saver.dump_to_file: filepath={path!r} is{inside or ' a sok.dump'} (of "
                f"{names}), not a Saver's directory: the Saver keeps each table in a directory "
                f"of its own inside filepath, and would mix them into the dump's files; choose "
                f"another filepath (a dump of the Saver's earlier one-table layout still "
                f"restores, but takes no new tables)")
        parent = os.path.dirname(where)
        if parent == where:
            return
        where = parent


def _as_str(path):
    return path.decode("utf-8") if isinstance(path, bytes) else path


def _entry(var):
    """The directory, inside filepath, of var's shard: its name's file stem,
    and with several workers the shard (rank, number of workers), so the
    workers' shards of one table never share files."""
    world_size, rank, _ = var.placement
    stem = table_stem(var_name(var))
    return stem if world_size == 1 else f"{stem}.shard-{rank}-of-{world_size}"


def _refuse_a_newer_dump_of_other_workers(var, path, entry):
    """A CheckpointError where `path` holds a dump of var's table made by
    another number of workers that is newer than `entry`, the one this
    worker would read: a job that shrank or grew between a dump and a
    restore read the older files without a word (a one-worker restore took
    the rows of the dump before the two-worker job trained)."""
    world_size = var.placement[0]
    stem = table_stem(var_name(var))
    mine = os.path.getmtime(os.path.join(path, entry))
    pattern = re.compile(re.escape(stem) + r"(?:\.shard-\d+-of-(\d+))?\Z")
    newer = []
    for name in os.listdir(path):
        found = pattern.match(name)
        if found is None or int(found.group(1) or 1) == world_size:
            continue
        other = os.path.join(path, name)
        if dumped_names(other) and os.path.getmtime(other) > mine:
            newer.append(name)
    if newer:
        raise CheckpointError(
            f"{path} holds a dump of {var_name(var)!r} made by {world_size} worker(s) "
            f"({entry!r}) and newer ones made by another number of workers ({sorted(newer)}); "
            f"restoring would read the older rows: restore with the job's number of workers "
            f"that wrote the newer dump, or remove the dump not wanted")


# A Saver writes one shard as a table of its own, keys in the shard's own
# numbering (key_map: a static shard's local row numbers 0..n-1, a dynamic
# table's keys), as its files always held them.


def _check_name_length(var, entry, directory):
    """ValueError, before anything is written, where the table's name makes
    a name longer than the file system of `directory` takes (a string
    tensor, fed when the graph runs: that of "/"): the table's directory in
    filepath (with the suffix of the copies a dump writes beside it) or its
    files."""
    name = var_name(var)
    limit = name_max(directory) if isinstance(directory, str) else name_max("/")
    refuse_long_name(name, entry, len(os.fsencode(entry)) + _SIBLING_SUFFIX, limit,
                     "the Saver's directory",
                     " (with the suffix of the copies a dump writes beside it)")
    for part in ("keys", "values") + _filter_parts(var):
        fname = f"{_file_stem(name)}.{part}"
        refuse_long_name(name, fname, len(os.fsencode(fname)), limit, "the Saver's file")


def _refuse_a_copys_name(var, entry):
    """ValueError where the table's directory `entry` is named as the
    copies that a dump to another table's directory makes beside it
    (`<dir>.old-<20 digits>-<8 hex>`, `<dir>.tmp-<pid>-<8 hex>`): the next
    dump of that table deleted this one's directory as its own old copy,
    without an error, and a restore of it took this one's files as its
    own previous dump."""
    for pattern in (_ASIDE, _TMP):
        found = re.search(pattern.pattern + r"\Z", entry)
        if found is not None:
            raise ValueError(
                f"Saver.dump_to_file: variable {var_name(var)!r} would be kept in the "
                f"directory {entry!r}, which is named as the copies a dump of the table "
                f"{entry[:found.start()]!r} makes beside its own directory (and deletes): "
                f"give the variable a name that does not end in {found.group(0)!r}")


# The real path of a table's directory inside a Saver's filepath -> a weak
# reference to the table this process last dumped there. The lock makes a
# check and the dump it allows one step, so two tables of one name dumped
# at once cannot both pass.
_dumped_here = {}
_dumped_lock = threading.Lock()
# The real path of a table's directory -> weak references to the tables
# whose dump there _refuse_a_namesake refused: the rows there are not
# theirs, which a restore of one of them checks.
_refused_here = {}


def _home(var):
    """The graph the table was made in; None for an eager table."""
    try:
        return var.handle.graph
    except AttributeError:  # an eager handle has no graph
        return None


def _described(var):
    """How the refusal of a shared name names a table."""
    if kind_of(var) == "dynamic":
        return f"sok.DynamicVariable (dimension {dimension_of(var)})"
    return f"sok.Variable ({var.fixed_rows} rows of dimension {dimension_of(var)})"


def _namesake(var, target):
    """The other table, eager as `var` is or in its graph, that this
    process dumped to the directory `target` and that still exists; None
    where there is none. Called under _dumped_lock."""
    ref = _dumped_here.get(os.path.realpath(target))
    other = None if ref is None else ref()
    if other is None or other is var or _home(other) is not _home(var):
        return None
    return other


def _refused_before(var, target):
    """Whether `var`'s dump to the directory `target` was refused (its rows
    are not there). Called under _dumped_lock."""
    return any(ref() is var for ref in _refused_here.get(os.path.realpath(target), ()))


def _refuse_a_namesake(var, name, target):
    """ValueError where another table named `name`, eager as `var` is or in
    its graph, was dumped by this process to the directory `target` and
    still exists: `var`'s dump would replace that table's files there
    (a Saver tells tables apart by name only), losing its rows without an
    error. Called under _dumped_lock."""
    other = _namesake(var, target)
    if other is None:
        return
    refused = [ref for ref in _refused_here.get(os.path.realpath(target), ()) if ref() is not None]
    if not any(ref() is var for ref in refused):
        refused.append(weakref.ref(var))
    _refused_here[os.path.realpath(target)] = refused
    this, that = _names_of(var, other)
    other = None  # the refusal's traceback must not keep the other table alive
    raise ValueError(
        f"Saver.dump_to_file: {this} and {that} are both named {name!r}: in "
        f"filepath a Saver keeps each table in the directory of its name ({target}), where "
        f"the other one was dumped before, so this dump would replace its rows; give the "
        f"tables distinct names (name=...), or dump them to different filepaths (nothing "
        f"was written)")


def _refuse_anothers_rows(var, name, target):
    """ValueError where the rows a restore of `var` would read from the
    directory `target` are another live table's (see _namesake) that cannot
    be meant for `var`: `var`'s own dump there was refused, or that table is
    of the other kind (static against dynamic). A restore from the dump of
    another table of its kind and name is a copy, which goes on. Called
    under _dumped_lock."""
    other = _namesake(var, target)
    if other is None:
        return
    refused = _refused_before(var, target)
    if not refused and kind_of(other) == kind_of(var):
        return
    this, that = _names_of(var, other)
    other = None  # the refusal's traceback must not keep the other table alive
    why = ("this table's own dump there was refused" if refused else
           "a static table's rows are not a dynamic table's")
    raise ValueError(
        f"Saver.restore_from_file: {this} and {that} are both named {name!r}: in "
        f"filepath a Saver keeps each table in the directory of its name ({target}), which "
        f"holds the rows of the other one ({why}); give the tables distinct names "
        f"(name=...) and dump each (the table was not changed)")


def _names_of(var, other):
    """How a refusal names `var` and `other`, two tables of one name."""
    this, that = _described(var), _described(other)
    if this == that:
        this, that = f"this {this}", f"another {that}"
    return this, that


def _filter_parts(var):
    """The files a dump of `var` holds for its admission filter's counts."""
    admission = var.admission
    return _FILTER_PARTS if admission is not None and admission.counting else ()


# A shard's admission filter state is dumped and restored by dump_load's
# code for it (filter_tensors, filter_arrays, check_filter_fits,
# filter_state, restore_filter). The Saver kept keys and rows only: a
# restored table counted every waiting key from zero and repeated its first
# calls' draws.


def _filter_state_parts(var):
    """The parts of filter_state that `var`'s filter takes (all int64), in
    the order a restore's read returns them."""
    parts = list(_filter_parts(var))
    if var.admission is not None and var.admission.draws:
        parts.append(FILTER_CALLS)
    return parts


def _rows(var):
    """(keys, rows, {metadata name: tensor}) of the whole shard, keys in its
    own numbering; the metadata is what the table keeps per key
    (key_metadata: a dynamic table's last-use times and use counts)."""
    keys, rows, metadata = var.read_all()
    return tf.cast(var.key_map(keys), tf.int64), rows, metadata


def _assign(var, keys, rows, metadata):
    """Replaces the shard's contents with `rows` of `keys` in its own
    numbering (as _rows gives them): it holds exactly those afterwards.
    metadata: {name: int64 entries per key} for each of the table's
    key_metadata; empty entries (a dump from before the Saver kept them)
    give the table's defaults, as a fresh write does."""
    keys = tf.cast(var.global_ids(keys), var.key_dtype)
    return var.replace_rows(keys, rows, **metadata)


# A dynamic table's last-use times and use counts are dumped and restored
# with its rows, as sok.dump and sok.load keep them. The Saver kept keys and
# rows only: a restored bounded table had every use count at 0 and every
# key last used at the restore, so LFU evicted the most used key next and
# LRU the key used last before the dump.


def _in_graph_or_now(fn, inputs, out_types, path):
    """fn(path, *inputs) now (eagerly) or as a py_func of the graph, the
    path a string tensor or a constant."""
    if tf.executing_eagerly():
        return fn(path, *[x.numpy() if hasattr(x, "numpy") else x for x in inputs])
    path = path if isinstance(path, tf.Tensor) else tf.constant(path)
    return tf.compat.v1.py_func(fn, [path] + list(inputs), out_types, stateful=True)


def _refuse_more_rows_than_held(var, n):
    """ValueError naming the table where keys 0..n-1 give a shard of it more
    rows than it can hold (a bounded dynamic table's max_capacity); the
    table's import refused them with a message that named neither the table
    nor `tensors`."""
    for shard in replica_shards.shards_of(var):
        if not is_dynamic(shard):
            continue
        owned = placement.owned_count(shard, n)
        limit = int(shard.row_limit())
        if 0 < limit < owned:
            raise ValueError(
                f"load_embedding_values: table '{var_name(shard)}' holds at most {limit} rows "
                f"(its max_capacity{' on this worker' if shard.placement[0] > 1 else ''}); "
                f"tensors give "
                f"it {owned}: raise max_capacity or load fewer rows")


# With several worker processes each writes and reads its own shard, so the
# shards of one table in `filepath` may come from different saves (a worker
# that died before its turn, a directory copied in part). The workers of a
# dump agree on a number (the earliest clock reading among them, gathered
# in the dump's op) that every shard records; a restore gathers each
# worker's number and whether it could read its shard, and every worker
# refuses the restore, before any table changes, unless all read shards
# of one save. The shards of one save used to be restored together with
# another's, and a worker that could not read its shard failed alone.


def _workers_comm(var):
    """The communicator joining the worker processes that hold var's
    shards, or None where one process holds the table."""
    comm = context.active()
    if var.placement[0] == 1 or not agreement.spans_processes(comm):
        return None
    return comm


def _agreed_save_id(var):
    """The number every worker's shard of this dump records (a tensor, or
    None in one process): the earliest of their clock readings."""
    comm = _workers_comm(var)
    if comm is None:
        return None
    now = tf.reshape(tf.timestamp(), [1])
    return tf.reduce_min(comm.allgather(now, name="sok_saver_save_id"))


def _gathered_reads(comm, mine):
    """Every worker's [read it (1/0), save id (NaN: none recorded)] (a
    [workers, 2] float64 tensor) from this worker's `mine`."""
    return comm.allgather(tf.reshape(mine, [1, 2]), name="sok_saver_restore_ids")


def _refuse_mixed_shards(name, path, every, own_error):
    """CheckpointError unless every worker read its shard of `name` and all
    shards are of one save (`every`: _gathered_reads' numbers)."""
    every = np.asarray(every, np.float64).reshape([-1, 2])
    failed = [r for r in range(len(every)) if every[r, 0] == 0]
    if failed:
        if own_error:
            raise CheckpointError(own_error)
        raise CheckpointError(
            f"Saver.restore_from_file of {name!r} from {_as_str(path)}: worker(s) {failed} of "
            f"{len(every)} could not read their shard; no worker changed the table")
    ids = every[:, 1]
    if np.isnan(ids).all():
        return  # dumps from before save ids, or of one worker
    if np.isnan(ids).any() or len(set(ids.tolist())) > 1:
        saves = {r: (None if np.isnan(i) else float(i)) for r, i in enumerate(ids)}
        raise CheckpointError(
            f"Saver.restore_from_file of {name!r} from {_as_str(path)}: the workers' shards "
            f"come from different saves (save id by worker: {saves}; a worker that did not "
            f"dump with the others, or a directory copied in part): restoring would mix "
            f"them; no worker changed the table")


def _refuse_a_later_dump_as_the_earlier_layout(path, name, entry):
    """CheckpointError where `path`, a dump of one table named "table" that
    restore_from_file of `name` would take for the earlier one-table
    layout, holds what that layout never did: per-key metadata, admission
    filter state or optimizer slots. It is then a sok.dump, or the
    directory a Saver keeps a table named "table" in (a filepath given one
    level too deep), and its rows are that table's: they went to whatever
    table was restored from it, which lost its own rows without an error.
    (A static table's sok.dump without slots has only the earlier layout's
    parts, and cannot be told from it.)"""
    if name == _TABLE:
        return
    manifest = dump_manifest(path) or {}
    held = manifest.get("variables", {}).get(_TABLE, {})
    later = sorted(set(held.get("files", {})) - {"keys", "values"})
    if later or "filter" in held or FILTER_CALLS in held:
        raise CheckpointError(
            f"{path} is the dump of one table named {_TABLE!r} ({later or 'with filter state'} "
            f"beside its rows: a sok.dump, or the directory a Saver keeps a table of that name "
            f"in), not a Saver's directory: it holds no {entry!r} for {name!r}; restore "
            f"{_TABLE!r} from it with sok.load, or give the Saver's filepath (the directory "
            f"above the tables' directories) (the table was not changed)")


class Saver:
    """Saves and restores single sok embedding tables (see the module docstring)."""

    def dump_to_file(self, embedding_variable, filepath):
        """Writes the table's (this worker's shard's) keys and rows into the
        directory `filepath`, next to the other tables dumped there."""
        _check(embedding_variable, "dump_to_file")
        # One shard: that of the replica being built (inside strategy.run).
        var = replica_shards.resolve(embedding_variable, "Saver.dump_to_file")
        directory = _directory(filepath, "dump_to_file")
        kind, name, entry = kind_of(var), var_name(var), _entry(var)
        _check_name_length(var, entry, directory)
        _refuse_a_copys_name(var, entry)

        if isinstance(directory, str):
            _refuse_a_dump_at(directory)

        keys, rows, metadata = _rows(var)
        meta_parts = sorted(metadata)
        state = filter_tensors(var)
        parts = list(state)

        def write(path, keys, rows, *rest):
            # rest: the per-key metadata (meta_parts), the filter's state
            # (parts), then the save id, if any.
            arrays = {"keys": keys, "values": rows}
            arrays.update(zip(meta_parts, rest[:len(meta_parts)]))
            rest = rest[len(meta_parts):]
            save_id = rest[len(parts)] if len(rest) > len(parts) else None
            arrays.update(filter_arrays(var.admission, dict(zip(parts, rest))))
            path = checked_path(_as_str(path), "Saver.dump_to_file: filepath")
            _refuse_a_dump_at(path)
            target = os.path.join(path, entry)
            held = dumped_names(target)
            if held and held != [name]:
                raise FileExistsError(
                    f"{target} holds a Saver dump of {held}, not of {name!r}: their names "
                    f"map to one file name; give the variables names that differ in "
                    f"letters, digits, '-', '_' or '.'")
            with _dumped_lock:
                _refuse_a_namesake(var, name, target)
                write_dump(target, {name: (kind, arrays)},
                           save_id=None if save_id is None else float(save_id))
                where = os.path.realpath(target)
                _dumped_here[where] = weakref.ref(var)
                # Its rows are there now: no longer a refused table there.
                _refused_here[where] = [ref for ref in _refused_here.get(where, ())
                                        if ref() is not None and ref() is not var]
            return np.int32(0)

        save_id = _agreed_save_id(var)
        inputs = [keys, rows] + [metadata[m] for m in meta_parts] + [state[p] for p in parts] + (
            [] if save_id is None else [save_id])
        result = _in_graph_or_now(write, inputs, tf.int32, directory)
        return None if tf.executing_eagerly() else tf.group(result, name="sok_saver_dump")

    def restore_from_file(self, embedding_variable, filepath):
        """Replaces the table's contents with what dump_to_file wrote for it
        (its name, this worker's shard) into `filepath`, checked before
        anything changes."""
        _check(embedding_variable, "restore_from_file")
        # One shard: that of the replica being built (inside strategy.run).
        var = replica_shards.resolve(embedding_variable, "Saver.restore_from_file")
        directory = _directory(filepath, "restore_from_file")
        dim, name, entry = dimension_of(var), var_name(var), _entry(var)
        # A table of fixed rows holds exactly the shard's rows, numbered 0..n-1.
        fixed = var.fixed_rows
        shard_rows = None if fixed is None else placement.shard_rows(fixed, *var.placement)
        key_dtype = var.key_dtype
        dtype = tf.as_dtype(var.dtype).base_dtype
        filter_parts = _filter_state_parts(var)
        meta_parts = list(key_metadata_of(var))

        def read(path):
            path = checked_path(_as_str(path), "Saver.restore_from_file: filepath")
            target, table = os.path.join(path, entry), name
            held = dumped_names(target)
            if not held:
                here = dumped_names(path)
                if here == [_TABLE]:  # one table's dump, the earlier layout
                    _refuse_a_later_dump_as_the_earlier_layout(path, name, entry)
                    target, table, held = path, _TABLE, [_TABLE]
                elif here:
                    # A sok.dump of several tables, one of them named
                    # "table": its rows went to any table restored from it.
                    raise CheckpointError(
                        f"{path} is a sok.dump of {here}, not a Saver's directory (no "
                        f"{entry!r} in it for {name!r}): restore it with sok.load")
                else:
                    damage = unreadable_manifest(target)
                    if damage is not None:
                        # It said "no Saver dump" of a dump it could not read.
                        raise CheckpointError(f"the Saver dump of {name!r} in {target} is "
                                              f"damaged: {damage}")
                    if not os.path.isdir(path):
                        # It said "it holds []" of a directory that is not there.
                        raise CheckpointError(
                            f"no Saver dump of {name!r} in {path}: there is no such "
                            f"directory")
                    inside = sorted(os.listdir(path))
                    stem = re.sub(r"\.shard-[0-9]+-of-[0-9]+\Z", "", entry)
                    shards = [e for e in inside if e == stem or re.fullmatch(
                        re.escape(stem) + r"\.shard-[0-9]+-of-[0-9]+", e)]
                    hint = ""
                    if shards and entry not in shards:
                        # Its shards of another number of workers are there.
                        hint = (f": it was dumped by another number of workers ({shards[:4]}); "
                                f"a Saver dump restores with the number of workers that wrote "
                                f"it, and sok.dump / sok.load move tables between numbers of "
                                f"workers")
                    raise CheckpointError(
                        f"no Saver dump of {name!r} (this worker's shard: {entry!r}) in "
                        f"{path}; it holds {inside[:8]}{hint}")
            if held != [table]:
                raise CheckpointError(f"{target} holds a Saver dump of {held}, not of {name!r}")
            if target != path:
                _refuse_a_newer_dump_of_other_workers(var, path, entry)
            if table == name:
                with _dumped_lock:
                    _refuse_anothers_rows(var, name, target)
            static_rows = {} if shard_rows is None else {table: shard_rows}
            manifest, loaded = read_dump(target, {table: dim}, static_rows)
            arrays = loaded[table]
            keys = arrays["keys"].astype(np.int64)
            what = f"the table restored from {target}"
            check_keys_fit(keys, key_dtype, what)
            check_filter_fits(var, arrays, name, f"the Saver dump at {target}")
            # Rows in the dump's dtype (float32 in dumps before it was kept),
            # converted to the table's: no finite value may become infinite.
            rows = rows_as(arrays["values"], dtype, what, keys, static=fixed is not None)
            state = filter_state(var, arrays)
            # Empty where the dump has none (the table's defaults).
            metadata = [np.asarray(arrays.get(m, np.zeros([0])), np.int64) for m in meta_parts]
            return [keys, rows, manifest.get("save_id", np.nan)] + metadata + [
                state[p] for p in filter_parts]

        comm = _workers_comm(var)

        def read_told(path):
            """read's keys and rows, with [read it, save id] and the
            refusal's message (b"" where there is none), for the others."""
            try:
                keys, rows, save_id, *rest = read(path)
            except CheckpointError as e:
                nothing = [np.zeros([0] if p in _FILTER_PARTS + tuple(meta_parts) else [],
                                    np.int64) for p in meta_parts + filter_parts]
                return [np.zeros([0], np.int64), np.zeros([0, dim], dtype.as_numpy_dtype),
                        np.array([0.0, np.nan]), str(e).encode("utf-8")] + nothing
            return [keys, rows, np.array([1.0, save_id]), b""] + rest

        def check(path, every, own):
            own = own.decode("utf-8") if isinstance(own, bytes) else own
            _refuse_mixed_shards(name, path, every, own or None)
            return np.int32(0)

        def split(rest):
            """({metadata name: entries}, {filter part: state}) of what
            follows the keys, rows and save id of a read."""
            return (dict(zip(meta_parts, rest[:len(meta_parts)])),
                    dict(zip(filter_parts, rest[len(meta_parts):])))

        if tf.executing_eagerly():
            if comm is None:
                keys, rows, _, *rest = read(directory)
            else:
                keys, rows, mine, own, *rest = read_told(directory)
                check(directory, _gathered_reads(comm, tf.constant(mine, tf.float64)).numpy(),
                      own)
            metadata, state = split(rest)
            _assign(var, tf.constant(keys), tf.constant(rows),
                    {m: tf.constant(v) for m, v in metadata.items()})
            restore_filter(var, state)
            return None
        int64s = [tf.int64] * (len(meta_parts) + len(filter_parts))
        if comm is None:
            keys, rows, _, *rest = _in_graph_or_now(
                read, [], [tf.int64, dtype, tf.float64] + int64s, directory)
            checks = []
        else:
            keys, rows, mine, own, *rest = _in_graph_or_now(
                read_told, [], [tf.int64, dtype, tf.float64, tf.string] + int64s, directory)
            checks = [_in_graph_or_now(check, [_gathered_reads(comm, mine), own], tf.int32,
                                       directory)]
        keys.set_shape([None])
        rows.set_shape([None, dim])
        for part, tensor in zip(meta_parts + filter_parts, rest):
            tensor.set_shape([None] if part in _FILTER_PARTS + tuple(meta_parts) else [])
        with tf.control_dependencies(checks):
            # Nothing changes before every worker's read passed its checks.
            keys = tf.identity(keys)
            rest = [tf.identity(t) for t in rest]
        metadata, state = split(rest)
        ops = [_assign(var, keys, rows, metadata)] + restore_filter(var, state)
        return tf.group(*ops, name="sok_saver_restore")

    def load_embedding_values(self, embedding_variable, tensors):
        """Sets the table from `tensors` (one [rows, dim] tensor or a list of
        them, concatenated): row i becomes key i's embedding. A static table
        must have exactly that many rows."""
        _check(embedding_variable, "load_embedding_values")
        var = embedding_variable
        table = replica_shards.shards_of(var)[0]  # the kind, dimension and rows of every shard
        parts = list(tensors) if isinstance(tensors, (list, tuple)) else [tensors]
        if parts and all(isinstance(p, (list, tuple)) and p and
                         all(isinstance(x, (int, float, np.number)) for x in p) for p in parts):
            # A nested list of numbers (W.tolist()) is one [rows, dim] value;
            # each of its rows was taken for a tensor ("tensors[0] must be
            # [rows, dim]; got shape (dim,)").
            parts = [tensors]
        if not parts:
            raise ValueError("tensors must hold at least one [rows, dim] tensor")
        dim = dimension_of(table)
        # The table's own dtype: float32 made a float64 table refuse its rows.
        dtype = tf.as_dtype(table.dtype).base_dtype
        values = []
        for i, t in enumerate(parts):
            t = rows_from_user(t, dtype, f"tensors[{i}]")
            if t.shape.rank != 2 or (t.shape[1] is not None and t.shape[1] != dim):
                raise ValueError(f"tensors[{i}] must be [rows, {dim}] (the table's dimension); "
                                 f"got shape {t.shape}")
            values.append(t)
        rows = tf.concat(values, 0) if len(values) > 1 else values[0]
        # A NaN or infinite row (which the layers' initializers refuse) made
        # every lookup of its key, and the loss, NaN.
        if tf.executing_eagerly():
            # Checked where the rows are: no copy of a table to the host.
            finite = tf.math.is_finite(rows)
            if not bool(tf.reduce_all(finite)):
                row = int(tf.where(tf.logical_not(finite))[0][0])
                raise ValueError(f"load_embedding_values: tensors hold a NaN or infinite value "
                                 f"in row {row} (key {row}); every value must be finite")
        else:
            rows = tf.debugging.assert_all_finite(
                rows, "load_embedding_values: tensors hold a NaN or infinite value; every "
                      "value must be finite")
        n = tf.compat.dimension_value(rows.shape[0])  # a Dimension on TF 1.15
        fixed = table.fixed_rows
        if fixed is not None and n is not None and n != fixed:
            raise ValueError(f"the table has {fixed} rows; tensors hold {n}")
        if fixed is not None and n is None:
            # Known only when the graph runs: checked before any row moves.
            check = tf.debugging.assert_equal(
                tf.shape(rows, out_type=tf.int64)[0], tf.constant(fixed, tf.int64),
                message=f"load_embedding_values: the table has {fixed} rows; tensors must "
                        f"hold as many")
            with tf.control_dependencies([check]):
                rows = tf.identity(rows)
        if n is not None and tf.executing_eagerly():
            _refuse_more_rows_than_held(var, n)
        all_keys = tf.range(tf.shape(rows, out_type=tf.int64)[0])
        ops = []
        # Each worker keeps the rows it owns (each replica's shard, when the
        # replicas of a MirroredStrategy are the workers).
        for shard in replica_shards.shards_of(var):
            keys, owned = placement.owned_rows(shard, all_keys, rows)
            ops.append(shard.import_rows(tf.cast(keys, shard.key_dtype), owned))
        return None if tf.executing_eagerly() else tf.group(*ops,
                                                             name="sok_load_embedding_values")
